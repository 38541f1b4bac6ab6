"""A flow run in this process whose end the Prefect API could not be told (issue #26).

The work does not need the API: the batch's state lives in the operational database, and
the flow's body gives up its reports when the API is gone (flows/api_reports.py). But the
engine must report the final state, and past the client's retries it raises instead. Then
the state the flow computed is the truth about the batch: it is printed in one line with
the API named, and its exit code is the batch's. The process then exits within a bound:
Prefect's event and log workers would otherwise try, at exit, to deliver every queued event
(about 7 s each against an API that refuses), so a large delivery's exit was unbounded.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from rich.console import Console
from rich.text import Text

from fleet_cli.guard import debugging

if TYPE_CHECKING:
    from prefect.states import State

UNDELIVERED_DRAIN_SECONDS = 5.0
"""How long the exit waits for Prefect's queued events and logs once the API is gone."""

_console = Console()
_err_console = Console(stderr=True)


def run_flow(start: Callable[[], State]) -> State:
    """`start()` the flow (with return_state=True) and return its final state; when the API
    could not be told its end, say what the flow computed and exit with that state's code."""
    from flows.api_reports import api_unreachable, last_computed_state

    try:
        return start()
    except Exception as exc:
        if not api_unreachable(exc):
            raise
        _say_unreported(last_computed_state(), exc)


def _say_unreported(state: State | None, exc: BaseException) -> NoReturn:
    from flows.api_reports import describe_outage
    from flows.reporting import ExitCode, exit_code_for

    if debugging():
        traceback.print_exception(exc, file=sys.stderr)
    outage = describe_outage(exc)
    if state is None:  # the flow's body never ended: no batch state to tell
        _err_console.print(
            Text.assemble(("error:", "red"), f" the flow run could not start or end: {outage}"),
            soft_wrap=True,
        )
        _exit_bounded(int(ExitCode.FAILED))
    code = exit_code_for(state)
    colour = {ExitCode.SUCCEEDED: "green", ExitCode.FAILED: "red"}.get(code, "yellow")
    line = Text.assemble(
        (state.name, colour),
        ": ",
        state.message or "",
        f"; but its flow run could not be reported: {outage} "
        "(the Prefect UI shows the run as the API last heard of it)",
    )
    _console.print(line, soft_wrap=True)
    _exit_bounded(int(code))


def _exit_bounded(code: int) -> NoReturn:
    """Give Prefect's queued events and logs a few seconds (the API may be back), then end
    the process without the unbounded drain Prefect runs at exit. The batch's lease was
    released when its work ended; nothing of the import waits on these queues."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    sys.stdout.flush()
    sys.stderr.flush()
    for worker in (EventsWorker, APILogWorker):
        worker.drain_all(timeout=UNDELIVERED_DRAIN_SECONDS / 2)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
