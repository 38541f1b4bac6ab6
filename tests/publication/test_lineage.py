"""OpenLineage per slice (issue #29): events received over HTTP by a local receiver and
validated against the spec's rules (tests.lineage_receiver: the client wheel ships no JSON
schema file), the batch's success independent of the endpoint, and pending events
delivered once each."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from rich.console import Console

from fleet_cli.batch_views import batch_detail_record, batch_views
from fleet_import.checks.settings import SettingsInvalid, Uses, check_settings
from fleet_import.config import Settings
from fleet_import.importing.context import Committed, Failed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.publication.lineage import job_name, lineage_run_id
from fleet_import.publication.lineage_delivery import (
    Lineage,
    LineageDelivery,
    LineageNaming,
    transport_emit,
)
from fleet_import.retry import Backoff
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant, source_scope, split_folder
from fleet_import.store.details import FailureKind
from fleet_import.store.lineage_outbox import LineageOutbox
from fleet_import.store.models import BatchStatus
from tests.helpers import upload
from tests.lineage_receiver import VALIDATOR, Receiver

ACME = Tenant.named("acme")
DATASETS = ("fuel_transactions", "trips", "vehicles")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    if server.running:
        server.stop()


@pytest.fixture
def lineage_ctx(publishing_ctx: ImportContext, database_url: str, receiver: Receiver):
    """publishing_ctx with OpenLineage sent to the receiver, retried with no backoff."""
    delivery = LineageDelivery(
        LineageOutbox(database_url), transport_emit(receiver.url), backoff=Backoff((0.0,))
    )
    naming = LineageNaming("fleet-import", "postgres://127.0.0.1:5432", "warehouse")
    publishing_ctx.lineage = Lineage(naming, delivery)
    return publishing_ctx


def _etags(s3, folder: str) -> dict[str, str]:
    bucket, prefix = split_folder(folder)
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
    return {item["Key"]: item["ETag"].strip('"') for item in listed}


def test_each_slice_is_a_run_whose_events_name_its_objects_and_counts(
    lineage_ctx: ImportContext, s3, landing_bucket: str, receiver: Receiver
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=300, fuel=120, vehicles=25, bad_rows=True))
    outcome = import_folder(lineage_ctx, ACME, folder, "delivery-1")
    assert isinstance(outcome, Committed) and outcome.published, outcome

    events = receiver.events
    assert len(events) == 2 * len(DATASETS)
    for event in events:
        errors = sorted(VALIDATOR.iter_errors(event), key=str)
        assert not errors, [e.message for e in errors]
    runs: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        runs.setdefault(event["job"]["name"], []).append(event)
    assert sorted(runs) == sorted(job_name("acme", d) for d in DATASETS)

    etags = _etags(s3, folder)
    for dataset in DATASETS:
        start, complete = runs[job_name("acme", dataset)]
        assert [start["eventType"], complete["eventType"]] == ["START", "COMPLETE"]
        run_id = str(lineage_run_id(outcome.batch_id, dataset))
        assert start["run"]["runId"] == complete["run"]["runId"] == run_id
        assert start["eventTime"] <= complete["eventTime"]
        inputs = complete["inputs"]
        assert inputs and all(i["namespace"] == f"s3://{landing_bucket}" for i in inputs)
        for item in inputs:  # each input pinned to the content that was loaded
            assert item["facets"]["version"]["datasetVersion"] == etags[item["name"]]
            assert item["facets"]["fleetImportObject"]["etag"] == etags[item["name"]]
        (output,) = complete["outputs"]
        contract = lineage_ctx.contracts[dataset]
        assert output["name"] == f"warehouse.{contract.target_table}"
        rows = output["outputFacets"]["outputStatistics"]["rowCount"]
        assert rows == outcome.row_counts[dataset]
        slice_facet = output["facets"]["fleetImportSlice"]
        assert slice_facet["tenant"] == "acme"
        assert slice_facet["scope"] == source_scope(folder)
        assert slice_facet["batch"] == str(outcome.batch_id)
        schema = [f["name"] for f in output["facets"]["schema"]["fields"]]
        assert schema == [c.name for c in contract.columns]
    keys = {i["name"] for r in runs.values() for e in r for i in e["inputs"]}
    assert keys == set(etags)
    trips = runs[job_name("acme", "trips")][1]["outputs"][0]["facets"]["fleetImportSlice"]
    assert trips["rejectCount"] == 3  # the three bad rows of trips-1.csv
    fuel = runs[job_name("acme", "fuel_transactions")][1]["outputs"][0]["facets"]
    assert fuel["fleetImportSlice"]["rejectCount"] == 0


def test_a_lineage_endpoint_down_leaves_the_batch_succeeded_and_its_events_pending(
    lineage_ctx: ImportContext, s3, landing_bucket: str, receiver: Receiver, database_url: str
) -> None:
    receiver.stop()
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=40, fuel=10, vehicles=5))
    outcome = import_folder(lineage_ctx, ACME, folder, "delivery-1")
    assert isinstance(outcome, Committed) and outcome.published, outcome
    batch = lineage_ctx.repo.get(outcome.batch_id)
    assert batch.status == BatchStatus.SUCCEEDED

    shown = batch_detail_record(batch, [], LineageOutbox(database_url).of_batch(outcome.batch_id))[
        "lineage"
    ]
    assert len(shown) == 2 * len(DATASETS)
    assert {e["status"] for e in shown} == {"pending"}
    tried = [e for e in shown if e["attempts"]]  # the run stopped at the first refusal
    assert len(tried) == 1 and "ConnectionError" in tried[0]["last_error"]
    assert tried[0]["event_type"] == "START"
    console = Console(record=True, width=200)
    for view in batch_views(batch, [], LineageOutbox(database_url).of_batch(batch.id)):
        console.print(view)
    text = console.export_text()
    assert "lineage" in text and "fleet-import.acme.trips" in text
    assert text.count("pending") == 2 * len(DATASETS) and "ConnectionError" in text

    receiver.start()  # back, on the same port
    delivery = lineage_ctx.lineage.delivery
    assert delivery.deliver("drain").sent == 2 * len(DATASETS)
    assert delivery.deliver("drain").sent == 0  # a second drain finds nothing to send
    keys = [(e["run"]["runId"], e["eventType"], e["eventTime"]) for e in receiver.events]
    assert len(keys) == len(set(keys)) == 2 * len(DATASETS)
    for run_id in {k[0] for k in keys}:  # each run's START reached the receiver first
        types = [e["eventType"] for e in receiver.events if e["run"]["runId"] == run_id]
        assert types == ["START", "COMPLETE"]
    rows = LineageOutbox(database_url).of_batch(outcome.batch_id)
    assert {r.status for r in rows} == {"delivered"}


def test_a_forced_reload_is_a_new_run_and_the_first_keeps_its_events(
    lineage_ctx: ImportContext, s3, landing_bucket: str, receiver: Receiver
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=20, fuel=4, vehicles=3))
    first = import_folder(lineage_ctx, ACME, folder, "d1")
    again = import_folder(lineage_ctx, ACME, folder, "d2", force=True)
    assert isinstance(again, Committed) and again.batch_id != first.batch_id
    run_ids = {e["run"]["runId"] for e in receiver.events}
    expected = {
        str(lineage_run_id(b, d)) for b in (first.batch_id, again.batch_id) for d in DATASETS
    }
    assert run_ids == expected and len(receiver.events) == 4 * len(DATASETS)


def test_the_file_transport_appends_one_event_a_line(
    publishing_ctx: ImportContext, s3, landing_bucket: str, database_url: str, tmp_path
) -> None:
    path = tmp_path / "lineage" / "events.jsonl"
    path.parent.mkdir()
    delivery = LineageDelivery(LineageOutbox(database_url), transport_emit(f"file://{path}"))
    naming = LineageNaming("fleet-import", "postgres://127.0.0.1:5432", "warehouse")
    publishing_ctx.lineage = Lineage(naming, delivery)
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=10, fuel=2, vehicles=2))
    outcome = import_folder(publishing_ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed) and outcome.published
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2 * len(DATASETS)
    assert not [e for line in lines for e in VALIDATOR.iter_errors(line)]


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("http://marquez:5000", True),
        ("https://lineage.example.com/base", True),
        ("file:///var/log/fleet/lineage.jsonl", True),
        ("marquez:5000", False),
        ("file://relative/path.jsonl", False),
        ("kafka://broker:9092", False),
    ],
)
def test_the_openlineage_setting_is_checked(value: str, ok: bool) -> None:
    settings = Settings(database_url="postgresql://u@h:5432/d", openlineage=value)
    if ok:
        check_settings({Uses.WAREHOUSE}, settings=settings, env={})
        return
    with pytest.raises(SettingsInvalid) as raised:
        check_settings({Uses.WAREHOUSE}, settings=settings, env={})
    assert [p.variable for p in raised.value.problems] == ["FLEET_OPENLINEAGE"]
    assert value not in str(raised.value)  # values are never echoed


def test_lineage_run_ids_are_derived_from_the_batch() -> None:
    batch = uuid.UUID("01890000-0000-7000-8000-000000000001")
    assert lineage_run_id(batch, "trips") == lineage_run_id(uuid.UUID(str(batch)), "trips")
    assert lineage_run_id(batch, "trips") != lineage_run_id(batch, "vehicles")


def test_a_slice_rolled_back_in_the_warehouse_is_a_failed_run(
    lineage_ctx: ImportContext, s3, landing_bucket: str, receiver: Receiver
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=6, fuel=4, vehicles=3, bad_rows=True))
    outcome = import_folder(lineage_ctx, ACME, folder, "d1")
    assert isinstance(outcome, Failed) and outcome.kind == FailureKind.FAILED_PRE_COMMIT
    assert "reject" in outcome.error
    events = receiver.events
    assert not [e for event in events for e in VALIDATOR.iter_errors(event)]
    assert sorted((e["job"]["name"], e["eventType"]) for e in events) == sorted(
        (job_name("acme", d), t) for d in DATASETS for t in ("START", "FAIL")
    )
    for fail in (e for e in events if e["eventType"] == "FAIL"):
        assert fail["run"]["facets"]["errorMessage"]["message"] == outcome.error
        (output,) = fail["outputs"]
        assert "outputStatistics" not in output.get("outputFacets", {})  # nothing committed


def test_a_batch_that_never_reached_the_warehouse_tells_no_lineage(
    lineage_ctx: ImportContext, s3, landing_bucket: str, receiver: Receiver, database_url: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, {"trips-1.csv": b"not,a,trips,header\n1,2,3,4\n"})
    outcome = import_folder(lineage_ctx, ACME, folder, "d1")
    assert isinstance(outcome, Failed), outcome
    assert receiver.events == []
    assert LineageOutbox(database_url).of_batch(outcome.batch_id) == []


def test_drains_racing_send_each_event_once_and_every_start_before_its_complete(
    lineage_ctx: ImportContext, s3, landing_bucket: str, receiver: Receiver
) -> None:
    receiver.stop()
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=20, fuel=4, vehicles=3))
    assert isinstance(import_folder(lineage_ctx, ACME, folder, "d1"), Committed)
    receiver.start()
    delivery = lineage_ctx.lineage.delivery
    barrier = threading.Barrier(4)
    sent: list[int] = []

    def drain(worker: str) -> None:
        barrier.wait()
        sent.append(delivery.deliver(worker).sent)

    threads = [threading.Thread(target=drain, args=(f"drain-{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    keys = [(e["run"]["runId"], e["eventType"]) for e in receiver.events]
    assert sum(sent) == len(keys) == len(set(keys)) == 2 * len(DATASETS)
    for run_id in {k[0] for k in keys}:
        assert [t for r, t in keys if r == run_id] == ["START", "COMPLETE"]
