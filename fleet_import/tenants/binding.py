"""A folder belongs to one tenant: the rule every import entry applies before any write.

Whose folder it is follows from where it lies, never from a label: inside a tenant's own
registered prefix (`landing_prefixes`, the most specific one wins), else the tenant the
landing layout (`{tenant}/fleet/{yyyy-mm-dd}/` under a prefix) reads from its key. A
delivery is admitted only when that tenant is the one it is loaded for and, with a
registry, the tenant is registered and enabled. Anything else is `Refused`: one line
naming both tenants and the layout, announced as DELIVERY_REFUSED_EVENT.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from fleet_import.scope import Tenant, canonical_folder, split_folder, validate_tenant_id
from fleet_import.tenants.registry import TenantRegistry

DELIVERY_REFUSED_EVENT = "fleet.delivery.refused"
# A key inside the folder, for layouts that place object keys (not folders) in a delivery.
_PROBE_LEAF = "_fleet_probe"


class Layout(Protocol):
    """What the rule needs of `fleet_import.intake.landing.LandingLayout`."""

    prefix: str
    pattern: str

    def locate(self, bucket: str, key: str) -> tuple[str, str] | None: ...


@dataclass(frozen=True)
class Refused:
    """The delivery may not be imported for `tenant_id`; nothing was written."""

    tenant_id: str
    folder: str
    kind: str  # other_tenant | outside | unknown_tenant | disabled_tenant
    reason: str
    owner_tenant_id: str | None = None

    def payload(self, source: str, **more: str) -> dict[str, str | None]:
        """The DELIVERY_REFUSED_EVENT payload, shaped like `fleet.delivery.skipped`'s."""
        return {
            "source": source,
            "tenant_id": self.tenant_id,
            "folder": self.folder,
            "kind": self.kind,
            "reason": self.reason,
            "owner_tenant_id": self.owner_tenant_id,
            **more,
        }


Admission = Callable[[str, str], Tenant | Refused]
"""(tenant_id, folder) -> the tenant to import it as, or why not: the rule with the settings
in force (`fleet_import.intake.admission.admission`). The core paths that load or publish
for a batch already made (approve, rollback, the drain) take one and ask it first."""


def folder_owner(folder: str, layout: Layout, registry: TenantRegistry | None) -> str | None:
    """The tenant whose landing area holds `folder` (canonical), or None."""
    if registry is not None:
        for prefix, tenant_id in registry.prefix_owners():
            if folder.startswith(prefix):
                return tenant_id
    bucket, key_prefix = split_folder(folder)
    located = layout.locate(bucket, key_prefix + _PROBE_LEAF)
    if located is None or located[1] != folder:
        return None
    return located[0]


def bind(
    tenant_id: str, folder: str, *, layout: Layout, registry: TenantRegistry | None
) -> Tenant | Refused:
    """The tenant to import `folder` as, or why it may not be. Invalid ids and folders
    raise InvalidInput, as `scope` does."""
    validate_tenant_id(tenant_id)
    folder = canonical_folder(folder)
    registered = registry.get(tenant_id) if registry is not None else None
    if registry is not None and registered is None:
        return Refused(
            tenant_id,
            folder,
            "unknown_tenant",
            f"tenant {tenant_id!r} is not in the tenant registry {registry.path}",
        )
    if registered is not None and not registered.enabled:
        return Refused(
            tenant_id,
            folder,
            "disabled_tenant",
            f"tenant {tenant_id!r} is disabled in the tenant registry {registry.path}"
            if registry is not None
            else f"tenant {tenant_id!r} is disabled",
        )
    owner = folder_owner(folder, layout, registry)
    where = _landing_area(tenant_id, layout, registry)
    if owner is None:
        return Refused(
            tenant_id,
            folder,
            "outside",
            f"{folder} is in no tenant's landing area, so not in {tenant_id!r}'s "
            f"({where})",
        )
    if owner != tenant_id:
        return Refused(
            tenant_id,
            folder,
            "other_tenant",
            f"{folder} belongs to tenant {owner!r}, not {tenant_id!r} ({where})",
            owner_tenant_id=owner,
        )
    return registered.tenant if registered is not None else Tenant.named(tenant_id)


def _landing_area(tenant_id: str, layout: Layout, registry: TenantRegistry | None) -> str:
    registered = registry.get(tenant_id) if registry is not None else None
    if registered is not None and registered.landing_prefixes:
        return f"{tenant_id!r}'s registered prefixes {', '.join(registered.landing_prefixes)}"
    return f"landing layout {layout.prefix}{layout.pattern}"
