"""Helpers several test modules share: a delivery uploaded to moto's S3, the slices it loads
into, and the lease of an import child killed at a failpoint.

They live here, not in a test module, so that no test module imports another: importing
one runs its module-level setup too, and an edit to its tests could break another file's."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import psycopg

from fleet_import.config import Settings
from fleet_import.intake.admission import admission
from fleet_import.scope import source_scope, split_folder
from fleet_import.store.models import Batch, BatchStatus
from fleet_import.tenants.binding import Admission
from tests.s3fixtures import put_objects

# The lease of an import child a test kills: short, so that the test waits little for it to
# expire before the rerun takes the batch over.
CHILD_TTL = 1.5


def upload(s3, folder: str, files: dict[str, bytes]) -> None:
    bucket, prefix = split_folder(folder)
    put_objects(s3, bucket, {prefix + name: data for name, data in files.items()})


def started_at(database_url: str, batch_id, moment) -> None:
    """Date a batch as started at `moment`: the store stamps batches with the database's
    clock, and a check judging a simulated moment counts only loads started by then."""
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE ingestion_batches SET created_at = %s WHERE id = %s", (moment, batch_id)
        )


def curated(database_url: str, sql: str, *params) -> list[tuple]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(sql, params).fetchall()


def slice_rows(database_url: str, table: str, tenant: str, folder: str) -> list[tuple]:
    """(stamp, rows) of the slice; the stamp a UUID on both backends (Redshift's column is
    a VARCHAR)."""
    return curated(
        database_url,
        f"SELECT ingestion_batch_id::uuid, count(*) FROM curated.{table} "
        "WHERE tenant_id = %s AND source_scope = %s GROUP BY 1",
        tenant,
        source_scope(folder),
    )


def layout_admission() -> Admission:
    """The tenant rule as a one-tenant setup has it (no registry, the default landing
    layout): what the core tests hand approve and rollback."""
    return admission(Settings(tenants=None, landing_prefix=""))


def stored_batch(status: str, details: dict[str, Any], **fields: Any) -> Batch:
    """A batch as the store returns it, for a view's test that needs no store."""
    at = dt.datetime(2026, 7, 22, 10, 44, tzinfo=dt.UTC)
    row: dict[str, Any] = {
        "id": uuid.uuid4(),
        "tenant_id": "acme_eu",
        "company_id": "acme",
        "tenant_database": "acme_eu",
        "mode": "file_upload",
        "source_type": "fleet_s3",
        "business_date": None,
        "pipeline_stage": "fleet_s3_direct_to_curated",
        "source_scope": "fleet_s3:s3://b/acme/fleet/2026-07-22/",
        "delivery_key": None,
        "status": BatchStatus(status),
        "details": details,
        "execution_lease_id": None,
        "execution_lease_expires_at": None,
        "is_current": False,
        "created_at": at,
        "updated_at": at,
    }
    return Batch(**{**row, **fields})
