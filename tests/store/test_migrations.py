"""Alembic history: upgrading databases that predate fleet imports, and round trips."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import uuid

import psycopg
import pytest
from alembic import command
from alembic.script import ScriptDirectory

from fleet_import.config import libpq_url
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.models import BatchStatus, Reserved
from fleet_import.store.repository import BatchRepository
from tests import pgtools

LEGACY_INSERT = """
INSERT INTO ingestion_batches (id, tenant_id, company_id, tenant_database, mode, source_type,
    business_date, pipeline_stage, status, details, is_current)
VALUES (%s, %s, 'c1', 'tenant_db', 'api_pull', %s, %s, 'raw_to_curated', %s, '{"v": 1}', %s)
"""


def test_one_head() -> None:
    script = ScriptDirectory.from_config(pgtools.alembic_config("postgresql://unused/x"))
    assert len(script.get_heads()) == 1
    for revision in script.walk_revisions():
        assert revision.doc and "Why:" in (revision.module.__doc__ or "")


def test_head_revision_is_alembics() -> None:
    """The services check's cheap head (no Alembic import) is the one Alembic computes."""
    from fleet_import.store.migrate import head_revision

    script = ScriptDirectory.from_config(pgtools.alembic_config("postgresql://unused/x"))
    assert head_revision() == script.get_current_head()


def legacy_rows(url: str) -> list[tuple]:
    rows = [
        (uuid.uuid4(), "acme", "brink_pos", dt.date(2026, 7, 20), "succeeded", True),
        (uuid.uuid4(), "acme", "brink_pos", dt.date(2026, 7, 21), "running", False),
        (uuid.uuid4(), "globex", "kds_cdc", None, "failed", False),
    ]
    with psycopg.connect(libpq_url(url)) as conn:
        for row in rows:
            conn.execute(LEGACY_INSERT, row)
    return rows


def snapshot(url: str) -> list[tuple]:
    with psycopg.connect(libpq_url(url)) as conn:
        return conn.execute(
            "SELECT id, tenant_id, source_type, business_date, status, details, is_current, "
            "created_at FROM ingestion_batches ORDER BY id"
        ).fetchall()


def test_upgrade_keeps_existing_date_scoped_batches(empty_database_url: str) -> None:
    url = empty_database_url
    pgtools.migrate(url, "0001")
    legacy_rows(url)
    before = snapshot(url)
    pgtools.migrate(url, "head")
    assert snapshot(url) == before
    with psycopg.connect(libpq_url(url)) as conn:
        new_columns = conn.execute(
            "SELECT count(*) FROM ingestion_batches WHERE source_scope IS NULL AND "
            "delivery_key IS NULL AND execution_lease_id IS NULL AND "
            "execution_lease_expires_at IS NULL"
        ).fetchone()
    assert new_columns == (3,)
    # Fleet batches work beside them.
    repo = BatchRepository(url)
    outcome = repo.reserve(Tenant.named("acme"), source_scope("s3://b-1/acme/x/"), "d1")
    assert isinstance(outcome, Reserved)
    assert {b.status for b in repo.list(tenant="acme")} == {
        BatchStatus.RUNNING,
        BatchStatus.SUCCEEDED,
    }


def test_date_scoped_current_rule_is_unchanged(database_url: str) -> None:
    legacy_rows(database_url)
    with psycopg.connect(libpq_url(database_url)) as conn:
        # A second current batch for the same tenant/day/stage still violates the old index...
        with pytest.raises(psycopg.errors.UniqueViolation) as error:
            conn.execute(
                LEGACY_INSERT,
                (uuid.uuid4(), "acme", "brink_pos", dt.date(2026, 7, 20), "succeeded", True),
            )
        assert error.value.diag.constraint_name == "ux_ingestion_batches_current"
    with psycopg.connect(libpq_url(database_url)) as conn:
        # ...while rows without a business date (fleet ones included) never take part.
        conn.execute(LEGACY_INSERT, (uuid.uuid4(), "acme", "kds_cdc", None, "running", True))
        conn.execute(LEGACY_INSERT, (uuid.uuid4(), "acme", "kds_cdc", None, "running", True))
    # Two running date-scoped batches (no source scope) never conflict under the new index.
    with psycopg.connect(libpq_url(database_url)) as conn:
        conn.execute(LEGACY_INSERT, (uuid.uuid4(), "acme", "brink_pos", None, "running", False))


