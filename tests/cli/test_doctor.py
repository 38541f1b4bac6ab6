"""`fleet-import doctor` against a healthy stack (real PostgreSQL, moto's S3 server, Prefect's
test harness holding what prefect.yaml and blocks.register create), then against each
broken part, with the failing line named."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.cli.test_first_contact import fleet
from tests.prefect_server import free_port


@pytest.fixture
def prefect_stack(prefect_api: None) -> Iterator[str]:
    """The work pool, its backfill queue, every deployment of prefect.yaml (with its job
    variables), the load limit, the zombie-run automation and the block types, on the test
    harness's API; removed afterwards (it is shared)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL

    from blocks.limits import WAREHOUSE_LOADS_LIMIT, WORK_POOL, ensure_limits
    from blocks.register import register_types
    from blocks.zombies import ensure_zombie_automation, read_zombie_automation
    from fleet_cli.doctor_prefect import PREFECT_YAML, expected_deployments
    from fleet_import.config import Settings

    declared = yaml.safe_load(PREFECT_YAML.read_text("utf-8"))["deployments"]
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=WORK_POOL, type="process"), overwrite=True)
        ensure_limits(Settings(warehouse_load_slots=4))
        ensure_zombie_automation()
        register_types()
        deployment_ids = []
        for name, spec in zip(expected_deployments(), declared, strict=True):
            flow_name, deployment = name.split("/")
            flow_id = client.create_flow_from_name(flow_name)
            deployment_ids.append(
                client.create_deployment(
                    flow_id=flow_id,
                    name=deployment,
                    work_pool_name=WORK_POOL,
                    job_variables=spec["work_pool"]["job_variables"],
                )
            )
        try:
            yield str(PREFECT_API_URL.value())
        finally:
            for deployment_id in deployment_ids:
                client.delete_deployment(deployment_id)
            client.delete_global_concurrency_limit_by_name(WAREHOUSE_LOADS_LIMIT)
            zombies = read_zombie_automation(client)
            if zombies is not None:  # a test deleted it already
                client.delete_automation(zombies.id)
            with contextlib.suppress(ObjectNotFound):  # a test deleted it already
                client.delete_work_pool(WORK_POOL)


@pytest.fixture
def healthy_env(
    prefect_stack: str, database_url: str, warehouse: Any, moto_endpoint: str,
    landing_bucket: str, staging_bucket: str,
) -> dict[str, str]:
    return {
        "FLEET_DATABASE_URL": database_url,
        "FLEET_S3_ENDPOINT_URL": moto_endpoint,
        "FLEET_STAGING_URI": f"s3://{staging_bucket}/stage/",
        "FLEET_LANDING_BUCKET": landing_bucket,
        "FLEET_WAREHOUSE_LOAD_SLOTS": "4",
        "PREFECT_API_URL": prefect_stack,
    }


