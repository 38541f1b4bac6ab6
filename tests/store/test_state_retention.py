"""Retention of the operational store's own rows (issue 50): what ended before the cutoff is
trimmed; what a resume, rollback or "already loaded" decision reads is kept."""

from __future__ import annotations

import datetime as dt
import uuid

import psycopg
from psycopg.types.json import Jsonb

from fleet_import.importing.context import AlreadyLoaded, Committed
from fleet_import.importing.driver import import_folder
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.store.models import BatchStatus
from fleet_import.store.state_retention import StateRetention, Trimmed
from tests.helpers import upload

DAY = 24 * 3600.0


def _age(database_url: str, batch_id: uuid.UUID, days: int, status: str | None = None) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE ingestion_batches SET updated_at = now() - make_interval(days => %s),"
            " status = coalesce(%s, status) WHERE id = %s",
            (days, status, batch_id),
        )


def _lineage(database_url: str, batch_id: uuid.UUID, event_type: str, delivered_days_ago):
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO lineage_outbox (batch_id, run_id, job_name, event_type, event_time,"
            " event, status, delivered_at) VALUES (%s, %s, 'job', %s, now(), %s, %s,"
            " now() - make_interval(days => %s))",
            (
                batch_id,
                uuid.uuid4(),
                event_type,
                Jsonb({}),
                "pending" if delivered_days_ago is None else "delivered",
                delivered_days_ago or 0,
            ),
        )


def _count(database_url: str, sql: str, *params) -> int:
    with psycopg.connect(database_url) as conn:
        return conn.execute(sql, params).fetchone()[0]


def test_trim_keeps_what_resumes_and_reloads_need(
    publishing_ctx, acme, s3, landing_bucket: str, database_url: str
) -> None:
    outcomes = {}
    for tenant_day in ("2026-07-20", "2026-07-21", "2026-07-22"):
        folder = today_folder(landing_bucket, "acme", dt.date.fromisoformat(tenant_day))
        upload(s3, folder, fleet_delivery(trips=20))
        outcome = import_folder(publishing_ctx, acme, folder, f"k:{tenant_day}")
        assert isinstance(outcome, Committed) and outcome.published, outcome
        outcomes[tenant_day] = (folder, outcome.batch_id)
    old_folder, old = outcomes["2026-07-20"]
    _, recent = outcomes["2026-07-21"]
    _, failed = outcomes["2026-07-22"]
    _age(database_url, old, 40)
    _age(database_url, failed, 40, status="failed")  # a resume may still need its steps
    _lineage(database_url, old, "START", 35)
    _lineage(database_url, old, "COMPLETE", None)  # never delivered: still owed
    _lineage(database_url, recent, "START", 1)
    outbox = "SELECT count(*) FROM publication_outbox WHERE batch_id = %s"
    steps = {b: _count(database_url, outbox, b) for b in (old, recent, failed)}
    assert all(steps.values()), steps

    store = StateRetention(database_url)
    # Chunks smaller than the work: every one runs. A tiny delivery's details are below
    # the compaction threshold; the second trim lowers it to show what compaction keeps.
    trimmed = store.trim(30 * DAY, chunk=2)
    assert (trimmed.outbox_rows, trimmed.lineage_rows) == (steps[old], 1)
    assert trimmed.compacted_batches == 0
    assert store.trim(30 * DAY, chunk=2, compact_above_bytes=0).compacted_batches == 1
    assert _count(database_url, outbox, old) == 0
    assert _count(database_url, outbox, recent) == steps[recent]
    assert _count(database_url, outbox, failed) == steps[failed]
    lineage = "SELECT count(*) FROM lineage_outbox WHERE batch_id = %s"
    assert (_count(database_url, lineage, old), _count(database_url, lineage, recent)) == (1, 1)

    batch = publishing_ctx.repo.get(old)
    assert batch.status == BatchStatus.SUCCEEDED
    assert "summary" not in batch.details and batch.details["compacted"]["files"] > 0
    assert batch.details["manifest"] and batch.details["row_counts"]
    assert "sample" not in (batch.details.get("rejects") or {})
    assert publishing_ctx.repo.get(recent).details.get("summary")
    # The compacted batch still owns its slice and its content: a redelivery is no reload.
    again = import_folder(publishing_ctx, acme, old_folder, "k:again")
    assert isinstance(again, AlreadyLoaded) and again.owner_batch_id == old, again
    # A second trim finds nothing more.
    assert store.trim(30 * DAY, compact_above_bytes=0) == Trimmed()
    assert set(store.table_bytes()) >= {"ingestion_batches", "publication_outbox"}
