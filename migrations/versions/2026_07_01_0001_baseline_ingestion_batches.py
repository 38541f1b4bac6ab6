"""Baseline: ingestion_batches as it existed before fleet imports.

Why: databases in production already hold this table with tenant/date-scoped batches. The
fleet feature must upgrade them in place, so the history starts from that exact shape and
the upgrade test starts from a database at this revision with real rows in it.

Revision ID: 0001
Revises:
Create Date: 2026-07-01
"""

from __future__ import annotations

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

SOURCE_TYPES_BEFORE_FLEET = ("brink_pos", "kds_cdc", "manual_upload")


def upgrade() -> None:
    op.execute(
        f"""
        CREATE TABLE ingestion_batches (
            id uuid PRIMARY KEY,
            tenant_id varchar(63) NOT NULL,
            company_id varchar(64) NOT NULL,
            tenant_database varchar(127) NOT NULL,
            mode varchar(32) NOT NULL,
            source_type varchar(32) NOT NULL,
            business_date date NULL,
            pipeline_stage varchar(64) NOT NULL,
            status varchar(16) NOT NULL,
            details jsonb NOT NULL DEFAULT '{{}}'::jsonb,
            is_current boolean NOT NULL DEFAULT false,
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT ck_ingestion_batches_status
                CHECK (status IN ('running', 'failed', 'succeeded')),
            CONSTRAINT ck_ingestion_batches_source_type
                CHECK (source_type IN {SOURCE_TYPES_BEFORE_FLEET!r})
        )
        """
    )
    # The date-scoped "current batch" rule: one current batch per tenant, day and stage.
    # Rows without a business date never take part in it.
    op.execute(
        """
        CREATE UNIQUE INDEX ux_ingestion_batches_current
            ON ingestion_batches (tenant_id, business_date, pipeline_stage)
            WHERE is_current AND business_date IS NOT NULL
        """
    )
    op.execute(
        "CREATE INDEX ix_ingestion_batches_tenant_created "
        "ON ingestion_batches (tenant_id, created_at)"
    )


def downgrade() -> None:
    op.execute("DROP TABLE ingestion_batches")
