"""A real Prometheus (Debian's package) scrapes a real `fleet-import metrics serve` over a
real store holding a held batch and a running batch whose lease expired, with the shipped
alert rules loaded: the series arrive as the store says, the expired lease's alert is
evaluated (pending: its `for` is minutes), and every panel of the Grafana dashboard is a
query Prometheus answers, on series the endpoint serves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleet_import.scope import Tenant
from tests.monitoring.prometheus_tools import (
    dashboard_exprs,
    get_json,
    prometheus_stack,
    wait_for,
)
from tests.monitoring.test_collector import _held, _leased

pytestmark = pytest.mark.e2e


def test_prometheus_scrapes_the_endpoint_and_evaluates_the_rules(
    repo, database_url: str, tmp_path: Path
) -> None:
    acme = Tenant.named("acme")
    _held(repo, acme, "2026-07-20")
    _leased(repo, acme, "2026-07-19", "frozen", ttl=0.1)
    with prometheus_stack(database_url, tmp_path, ["acme"]) as stack:
        [held] = wait_for(
            "the held batch", lambda: stack.query("fleet_import_held_batches"), stack.logs
        )
        assert held["metric"]["tenant"] == "acme" and held["value"][1] == "1"
        assert held["metric"]["job"] == "fleet-import"

        def expired_lease_alert() -> list[dict]:
            alerts = get_json(f"{stack.api}/alerts")["data"]["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "FleetImportExpiredLease"]

        [alert] = wait_for("the expired lease's alert", expired_lease_alert, stack.logs)
        assert alert["state"] == "pending" and alert["labels"]["tenant"] == "acme"

        # Families the endpoint describes (# HELP/# TYPE), samples or not.
        families = set(get_json(f"{stack.api}/metadata")["data"])
        for expr in dashboard_exprs():
            stack.query(expr)  # a panel Prometheus cannot evaluate fails here
            for name in re.findall(r"\bfleet_import_\w+", expr):
                family = re.sub(r"_(bucket|count|sum|total)$", "", name)
                assert family in families, (
                    f"the dashboard reads {name}, which the endpoint does not serve"
                )
