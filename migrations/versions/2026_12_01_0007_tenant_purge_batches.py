"""`tenant_purge`: offboarding a tenant is recorded as an operational batch of its own.

Why: `fleet-import tenants purge` deletes a tenant's slices, slice-registry rows and staged
files. An auditor must be able to see that it happened, when, and what went: the purge is
an `ingestion_batches` row (source type `tenant_purge`, never running, so no reservation,
lease or drain ever takes it), its details listing what was removed. Source types are
append-only; this one is appended.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

SOURCE_TYPES_BEFORE = ("brink_pos", "kds_cdc", "manual_upload", "fleet_s3")
SOURCE_TYPES = (*SOURCE_TYPES_BEFORE, "tenant_purge")


def _source_type_check(values: tuple[str, ...]) -> None:
    op.execute("ALTER TABLE ingestion_batches DROP CONSTRAINT ck_ingestion_batches_source_type")
    op.execute(
        "ALTER TABLE ingestion_batches ADD CONSTRAINT ck_ingestion_batches_source_type "
        f"CHECK (source_type IN {values!r})"
    )


def upgrade() -> None:
    _source_type_check(SOURCE_TYPES)


def downgrade() -> None:
    op.execute("DELETE FROM ingestion_batches WHERE source_type = 'tenant_purge'")
    _source_type_check(SOURCE_TYPES_BEFORE)
