"""The import flow's task runner, chosen when a run starts rather than when the flow module
is imported: a thread pool of FLEET_NORMALIZE_WORKERS threads, or, with
FLEET_DASK_ADDRESS set, the Dask cluster at that address (prefect-dask's DaskTaskRunner).

Only mapped steps (normalizing a delivery's files) go through it; the other steps run in
the flow's own thread. On Dask, each file's task gets the import context rebuilt from the
run's settings on its worker (fleet_import.importing.runtime), and its normalized output reaches the
flow through the S3 staging area.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prefect.context import TaskRunContext
from prefect.futures import PrefectFuture
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from fleet_import.config import Settings


def chosen_runner(settings: Settings) -> TaskRunner[Any]:
    if settings.dask_address:
        from prefect_dask import DaskTaskRunner

        return DaskTaskRunner(address=settings.dask_address)
    return ThreadPoolTaskRunner(max_workers=settings.normalize_workers)


class SettingsTaskRunner(TaskRunner[PrefectFuture[Any]]):
    """Delegates to the runner the settings choose when the flow run starts it."""

    def __init__(self) -> None:
        super().__init__()
        self._inner: TaskRunner[Any] | None = None
        self._remote = False

    @property
    def inner(self) -> TaskRunner[Any]:
        if self._inner is None:
            raise RuntimeError("the task runner must be started before submitting work")
        return self._inner

    def duplicate(self) -> SettingsTaskRunner:
        return type(self)()

    def submit(
        self,
        task: Any,
        parameters: dict[str, Any],
        wait_for: Iterable[PrefectFuture[Any]] | None = None,
        dependencies: dict[str, set[Any]] | None = None,
    ) -> PrefectFuture[Any]:
        if not self._remote:
            return self.inner.submit(task, parameters, wait_for, dependencies)
        # The normalize tasks are submitted from inside the slice load's task, whose run
        # context (its parameters: a generator, connections) would be shipped with each:
        # they are submitted as the flow's, from outside it.
        token = TaskRunContext.__var__.set(None)
        try:
            return self.inner.submit(task, parameters, wait_for, dependencies)
        finally:
            TaskRunContext.__var__.reset(token)

    def map(self, task: Any, parameters: dict[str, Any], wait_for: Any = None) -> Any:
        # TaskRunner.map submits each item through self.submit (above), not the inner's.
        return TaskRunner.map(self, task, parameters, wait_for)

    def cancel_all(self) -> None:
        cancel = getattr(self._inner, "cancel_all", None)
        if cancel is not None:
            cancel()

    def __enter__(self) -> SettingsTaskRunner:
        super().__enter__()
        settings = Settings()
        self._inner = chosen_runner(settings)
        self._remote = bool(settings.dask_address)
        self._inner.__enter__()
        self.logger.debug("tasks run on %s", type(self._inner).__name__)
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        try:
            if self._inner is not None:
                self._inner.__exit__(exc_type, exc_value, traceback)
        finally:
            self._inner = None
            super().__exit__(exc_type, exc_value, traceback)
