"""A worker process for the reliability tests: `once` runs one import (the crash matrix
kills it at a failpoint), `loop` imports random deliveries until a deadline (the soak kills
and stalls it from outside).

Usage: python -m tests.reliability.soak_worker CONFIG_JSON

It builds what a deployed worker builds: an ImportContext with a Publisher carrying the
default steps. refresh_dependants inserts a row into a side-effect table and every event is
appended to a JSON-lines file, so the parent can count how often each step took effect.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from fleet_import.errors import FleetImportError
from fleet_import.importing.context import ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.publication.publisher import Publisher
from fleet_import.publication.retention import Retention
from fleet_import.retry import Backoff
from fleet_import.s3.client import s3_client
from fleet_import.s3.staging import StagingArea
from fleet_import.scope import Tenant
from fleet_import.store.outbox import OutboxRepository
from fleet_import.store.repository import BatchRepository
from fleet_import.store.review_repository import ReviewRepository
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse

_DRAIN_PROBABILITY = 0.1


def event_sink(path: Path, worker: str):
    def emit(name: str, payload: Mapping[str, Any]) -> None:
        line = json.dumps({"event": name, "worker": worker, "pid": os.getpid(), **payload})
        # One write per event, O_APPEND: lines of concurrent workers never interleave.
        with path.open("a") as handle:
            handle.write(line + "\n")

    return emit


def build(config: Mapping[str, Any]) -> tuple[ImportContext, Publisher]:
    database_url, ttl = config["database_url"], float(config["ttl"])
    s3 = s3_client(config["endpoint"])
    repo = BatchRepository(database_url)
    warehouse = PostgresWarehouse(database_url)
    staging = StagingArea(config["staging_uri"], s3)
    events = event_sink(Path(config["events"]), config.get("worker", "once"))
    refresh_sql = [config["refresh_sql"]] if config.get("refresh_sql") else []
    publisher = Publisher(
        repo,
        OutboxRepository(database_url),
        warehouse,
        events=events,
        refresh_sql=refresh_sql,
        run_warehouse_sql=warehouse.execute if refresh_sql else None,
        staging=staging,
        backoff=Backoff((0.0,)),
        # Claims end with the lease they were made under; "claim_ttl" may set it apart.
        claim_ttl=float(config.get("claim_ttl", ttl)),
        # "retain": keep earlier successes' files for rollbacks, as the runtime does.
        retention=Retention(ReviewRepository(database_url)) if config.get("retain") else None,
    )
    ctx = ImportContext(
        repo=repo,
        warehouse=warehouse,
        s3=s3,
        staging=staging,
        lease_ttl=ttl,
        publisher=publisher,
        events=events,
        workdir=Path(config["workdir"]),
    )
    return ctx, publisher


def describe(outcome: object) -> dict[str, Any]:
    if isinstance(outcome, dict):
        return outcome
    fields = asdict(outcome) if is_dataclass(outcome) else {}  # type: ignore[arg-type]
    keep = {k: v for k, v in fields.items() if k in {"batch_id", "published", "recovered"}}
    return {"outcome": type(outcome).__name__, **json.loads(json.dumps(keep, default=str))}


Importer = Callable[[ImportContext, Tenant, str, str], object]


def importer(config: Mapping[str, Any], publisher: Publisher) -> Importer:
    """The core's import_folder, or (config "path": "flow") the import-s3-folder flow."""
    if config.get("path") != "flow":
        return import_folder
    use_prefect_api(config)
    return lambda ctx, tenant, folder, key: through_flow(
        "import_s3_folder",
        config,
        ctx,
        publisher,
        tenant_id=tenant.tenant_id,
        folder=folder,
        delivery_key=key,
    )


def use_prefect_api(config: Mapping[str, Any]) -> None:
    if config.get("prefect_api_url"):  # before Prefect is imported: it reads settings then
        os.environ["PREFECT_API_URL"] = config["prefect_api_url"]


def run_once(config: Mapping[str, Any]) -> int:
    ctx, publisher = build(config)
    tenant, folder, key = Tenant.named(config["tenant"]), config["folder"], config["key"]
    if config.get("action") in ("approve", "rollback"):  # issue #24's crash cases
        outcome = review_action(ctx, publisher, config, tenant, folder)
    elif config.get("action") == "drain":
        outcome = drain_once(ctx, publisher, config["worker"])
    else:
        outcome = importer(config, publisher)(ctx, tenant, folder, key)
    print(json.dumps(describe(outcome)), flush=True)
    return 0


