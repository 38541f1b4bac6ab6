"""Deliver the lineage outbox: each OpenLineage event sent once its run's earlier events
are, retried with backoff (the outbox keeps it pending and visible until the endpoint
answers). The run delivers its batch's events after publication and the drain delivers
everyone's, so a lineage endpoint that is down never holds back or fails a batch.

The transport is the OpenLineage client's, named by `FLEET_OPENLINEAGE`: `http(s)://host:port`
(POST to `/api/v1/lineage`, Marquez's API) or `file:///path` (one JSON event a line).
Delivery is at least once: a worker that dies between the POST and recording it leaves the
event to be sent again with the same run id, type and event time, which receivers (Marquez)
store once.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from fleet_import.errors import ConfigurationError
from fleet_import.explain import with_next_step
from fleet_import.retry import Backoff, doubling

if TYPE_CHECKING:  # the settings check imports this module: it must not load the store
    from fleet_import.store.lineage_outbox import LineageOutbox

log = logging.getLogger(__name__)

HTTP_ENDPOINT = "api/v1/lineage"
DEFAULT_CLAIM_TTL_SECONDS = 60.0
DEFAULT_LIMIT = 200
_HTTP_TIMEOUT_SECONDS = 5.0
LINEAGE_BACKOFF = doubling(5.0, 600.0)
"""The wait before an event that failed is sent again: 5, 10, 20... s, at most 600 s."""

Emit = Callable[[Mapping[str, Any]], None]


def transport_problem(target: str) -> str | None:
    """What is wrong with a `FLEET_OPENLINEAGE` value, or None (checks.settings asks)."""
    parts = urlsplit(target)
    if parts.scheme in ("http", "https"):
        return None if parts.netloc else "expected http://host:5000 (the lineage API's root)"
    if parts.scheme == "file":
        if parts.netloc or not parts.path or parts.path.endswith("/"):
            return "expected file:///path/to/events.jsonl (an absolute file path)"
        return None
    return "expected http(s)://host:5000 or file:///path/events.jsonl"


def transport_emit(target: str) -> Emit:
    """An `Emit` sending through the OpenLineage client's HTTP or file transport. Its own
    retries are off: the outbox retries, with backoff, across runs."""
    problem = transport_problem(target)
    if problem is not None:
        raise ConfigurationError(f"FLEET_OPENLINEAGE: {problem}")
    parts = urlsplit(target)
    if parts.scheme == "file":
        from openlineage.client.transport.file import FileConfig, FileTransport

        transport: Any = FileTransport(FileConfig(log_file_path=unquote(parts.path), append=True))
    else:
        from openlineage.client.transport.http import HttpConfig, HttpTransport

        retry = {
            "total": 0,
            "connect": 0,
            "read": 0,
            "status": 0,
            "backoff_factor": 0,
            "allowed_methods": ["POST"],
        }
        base = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}/"
        config = HttpConfig(
            url=base, endpoint=HTTP_ENDPOINT, timeout=_HTTP_TIMEOUT_SECONDS, retry=retry
        )
        transport = HttpTransport(config)
    return lambda event: transport.emit(dict(event))


@dataclass(frozen=True)
class LineageNaming:
    """Where the events say things live: the job namespace, and the warehouse's namespace
    (`postgres://host:5432`, `redshift://cluster:5439`) and shared database; `database_of`
    names a tenant's own database (None: the shared one)."""

    namespace: str
    warehouse_namespace: str
    warehouse_database: str
    database_of: Callable[[str], str | None] = lambda tenant_id: None


@dataclass(frozen=True)
class Delivered:
    """What one delivery pass did: events sent, and the error that stopped it (if any)."""

    sent: int
    error: str | None = None


class LineageDelivery:
    """Sends due events from the lineage outbox through `emit`."""

    def __init__(
        self,
        outbox: LineageOutbox,
        emit: Emit,
        *,
        backoff: Backoff = LINEAGE_BACKOFF,
        claim_ttl: float = DEFAULT_CLAIM_TTL_SECONDS,
    ) -> None:
        self._outbox, self._emit = outbox, emit
        self._backoff, self._claim_ttl = backoff, claim_ttl

    @property
    def outbox(self) -> LineageOutbox:
        return self._outbox

    def deliver(
        self, worker: str, batch_id: uuid.UUID | None = None, limit: int = DEFAULT_LIMIT
    ) -> Delivered:
        """Send due events (of one batch, or all) until none is due or one fails: the
        endpoint is then likely down, and that event waits out its backoff. Never raises
        for the endpoint: the caller's batch is not the lineage endpoint's business."""
        sent = 0
        while sent < limit:
            claimed = self._outbox.claim_next(worker, self._claim_ttl, batch_id)
            if claimed is None:
                return Delivered(sent)
            row, event = claimed
            try:
                self._emit(event)
            except Exception as exc:  # noqa: BLE001 - any transport failure is an attempt
                error = with_next_step(f"{type(exc).__name__}: {exc}", exc)
                self._outbox.failed(row, worker, error, self._backoff)
                log.warning(
                    "OpenLineage %s of %s (batch %s) not delivered (attempt %d), left pending: %s",
                    row.event_type,
                    row.job_name,
                    row.batch_id,
                    row.attempts + 1,
                    error,
                )
                return Delivered(sent, error)
            if self._outbox.delivered(row.id, worker):
                sent += 1
        return Delivered(sent)

    def deliver_quietly(
        self, worker: str, batch_id: uuid.UUID | None = None, limit: int = DEFAULT_LIMIT
    ) -> Delivered:
        """`deliver`, with a failing operational store logged too: what the run calls after
        its batch is decided, which nothing about lineage may change."""
        try:
            return self.deliver(worker, batch_id, limit)
        except Exception as exc:  # noqa: BLE001 - lineage never fails the caller
            log.warning("OpenLineage delivery stopped: %s", exc)
            return Delivered(0, str(exc))


@dataclass(frozen=True)
class Lineage:
    """OpenLineage as configured: how events name things, and how they are delivered."""

    naming: LineageNaming
    delivery: LineageDelivery
