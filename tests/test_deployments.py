"""prefect.yaml and the fleet blocks against a real local Prefect API server.

Prefect ignores unknown keys in prefect.yaml and in block documents, so these tests read
back from a server what `prefect deploy --all` and `python -m blocks.register` stored,
instead of trusting that the commands exited 0.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from blocks.zombies import DEFAULT_ZOMBIE_AFTER_SECONDS, ZOMBIE_AUTOMATION, zombie_after_seconds
from tests.prefect_server import (
    PREFECT,
    REPO,
    PrefectServer,
    ServerFailed,
    output,
    run,
)
from tests.prefect_server import prefect_server as start_prefect_server

PREFECT_YAML = REPO / "prefect.yaml"
WORK_POOL = "fleet-process-pool"

# deployment name -> (entrypoint, flow name, required parameters)
EXPECTED_DEPLOYMENTS = {
    "import-s3-folder": (
        "flows/import_s3_folder.py:import_s3_folder",
        "import-s3-folder",
        {"tenant_id", "folder"},
    ),
    "backfill": (
        "flows/import_s3_folder.py:import_s3_folder",
        "import-s3-folder",
        {"tenant_id", "folder"},
    ),
    "bulk-import": (
        "flows/bulk_import.py:bulk_import",
        "bulk-import",
        {"deliveries"},
    ),
    "bulk-backfill": (
        "flows/bulk_import.py:bulk_import",
        "bulk-import",
        {"deliveries"},
    ),
    "resume-publication": (
        "flows/resume_publication.py:resume_publication",
        "resume-publication",
        {"batch_id"},
    ),
    "approve-held-batch": (
        "flows/approve_held_batch.py:approve_held_batch",
        "approve-held-batch",
        {"batch_id"},
    ),
    "rollback-slice": (
        "flows/rollback_slice.py:rollback_slice",
        "rollback-slice",
        {"tenant_id", "folder"},
    ),
    "drain-publications": (
        "flows/drain_publications.py:drain_publications",
        "drain-publications",
        set(),
    ),
    "sweep-landing-zone": (
        "flows/sweep_landing_zone.py:sweep_landing_zone",
        "sweep-landing-zone",
        {"bucket"},
    ),
    "check-freshness": (
        "flows/check_freshness.py:check_freshness",
        "check-freshness",
        set(),
    ),
    "trim-operational-state": (
        "flows/trim_operational_state.py:trim_operational_state",
        "trim-operational-state",
        set(),
    ),
}

# The scheduled deployments run one at a time; a tick that finds one running is cancelled.
# The others have no Prefect limit: the scope reservation lives in PostgreSQL (prefect.yaml).
ONE_AT_A_TIME = {
    "drain-publications",
    "sweep-landing-zone",
    "check-freshness",
    "trim-operational-state",
}
_ONE_AT_A_TIME_LIMIT = {"limit": 1, "collision_strategy": "CANCEL_NEW"}

# Every deployment's pull steps: into the checkout (or the image's copy), then the pin.
PULL_STEPS = [
    {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $FLEET_PROJECT_DIR }}"}},
    {"flows.code_version.require_code_version": {"expected": "{{ $FLEET_CODE_VERSION }}"}},
]
# Backfills wait in their own queue; everything else runs from the pool's default one.
QUEUES = {"backfill": "backfill", "bulk-backfill": "backfill"}
JOB_ENV = {
    "FLEET_NORMALIZE_WORKERS",
    "FLEET_WAREHOUSE_LOAD_SLOTS",
    "FLEET_TENANT_LOAD_SLOTS",
    "PREFECT_FLOWS_HEARTBEAT_FREQUENCY",  # what the zombie automation watches
}


def _prefect_yaml() -> dict[str, Any]:
    return yaml.safe_load(PREFECT_YAML.read_text())


# --- prefect.yaml, statically (Prefect would drop a misspelled key without a word) ---------


def test_prefect_yaml_uses_only_keys_prefect_reads() -> None:
    from prefect.cli.deploy._models import DeploymentConfig, PrefectYamlModel, RawScheduleConfig

    config = _prefect_yaml()
    top_level = {field.alias or name for name, field in PrefectYamlModel.model_fields.items()}
    assert set(config) - top_level == {"definitions"}  # definitions: YAML anchors only
    for deployment in config["deployments"]:
        unknown = set(deployment) - set(DeploymentConfig.model_fields)
        assert not unknown, f"{deployment['name']}: keys Prefect ignores: {unknown}"
        for schedule in deployment.get("schedules") or []:
            RawScheduleConfig.model_validate(schedule)  # extra="forbid": typos raise
    PrefectYamlModel.model_validate(config)


def test_prefect_yaml_pool_tags_and_concurrency_only_on_schedules() -> None:
    from prefect.cli.deploy._models import ConcurrencyLimitSpec
    from prefect.client.schemas.objects import ConcurrencyLimitStrategy

    config = _prefect_yaml()
    deployments = {d["name"]: d for d in config["deployments"]}
    assert set(deployments) == set(EXPECTED_DEPLOYMENTS)
    for name, deployment in deployments.items():
        assert deployment["entrypoint"] == EXPECTED_DEPLOYMENTS[name][0]
        assert deployment["work_pool"]["name"] == WORK_POOL
        assert deployment["work_pool"]["work_queue_name"] == QUEUES.get(name, "default")
        assert set(deployment["work_pool"]["job_variables"]["env"]) == JOB_ENV
        assert "fleet" in deployment["tags"]
        if name not in ONE_AT_A_TIME:
            # The scope reservation lives in PostgreSQL; see the comment in prefect.yaml.
            assert "concurrency_limit" not in deployment
            continue
        limit = deployment["concurrency_limit"]
        # ConcurrencyLimitSpec ignores unknown keys: a misspelled one would be dropped.
        assert set(limit) <= set(ConcurrencyLimitSpec.model_fields), f"{name}: {limit}"
        assert limit == _ONE_AT_A_TIME_LIMIT, name
        ConcurrencyLimitStrategy(limit["collision_strategy"])
        assert deployment["schedules"], f"{name}: a limit of one is for scheduled runs"
    assert config["pull"] == PULL_STEPS


# --- Kubernetes and ECS pools, statically (no cluster runs here) --------------------------

DEPLOYMENTS_DIR = REPO / "deployments"
_IMAGE_PROJECT_DIR = "/opt/fleet-import"


def _job_template(name: str) -> dict[str, Any]:
    return json.loads((DEPLOYMENTS_DIR / name).read_text())


def _job_configuration(cls: Any, template: dict[str, Any], values: dict[str, Any]) -> Any:
    """What a worker of that type builds for a flow run of one of our deployments: the
    pool's template filled with the deployment's job variables, then prepared for a run."""
    import asyncio
    import uuid

    from prefect.client.schemas.objects import FlowRun
    from prefect.utilities.schema_tools.validation import validate

    # As the server checks a deployment's job variables against the pool's schema.
    validate(values, template["variables"], raise_on_error=True, ignore_required=True)
    # No block or variable references in these templates: the client is never called.
    configuration = asyncio.run(cls.from_template_and_values(template, values, client=object()))
    configuration.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="import/acme/x"))
    return configuration


def _deployment_job_variables() -> list[dict[str, Any]]:
    return [d["work_pool"]["job_variables"] for d in _prefect_yaml()["deployments"]]


def test_kubernetes_job_template_runs_our_deployments() -> None:
    pytest.importorskip("prefect_kubernetes", reason="the workers extra")
    from prefect_kubernetes.worker import KubernetesWorker, KubernetesWorkerJobConfiguration

    template = _job_template("kubernetes-job-template.json")
    # The worker's own template, with our defaults: nothing of its shape was lost.
    default = KubernetesWorker.get_default_base_job_template()
    assert template["job_configuration"] == default["job_configuration"]
    assert set(template["variables"]["properties"]) == set(default["variables"]["properties"])
    for values in _deployment_job_variables():
        configuration = _job_configuration(KubernetesWorkerJobConfiguration, template, values)
        manifest = configuration.job_manifest
        assert manifest["metadata"]["namespace"] == "fleet-import"
        # Prefect, not Kubernetes, retries a run: an evicted pod is rescheduled by Prefect.
        assert manifest["spec"]["backoffLimit"] == 0
        pod = manifest["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "fleet-import"
        [container] = pod["containers"]
        assert container["image"].startswith("fleet-import-worker:")
        env = {item["name"]: item.get("value") for item in container["env"]}
        assert env["FLEET_PROJECT_DIR"] == _IMAGE_PROJECT_DIR
        assert values["env"].items() <= env.items()
        assert "PREFECT__FLOW_RUN_ID" in env
        assert container["resources"]["requests"] == {"cpu": "500m", "memory": "1Gi"}
    # A release pins its image through the same variable.
    pinned = _job_configuration(
        KubernetesWorkerJobConfiguration,
        template,
        {**_deployment_job_variables()[0], "image": "registry.example.com/fleet-worker:abc123"},
    )
    [container] = pinned.job_manifest["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/fleet-worker:abc123"


def test_ecs_job_template_runs_our_deployments() -> None:
    pytest.importorskip("prefect_aws", reason="the workers extra")
    from prefect_aws.workers.ecs_worker import ECSJobConfiguration, ECSWorker

    template = _job_template("ecs-job-template.json")
    default = ECSWorker.get_default_base_job_template()
    assert template["job_configuration"] == default["job_configuration"]
    assert set(template["variables"]["properties"]) == set(default["variables"]["properties"])
    for values in _deployment_job_variables():
        configuration = _job_configuration(ECSJobConfiguration, template, values)
        [container] = configuration.task_definition["containerDefinitions"]
        assert container["image"].startswith("fleet-import-worker:")
        assert container["name"] == "fleet-import"
        assert configuration.task_run_request["launchType"] == "FARGATE"
        assert configuration.env["FLEET_PROJECT_DIR"] == _IMAGE_PROJECT_DIR
        assert values["env"].items() <= configuration.env.items()
    # Production values: a cluster, the roles, logs to CloudWatch (which needs the
    # execution role: the worker model refuses logs without one).
    production = _job_configuration(
        ECSJobConfiguration,
        template,
        {
            **_deployment_job_variables()[0],
            "cluster": "fleet",
            "execution_role_arn": "arn:aws:iam::123456789012:role/fleet-import-execution",
            "task_role_arn": "arn:aws:iam::123456789012:role/fleet-import-task",
            "configure_cloudwatch_logs": True,
            "image": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/fleet-import-worker:abc123",
        },
    )
    assert production.task_run_request["cluster"] == "fleet"
    assert production.configure_cloudwatch_logs
    with pytest.raises(ValueError, match="execution_role_arn"):
        _job_configuration(
            ECSJobConfiguration,
            template,
            {**_deployment_job_variables()[0], "configure_cloudwatch_logs": True},
        )


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of deployments/Dockerfile, continuation lines joined."""
    text = (DEPLOYMENTS_DIR / "Dockerfile").read_text().replace("\\\n", " ")
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            instructions.append((word.upper(), rest.strip()))
    return instructions


