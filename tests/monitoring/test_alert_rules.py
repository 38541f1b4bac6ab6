"""The alert rules shipped in deployments/prometheus/, unit-tested by `promtool test rules`
(each alert fires on the series that should fire it, when it should, and not before); every
alert has a test there; and the tests bite: a rule whose threshold moved fails them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.monitoring.prometheus_tools import (
    REQUIRE_PROMETHEUS_ENV,
    RULES,
    dashboard_exprs,
    executable,
)

RULES_DIR = RULES.parent
RULE_TESTS = RULES_DIR / "fleet-import-rules.test.yml"


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [executable("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_every_alert_fires_when_its_tests_say() -> None:
    checked = promtool("check", "rules", RULES.name, cwd=RULES_DIR)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=RULES_DIR)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_has_a_unit_test() -> None:
    alerts = {
        rule["alert"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts == tested


def test_a_threshold_moved_fails_the_rule_tests(tmp_path: Path) -> None:
    shutil.copy(RULE_TESTS, tmp_path)
    text = RULES.read_text()
    moved = text.replace("fleet_import_held_batches_oldest_age_seconds > 4 * 3600",
                         "fleet_import_held_batches_oldest_age_seconds > 2 * 3600")
    assert moved != text
    (tmp_path / RULES.name).write_text(moved)
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert tested.returncode != 0
    assert "FleetImportBatchHeldTooLong" in tested.stdout + tested.stderr


def test_a_missing_promtool_fails_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv(REQUIRE_PROMETHEUS_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="promtool is not installed"):
        executable("promtool")
    monkeypatch.delenv(REQUIRE_PROMETHEUS_ENV)
    with pytest.raises(pytest.skip.Exception):
        executable("promtool")


def test_every_dashboard_panel_is_valid_promql(tmp_path: Path) -> None:
    """The Grafana dashboard's queries, checked as recording rules (no server needed); the
    e2e scrape test runs each against a real Prometheus."""
    exprs = dashboard_exprs()
    assert exprs
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"panel:{n}", "expr": e} for n, e in enumerate(exprs)],
            }
        ]
    }
    (tmp_path / "panels.yml").write_text(yaml.safe_dump(rules))
    checked = promtool("check", "rules", "panels.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
