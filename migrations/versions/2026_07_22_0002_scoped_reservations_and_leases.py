"""Source-scoped reservations and execution leases on ingestion_batches.

Why: fleet imports are keyed by (tenant, source folder), not by business date, and two
deliveries of one folder must never run at once even across machines. A unique partial index
makes PostgreSQL the arbiter of "one running batch per scope"; the lease columns let exactly
one worker execute a batch and another take over only after the lease expires. Existing rows
get NULLs and keep their date-scoped behaviour; `fleet_s3` is appended to the source types.

Revision ID: 0002
Revises: 0001
Create Date: 2026-07-22
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

SOURCE_TYPES_BEFORE_FLEET = ("brink_pos", "kds_cdc", "manual_upload")
SOURCE_TYPES = (*SOURCE_TYPES_BEFORE_FLEET, "fleet_s3")


def _source_type_check(values: tuple[str, ...]) -> None:
    op.execute("ALTER TABLE ingestion_batches DROP CONSTRAINT ck_ingestion_batches_source_type")
    op.execute(
        "ALTER TABLE ingestion_batches ADD CONSTRAINT ck_ingestion_batches_source_type "
        f"CHECK (source_type IN {values!r})"
    )


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE ingestion_batches
            ADD COLUMN source_scope varchar(200) NULL,
            ADD COLUMN delivery_key varchar(200) NULL,
            ADD COLUMN execution_lease_id varchar(100) NULL,
            ADD COLUMN execution_lease_expires_at timestamptz NULL
        """
    )
    _source_type_check(SOURCE_TYPES)
    # Fleet batches are never date-scoped and always scoped by folder.
    op.execute(
        """
        ALTER TABLE ingestion_batches ADD CONSTRAINT ck_ingestion_batches_fleet_scoped
            CHECK (source_type <> 'fleet_s3'
                   OR (source_scope IS NOT NULL AND business_date IS NULL AND NOT is_current))
        """
    )
    op.execute(
        """
        CREATE UNIQUE INDEX ux_ingestion_batches_running_scope
            ON ingestion_batches (tenant_id, source_scope)
            WHERE status = 'running' AND source_scope IS NOT NULL
        """
    )
    # Duplicate deliveries find the batch they made before.
    op.execute(
        """
        CREATE INDEX ix_ingestion_batches_delivery
            ON ingestion_batches (tenant_id, source_scope, delivery_key)
            WHERE source_scope IS NOT NULL
        """
    )


def downgrade() -> None:
    op.execute("DROP INDEX ix_ingestion_batches_delivery")
    op.execute("DROP INDEX ux_ingestion_batches_running_scope")
    op.execute("ALTER TABLE ingestion_batches DROP CONSTRAINT ck_ingestion_batches_fleet_scoped")
    op.execute("DELETE FROM ingestion_batches WHERE source_type = 'fleet_s3'")
    _source_type_check(SOURCE_TYPES_BEFORE_FLEET)
    op.execute(
        """
        ALTER TABLE ingestion_batches
            DROP COLUMN execution_lease_expires_at,
            DROP COLUMN execution_lease_id,
            DROP COLUMN delivery_key,
            DROP COLUMN source_scope
        """
    )