def test_worker_image_recipe_matches_the_project() -> None:
    """docker does not run here: what can be checked without building is checked."""
    import tomllib

    instructions = _dockerfile()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    [base] = [args for word, args in instructions if word == "FROM"]
    assert base.startswith("python:3.11")  # requires-python >= 3.11, the CI's version
    assert pyproject["project"]["requires-python"] == ">=3.11"
    [workdir] = [args for word, args in instructions if word == "WORKDIR"]
    assert workdir == _IMAGE_PROJECT_DIR
    copied = set()
    for word, args in instructions:
        if word == "COPY":
            *sources, _ = args.split()
            copied.update(sources)
    for source in copied:
        assert (REPO / source).exists(), f"COPY {source}: not in the repository"
    packages = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {package.rstrip("*") for package in packages} <= copied
    assert "prefect.yaml" in copied and "migrations" in copied
    [install] = [args for word, args in instructions if word == "RUN" and "pip install" in args]
    extras = install.split("[", 1)[1].split("]", 1)[0].split(",")
    assert set(extras) <= set(pyproject["project"]["optional-dependencies"])
    assert "workers" in extras and "redshift" in extras
    env = " ".join(args for word, args in instructions if word == "ENV")
    assert f"FLEET_PROJECT_DIR={_IMAGE_PROJECT_DIR}" in env
    assert "FLEET_CODE_VERSION=${FLEET_CODE_VERSION}" in env
    for name in ("kubernetes-job-template.json", "ecs-job-template.json"):
        defaults = _job_template(name)["variables"]["properties"]["env"]["default"]
        assert defaults["FLEET_PROJECT_DIR"] == _IMAGE_PROJECT_DIR
    assert any(word == "USER" and args != "root" for word, args in instructions)
    # BuildKit's per-Dockerfile ignore file keeps everything else out of the context.
    ignore = (DEPLOYMENTS_DIR / "Dockerfile.dockerignore").read_text().split()
    assert ignore[ignore.index("**") + 1 :].count("!prefect.yaml") == 1
    for source in copied - {"./"}:
        assert f"!{source}" in ignore or f"!{source}/**" in ignore, source


