"""`fleet-import worker`: Prefect's process worker, each flow run started as the engine
itself in this worker's interpreter.

A stock process worker with no `command` configured starts every flow run through Prefect's
workspace supervisor, a Python process that imports Prefect, prepares the run's workspace,
then replaces itself with `python -m prefect.engine`, which imports Prefect again: Prefect's
import is paid twice per run. Our deployments need none of what the supervisor adds (their
pull steps run in the engine either way), so a run here starts the engine directly, as a
process worker does when a pool or deployment sets `command` (benchmarks/README.md,
`workers_scale.py`: the per-run CPU and folders per minute, both ways, in one run). A
command set by the pool or the deployment still wins.
"""

from __future__ import annotations

import os
import sys
from contextlib import suppress
from typing import Annotated, Any

import typer

from fleet_cli.cli import app
from fleet_cli.guard import CONFIGURATION_ERROR, error_line, prefect_ready

DEFAULT_POOL = "fleet-process-pool"


def engine_command() -> str:
    """The engine, in this interpreter: the one that holds the project, whatever PATH says."""
    from prefect.utilities.processutils import command_to_string

    return command_to_string([sys.executable, "-m", "prefect.engine"])


def direct_engine_worker(**options: Any) -> Any:
    """A `ProcessWorker` whose runs start `engine_command()` unless a command is set."""
    from prefect.workers.process import ProcessJobConfiguration, ProcessWorker

    class DirectEngineConfiguration(ProcessJobConfiguration):
        def prepare_for_flow_run(self, *args: Any, **kwargs: Any) -> None:
            if self.command is None:
                self.command = engine_command()
            super().prepare_for_flow_run(*args, **kwargs)

    worker = ProcessWorker(**options)
    # Per instance: a subclass would take over the "process" type in Prefect's registry.
    worker.job_configuration = DirectEngineConfiguration
    return worker


async def _serve(options: dict[str, Any]) -> None:
    from prefect.settings import PREFECT_WORKER_HEARTBEAT_SECONDS, PREFECT_WORKER_PREFETCH_SECONDS
    from prefect.utilities.processutils import setup_signal_handlers_worker

    setup_signal_handlers_worker(os.getpid(), "the fleet-import process worker", print)
    worker = direct_engine_worker(
        prefetch_seconds=PREFECT_WORKER_PREFETCH_SECONDS.value(),
        heartbeat_interval_seconds=int(PREFECT_WORKER_HEARTBEAT_SECONDS.value()),
        **options,
    )
    await worker.start(printer=print)


@app.command("worker")
def worker(
    pool: Annotated[
        str,
        typer.Option("--pool", "-p", envvar="FLEET_WORK_POOL", show_envvar=True, help="work pool"),
    ] = DEFAULT_POOL,
    name: Annotated[str | None, typer.Option("--name", "-n", help="worker name")] = None,
    work_queue: Annotated[
        list[str] | None, typer.Option("--work-queue", "-q", help="queues to serve (repeatable)")
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", "-l", min=1, help="flow runs at once")
    ] = None,
) -> None:
    """Run a process worker for the fleet-import deployments (Ctrl-C stops it).

    What `prefect worker start --pool fleet-process-pool` does, but each flow run starts
    Prefect's engine in this worker's Python directly, not through Prefect's workspace
    supervisor, which imports Prefect once more per run.

    Example: fleet-import worker --limit 2   (with FLEET_PROJECT_DIR set to this checkout)
    """
    import anyio

    if not os.environ.get("PREFECT_API_URL"):
        error_line(
            "PREFECT_API_URL is not set: a worker serves the work pool of the Prefect server "
            "the deployments were applied to; set it to that server's API"
        )
        raise typer.Exit(CONFIGURATION_ERROR)
    prefect_ready()
    options = {"work_pool_name": pool, "name": name, "work_queues": work_queue, "limit": limit}
    with suppress(KeyboardInterrupt):  # Prefect's handlers print that it stopped
        anyio.run(_serve, options)
