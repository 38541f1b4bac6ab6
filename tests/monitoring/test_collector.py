"""The metrics endpoint against a real operational store in the states an operator must
hear about: a held batch awaiting review, a failed publication not resumed, a running
batch whose lease expired, a late tenant, and a real import's rows and timings. Each scrape
is fetched over HTTP and read with prometheus-client's own parser."""

from __future__ import annotations

import datetime as dt
import time
import urllib.request
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from fleet_import.importing.context import Committed
from fleet_import.importing.driver import import_folder
from fleet_import.monitoring.collector import OTHER_TENANTS, StoreCollector, TenantLabels
from fleet_import.monitoring.endpoint import start_endpoint
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.details import FailureKind
from fleet_import.store.freshness_repository import FreshnessRepository, StoredVerdict
from fleet_import.store.metrics_repository import MetricsRepository
from fleet_import.store.models import LeaseAcquired, Reserved
from fleet_import.store.repository import BatchRepository
from tests.helpers import upload

ACME = Tenant.named("acme")
GLOBEX = Tenant.named("globex")
LIMITS = {"trips": 0.05, "vehicles": 0.05, "fuel_transactions": 0.05}


def scrape(collector: StoreCollector) -> dict[str, list[tuple[dict[str, str], float]]]:
    """GET /metrics from a real endpoint; series name -> [(labels, value)]."""
    server, thread = start_endpoint(collector, port=0, addr="127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    series: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series.setdefault(sample.name, []).append((sample.labels, sample.value))
    return series


def value(series, name: str, **labels: str) -> float:
    matching = [v for found, v in series.get(name, []) if found == labels]
    assert len(matching) == 1, (name, labels, series.get(name))
    return matching[0]


def _leased(repo: BatchRepository, tenant: Tenant, day: str, key: str, ttl: float = 60):
    scope = source_scope(f"s3://fleet-landing/{tenant.tenant_id}/fleet/{day}/")
    reserved = repo.reserve(tenant, scope, key)
    assert isinstance(reserved, Reserved), reserved
    assert isinstance(repo.acquire_lease(reserved.batch.id, key, ttl), LeaseAcquired)
    return reserved.batch.id


def _held(repo: BatchRepository, tenant: Tenant, day: str) -> uuid.UUID:
    batch_id = _leased(repo, tenant, day, f"held-{day}")
    breach = {"dataset": "trips", "current_rows": 100, "new_rows": 3, "rule": "min_rows_ratio 0.5"}
    facts = {"held": {"breaches": [breach], "content": {"fingerprint": "f"}}}
    repo.mark_failed(batch_id, f"held-{day}", FailureKind.HELD, "held for review", facts)
    return batch_id


def _failed_publication(repo: BatchRepository, tenant: Tenant, day: str) -> uuid.UUID:
    key = f"pub-{day}"
    batch_id = _leased(repo, tenant, day, key)
    repo.mark_committed(batch_id, key, row_counts={"trips": 5}, publication_steps=["notify"])
    repo.mark_failed(batch_id, key, FailureKind.FAILED_PUBLICATION, "notify failed")
    return batch_id


def test_the_states_that_matter_scraped_from_a_real_store(
    repo: BatchRepository, database_url: str, import_ctx, s3, landing_bucket
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(bad_rows=True))
    loaded = import_folder(import_ctx, ACME, folder, "metrics-import")
    assert isinstance(loaded, Committed) and loaded.published
    _held(repo, ACME, "2026-07-20")
    _failed_publication(repo, GLOBEX, "2026-07-21")
    expired = _leased(repo, GLOBEX, "2026-07-19", "frozen", ttl=0.2)
    FreshnessRepository(database_url).remember(
        StoredVerdict(
            "acme",
            "trips",
            state="missing",
            late=True,
            expected_at=dt.datetime.now(dt.UTC) - dt.timedelta(hours=3),
            checked_at=dt.datetime.now(dt.UTC),
        ),
        lambda previous: True,
    )
    time.sleep(0.5)  # the frozen batch's lease runs out (database clock)

    collector = StoreCollector(
        MetricsRepository(database_url), TenantLabels(frozenset({"acme", "globex"})), LIMITS
    )
    series = scrape(collector)

    assert value(series, "fleet_import_store_up") == 1
    assert value(series, "fleet_import_batches", status="succeeded", phase="published") == 1
    assert value(series, "fleet_import_batches", status="running", phase="reserved") == 1
    assert value(series, "fleet_import_held_batches", tenant="acme") == 1
    assert value(series, "fleet_import_held_batches_oldest_age_seconds", tenant="acme") >= 0
    assert "globex" not in {labels["tenant"] for labels, _ in series["fleet_import_held_batches"]}
    assert value(series, "fleet_import_failed_publications", tenant="globex") == 1
    assert value(series, "fleet_import_expired_leases", tenant="globex") == 1
    assert value(series, "fleet_import_expired_leases_oldest_seconds", tenant="globex") > 0
    assert repo.get(expired).status == "running"

    # The real import's rows (bad rows rejected), bytes staged and timings, per dataset.
    summary = repo.get(loaded.batch_id).details["summary"]
    for dataset, rows in loaded.row_counts.items():
        assert value(series, "fleet_import_rows_published_total", dataset=dataset) == rows
        assert value(series, "fleet_import_staged_bytes_total", dataset=dataset) > 0
        assert value(series, "fleet_import_copy_seconds_total", dataset=dataset) == pytest.approx(
            summary["seconds"]["copy"][dataset]
        )
    rejected = sum(v for _, v in series["fleet_import_rows_rejected_total"])
    assert rejected == sum(f["rejects"] for f in summary["files"]) > 0
    assert value(series, "fleet_import_commit_seconds_total") == pytest.approx(
        summary["seconds"]["commit"]
    )
    assert value(series, "fleet_import_reject_ratio_limit", dataset="trips") == 0.05

    # One success: one delivery-to-publish observation, in every bucket up to +Inf.
    assert value(series, "fleet_import_delivery_to_publish_seconds_count") == 1
    assert value(series, "fleet_import_delivery_to_publish_seconds_bucket", le="+Inf") == 1
    assert value(series, "fleet_import_delivery_to_publish_seconds_bucket", le="60.0") == 1
    assert 0 < value(series, "fleet_import_delivery_to_publish_seconds_sum") < 60

    gates = "fleet_import_gate_findings_total"
    assert value(series, gates, severity="error", rule="min_rows_ratio") == 1
    assert value(series, "fleet_import_freshness_late", tenant="acme", dataset="trips") == 1
    lag = value(series, "fleet_import_freshness_lag_seconds", tenant="acme", dataset="trips")
    assert 3 * 3600 - 60 < lag < 3 * 3600 + 600


def test_a_failed_publication_resumed_or_superseded_is_no_longer_counted(
    repo: BatchRepository, database_url: str
) -> None:
    batch_id = _failed_publication(repo, ACME, "2026-07-21")
    collector = StoreCollector(MetricsRepository(database_url), TenantLabels(frozenset({"acme"})))
    assert value(scrape(collector), "fleet_import_failed_publications", tenant="acme") == 1
    batch = repo.get(batch_id)
    resumed = repo.resume_publication(batch_id, batch.source_type, batch.source_scope)
    assert type(resumed).__name__ == "Resumed", resumed
    assert "fleet_import_failed_publications" not in scrape(collector)


def test_tenants_the_registry_does_not_name_share_one_label(
    repo: BatchRepository, database_url: str
) -> None:
    for n in range(3):
        _held(repo, Tenant.named(f"walk-in-{n}"), "2026-07-20")
    _held(repo, ACME, "2026-07-20")
    series = scrape(
        StoreCollector(MetricsRepository(database_url), TenantLabels(frozenset({"acme"})))
    )
    assert value(series, "fleet_import_held_batches", tenant=OTHER_TENANTS) == 3
    assert value(series, "fleet_import_held_batches", tenant="acme") == 1
    assert len(series["fleet_import_held_batches"]) == 2


@given(
    registered=st.frozensets(st.from_regex(r"[a-z]{1,8}", fullmatch=True), max_size=5),
    seen=st.lists(st.from_regex(r"[a-z]{1,8}", fullmatch=True), max_size=50),
)
def test_tenant_labels_never_outnumber_the_registry(registered, seen) -> None:
    labels = {TenantLabels(registered)(tenant) for tenant in seen}
    assert labels <= registered | {OTHER_TENANTS}
    assert len(labels) <= len(registered) + 1


def test_a_store_that_does_not_answer_is_a_zero_not_an_error() -> None:
    closed = "postgresql://postgres@127.0.0.1:1/postgres"
    series = scrape(StoreCollector(MetricsRepository(closed, 2.0), TenantLabels()))
    assert series == {"fleet_import_store_up": [({}, 0.0)]}


def test_the_content_gate_s_warnings_and_errors_are_counted_by_check(
    repo: BatchRepository, database_url: str
) -> None:
    """Each result of the content gate that warned or erred is a finding of its check; a
    passing one is none."""
    from fleet_import.store.gates import DatasetGate, GateRepository

    batch_id = _leased(repo, ACME, "2026-07-20", "gated")
    results = [
        {"dataset": "trips", "check": "not_null(driver_id)", "outcome": "error"},
        {"dataset": "trips", "check": "not_null(vehicle_id)", "outcome": "error"},
        {"dataset": "trips", "check": "sum_moved(distance_km)", "outcome": "warn"},
        {"dataset": "trips", "check": "row_count", "outcome": "pass"},
    ]
    GateRepository(database_url).record_gate(
        batch_id, [DatasetGate("trips", "error", {}, results)], None
    )
    collector = StoreCollector(MetricsRepository(database_url), TenantLabels(frozenset({"acme"})))
    series = scrape(collector)
    gates = "fleet_import_gate_findings_total"
    assert value(series, gates, severity="error", rule="gate_not_null") == 2
    assert value(series, gates, severity="warning", rule="gate_sum_moved") == 1
    assert not [labels for labels, _ in series[gates] if labels["rule"] == "gate_row_count"]
