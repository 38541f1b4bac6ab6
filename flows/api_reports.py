"""What a flow run sends the Prefect API besides its work: artifacts, progress, tags, its
final state. The batch's truth lives in the operational database, not in the API, so when
the API stops answering past its client's retries (PREFECT_CLIENT_MAX_RETRIES and their
backoff, about a minute by default) these reports are given up and the work goes on
(issue #26): a progress update that raised would fail the slice load it is called from.

Once one report of a run found the API gone, the run sends no more (each would wait out the
client's retries again), and the state the flow computed is kept, so the command that ran
it in this process can say what happened to the batch when the engine cannot report it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import httpx
from prefect.runtime import flow_run
from prefect.states import State

from fleet_import.errors import FleetImportError

log = logging.getLogger(__name__)
T = TypeVar("T")

# Flow run id -> the first error that showed the API gone in that run.
_api_gone: dict[str, BaseException] = {}
_last_computed: list[State] = []


class PrefectApiGone(FleetImportError):
    """The Prefect API does not answer, and a step cannot go on without it (a warehouse
    load slot): the step fails before it touched the warehouse."""


def api_unreachable(exc: BaseException) -> bool:
    """The Prefect API did not answer, or answered that it cannot serve (5xx), after the
    client's own retries: an outage, not a bug."""
    if isinstance(exc, httpx.TransportError):
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code >= 500
    return False


def describe_outage(exc: BaseException) -> str:
    """The one line's middle: what the API did, and what to check."""
    return f"the Prefect API does not answer ({type(exc).__name__}): check PREFECT_API_URL"


def api_gone() -> BaseException | None:
    """The error that showed the API gone during this flow run, if one did (outside a flow
    run, as under a test's `.fn()`, nothing is remembered: each report tries)."""
    run_id = flow_run.get_id()
    return _api_gone.get(run_id) if run_id else None


def note_api_gone(exc: BaseException, what: str) -> None:
    """Remember, once per run, that the API is gone; later reports are skipped."""
    run_id = flow_run.get_id()
    if run_id is None or run_id not in _api_gone:
        if run_id is not None:
            _api_gone[run_id] = exc
        log.warning(
            "%s: %s not sent; the run goes on without reporting to the API",
            describe_outage(exc),
            what,
        )


def report(what: str, send: Callable[[], T]) -> T | None:
    """`send()` a report to the API, or nothing once the API is gone in this run. An API
    that does not answer is noted and the report dropped (None); anything else raises."""
    if api_gone() is not None:
        return None
    try:
        return send()
    except Exception as exc:
        if not api_unreachable(exc):
            raise
        note_api_gone(exc, what)
        return None


def keep_computed_state(state: State) -> State:
    """The final state the flow's body computed, kept before the engine reports it."""
    _last_computed[:] = [state]
    return state


def last_computed_state() -> State | None:
    """In a process that ran one flow (the CLI): the state its body computed, if it got
    that far; the engine may have failed to report it."""
    return _last_computed[0] if _last_computed else None
