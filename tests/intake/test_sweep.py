"""The landing-zone sweep: completion rules, planning against the operational store, the
sweep/event race, bursts of duplicate events, and the flow under Prefect's test harness."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet_import import failpoints
from fleet_import.errors import InvalidInput
from fleet_import.importing.context import (
    Committed,
    Failed,
    ImportContext,
    NotClaimed,
    NothingToDo,
    Skipped,
)
from fleet_import.importing.driver import import_folder as run_import
from fleet_import.intake.completion import Marker, Quiet, completion_rule
from fleet_import.intake.sweep import (
    MAX_KEY_LENGTH,
    Scan,
    announce_skips,
    find_ready_folders,
    idempotency_key,
    plan_sweep,
)
from fleet_import.intake.triggers import marker_event_matches, resource_matches
from fleet_import.s3.sources import discover
from fleet_import.sample_data import csv_bytes, fleet_delivery, today_folder, trips_table
from fleet_import.scope import Tenant, source_scope, split_folder
from fleet_import.store.models import BatchStatus
from fleet_import.store.repository import BatchRepository
from fleet_import.store.sweep_repository import SweepRepository
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse
from tests.helpers import upload
from tests.s3fixtures import put_objects

ACME = Tenant.named("acme")
PREFECT_YAML = Path(__file__).resolve().parents[2] / "prefect.yaml"
LATER = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)


def deliver(s3, folder: str, *, marker: bool = True, **sizes: int) -> None:
    files = fleet_delivery(**({"trips": 40, "fuel": 10, "vehicles": 5} | sizes))
    if marker:
        files["_SUCCESS"] = b""
    upload(s3, folder, files)


def ready_folders(scan: Scan) -> dict[str, str]:
    return {f.folder: f.tenant_id for f in scan.ready}


def reasons(skipped) -> dict[str, str]:
    return {skip.folder: skip.reason for skip in skipped}


def tenants(skipped) -> dict[str, str | None]:
    return {skip.folder: skip.tenant_id for skip in skipped}


class ListCalls:
    """Counts the LIST requests (every page) a client sends, by a botocore event hook."""

    def __init__(self, s3) -> None:
        self.count = 0
        s3.meta.events.register("before-call.s3.ListObjectsV2", self._seen)

    def _seen(self, **kwargs: Any) -> None:
        self.count += 1


class Sink:
    """An event sink that records what it is given."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, name: str, payload: Any) -> None:
        self.events.append((name, dict(payload)))


def import_trigger() -> dict[str, Any]:
    config = yaml.safe_load(PREFECT_YAML.read_text())
    [deployment] = [d for d in config["deployments"] if d["name"] == "import-s3-folder"]
    [trigger] = deployment["triggers"]
    return trigger


def trigger_match(bucket: str) -> dict[str, Any]:
    """The trigger's match, for this test's bucket instead of fleet-landing."""
    match = dict(import_trigger()["match"])
    match["prefect.resource.id"] = match["prefect.resource.id"].replace(
        "s3://fleet-landing/", f"s3://{bucket}/"
    )
    return match


# -- completion rules and listing ------------------------------------------------------------


