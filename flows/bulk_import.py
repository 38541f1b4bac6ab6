"""bulk_import: many deliveries in one flow run (a "shard" of a sweep, issue 50).

A flow run costs Prefect's engine start and end, a worker slot and tens of API calls; a tiny
delivery costs the core a fraction of that. A shard imports its deliveries on its task
runner's threads, each as one task run named `import/{tenant}/{date}` whose final state is the
delivery's (Completed, Held, Failed, AlreadyLoaded...), with its batch artifact and story:
what the UI shows of one delivery, without a flow run of its own. Each delivery goes
through the same claim and driver as `import-s3-folder` (its own delivery key, scope
reservation, lease and load slots), so a shard and a per-folder run of one folder never load
it twice at once; one delivery failing or held ends its own task run only.

`per_folder="flow"` runs each delivery as a child `import-s3-folder` flow run instead, in
this process: benchmarks/fleet_scale.py measures both (benchmarks/README.md says which won).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture, wait
from prefect.runtime import flow_run, task_run
from prefect.states import Completed, State
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote
from pydantic import BaseModel

from fleet_import.errors import FleetImportError, InvalidInput
from fleet_import.importing.driver import CoreSteps, Step, import_folder
from fleet_import.importing.runtime import Runtime
from fleet_import.intake.admission import admission
from fleet_import.scope import folder_leaf, source_scope
from flows.common import (
    holding_load_slots,
    lease_owner,
    load_settings,
    runtime_for_flow,
)
from flows.import_s3_folder import import_s3_folder
from flows.operation import FlowHost, run_operation
from flows.reporting import (
    failed,
    fails_with_one_line,
    foreseen_failure,
)
from flows.story import tell_tenants

BULK = "bulk-import"  # a refusal's `source`, as the flow is named
DEFAULT_CONCURRENCY = 4
"""Deliveries a shard imports at once: its threads wait on S3, PostgreSQL and the warehouse
more than they compute; more than the warehouse load slots only queues at the slots."""
_SHARD_ROWS_SHOWN = 500


class Delivery(BaseModel):
    """One delivery of a shard: `import-s3-folder`'s parameters."""

    tenant_id: str
    folder: str
    delivery_key: str


class BulkSteps(CoreSteps):
    """The driver's steps as plain calls in the delivery's task run (retried on transient
    errors as under the CLI), the slice load inside the warehouse load slots as in the
    flow: a shard's deliveries hold the same caps as their per-folder runs."""

    def run(self, step: Step, fn: Any, *args: Any) -> Any:
        if step.name == "commit-slice":
            fn = holding_load_slots(fn)
        return super().run(step, fn, *args)


def _delivery_run_name() -> str:
    delivery = task_run.get_parameters().get("delivery")
    if not isinstance(delivery, Delivery):
        return "import/?"
    return f"import/{delivery.tenant_id}/{folder_leaf(delivery.folder)}"


def _shard_run_name() -> str:
    deliveries = flow_run.get_parameters().get("deliveries") or []
    return f"bulk-import/{len(deliveries)}-deliveries"


@task(name="import-delivery", task_run_name=_delivery_run_name, cache_policy=NO_CACHE)
def import_delivery(rt: Runtime, delivery: Delivery) -> State:
    """One delivery through the claim and the driver; its outcome is this task run's state."""
    try:
        return _import_delivery(rt, delivery)
    except FleetImportError as exc:  # a database gone mid-way: its one line, siblings go on
        return foreseen_failure(exc)


def _import_delivery(rt: Runtime, delivery: Delivery) -> State:
    """The same operation as `import-s3-folder` (`importing.driver.import_folder`: admission,
    claim, the steps), its steps plain calls in this task run; the shard tells each tenant's
    table once for all its deliveries."""
    try:
        source_scope(delivery.folder)  # invalid input is refused before anything is written
        return run_operation(
            FlowHost(rt, tell_unreported=True, tenant_tables=False),
            lambda steps, host: import_folder(
                rt.ctx,
                delivery.tenant_id,
                delivery.folder,
                delivery.delivery_key,
                admission=admission(rt.settings),
                owner=lease_owner(),
                steps=steps,
                host=host,
                source=BULK,
            ),
            steps=BulkSteps(rt.ctx.normalize_workers),
        )
    except InvalidInput as exc:
        return failed(f"invalid input: {exc}")


@task(name="import-folder-run", task_run_name=_delivery_run_name, cache_policy=NO_CACHE)
def import_folder_run(delivery: Delivery) -> State:
    """One delivery as a child `import-s3-folder` flow run (the measured alternative)."""
    return import_s3_folder(
        tenant_id=delivery.tenant_id,
        folder=delivery.folder,
        delivery_key=delivery.delivery_key,
        return_state=True,
    )


@flow(
    name="bulk-import",
    flow_run_name=_shard_run_name,
    retries=0,
    task_runner=ThreadPoolTaskRunner(max_workers=DEFAULT_CONCURRENCY),
)
@fails_with_one_line
def bulk_import(
    deliveries: list[Delivery],
    per_folder: Literal["task", "flow"] = "task",
) -> dict[str, int] | State:
    """Import many tenant folders in this one flow run, each on its own: one task run per
    delivery, named import/{tenant}/{date}, whose state is that delivery's outcome. One
    delivery failing or held never fails the others, nor this run.

    Args:
        deliveries: The deliveries, each with tenant_id, folder and delivery_key as
            import-s3-folder takes them (the sweep fills this).
        per_folder: "task": each delivery a task run of this flow run (the default: fewer
            API calls and no engine start per delivery); "flow": each a child
            import-s3-folder flow run, as a per-folder run shows it.
    """
    logger = get_run_logger()
    if not deliveries:
        return {"deliveries": 0}
    futures: list[PrefectFuture[Any]]
    if per_folder == "flow":
        futures = [import_folder_run.submit(d) for d in deliveries]
    else:
        # One runtime for the shard: its connections are per call, its S3 client shared.
        rt = runtime_for_flow(settings=load_settings())
        futures = [
            import_delivery.with_options(tags=[f"tenant:{d.tenant_id}"]).submit(quote(rt), d)
            for d in deliveries
        ]
    wait(futures)
    # A task's returned state is its final state: Held, AlreadyLoaded... as the run's would be.
    states = [future.state for future in futures]
    counts = Counter(state.name or "unknown" for state in states)
    rows = [
        {
            "tenant": d.tenant_id,
            "folder": d.folder,
            "state": state.name,
            "message": (state.message or "")[:200],
        }
        for d, state in zip(deliveries, states, strict=True)
    ]
    summary = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
    description = f"bulk import of {len(deliveries)} deliveries: {summary}"
    if per_folder == "task":
        tell_tenants(rt, sorted({d.tenant_id for d in deliveries}))
    create_table_artifact(rows[:_SHARD_ROWS_SHOWN], key="bulk-import", description=description)
    logger.info(description)
    return Completed(message=description, data={"deliveries": len(deliveries), **counts})
