"""`batches show`'s failure history: a held batch says the command that approves it until it
is reviewed, then no longer (the review says what became of it)."""

from __future__ import annotations

from fleet_cli.batch_views import failure_history
from fleet_import.importing.guards import approve_command
from fleet_import.store.details import BatchDetails, FailureKind

HELD = {
    "kind": FailureKind.HELD,
    "error": f"held for review: trips 400 -> 10 rows; to load it anyway: {approve_command('b1')}",
}


def test_a_held_batch_says_how_to_approve_it_until_it_is_reviewed() -> None:
    (waiting,) = failure_history(BatchDetails.parse({"failure": HELD}))
    assert approve_command("b1") in waiting[1]
    (reviewed,) = failure_history(
        BatchDetails.parse({"failure": HELD, "review": {"decision": "approved", "batch_id": "b2"}})
    )
    assert reviewed[0] == "failure" and "trips 400 -> 10 rows" in reviewed[1]
    assert "batches approve" not in reviewed[1]