def test_marker_rule_lists_tenants_and_dates_and_skips_what_it_cannot_import(
    s3, landing_bucket: str
) -> None:
    complete = today_folder(landing_bucket, "acme")
    unmarked = today_folder(landing_bucket, "acme", dt.date(2026, 7, 23))
    globex = today_folder(landing_bucket, "globex")
    deliver(s3, complete)
    deliver(s3, unmarked, marker=False)
    deliver(s3, globex)
    put_objects(
        s3,
        landing_bucket,
        {
            "Bad_Tenant/fleet/2026-07-22/_SUCCESS": b"",
            "acme/fleet/latest/_SUCCESS": b"",
            "acme/fleet/2026-02-30/_SUCCESS": b"",
            "acme/other/2026-07-22/_SUCCESS": b"",  # not the layout: never looked at
            "acme/fleet/2026-07-24/_SUCCESS": b"",  # a marker and nothing to import
        },
    )
    scan = find_ready_folders(s3, landing_bucket, completion=Marker())
    assert ready_folders(scan) == {complete: "acme", globex: "globex"}
    fingerprints = {f.folder: f.fingerprint for f in scan.ready}
    assert fingerprints[complete] == discover(s3, complete, _contracts()).fingerprint
    skipped = reasons(scan.skipped)
    assert "waiting for its _SUCCESS marker" in skipped[unmarked]
    assert "invalid tenant id 'Bad_Tenant'" in skipped[f"s3://{landing_bucket}/Bad_Tenant/"]
    assert "not a yyyy-mm-dd date" in skipped[f"s3://{landing_bucket}/acme/fleet/latest/"]
    assert "not a yyyy-mm-dd date" in skipped[f"s3://{landing_bucket}/acme/fleet/2026-02-30/"]
    assert (
        "no file for required dataset" in skipped[f"s3://{landing_bucket}/acme/fleet/2026-07-24/"]
    )
    assert not any("/acme/other/" in folder for folder in skipped)
    # Every skip names its tenant (an invalid one as written), for the plan's tenant column.
    assert tenants(scan.skipped) == {
        unmarked: "acme",
        f"s3://{landing_bucket}/Bad_Tenant/": "Bad_Tenant",
        f"s3://{landing_bucket}/acme/fleet/latest/": "acme",
        f"s3://{landing_bucket}/acme/fleet/2026-02-30/": "acme",
        f"s3://{landing_bucket}/acme/fleet/2026-07-24/": "acme",
    }


def _contracts():
    from fleet_import.contracts.fleet import FLEET_DATASETS

    return FLEET_DATASETS


def test_quiet_rule_and_marker_grace_use_last_modified(s3, landing_bucket: str) -> None:
    marked = today_folder(landing_bucket, "acme")
    unmarked = today_folder(landing_bucket, "globex")
    deliver(s3, marked)
    deliver(s3, unmarked, marker=False)

    quiet = Quiet(3600)
    assert find_ready_folders(s3, landing_bucket, completion=quiet).ready == []
    later = find_ready_folders(s3, landing_bucket, completion=quiet, now=LATER)
    assert ready_folders(later) == {marked: "acme", unmarked: "globex"}

    # A fresh marker is left to the S3 event trigger for the grace period.
    graced = completion_rule("marker", marker_grace_seconds=600)
    fresh = find_ready_folders(s3, landing_bucket, completion=graced)
    assert fresh.ready == []
    assert "left to the S3 event trigger" in reasons(fresh.skipped)[marked]
    assert ready_folders(find_ready_folders(s3, landing_bucket, completion=graced, now=LATER)) == {
        marked: "acme"
    }


class _SmallPages:
    """An S3 client whose listings come two keys or prefixes per page."""

    def __init__(self, s3) -> None:
        self._s3 = s3
        self.pages = 0

    def __getattr__(self, name: str):
        return getattr(self._s3, name)

    def get_paginator(self, operation: str):
        paginator = self._s3.get_paginator(operation)
        outer = self

        class Paginator:
            def paginate(self, **kwargs):
                for page in paginator.paginate(**kwargs, PaginationConfig={"PageSize": 2}):
                    outer.pages += 1
                    yield page

        return Paginator()


def test_listing_follows_every_page(s3, landing_bucket: str) -> None:
    tenants = [f"tenant-{n}" for n in range(5)]
    folders = {
        today_folder(landing_bucket, t, dt.date(2026, 7, d)): t for t in tenants for d in (1, 2, 3)
    }
    for folder in folders:
        deliver(s3, folder)
    small = _SmallPages(s3)
    scan = find_ready_folders(small, landing_bucket, prefix="", completion=Marker())
    assert ready_folders(scan) == folders
    assert small.pages > len(folders) * 2  # tenants, dates and files each took several pages


