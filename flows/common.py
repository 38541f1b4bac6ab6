"""What every flow shares: settings (the environment, then blocks), the event sink, the retry
rule, the warehouse load slots, and Prefect-visible state helpers."""

from __future__ import annotations

import functools
import gc
import logging
import os
import random
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from prefect import Task
from prefect.client.schemas.objects import TaskRun
from prefect.concurrency.sync import concurrency
from prefect.events import emit_event
from prefect.runtime import flow_run
from prefect.states import State

from blocks.settings_in_force import settings_in_force
from fleet_import.checks.settings import IMPORTS, SettingsInvalid, check_settings
from fleet_import.config import Settings
from fleet_import.errors import should_retry
from fleet_import.importing.driver import STEP_BACKOFF
from fleet_import.importing.leased_batch import LeasedBatch
from fleet_import.importing.runtime import Runtime, build_runtime
from fleet_import.publication.events import BATCH_FAILED_EVENT
from flows.api_reports import PrefectApiGone, api_unreachable, describe_outage, report

log = logging.getLogger(__name__)
T = TypeVar("T")

# A load slot is leased: a worker killed mid-load gives its slot back when the lease runs
# out (Prefect's minimum is 60 s); a live one renews it in the background.
LOAD_SLOT_LEASE_SECONDS = 60.0
# Limits this process saw exist: a bulk import's next load in the same process asks the API
# for the slots only, not again whether each limit exists (two calls and a client fewer).
# Forgotten when taking the slots fails, so a limit deleted since is made again.
_LIMITS_SEEN: set[str] = set()

# Exponential backoff with jitter for transient failures (dropped database connections,
# serialisation conflicts); contract violations are never retried, nor S3's errors, which
# botocore retried already (fleet_import.s3.client: one retry layer for S3).
# The core's step retry policy (fleet_import.importing.driver), so a step is retried alike under the
# CLI's core path and as a Prefect task.
TASK_RETRY_DELAYS = list(STEP_BACKOFF.delays)
TASK_RETRIES = STEP_BACKOFF.retries
TASK_RETRY_JITTER = STEP_BACKOFF.jitter


