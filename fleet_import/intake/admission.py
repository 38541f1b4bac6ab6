"""Whether a delivery may be imported for a tenant, by the settings in force: the landing
layout (FLEET_LANDING_PREFIX, FLEET_LANDING_PATTERN) and the tenant registry
(FLEET_TENANTS) given to `fleet_import.tenants.binding.bind`, the rule itself. Every entry
point (the import flow, so `fleet-import run`, UI runs, S3 events and the sweep's runs; the
relay and the sweep before they start anything) asks here; the core paths that load or
publish for a batch already made (resume, approve, rollback, the drain) are handed
`admission(settings)` and ask it before they write anything."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

from fleet_import.config import Settings
from fleet_import.intake.landing import LandingLayout
from fleet_import.intake.sweep import QUIET_SKIPS, SweepPlan
from fleet_import.scope import Tenant
from fleet_import.tenants.binding import Admission, Refused, bind
from fleet_import.tenants.databases import recorded_tenant
from fleet_import.tenants.registry import TenantRegistry, registry_in_force


class _Delivery(Protocol):
    @property
    def tenant_id(self) -> str: ...

    @property
    def folder(self) -> str: ...


D = TypeVar("D", bound=_Delivery)


def landing_layout(settings: Settings) -> LandingLayout:
    return LandingLayout(prefix=settings.landing_prefix, pattern=settings.landing_pattern)


def admit(
    settings: Settings,
    tenant_id: str,
    folder: str,
    *,
    registry: TenantRegistry | None = None,
    layout: LandingLayout | None = None,
) -> Tenant | Refused:
    """The tenant to import `folder` as (its database the one that will hold its slices),
    or why not. The registry and layout default to the settings'."""
    if registry is None:
        registry = registry_in_force(settings.tenants)
    bound = bind(tenant_id, folder, layout=layout or landing_layout(settings), registry=registry)
    if isinstance(bound, Refused):
        return bound
    return recorded_tenant(settings, bound, registry)


def admission(settings: Settings) -> Admission:
    """`admit` with these settings, the registry read again on every call: an operator who
    disables a tenant stops a long-running drain's publications at its next batch."""

    def admitted(tenant_id: str, folder: str) -> Tenant | Refused:
        return admit(settings, tenant_id, folder)

    return admitted


def admitted_only(
    settings: Settings, deliveries: Iterable[D], *, layout: LandingLayout
) -> tuple[list[D], list[Refused]]:
    """The deliveries (found by `layout`, so their tenant is the key's) that may be
    imported, and the refusals of the others."""
    return _admitted(registry_in_force(settings.tenants), deliveries, layout)


def _admitted(
    registry: TenantRegistry, deliveries: Iterable[D], layout: LandingLayout
) -> tuple[list[D], list[Refused]]:
    admitted: list[D] = []
    refusals: list[Refused] = []
    for delivery in deliveries:
        bound = bind(delivery.tenant_id, delivery.folder, layout=layout, registry=registry)
        if isinstance(bound, Refused):
            refusals.append(bound)
        else:
            admitted.append(delivery)
    return admitted, refusals


def admitted_sweep(
    settings: Settings, plan: SweepPlan, *, layout: LandingLayout
) -> tuple[SweepPlan, list[Refused]]:
    """The sweep's check before it starts runs: the plan without the folders the tenant
    rule refuses, and their refusals. Judged for the folders it would start and for those
    it would skip as news (a disabled tenant's folder whose last batch failed is refused,
    not "failed, fix the files"); one already loaded stays a quiet skip, and one the layout
    names no tenant for stays unimportable."""
    registry = registry_in_force(settings.tenants)
    start, refusals = _admitted(registry, plan.start, layout)
    skips = []
    for skip in plan.skip:
        if skip.tenant_id is None or skip.kind in (*QUIET_SKIPS, "unimportable"):
            skips.append(skip)
            continue
        bound = bind(skip.tenant_id, skip.folder, layout=layout, registry=registry)
        if isinstance(bound, Refused):
            refusals.append(bound)
        else:
            skips.append(skip)
    return SweepPlan(start, skips), refusals
