"""What the import algorithm talks to, and what its steps answer.

Its own module so that each step (claim, normalize, load, settle) can be read, and
imported, without the others.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fleet_import.config import (
    DEFAULT_COMMIT_READBACK_SECONDS,
    DEFAULT_CSV_MAX_LINE_BYTES,
    DEFAULT_NORMALIZE_WORKERS,
    Settings,
)
from fleet_import.contracts.fleet import FLEET_DATASETS
from fleet_import.contracts.model import ContractSet
from fleet_import.publication.events import EventSink
from fleet_import.publication.lineage_delivery import Lineage
from fleet_import.publication.publisher import Publisher
from fleet_import.retry import Backoff, spanning
from fleet_import.s3.staging import StagingArea
from fleet_import.scope import Tenant
from fleet_import.store.details import FailureKind
from fleet_import.store.gates import GateRepository
from fleet_import.store.repository import BatchRepository
from fleet_import.warehouse.base import Warehouse

Progress = Callable[[str, float | None], None]


def no_event(name: str, payload: Mapping[str, Any]) -> None:
    return None


def no_progress(message: str, fraction: float | None) -> None:
    return None


@dataclass
class ImportContext:
    """What the algorithm talks to; built from Settings or by tests."""

    repo: BatchRepository
    warehouse: Warehouse
    s3: Any
    staging: StagingArea
    contracts: ContractSet = field(default_factory=lambda: FLEET_DATASETS)
    lease_ttl: float = 120.0
    # Reading back the stamp of a COMMIT that got no answer (importing.settle).
    commit_readback: Backoff = field(
        default_factory=lambda: spanning(DEFAULT_COMMIT_READBACK_SECONDS)
    )
    normalize_workers: int = DEFAULT_NORMALIZE_WORKERS
    csv_max_line_bytes: int = DEFAULT_CSV_MAX_LINE_BYTES  # the longest CSV line read
    publisher: Publisher | None = None  # None: nothing to publish, succeed after commit
    events: EventSink = no_event
    lineage: Lineage | None = None  # None: no OpenLineage events (FLEET_OPENLINEAGE unset)
    # The content gate's profiles and results (importing.gate); None: judged, not kept.
    gates: GateRepository | None = None
    progress: Progress = no_progress  # called from the loading and the COPY reader threads
    workdir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "fleet-import")
    # The Settings it was built from (runtime.build_runtime): what a job (importing.jobs)
    # carries to another process (a Dask worker), to rebuild a context there.
    settings: Settings | None = None
    # Built in such a process: normalized files are left in the staging area only.
    remote: bool = False

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError(
            "an ImportContext does not leave its process: send a job (importing.jobs) instead"
        )

    def publication_steps(self) -> tuple[str, ...]:
        return tuple(self.publisher.steps) if self.publisher is not None else ()


# -- outcomes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claimed:
    """This worker holds the batch's execution lease: it may work on it."""

    batch_id: uuid.UUID
    scope: str
    owner: str
    lease_confirmed_at: float | None = None
    """When the acquisition was sent, by this process's monotonic clock: where the lease's
    fence starts counting (store.heartbeat); None: when the work starts."""


@dataclass(frozen=True)
class Skipped:
    """Another batch holds the scope; nothing was touched."""

    scope: str
    holder_batch_id: uuid.UUID


@dataclass(frozen=True)
class NotClaimed:
    """The batch is running under another live executor."""

    batch_id: uuid.UUID
    holder: str | None
    expires_at: Any


@dataclass(frozen=True)
class NothingToDo:
    """The delivery's batch is already failed or succeeded: this delivery does no work."""

    batch_id: uuid.UUID
    status: str


@dataclass(frozen=True)
class AlreadyLoaded:
    """The scope's slice already holds this delivery's content (same files, same contract
    versions), loaded by `owner_batch_id`: no batch was made and no warehouse work done."""

    scope: str
    owner_batch_id: uuid.UUID
    finished_abandoned: bool = False
    """This delivery took the scope's abandoned batch over and finished its publication
    (it committed before its executor died): that is what made the slice hold this content."""


@dataclass(frozen=True)
class Committed:
    """The slice is committed; `published` says whether the batch also succeeded (else a
    drain finishes its publication: a step is waiting out a backoff or claimed elsewhere)."""

    batch_id: uuid.UUID
    scope: str
    row_counts: dict[str, int]
    summary: dict[str, Any]
    recovered: bool = False  # the slice was already stamped: only the record was redone
    published: bool = False


@dataclass(frozen=True)
class Failed:
    batch_id: uuid.UUID
    kind: FailureKind
    error: str
    resumable: bool = False
    """A failed publication `resume_publication` can finish (the slice is still this batch's)."""
    expired: bool = False
    """A newer batch owns the slice: nothing of this batch's publication may run any more."""


@dataclass(frozen=True)
class CommitUnknown:
    """The slice's COMMIT was sent and got no answer, and the slice stamp could not be read
    back within the configured time: whether the batch committed is not known. It stays
    running, its lease released, `commit_unknown` in its details; whoever touches it next
    (a rerun of the delivery, another delivery of the scope, the drain, `fleet-import
    resume`) settles it from the stamp. Never failed while its stamp may own the slice."""

    batch_id: uuid.UUID
    scope: str
    error: str
    next_step: str = ""
    """What to check before anyone can settle it (the warehouse's settings, as the backend
    that lost the answer names them), for the run's one line."""


ImportOutcome = (
    Skipped | NotClaimed | NothingToDo | AlreadyLoaded | Committed | Failed | CommitUnknown
)


class Host(Protocol):
    """What the process running an operation (import, approve, rollback) shows of it as it
    goes: the flows tag their run, tell the batch's story and show progress in the UI. The
    operation is composed once, in the core; its host only watches."""

    def admitted(self, tenant: Tenant, scope: str) -> None:
        """The tenant may load this scope; nothing is claimed yet."""

    def claim_ended(self, tenant: Tenant, scope: str, claim: Claimed | ImportOutcome) -> None:
        """The claim's answer: a batch to load, or why there is no work."""

    def progress(self, scope: str) -> Progress | None:
        """Where the load of `scope` reports how far it got (None: the context's own)."""

    def loading(
        self, claimed: Claimed, told: Sequence[uuid.UUID], headline: str | None = None
    ) -> None:
        """The batch is ours and its steps start. `told`: the batches whose views the
        outcome changes (an approval's held batch too); `headline`: what the outcome's one
        line starts with (a rollback says which batch it loads)."""


class Unwatched:
    """The core's own runs (the CLI's in-process paths, tests, benchmarks): nothing shown."""

    def admitted(self, tenant: Tenant, scope: str) -> None:
        pass

    def claim_ended(self, tenant: Tenant, scope: str, claim: Claimed | ImportOutcome) -> None:
        pass

    def progress(self, scope: str) -> Progress | None:
        return None

    def loading(
        self, claimed: Claimed, told: Sequence[uuid.UUID], headline: str | None = None
    ) -> None:
        pass


UNWATCHED = Unwatched()
