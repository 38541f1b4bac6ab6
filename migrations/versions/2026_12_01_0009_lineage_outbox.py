"""`lineage_outbox`: OpenLineage RunEvents waiting to be delivered (issue #29).

Why: a table of its own, not `publication_outbox` rows: publication steps run in order
and the batch succeeds only once every step is done, while a lineage endpoint that is down
must never hold a batch back or fail it. These rows are written in the transaction that
records the warehouse commit (so no committed slice goes untold) and delivered by the run
and the drain, each retried with backoff until the endpoint answers. One row per (run id,
event type): a commit recorded again enqueues nothing twice.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE lineage_outbox (
            id bigserial PRIMARY KEY,
            batch_id uuid NOT NULL REFERENCES ingestion_batches (id) ON DELETE CASCADE,
            run_id uuid NOT NULL,
            job_name text NOT NULL,
            event_type varchar(20) NOT NULL,
            event_time timestamptz NOT NULL,
            event jsonb NOT NULL,
            status varchar(20) NOT NULL DEFAULT 'pending',
            attempts integer NOT NULL DEFAULT 0,
            last_error text NULL,
            claimed_by varchar(100) NULL,
            claimed_until timestamptz NULL,
            available_at timestamptz NOT NULL DEFAULT now(),
            delivered_at timestamptz NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            UNIQUE (run_id, event_type),
            CHECK (status IN ('pending', 'claimed', 'delivered'))
        )
        """
    )
    op.execute(
        "CREATE INDEX lineage_outbox_due ON lineage_outbox (available_at) "
        "WHERE status <> 'delivered'"
    )
    op.execute("CREATE INDEX lineage_outbox_batch ON lineage_outbox (batch_id)")


def downgrade() -> None:
    op.execute("DROP TABLE lineage_outbox")