def doctor_json(env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    result, _ = fleet("doctor", "--json", **env)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {check["check"]: check["status"] for check in report["checks"]}


def failing(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["check"]: c for c in report["checks"] if c["status"] == "failed"}


def test_a_healthy_stack_passes_every_check(healthy_env: dict[str, str], s3: Any) -> None:
    code, report = doctor_json(healthy_env)
    assert failing(report) == {}
    assert code == 0 and report["ok"] is True
    names = [check["check"] for check in report["checks"]]
    assert names == [
        "settings",
        "operational database reachable",
        "operational database migrated",
        "warehouse reachable",
        "curated tables match the contracts",
        "warehouse privileges",
        f"landing bucket {healthy_env['FLEET_LANDING_BUCKET']} listable",
        "staging writable",
        "Prefect API reachable",
        "work pool fleet-process-pool",
        "work queue fleet-process-pool/backfill",
        "deployments",
        "concurrency limit fleet-warehouse-loads",
        "zombie flow runs",
        "flow run retention",
        "block types",
        "block documents",
        "relay queue",
    ]
    assert statuses(report)["block documents"] == "skipped"
    retention = next(c for c in report["checks"] if c["check"] == "flow run retention")
    assert retention["status"] == "skipped"  # Prefect's default: events only
    assert "PREFECT_SERVER_SERVICES_DB_VACUUM_ENABLED=events,flow_runs" in retention["fix"]
    bucket = healthy_env["FLEET_STAGING_URI"].split("/")[2]
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0  # the probe is gone

    table, _ = fleet("doctor", **healthy_env)
    assert table.returncode == 0
    assert "✓" in table.stdout and "✗" not in table.stdout
    assert "all checks passed" in table.stdout


def test_a_stopped_database(healthy_env: dict[str, str]) -> None:
    url = f"postgresql://postgres:pw-never-shown@127.0.0.1:{free_port()}/fleet"
    code, report = doctor_json({**healthy_env, "FLEET_DATABASE_URL": url})
    assert code == 1 and report["ok"] is False
    broken = failing(report)
    assert set(broken) == {"operational database reachable", "warehouse reachable"}
    assert broken["operational database reachable"]["fix"] == (
        "check FLEET_DATABASE_URL (host:port) and that the server runs"
    )
    assert "pw-never-shown" not in json.dumps(report)


def test_an_unmigrated_database(
    healthy_env: dict[str, str], empty_database_url: str
) -> None:
    code, report = doctor_json({**healthy_env, "FLEET_DATABASE_URL": empty_database_url})
    assert code == 1
    broken = failing(report)
    assert set(broken) == {"operational database migrated"}
    assert broken["operational database migrated"]["fix"] == "run `fleet-import db upgrade`"
    assert broken["operational database migrated"]["reason"].startswith("never migrated")
    assert statuses(report)["curated tables match the contracts"] == "ok"  # creatable


def test_a_missing_bucket(healthy_env: dict[str, str]) -> None:
    code, report = doctor_json({**healthy_env, "FLEET_LANDING_BUCKET": "fleet-nowhere-bucket"})
    assert code == 1
    broken = failing(report)
    assert set(broken) == {"landing bucket fleet-nowhere-bucket listable"}
    assert broken["landing bucket fleet-nowhere-bucket listable"]["reason"] == (
        "the S3 bucket does not exist"
    )


def test_a_missing_work_pool(healthy_env: dict[str, str]) -> None:
    from prefect.client.orchestration import get_client

    from blocks.limits import WORK_POOL

    with get_client(sync_client=True) as client:
        client.delete_work_pool(WORK_POOL)
    code, report = doctor_json(healthy_env)
    assert code == 1
    broken = failing(report)
    assert "work pool fleet-process-pool" in broken
    assert broken["work pool fleet-process-pool"]["fix"] == (
        "prefect work-pool create fleet-process-pool --type process"
    )


def test_a_missing_or_mis_set_zombie_automation(healthy_env: dict[str, str]) -> None:
    """Without the automation a killed run stays Running; with a window shorter than two of
    the runs' heartbeats (prefect.yaml: 30 s) it would crash live runs. Setting it up again
    updates the one automation, never a second."""
    from prefect.client.orchestration import get_client

    from blocks.zombies import ZOMBIE_AUTOMATION, ensure_zombie_automation, read_zombie_automation

    assert statuses(doctor_json(healthy_env)[1])["zombie flow runs"] == "ok"
    assert ensure_zombie_automation(45).startswith(f"automation {ZOMBIE_AUTOMATION} updated")
    with get_client(sync_client=True) as client:
        assert len(client.read_automations_by_name(ZOMBIE_AUTOMATION)) == 1
        code, report = doctor_json(healthy_env)
        assert code == 1
        short = failing(report)["zombie flow runs"]
        assert "a heartbeat every 30 s (the deployments' job variables)" in short["reason"]
        assert "would crash live runs" in short["reason"]
        assert "--zombie-after 60" in short["fix"]

        client.delete_automation(read_zombie_automation(client).id)
        code, report = doctor_json(healthy_env)
    assert code == 1
    missing = failing(report)["zombie flow runs"]
    assert missing["reason"] == (
        f"automation {ZOMBIE_AUTOMATION} not found: a killed run stays Running"
    )
    assert missing["fix"] == "python -m blocks.register"


def test_prefect_that_does_not_answer(healthy_env: dict[str, str]) -> None:
    env = {**healthy_env, "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"}
    code, report = doctor_json(env)
    assert code == 1
    assert set(failing(report)) == {"Prefect API reachable"}


def _operational_reachable(report: dict[str, Any]) -> dict[str, Any]:
    (check,) = [c for c in report["checks"] if c["check"] == "operational database reachable"]
    return check


def test_with_nothing_set_it_says_which_database_it_checked() -> None:
    """With FLEET_DATABASE_URL unset it checks libpq's usual local database: a server that
    happens to answer there must not pass, silently, for the one meant."""
    closed_s3 = f"http://127.0.0.1:{free_port()}"  # S3 not reached off this machine
    _, report = doctor_json({"FLEET_S3_ENDPOINT_URL": closed_s3})
    reason = _operational_reachable(report)["reason"]
    assert "postgresql://postgres@127.0.0.1:5432/postgres" in reason, reason  # passed or not
    assert reason.endswith("the default: FLEET_DATABASE_URL is not set)") or reason.endswith(
        "; tried postgresql://postgres@127.0.0.1:5432/postgres, the default: FLEET_DATABASE_URL "
        "is not set"
    ), reason


def test_it_names_the_database_it_tried_without_its_password() -> None:
    port = free_port()
    env = {
        "FLEET_DATABASE_URL": f"postgresql://postgres:pw-never-shown@127.0.0.1:{port}/fleet",
        "FLEET_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
    }
    code, report = doctor_json(env)
    assert code == 1
    check = _operational_reachable(report)
    assert check["reason"] == (
        f"operational database error (OperationalError): could not connect to 127.0.0.1:{port} "
        "(is the server up, is FLEET_DATABASE_URL right, are there free connections?); tried "
        f"postgresql://postgres:***@127.0.0.1:{port}/fleet"
    )
    assert "pw-never-shown" not in json.dumps(report)
    table, _ = fleet("doctor", **env, COLUMNS="400")  # the reason on one line of its cell
    assert f"tried postgresql://postgres:***@127.0.0.1:{port}/fleet" in table.stdout
