"""`fleet-import tenants list|show`: the registry as the imports read it."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from fleet_cli.cli import app
from flows.demo import DEMO_TENANTS_YAML

REGISTRY = """
tenants:
  acme: {company_id: ACME-001}
  globex: {database: globex_dw, enabled: false, landing_prefixes: [s3://globex-drop/]}
"""


def _invoke(*args: str, env: dict[str, str]):
    return CliRunner().invoke(app, list(args), env=env)


def test_list_and_show_print_the_registry(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(REGISTRY)
    env = {"FLEET_TENANTS": str(path), "FLEET_WAREHOUSE_URL": "postgresql://u@h/dw"}
    env["COLUMNS"] = "200"
    listed = _invoke("tenants", "list", "--json", env=env)
    assert listed.exit_code == 0, listed.output
    document = json.loads(listed.output)
    assert document["registry"] == str(path)
    by_id = {t["tenant_id"]: t for t in document["tenants"]}
    assert by_id["acme"]["company_id"] == "ACME-001" and by_id["acme"]["enabled"]
    assert by_id["acme"]["warehouse_database"] == "dw" and not by_id["acme"]["own_database"]
    assert by_id["globex"]["warehouse_database"] == "globex_dw" and not by_id["globex"]["enabled"]
    assert by_id["globex"]["landing_prefixes"] == ["s3://globex-drop/"]
    table = _invoke("tenants", "list", env=env)
    assert table.exit_code == 0 and "globex_dw (own)" in table.output
    shown = _invoke("tenants", "show", "globex", "--json", env=env)
    assert shown.exit_code == 0 and json.loads(shown.output)["recorded_database"] == "globex_dw"
    missing = _invoke("tenants", "show", "hooli", env=env)
    assert missing.exit_code == 1 and "not in the tenant registry" in missing.output


def test_without_a_registry_any_slug_is_a_tenant() -> None:
    env = {"FLEET_WAREHOUSE_URL": "postgresql://u@h/{database}"}
    listed = _invoke("tenants", "list", env=env)
    assert listed.exit_code == 0 and "no tenant registry" in listed.output
    shown = _invoke("tenants", "show", "acme-eu", "--json", env=env)
    record = json.loads(shown.output)
    assert record["registered"] is False and record["warehouse_database"] == "tenant_acme_eu"


def test_a_broken_registry_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  acme: {enabeld: true}\n")
    broken = _invoke("tenants", "list", env={"FLEET_TENANTS": str(path)})
    assert broken.exit_code == 2 and "tenants.acme: enabeld" in broken.output


def test_the_demo_registry_names_both_demo_tenants(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(DEMO_TENANTS_YAML)
    listed = _invoke("tenants", "list", "--json", env={"FLEET_TENANTS": str(path)})
    listed = json.loads(listed.output)
    assert sorted(t["tenant_id"] for t in listed["tenants"]) == ["acme", "globex"]
