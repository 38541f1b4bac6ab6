"""OpenLineage through the flows (issue #29), in Prefect's test harness: an import whose
lineage endpoint is down succeeds with its events pending; the drain-publications flow
delivers them once the endpoint is back, each once."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.store.lineage_outbox import LineageOutbox
from fleet_import.store.models import BatchStatus
from fleet_import.store.repository import BatchRepository
from flows.drain_publications import drain_publications
from flows.import_s3_folder import import_s3_folder
from tests.helpers import upload
from tests.lineage_receiver import VALIDATOR, Receiver

EVENTS = 6  # START and COMPLETE of vehicles, trips and fuel_transactions


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    if server.running:
        server.stop()


def test_the_drain_delivers_what_the_import_could_not(
    flow_env: str, monkeypatch, s3, landing_bucket: str, receiver: Receiver
) -> None:
    monkeypatch.setenv("FLEET_OPENLINEAGE", receiver.url)
    receiver.stop()
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=30, fuel=6, vehicles=4))
    state = import_s3_folder(tenant_id="acme", folder=folder, return_state=True)
    assert state.is_completed() and "succeeded" in state.message, state.message
    (batch,) = BatchRepository(flow_env).list()
    assert batch.status == BatchStatus.SUCCEEDED
    pending = LineageOutbox(flow_env).of_batch(batch.id)
    assert len(pending) == EVENTS and {row.status for row in pending} == {"pending"}

    tried = [row for row in pending if row.attempts]  # the run stopped at the first refusal
    untried = [row.available_at for row in pending if not row.attempts]
    assert len(tried) == 1 and tried[0].available_at > max(untried)  # waiting out a backoff

    receiver.start()
    with psycopg.connect(flow_env) as conn:  # its backoff (5 s) has run out
        conn.execute("UPDATE lineage_outbox SET available_at = now()")
    assert drain_publications(limit=10)["LineageDelivered"] == EVENTS
    assert drain_publications(limit=10)["LineageDelivered"] == 0
    assert len(receiver.events) == EVENTS
    assert not [e for event in receiver.events for e in VALIDATOR.iter_errors(event)]
    runs = {(e["run"]["runId"], e["eventType"]) for e in receiver.events}
    assert len(runs) == EVENTS
    delivered = LineageOutbox(flow_env).of_batch(batch.id)
    assert {row.status for row in delivered} == {"delivered"}
