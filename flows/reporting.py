"""How outcomes look in the Prefect UI: final states and artifacts."""

from __future__ import annotations

import functools
import inspect
import logging
import os
import re
import uuid
from collections.abc import Callable, Mapping
from enum import IntEnum
from types import MappingProxyType
from typing import Any, TypeVar

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.states import Completed, Failed, State

from fleet_import.errors import FleetImportError, should_retry
from fleet_import.explain import explain
from fleet_import.importing import context
from fleet_import.importing.runtime import Runtime
from fleet_import.store.details import FailureKind, Summary
from fleet_import.tenants.binding import Refused
from flows.api_reports import api_unreachable, describe_outage, keep_computed_state, report

T = TypeVar("T")
log = logging.getLogger(__name__)

_REJECTS_SHOWN = 20
_REJECT_VALUE_SHOWN = 60


class ExitCode(IntEnum):
    """How `fleet-import run` and `resume` end: scripts and schedulers branch on it."""

    SUCCEEDED = 0
    FAILED = 1
    USAGE_ERROR = 2  # click's own code for a bad command line; no flow state maps to it
    SKIPPED = 3  # another batch holds the scope, a live worker runs it, or it had finished
    PUBLICATION_PENDING = 4  # the slice is committed; the batch runs until it is published
    ALREADY_LOADED = 5  # the slice already holds this content; nothing loaded (--force does)
    HELD = 6  # a slice guard or new columns (review) held the batch; batches approve loads it
    # the slice COMMIT got no answer and its stamp could not be read back: the batch stays
    # running, lease released; the next run, the drain or `resume` settles it from the stamp
    COMMIT_UNKNOWN = 7
    # 8 is left to a code another outcome may take; 9 stays the refusal.
    REFUSED = 9  # the folder is not the tenant's, or the tenant is unknown or disabled
    # sysexits.h EX_CONFIG: settings wrong, nothing started (the CLI's guard exits with it
    # before any flow runs, so no flow state maps to it either)
    CONFIGURATION_ERROR = 78


# The final state's name decides, not its type: "Committed" and "Skipped" are Completed
# states, yet neither is a success. A name missing here exits FAILED, never SUCCEEDED.
EXIT_CODES: Mapping[str, ExitCode] = MappingProxyType(
    {
        "Completed": ExitCode.SUCCEEDED,
        "Failed": ExitCode.FAILED,
        "Crashed": ExitCode.FAILED,
        "NotResumable": ExitCode.FAILED,  # resume_publication refused the batch
        "Skipped": ExitCode.SKIPPED,
        "NotClaimed": ExitCode.SKIPPED,
        "Committed": ExitCode.PUBLICATION_PENDING,
        "AlreadyLoaded": ExitCode.ALREADY_LOADED,
        "Refused": ExitCode.REFUSED,  # a Failed state: nothing was written for the tenant
        "Held": ExitCode.HELD,  # a Failed state: red in the UI, yet not a data error
        "CommitUnknown": ExitCode.COMMIT_UNKNOWN,  # a Failed state: nobody can say yet
    }
)


def exit_code_for(state: State) -> ExitCode:
    """The exit code of a flow's final state (EXIT_CODES); any other failed state is FAILED."""
    if state.is_failed() or state.is_crashed():
        code = EXIT_CODES.get(state.name, ExitCode.FAILED)
        return code if code is not ExitCode.SUCCEEDED else ExitCode.FAILED
    return EXIT_CODES.get(state.name, ExitCode.FAILED)


class BusinessFailure(Exception):
    """A failure the flow foresaw and reported: its state's message says all there is to say.

    A failed run's state carries one as its data, so when a worker's engine raises the
    state's result (as it does for every failed run) it raises this, and
    `quiet_business_failures` keeps Prefect's "unexpected exception" and its traceback out
    of the run's log. A crash (a bug) carries its own exception and is logged in full.
    """


def failed(message: str, *, name: str = "Failed", crash: BaseException | None = None) -> State:
    """A Failed state that is quiet in a worker's log, unless `crash` says it is a bug."""
    return Failed(name=name, message=message, data=crash or BusinessFailure(message))


def refused(refusal: Refused) -> State:
    """The Failed state named Refused of a delivery that is not the tenant's (exit 9)."""
    return failed(refusal.reason, name="Refused")


def foreseen_failure(exc: FleetImportError) -> State:
    """A foreseen error before the work starts (settings, a database that does not answer,
    one never migrated) as the run's Failed state: its one line with the next step, not
    "Flow run encountered an exception". FLEET_DEBUG=1 logs the traceback too."""
    debug = os.environ.get("FLEET_DEBUG", "").lower() not in ("", "0", "false", "no")
    return failed(explain(exc) or str(exc), crash=exc if debug else None)


