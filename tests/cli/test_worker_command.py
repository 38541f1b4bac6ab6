"""`fleet-import worker` (issue 30): Prefect's process worker, each flow run started as the
engine in the worker's own interpreter, without the workspace supervisor that imports
Prefect once more per run. The flow runs it starts are tested in tests/workers (cluster)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from fleet_cli.run_client import SERVER_VARIABLE
from fleet_cli.worker_command import direct_engine_worker, engine_command
from tests.cli.run_cli import CONFIGURATION_ERROR, error_lines, fleet
from tests.prefect_server import REPO
from tests.test_deployments import _job_configuration


def _prepared(worker: object, values: dict) -> object:
    """The job configuration the worker gives a flow run of a deployment setting `values`
    as job variables, on a stock process pool."""
    from prefect.workers.process import ProcessWorker

    template = ProcessWorker.get_default_base_job_template()
    return _job_configuration(worker.job_configuration, template, values)


def test_a_run_starts_the_engine_in_the_workers_interpreter() -> None:
    configuration = _prepared(direct_engine_worker(work_pool_name="p"), {})
    assert configuration.command == engine_command()
    assert engine_command().split()[:3] == [sys.executable, "-m", "prefect.engine"]
    # What makes Prefect's process worker start the command itself, not its supervisor.
    assert configuration._command_configured is True


def test_a_command_the_deployment_sets_still_wins() -> None:
    configuration = _prepared(
        direct_engine_worker(work_pool_name="p"), {"command": "my-engine --flag"}
    )
    assert configuration.command == "my-engine --flag"


def test_the_stock_worker_would_go_through_its_supervisor() -> None:
    """The reference the change is measured against: Prefect's own process worker leaves no
    command configured, so its runs start the workspace supervisor."""
    from prefect.workers.process import ProcessWorker

    configuration = _prepared(ProcessWorker(work_pool_name="p"), {})
    assert configuration._command_configured is False


def test_without_a_prefect_api_the_worker_is_refused_in_one_line() -> None:
    result, _ = fleet("worker", "--limit", "1")
    assert result.returncode == CONFIGURATION_ERROR, result.stderr
    assert "Traceback" not in result.stderr
    [line] = error_lines(result)
    assert line.startswith("error: PREFECT_API_URL is not set")


def test_with_a_run_server_a_run_is_its_client_and_knows_where_it_listens() -> None:
    configuration = _prepared(direct_engine_worker("/tmp/x/runs.sock", work_pool_name="p"), {})
    assert configuration.command.split()[1:] == ["-m", "fleet_cli.run_client"]
    assert configuration.env[SERVER_VARIABLE] == "/tmp/x/runs.sock"
    deployed = _prepared(direct_engine_worker("/tmp/x/runs.sock", work_pool_name="p"),
                         {"command": "my-engine"})  # fmt: skip
    assert deployed.command == "my-engine" and SERVER_VARIABLE not in deployed.env


def test_a_client_with_no_run_server_becomes_the_engine(tmp_path) -> None:
    """What the run server is not there for (not started yet, or gone), the run still gets:
    its client execs `python -m prefect.engine`, which judges the run as it always does."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    environment.update(
        {SERVER_VARIABLE: str(tmp_path / "none.sock"), "PREFECT__FLOW_RUN_ID": "not-an-id"}
    )
    done = subprocess.run(
        [sys.executable, "-m", "fleet_cli.run_client"],
        env=environment, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"no run server at {tmp_path / 'none.sock'}; starting Prefect's engine" in done.stderr
    assert "Invalid flow run id" in done.stderr  # prefect.engine's own refusal


def test_a_pool_of_another_type_is_refused_with_prefects_own_worker_named(prefect_api) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from fleet_cli.worker_command import pool_mismatch

    name = f"k8s-{uuid.uuid4().hex[:8]}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=name, type="kubernetes"))
        client.create_work_pool(WorkPoolCreate(name=f"{name}-p", type="process"))
    assert pool_mismatch(name) == (
        f"work pool {name!r} is a kubernetes pool: fleet-import worker serves process pools; "
        f"start Prefect's worker for it (prefect worker start --pool {name} --type kubernetes)"
    )
    assert pool_mismatch(f"{name}-p") is None
    assert pool_mismatch(f"{name}-none") is None  # the worker creates it, as Prefect's does


@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("sigint", "signal_to"),
    [(signal.SIG_IGN, os.kill), (signal.SIG_DFL, os.kill), (signal.SIG_DFL, os.killpg)],
    ids=["started-by-a-script", "from-a-terminal", "its-whole-group"],
)
def test_one_sigterm_stops_an_idle_worker_with_its_run_server_and_socket(
    prefect_api, tmp_path, sigint, signal_to
) -> None:
    """A supervisor (systemd, Kubernetes) stops a worker with one SIGTERM and SIGKILLs it
    after a grace period: the idle worker must stop on that first signal, and take its run
    server and the server's socket with it (a SIGKILL would orphan both). Started by a shell
    script's `&`, the worker inherits SIGINT ignored: Prefect's handlers turned SIGTERM into
    that SIGINT, so the worker ignored it. Sent to the whole group (as systemd does), the
    SIGTERM ends the run server too, and the stopping worker does not start it again."""
    with _idle_worker(tmp_path, sigint) as (process, server, socket_path, log):
        signal_to(process.pid, signal.SIGTERM)  # its own session: its pid is its group's
        code = process.wait(timeout=_GRACE_SECONDS)
        printed = log.read_text(errors="replace")
        assert code == 0, printed
        assert "SIGTERM received: stopping" in printed and "worker: stopped" in printed
        assert _gone(server) and not socket_path.parent.exists(), printed
        assert "starting it again" not in printed


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_second_signal_stops_the_worker_at_once_and_its_run_server_too(
    prefect_api, tmp_path
) -> None:
    """An impatient second signal (Prefect's handlers SIGKILLed the worker itself then)
    still takes the run server and its socket with the worker."""
    with _idle_worker(tmp_path, signal.SIG_DFL) as (process, server, socket_path, log):
        os.kill(process.pid, signal.SIGTERM)
        os.kill(process.pid, signal.SIGINT)  # a second SIGTERM pending would be merged
        code = process.wait(timeout=_GRACE_SECONDS)
        printed = log.read_text(errors="replace")
        assert code == 128 + signal.SIGTERM, printed
        assert _gone(server) and not socket_path.parent.exists(), printed


