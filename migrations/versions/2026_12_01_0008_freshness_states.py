"""`freshness_states`: the last freshness verdict of each (tenant, dataset).

Why: the `check-freshness` flow runs every few minutes, and an operator must hear about a
late delivery once, not on every run: `fleet.tenant.late` is emitted when a (tenant,
dataset) turns late (or misses another due time while late), `fleet.tenant.fresh-again`
when it is loaded again. What changed is decided against this row, read FOR UPDATE in the
transaction that writes the new verdict, so two checks running at once tell a change once.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE freshness_states (
            tenant_id varchar(63) NOT NULL,
            dataset varchar(200) NOT NULL,
            state varchar(40) NULL,
            late boolean NOT NULL DEFAULT false,
            expected_at timestamptz NULL,
            found text NULL,
            checked_at timestamptz NULL,
            changed_at timestamptz NULL,
            PRIMARY KEY (tenant_id, dataset)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE freshness_states")
