"""The tenant registry: a YAML file (FLEET_TENANTS) naming every tenant that may import.

Without a registry every valid slug is a tenant whose company id and warehouse database
follow from the slug (`scope.Tenant.named`): a one-tenant setup needs no file. With one,
only its tenants exist, and a disabled one (an offboarded customer) imports nothing:

    tenants:
      acme:
        company_id: ACME-001          # default: the slug
        database: tenant_acme         # its own warehouse database (default: the shared one)
        enabled: true
        landing_prefixes:             # its own bucket or prefixes (default: the landing layout)
          - s3://acme-drop/fleet/
        overrides: {}                 # per-tenant settings other features read

A mistake names the file and the field (`tenants.acme.landing_prefixes[0]: ...`), the way
contract files do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from fleet_import.contracts.describe import describe
from fleet_import.errors import ConfigurationError, InvalidInput
from fleet_import.scope import Tenant, canonical_folder, validate_tenant_id

_TOP_LEVEL_FIELDS = ("tenants",)


class TenantRegistryError(ConfigurationError):
    """The tenant registry file is not valid."""


class _TenantEntry(BaseModel):
    """One tenant as the file spells it."""

    model_config = ConfigDict(extra="forbid")

    company_id: str | None = None
    database: str | None = None
    enabled: bool = True
    landing_prefixes: tuple[str, ...] = ()
    overrides: dict[str, Any] = {}

    @field_validator("landing_prefixes", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @field_validator("landing_prefixes")
    @classmethod
    def _canonical(cls, prefixes: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(landing_prefix(prefix) for prefix in prefixes)


def landing_prefix(prefix: str) -> str:
    """`s3://bucket/` or `s3://bucket/some/prefix/`, canonical like a folder (a whole bucket
    is allowed here: a tenant may own one)."""
    bucket_only = prefix.rstrip("/").count("/") == 2 and prefix.lower().startswith("s3://")
    if bucket_only:
        return canonical_folder(prefix.rstrip("/") + "/_/").removesuffix("_/")
    return canonical_folder(prefix)


@dataclass(frozen=True)
class RegisteredTenant:
    """A tenant the registry names."""

    tenant: Tenant  # its database is the registry's, or the derived one when it names none
    enabled: bool = True
    own_database: bool = False  # the registry names its database: its slices live there
    landing_prefixes: tuple[str, ...] = ()
    overrides: Mapping[str, Any] = field(default_factory=dict)

    @property
    def tenant_id(self) -> str:
        return self.tenant.tenant_id

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "company_id": self.tenant.company_id,
            "database": self.tenant.database if self.own_database else None,
            "enabled": self.enabled,
            "landing_prefixes": list(self.landing_prefixes),
            "overrides": dict(self.overrides),
        }


@dataclass(frozen=True)
class TenantRegistry:
    """The tenants of one registry file, by id."""

    path: str
    tenants: Mapping[str, RegisteredTenant]

    def get(self, tenant_id: str) -> RegisteredTenant | None:
        return self.tenants.get(tenant_id)

    def prefix_owners(self) -> list[tuple[str, str]]:
        """(landing prefix, tenant id), longest prefix first: the most specific one wins."""
        owned = [(p, t.tenant_id) for t in self.tenants.values() for p in t.landing_prefixes]
        return sorted(owned, key=lambda pair: len(pair[0]), reverse=True)


def load_registry(path: str | Path) -> TenantRegistry:
    """Read and check a registry file; every problem of the file is reported at once."""
    import yaml

    where = str(path)
    file = Path(path)
    if not file.is_file():
        raise TenantRegistryError(f"tenant registry {where!r} does not exist")
    try:
        raw = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise TenantRegistryError(f"{where}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise TenantRegistryError(f"{where}: expected a mapping with the field 'tenants'")
    unknown = sorted(map(str, raw.keys() - set(_TOP_LEVEL_FIELDS)))
    if unknown:
        raise TenantRegistryError(f"{where}: {', '.join(unknown)}: unknown field (one of tenants)")
    entries = raw.get("tenants") or {}
    if not isinstance(entries, dict):
        raise TenantRegistryError(f"{where}: tenants: expected a mapping of tenant id to fields")
    tenants: dict[str, RegisteredTenant] = {}
    problems: list[str] = []
    for tenant_id, fields in entries.items():
        try:
            tenants[str(tenant_id)] = _tenant(tenant_id, fields or {}, f"tenants.{tenant_id}")
        except InvalidInput as exc:
            problems.append(str(exc))
    problems += _shared_prefixes(tenants)
    if problems:
        raise TenantRegistryError(f"{where}: " + "; ".join(problems))
    return TenantRegistry(where, tenants)


def _shared_prefixes(tenants: Mapping[str, RegisteredTenant]) -> list[str]:
    """A landing prefix two tenants name: no rule could say whose its folders are (the
    first in the file used to win, silently), so the file is refused."""
    owners: dict[str, list[str]] = {}
    for tenant in tenants.values():
        for prefix in dict.fromkeys(tenant.landing_prefixes):
            owners.setdefault(prefix, []).append(tenant.tenant_id)
    return [
        f"landing prefix {prefix!r} is named by {' and '.join(ids)}: a folder belongs to one "
        "tenant, give each its own prefix"
        for prefix, ids in owners.items()
        if len(ids) > 1
    ]


def _tenant(tenant_id: object, fields: object, where: str) -> RegisteredTenant:
    try:
        validate_tenant_id(tenant_id)
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc}") from None
    assert isinstance(tenant_id, str)
    try:
        entry = _TenantEntry.model_validate(fields)
    except ValidationError as exc:
        raise InvalidInput(describe(exc, _TenantEntry, where)) from None
    derived = Tenant.named(tenant_id)
    try:
        tenant = Tenant(
            tenant_id, entry.company_id or derived.company_id, entry.database or derived.database
        )
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc}") from None
    return RegisteredTenant(
        tenant,
        enabled=entry.enabled,
        own_database=entry.database is not None,
        landing_prefixes=entry.landing_prefixes,
        overrides=entry.overrides,
    )


def registry_in_force(path: str | None) -> TenantRegistry | None:
    """The registry FLEET_TENANTS names, or None (every valid slug is a tenant)."""
    return load_registry(path) if path else None
