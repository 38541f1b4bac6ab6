"""Another tenant's folder, an unknown or a disabled tenant: refused before anything is
written, through the flow (called, and a manual deployment run executed as a process worker
executes it), the CLI, the relay and the sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fleet_cli.cli import app
from fleet_import.intake.dead_letters import FileDeadLetter
from fleet_import.intake.relay import Relay, RelayStats
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.store.repository import BatchRepository
from fleet_import.tenants.binding import DELIVERY_REFUSED_EVENT
from fleet_import.tenants.registry import load_registry
from tests.cli.run_cli import invoke_with_test_settings
from tests.helpers import curated, upload
from tests.prefect_reads import resource_events
from tests.s3fixtures import notify_queue_of, put_objects

REGISTRY = "tenants:\n  acme: {}\n  globex:\n    enabled: false\n"


def _nothing_written(database_url: str) -> None:
    assert BatchRepository(database_url).list() == []
    for table in ("fleet_trips", "fleet_vehicles"):
        assert curated(database_url, f"SELECT count(*) FROM curated.{table}") == [(0,)]


def _refused_events(folder: str, expected: int = 1) -> list[Any]:
    return resource_events(f"fleet.delivery.{folder}", DELIVERY_REFUSED_EVENT, expected)


@pytest.mark.slow
def test_the_flow_refuses_another_tenant_s_folder(flow_env: str, s3, landing_bucket: str) -> None:
    from flows.import_s3_folder import import_s3_folder
    from flows.reporting import ExitCode, exit_code_for

    globex = today_folder(landing_bucket, "globex")
    upload(s3, globex, fleet_delivery(trips=20))
    state = import_s3_folder(tenant_id="acme", folder=globex, return_state=True)
    assert state.is_failed() and state.name == "Refused", state.message
    assert exit_code_for(state) == ExitCode.REFUSED == 9
    assert "'globex'" in state.message and "'acme'" in state.message
    assert "landing layout {tenant}/fleet/{yyyy-mm-dd}/" in state.message
    _nothing_written(flow_env)
    (event,) = _refused_events(globex)
    assert event.payload["kind"] == "other_tenant"
    assert event.payload["owner_tenant_id"] == "globex"
    assert event.resource["fleet.tenant"] == "acme"


@pytest.mark.slow
def test_the_flow_refuses_a_disabled_tenant(
    flow_env: str, s3, landing_bucket: str, tmp_path: Path, monkeypatch
) -> None:
    from flows.import_s3_folder import import_s3_folder

    registry = tmp_path / "tenants.yaml"
    registry.write_text(REGISTRY)
    monkeypatch.setenv("FLEET_TENANTS", str(registry))
    globex = today_folder(landing_bucket, "globex")
    upload(s3, globex, fleet_delivery(trips=20))
    state = import_s3_folder(tenant_id="globex", folder=globex, return_state=True)
    assert state.name == "Refused" and "disabled" in state.message, state.message
    unknown = today_folder(landing_bucket, "hooli")
    upload(s3, unknown, fleet_delivery(trips=20))
    state = import_s3_folder(tenant_id="hooli", folder=unknown, return_state=True)
    assert state.name == "Refused" and "not in the tenant registry" in state.message
    _nothing_written(flow_env)
    acme = today_folder(landing_bucket, "acme")
    upload(s3, acme, fleet_delivery(trips=20))
    state = import_s3_folder(tenant_id="acme", folder=acme, return_state=True)
    assert state.name == "Completed", state.message


@pytest.mark.slow
def test_the_cli_exits_9_and_writes_nothing(flow_env: str, s3, landing_bucket: str) -> None:
    globex = today_folder(landing_bucket, "globex")
    upload(s3, globex, fleet_delivery(trips=20))
    done = invoke_with_test_settings("run", "--tenant", "acme", globex, COLUMNS="300")
    assert done.returncode == 9, done.stdout + done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("Refused")]
    assert f"{globex} belongs to tenant 'globex', not 'acme'" in line
    _nothing_written(flow_env)


def _manual_deployment_run(deployment: str, parameters: dict[str, str]) -> Any:
    """A run of `deployment` as the UI's Run button makes it, executed as a process worker
    executes it (`python -m prefect.engine FLOW_RUN_ID` in a process of its own); its final
    flow run."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    scheduled = run_deployment(deployment, parameters=parameters, timeout=0)
    done = subprocess.run(
        [sys.executable, "-m", "prefect.engine", str(scheduled.id)],
        env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()},
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=600,
    )
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(scheduled.id)
    assert flow_run.state is not None and flow_run.state.is_final(), done.stderr[-3000:]
    return flow_run


