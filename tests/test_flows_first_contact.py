"""Under every flow, a foreseen error ends the run Failed with its one line and the next
step (flows/reporting.py `fails_with_one_line`), never Prefect's "Flow run encountered an
exception": here, an operational database that does not answer."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

import pytest

import flows
from fleet_import.sample_data import fleet_delivery, today_folder
from tests.cli.run_cli import FOLDER, SECRET, closed_port_url
from tests.helpers import upload

BATCH = "00000000-0000-0000-0000-000000000001"
NEXT_STEP = "check FLEET_DATABASE_URL (host:port) and that the server runs"


def test_every_flow_fails_with_one_line() -> None:
    from prefect import Flow

    found = {}
    for module_info in pkgutil.iter_modules(flows.__path__):
        module = importlib.import_module(f"flows.{module_info.name}")
        for value in vars(module).values():
            if isinstance(value, Flow) and value.fn.__module__ == module.__name__:
                found[value.name] = getattr(value.fn, "fails_with_one_line", False)
    assert len(found) >= 6, found
    assert all(found.values()), found


def _drain(**_: Any):
    from flows.drain_publications import drain_publications

    return drain_publications(return_state=True)


def _approve(**_: Any):
    from flows.approve_held_batch import approve_held_batch

    return approve_held_batch(batch_id=BATCH, return_state=True)


def _rollback(**_: Any):
    from flows.rollback_slice import rollback_slice

    return rollback_slice(tenant_id="acme", folder=FOLDER, return_state=True)


def _sweep(*, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """A ready folder, so that the sweep asks the database (which it retries, without the
    waits here, as a transient error)."""
    from flows import sweep_landing_zone as module

    s3 = request.getfixturevalue("s3")
    bucket = request.getfixturevalue("landing_bucket")
    monkeypatch.setenv("FLEET_S3_ENDPOINT_URL", request.getfixturevalue("moto_endpoint"))
    monkeypatch.setattr(module.plan_sweep, "retry_delay_seconds", [0.0] * 3)
    upload(s3, today_folder(bucket, "acme"), {**fleet_delivery(trips=5), "_SUCCESS": b""})
    return module.sweep_landing_zone(bucket=bucket, lookback_days=0, return_state=True)


FLOWS: dict[str, Callable[..., Any]] = {
    "drain-publications": _drain,
    "approve-held-batch": _approve,
    "rollback-slice": _rollback,
    "sweep-landing-zone": _sweep,
}


@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize("name", FLOWS)
def test_an_unreachable_database_ends_the_run_failed_with_one_line(
    name: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # The warehouse answers (the test's own database): only the operational one is down.
    request.getfixturevalue("warehouse")  # its curated tables and registry
    monkeypatch.setenv("FLEET_WAREHOUSE_URL", request.getfixturevalue("database_url"))
    monkeypatch.setenv("FLEET_DATABASE_URL", closed_port_url())
    monkeypatch.setenv("FLEET_STAGING_URI", "s3://fleet-staging/stage/")
    state = FLOWS[name](request=request, monkeypatch=monkeypatch)
    assert state.is_failed(), state
    assert "encountered an exception" not in state.message, state.message
    assert "\n" not in state.message
    assert state.message.startswith("operational database error"), state.message
    assert state.message.endswith(NEXT_STEP), state.message
    assert SECRET not in state.message
