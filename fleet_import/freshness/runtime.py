"""The freshness check's parts built from `Settings` (what the flow and the CLI share): the
tenants to check, the SLOs, the store, and where S3 is looked at."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from fleet_import.config import Settings
from fleet_import.freshness.check import (
    FreshnessReport,
    Landing,
    Verdict,
    check_freshness,
    judge,
    tenants_to_check,
)
from fleet_import.freshness.policies import FreshnessPolicy, load_policy
from fleet_import.intake.landing import LandingLayout
from fleet_import.publication.events import EventSink
from fleet_import.s3.client import settings_s3_client
from fleet_import.store.freshness_repository import FreshnessRepository
from fleet_import.tenants.registry import registry_in_force


@dataclass(frozen=True)
class FreshnessRuntime:
    tenant_ids: list[str]
    policy: FreshnessPolicy
    store: FreshnessRepository
    landing: Landing

    def judge(self, now: dt.datetime) -> list[Verdict]:
        """Every verdict, nothing remembered or told (what `fleet-import freshness` shows)."""
        return judge(self.tenant_ids, self.policy, self.store, self.landing, now)

    def check(self, events: EventSink, now: dt.datetime) -> FreshnessReport:
        """Judge, remember and tell each change (what the `check-freshness` flow does)."""
        return check_freshness(self.tenant_ids, self.policy, self.store, self.landing, events, now)


def freshness_runtime(settings: Settings) -> FreshnessRuntime:
    """The parts FLEET_FRESHNESS, FLEET_TENANTS and the landing settings name."""
    registry = registry_in_force(settings.tenants)
    policy = load_policy(settings.freshness, registry)
    store = FreshnessRepository.from_settings(settings)
    elsewhere = frozenset(
        t.tenant_id for t in (registry.tenants.values() if registry else ()) if t.landing_prefixes
    )
    landing = Landing(
        settings_s3_client(settings) if policy.bucket else None,
        LandingLayout(settings.landing_prefix, settings.landing_pattern),
        elsewhere,
    )
    return FreshnessRuntime(tenants_to_check(registry, store), policy, store, landing)
