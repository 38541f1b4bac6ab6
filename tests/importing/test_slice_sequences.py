"""A slice after any sequence of deliveries, approvals, rejections and rollbacks holds exactly
one delivery's rows, owned by one batch, and every held batch is in one of the review states
the docs name: a hypothesis state machine on real PostgreSQL and moto (each example its own
folder), checked after every step.

Also the rollback rule: a rollback with no `--to` never goes back to content that a rollback
removed. 8 examples in CI (about 30 s); FLEET_SEQUENCE_EXAMPLES=200 for a longer search."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from fleet_import.importing.context import AlreadyLoaded, Committed, Failed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.importing.review import approve_held, reject_held
from fleet_import.importing.rollback import rollback_slice
from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.batch_state import ReviewState, review_state
from fleet_import.store.details import FailureKind
from fleet_import.store.models import BatchStatus
from fleet_import.store.review_repository import ReviewRepository
from tests.helpers import curated, layout_admission, upload
from tests.importing.guard_helpers import redeliver, retaining_ctx

pytestmark = pytest.mark.slow

ACME = Tenant.named("acme")
ADMIT = layout_admission()
TABLES = {
    "trips": "fleet_trips",
    "vehicles": "fleet_vehicles",
    "fuel_transactions": "fleet_fuel_transactions",
}
_days = itertools.count()


def _slice(database_url: str, folder: str) -> dict[str, list[tuple[uuid.UUID, int]]]:
    return {
        dataset: curated(
            database_url,
            f"SELECT ingestion_batch_id::uuid, count(*) FROM curated.{table} "
            "WHERE tenant_id = 'acme' AND source_scope = %s GROUP BY 1",
            source_scope(folder),
        )
        for dataset, table in TABLES.items()
    }


class SliceSequences(RuleBasedStateMachine):
    ctx: ImportContext
    reviews: ReviewRepository
    s3: object
    landing: str
    database_url: str

    def __init__(self) -> None:
        super().__init__()
        day = dt.date(2026, 1, 1) + dt.timedelta(days=next(_days))
        self.folder = today_folder(self.landing, "acme", day)
        self.deliveries = 0
        self.removed_by_rollback: set[uuid.UUID] = set()

    def _import(self) -> object:
        self.deliveries += 1
        return import_folder(self.ctx, ACME, self.folder, f"d{self.deliveries}")

    def _owner(self) -> uuid.UUID | None:
        return self.ctx.warehouse.slice_owner("acme", source_scope(self.folder))

    def _held(self) -> list:
        return [
            b
            for b in self.ctx.repo.list(tenant="acme", status=BatchStatus.FAILED, limit=500)
            if b.source_scope == source_scope(self.folder)
            and (b.details.get("failure") or {}).get("kind") == FailureKind.HELD
        ]

    @rule(trips=st.integers(300, 420), start=st.integers(0, 3))
    def deliver_whole(self, trips: int, start: int) -> None:
        """A whole delivery (one of a few contents): loads, or is already loaded."""
        upload(self.s3, self.folder, fleet_delivery())
        trips_file = csv_bytes(trips_table(trips, start=start * 1000))
        redeliver(self.s3, self.folder, {"trips-1.csv": trips_file})
        outcome = self._import()
        assert not isinstance(outcome, Failed) or outcome.kind == FailureKind.HELD, outcome

    @rule(rows=st.integers(1, 20))
    def deliver_truncated(self, rows: int) -> None:
        """A truncated redelivery: held when a slice exists, loaded when it is the first."""
        if self._owner() is None:
            upload(self.s3, self.folder, fleet_delivery(trips=rows))
        else:
            redeliver(self.s3, self.folder, {"trips-1.csv": csv_bytes(trips_table(rows))})
        outcome = self._import()
        assert isinstance(outcome, Committed | AlreadyLoaded) or (
            isinstance(outcome, Failed) and outcome.kind == FailureKind.HELD
        ), outcome

    @rule()
    def approve_newest_held(self) -> None:
        waiting = [b for b in self._held() if not b.details.get("review")]
        if waiting:
            approve_held(self.ctx, waiting[0].id, admission=ADMIT)

    @rule(note=st.sampled_from(["", "resent Monday"]))
    def reject_newest_held(self, note: str) -> None:
        waiting = [b for b in self._held() if not b.details.get("review")]
        if waiting:
            reject_held(self.ctx, self.reviews, waiting[0].id, note)

    @rule()
    def roll_back(self) -> None:
        before = self._owner()
        outcome = rollback_slice(self.ctx, self.reviews, "acme", self.folder, admission=ADMIT)
        if not isinstance(outcome, Committed):
            return
        target = self.ctx.repo.get(outcome.batch_id).details["rolled_back_to"]
        assert uuid.UUID(target) not in self.removed_by_rollback, (
            f"a default rollback went back to batch {target}, whose content a rollback removed"
        )
        if before is not None:
            self.removed_by_rollback.add(self._rolled_back_from(before))

    def _rolled_back_from(self, owner: uuid.UUID) -> uuid.UUID:
        """The batch whose content a rollback removed: the owner, or the batch it reloaded."""
        details = self.ctx.repo.get(owner).details
        return uuid.UUID(details.get("rolled_back_to") or details.get("approves") or str(owner))

    @invariant()
    def one_delivery_owns_the_slice(self) -> None:
        owner = self._owner()
        rows = _slice(self.database_url, self.folder)
        if owner is None:
            assert all(not stamped for stamped in rows.values()), rows
            return
        batch = self.ctx.repo.get(owner)
        assert batch is not None and batch.status is BatchStatus.SUCCEEDED, batch
        counts = batch.details["row_counts"]
        for dataset, stamped in rows.items():
            assert stamped == ([(owner, counts[dataset])] if counts.get(dataset) else []), (
                dataset,
                stamped,
                counts,
            )

    @invariant()
    def every_held_batch_is_in_a_named_state(self) -> None:
        for batch in self._held():
            assert review_state(batch) in set(ReviewState), batch.details
        assert self.ctx.repo.list(status="running") == []


def test_any_sequence_leaves_one_delivery_in_the_slice(
    import_ctx: ImportContext, outbox, s3, landing_bucket: str, database_url: str
) -> None:
    reviews = ReviewRepository(database_url)
    SliceSequences.ctx = retaining_ctx(import_ctx, outbox, reviews, keep_seconds=3600)
    SliceSequences.reviews = reviews
    SliceSequences.s3 = s3
    SliceSequences.landing = landing_bucket
    SliceSequences.database_url = database_url
    run_state_machine_as_test(
        SliceSequences,
        settings=settings(
            max_examples=int(os.environ.get("FLEET_SEQUENCE_EXAMPLES", "8")),
            stateful_step_count=8,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
