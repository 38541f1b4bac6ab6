"""The doctor's Prefect checks: the API answers, and what `prefect.yaml` and
`python -m blocks.register` create exists there (work pool and its backfill queue,
deployments, the global load limit, the zombie-run automation, block types and documents).
Outside the core: it talks to Prefect."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fleet_import.checks.services import Check, failed, passed
from fleet_import.config import Settings

PREFECT_YAML = Path(__file__).resolve().parents[1] / "prefect.yaml"
_PROBE_TIMEOUT_SECONDS = 5.0
_DEPLOY = "prefect --no-prompt deploy --all (from the repository root)"
_REGISTER = "python -m blocks.register"


def configured_api_url() -> str | None:
    """PREFECT_API_URL from the environment or the active Prefect profile."""
    from prefect.settings import PREFECT_API_URL

    return os.environ.get("PREFECT_API_URL") or PREFECT_API_URL.value()


def expected_deployments(prefect_yaml: Path = PREFECT_YAML) -> list[str]:
    """`flow-name/deployment-name` of every deployment prefect.yaml declares."""
    import yaml

    declared = yaml.safe_load(prefect_yaml.read_text("utf-8")).get("deployments") or []
    names = []
    for deployment in declared:
        path, _, function = str(deployment["entrypoint"]).partition(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        names.append(f"{getattr(module, function).name}/{deployment['name']}")
    return names


def check_prefect(settings: Settings) -> Iterator[Check]:
    url = configured_api_url()
    if not url:
        yield Check(
            "Prefect API",
            None,
            "PREFECT_API_URL is not set: `run` starts a temporary local API; deployments, "
            "workers and the relay need a server",
            "prefect server start; export PREFECT_API_URL=http://127.0.0.1:4200/api",
        )
        return
    import httpx

    try:
        httpx.get(url.rstrip("/") + "/health", timeout=_PROBE_TIMEOUT_SECONDS).raise_for_status()
    except httpx.HTTPError as exc:
        yield failed(
            "Prefect API reachable",
            f"no answer at PREFECT_API_URL ({type(exc).__name__})",
            "start the server (`prefect server start`) or fix PREFECT_API_URL",
        )
        return
    yield passed("Prefect API reachable", "healthy")
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        yield from _work_pool(client)
        yield _deployments(client)
        yield _load_limit(client, settings)
        yield _zombie_automation(client)
        yield _flow_run_retention(url)
        yield from _blocks(client)


def _work_pool(client: Any) -> Iterator[Check]:
    from prefect.exceptions import ObjectNotFound

    from blocks.limits import BACKFILL_QUEUE, WORK_POOL

    try:
        pool = client.read_work_pool(WORK_POOL)
    except ObjectNotFound:
        yield failed(
            f"work pool {WORK_POOL}",
            "not found",
            f"prefect work-pool create {WORK_POOL} --type process",
        )
        return
    yield passed(f"work pool {WORK_POOL}", f"type {pool.type}")
    try:
        client.read_work_queue_by_name(BACKFILL_QUEUE, work_pool_name=WORK_POOL)
    except ObjectNotFound:
        yield failed(f"work queue {WORK_POOL}/{BACKFILL_QUEUE}", "not found", _REGISTER)
        return
    yield passed(f"work queue {WORK_POOL}/{BACKFILL_QUEUE}", "present")


def _deployments(client: Any) -> Check:
    from prefect.exceptions import ObjectNotFound

    expected = expected_deployments()
    missing = []
    for name in expected:
        try:
            client.read_deployment_by_name(name)
        except ObjectNotFound:
            missing.append(name)
    if missing:
        return failed("deployments", f"missing {', '.join(missing)}", _DEPLOY)
    return passed("deployments", f"all {len(expected)} of prefect.yaml")


def _load_limit(client: Any, settings: Settings) -> Check:
    from prefect.exceptions import ObjectNotFound

    from blocks.limits import WAREHOUSE_LOADS_LIMIT

    name = f"concurrency limit {WAREHOUSE_LOADS_LIMIT}"
    if settings.warehouse_load_slots == 0:
        return Check(name, None, "FLEET_WAREHOUSE_LOAD_SLOTS=0: loads are not capped")
    try:
        limit = client.read_global_concurrency_limit_by_name(WAREHOUSE_LOADS_LIMIT)
    except ObjectNotFound:
        return failed(name, "not found (the first load would create it)", _REGISTER)
    return passed(name, f"{limit.limit} slots")


def _flow_run_retention(url: str) -> Check:
    """Does the server trim old flow runs (its vacuum service)? A thousand deliveries a day
    are that many runs or task runs; off is Prefect's default, so it is said, not failed."""
    import httpx

    name = "flow run retention"
    try:
        answer = httpx.get(url.rstrip("/") + "/admin/settings", timeout=_PROBE_TIMEOUT_SECONDS)
        vacuum = answer.raise_for_status().json()["server"]["services"]["db_vacuum"]
    except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
        return Check(name, None, f"the server's settings are not readable ({type(exc).__name__})")
    if "flow_runs" not in (vacuum.get("enabled") or []):
        return Check(
            name,
            None,
            "off: the server keeps every flow run, its logs and artifacts",
            "on the server: PREFECT_SERVER_SERVICES_DB_VACUUM_ENABLED=events,flow_runs "
            "(docs/operating.md, State that does not pile up)",
        )
    return passed(name, f"flow runs ended {vacuum.get('retention_period')} ago are deleted")