def test_prefix_and_layout_are_configurable(s3, landing_bucket: str) -> None:
    folder = f"s3://{landing_bucket}/landing/acme/deliveries/dt=2026-07-22/"
    deliver(s3, folder)
    deliver(s3, today_folder(landing_bucket, "globex"))  # outside the prefix
    scan = find_ready_folders(
        s3,
        landing_bucket,
        "landing",
        layout="{prefix}{tenant}/*/dt={yyyy-mm-dd}/",
        completion=completion_rule("marker"),
    )
    assert ready_folders(scan) == {folder: "acme"}


# -- the lookback window ---------------------------------------------------------------------


def test_the_lookback_window_never_lists_old_folders_and_each_folder_costs_one_list(
    s3, landing_bucket: str
) -> None:
    today = dt.datetime.now(dt.UTC).date()

    def folder(tenant: str, days_ago: int) -> str:
        return today_folder(landing_bucket, tenant, today - dt.timedelta(days=days_ago))

    # Three days back through tomorrow (a producer ahead of UTC) are in the window.
    recent = {folder(t, d): t for t in ("acme", "globex") for d in (-1, 0, 3)}
    for delivery in recent:
        deliver(s3, delivery)
    history = [folder(t, d) for t in ("acme", "globex") for d in (4, 30, 400)]
    put_objects(s3, landing_bucket, {split_folder(f)[1] + "_SUCCESS": b"" for f in history})
    put_objects(s3, landing_bucket, {"acme/fleet/latest/_SUCCESS": b""})

    calls = ListCalls(s3)
    scan = find_ready_folders(s3, landing_bucket, lookback_days=3)
    assert ready_folders(scan) == recent
    assert scan.window == (today - dt.timedelta(days=3), today + dt.timedelta(days=1))
    assert scan.skipped == []  # old folders and `latest` were never seen
    # One LIST of the tenants, then each tenant's five dates entered by name, one LIST each
    # (a date without a folder lists empty); `acme/fleet/` itself is never listed.
    assert calls.count == scan.listings == 1 + 2 * 5

    # More history costs the windowed sweep nothing.
    more = [folder("acme", d) for d in range(31, 91)]
    put_objects(s3, landing_bucket, {split_folder(f)[1] + "_SUCCESS": b"" for f in more})
    calls.count = 0
    assert ready_folders(find_ready_folders(s3, landing_bucket, lookback_days=3)) == recent
    assert calls.count == 1 + 2 * 5

    # Without a window every folder is looked at, still with one LIST each.
    calls.count = 0
    every = find_ready_folders(s3, landing_bucket, lookback_days=0)
    assert every.window is None and ready_folders(every) == recent
    folders = len(recent) + len(history) + len(more)
    assert calls.count == every.listings == 1 + 2 + folders


def test_the_lookback_default_is_a_documented_setting() -> None:
    from fleet_import.config import DEFAULT_SWEEP_LOOKBACK_DAYS, Settings
    from fleet_import.intake.landing import lookback_dates
    from flows.sweep_landing_zone import sweep_landing_zone

    assert Settings.model_fields["sweep_lookback_days"].default == DEFAULT_SWEEP_LOOKBACK_DAYS == 3
    reference = (PREFECT_YAML.parent / "docs" / "configuration.md").read_text()
    assert "`FLEET_SWEEP_LOOKBACK_DAYS` (default 3)" in reference
    assert "FLEET_SWEEP_LOOKBACK_DAYS" in (sweep_landing_zone.fn.__doc__ or "")
    day = dt.date(2026, 7, 22)
    assert lookback_dates(1, day) == [dt.date(2026, 7, d) for d in (21, 22, 23)]
    assert lookback_dates(0, day) is None
    with pytest.raises(InvalidInput, match="cannot be negative"):
        lookback_dates(-1, day)