def test_code_version_pull_step_pins_the_worker(monkeypatch, tmp_path: Path) -> None:
    from flows.code_version import CodeVersionMismatch, require_code_version

    monkeypatch.setenv("FLEET_CODE_VERSION", "0123456789abcdef")
    assert require_code_version("0123456789abcdef") == {"code_version": "0123456789abcdef"}
    assert require_code_version("0123456") == {"code_version": "0123456789abcdef"}
    with pytest.raises(CodeVersionMismatch, match="pins code version fedcba9"):
        require_code_version("fedcba9")
    # Deployed without FLEET_CODE_VERSION: the placeholder was dropped, nothing is pinned.
    assert require_code_version() == {"code_version": "0123456789abcdef"}
    assert require_code_version("{{ $FLEET_CODE_VERSION }}")["code_version"]
    # A checkout: git says which commit it holds.
    monkeypatch.delenv("FLEET_CODE_VERSION")
    monkeypatch.chdir(REPO)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert require_code_version(head) == {"code_version": head}
    monkeypatch.chdir(tmp_path)  # no repository, no variable: an unknown version
    with pytest.raises(CodeVersionMismatch, match="an unknown version"):
        require_code_version(head)


# --- a real server --------------------------------------------------------------------------


# The tests that use it start a real `prefect server` and run the commands: marked `e2e`, they
# are left to `make test-e2e`.
@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """`prefect server start` on a free port with a private PREFECT_HOME and SQLite file."""
    try:
        with start_prefect_server(tmp_path_factory.mktemp("prefect-server")) as server:
            yield server
    except ServerFailed as exc:
        pytest.fail(str(exc))


