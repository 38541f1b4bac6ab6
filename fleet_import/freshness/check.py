"""The freshness check: for each tenant and dataset with an SLO, was the delivery due last
loaded, and if not, what is waiting in S3? Verdicts are remembered in the operational store,
and `fleet.tenant.late` / `fleet.tenant.fresh-again` are told once per change.

What counts as loaded: a succeeded fleet batch of the tenant (holding the dataset, unless the
SLO is the tenant's `*` one), started at or before the moment judged, whose folder is dated
from the due delivery's date to the judged moment's date in the SLO's zone (daily SLOs, by
the landing layout's `{yyyy-mm-dd}`), or that started after the hour began (hourly SLOs, and
daily ones whose folder names no date). A load started later did not exist at that moment,
and a folder dated after it is not a delivery of that day: loading it early does not keep a
tenant fresh until its date. A delivery not loaded is "late", and S3
says why: no folder ("missing"), a folder the sweep's completion rule does not call complete
yet ("arrived, incomplete"), or a complete one nobody loaded yet ("arrived, not loaded").

A change is: turning late, missing another due time while late (a new delivery is late),
or turning fresh after being late. The first verdict of a fresh (tenant, dataset) tells
nothing. `now` is explicit: tests, the flow and the CLI give their clock.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet_import.freshness.policies import ANY_DATASET, FreshnessPolicy
from fleet_import.freshness.slo import Due, Slo
from fleet_import.intake.completion import folder_completion
from fleet_import.intake.landing import LandingFolder, LandingLayout
from fleet_import.publication.events import EventSink, emit_quietly
from fleet_import.s3.client import Children, S3Client, list_children
from fleet_import.s3.errors import s3_errors
from fleet_import.s3.sources import DiscoveryError
from fleet_import.scope import SOURCE_SCOPE_PREFIX, split_folder
from fleet_import.store.freshness_repository import (
    FreshnessRepository,
    StoredVerdict,
    SucceededBatch,
)
from fleet_import.tenants.registry import TenantRegistry

LATE_EVENT = "fleet.tenant.late"
FRESH_AGAIN_EVENT = "fleet.tenant.fresh-again"

FRESH = "fresh"
MISSING = "missing"
INCOMPLETE = "arrived, incomplete"
NOT_LOADED = "arrived, not loaded"
LATE = "late"  # not loaded, and S3 was not searched (no landing bucket, own prefixes)
OFF = "off"
LATE_STATES = frozenset({MISSING, INCOMPLETE, NOT_LOADED, LATE})

# Batches read per check: started this long before the oldest due delivery's window. A
# weekend of business days plus a margin for producers ahead of or behind the clock.
_STORE_MARGIN = dt.timedelta(days=4)


@dataclass(frozen=True)
class Verdict:
    """One (tenant, dataset) at `checked_at`: its state and what was found."""

    tenant_id: str
    dataset: str
    slo: str
    state: str
    checked_at: dt.datetime
    expected_by: dt.datetime | None = None  # the missed due time if late, else the next one
    last_loaded: dt.datetime | None = None  # when its newest succeeded batch started
    found: str = ""
    folder: str | None = None  # the late delivery's folder, when one arrived

    @property
    def late(self) -> bool:
        return self.state in LATE_STATES

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "dataset": self.dataset,
            "slo": self.slo,
            "state": self.state,
            "late": self.late,
            "expected_by": _iso(self.expected_by),
            "last_loaded": _iso(self.last_loaded),
            "found": self.found,
            "folder": self.folder,
            "checked_at": _iso(self.checked_at),
        }


@dataclass(frozen=True)
class FreshnessReport:
    verdicts: list[Verdict] = field(default_factory=list)
    told: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (event, payload)

    @property
    def late(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.late]


@dataclass(frozen=True)
class Landing:
    """Where late deliveries are looked for: the bucket and layout, and the registry's
    tenants whose folders are elsewhere (their own landing prefixes)."""

    s3: S3Client | None
    layout: LandingLayout = field(default_factory=LandingLayout)
    elsewhere: frozenset[str] = frozenset()


def tenants_to_check(registry: TenantRegistry | None, store: FreshnessRepository) -> list[str]:
    """The registry's enabled tenants; without one, every tenant that ever imported."""
    if registry is None:
        return store.known_tenants()
    return sorted(t.tenant_id for t in registry.tenants.values() if t.enabled)