# -- keys and trigger matching ---------------------------------------------------------------


def test_idempotency_key_is_stable_bounded_and_content_specific() -> None:
    scope = source_scope("s3://fleet-landing/" + "x" * 150 + "/")
    key = idempotency_key(scope, "f" * 64)
    assert key == idempotency_key(scope, "f" * 64)
    assert len(key) <= MAX_KEY_LENGTH
    assert key != idempotency_key(scope, "e" * 64)
    assert key != idempotency_key(source_scope("s3://fleet-landing/y/"), "f" * 64)
    assert key != idempotency_key(scope, "f" * 64, replaces=uuid.uuid4())


def test_marker_event_matches_like_prefect() -> None:
    from prefect.server.events.schemas.events import matches

    pattern = import_trigger()["match"]["prefect.resource.id"]
    cases = [
        "s3://fleet-landing/acme/fleet/2026-07-22/_SUCCESS",
        "s3://fleet-landing/acme/fleet/2026-07-22/trips-1.csv",
        "s3://fleet-landing/_SUCCESS",
        "s3://fleet-landing/acme/fleet/2026-07-22/not_SUCCESS",
        "s3://other-bucket/acme/fleet/2026-07-22/_SUCCESS",
        "S3://fleet-landing/acme/fleet/2026-07-22/_SUCCESS",
    ]
    for resource_id in cases:
        for candidate in (pattern, "!" + pattern, "s3://fleet-landing/acme/*"):
            assert marker_event_matches(resource_id, candidate) == matches(candidate, resource_id)
    assert marker_event_matches(cases[0], pattern)
    assert not marker_event_matches(cases[1], pattern)
    assert not marker_event_matches(None, pattern)
    assert marker_event_matches(cases[1], [pattern, "*.csv"])


def _relay_event(bucket: str, key: str, etag: str, at: dt.datetime):
    """The event the relay emits for one S3 record (its own builder), as the server holds it."""
    from prefect.server.events.schemas.events import Event as ServerEvent

    from fleet_import.intake.landing import DEFAULT_LAYOUT
    from fleet_import.intake.notifications import S3ObjectCreated
    from flows.events import build_s3_object_created

    location = DEFAULT_LAYOUT.locate(bucket, key)
    record = S3ObjectCreated(
        bucket=bucket,
        key=key,
        size=0,
        etag=etag,
        event_name="ObjectCreated:Put",
        tenant_id=location[0] if location else None,
        folder=location[1] if location else None,
        event_time=at,
    )
    client_event = build_s3_object_created(record)
    return ServerEvent(**client_event.model_dump(mode="json")).receive()


def _trigger_parameters(event) -> dict[str, str]:
    """The import parameters the trigger's templates render from this event, rendered by
    the same function the Prefect server uses."""
    from prefect.server.utilities.user_templates import render_user_template

    async def render() -> dict[str, str]:
        return {
            name: await render_user_template(template, {"event": event})
            for name, template in import_trigger()["parameters"].items()
        }

    return asyncio.run(render())


def test_trigger_parameters_render_from_a_relay_event() -> None:
    at = dt.datetime(2026, 7, 22, 10, 0, tzinfo=dt.UTC)
    key = "acme/fleet/2026-07-22/_SUCCESS"
    event = _relay_event("fleet-landing", key, "d41d8cd98f00b204e9800998ecf8427e", at)
    assert resource_matches(event.resource.root, import_trigger()["match"])
    parameters = _trigger_parameters(event)
    assert parameters["tenant_id"] == "acme"
    assert parameters["folder"] == "s3://fleet-landing/acme/fleet/2026-07-22/"
    assert parameters["delivery_key"].startswith(f"s3-event:{event.id}@")
    assert len(parameters["delivery_key"]) <= MAX_KEY_LENGTH
    # A duplicate notification renders the same key; the marker written again does not.
    duplicate = _relay_event("fleet-landing", key, "d41d8cd98f00b204e9800998ecf8427e", at)
    assert _trigger_parameters(duplicate) == parameters
    rewritten = _relay_event(
        "fleet-landing", key, "d41d8cd98f00b204e9800998ecf8427e", at + dt.timedelta(hours=1)
    )
    assert _trigger_parameters(rewritten)["delivery_key"] != parameters["delivery_key"]
    # Files outside a tenant folder carry no tenant label: the trigger ignores them.
    stray = _relay_event("fleet-landing", "tmp/_SUCCESS", "x", at)
    assert not resource_matches(stray.resource.root, import_trigger()["match"])


