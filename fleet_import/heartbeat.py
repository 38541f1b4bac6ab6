"""Keep an execution lease alive while work runs, and notice when it is lost."""

from __future__ import annotations

import logging
import threading
import uuid
from types import TracebackType

from fleet_import.batches import BatchRepository
from fleet_import.errors import LeaseLost, OperationalStoreError

log = logging.getLogger(__name__)

# Renew three times per TTL, so that two missed beats (a slow database, a GC pause) still
# leave the lease alive.
_RENEWAL_FRACTION = 1 / 3


class Heartbeat:
    """A context manager renewing `owner`'s lease on `batch_id` in a daemon thread.

    Work calls `check()` between steps: once the lease is lost it raises LeaseLost, so a
    worker that was taken over stops before it writes. Writes are fenced in SQL anyway.
    """

    def __init__(self, repo: BatchRepository, batch_id: uuid.UUID, owner: str, ttl: float) -> None:
        self._repo, self._batch_id, self._owner, self._ttl = repo, batch_id, owner, ttl
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
        while not self._stop.wait(self._ttl * _RENEWAL_FRACTION):
            try:
                self._repo.renew_lease(self._batch_id, self._owner, self._ttl)
            except LeaseLost as exc:
                self._lost = exc
                return
            except OperationalStoreError as exc:
                # One missed beat is survivable; the next try may get through.
                log.warning("lease renewal for batch %s failed: %s", self._batch_id, exc)

    def check(self) -> None:
        if self._lost is not None:
            raise self._lost

    def renew_now(self) -> None:
        """Renew synchronously: the last check before an irreversible step."""
        self.check()
        self._repo.renew_lease(self._batch_id, self._owner, self._ttl)
