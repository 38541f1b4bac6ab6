"""A slice after any sequence of deliveries, approvals, rejections and rollbacks holds exactly
one delivery's rows, owned by one batch, and every held batch is in one of the review states
the docs name, as the held list and the batch itself say alike: a hypothesis state machine,
checked after every step. It runs on the in-memory fakes (tests/fakes, held to the real
parts by tests/contract), a fresh world per example, with many examples in `make test-fast`;
and on real PostgreSQL and moto (each example its own folder) with fewer.

Also the rollback rule: a rollback with no `--to` never goes back to content that a rollback
removed. On the fakes 50 examples (6-7 s of CPU; FLEET_SEQUENCE_MEMORY_EXAMPLES), on PostgreSQL
8 (about 30 s; FLEET_SEQUENCE_EXAMPLES=200 for a longer search)."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from fleet_import.importing.context import AlreadyLoaded, Committed, Failed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.importing.review import approve_held, reject_held
from fleet_import.importing.rollback import rollback_slice
from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.batch_state import ReviewState, review_state, shown_status
from fleet_import.store.details import FailureKind
from fleet_import.store.models import BatchStatus
from fleet_import.store.review_repository import ReviewRepository
from tests.fakes.review import MemoryReviewRepository
from tests.fakes.world import LANDING, memory_world
from tests.helpers import curated, layout_admission, upload
from tests.importing.guard_helpers import redeliver, retaining_ctx

ACME = Tenant.named("acme")
ADMIT = layout_admission()
TABLES = {
    "trips": "fleet_trips",
    "vehicles": "fleet_vehicles",
    "fuel_transactions": "fleet_fuel_transactions",
}
RETAIN_SECONDS = 3600
_days = itertools.count()

Stamps = dict[str, list[tuple[uuid.UUID, int]]]
"""dataset -> (batch stamped, rows) of a folder's slice."""


@dataclass
class Backend:
    """The parts one example runs on, and how its slice's rows are read."""

    ctx: ImportContext
    reviews: Any
    s3: Any
    landing: str
    stamps: Callable[[str], Stamps]


def postgres_backend(ctx: ImportContext, database_url: str, s3: Any, landing: str) -> Backend:
    def stamps(folder: str) -> Stamps:
        return {
            dataset: curated(
                database_url,
                f"SELECT ingestion_batch_id::uuid, count(*) FROM curated.{table} "
                "WHERE tenant_id = 'acme' AND source_scope = %s GROUP BY 1",
                source_scope(folder),
            )
            for dataset, table in TABLES.items()
        }

    return Backend(ctx, ReviewRepository(database_url), s3, landing, stamps)


def memory_backend(workdir: Path) -> Backend:
    """A fresh in-memory world: the fakes' store, outbox, reviews, warehouse and S3."""
    world = memory_world(Path(tempfile.mkdtemp(dir=workdir)))
    reviews = MemoryReviewRepository(world.store)
    ctx = retaining_ctx(world.ctx, world.outbox, reviews, keep_seconds=RETAIN_SECONDS)

    def stamps(folder: str) -> Stamps:
        scope = ("acme", source_scope(folder))
        registered = world.warehouse.registry.get(scope, {})
        found: Stamps = dict.fromkeys(TABLES, [])
        for dataset, row in registered.items():
            rows = world.warehouse.slice_rows(*scope, dataset)
            if rows is not None and rows.num_rows:
                found[dataset] = [(row.batch_id, rows.num_rows)]
        return found

    return Backend(ctx, reviews, world.s3, LANDING, stamps)


def _told(step: str, outcome: Any) -> Any:
    """The outcome's kind, counted by hypothesis (`--hypothesis-show-statistics`): proof
    that the examples reach holds, approvals and rollbacks, not only first loads."""
    kind = getattr(outcome, "kind", None)
    event(f"{step}: {type(outcome).__name__}{f' ({kind})' if kind else ''}")
    return outcome


