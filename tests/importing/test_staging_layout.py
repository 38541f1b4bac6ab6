"""Staged data under the tenant's prefix (issue #46 item 9): every object an import stages
(normalized Parquet, its rejects, the batch's rejects file) is below `{staging}/{tenant}/`,
so a per-tenant IAM policy or KMS key covers it; cache rows made before that layout still
resolve where they point."""

from __future__ import annotations

import psycopg

from fleet_import.importing.context import Committed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant
from tests.cli.run_cli import invoke_with_test_settings
from tests.helpers import upload


def _staged_keys(s3, bucket: str) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def test_fleet_import_run_stages_under_the_tenant_prefix(
    flow_env: str, s3, landing_bucket: str, staging_bucket: str
) -> None:
    for tenant in ("acme", "globex"):
        folder = today_folder(landing_bucket, tenant)
        upload(s3, folder, fleet_delivery(trips=200, bad_rows=True))  # rejects staged too
        ran = invoke_with_test_settings("run", "--tenant", tenant, folder)
        assert ran.returncode == 0, ran.stdout + ran.stderr
    keys = _staged_keys(s3, staging_bucket)
    assert any(key.endswith(".rejects.csv") for key in keys), keys
    assert any(key.endswith("/rejects.csv") for key in keys), keys
    outside = [k for k in keys if not k.startswith(("stage/acme/", "stage/globex/"))]
    assert outside == [], outside
    acme = [k for k in keys if k.startswith("stage/acme/")]
    globex = [k for k in keys if k.startswith("stage/globex/")]
    assert len(acme) == len(globex) > 0


def test_a_cache_row_of_the_old_layout_still_resolves(
    import_ctx: ImportContext, s3, landing_bucket: str, staging_bucket: str, database_url: str
) -> None:
    """A row written before the tenant prefix (`normalized/{dataset}/{digest}.parquet`) is a
    cache hit at the place it records: no file is normalized again, nothing is moved."""
    acme = Tenant.named("acme")
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=200, bad_rows=True))
    first = import_folder(import_ctx, acme, folder, "d1")
    assert isinstance(first, Committed), first
    root = f"s3://{staging_bucket}/stage/"

    def to_old_layout(uri: str) -> str:
        old = uri.replace(f"{root}acme/", root)
        key = uri.removeprefix(f"s3://{staging_bucket}/")
        s3.copy_object(
            Bucket=staging_bucket,
            Key=old.removeprefix(f"s3://{staging_bucket}/"),
            CopySource={"Bucket": staging_bucket, "Key": key},
        )
        s3.delete_object(Bucket=staging_bucket, Key=key)
        return old

    with psycopg.connect(database_url) as conn:  # every entry moved to the old layout
        rows = conn.execute("SELECT output_uri, details FROM normalized_files").fetchall()
        for uri, details in rows:
            assert uri.startswith(f"{root}acme/normalized/"), uri
            rejects = details.get("rejects_uri")
            old_rejects = to_old_layout(rejects) if rejects else None
            conn.execute(
                "UPDATE normalized_files SET output_uri = %s, details = CASE WHEN %s::text IS NULL"
                " THEN details ELSE jsonb_set(details, '{rejects_uri}', to_jsonb(%s::text)) END"
                " WHERE output_uri = %s",
                (to_old_layout(uri), old_rejects, old_rejects, uri),
            )
    again = import_folder(import_ctx, acme, folder, "d2", force=True)
    assert isinstance(again, Committed), again
    assert again.summary["cache_hits"] == len(again.summary["files"]) == 4
    assert again.row_counts == first.row_counts