def _run(
    args: list[str], env: Mapping[str, str], cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    return run(args, env, cwd)


def _output(result: subprocess.CompletedProcess[str]) -> str:
    return output(result)


@pytest.fixture(scope="module")
def deployed(prefect_server: PrefectServer) -> subprocess.CompletedProcess[str]:
    """The documented sequence: create the pool, then `prefect deploy --all` from the repo.
    FLEET_PROJECT_DIR is unset, so the pull step keeps its placeholder for the worker."""
    env = prefect_server.env()
    pool = _run([PREFECT, "work-pool", "create", WORK_POOL, "--type", "process"], env)
    assert pool.returncode == 0, _output(pool)
    return _run([PREFECT, "--no-prompt", "deploy", "--all"], env)


@pytest.fixture
def api(prefect_server: PrefectServer) -> Iterator[None]:
    """Point this process's Prefect client at the test server."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_server.api_url}):
        yield


def _read_deployments() -> dict[str, Any]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return {d.name: d for d in client.read_deployments()}


@pytest.mark.slow
@pytest.mark.e2e
def test_deploy_all_registers_every_deployment(
    deployed: subprocess.CompletedProcess[str], api: None
) -> None:
    assert deployed.returncode == 0, _output(deployed)
    deployments = _read_deployments()
    assert set(deployments) == set(EXPECTED_DEPLOYMENTS)

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        flow_names = {d.name: client.read_flow(d.flow_id).name for d in deployments.values()}

    for name, (entrypoint, flow_name, required) in EXPECTED_DEPLOYMENTS.items():
        deployment = deployments[name]
        assert deployment.entrypoint == entrypoint
        assert flow_names[name] == flow_name
        assert deployment.work_pool_name == WORK_POOL
        assert "fleet" in deployment.tags
        if name in ONE_AT_A_TIME:
            assert deployment.global_concurrency_limit is not None
            assert deployment.global_concurrency_limit.limit == 1
            assert deployment.concurrency_options is not None
            assert deployment.concurrency_options.collision_strategy == "CANCEL_NEW"
        else:
            assert deployment.global_concurrency_limit is None
        assert deployment.enforce_parameter_schema is True
        assert deployment.pull_steps == PULL_STEPS
        assert deployment.work_queue_name == QUEUES.get(name, "default")
        assert set(deployment.job_variables["env"]) == JOB_ENV
        schema = deployment.parameter_openapi_schema
        assert set(schema.get("required", [])) == required

    import_schema = deployments["import-s3-folder"].parameter_openapi_schema["properties"]
    assert {"tenant_id", "folder", "delivery_key"} <= set(import_schema)
    assert import_schema["tenant_id"]["type"] == "string"
    assert "batch_id" in deployments["resume-publication"].parameter_openapi_schema["properties"]

    drain = deployments["drain-publications"]
    assert drain.parameters == {"limit": 50}
    assert drain.parameter_openapi_schema["properties"]["limit"]["default"] == 50
    [schedule] = drain.schedules
    assert schedule.active
    assert schedule.schedule.cron == "*/5 * * * *"
    assert schedule.schedule.timezone == "UTC"
    for name in (
        "import-s3-folder",
        "backfill",
        "bulk-import",
        "bulk-backfill",
        "resume-publication",
        "approve-held-batch",
        "rollback-slice",
    ):
        assert deployments[name].schedules == []


@pytest.mark.slow
@pytest.mark.e2e
def test_manual_run_parameters_are_described_for_the_ui(
    deployed: subprocess.CompletedProcess[str], api: None
) -> None:
    """The UI's run form shows these descriptions; they come from the flows' docstrings
    (a Google-style `Args:` section), not from prefect.yaml."""
    assert deployed.returncode == 0, _output(deployed)
    deployments = _read_deployments()
    for name, parameter in (
        ("import-s3-folder", "tenant_id"),
        ("import-s3-folder", "folder"),
        ("import-s3-folder", "delivery_key"),
        ("resume-publication", "batch_id"),
        ("approve-held-batch", "batch_id"),
    ):
        properties = deployments[name].parameter_openapi_schema["properties"]
        assert properties[parameter].get("description"), f"{name}: {parameter} undescribed"


@pytest.mark.slow
@pytest.mark.e2e
def test_redeploy_updates_in_place(
    deployed: subprocess.CompletedProcess[str], prefect_server: PrefectServer, api: None
) -> None:
    assert deployed.returncode == 0, _output(deployed)
    before = {name: d.id for name, d in _read_deployments().items()}
    again = _run([PREFECT, "--no-prompt", "deploy", "--all"], prefect_server.env())
    assert again.returncode == 0, _output(again)
    after = _read_deployments()
    assert {name: d.id for name, d in after.items()} == before
    assert len(after["drain-publications"].schedules) == 1  # the slug keeps it single


_WORKER_SIDE = """
import asyncio, json, os, sys
sys.path[:] = [p for p in sys.path if p not in ("", ".")]  # like a worker: cwd is not on the path
from prefect.deployments.steps.core import run_steps
from prefect.flows import load_flow_from_entrypoint

asyncio.run(run_steps(json.loads(sys.argv[1]), print_function=lambda *a: None))
names = [load_flow_from_entrypoint(entrypoint).name for entrypoint in sys.argv[2:]]
print(json.dumps({"cwd": os.getcwd(), "flows": names}))
"""


@pytest.mark.slow
@pytest.mark.e2e
def test_worker_pull_step_finds_the_project(
    deployed: subprocess.CompletedProcess[str],
    prefect_server: PrefectServer,
    api: None,
    tmp_path: Path,
) -> None:
    """What a process worker does before a run, from its own temporary directory: run the
    stored pull steps (FLEET_PROJECT_DIR from the worker's environment), load the entrypoint."""
    assert deployed.returncode == 0, _output(deployed)
    deployments = _read_deployments()
    [pull_steps] = {json.dumps(d.pull_steps) for d in deployments.values()}
    entrypoints = [EXPECTED_DEPLOYMENTS[name][0] for name in EXPECTED_DEPLOYMENTS]
    result = _run(
        [sys.executable, "-c", _WORKER_SIDE, pull_steps, *entrypoints],
        prefect_server.env(FLEET_PROJECT_DIR=str(REPO)),
        cwd=tmp_path,
    )
    assert result.returncode == 0, _output(result)
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(loaded["cwd"]) == REPO
    assert loaded["flows"] == [EXPECTED_DEPLOYMENTS[name][1] for name in EXPECTED_DEPLOYMENTS]


# --- blocks ---------------------------------------------------------------------------------

_DB_PASSWORD = "db-pass-5f3c"
_WAREHOUSE_PASSWORD = "wh-pass-91ab"
_AWS_SECRET = "aws-secret-77de"


def _block_env(database_url: str, **extra: str) -> dict[str, str]:
    return {
        "FLEET_DATABASE_URL": database_url,
        "FLEET_LANDING_BUCKET": "fleet-landing",
        "FLEET_LANDING_PREFIX": "tenants/",
        "FLEET_STAGING_URI": "s3://fleet-staging/stage/",
        "FLEET_S3_ENDPOINT_URL": "http://127.0.0.1:5999",
        "FLEET_AWS_ACCESS_KEY_ID": "AKIAFLEETTEST",
        "FLEET_AWS_SECRET_ACCESS_KEY": _AWS_SECRET,
        **extra,
    }


def _register(server: PrefectServer, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "blocks.register", *args], server.env(**env))


@pytest.mark.slow
@pytest.mark.e2e
def test_register_blocks_and_settings_overrides(prefect_server: PrefectServer, api: None) -> None:
    from blocks.fleet_blocks import (
        LANDING_BLOCK,
        FleetLandingBucket,
        FleetWarehouse,
        settings_overrides,
    )
    from fleet_import.config import Settings

    # Nothing registered yet: neither the block types nor the documents exist.
    assert settings_overrides() == {}

    types_only = _register(prefect_server)
    assert types_only.returncode == 0, _output(types_only)
    for slug in ("fleet-operational-database", "fleet-warehouse", "fleet-landing-bucket"):
        assert f"registered block type {slug}" in types_only.stdout
    assert settings_overrides() == {}
    assert f"automation {ZOMBIE_AUTOMATION} created" in types_only.stdout
    assert _zombie_windows() == [DEFAULT_ZOMBIE_AFTER_SECONDS]
    shorter = _register(prefect_server, "--zombie-after", "59")  # less than two heartbeats
    assert shorter.returncode == 2, _output(shorter)
    assert "--zombie-after must be at least 60 seconds" in shorter.stderr

    incomplete = _register(prefect_server, "--from-env", FLEET_DATABASE_URL="postgresql://x/y")
    assert incomplete.returncode == 2, _output(incomplete)
    assert "FLEET_STAGING_URI" in incomplete.stderr
    assert settings_overrides() == {}  # validated before writing anything

    database_url = f"postgresql://fleet:{_DB_PASSWORD}@db.internal:5432/fleet"
    created = _register(prefect_server, "--from-env", **_block_env(database_url))
    assert created.returncode == 0, _output(created)
    assert "saved block document fleet-landing-bucket/fleet-landing" in created.stdout
    assert _DB_PASSWORD not in created.stdout + created.stderr
    assert _AWS_SECRET not in created.stdout + created.stderr
    # Bucket, prefix and access keys are no block fields any more; the command says so.
    assert "not stored in blocks: FLEET_LANDING_BUCKET" in created.stderr

    overrides = settings_overrides()
    assert overrides == {
        "database_url": database_url,
        "warehouse": "postgres",
        "warehouse_url": database_url,  # no FLEET_WAREHOUSE_URL: the operational database
        "s3_endpoint_url": "http://127.0.0.1:5999",
        "staging_uri": "s3://fleet-staging/stage/",
    }
    settings = Settings().model_copy(update=overrides)
    assert settings.effective_warehouse_url == database_url

    landing = FleetLandingBucket.load(LANDING_BLOCK, _sync=True)
    assert landing.staging_uri == "s3://fleet-staging/stage/"
    assert _AWS_SECRET not in landing.model_dump_json()

    # Re-running overwrites: a Redshift warehouse with its own staging prefix.
    warehouse_url = f"redshift://loader:{_WAREHOUSE_PASSWORD}@wh.example:5439/fleet"
    rerun = _register(
        prefect_server,
        "--from-env",
        **_block_env(
            database_url,
            FLEET_WAREHOUSE="redshift",
            FLEET_WAREHOUSE_URL=warehouse_url,
            FLEET_WAREHOUSE_IAM_ROLE="arn:aws:iam::123456789012:role/fleet-copy",
            FLEET_WAREHOUSE_STAGING_URI="s3://fleet-redshift-staging/copy/",
            FLEET_REFRESH_SQL='["REFRESH MATERIALIZED VIEW fleet_daily"]',
        ),
    )
    assert rerun.returncode == 0, _output(rerun)
    assert _WAREHOUSE_PASSWORD not in rerun.stdout + rerun.stderr
    overrides = settings_overrides()
    assert overrides["warehouse"] == "redshift"
    assert overrides["warehouse_url"] == warehouse_url
    assert overrides["staging_uri"] == "s3://fleet-redshift-staging/copy/"  # the warehouse's
    assert overrides["refresh_sql"] == ["REFRESH MATERIALIZED VIEW fleet_daily"]
    assert set(overrides) <= set(Settings.model_fields)
    warehouse = FleetWarehouse.load("fleet-warehouse", _sync=True)
    assert warehouse.iam_role == "arn:aws:iam::123456789012:role/fleet-copy"

    again = _register(prefect_server, "--zombie-after", "120")  # documents untouched
    assert again.returncode == 0, _output(again)
    assert settings_overrides() == overrides
    # The zombie automation was updated in place each time, never made twice.
    assert f"automation {ZOMBIE_AUTOMATION} updated" in again.stdout
    assert _zombie_windows() == [120]


def _zombie_windows() -> list[int]:
    """The window of each automation named like the zombie one (one, once registered)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        found = client.read_automations_by_name(ZOMBIE_AUTOMATION)
    return [zombie_after_seconds(automation) for automation in found]


@pytest.mark.slow
@pytest.mark.e2e
def test_invalid_block_document_is_skipped_with_a_clean_warning(
    prefect_server: PrefectServer, api: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Someone saves a bad value through the API or UI: the flow falls back to the
    environment for that block and says so, without quoting the secret."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import BlockDocumentUpdate

    from blocks.fleet_blocks import WAREHOUSE_BLOCK, FleetWarehouse, settings_overrides

    registered = _register(
        prefect_server, "--from-env", **_block_env("postgresql://fleet@db.internal/fleet")
    )
    assert registered.returncode == 0, _output(registered)
    with get_client(sync_client=True) as client:
        document = client.read_block_document_by_name(
            WAREHOUSE_BLOCK, FleetWarehouse.get_block_type_slug()
        )
        client.update_block_document(
            document.id,
            BlockDocumentUpdate(
                data={"backend": "snowflake", "url": f"snowflake://u:{_WAREHOUSE_PASSWORD}@x"},
                merge_existing_data=False,
            ),
        )
    with caplog.at_level(logging.WARNING, logger="blocks"):
        overrides = settings_overrides()
    assert overrides["database_url"] == "postgresql://fleet@db.internal/fleet"
    assert "warehouse" not in overrides and "warehouse_url" not in overrides
    assert "fleet-warehouse/fleet-warehouse: invalid block document (backend:" in caplog.text
    assert _WAREHOUSE_PASSWORD not in caplog.text


# --- the landing-zone sweep and the S3 arrival trigger (issue 5) ----------------------------

_IMPORT_TRIGGER = "import-s3-folder-on-marker"


def test_prefect_yaml_triggers_use_only_keys_prefect_reads() -> None:
    """Prefect drops unknown trigger keys (extra="ignore"): a misspelled `within` or
    `schedule_after` would silently turn off the debounce."""
    from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger
    from prefect.events.schemas.events import ResourceSpecification

    triggers = [
        (deployment["name"], trigger)
        for deployment in _prefect_yaml()["deployments"]
        for trigger in deployment.get("triggers") or []
    ]
    assert [name for name, _ in triggers] == ["import-s3-folder"]
    for name, trigger in triggers:
        unknown = set(trigger) - set(DeploymentEventTrigger.model_fields)
        assert not unknown, f"{name}: trigger keys Prefect ignores: {unknown}"
        parsed = DeploymentEventTrigger.model_validate(trigger)
        ResourceSpecification.model_validate(trigger["match"])
        assert parsed.expect == {"aws.s3.object.created"}
        assert parsed.for_each == {"prefect.resource.id"}  # debounce per marker, not globally
        assert parsed.within.total_seconds() > 0 and parsed.schedule_after.total_seconds() > 0
        # A marker means complete: its run is scheduled within seconds, not after a minute.
        assert parsed.schedule_after.total_seconds() <= 5 and parsed.within.total_seconds() <= 5
        assert set(parsed.parameters or {}) == {"tenant_id", "folder", "delivery_key"}


@pytest.mark.slow
@pytest.mark.e2e
def test_deploy_all_registers_the_sweep_and_the_import_trigger(
    deployed: subprocess.CompletedProcess[str], api: None
) -> None:
    assert deployed.returncode == 0, _output(deployed)
    from prefect.client.orchestration import get_client

    deployments = _read_deployments()
    sweep = deployments["sweep-landing-zone"]
    [schedule] = sweep.schedules
    assert schedule.active and schedule.schedule.cron == "*/10 * * * *"
    assert sweep.parameters["bucket"] == "fleet-landing"
    assert sweep.parameters["deployment"] == "import-s3-folder/import-s3-folder"
    properties = sweep.parameter_openapi_schema["properties"]
    for parameter in ("bucket", "prefix", "completion", "marker", "quiet_seconds"):
        assert properties[parameter].get("description"), f"sweep: {parameter} undescribed"

    with get_client(sync_client=True) as client:
        [automation] = client.read_automations_by_name(_IMPORT_TRIGGER)
    assert automation.enabled
    trigger = automation.trigger
    assert trigger.expect == {"aws.s3.object.created"}
    assert trigger.match.root["prefect.resource.id"] == "s3://fleet-landing/*/_SUCCESS"
    assert trigger.for_each == {"prefect.resource.id"}
    assert trigger.within.total_seconds() == 5
    [action] = automation.actions
    assert action.type == "run-deployment"
    assert action.deployment_id == deployments["import-s3-folder"].id
    assert action.schedule_after.total_seconds() == 1
    assert action.parameters["tenant_id"] == "{{ event.resource['fleet.tenant'] }}"
    assert action.parameters["folder"] == "{{ event.resource['fleet.folder'] }}"
    assert action.parameters["delivery_key"].startswith("s3-event:")


# --- freshness SLOs (issue 29): the late-delivery automation template ----------------------


def test_late_notification_template_is_an_automation_prefect_reads_and_off_by_default() -> None:
    """The template under `definitions.automations` is what `prefect automation create -f`
    validates (AutomationCore), is disabled, fires on each late (tenant, dataset) as the
    flow's event sink names it, and its notification renders from a late event's payload."""
    from prefect.events.schemas.automations import AutomationCore, EventTrigger
    from prefect.server.utilities.user_templates import render_user_template_sync

    from fleet_import.intake.triggers import resource_matches

    [template] = _prefect_yaml()["definitions"]["automations"]
    unknown = set(template["trigger"]) - set(EventTrigger.model_fields)
    assert not unknown, f"trigger keys Prefect ignores: {unknown}"
    automation = AutomationCore.model_validate(template)
    assert automation.enabled is False
    assert automation.trigger.expect == {"fleet.tenant.late"}
    assert automation.trigger.for_each == {"prefect.resource.id"}
    resource = {"prefect.resource.id": "fleet.freshness.acme.*", "fleet.tenant": "acme"}
    assert resource_matches(resource, template["trigger"]["match"])
    assert not resource_matches(
        {"prefect.resource.id": "fleet.batch.1"}, template["trigger"]["match"]
    )
    [action] = automation.actions
    assert action.type == "send-notification"
    payload = {
        "tenant_id": "acme",
        "dataset": "*",
        "slo": "daily by 06:00 Europe/Berlin",
        "expected_at": "2026-07-22T04:00:00+00:00",
        "found": "arrived, incomplete: waiting for its _SUCCESS marker",
        "folder": "s3://fleet-landing/acme/fleet/2026-07-22/",
        "last_loaded": None,
    }
    context = {"event": {"payload": payload}}
    assert render_user_template_sync(action.subject, context) == ("fleet-import: acme is late (*)")
    body = render_user_template_sync(action.body, context)
    assert "expected by 2026-07-22T04:00:00+00:00 (daily by 06:00 Europe/Berlin)" in body
    assert "waiting for its _SUCCESS marker (s3://fleet-landing/acme/fleet/2026-07-22/)" in body
    assert "Last loaded: never." in body


@pytest.mark.slow
@pytest.mark.e2e
def test_late_notification_template_creates_the_automation_as_documented(
    prefect_server: PrefectServer, api: None, tmp_path: Path
) -> None:
    """deployments/README.md's steps against a real server: a notification block saved, the
    template extracted with the block's id and enabled, `prefect automation create -f`."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.client.orchestration import get_client

    block_id = CustomWebhookNotificationBlock(
        name="ops-webhook", url="http://127.0.0.1:9/notify"
    ).save("fleet-late-test", overwrite=True)
    automations = _prefect_yaml()["definitions"]["automations"]
    automations[0] |= {"enabled": True}
    automations[0]["actions"][0]["block_document_id"] = str(block_id)
    path = tmp_path / "automations.yaml"
    path.write_text(yaml.safe_dump(automations))
    created = _run(
        [PREFECT, "automation", "create", "--from-file", str(path)], prefect_server.env()
    )
    assert created.returncode == 0, _output(created)
    with get_client(sync_client=True) as client:
        [automation] = client.read_automations_by_name("fleet-tenant-late-notification")
    assert automation.enabled
    assert automation.trigger.expect == {"fleet.tenant.late"}
    [action] = automation.actions
    assert action.type == "send-notification" and action.block_document_id == block_id
