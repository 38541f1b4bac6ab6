"""The check-freshness flow under Prefect's test harness, with a controlled clock: one
fleet.tenant.late event for a missing delivery, none on the next run, one
fleet.tenant.fresh-again once its import succeeded, each on the tenant's freshness resource
and readable back from the API; the verdicts as a table artifact."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import pytest

from fleet_import.importing.context import Committed
from fleet_import.importing.driver import import_folder
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant
from tests.helpers import started_at, upload

DAY = dt.date(2026, 7, 22)
AFTER_DUE = dt.datetime(2026, 7, 22, 4, 30, tzinfo=dt.UTC)  # 06:30 in Berlin
RESOURCE = "fleet.freshness.acme.*"


@pytest.fixture
def freshness_env(flow_env: str, monkeypatch, tmp_path: Path, landing_bucket: str) -> str:
    slos = tmp_path / "freshness.yaml"
    slos.write_text(f"landing: {{bucket: {landing_bucket}}}\n")
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        "tenants:\n  acme:\n    overrides:\n      freshness: daily by 06:00 Europe/Berlin\n"
    )
    monkeypatch.setenv("FLEET_FRESHNESS", str(slos))
    monkeypatch.setenv("FLEET_TENANTS", str(tenants))
    return flow_env


@pytest.mark.slow
def test_late_is_told_once_and_fresh_again_after_the_import(
    freshness_env: str, import_ctx, s3, landing_bucket: str, database_url: str
) -> None:
    from flows.check_freshness import check_freshness

    first = check_freshness(now=AFTER_DUE, return_state=True)
    assert first.is_completed(), first.message
    assert first.result() == {"checked": 1, "late": 1, "told": 1}
    assert check_freshness(now=AFTER_DUE + dt.timedelta(minutes=5)) == {
        "checked": 1,
        "late": 1,
        "told": 0,
    }
    folder = today_folder(landing_bucket, "acme", DAY)
    upload(s3, folder, fleet_delivery(trips=20, fuel=5, vehicles=3) | {"_SUCCESS": b""})
    loaded = import_folder(import_ctx, Tenant.named("acme"), folder, "k")
    assert isinstance(loaded, Committed)
    started_at(database_url, loaded.batch_id, AFTER_DUE + dt.timedelta(minutes=7))
    again = check_freshness(now=AFTER_DUE + dt.timedelta(minutes=10), return_state=True)
    assert again.result() == {"checked": 1, "late": 0, "told": 1}

    [late] = _read_events("fleet.tenant.late", 1)
    assert late.resource.id == "fleet.freshness.acme.*"
    assert late.resource["fleet.tenant"] == "acme" and late.resource["fleet.dataset"] == "*"
    assert late.payload["expected_at"] == "2026-07-22T04:00:00+00:00"
    assert late.payload["state"] == "missing"
    assert late.payload["found"] == f"no folder dated 2026-07-22 in s3://{landing_bucket}/"
    [fresh] = _read_events("fleet.tenant.fresh-again", 1)
    assert fresh.payload["tenant_id"] == "acme" and fresh.payload["found"] == "loaded"
    rows = _artifact_rows(again.state_details.flow_run_id)
    assert [(r["tenant"], r["dataset"], r["state"]) for r in rows] == [("acme", "*", "fresh")]


def test_a_broken_freshness_file_fails_the_run_with_its_field(
    flow_env: str, monkeypatch, tmp_path: Path
) -> None:
    slos = tmp_path / "freshness.yaml"
    slos.write_text("default: daily at 6\n")
    monkeypatch.setenv("FLEET_FRESHNESS", str(slos))
    from flows.check_freshness import check_freshness

    state = check_freshness(return_state=True)
    assert state.is_failed()
    assert "FLEET_FRESHNESS" in state.message and "default: 'daily at 6'" in state.message


def _read_events(name: str, count: int) -> list[Any]:
    """This test's events of `name` once `count` are stored (they arrive asynchronously)."""
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
        resource=EventResourceFilter(id_prefix=["fleet.freshness.acme."]),
        occurred=EventOccurredFilter(since=now - dt.timedelta(minutes=10), until=now),
    )
    deadline = time.monotonic() + 30
    with get_client(sync_client=True) as client:
        while True:
            events = client.read_events(query, limit=50).events
            if len(events) >= count:
                time.sleep(1)  # and no more than that
                return client.read_events(query, limit=50).events
            assert time.monotonic() < deadline, f"{len(events)} of {count} {name} events stored"
            time.sleep(0.25)


def _artifact_rows(flow_run_id) -> list[dict[str, Any]]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
    )

    with get_client(sync_client=True) as client:
        [artifact] = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["freshness"]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
            )
        )
    return json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
