"""`batch_gates`: the content gate's profile and check results, per batch and dataset
(issue 49).

Why: a delivery's content is judged before its slice commit (dataset checks, and drift
rules comparing its profile with the replaced slice's), and the next delivery of the folder
needs the profile of the slice it replaces to compare with. A table of its own, not the
batch's details: a profile is one row per dataset read by the next batch of the scope, and
the check results are what `fleet-import gate show` and the batch's artifact print. Written
before the slice commit (a held batch keeps what held it); the baseline is the profile of
the batch that owns the slice, never the current delivery's own (no baseline polluted by
the value it judges).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE batch_gates (
            batch_id uuid NOT NULL REFERENCES ingestion_batches (id) ON DELETE CASCADE,
            dataset text NOT NULL,
            baseline_batch_id uuid NULL,
            outcome varchar(20) NOT NULL,
            profile jsonb NOT NULL,
            results jsonb NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (batch_id, dataset),
            CHECK (outcome IN ('pass', 'warn', 'error', 'waived'))
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE batch_gates")
