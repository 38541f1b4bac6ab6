"""The tenant registry file: what it holds, and mistakes told by file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_import.tenants.registry import TenantRegistryError, load_registry, registry_in_force

ACME = "tenants:\n  acme:\n    "


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    return path


def test_entries_default_from_the_slug(tmp_path: Path) -> None:
    registry = load_registry(_write(tmp_path, "tenants:\n  acme-eu: {}\n  globex:\n"))
    acme = registry.get("acme-eu")
    assert acme is not None and acme.enabled and not acme.own_database
    assert acme.to_json() == {
        "tenant_id": "acme-eu",
        "company_id": "acme-eu",
        "database": None,
        "enabled": True,
        "landing_prefixes": [],
        "overrides": {},
    }
    assert registry.get("globex") is not None and registry.get("nobody") is None
    assert registry_in_force(None) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (ACME + "enabeld: false\n", "acme: enabeld: unknown field (did you mean 'enabled'?)"),
        (ACME + "enabled: maybe\n", "tenants.acme: enabled: invalid value 'maybe'"),
        ("tenants:\n  Acme!: {}\n", "tenants.Acme!: invalid tenant id 'Acme!'"),
        (ACME + "database: 'x; drop'\n", "tenants.acme: invalid warehouse database"),
        (ACME + "landing_prefixes: [http://x/]\n", "tenants.acme: landing_prefixes"),
        ("tenant:\n  acme: {}\n", "tenant: unknown field (one of tenants)"),
        ("tenants: [acme]\n", "tenants: expected a mapping"),
        ("tenants: {acme: {\n", "not valid YAML"),
    ],
)
def test_mistakes_name_the_file_and_the_field(tmp_path: Path, text: str, expected: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(TenantRegistryError) as raised:
        load_registry(path)
    assert str(raised.value).startswith(f"{path}: "), raised.value
    assert expected in str(raised.value), raised.value


def test_every_mistake_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    path = _write(tmp_path, "tenants:\n  a:\n    x: 1\n  b:\n    enabled: no-way\n")
    with pytest.raises(TenantRegistryError) as raised:
        load_registry(path)
    assert "tenants.a: x: unknown field" in str(raised.value)
    assert "tenants.b: enabled" in str(raised.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TenantRegistryError, match="does not exist"):
        load_registry(tmp_path / "nope.yaml")