def fails_with_one_line(fn: Callable[..., T]) -> Callable[..., T | State]:
    """Under every flow's @flow: a fleet-import error that escapes the flow's body (settings,
    a database, warehouse or bucket that does not answer, a step that gave up) ends the run
    Failed with its one line and next step (`foreseen_failure`), not Prefect's "Flow run
    encountered an exception" and a traceback; so does a Prefect API that does not answer.
    Anything else is a bug and stays a crash.
    tests/test_flows_first_contact.py checks that every flow of flows/ is wrapped."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> T | State:
        try:
            result = fn(*args, **kwargs)
        except FleetImportError as exc:
            result = foreseen_failure(exc)
        except Exception as exc:
            if not api_unreachable(exc):
                raise
            # A call the flow itself makes (its settings' blocks): one line, not a crash.
            result = failed(describe_outage(exc))
        # Kept for the command that ran the flow, should the engine fail to report it.
        return keep_computed_state(result) if isinstance(result, State) else result

    # Prefect validates parameters by the signature, resolving string annotations in the
    # function's module globals, which are this module's for `run`: resolved here instead.
    run.__signature__ = inspect.signature(fn, eval_str=True)  # type: ignore[attr-defined]
    run.fails_with_one_line = True  # type: ignore[attr-defined]
    return run


def foreseen_as_state(fn: Callable[..., T], *, retried: bool = True) -> Callable[..., T | State]:
    """A foreseen failure of a step (a fleet-import error Prefect is not to retry) becomes
    the task's Failed state: raised, Prefect's engine would log it with a traceback, as a
    crash, in this task and again in each task waiting on it. A transient error of a
    `retried` step is still raised (Prefect retries it); a step Prefect never retries (the
    slice load, publication) returns it as its state too. Anything else is a bug, raised and
    logged in full."""

    @functools.wraps(fn)
    def step(*args: Any, **kwargs: Any) -> T | State:
        try:
            return fn(*args, **kwargs)
        except FleetImportError as exc:
            if should_retry(exc) and retried:
                raise
            return Failed(message=f"{type(exc).__name__}: {exc}", data=exc)

    return step


class _QuietBusinessFailures(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], BusinessFailure):
            return False
        if record.exc_info and record.exc_info[1] and api_unreachable(record.exc_info[1]):
            # The engine could not report to an API that is gone: its one line says so; the
            # command that ran the flow says what happened to the batch.
            record.exc_info = None
        if record.exc_info and record.exc_info[1] is None:
            # A task that returned its Failed state is logged with exc_info=True outside any
            # exception, which would print "NoneType: None" under the message.
            record.exc_info = None
        return True


def quiet_business_failures() -> None:
    """Drop the engine's record of a business failure re-raised from the run's final state
    ("Engine execution exited with unexpected exception" and a traceback): the run already
    logged its Failed state and message. Idempotent; the flow modules call it on import."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _QuietBusinessFailures) for f in logger.filters):
            logger.addFilter(_QuietBusinessFailures())


quiet_business_failures()


def state_for(outcome: context.ImportOutcome, crash: BaseException | None = None) -> State:
    if isinstance(outcome, context.Committed):
        rows = ", ".join(f"{n:,} {dataset}" for dataset, n in outcome.row_counts.items())
        warned = outcome.summary.get("gate_warned")  # issue 49: published, and says so
        rows += f"; {warned}" if warned else ""
        if outcome.published:
            return Completed(message=f"batch {outcome.batch_id} succeeded: {rows}")
        return Completed(
            name="Committed",
            message=(
                f"batch {outcome.batch_id} committed its slice ({rows}) but is still running: "
                "publication is pending; the drain-publications flow or "
                f"`fleet-import resume {outcome.batch_id}` finishes it"
            ),
        )
    if isinstance(outcome, context.CommitUnknown):
        check = outcome.next_step or "check the warehouse, FLEET_WAREHOUSE_URL"
        return failed(
            f"batch {outcome.batch_id}: whether its slice committed is unknown ({outcome.error}); "
            "it stays running, and the next run of this folder, the drain-publications flow or "
            f"`fleet-import resume {outcome.batch_id}` settles it from the slice stamp once the "
            f"warehouse answers ({check})",
            name="CommitUnknown",
        )
    if isinstance(outcome, context.Failed) and outcome.kind == FailureKind.HELD:
        return failed(outcome.error, name="Held")
    if isinstance(outcome, context.Failed):
        # Both ways in: a shell with the CLI, or the UI's resume-publication deployment.
        hint = (
            f" (resumable: fleet-import resume {outcome.batch_id}, or run the "
            f"resume-publication deployment with batch_id={outcome.batch_id})"
            if outcome.resumable
            else ""
        )
        return failed(f"{outcome.kind}{hint}: {outcome.error}", crash=crash)
    if isinstance(outcome, context.NotClaimed):
        message = f"batch {outcome.batch_id} is executed by {outcome.holder}"
        return Completed(name="NotClaimed", message=message)
    if isinstance(outcome, context.Skipped):
        message = f"{outcome.scope} is held by batch {outcome.holder_batch_id}; skipped"
        return Completed(name="Skipped", message=message)
    if isinstance(outcome, context.NothingToDo):
        message = f"batch {outcome.batch_id} is already {outcome.status}: nothing to do"
        return Completed(name="Skipped", message=message)
    if isinstance(outcome, context.AlreadyLoaded) and outcome.finished_abandoned:
        message = (
            f"took over abandoned batch {outcome.owner_batch_id} (it committed before its "
            f"run died) and published it: {outcome.scope} holds this content now; nothing "
            "more to load (force reloads it)"
        )
        return Completed(name="AlreadyLoaded", message=message)
    if isinstance(outcome, context.AlreadyLoaded):
        message = (
            f"{outcome.scope} already holds this content, loaded by batch "
            f"{outcome.owner_batch_id}: nothing to do (force reloads it)"
        )
        return Completed(name="AlreadyLoaded", message=message)
    raise TypeError(f"unexpected outcome {outcome!r}")