@pytest.mark.slow
def test_a_manual_deployment_run_refuses_another_tenant_s_folder_and_a_disabled_tenant(
    flow_env: str, s3, landing_bucket: str, tmp_path: Path, monkeypatch
) -> None:
    from flows.import_s3_folder import import_s3_folder

    name = f"import-{uuid.uuid4().hex[:8]}"
    import_s3_folder.to_deployment(name=name).apply()
    globex = today_folder(landing_bucket, "globex")
    upload(s3, globex, fleet_delivery(trips=20))
    run = _manual_deployment_run(
        f"import-s3-folder/{name}", {"tenant_id": "acme", "folder": globex}
    )
    assert run.state.name == "Refused", run.state.message
    assert f"{globex} belongs to tenant 'globex', not 'acme'" in run.state.message
    _nothing_written(flow_env)
    (event,) = _refused_events(globex)
    assert event.payload["source"] == "import-s3-folder"

    registry = tmp_path / "tenants.yaml"
    registry.write_text(REGISTRY)
    monkeypatch.setenv("FLEET_TENANTS", str(registry))  # the worker's environment
    run = _manual_deployment_run(
        f"import-s3-folder/{name}", {"tenant_id": "globex", "folder": globex}
    )
    assert run.state.name == "Refused", run.state.message
    assert "tenant 'globex' is disabled in the tenant registry" in run.state.message
    _nothing_written(flow_env)


@pytest.mark.slow
def test_the_cli_refuses_a_disabled_tenant(
    flow_env: str, s3, landing_bucket: str, tmp_path: Path, monkeypatch
) -> None:
    registry = tmp_path / "tenants.yaml"
    registry.write_text(REGISTRY)
    monkeypatch.setenv("FLEET_TENANTS", str(registry))
    globex = today_folder(landing_bucket, "globex")
    upload(s3, globex, fleet_delivery(trips=20))
    done = CliRunner().invoke(app, ["run", "--tenant", "globex", globex], env={"COLUMNS": "300"})
    assert done.exit_code == 9, done.output
    (line,) = [line for line in done.output.splitlines() if line.startswith("Refused")]
    assert "tenant 'globex' is disabled in the tenant registry" in line
    _nothing_written(flow_env)


def test_the_relay_refuses_a_key_in_another_tenant_s_registered_area(
    s3, sqs, landing_bucket: str, tmp_path: Path
) -> None:
    """The key's place in the layout names globex, the registry gives that area to acme:
    the relay believes neither label nor layout alone, and emits nothing for it."""
    url = sqs.create_queue(
        QueueName=f"fleet-relay-{uuid.uuid4().hex[:12]}", Attributes={"VisibilityTimeout": "1"}
    )["QueueUrl"]
    notify_queue_of(s3, sqs, landing_bucket, url)
    registry_file = tmp_path / "tenants.yaml"
    registry_file.write_text(
        f"tenants:\n  acme:\n    landing_prefixes: s3://{landing_bucket}/globex/\n  globex: {{}}\n"
    )
    emitted: list[Any] = []
    announced: list[tuple[str, dict[str, Any]]] = []
    relay = Relay(
        sqs,
        url,
        emitted.append,
        dead_letter=FileDeadLetter(str(tmp_path / "dead.jsonl")),
        wait_seconds=1,
        events=lambda name, payload: announced.append((name, dict(payload))),
        registry=load_registry(registry_file),
    )
    globex = today_folder(landing_bucket, "globex").removeprefix(f"s3://{landing_bucket}/")
    put_objects(s3, landing_bucket, {globex + "_SUCCESS": b""})
    totals = RelayStats()
    deadline = time.monotonic() + 15
    while totals.emitted + totals.skipped < 1:
        assert time.monotonic() < deadline, totals
        totals.add(relay.poll_once())
    assert emitted == []
    (refusal,) = [payload for name, payload in announced if name == DELIVERY_REFUSED_EVENT]
    assert refusal["kind"] == "other_tenant" and refusal["owner_tenant_id"] == "acme"
    assert refusal["tenant_id"] == "globex" and "'acme'" in refusal["reason"]


