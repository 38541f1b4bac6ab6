"""Helpers of the slice-guard, review and rollback tests: a slice's rows, a redelivery."""

from __future__ import annotations

from fleet_import.retry import Backoff
from fleet_import.scope import split_folder
from tests.helpers import curated, upload


def slice_snapshot(database_url: str, folder: str) -> dict[str, list[tuple]]:
    """Every row of the scope's slice in every curated table, sorted: for row-exact checks."""
    return {
        table: curated(
            database_url,
            f"SELECT * FROM curated.{table} WHERE tenant_id = 'acme' AND source_scope = %s "
            "ORDER BY 1, 2",
            f"fleet_s3:{folder}",
        )
        for table in ("fleet_vehicles", "fleet_trips", "fleet_fuel_transactions")
    }


def redeliver(s3, folder: str, trips_files: dict[str, bytes]) -> None:
    """Replace the folder's trips files with these (the other datasets stay as they are)."""
    bucket, prefix = split_folder(folder)
    for name in ("trips-1.csv", "trips-2.csv.gz"):
        s3.delete_object(Bucket=bucket, Key=prefix + name)
    upload(s3, folder, trips_files)


def retaining_ctx(import_ctx, outbox, reviews, keep_seconds: float):
    """`import_ctx` publishing with the default steps and a retention of `keep_seconds`:
    what a rollback needs (the files of earlier successes kept)."""
    from fleet_import.publication.publisher import Publisher
    from fleet_import.publication.retention import Retention

    import_ctx.publisher = Publisher(
        import_ctx.repo,
        outbox,
        import_ctx.warehouse,
        events=import_ctx.events,
        staging=import_ctx.staging,
        backoff=Backoff((0.0,)),
        retention=Retention(reviews, keep_seconds=keep_seconds),
    )
    return import_ctx
