"""The fleet's metrics, read from the operational store at each scrape (a prometheus-client
`Collector`), never counted inside runs: a run that crashed or never started reports
nothing, while its batch row still says what became of it. So any process may serve them
(`fleet-import metrics serve`, a worker, the relay) and every one says the same.

Tenant labels only where the registry bounds their number: a tenant the registry names is
its own label value; every other one (and all of them without a registry) is counted under
`_other`. The rest is per dataset.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from fleet_import.errors import OperationalStoreError
from fleet_import.store.batch_state import ReviewState, review_state
from fleet_import.store.metrics_repository import AgedBatch, MetricsRepository, StoreSnapshot
from fleet_import.store.models import resume_refusal

log = logging.getLogger(__name__)

PREFIX = "fleet_import"
OTHER_TENANTS = "_other"
"""The label value of every tenant the registry does not name."""
LATENCY_BOUNDS = (60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0)
"""Delivery-to-publish histogram buckets, seconds: a minute to a day."""


@dataclass(frozen=True)
class TenantLabels:
    """Which tenants get a label value of their own: those the registry names."""

    registered: frozenset[str] = frozenset()

    def __call__(self, tenant_id: str) -> str:
        return tenant_id if tenant_id in self.registered else OTHER_TENANTS


class StoreCollector(Collector):
    """Every series of docs/operating.md#metrics-alerts-and-costs, from one store snapshot.
    `reject_limits`: each dataset's contract limit (`max_reject_ratio`), for the alert that
    compares the reject ratio with it."""

    def __init__(
        self,
        metrics: MetricsRepository,
        tenants: TenantLabels,
        reject_limits: Mapping[str, float] | None = None,
    ) -> None:
        self._metrics = metrics
        self._tenant = tenants
        self._reject_limits = dict(reject_limits or {})

    def describe(self) -> Iterable[Metric]:
        return []  # registering must not read the store

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            f"{PREFIX}_store_up", "1 if the operational store answered this scrape, else 0"
        )
        try:
            snapshot = self._metrics.snapshot(LATENCY_BOUNDS)
        except OperationalStoreError as exc:
            log.warning("metrics: the operational store did not answer: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from self._batches(snapshot)
        yield from self._held(snapshot)
        yield from self._aged(
            "failed_publications",
            "failed publications not resumed (resumable: committed, neither superseded nor"
            " expired)",
            [a for a in snapshot.failed_publications if _resumable(a)],
        )
        yield from self._leases(snapshot)
        yield self._latency(snapshot)
        yield from self._rows(snapshot)
        yield from self._warehouse_seconds(snapshot)
        yield self._gates(snapshot)
        yield from self._freshness(snapshot)

    def _batches(self, snapshot: StoreSnapshot) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            f"{PREFIX}_batches", "batches in the operational store", labels=["status", "phase"]
        )
        for row in snapshot.batches:
            family.add_metric([row["status"], row["phase"]], row["batches"])
        yield family

    def _held(self, snapshot: StoreSnapshot) -> Iterator[Metric]:
        awaiting = [
            held
            for held in snapshot.held
            if review_state(held.batch, snapshot.held_since.get(held.batch.id))
            is ReviewState.AWAITING
        ]
        yield from self._aged("held_batches", "held batches awaiting review", awaiting)

    def _aged(self, name: str, what: str, batches: list[AgedBatch]) -> Iterator[Metric]:
        """`{name}` (how many) and `{name}_oldest_age_seconds`, per tenant label."""
        yield from self._per_tenant(
            (f"{PREFIX}_{name}", what),
            (
                f"{PREFIX}_{name}_oldest_age_seconds",
                f"seconds since the oldest of the {what} got there",
            ),
            ((aged.batch.tenant_id, 1, aged.age_seconds) for aged in batches),
        )

    def _leases(self, snapshot: StoreSnapshot) -> Iterator[Metric]:
        yield from self._per_tenant(
            (
                f"{PREFIX}_expired_leases",
                "running batches whose execution lease expired (worker dead or frozen, not"
                " taken over yet)",
            ),
            (
                f"{PREFIX}_expired_leases_oldest_seconds",
                "seconds since the oldest of those leases expired",
            ),
            (
                (row["tenant_id"], int(row["batches"]), float(row["oldest_seconds"]))
                for row in snapshot.expired_leases
            ),
        )

    def _per_tenant(
        self,
        counted: tuple[str, str],
        aged: tuple[str, str],
        items: Iterable[tuple[str, int, float]],
    ) -> Iterator[Metric]:
        """A count and the oldest age per tenant label, from (tenant, count, age) items: the
        tenants the registry does not name summed under one label, their oldest kept."""
        count: dict[str, int] = defaultdict(int)
        oldest: dict[str, float] = defaultdict(float)
        for tenant_id, how_many, age in items:
            label = self._tenant(tenant_id)
            count[label] += how_many
            oldest[label] = max(oldest[label], age)
        count_family = GaugeMetricFamily(*counted, labels=["tenant"])
        age_family = GaugeMetricFamily(*aged, labels=["tenant"])
        for label in sorted(count):
            count_family.add_metric([label], count[label])
            age_family.add_metric([label], oldest[label])
        yield count_family
        yield age_family

    def _latency(self, snapshot: StoreSnapshot) -> Metric:
        latency = snapshot.latencies
        family = HistogramMetricFamily(
            f"{PREFIX}_delivery_to_publish_seconds",
            "from a delivery's newest file to its batch's success",
        )
        buckets = [(_bound(b), n) for b, n in zip(latency.bounds, latency.at_most, strict=True)]
        family.add_metric([], [*buckets, ("+Inf", latency.count)], latency.total_seconds)
        return family

    def _rows(self, snapshot: StoreSnapshot) -> Iterator[Metric]:
        loaded = CounterMetricFamily(
            f"{PREFIX}_rows_published", "rows loaded by committed slices", labels=["dataset"]
        )
        rejected = CounterMetricFamily(
            f"{PREFIX}_rows_rejected", "rows rejected by committed slices", labels=["dataset"]
        )
        staged = CounterMetricFamily(
            f"{PREFIX}_staged_bytes", "bytes of normalized Parquet staged", labels=["dataset"]
        )
        for row in sorted(snapshot.rows, key=lambda r: r["dataset"] or ""):
            dataset = row["dataset"] or ""
            loaded.add_metric([dataset], row["loaded"])
            rejected.add_metric([dataset], row["rejected"])
            staged.add_metric([dataset], row["staged_bytes"])
        yield loaded
        yield rejected
        yield staged
        limit = GaugeMetricFamily(
            f"{PREFIX}_reject_ratio_limit",
            "the dataset contract's max_reject_ratio",
            labels=["dataset"],
        )
        for dataset, ratio in sorted(self._reject_limits.items()):
            limit.add_metric([dataset], ratio)
        yield limit

    def _warehouse_seconds(self, snapshot: StoreSnapshot) -> Iterator[Metric]:
        copy = CounterMetricFamily(
            f"{PREFIX}_copy_seconds",
            "seconds in COPY of committed slices (waiting for files included)",
            labels=["dataset"],
        )
        commit = CounterMetricFamily(
            f"{PREFIX}_commit_seconds", "seconds in the COMMIT of committed slices"
        )
        for row in snapshot.warehouse_seconds:
            if row["step"] == "copy":
                copy.add_metric([row["dataset"]], row["seconds"])
            else:
                commit.add_metric([], row["seconds"])
        yield copy
        yield commit

    def _gates(self, snapshot: StoreSnapshot) -> Metric:
        family = CounterMetricFamily(
            f"{PREFIX}_gate_findings",
            "guard breaches that held a batch (error), drift reported on one that went on"
            " (warning), the content gate's checks and drift rules that warned or erred"
            " (rule gate_<check>)",
            labels=["severity", "rule"],
        )
        for row in snapshot.gate_findings:
            family.add_metric([row["severity"], row["rule"]], row["findings"])
        return family

    def _freshness(self, snapshot: StoreSnapshot) -> Iterator[Metric]:
        late: dict[tuple[str, str], int] = defaultdict(int)
        lag: dict[tuple[str, str], float] = defaultdict(float)
        for row in snapshot.freshness:
            key = (self._tenant(row["tenant_id"]), row["dataset"])
            late[key] = max(late[key], int(bool(row["late"])))
            lag[key] = max(lag[key], float(row["lag_seconds"]))
        late_family = GaugeMetricFamily(
            f"{PREFIX}_freshness_late",
            "1 while the last freshness check found the delivery late",
            labels=["tenant", "dataset"],
        )
        lag_family = GaugeMetricFamily(
            f"{PREFIX}_freshness_lag_seconds",
            "seconds past the due time of a late delivery, 0 when fresh",
            labels=["tenant", "dataset"],
        )
        for key in sorted(late):
            late_family.add_metric(list(key), late[key])
            lag_family.add_metric(list(key), lag[key])
        yield late_family
        yield lag_family


def _resumable(aged: AgedBatch) -> bool:
    batch = aged.batch
    return resume_refusal(batch, batch.source_type, batch.source_scope or "") is None


def _bound(seconds: float) -> str:
    """An `le` label as prometheus-client's own histograms write it (`60.0`)."""
    return floatToGoString(seconds)


