"""A real Prometheus (Debian's package) scrapes a real `fleet-import metrics serve` over a
real store holding a held batch and a running batch whose lease expired, with the shipped
alert rules loaded: the series arrive as the store says, and the expired lease's alert is
evaluated (pending: its `for` is minutes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fleet_import.scope import Tenant
from tests.monitoring.prometheus_tools import executable
from tests.monitoring.test_alert_rules import RULES
from tests.monitoring.test_collector import _held, _leased
from tests.prefect_server import free_port

pytestmark = pytest.mark.e2e

_WAIT_SECONDS = 90.0
_POLL_SECONDS = 0.5


@contextmanager
def running(args: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[None]:
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def wait_for(what: str, probe, logs: list[Path]):
    deadline = time.monotonic() + _WAIT_SECONDS
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = probe()
            if last:
                return last
        except OSError as exc:
            last = exc
        time.sleep(_POLL_SECONDS)
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs)
    pytest.fail(f"{what} not seen in {_WAIT_SECONDS:g} s (last: {last!r})\n{tails}")


def test_prometheus_scrapes_the_endpoint_and_evaluates_the_rules(
    repo, database_url: str, tmp_path: Path
) -> None:
    prometheus = executable("prometheus")
    acme = Tenant.named("acme")
    _held(repo, acme, "2026-07-20")
    _leased(repo, acme, "2026-07-19", "frozen", ttl=0.1)
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text("tenants:\n  acme: {}\n")

    metrics_port, prometheus_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{json.dumps(str(RULES))}]\n"
        "scrape_configs:\n"
        "  - job_name: fleet-import\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n"
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "PREFECT_"))},
        "FLEET_DATABASE_URL": database_url,
        "FLEET_TENANTS": str(tenants),
    }
    serve_log, prometheus_log = tmp_path / "serve.log", tmp_path / "prometheus.log"
    logs = [serve_log, prometheus_log]
    serve = [sys.executable, "-m", "fleet_cli", "metrics", "serve", "--addr", "127.0.0.1",
             "--port", str(metrics_port)]
    server = [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
              f"--web.listen-address=127.0.0.1:{prometheus_port}"]
    api = f"http://127.0.0.1:{prometheus_port}/api/v1"
    with running(serve, serve_log, env), running(server, prometheus_log):

        def query(expr: str) -> list[dict]:
            found = get_json(f"{api}/query?{urllib.parse.urlencode({'query': expr})}")
            return found["data"]["result"]

        [held] = wait_for("the held batch", lambda: query("fleet_import_held_batches"), logs)
        assert held["metric"]["tenant"] == "acme" and held["value"][1] == "1"
        assert held["metric"]["job"] == "fleet-import"
        [up] = query("fleet_import_store_up")
        assert up["value"][1] == "1"

        def expired_lease_alert() -> list[dict]:
            alerts = get_json(f"{api}/alerts")["data"]["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "FleetImportExpiredLease"]

        [alert] = wait_for("the expired lease's alert", expired_lease_alert, logs)
        assert alert["state"] == "pending" and alert["labels"]["tenant"] == "acme"
        rules = get_json(f"{api}/rules")["data"]["groups"][0]["rules"]
        assert {r["health"] for r in rules} == {"ok"}, rules
