"""`fleet-import worker` (issue 30): Prefect's process worker, each flow run started as the
engine in the worker's own interpreter, without the workspace supervisor that imports
Prefect once more per run. The flow runs it starts are tested in tests/workers (cluster)."""

from __future__ import annotations

import sys

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
