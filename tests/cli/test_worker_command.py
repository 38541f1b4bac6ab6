"""`fleet-import worker` (issue 30): Prefect's process worker, each flow run started as the
engine in the worker's own interpreter, without the workspace supervisor that imports
Prefect once more per run. The flow runs it starts are tested in tests/workers (cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from fleet_cli.run_client import SERVER_VARIABLE
from fleet_cli.worker_command import direct_engine_worker, engine_command
from tests.cli.run_cli import CONFIGURATION_ERROR, error_lines, fleet
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