def test_the_relay_refuses_a_disabled_tenant_s_objects(
    s3, sqs, landing_bucket: str, tmp_path: Path
) -> None:
    url = sqs.create_queue(
        QueueName=f"fleet-relay-{uuid.uuid4().hex[:12]}", Attributes={"VisibilityTimeout": "1"}
    )["QueueUrl"]
    notify_queue_of(s3, sqs, landing_bucket, url)
    registry_file = tmp_path / "tenants.yaml"
    registry_file.write_text(REGISTRY)
    emitted: list[Any] = []
    announced: list[tuple[str, dict[str, Any]]] = []
    relay = Relay(
        sqs,
        url,
        emitted.append,
        dead_letter=FileDeadLetter(str(tmp_path / "dead.jsonl")),
        wait_seconds=1,
        events=lambda name, payload: announced.append((name, dict(payload))),
        registry=load_registry(registry_file),
    )
    acme = today_folder(landing_bucket, "acme").removeprefix(f"s3://{landing_bucket}/")
    globex = today_folder(landing_bucket, "globex").removeprefix(f"s3://{landing_bucket}/")
    put_objects(s3, landing_bucket, {acme + "_SUCCESS": b"", globex + "_SUCCESS": b""})
    totals = RelayStats()
    deadline = time.monotonic() + 15
    while totals.emitted + totals.skipped < 2:
        assert time.monotonic() < deadline, totals
        totals.add(relay.poll_once())
    assert [record.tenant_id for record in emitted] == ["acme"]
    refusals = [payload for name, payload in announced if name == DELIVERY_REFUSED_EVENT]
    assert len(refusals) == 1 and refusals[0]["tenant_id"] == "globex"
    assert refusals[0]["kind"] == "disabled_tenant" and refusals[0]["source"] == "relay"
    assert json.dumps(refusals[0])  # a Prefect event payload: plain JSON


@pytest.mark.slow
def test_the_sweep_starts_no_run_for_a_disabled_tenant(
    flow_env: str, s3, landing_bucket: str, tmp_path: Path, monkeypatch
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    from flows.import_s3_folder import import_s3_folder
    from flows.sweep_landing_zone import sweep_landing_zone

    registry = tmp_path / "tenants.yaml"
    registry.write_text(REGISTRY)
    monkeypatch.setenv("FLEET_TENANTS", str(registry))
    name = f"import-{uuid.uuid4().hex[:8]}"
    deployment_id = import_s3_folder.to_deployment(name=name).apply()
    for tenant in ("acme", "globex"):
        folder = today_folder(landing_bucket, tenant)
        upload(s3, folder, {**fleet_delivery(trips=10), "_SUCCESS": b""})
    state = sweep_landing_zone(
        bucket=landing_bucket,
        deployment=f"import-s3-folder/{name}",
        lookback_days=0,
        return_state=True,
    )
    assert state.is_completed(), state.message
    counts = state.result()
    assert counts["started"] == 1 and counts["refused"] == 1, counts
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
        )
    assert [run.parameters["tenant_id"] for run in runs] == ["acme"]
    globex = today_folder(landing_bucket, "globex")
    (event,) = _refused_events(globex)
    assert event.payload["source"] == "sweep" and event.payload["kind"] == "disabled_tenant"


@pytest.mark.slow
def test_the_sweep_refuses_a_disabled_tenant_s_folder_whose_batch_failed(
    flow_env: str, s3, landing_bucket: str, tmp_path: Path, monkeypatch
) -> None:
    """Issue #46 item 9: a folder whose last batch failed while its tenant was enabled was
    reported "failed" (fix the files, rerun) once the tenant was disabled: the tenant rule
    is the news, and the folder is refused."""
    from flows.import_s3_folder import import_s3_folder
    from flows.sweep_landing_zone import sweep_landing_zone

    registry = tmp_path / "tenants.yaml"
    registry.write_text("tenants:\n  acme: {}\n  globex: {}\n")
    monkeypatch.setenv("FLEET_TENANTS", str(registry))
    globex = today_folder(landing_bucket, "globex")
    files = fleet_delivery(trips=10)
    files["trips-1.csv"] = files["trips-1.csv"].replace(b'"distance_km"', b'"miles"', 1)
    upload(s3, globex, {**files, "_SUCCESS": b""})
    failed = import_s3_folder(tenant_id="globex", folder=globex, return_state=True)
    assert failed.is_failed() and failed.name != "Refused", failed.message
    registry.write_text(REGISTRY)  # globex disabled now

    state = sweep_landing_zone(
        bucket=landing_bucket,
        deployment="import-s3-folder/never-started",
        lookback_days=0,
        return_state=True,
    )
    assert state.is_completed(), state.message
    counts = state.result()
    assert counts == {"ready": 1, "started": 0, "skipped": 0, "refused": 1}, counts
    (event,) = _refused_events(globex)
    assert event.payload["source"] == "sweep" and event.payload["kind"] == "disabled_tenant"