# What a supervisor waits after its SIGTERM before it SIGKILLs (Kubernetes' default).
_GRACE_SECONDS = 30.0
_START_SECONDS = 120.0


@contextmanager
def _idle_worker(tmp_path: Path, sigint: Any) -> Iterator[tuple[Any, Any, Path, Path]]:
    """`fleet-import worker` as a child started with SIGINT's disposition `sigint`, once it
    polls an empty pool: (the process, its run server, the server's socket, its log)."""
    from prefect.settings import PREFECT_API_URL

    environment = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "PREFECT_"))}
    environment.update(PREFECT_API_URL=str(PREFECT_API_URL.value()), PYTHONPATH=str(REPO))
    log = tmp_path / "worker.log"
    pool = f"sigterm-{uuid.uuid4().hex[:8]}"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "fleet_cli", "worker", "--pool", pool, "--limit", "1"],
            env=environment, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
        )  # fmt: skip
    try:
        server = _wait_for(lambda: _run_server_of(process.pid), process, log, "a run server")
        socket_path = Path(server.cmdline()[-1])
        _wait_for(lambda: "started" in log.read_text(errors="replace"), process, log,
                  "the worker polling")  # fmt: skip
        assert socket_path.exists()
        yield process, server, socket_path, log
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def _gone(process: Any) -> bool:
    """Whether `process` (psutil) exited and was reaped: not left running under PID 1."""
    import psutil

    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _run_server_of(pid: int) -> Any:
    import psutil

    for child in psutil.Process(pid).children():
        with suppress(psutil.Error):
            if "fleet_cli.run_server" in child.cmdline():
                return child
    return None


def _wait_for(found: Callable[[], Any], process: subprocess.Popen, log: Path, what: str) -> Any:
    deadline = time.monotonic() + _START_SECONDS
    while not (value := found()):
        assert process.poll() is None, f"the worker exited: {log.read_text(errors='replace')}"
        assert time.monotonic() < deadline, f"no {what}: {log.read_text(errors='replace')}"
        time.sleep(0.2)
    return value