def _zombie_automation(client: Any) -> Check:
    """Is a run whose process died marked Crashed, and only a dead one? The automation must
    exist, be enabled, and its window span two heartbeats of the runs (the deployment's job
    variables, else this environment's Prefect setting)."""
    from blocks.zombies import ZOMBIE_AUTOMATION, read_zombie_automation, zombie_after_seconds

    name = "zombie flow runs"
    automation = read_zombie_automation(client)
    if automation is None:
        return failed(
            name,
            f"automation {ZOMBIE_AUTOMATION} not found: a killed run stays Running",
            _REGISTER,
        )
    if not automation.enabled:
        return failed(
            name,
            f"automation {ZOMBIE_AUTOMATION} is disabled: a killed run stays Running",
            f"{_REGISTER} (or prefect automation resume {ZOMBIE_AUTOMATION})",
        )
    window = zombie_after_seconds(automation)
    heartbeat, source = _heartbeat_seconds(client)
    heartbeat_fix = (
        f'PREFECT_FLOWS_HEARTBEAT_FREQUENCY: "30" in prefect.yaml\'s job variables, then {_DEPLOY}'
    )
    if heartbeat is None:
        return failed(
            name, f"runs send no heartbeats ({source}): a killed run stays Running", heartbeat_fix
        )
    if window < 2 * heartbeat:
        return failed(
            name,
            f"runs send a heartbeat every {heartbeat} s ({source}): {ZOMBIE_AUTOMATION} "
            f"({window} s) would crash live runs",
            f"{heartbeat_fix}; or {_REGISTER} --zombie-after {2 * heartbeat}",
        )
    return passed(
        name,
        f"marked Crashed {window} s after a heartbeat; runs send one every {heartbeat} s "
        f"({source})",
    )


def _heartbeat_seconds(client: Any) -> tuple[int | None, str]:
    """How often an import's run heartbeats, and where that is set."""
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import get_current_settings

    from blocks.zombies import HEARTBEAT_VARIABLES

    try:
        deployment = client.read_deployment_by_name("import-s3-folder/import-s3-folder")
        env = (deployment.job_variables or {}).get("env") or {}
    except ObjectNotFound:
        env = {}
    for variable in HEARTBEAT_VARIABLES:
        value = str(env.get(variable) or "")
        if value:
            # Not a whole number: Prefect refuses it, so no heartbeat can be counted on.
            seconds = int(value) if value.isdigit() else None
            return seconds, "the deployments' job variables"
    return get_current_settings().flows.heartbeat_frequency, "this environment"


def _blocks(client: Any) -> Iterator[Check]:
    from prefect.exceptions import ObjectNotFound

    from blocks.fleet_blocks import BLOCK_DOCUMENTS

    unregistered, documents = [], []
    for block_cls, name in BLOCK_DOCUMENTS:
        slug = block_cls.get_block_type_slug()
        try:
            client.read_block_type_by_slug(slug)
        except ObjectNotFound:
            unregistered.append(slug)
            continue
        try:
            client.read_block_document_by_name(name, block_type_slug=slug)
            documents.append(f"{slug}/{name}")
        except ObjectNotFound:
            pass
    if unregistered:
        yield failed("block types", f"not registered: {', '.join(unregistered)}", _REGISTER)
        return
    yield passed("block types", "registered")
    if documents:
        yield passed("block documents", ", ".join(documents))
    else:
        yield Check(
            "block documents",
            None,
            "none: workers read settings from their environment",
            f"{_REGISTER} --from-env stores them",
        )
