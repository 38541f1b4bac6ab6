"""The content gate (issue 49) through the import-s3-folder flow under Prefect's test harness,
on PostgreSQL and moto: each check type and each drift rule, declared in a FLEET_CONTRACTS
file, holds a delivery that breaks it (state `Held`, exit code 6) and lets the same delivery
through once switched off. (tests/importing/test_gate.py states the same through the core's
`import_folder`, with what the gate records.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flows.import_s3_folder import import_s3_folder
from flows.reporting import ExitCode, exit_code_for
from tests.importing.test_gate import CHECKS, DRIFTS, delivered, only, trips_with

# Eleven cases of two or three flow runs each (4-5 minutes here): make test-e2e. make test
# keeps the same cases through the core (tests/importing/test_gate.py).
pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def contracts(tmp_path: Path, monkeypatch, extension: dict) -> None:
    """A new file each time: nothing may take it for the one read before."""
    spec = tmp_path / f"contracts-{len(list(tmp_path.glob('contracts-*')))}.yaml"
    spec.write_text(yaml.safe_dump({"extend": extension}))
    monkeypatch.setenv("FLEET_CONTRACTS", str(spec))


def run(folder: str, key: str):
    return import_s3_folder(tenant_id="acme", folder=folder, delivery_key=key, return_state=True)


@pytest.mark.parametrize("check_type", list(CHECKS))
def test_each_check_type_holds_through_the_flow_and_not_once_switched_off(
    flow_env: str, s3, landing_bucket: str, tmp_path: Path, monkeypatch, check_type: str
) -> None:
    check, columns, named = CHECKS[check_type]
    folder = delivered(s3, landing_bucket, trips_with(**columns))
    contracts(tmp_path, monkeypatch, {"trips": {"checks": [check]}})
    held = run(folder, "d1")
    assert held.name == "Held" and exit_code_for(held) == ExitCode.HELD, held.message
    assert named in held.message, held.message
    contracts(tmp_path, monkeypatch, {"trips": {"checks": []}})
    loaded = run(folder, "d2")
    assert loaded.name == "Completed", loaded.message


@pytest.mark.parametrize("rule", list(DRIFTS))
def test_each_drift_rule_holds_through_the_flow_and_not_once_switched_off(
    flow_env: str, s3, landing_bucket: str, tmp_path: Path, monkeypatch, rule: str
) -> None:
    change, named = DRIFTS[rule]
    folder = delivered(s3, landing_bucket)
    contracts(tmp_path, monkeypatch, only(rule))
    assert run(folder, "d1").name == "Completed"
    change(s3, folder)
    held = run(folder, "d2")
    assert held.name == "Held" and exit_code_for(held) == ExitCode.HELD, held.message
    assert named in held.message, held.message
    contracts(tmp_path, monkeypatch, only(None))
    loaded = run(folder, "d3")
    assert loaded.name == "Completed", loaded.message
