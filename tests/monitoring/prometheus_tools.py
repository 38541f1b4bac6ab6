"""Debian's `prometheus` package (the server and `promtool`) for the tests that need it. A
machine without it skips them, unless the run requires it (FLEET_REQUIRE_PROMETHEUS, as
.ci/run sets after installing it): then a missing one fails the test instead of hiding it
as a skip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

REQUIRE_PROMETHEUS_ENV = "FLEET_REQUIRE_PROMETHEUS"


def missing(reason: str) -> NoReturn:
    """Skip, unless the run requires Prometheus: then fail."""
    if os.environ.get(REQUIRE_PROMETHEUS_ENV):
        pytest.fail(f"{REQUIRE_PROMETHEUS_ENV} is set but {reason}")
    pytest.skip(reason)


def executable(name: str) -> str:
    """The path of `prometheus` or `promtool`, or skip/fail as `missing` says."""
    found = shutil.which(name)
    if found is None:
        missing(f"{name} is not installed (apt-get install prometheus)")
    return found


_WAIT_SECONDS = 90.0
_POLL_SECONDS = 0.5
_DEPLOYMENTS = Path(__file__).resolve().parents[2] / "deployments"
RULES = _DEPLOYMENTS / "prometheus" / "fleet-import-rules.yml"
DASHBOARD = _DEPLOYMENTS / "grafana" / "fleet-import-dashboard.json"


def dashboard_exprs() -> list[str]:
    """Every PromQL expression of the Grafana dashboard's panels."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


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


def get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def wait_for(what: str, probe: Callable[[], Any], logs: list[Path]) -> Any:
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


@dataclass(frozen=True)
class Stack:
    """A real Prometheus scraping a real `fleet-import metrics serve` every second."""

    prometheus_url: str
    logs: list[Path]

    @property
    def api(self) -> str:
        return f"{self.prometheus_url}/api/v1"

    def query(self, expr: str) -> list[dict[str, Any]]:
        found = get_json(f"{self.api}/query?{urllib.parse.urlencode({'query': expr})}")
        assert found["status"] == "success", found
        return found["data"]["result"]


@contextmanager
def prometheus_stack(database_url: str, tmp_path: Path, tenants: list[str]) -> Iterator[Stack]:
    """`fleet-import metrics serve` over the store at `database_url` (the registry naming
    `tenants`) and Prometheus with the shipped rules, scraping it every second."""
    from tests.prefect_server import free_port

    prometheus = executable("prometheus")
    registry = tmp_path / "tenants.yaml"
    registry.write_text("tenants:\n" + "".join(f"  {t}: {{}}\n" for t in tenants))
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
        "FLEET_TENANTS": str(registry),
    }
    serve_log, prometheus_log = tmp_path / "serve.log", tmp_path / "prometheus.log"
    serve = [sys.executable, "-m", "fleet_cli", "metrics", "serve", "--addr", "127.0.0.1",
             "--port", str(metrics_port)]  # fmt: skip
    server = [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
              f"--web.listen-address=127.0.0.1:{prometheus_port}"]  # fmt: skip
    with running(serve, serve_log, env), running(server, prometheus_log):
        stack = Stack(f"http://127.0.0.1:{prometheus_port}", [serve_log, prometheus_log])
        wait_for("the first scrape", lambda: stack.query("fleet_import_store_up == 1"), stack.logs)
        yield stack
