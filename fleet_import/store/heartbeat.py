"""An execution lease's life once acquired: kept alive while work runs (noticing when it is
lost), released when the work ends. `leased` is the one place that does both; every holder
(the import, resume, the drain, a takeover) uses it."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

from fleet_import import failpoints
from fleet_import.errors import (
    FleetImportError,
    LeaseLost,
    LeaseUnconfirmed,
    OperationalStoreError,
)
from fleet_import.store.repository import BatchRepository

log = logging.getLogger(__name__)

# Renew three times per TTL, so that two missed beats (a slow database, a GC pause) still
# leave the lease alive.
_RENEWAL_FRACTION = 1 / 3
# The fence (issue #26): unconfirmed for this share of the TTL, the lease may have expired
# by the database's clock once a COMMIT sent now lands (clock rates, the COMMIT's own time):
# stop touching the warehouse a fifth of a TTL early (24 s of the default 120 s). One missed
# beat still leaves 2/15 of a TTL for the next one to get through.
_FENCE_MARGIN_FRACTION = 1 / 5


class Heartbeat:
    """A context manager renewing `owner`'s lease on `batch_id` in a daemon thread.

    Work calls `check()` between steps: once the lease is lost it raises LeaseLost, so a
    worker that was taken over stops before it writes. Writes are fenced in SQL anyway.

    The warehouse is not: it cannot see the lease. So `check()` is also the fence. The
    heartbeat remembers when the lease was last confirmed (the monotonic time a renewal that
    succeeded was *sent*: the database's expiry is at least that plus the TTL), and once
    `ttl - margin` has passed without a confirmation -- the operational database gone, or
    too slow -- it raises LeaseUnconfirmed: a successor may take the batch over any moment.
    `confirmed_at` is when the caller's acquisition was sent (now, if not given).
    """

    def __init__(
        self,
        repo: BatchRepository,
        batch_id: uuid.UUID,
        owner: str,
        ttl: float,
        *,
        confirmed_at: float | None = None,
    ) -> None:
        self._repo, self._batch_id, self._owner, self._ttl = repo, batch_id, owner, ttl
        self._confirmed_at = time.monotonic() if confirmed_at is None else confirmed_at
        self._fence_after = ttl * (1 - _FENCE_MARGIN_FRACTION)
        self._stop = threading.Event()
        self._lost: LeaseLost | None = None
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{batch_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=self._ttl)

    def _run(self) -> None:
        # Each beat is due a renewal interval after the last confirmation (the acquisition
        # may be a while ago already); after a missed beat, an interval after that try.
        interval = self._ttl * _RENEWAL_FRACTION
        due = self._confirmed_at + interval
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            due = time.monotonic() + interval
            try:
                self._renew()
                due = self._confirmed_at + interval
            except LeaseLost as exc:
                self._lost = exc
                return
            except OperationalStoreError as exc:
                # One missed beat is survivable; the next try may get through.
                log.warning("lease renewal for batch %s failed: %s", self._batch_id, exc)

    def _renew(self) -> None:
        sent = time.monotonic()
        self._repo.renew_lease(self._batch_id, self._owner, self._ttl)
        self._confirmed_at = max(self._confirmed_at, sent)

    def unconfirmed_for(self) -> float:
        """Seconds since the lease was last confirmed (by the monotonic clock)."""
        return time.monotonic() - self._confirmed_at

    def check(self) -> None:
        """Raise LeaseLost if the lease was taken, LeaseUnconfirmed if it may have expired."""
        if self._lost is not None:
            raise self._lost
        unconfirmed = self.unconfirmed_for()
        if unconfirmed >= self._fence_after:
            raise LeaseUnconfirmed(
                f"the operational database has not confirmed the lease of batch "
                f"{self._batch_id} for {unconfirmed:.1f} s (lease TTL {self._ttl:g} s): "
                "stopped before touching the warehouse again, its slice transaction rolled "
                "back; the next run of the folder or the drain takes the batch over"
            )

    def renew_now(self) -> None:
        """Renew synchronously: the last check before an irreversible step."""
        self.check()
        self._renew()


@contextmanager
def leased(
    repo: BatchRepository,
    batch_id: uuid.UUID,
    owner: str,
    ttl: float,
    *,
    confirmed_at: float | None = None,
) -> Iterator[Heartbeat]:
    """Hold the lease `owner` has just acquired on `batch_id` (sent at `confirmed_at`, by
    the monotonic clock; now if not given): renewed while inside, released on the way out
    however the work ends. (Acquiring stays with the caller: what a refused acquisition
    means differs between an import, a resume and a drain.)"""
    try:
        with Heartbeat(repo, batch_id, owner, ttl, confirmed_at=confirmed_at) as heartbeat:
            yield heartbeat
    finally:
        failpoints.hit("before_lease_release")
        release_lease_quietly(repo, batch_id, owner)


def release_lease_quietly(repo: BatchRepository, batch_id: uuid.UUID, owner: str) -> None:
    """Release at the end of work; if the database is unreachable the lease expires anyway."""
    try:
        repo.release_lease(batch_id, owner)
    except FleetImportError as exc:
        log.warning("could not release lease on batch %s: %s", batch_id, exc)