def retry_if_transient(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    """retry_condition_fn: retry only errors that may pass on their own and that no layer
    below retried already (S3's: botocore is their one retry layer)."""
    try:
        state.result(raise_on_failure=True)
    except BaseException as exc:  # noqa: BLE001 - we classify, not handle
        return should_retry(exc)
    return False


def load_settings() -> Settings:
    """The settings in force (blocks.settings_in_force: the environment, then the blocks,
    then the defaults), the same every command and check uses; a variable whose value is
    refused is SettingsInvalid, as every other problem."""
    resolved, problems = settings_in_force()
    if problems:
        raise SettingsInvalid(problems)
    return resolved.settings


@contextmanager
def warehouse_load_slots(tenant_id: str, settings: Settings | None = None) -> Iterator[None]:
    """Hold a slot of the global load limit and one of the tenant's while a slice loads;
    waits while either is full. A missing limit is created, sized by the settings; a size
    of 0 turns that limit off.

    A worker that dies holding a slot gives it back when its lease expires: the Prefect
    server's repossessor service does that. An ephemeral server (Prefect's test harness, a
    flow run with no PREFECT_API_URL) runs no services: there a dead holder's slot is never
    freed, so turn the limits off (0) or point the flows at a real `prefect server`."""
    from blocks.limits import WAREHOUSE_LOADS_LIMIT, ensure_limit, tenant_limit

    settings = settings or Settings()
    sizes = {
        WAREHOUSE_LOADS_LIMIT: settings.warehouse_load_slots,
        tenant_limit(tenant_id): settings.tenant_load_slots,
    }
    names = [name for name, size in sizes.items() if size > 0]
    if not names:
        yield
        return
    try:
        try:
            slots = _take_slots(names, sizes, ensure_limit)
        except Exception as exc:
            if api_unreachable(exc) or not _LIMITS_SEEN.intersection(names):
                raise
            # A limit this process saw may have been deleted since: made again, once.
            _LIMITS_SEEN.difference_update(names)
            slots = _take_slots(names, sizes, ensure_limit)
    except Exception as exc:
        # No slot, no load: the cap is the warehouse's promise. Nothing was loaded yet.
        if api_unreachable(exc):
            raise PrefectApiGone(f"no warehouse load slot: {describe_outage(exc)}") from exc
        raise
    try:
        yield
    except BaseException:
        _give_back(slots, names, *sys.exc_info())
        raise
    _give_back(slots, names, None, None, None)


def _take_slots(
    names: list[str], sizes: dict[str, int], ensure_limit: Callable[[str, int], bool]
) -> Any:
    """Make the limits this process has not seen yet, then take one slot of each."""
    # strict: a limit deleted since is an error, not a silent pass. A failed lease renewal
    # is not: the slot only throttles, the batch's lease in PostgreSQL guards the load.
    slots = concurrency(
        names,
        occupy=1,
        strict=True,
        lease_duration=LOAD_SLOT_LEASE_SECONDS,
        raise_on_lease_renewal_failure=False,
    )
    # A tenant's first load creates its limit: expected, not a warning; one line for all.
    made = [name for name in names if name not in _LIMITS_SEEN and ensure_limit(name, sizes[name])]
    if made:
        told = ", ".join(f"{name} ({sizes[name]} slots)" for name in made)
        log.info("created concurrency limits %s", told)
    slots.__enter__()
    _LIMITS_SEEN.update(names)
    return slots


def _give_back(slots: Any, names: list[str], *exc_info: Any) -> None:
    """Release the load slots; an API that is gone cannot take them back, and their lease
    ends them on the server (LOAD_SLOT_LEASE_SECONDS): the load's outcome stands."""
    try:
        slots.__exit__(*exc_info)
    except Exception as exc:
        if not api_unreachable(exc):
            raise
        log.warning(
            "load slots %s not given back (%s); their lease frees them within %.0f s",
            ", ".join(names),
            describe_outage(exc),
            LOAD_SLOT_LEASE_SECONDS,
        )


def holding_load_slots(load: Callable[..., T]) -> Callable[..., T]:
    """The slice load step (`load_step(batch, ...)`) inside the load slots of its tenant."""

    @functools.wraps(load)
    def wrapper(batch: LeasedBatch, *args: Any, **kwargs: Any) -> T:
        with warehouse_load_slots(batch.tenant_id):
            return load(batch, *args, **kwargs)

    return wrapper


def prefect_event_sink(name: str, payload: Mapping[str, Any]) -> None:
    """Core events become Prefect events on the batch resource (a delivery that made no
    batch, such as a `fleet.delivery.skipped` one, on its folder), related to the flow run.
    A freshness event (`fleet.tenant.*`, which names a tenant and a dataset, no batch) is on
    `fleet.freshness.{tenant}.{dataset}`, so an automation counts each of them alone.
    A failed batch's resource carries its failure kind (`fleet.failure`). A payload's
    `event_id` becomes the event's id (Prefect keeps one event per id)."""
    if "dataset" in payload and "batch_id" not in payload:
        tenant, dataset = payload.get("tenant_id"), payload["dataset"]
        resource = {
            "prefect.resource.id": f"fleet.freshness.{tenant}.{dataset}",
            "prefect.resource.name": f"{tenant} {dataset}",
            "fleet.dataset": str(dataset),
        }
    elif "batch_id" in payload or "folder" not in payload:
        batch_id = str(payload.get("batch_id", "unknown"))
        resource = {
            "prefect.resource.id": f"fleet.batch.{batch_id}",
            "prefect.resource.name": f"batch {batch_id}",
        }
    else:
        folder = str(payload["folder"])
        resource = {
            "prefect.resource.id": f"fleet.delivery.{folder}",
            "prefect.resource.name": folder,
        }
    if payload.get("tenant_id") is not None:
        resource["fleet.tenant"] = str(payload["tenant_id"])
    if name == BATCH_FAILED_EVENT and payload.get("kind") is not None:
        # Triggers match resources, not payloads: the notifications tell failed
        # publications apart by this label (blocks.notifications).
        resource["fleet.failure"] = str(payload["kind"])
    if payload.get("folder") is not None:
        resource["fleet.folder"] = str(payload["folder"])
    try:
        event_id = payload.get("event_id")
        emit_event(
            event=name,
            resource=resource,
            payload=dict(payload),
            id=uuid.UUID(str(event_id)) if event_id else None,
        )
    except Exception as exc:  # noqa: BLE001 - an event never fails the import
        log.warning("could not emit %s: %s", name, exc)


def runtime_for_flow(settings: Settings | None = None, **kwargs: Any) -> Runtime:
    """The run's runtime; SettingsInvalid (every problem at once) before anything starts."""
    settings = check_settings(IMPORTS, settings=settings or load_settings())
    return build_runtime(settings, events=prefect_event_sink, **kwargs)


def freeze_startup_heap(*, owned: bool = False) -> None:
    """In a process that exists for this one run (a worker's flow-run process, or `owned`:
    the CLI's), put every object alive now (Prefect, pyarrow, pydantic's models: what the
    imports made) out of the cycle collector's sight, so neither its passes during the run
    nor the interpreter's last one at exit walk them again: about 0.7 CPU-s of a tiny
    delivery's run (benchmarks/small_deliveries.py). They live until exit anyway. Not in a
    process that runs many flows (tests, a served flow): there it would keep garbage."""
    run_id = flow_run.get_id()
    if owned or (run_id is not None and os.environ.get("PREFECT__FLOW_RUN_ID") == run_id):
        gc.freeze()


def lease_owner() -> str:
    """Flow run id plus a per-acquisition suffix: a retry of the same run is a new owner."""
    return f"flow-run:{flow_run.get_id() or 'local'}:{random.getrandbits(40):010x}"


def tag_flow_run(*tags: str) -> None:
    """Add tags to the running flow run (tenant, scope), so the UI can filter on them."""
    from prefect.client.orchestration import get_client

    run_id = flow_run.get_id()
    if run_id is None:
        return

    def send() -> None:
        # The run's own tags from its context (one API call fewer); read only outside it.
        current = flow_run.get_tags()
        with get_client(sync_client=True) as client:
            client.update_flow_run(run_id, tags=sorted({*current, *tags}))

    try:
        report(f"the tags of flow run {run_id}", send)
    except Exception as exc:  # noqa: BLE001 - tags are a convenience, never a failure
        log.warning("could not tag flow run %s: %s", run_id, exc)