# -- planning against the operational store --------------------------------------------------


def _plan(s3, bucket: str, database_url: str):
    return plan_sweep(
        find_ready_folders(s3, bucket, completion=Marker()), SweepRepository(database_url)
    )


def test_plan_skips_loaded_or_running_content_and_replans_a_changed_folder(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    deliver(s3, folder)
    plan = _plan(s3, landing_bucket, database_url)
    [planned] = plan.start
    fingerprint = discover(s3, folder, _contracts()).fingerprint
    assert planned.fingerprint == fingerprint
    assert planned.idempotency_key == idempotency_key(source_scope(folder), fingerprint)
    assert planned.parameters == {
        "tenant_id": "acme",
        "folder": folder,
        "delivery_key": planned.idempotency_key,
    }
    assert _plan(s3, landing_bucket, database_url).start == plan.start  # stable across sweeps

    first = run_import(import_ctx, ACME, folder, planned.delivery_key)
    assert isinstance(first, Committed) and first.published
    again = _plan(s3, landing_bucket, database_url)
    assert again.start == []
    assert reasons(again.skip)[folder] == f"already loaded by batch {first.batch_id}"
    assert tenants(again.skip) == {folder: "acme"}
    assert announce_skips(again.skip, Sink()) == 0  # the steady state is not news

    # Files arriving after the load: a new fingerprint, a new key, a new batch.
    bucket, prefix = split_folder(folder)
    put_objects(s3, bucket, {prefix + "trips-3.csv": csv_bytes(trips_table(5, start=900))})
    [changed] = _plan(s3, landing_bucket, database_url).start
    assert changed.fingerprint != fingerprint
    assert changed.idempotency_key != planned.idempotency_key

    # While any batch holds the scope (here: an event's, before it listed the folder).
    held = import_ctx.repo.reserve(ACME, source_scope(folder), "s3-event:held")
    busy = _plan(s3, landing_bucket, database_url)
    assert busy.start == []
    assert reasons(busy.skip)[folder] == f"batch {held.batch.id} is running for this scope"
    import_ctx.repo.mark_failed(held.batch.id, None, "enqueue_failed", "no worker picked it up")

    second = run_import(import_ctx, ACME, folder, changed.delivery_key)
    assert isinstance(second, Committed) and second.batch_id != first.batch_id
    assert _plan(s3, landing_bucket, database_url).start == []

    # Back to the first content: a new delivery, not the first load of it.
    s3.delete_object(Bucket=bucket, Key=prefix + "trips-3.csv")
    [reverted] = _plan(s3, landing_bucket, database_url).start
    assert reverted.fingerprint == fingerprint
    assert reverted.idempotency_key != planned.idempotency_key
    third = run_import(import_ctx, ACME, folder, reverted.delivery_key)
    assert isinstance(third, Committed) and third.batch_id not in (first.batch_id, second.batch_id)


def test_a_contract_changed_since_the_last_success_makes_its_folder_due_again(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str, monkeypatch
) -> None:
    """The sweep and the import share one DeliveryIdentity: the same files read with a
    changed contract are new content for both, and loaded once with it, not due again."""
    from fleet_import.contracts.model import ContractSet

    folder = today_folder(landing_bucket, "acme")
    deliver(s3, folder)
    [planned] = _plan(s3, landing_bucket, database_url).start
    first = run_import(import_ctx, ACME, folder, planned.delivery_key)
    assert isinstance(first, Committed) and first.published
    assert _plan(s3, landing_bucket, database_url).start == []

    contracts = _contracts()
    changed_name = sorted(contracts)[0]
    changed = ContractSet(
        [
            contracts[name].model_copy(
                update={"max_reject_ratio": 0.4 if contracts[name].max_reject_ratio == 0.5 else 0.5}
            )
            if name == changed_name
            else contracts[name]
            for name in contracts
        ]
    )
    assert changed[changed_name].contract_version != contracts[changed_name].contract_version

    def plan_with_changed_contracts():
        found = find_ready_folders(s3, landing_bucket, completion=Marker(), contracts=changed)
        return plan_sweep(found, SweepRepository(database_url))

    [due] = plan_with_changed_contracts().start
    assert due.folder == folder and due.fingerprint == planned.fingerprint  # the same files
    assert due.idempotency_key != planned.idempotency_key
    monkeypatch.setattr(import_ctx, "contracts", changed)
    second = run_import(import_ctx, ACME, folder, due.delivery_key)
    assert isinstance(second, Committed) and second.batch_id != first.batch_id
    assert plan_with_changed_contracts().start == []


def test_plan_leaves_failed_content_to_a_manual_rerun(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=40, fuel=10, vehicles=5)
    files["trips-1.csv"] = files["trips-1.csv"].replace(b"completed", b"exploded")
    upload(s3, folder, {**files, "_SUCCESS": b""})
    [planned] = _plan(s3, landing_bucket, database_url).start
    failed = run_import(import_ctx, ACME, folder, planned.delivery_key)
    assert isinstance(failed, Failed), failed
    plan = _plan(s3, landing_bucket, database_url)
    assert plan.start == []
    assert "failed (failed_pre_commit) on this content" in reasons(plan.skip)[folder]
    sink = Sink()
    assert announce_skips(plan.skip, sink) == 1
    [(name, payload)] = sink.events
    assert name == "fleet.delivery.skipped"
    assert payload == {
        "source": "sweep",
        "tenant_id": "acme",
        "folder": folder,
        "kind": "failed",
        "reason": reasons(plan.skip)[folder],
    }


# -- sweep and event racing on one delivery --------------------------------------------------


def _own_context(ctx: ImportContext, database_url: str, workdir: Path) -> ImportContext:
    """The same services through separate connections, as another worker would have."""
    return dataclasses.replace(
        ctx,
        repo=BatchRepository(database_url),
        warehouse=PostgresWarehouse(database_url),
        workdir=workdir,
    )


def _scope_batches(repo: BatchRepository, folder: str) -> list:
    return [
        b for b in repo.list(tenant="acme", limit=100) if b.source_scope == source_scope(folder)
    ]


@pytest.mark.parametrize("winner", ["event", "sweep"])
def test_sweep_and_event_racing_on_one_delivery_make_one_batch(
    winner: str,
    import_ctx: ImportContext,
    s3,
    landing_bucket: str,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = today_folder(landing_bucket, "acme")
    deliver(s3, folder)
    [planned] = _plan(s3, landing_bucket, database_url).start
    marker = _relay_event(
        landing_bucket, split_folder(folder)[1] + "_SUCCESS", "etag", dt.datetime.now(dt.UTC)
    )
    keys = {"sweep": planned.delivery_key, "event": _trigger_parameters(marker)["delivery_key"]}
    loser = "sweep" if winner == "event" else "event"

    # The winner holds the scope right after its reservation until we let it go.
    release = tmp_path / "release"
    monkeypatch.setattr(failpoints, "_ACTIVE", {"after_reserve": f"wait:{release}"})
    winner_ctx = _own_context(import_ctx, database_url, tmp_path / "winner")
    loser_ctx = _own_context(import_ctx, database_url, tmp_path / "loser")
    with ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(run_import, winner_ctx, ACME, folder, keys[winner])
        deadline = time.monotonic() + 30
        while not import_ctx.repo.list(tenant="acme", status=BatchStatus.RUNNING):
            assert time.monotonic() < deadline, "the winner never reserved"
            time.sleep(0.02)
        second = run_import(loser_ctx, ACME, folder, keys[loser])
        assert isinstance(second, Skipped), second
        held = _plan(s3, landing_bucket, database_url)
        assert held.start == [] and "is running for this scope" in reasons(held.skip)[folder]
        release.touch()
        outcome = first.result(timeout=120)
    assert isinstance(outcome, Committed) and outcome.published, outcome
    [batch] = _scope_batches(import_ctx.repo, folder)
    assert batch.id == outcome.batch_id and batch.delivery_key == keys[winner]
    after = _plan(s3, landing_bucket, database_url)
    assert after.start == [] and "already loaded" in reasons(after.skip)[folder]


# -- a burst of objects with duplicated notifications ----------------------------------------


def test_burst_of_200_objects_with_duplicate_events_makes_one_batch(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    bucket, prefix = split_folder(folder)
    files = fleet_delivery(trips=20, fuel=10, vehicles=5)
    files.update(
        {f"trips-{n:03d}.csv": csv_bytes(trips_table(2, start=1000 + 2 * n)) for n in range(196)}
    )
    files["_SUCCESS"] = b""
    assert len(files) == 201
    upload(s3, folder, files)

    # Every object is announced twice (S3 at least once, SQS redelivery), all at once.
    at = dt.datetime.now(dt.UTC)
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1000)["Contents"]
    events = [_relay_event(bucket, o["Key"], o["ETag"].strip('"'), at) for o in listed] * 2
    assert len(events) == 402
    match = trigger_match(bucket)
    fired = [e for e in events if resource_matches(e.resource.root, match)]
    assert len(fired) == 2 and {e.resource.id for e in fired} == {f"{folder}_SUCCESS"}

    # Whatever the debounce lets through, each fired event starts an import with its key,
    # concurrently with the sweep's own: one commits; a duplicate finds the batch running
    # (NotClaimed) or done (NothingToDo), another delivery finds the scope busy (Skipped).
    deliveries = [_trigger_parameters(e) for e in fired]
    [planned] = _plan(s3, landing_bucket, database_url).start
    deliveries.append(planned.parameters)
    with ThreadPoolExecutor(max_workers=len(deliveries)) as pool:
        outcomes = list(
            pool.map(
                lambda p: run_import(
                    import_ctx, Tenant.named(p["tenant_id"]), p["folder"], p["delivery_key"]
                ),
                deliveries,
            )
        )
    committed = [o for o in outcomes if isinstance(o, Committed)]
    assert len(committed) == 1, outcomes
    assert all(isinstance(o, Committed | Skipped | NothingToDo | NotClaimed) for o in outcomes), (
        outcomes
    )
    [batch] = _scope_batches(import_ctx.repo, folder)
    assert batch.status == BatchStatus.SUCCEEDED
    assert len(batch.details["manifest"]["objects"]) == 200  # the marker is no data file
    assert _plan(s3, landing_bucket, database_url).start == []


# -- the flow under Prefect's test harness ---------------------------------------------------


@pytest.mark.slow
def test_overlapping_sweeps_start_one_run_per_delivery(
    flow_env: str, s3, landing_bucket: str
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
        DeploymentFilter,
        DeploymentFilterId,
    )

    from flows.import_s3_folder import import_s3_folder
    from flows.sweep_landing_zone import sweep_landing_zone

    name = f"import-{uuid.uuid4().hex[:8]}"
    deployment_id = import_s3_folder.to_deployment(name=name).apply()
    acme = today_folder(landing_bucket, "acme")
    globex = today_folder(landing_bucket, "globex")
    deliver(s3, acme)
    deliver(s3, globex)
    unmarked = today_folder(landing_bucket, "acme", dt.date(2026, 7, 23))
    deliver(s3, unmarked, marker=False)

    # These folders are dated July 2026: no window, every folder.
    parameters = {
        "bucket": landing_bucket,
        "deployment": f"import-s3-folder/{name}",
        "lookback_days": 0,
    }
    # No worker runs the imports, so the second sweep finds the same folders unloaded, as
    # a sweep overlapping a slow one (or an event's run) would.
    with ThreadPoolExecutor(max_workers=2) as pool:
        states = list(
            pool.map(lambda _: sweep_landing_zone(**parameters, return_state=True), range(2))
        )
    for state in states:
        assert state.is_completed(), state.message
        assert state.result() == {"ready": 2, "started": 2, "skipped": 1}

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
        )
        [artifact] = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["sweep-plan"]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[states[0].state_details.flow_run_id]),
            )
        )
    assert sorted(r.parameters["folder"] for r in runs) == sorted([acme, globex])
    for run in runs:
        assert run.idempotency_key == run.parameters["delivery_key"]
        assert run.idempotency_key.startswith("sweep:")
        assert run.parent_task_run_id is None  # not a subflow: outlives the sweep
        assert f"tenant:{run.parameters['tenant_id']}" in run.tags
    # The plan names the tenant of every row, skips included, and how long the sweep took.
    rows = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
    assert {(r["action"], r["folder"], r["tenant"]) for r in rows} == {
        ("start", acme, "acme"),
        ("start", globex, "globex"),
        ("skip", unmarked, "acme"),
    }
    assert "every folder" in artifact.description and " listings in " in artifact.description
    # Each sweep's skip is an event an operator finds by tenant, folder or name.
    skipped = _read_events("fleet.delivery.skipped", f"fleet.delivery.{unmarked}", count=2)
    for event in skipped:
        assert event.resource["fleet.tenant"] == "acme"
        assert event.resource["fleet.folder"] == unmarked
        assert event.payload["kind"] == "incomplete"
        assert "waiting for its _SUCCESS marker" in event.payload["reason"]