class SliceSequences(RuleBasedStateMachine):
    backend: Callable[[], Backend]

    def __init__(self) -> None:
        super().__init__()
        self.parts = type(self).backend()
        self.ctx, self.reviews, self.s3 = self.parts.ctx, self.parts.reviews, self.parts.s3
        day = dt.date(2026, 1, 1) + dt.timedelta(days=next(_days))
        self.folder = today_folder(self.parts.landing, "acme", day)
        self.deliveries = 0
        self.removed_by_rollback: set[uuid.UUID] = set()

    def _import(self) -> object:
        self.deliveries += 1
        return _told("import", import_folder(self.ctx, ACME, self.folder, f"d{self.deliveries}"))

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

    def _waiting(self) -> list:
        return [b for b in self._held() if not b.details.get("review")]

    @precondition(lambda self: self._waiting())
    @rule()
    def approve_newest_held(self) -> None:
        _told("approve", approve_held(self.ctx, self._waiting()[0].id, admission=ADMIT))

    @precondition(lambda self: self._waiting())
    @rule(note=st.sampled_from(["", "resent Monday"]))
    def reject_newest_held(self, note: str) -> None:
        _told("reject", reject_held(self.ctx, self.reviews, self._waiting()[0].id, note))

    @rule()
    def roll_back(self) -> None:
        before = self._owner()
        outcome = rollback_slice(self.ctx, self.reviews, "acme", self.folder, admission=ADMIT)
        _told("rollback", outcome)
        if not isinstance(outcome, Committed):
            return
        target = uuid.UUID(self.ctx.repo.get(outcome.batch_id).details["rolled_back_to"])
        assert self._content(target) not in self.removed_by_rollback, (
            f"a default rollback went back to batch {target}, whose content a rollback removed"
        )
        if before is not None:
            assert self._content(target) != self._content(before), (
                f"a default rollback reloaded the content the slice showed (batch {target})"
            )
            self.removed_by_rollback.add(self._content(before))

    def _content(self, batch_id: uuid.UUID) -> uuid.UUID:
        """The batch that first loaded a batch's rows: an approval's held batch, a
        rollback's target, followed through rollbacks to rollbacks."""
        details = self.ctx.repo.get(batch_id).details
        loaded = details.get("rolled_back_to") or details.get("approves")
        return batch_id if loaded is None else self._content(uuid.UUID(loaded))

    @invariant()
    def one_delivery_owns_the_slice(self) -> None:
        owner = self._owner()
        rows = self.parts.stamps(self.folder)
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
        """One state per held batch, and every view says it: the batch, the held list
        (what still waits for a decision) and the status shown."""
        held = self._held()
        since = self.reviews.held_since(b.id for b in held)
        waiting = {b.id for b in self.reviews.held_batches("acme", limit=500)}
        for batch in held:
            state = review_state(batch, since.get(batch.id))
            assert state in set(ReviewState), batch.details
            decided = state in (ReviewState.APPROVED, ReviewState.REJECTED)
            assert (batch.id in waiting) is not decided, (state, batch.details)
            assert shown_status(batch, since.get(batch.id)) == f"held ({state})"
        assert self.ctx.repo.list(status="running") == []


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=8,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )


def test_any_sequence_on_the_fakes_leaves_one_delivery_in_the_slice(tmp_path: Path) -> None:
    SliceSequences.backend = lambda: memory_backend(tmp_path)
    examples = int(os.environ.get("FLEET_SEQUENCE_MEMORY_EXAMPLES", "50"))
    run_state_machine_as_test(SliceSequences, settings=_settings(examples))


@pytest.mark.slow
def test_any_sequence_leaves_one_delivery_in_the_slice(
    import_ctx: ImportContext, outbox, s3, landing_bucket: str, database_url: str
) -> None:
    reviews = ReviewRepository(database_url)
    ctx = retaining_ctx(import_ctx, outbox, reviews, keep_seconds=RETAIN_SECONDS)
    parts = postgres_backend(ctx, database_url, s3, landing_bucket)
    SliceSequences.backend = lambda: parts
    examples = int(os.environ.get("FLEET_SEQUENCE_EXAMPLES", "8"))
    run_state_machine_as_test(SliceSequences, settings=_settings(examples))