def drain_once(ctx: ImportContext, publisher: Publisher, worker: str) -> dict[str, Any]:
    """What the drain-publications flow does, on the core's calls: settle abandoned
    batches, then publish committed ones nobody executes."""
    from fleet_import.importing.claim import settle_abandoned_batches

    outcomes = [*settle_abandoned_batches(ctx, worker, 10)]
    outcomes += publisher.drain(worker, lease_ttl=ctx.lease_ttl)
    return {"outcome": "Drained", "outcomes": [describe(o) for o in outcomes]}


def review_action(
    ctx: ImportContext,
    publisher: Publisher,
    config: Mapping[str, Any],
    tenant: Tenant,
    folder: str,
) -> object:
    """Approve the held batch `config["batch"]`, or roll the folder back to it: the core's
    calls, or (config "path": "flow") the approve-held-batch / rollback-slice flow."""
    import uuid

    from fleet_import.importing.review import approve_held
    from fleet_import.importing.rollback import rollback_slice

    approve = config["action"] == "approve"
    if config.get("path") == "flow":
        use_prefect_api(config)
        if approve:
            return through_flow(
                "approve_held_batch", config, ctx, publisher, batch_id=config["batch"]
            )
        return through_flow(
            "rollback_slice",
            config,
            ctx,
            publisher,
            tenant_id=tenant.tenant_id,
            folder=folder,
            to_batch_id=config["batch"],
        )
    from tests.helpers import layout_admission

    reviews = ReviewRepository(config["database_url"])
    batch_id = uuid.UUID(config["batch"])
    if approve:
        return approve_held(ctx, batch_id, admission=layout_admission())
    return rollback_slice(
        ctx, reviews, tenant.tenant_id, folder, batch_id, admission=layout_admission()
    )


def through_flow(
    name: str,
    config: Mapping[str, Any],
    ctx: ImportContext,
    publisher: Publisher,
    **parameters: Any,
) -> object:
    """The flow `flows.{name}.{name}` (PREFECT_API_URL must name a server) run on this
    worker's ImportContext, so its events reach the same file; the outcome the flow turned
    into its final state."""
    import importlib

    import flows.operation
    from fleet_import.config import Settings
    from fleet_import.importing.runtime import Runtime

    module = importlib.import_module(f"flows.{name}")
    settings = Settings(database_url=config["database_url"])  # the flows' own repositories
    runtime = Runtime(settings, ctx, OutboxRepository(config["database_url"]), publisher)
    outcomes: list[object] = []
    state_for = flows.operation.state_for

    def recording_state_for(outcome: object, **kwargs: object):
        outcomes.append(outcome)
        return state_for(outcome, **kwargs)

    module.runtime_for_flow = lambda **_: runtime
    # Every flow that loads a slice turns its outcome into its state in flows.operation.
    flows.operation.state_for = recording_state_for
    state = getattr(module, name)(**parameters, return_state=True)
    if outcomes:
        return outcomes[-1]
    # No outcome: the flow lost its lease (an expected end after a stall), or it crashed.
    message = state.message or ""
    if message.startswith("lost the lease"):
        return {"outcome": "Error", "error": f"LeaseLost: {message}"}
    return {"outcome": "Crash", "error": f"{state.name}: {message}"}


def run_loop(config: Mapping[str, Any]) -> int:
    """Pick random deliveries from the plan until the deadline; log every outcome."""
    ctx, publisher = build(config)
    run_import = importer(config, publisher)
    rng = random.Random(config["seed"])
    plan = config["plan"]
    log = Path(config["log"])
    worker = config["worker"]
    while time.time() < config["deadline"]:
        started = time.monotonic()
        if rng.random() < _DRAIN_PROBABILITY:
            job = {"drain": True}
            try:
                outcomes = publisher.drain(worker, lease_ttl=ctx.lease_ttl)
                result = {"outcome": "Drained", "count": len(outcomes)}
            except FleetImportError as exc:
                result = {"outcome": "Error", "error": f"{type(exc).__name__}: {exc}"}
        else:
            tenant, folder, key = rng.choice(plan)
            job = {"tenant": tenant, "folder": folder, "key": key}
            try:
                result = describe(run_import(ctx, Tenant.named(tenant), folder, key))
            except FleetImportError as exc:  # LeaseLost after a stall: expected, logged
                result = {"outcome": "Error", "error": f"{type(exc).__name__}: {exc}"}
            except Exception as exc:  # noqa: BLE001 - anything else is a finding
                result = {
                    "outcome": "Crash",
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(),
                }
        record = {"worker": worker, "pid": os.getpid(), **job, **result}
        record["seconds"] = round(time.monotonic() - started, 3)
        with log.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
    return 0


def main(argv: list[str]) -> int:
    config = json.loads(argv[0])
    return run_once(config) if config["mode"] == "once" else run_loop(config)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