def publish_artifacts(rt: Runtime, batch_id: uuid.UUID) -> None:
    """The batch summary as a table and the first rejects as markdown, on the flow run.
    Never raises: a view of the batch must not turn its settled outcome into a failure (the
    operational database gone after the batch succeeded would end the run Failed; a Prefect
    API gone drops them, flows/api_reports)."""
    try:
        report("the batch's artifacts", lambda: _publish_artifacts(rt, batch_id))
    except FleetImportError as exc:
        log.warning(
            "could not publish the artifacts of batch %s (the batch is as this run reports; "
            "`fleet-import batches show %s` once the database answers): %s",
            batch_id,
            batch_id,
            explain(exc),
        )


def _publish_artifacts(rt: Runtime, batch_id: uuid.UUID) -> None:
    batch = rt.ctx.repo.get(batch_id)
    if batch is None:
        return
    record = batch.record
    summary = record.summary or Summary()
    rows = [
        {
            "file": f.key,
            "dataset": f.dataset,
            "rows": f.rows,
            "rejects": f.rejects,
            "cache hit": f.cache_hit,
            "seconds": f.seconds,
        }
        for f in summary.files
    ]
    rows.append(
        {
            "file": f"batch {batch_id} ({batch.status})",
            "dataset": "all",
            "rows": record.rows,
            "rejects": record.reject_count,
            "cache hit": summary.cache_hits,
            "seconds": summary.seconds.get("commit", ""),
        }
    )
    create_table_artifact(rows, key="batch-summary", description=f"batch {batch_id}")
    rejects = record.rejects
    if rejects is not None and rejects.count:
        lines = [
            f"# {rejects.count:,} rejected rows in batch {batch_id}",
            "",
            f"All rejects: {escape_markdown(rejects.uri)}",
            "",
            "| file | line | column | reason | value |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r in rejects.sample[:_REJECTS_SHOWN]:
            value = str(r.get("value") or "")[:_REJECT_VALUE_SHOWN]  # cut before escaping
            line = f"{r['line']}-{r['last_line']}" if r.get("last_line") else r["line"]
            cells = (r["file"], line, r["column"], r["reason"], value)
            lines.append("| " + " | ".join(escape_markdown(cell) for cell in cells) + " |")
        create_markdown_artifact(
            "\n".join(lines), key="batch-rejects", description=f"first rejects of batch {batch_id}"
        )
    failure = record.failure
    if failure is not None:
        create_markdown_artifact(
            f"# batch {batch_id} failed ({escape_markdown(failure.kind)})\n\n"
            f"{escape_markdown(failure.error)}",
            key="batch-failure",
        )
    # Imported here: flows.gate_report escapes its cells with this module's escape_markdown.
    from flows.gate_report import publish_gate_artifact

    publish_gate_artifact(rt, batch)  # the content gate (issue 49)


# Everything markdown could read as structure or markup: table pipes, code spans, links
# and images, raw HTML, entities, emphasis, headings. CommonMark takes a backslash before
# any ASCII punctuation as that character itself; the backslash is escaped too, so data
# ending in one cannot escape our next pipe.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_~\[\]<>|#&])")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_LINE_BREAK_SHOWN = " \u21b5 "  # ↵: a table row must stay on one line
# What starts a list when it starts a line (headings and quotes are escaped everywhere).
_LEADING_LIST_MARKER = re.compile(r"^(\s*)([-+]|\d+(?=[.)]))")


def escape_markdown(value: object) -> str:
    """`value` as literal markdown text on one line, safe in a table cell or a paragraph."""
    text = _MARKDOWN_SPECIAL.sub(r"\\\1", _LINE_BREAK.sub(_LINE_BREAK_SHOWN, str(value)))
    return _LEADING_LIST_MARKER.sub(_escape_list_marker, text)


def _escape_list_marker(match: re.Match[str]) -> str:
    indent, marker = match.groups()
    if marker in "-+":
        return f"{indent}\\{marker}"
    return f"{indent}{marker}\\"  # "1." or "1)": the escaped "." or ")" follows
