"""The tenant registry file: what it holds, and mistakes told by file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_import.errors import InvalidInput
from fleet_import.tenants.registry import (
    TenantRegistryError,
    landing_prefix,
    load_registry,
    registry_in_force,
)

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


def test_every_field_the_file_names_reaches_the_tenant(tmp_path: Path) -> None:
    """A named database is where the tenant's slices live, and `tenants` shows it; the
    overrides are what other features read: none of them may fall back to a default."""
    registry = load_registry(_write(tmp_path, ACME + (
        "company_id: ACME-001\n    database: tenant_acme\n    enabled: false\n"
        "    landing_prefixes: s3://Acme-Drop/fleet\n    overrides: {reject_ratio: 0.2}\n"
    )))
    acme = registry.get("acme")
    assert acme is not None and acme.own_database and acme.overrides == {"reject_ratio": 0.2}
    assert acme.to_json() == {
        "tenant_id": "acme",
        "company_id": "ACME-001",
        "database": "tenant_acme",
        "enabled": False,
        "landing_prefixes": ["s3://acme-drop/fleet/"],
        "overrides": {"reject_ratio": 0.2},
    }


@pytest.mark.parametrize("written", ["s3://fleet-dropbox", "s3://FLEET-DROPBOX/", "s3://fleet-dropbox//"])
def test_a_whole_bucket_is_canonical_like_a_folder(written: str) -> None:
    """Lower-case bucket, one trailing slash: two spellings of one bucket are one owner."""
    assert landing_prefix(written) == "s3://fleet-dropbox/"


def test_a_prefix_that_is_not_s3_is_quoted_as_written() -> None:
    with pytest.raises(InvalidInput) as raised:
        landing_prefix("http://x/")
    assert "'http://x/'" in str(raised.value), raised.value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (ACME + "enabeld: false\n", "acme: enabeld: unknown field (did you mean 'enabled'?)"),
        (ACME + "enabled: maybe\n", "tenants.acme: enabled: invalid value 'maybe'"),
        ("tenants:\n  Acme!: {}\n", "tenants.Acme!: invalid tenant id 'Acme!'"),
        (ACME + "database: 'x; drop'\n", "tenants.acme: invalid warehouse database"),
        (ACME + "landing_prefixes: [http://x/]\n", "tenants.acme: landing_prefixes"),
        ("tenant:\n  acme: {}\n", "tenant: unknown field (one of tenants)"),
        ("tenant: {}\nversion: 2\n", "tenant, version: unknown field (one of tenants)"),
        ("- acme\n", "expected a mapping with the field 'tenants'"),
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
    problems = str(raised.value).removeprefix(f"{path}: ").split("; ")
    assert [problem.split(":")[0] for problem in problems] == ["tenants.a", "tenants.b"]


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TenantRegistryError, match="does not exist"):
        load_registry(tmp_path / "nope.yaml")


def test_one_landing_prefix_named_by_two_tenants_is_refused(tmp_path: Path) -> None:
    """Whose would its folders be? The first tenant in the file used to win, silently."""
    path = _write(
        tmp_path,
        "tenants:\n  acme:\n    landing_prefixes: [s3://shared/x/]\n"
        "  globex:\n    landing_prefixes: ['S3://shared//x']\n"
        "  hooli:\n    landing_prefixes: [s3://shared/x/h/]\n",
    )
    with pytest.raises(TenantRegistryError) as raised:
        load_registry(path)
    assert "landing prefix 's3://shared/x/' is named by acme and globex" in str(raised.value)
    assert "hooli" not in str(raised.value)  # a nested prefix is no conflict: the longest wins
