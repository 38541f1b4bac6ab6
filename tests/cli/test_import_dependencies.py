"""A dependency an import needs that fails *during* the import (the landing bucket, S3's
credentials or endpoint, the warehouse) ends as one line naming it and what to check: in
the CLI's output, in the run's state message (which is what the CLI prints) and in the
batch's recorded error. Secrets are never echoed."""

from __future__ import annotations

import os
import uuid

import pytest

from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.store.repository import BatchRepository
from tests.cli.run_cli import CPU_BOUND_SECONDS, SECRET, closed_port_url, fleet
from tests.helpers import upload
from tests.prefect_server import free_port

pytestmark = pytest.mark.slow  # Prefect's harness; the CLI's runs start Prefect's client


def _flow_env() -> dict[str, str]:
    """What flow_env set, for the CLI in a clean environment, plus the harness's API."""
    from prefect.settings import PREFECT_API_URL

    env = {k: v for k, v in os.environ.items() if k.startswith("FLEET_")}
    return {**env, "PREFECT_API_URL": str(PREFECT_API_URL.value())}


def _recorded_error(database_url: str) -> str:
    (batch,) = BatchRepository(database_url).list()
    return batch.details["failure"]["error"]


def _assert_one_failed_line(result, cpu_seconds: float, *parts: str) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("Failed: ")]
    for part in parts:
        assert part in line, (part, line)
    assert cpu_seconds < CPU_BOUND_SECONDS * 4
    return line


def test_a_missing_landing_bucket(flow_env: str) -> None:
    bucket = f"fleet-landing-{uuid.uuid4().hex[:12]}"  # never created
    folder = today_folder(bucket, "acme")
    result, cpu_seconds = fleet("run", "--tenant", "acme", folder, **_flow_env())
    next_step = "create it, or check the folder's bucket (s3://bucket/prefix/)"
    line = _assert_one_failed_line(result, cpu_seconds, "NoSuchBucket", bucket, next_step)
    assert line.endswith(next_step), line
    assert _recorded_error(flow_env).endswith(next_step)


def test_no_aws_credentials(flow_env: str, s3, landing_bucket: str, tmp_path) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=10))
    env = _flow_env()
    result, cpu_seconds = fleet(
        "run", "--tenant", "acme", folder, **env,
        AWS_ACCESS_KEY_ID="", AWS_SECRET_ACCESS_KEY="",
        AWS_CONFIG_FILE=str(tmp_path / "no-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-credentials"),
        AWS_EC2_METADATA_DISABLED="true",  # never ask an instance metadata service
    )
    next_step = "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
    line = _assert_one_failed_line(result, cpu_seconds, "Unable to locate credentials", next_step)
    assert line.endswith(next_step), line
    assert _recorded_error(flow_env).endswith(next_step)


@pytest.fixture
def no_retry_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The import's transient steps and its slice load still retry, without the waits
    between attempts."""
    import flows.prefect_steps as module
    from fleet_import.importing import load
    from fleet_import.retry import Backoff

    monkeypatch.setattr(module, "TASK_RETRY_DELAYS", [0.0] * module.TASK_RETRIES)
    monkeypatch.setattr(load, "LOAD_BACKOFF", Backoff((0.0,) * load.LOAD_BACKOFF.retries))


@pytest.mark.usefixtures("no_retry_waits")
def test_an_s3_endpoint_that_does_not_answer(
    flow_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.import_s3_folder import import_s3_folder

    monkeypatch.setenv("FLEET_S3_MAX_ATTEMPTS", "1")  # botocore's own retries
    monkeypatch.setenv("FLEET_S3_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    state = import_s3_folder(
        tenant_id="acme", folder=today_folder("fleet-landing", "acme"), return_state=True
    )
    next_step = "check FLEET_S3_ENDPOINT_URL (or the network to AWS)"
    assert state.is_failed() and state.message.endswith(next_step), state.message
    assert "\n" not in state.message
    assert _recorded_error(flow_env).endswith(next_step)


@pytest.mark.usefixtures("no_retry_waits")
def test_a_warehouse_that_stops_answering(
    flow_env: str, monkeypatch: pytest.MonkeyPatch, s3, landing_bucket: str
) -> None:
    from flows.import_s3_folder import import_s3_folder

    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=10))
    monkeypatch.setenv("FLEET_WAREHOUSE_URL", closed_port_url())
    state = import_s3_folder(tenant_id="acme", folder=folder, return_state=True)
    next_step = "check FLEET_WAREHOUSE_URL (host:port) and that the server runs"
    assert state.is_failed() and state.message.endswith(next_step), state.message
    assert state.message.startswith("failed_pre_commit")
    assert "\n" not in state.message and SECRET not in state.message
    recorded = _recorded_error(flow_env)
    assert recorded.endswith(next_step) and SECRET not in recorded
