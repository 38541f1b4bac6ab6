"""publication_outbox and normalized_files.

Why: publication steps must survive a crash between the warehouse commit and their
execution, and must be claimed by exactly one drain (a row claim, not a process flag), so they
live in a transactional outbox written together with `redshift_committed`. Normalized files
are cached by (source key, etag, contract version) so that a rerun of unchanged files parses
nothing twice.

Revision ID: 0003
Revises: 0002
Create Date: 2026-07-23
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE publication_outbox (
            id bigserial PRIMARY KEY,
            batch_id uuid NOT NULL REFERENCES ingestion_batches (id) ON DELETE CASCADE,
            step varchar(64) NOT NULL,
            seq integer NOT NULL,
            status varchar(16) NOT NULL DEFAULT 'pending',
            attempts integer NOT NULL DEFAULT 0,
            claimed_by varchar(100) NULL,
            claimed_until timestamptz NULL,
            last_error text NULL,
            available_at timestamptz NOT NULL DEFAULT now(),
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT uq_publication_outbox_batch_step UNIQUE (batch_id, step),
            CONSTRAINT ck_publication_outbox_status
                CHECK (status IN ('pending', 'claimed', 'done', 'failed', 'dead'))
        )
        """
    )
    op.execute(
        "CREATE INDEX ix_publication_outbox_open ON publication_outbox (batch_id, seq) "
        "WHERE status IN ('pending', 'claimed', 'failed')"
    )
    op.execute(
        """
        CREATE TABLE normalized_files (
            source_key text NOT NULL,
            etag varchar(200) NOT NULL,
            contract_version varchar(64) NOT NULL,
            dataset varchar(63) NOT NULL,
            output_uri text NOT NULL,
            row_count bigint NOT NULL,
            reject_count bigint NOT NULL,
            details jsonb NOT NULL DEFAULT '{}'::jsonb,
            created_by_batch uuid NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (source_key, etag, contract_version)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE normalized_files")
    op.execute("DROP TABLE publication_outbox")
