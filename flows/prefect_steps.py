"""The import's steps as Prefect tasks: the `StepRunner` every flow that loads a slice
(import, approve, rollback) runs the core's operation with. Each step is a task retried
only on transient errors, as the step says; the slice load holds a warehouse load slot."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from prefect import Task, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture

from fleet_import.errors import FleetImportError
from fleet_import.importing.driver import Step
from flows.common import (
    TASK_RETRIES,
    TASK_RETRY_DELAYS,
    TASK_RETRY_JITTER,
    holding_load_slots,
    retry_if_transient,
)
from flows.reporting import foreseen_as_state

T = TypeVar("T")
# Task run names: the normalize step's shows the file it reads. "normalise" (and the
# artifact key "normalise-progress") keep the spelling Prefect recorded for earlier runs.
_RUN_NAMES = {"normalise": "normalise/{job.obj.name}"}


class PrefectSteps:
    """The driver's steps as Prefect tasks, on the flow's task runner. A step's error
    reaches the driver as the step's exception, as under CoreSteps; `crash` keeps the first
    one that is not a fleet-import error (a bug), so the run's state can say so."""

    def __init__(self) -> None:
        self._tasks: dict[tuple[str, Callable[..., Any]], Task[..., Any]] = {}
        self.crash: BaseException | None = None

    def _task(self, step: Step, fn: Callable[..., T]) -> Task[..., T]:
        key = (step.name, fn)
        if key not in self._tasks:
            retries: dict[str, Any] = {}
            if step.retried:
                retries = {
                    "retries": TASK_RETRIES,
                    "retry_delay_seconds": TASK_RETRY_DELAYS,
                    "retry_jitter_factor": TASK_RETRY_JITTER,
                    "retry_condition_fn": retry_if_transient,
                }
            if step.name == "commit-slice":  # one warehouse load slot, one of the tenant's
                fn = holding_load_slots(fn)
            self._tasks[key] = task(
                foreseen_as_state(fn, retried=step.retried),
                name=step.name,
                task_run_name=_RUN_NAMES.get(step.name),
                cache_policy=NO_CACHE,
                **retries,
            )
        return self._tasks[key]

    def run(self, step: Step, fn: Callable[..., T], *args: Any) -> T:
        # The state, not the call's value: a task that returned a Failed state would hand
        # back that state; its result() raises the step's exception.
        return self._raised(self._task(step, fn)(*args, return_state=True).result)

    def map(self, step: Step, fn: Callable[..., T], args: Sequence[tuple]) -> Iterator[T]:
        """As under CoreSteps, once an item failed the items not yet started never start:
        the run ends when the ones under way do (an S3 that stopped answering costs one
        call's bound, not one per file the task runner still had queued)."""
        if not args:
            return
        columns = [list(column) for column in zip(*args, strict=True)]
        futures = list(self._task(step, fn).map(*columns))
        for future in futures:
            future.add_done_callback(lambda done: _cancel_after_failure(done, futures))
        for future in futures:
            yield self._raised(future.result)

    def _raised(self, result: Callable[[], T]) -> T:
        try:
            return result()
        except FleetImportError:
            raise
        except Exception as exc:
            self.crash = self.crash or exc
            raise


def _cancel_after_failure(done: PrefectFuture[Any], futures: Sequence[PrefectFuture[Any]]) -> None:
    """A done callback: when `done` failed, cancel the futures not yet started. It runs in
    the worker that ran `done`, before that worker takes the next queued item."""
    try:
        outcome = done.result(raise_on_failure=False)
    except BaseException:  # noqa: BLE001 - cancelled: not a failure of its own
        return
    if not isinstance(outcome, BaseException):
        return
    for future in futures:
        wrapped = getattr(future, "wrapped_future", None)
        if wrapped is not None:
            wrapped.cancel()  # a queued item never starts; a running one carries on