def test_fleet_batches_are_never_date_scoped(database_url: str) -> None:
    with (
        psycopg.connect(libpq_url(database_url)) as conn,
        pytest.raises(psycopg.errors.CheckViolation),
    ):
        conn.execute(
            "INSERT INTO ingestion_batches (id, tenant_id, company_id, tenant_database, mode, "
            "source_type, business_date, pipeline_stage, status, source_scope) VALUES "
            "(gen_random_uuid(), 'acme', 'c', 'd', 'file_upload', 'fleet_s3', '2026-07-22', "
            "'fleet_s3_direct_to_curated', 'running', 'fleet_s3:s3://b-1/x/')"
        )


def test_source_types_are_append_only(empty_database_url: str) -> None:
    url = empty_database_url

    def allowed() -> str:
        with psycopg.connect(libpq_url(url)) as conn:
            return conn.execute(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conname = 'ck_ingestion_batches_source_type'"
            ).fetchone()[0]

    pgtools.migrate(url, "0001")
    before = allowed()
    pgtools.migrate(url, "head")
    after = allowed()
    for value in ("brink_pos", "kds_cdc", "manual_upload"):
        assert value in before and value in after
    assert "fleet_s3" not in before and "fleet_s3" in after


def test_upgrade_downgrade_upgrade(empty_database_url: str) -> None:
    url = empty_database_url
    config = pgtools.alembic_config(url)
    pgtools.migrate(url, "0001")
    legacy_rows(url)
    before = snapshot(url)
    command.upgrade(config, "head")
    BatchRepository(url).reserve(Tenant.named("acme"), source_scope("s3://b-1/acme/x/"), "d1")
    command.downgrade(config, "0001")
    assert snapshot(url) == before  # fleet rows go, legacy rows stay
    command.upgrade(config, "head")
    assert snapshot(url) == before
    command.downgrade(config, "base")
    with psycopg.connect(libpq_url(url)) as conn:
        assert conn.execute("SELECT to_regclass('ingestion_batches')").fetchone() == (None,)
    command.upgrade(config, "head")


def test_alembic_command_line_upgrades(empty_database_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "alembic", "-x", f"url={empty_database_url}", "upgrade", "head"],
        cwd=pgtools.REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    with psycopg.connect(libpq_url(empty_database_url)) as conn:
        head = ScriptDirectory.from_config(pgtools.alembic_config(empty_database_url))
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone() == (
            head.get_current_head(),
        )


def test_retired_outbox_steps_round_trip(empty_database_url: str) -> None:
    """0005 admits 'retired'; going back to 0004 turns such steps into 'dead' ones."""
    url = empty_database_url
    config = pgtools.alembic_config(url)
    pgtools.migrate(url, "head")
    outcome = BatchRepository(url).reserve(
        Tenant.named("acme"), source_scope("s3://b-1/acme/x/"), "d1"
    )
    assert isinstance(outcome, Reserved)
    with psycopg.connect(libpq_url(url)) as conn:
        conn.execute(
            "INSERT INTO publication_outbox (batch_id, step, seq, status) "
            "VALUES (%s, 'notify', 1, 'retired')",
            (outcome.batch.id,),
        )
    command.downgrade(config, "0004")
    with psycopg.connect(libpq_url(url)) as conn:
        assert conn.execute("SELECT status FROM publication_outbox").fetchall() == [("dead",)]
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE publication_outbox SET status = 'retired'")
    command.upgrade(config, "head")


def test_batch_ids_sort_by_creation(empty_database_url: str) -> None:
    """0006: each id leads with the next batch number (after the batches already recorded,
    when upgrading), so ids sort by creation, as the warehouse's slice index appends them,
    and their 8-digit prefixes are unique."""
    url = empty_database_url
    pgtools.migrate(url, "head")
    repository = BatchRepository(url)
    tenant = Tenant.named("acme")

    def reserve(n: int) -> uuid.UUID:
        outcome = repository.reserve(tenant, source_scope(f"s3://b-1/acme/{n}/"), f"d{n}")
        assert isinstance(outcome, Reserved)
        return outcome.batch.id

    ids = [reserve(n) for n in range(3)]
    command.downgrade(pgtools.alembic_config(url), "0005")
    command.upgrade(pgtools.alembic_config(url), "head")
    ids.append(reserve(3))
    assert [str(i)[:8] for i in ids] == ["00000001", "00000002", "00000003", "00000004"]
    assert ids == sorted(ids) and len({i.bytes[4:] for i in ids}) == 4
