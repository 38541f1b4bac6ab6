"""`fleet-import worker`: Prefect's process worker, each flow run forked from a run server
that has Prefect and the flows imported (`--no-preload`: the engine started directly).

A stock process worker with no `command` configured starts every flow run through Prefect's
workspace supervisor, a Python process that imports Prefect, prepares the run's workspace,
then replaces itself with `python -m prefect.engine`, which imports Prefect again: Prefect's
import is paid twice per run. Our deployments need none of what the supervisor adds (their
pull steps run in the engine either way), so a run here starts without it, as a process
worker's does when a pool or deployment sets `command`: as a client of the run server
(`fleet_cli.run_server`, `fleet_cli.run_client`), or as the engine in this interpreter
(benchmarks/README.md, `small_deliveries.py`: folders per minute and the host's CPU per
folder against `prefect worker start`, in one run). A command set by the pool or the
deployment still wins.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from types import FrameType
from typing import Annotated, Any

import typer

from fleet_cli.guard import CONFIGURATION_ERROR, error_line, prefect_ready
from fleet_cli.metrics_commands import MetricsPortOption, serving_metrics
from fleet_cli.run_client import SERVER_VARIABLE

DEFAULT_POOL = "fleet-process-pool"
_RUN_SERVER_START_SECONDS = 60.0
_RUN_SERVER_STOP_SECONDS = 10.0
_RUN_SERVER_RESTART_SECONDS = 1.0
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_STOPPED_AT_ONCE = 128 + signal.SIGTERM  # what a shell reports for a process SIGTERM ended


def engine_command(run_server: str | None = None) -> str:
    """The command of a flow run, in this interpreter (the one that holds the project,
    whatever PATH says): the engine itself, or a client of the run server at `run_server`."""
    from prefect.utilities.processutils import command_to_string

    module = "fleet_cli.run_client" if run_server else "prefect.engine"
    return command_to_string([sys.executable, "-m", module])


def direct_engine_worker(run_server: str | None = None, **options: Any) -> Any:
    """A `ProcessWorker` whose runs start `engine_command(run_server)` unless a command is
    set by the pool or the deployment."""
    from prefect.workers.process import ProcessJobConfiguration, ProcessWorker

    class DirectEngineConfiguration(ProcessJobConfiguration):
        def prepare_for_flow_run(self, *args: Any, **kwargs: Any) -> None:
            ours = self.command is None
            if ours:
                self.command = engine_command(run_server)
            super().prepare_for_flow_run(*args, **kwargs)
            if ours and run_server:
                self.env[SERVER_VARIABLE] = run_server

    worker = ProcessWorker(**options)
    # Per instance: a subclass would take over the "process" type in Prefect's registry.
    worker.job_configuration = DirectEngineConfiguration
    return worker


@dataclass(frozen=True)
class StopHooks:
    """What a stop signal does besides cancelling the worker, called from its handler: on
    the first (`begun`), and on a second, before the worker exits at once (`at_once`)."""

    begun: list[Callable[[], None]] = field(default_factory=list)
    at_once: list[Callable[[], None]] = field(default_factory=list)


@contextmanager
def run_server(hooks: StopHooks) -> Iterator[str | None]:
    """The run server (`fleet_cli.run_server`) for this worker's runs, its socket's path
    once it listens (None, said on stderr, when it did not start: runs then start the engine
    directly); started again whenever it exits while the worker runs, but not once a stop
    has begun (a supervisor's SIGTERM to the whole group ends it too). A worker stopped at
    once kills it and removes its socket's folder before it exits: nothing outlives it."""
    with tempfile.TemporaryDirectory(prefix="fleet-worker-") as folder:
        path = os.path.join(folder, "runs.sock")
        command = [sys.executable, "-m", "fleet_cli.run_server", path]
        server = [subprocess.Popen(command)]
        stopping = threading.Event()

        def kill_now() -> None:
            stopping.set()
            with suppress(OSError):
                server[0].kill()
                server[0].wait(_RUN_SERVER_STOP_SECONDS)
            shutil.rmtree(folder, ignore_errors=True)

        hooks.begun.append(stopping.set)
        hooks.at_once.append(kill_now)

        def keep_serving() -> None:
            while not stopping.is_set():
                code = server[0].wait()
                if stopping.wait(_RUN_SERVER_RESTART_SECONDS):
                    return
                print(f"fleet-import worker: the run server exited ({code}); starting it again",
                      file=sys.stderr)  # fmt: skip
                server[0] = subprocess.Popen(command)

        deadline = time.monotonic() + _RUN_SERVER_START_SECONDS
        while not os.path.exists(path) and server[0].poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        listening = os.path.exists(path)
        if listening:
            threading.Thread(target=keep_serving, daemon=True).start()
        else:
            print(
                "fleet-import worker: the run server did not start; each flow run starts "
                "Prefect's engine directly",
                file=sys.stderr,
            )
        try:
            yield path if listening else None
        finally:
            stopping.set()
            server[0].terminate()
            try:
                server[0].wait(_RUN_SERVER_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                server[0].kill()


def pool_mismatch(pool: str) -> str | None:
    """Why this worker must not serve `pool` (a pool of another type: its runs would start
    here as processes, not as its pods or tasks), or None (a process pool, or none yet:
    the worker creates it)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            kind = client.read_work_pool(pool).type
        except ObjectNotFound:
            return None
    if kind == "process":
        return None
    return (
        f"work pool {pool!r} is a {kind} pool: fleet-import worker serves process pools; "
        f"start Prefect's worker for it (prefect worker start --pool {pool} --type {kind})"
    )


async def _serve(options: dict[str, Any], hooks: StopHooks) -> None:
    """The worker until it is told to stop: the first SIGTERM or SIGINT cancels it (its
    run server stopped after it), a second one stops it at once (`hooks`)."""
    import asyncio

    import anyio
    from prefect.settings import PREFECT_WORKER_HEARTBEAT_SECONDS, PREFECT_WORKER_PREFETCH_SECONDS

    worker = direct_engine_worker(
        prefetch_seconds=PREFECT_WORKER_PREFETCH_SECONDS.value(),
        heartbeat_interval_seconds=int(PREFECT_WORKER_HEARTBEAT_SECONDS.value()),
        **options,
    )
    loop = asyncio.get_running_loop()
    with anyio.CancelScope() as serving:
        _stop_on_signals(lambda: loop.call_soon_threadsafe(serving.cancel), hooks)
        await worker.start(printer=print)


def _stop_on_signals(cancel: Callable[[], None], hooks: StopHooks) -> None:
    """Our own handlers, not Prefect's worker ones: those turn SIGTERM into a SIGINT sent to
    the worker itself, which is lost when it was started with SIGINT ignored (a shell
    script's `cmd &` starts it so), and SIGKILL it on the second signal, which orphans the
    run server and leaves its socket behind. Python runs these in the main thread, where the
    event loop runs."""

    def stop(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        print(f"fleet-import worker: {name} received: stopping (a second signal stops it at "
              "once)", file=sys.stderr, flush=True)  # fmt: skip
        for each in _STOP_SIGNALS:
            signal.signal(each, stop_at_once)
        for begin in hooks.begun:
            begin()
        cancel()

    def stop_at_once(signum: int, _frame: FrameType | None) -> None:
        for kill in hooks.at_once:
            kill()
        os._exit(_STOPPED_AT_ONCE)

    for each in _STOP_SIGNALS:
        signal.signal(each, stop)


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
    preload: Annotated[
        bool,
        typer.Option(
            "--preload/--no-preload",
            help="fork each flow run from a process with Prefect and the flows imported",
        ),
    ] = True,
    metrics_port: MetricsPortOption = None,
) -> None:
    """Run a process worker for the fleet-import deployments (SIGTERM or Ctrl-C stops it).

    What `prefect worker start --pool fleet-process-pool` does, but each flow run is forked
    from a process that has Prefect and the flows imported (--no-preload: Prefect's engine
    started in this worker's Python), not started through Prefect's workspace supervisor,
    which imports Prefect twice per run.

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
    mismatch = pool_mismatch(pool)
    if mismatch:
        error_line(mismatch)
        raise typer.Exit(CONFIGURATION_ERROR)
    options = {"work_pool_name": pool, "name": name, "work_queues": work_queue, "limit": limit}
    hooks = StopHooks()
    with (
        serving_metrics(metrics_port),
        run_server(hooks) if preload else nullcontext() as server,
        suppress(KeyboardInterrupt),  # a Ctrl-C before the worker's own handlers are set
    ):
        anyio.run(_serve, {**options, "run_server": server}, hooks)
    print("fleet-import worker: stopped", file=sys.stderr)