def judge(
    tenant_ids: Iterable[str],
    policy: FreshnessPolicy,
    store: FreshnessRepository,
    landing: Landing,
    now: dt.datetime,
) -> list[Verdict]:
    """Every (tenant, dataset) verdict at `now`, without remembering or telling anything."""
    slos = {tenant: policy.slos(tenant) for tenant in tenant_ids}
    dues = {
        (tenant, dataset): slo.last_due(now)
        for tenant, by_dataset in slos.items()
        for dataset, slo in by_dataset.items()
    }
    windows = [due.since for due in dues.values() if due is not None]
    if not windows:
        return [_off(t, d, s, now) for t, by in slos.items() for d, s in by.items()]
    since = min(windows) - _STORE_MARGIN
    batches = store.succeeded_batches(list(slos), since, now)
    last = store.last_succeeded(list(slos), now)
    listed = _Listings(landing.s3, policy.bucket) if landing.s3 and policy.bucket else None
    verdicts: list[Verdict] = []
    for tenant, by_dataset in slos.items():
        for dataset, slo in by_dataset.items():
            due = dues[(tenant, dataset)]
            if due is None:
                verdicts.append(_off(tenant, dataset, slo, now))
                continue
            mine = [b for b in batches if b.tenant_id == tenant and _holds(b, dataset)]
            newest = mine[0].started_at if mine else None
            last_loaded = newest or (last[tenant].started_at if tenant in last else None)
            if any(loads_due(b, due, slo, landing.layout, now) for b in mine):
                verdicts.append(
                    Verdict(
                        tenant,
                        dataset,
                        slo.text,
                        FRESH,
                        now,
                        slo.next_due(now),
                        last_loaded,
                        "loaded",
                    )
                )
                continue
            state, found, folder = _waiting(tenant, dataset, slo, due, policy, landing, listed, now)
            verdicts.append(
                Verdict(tenant, dataset, slo.text, state, now, due.at, last_loaded, found, folder)
            )
    return verdicts


def check_freshness(
    tenant_ids: Iterable[str],
    policy: FreshnessPolicy,
    store: FreshnessRepository,
    landing: Landing,
    events: EventSink,
    now: dt.datetime,
) -> FreshnessReport:
    """Judge, remember every verdict, and tell each change once (after it is remembered:
    a change is never told for a verdict the store does not hold)."""
    told: list[tuple[str, dict[str, Any]]] = []
    verdicts = judge(tenant_ids, policy, store, landing, now)
    for verdict in verdicts:
        stored = StoredVerdict(
            verdict.tenant_id,
            verdict.dataset,
            verdict.state,
            verdict.late,
            verdict.expected_by if verdict.late else None,
            verdict.found,
            now,
        )
        previous, changed = store.remember(stored, lambda old, v=verdict: _is_change(old, v))
        if not changed:
            continue
        name = LATE_EVENT if verdict.late else FRESH_AGAIN_EVENT
        payload = event_payload(verdict, previous)
        emit_quietly(events, name, payload)
        told.append((name, payload))
    return FreshnessReport(verdicts, told)


def event_payload(verdict: Verdict, previous: StoredVerdict) -> dict[str, Any]:
    """tenant, dataset, expected time and what was found (and what was known before)."""
    expected = verdict.expected_by if verdict.late else previous.expected_at
    return {
        "tenant_id": verdict.tenant_id,
        "dataset": verdict.dataset,
        "slo": verdict.slo,
        "state": verdict.state,
        "expected_at": _iso(expected),
        "found": verdict.found,
        "folder": verdict.folder,
        "last_loaded": _iso(verdict.last_loaded),
        "previous_state": previous.state,
        "checked_at": _iso(verdict.checked_at),
    }


def _is_change(previous: StoredVerdict, verdict: Verdict) -> bool:
    """Tell: turning late, another due time missed while late, fresh after late."""
    if verdict.state == OFF:
        return False
    if verdict.late:
        return not previous.late or previous.expected_at != verdict.expected_by
    return previous.late


def _off(tenant: str, dataset: str, slo: Slo, now: dt.datetime) -> Verdict:
    return Verdict(tenant, dataset, slo.text, OFF, now, found="no expectation")


def _holds(batch: SucceededBatch, dataset: str) -> bool:
    return dataset == ANY_DATASET or dataset in batch.datasets