def _read_events(name: str, resource_id: str, count: int) -> list[Any]:
    """The events of this name on this resource, once `count` of them are stored (events
    are persisted asynchronously after they were sent)."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import (
        EventFilter,
        EventNameFilter,
        EventOccurredFilter,
        EventResourceFilter,
    )

    now = dt.datetime.now(dt.UTC)
    query = EventFilter(
        event=EventNameFilter(name=[name]),
        resource=EventResourceFilter(id=[resource_id]),
        occurred=EventOccurredFilter(
            since=now - dt.timedelta(hours=1), until=now + dt.timedelta(hours=1)
        ),
    )
    deadline = time.monotonic() + 30
    with get_client(sync_client=True) as client:
        while True:
            events = client.read_events(query, limit=50).events
            if len(events) >= count:
                return events
            assert time.monotonic() < deadline, f"{len(events)} of {count} {name} events stored"
            time.sleep(0.25)


def test_a_sweep_of_a_missing_bucket_fails_with_its_reason_and_no_traceback(
    flow_env: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A configuration mistake is not a crash: the run ends Failed saying which bucket,
    and nothing logs a traceback (an operator would read it as a bug in fleet-import)."""
    import logging

    from flows.sweep_landing_zone import sweep_landing_zone

    bucket = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.INFO):
        state = sweep_landing_zone(bucket=bucket, lookback_days=0, return_state=True)
    assert state.is_failed(), state
    assert f"sweep of s3://{bucket}/ failed" in state.message, state.message
    assert bucket in state.message.split("failed: ", 1)[1], state.message
    tracebacks = [record for record in caplog.records if record.exc_info]
    assert not tracebacks, [record.getMessage() for record in tracebacks]
