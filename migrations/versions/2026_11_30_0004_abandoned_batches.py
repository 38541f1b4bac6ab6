"""ingestion_batch_abandoned(): when a running batch has no live executor.

Why: a worker killed or frozen before it finished left its scope blocked until someone
reran the dead batch's own delivery key. The next delivery of the scope, the drain and the
sweep now take such a batch over; all three must agree on what "abandoned" means, so the
rule is one SQL function rather than three copies of a predicate: the execution lease has
expired (by the database clock), or nobody ever leased the batch and it has not changed
for one lease TTL (its reserver died between reserving and leasing).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION ingestion_batch_abandoned(b ingestion_batches, ttl_seconds float8)
        RETURNS boolean
        LANGUAGE sql STABLE
        AS $$
            SELECT b.status = 'running'
               AND CASE
                       WHEN b.execution_lease_id IS NOT NULL
                       THEN b.execution_lease_expires_at <= now()
                       ELSE b.updated_at <= now() - make_interval(secs => ttl_seconds)
                   END
        $$
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION ingestion_batch_abandoned(ingestion_batches, float8)")