def loads_due(
    batch: SucceededBatch, due: Due, slo: Slo, layout: LandingLayout, now: dt.datetime
) -> bool:
    """Whether this batch had loaded the due delivery (or a newer one) at `now`: never one
    started after `now`, nor one whose folder is dated after `now`'s day (in the SLO's zone)."""
    if batch.started_at > now:
        return False
    if due.delivery_date is not None and batch.source_scope:
        dated = _folder_date(batch.source_scope, layout)
        if dated is not None:
            return due.delivery_date <= dated <= now.astimezone(slo.tz).date()
    return batch.started_at >= due.since


def _folder_date(scope: str, layout: LandingLayout) -> dt.date | None:
    try:
        _, key_prefix = split_folder(scope.removeprefix(SOURCE_SCOPE_PREFIX))
    except Exception:  # noqa: BLE001 - a scope of another shape names no date
        return None
    return layout.folder_date(key_prefix)


def _waiting(
    tenant: str,
    dataset: str,
    slo: Slo,
    due: Due,
    policy: FreshnessPolicy,
    landing: Landing,
    listed: _Listings | None,
    now: dt.datetime,
) -> tuple[str, str, str | None]:
    """(state, what was found, folder) for a delivery not loaded, from what S3 holds."""
    if listed is None or landing.s3 is None or policy.bucket is None:
        return (
            LATE,
            "not loaded (no landing bucket to look in: FLEET_FRESHNESS landing.bucket)",
            None,
        )
    if tenant in landing.elsewhere:
        return LATE, "not loaded (its own landing prefixes are not searched)", None
    if not landing.layout.dated:
        return LATE, "not loaded (the landing layout names no date to look for)", None
    days = _days(slo, due, now)
    found = [
        folder
        for folder in landing.layout.folders(policy.bucket, listed.folders, days)
        if isinstance(folder, LandingFolder) and folder.tenant_id == tenant
    ]
    arrived = []
    for folder in found:
        objects = listed(folder.key_prefix).objects
        if not objects:
            continue
        if due.delivery_date is None and _newest(objects) < due.since:
            continue  # an hourly SLO: this folder's content is older than the hour
        _, waiting = folder_completion(
            landing.s3, policy.bucket, objects, folder.key_prefix, policy.completion, now
        )
        arrived.append((folder.folder, waiting))
    if not arrived:
        what = f"folder dated {due.delivery_date}" if due.delivery_date else "new files"
        return MISSING, f"no {what} in s3://{policy.bucket}/{landing.layout.prefix}", None
    incomplete = [(f, why) for f, why in arrived if why is not None]
    if incomplete:
        folder, why = incomplete[0]
        return INCOMPLETE, f"arrived, incomplete: {why}", folder
    folder = arrived[0][0]
    loaded = (
        "no succeeded batch" if dataset == ANY_DATASET else f"no succeeded batch loaded {dataset}"
    )
    return NOT_LOADED, f"arrived, complete, not loaded ({loaded})", folder


def _days(slo: Slo, due: Due, now: dt.datetime) -> list[dt.date]:
    if due.delivery_date is not None:
        return [due.delivery_date]
    local = {due.since.astimezone(slo.tz).date(), now.astimezone(slo.tz).date()}
    return sorted(local | {now.astimezone(dt.UTC).date()})


class _Listings:
    """The landing bucket's listings during one judgement, each prefix listed once: late
    tenants share the listing of the tenants' level, datasets share their folder's."""

    def __init__(self, s3: S3Client, bucket: str) -> None:
        self.s3, self.bucket = s3, bucket
        self._children: dict[str, Children] = {}

    def __call__(self, key_prefix: str) -> Children:
        if key_prefix not in self._children:
            with s3_errors(f"cannot list s3://{self.bucket}/{key_prefix}", DiscoveryError):
                self._children[key_prefix] = list_children(self.s3, self.bucket, key_prefix)
        return self._children[key_prefix]

    def folders(self, key_prefix: str) -> list[str]:
        return self(key_prefix).folders


def _newest(objects: list[Mapping[str, Any]]) -> dt.datetime:
    return max(o["LastModified"] for o in objects).astimezone(dt.UTC)


def _iso(moment: dt.datetime | None) -> str | None:
    return moment.astimezone(dt.UTC).isoformat() if moment is not None else None
