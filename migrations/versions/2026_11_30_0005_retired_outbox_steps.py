"""publication_outbox status 'retired': the steps of a superseded failed publication.

Why: a batch whose publication failed kept its pending, failed or dead steps for good once a
newer batch replaced its slice (a UI retry of the run makes such a newer batch): nothing could
ever run them, yet they looked like open work. The newer batch's retire step now marks such
batches superseded and moves their open steps to 'retired', a terminal status kept for the
record (which step failed, how often, why) rather than deleting the rows. The status check
must admit the new value.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_STATUSES_BEFORE = ("pending", "claimed", "done", "failed", "dead")
_STATUSES = (*_STATUSES_BEFORE, "retired")


def _status_check(values: tuple[str, ...]) -> None:
    op.execute("ALTER TABLE publication_outbox DROP CONSTRAINT ck_publication_outbox_status")
    op.execute(
        "ALTER TABLE publication_outbox ADD CONSTRAINT ck_publication_outbox_status "
        f"CHECK (status IN {values!r})"
    )


def upgrade() -> None:
    _status_check(_STATUSES)


def downgrade() -> None:
    # Before 0005 a step nothing may run again was 'dead'; its superseded batch is never
    # resumed, so the step stays where it is.
    op.execute("UPDATE publication_outbox SET status = 'dead' WHERE status = 'retired'")
    _status_check(_STATUSES_BEFORE)
