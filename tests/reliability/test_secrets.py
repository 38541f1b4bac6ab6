"""Secrets never leak: a database password and an AWS secret key, set to sentinels, must not
appear in logs (DEBUG included), CLI output, Prefect logs, artifacts and state messages,
events, batch details or exception messages, even when imports fail in every way we can
force (unreachable databases, malformed URLs, unreachable S3, failing publication)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import subprocess
import sys
import traceback
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql

from fleet_import.config import Settings
from fleet_import.errors import FleetImportError
from fleet_import.importing import driver as pipeline
from fleet_import.importing import load as loading
from fleet_import.importing.context import Committed, Failed
from fleet_import.importing.driver import import_folder
from fleet_import.importing.runtime import build_runtime
from fleet_import.retry import Backoff
from fleet_import.s3.client import S3Limits, s3_client
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant, split_folder
from fleet_import.store.repository import BatchRepository
from tests.helpers import upload

ACME = Tenant.named("acme")
DB_PASSWORD = "S3cr3t-Pa55-db-sentinel"
AWS_SECRET = "AWS-s3cr3t-key-sentinel-0123456789"
SENTINELS = (DB_PASSWORD, AWS_SECRET)
_UNREACHABLE_PORT = 1  # nothing listens there: connection refused at once


def _with_user(url: str, user: str, password: str, port: int | None = None) -> str:
    parts = urlsplit(url)
    netloc = f"{user}:{password}@{parts.hostname}:{port or parts.port or 5432}"
    return parts._replace(netloc=netloc).geturl()


@pytest.fixture
def secret_url(pg_server_url: str, database_url: str, warehouse: Any) -> Iterator[str]:
    """The test database, reached as a role whose URL carries the sentinel password."""
    role = f"fleet_secret_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(DB_PASSWORD)
            )
        )
    ident = sql.Identifier(role)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("GRANT CREATE, CONNECT ON DATABASE {} TO {}").format(
                sql.Identifier(urlsplit(database_url).path.lstrip("/")), ident
            )
        )
        for schema in ("public", "curated"):
            schema_id = sql.Identifier(schema)
            conn.execute(sql.SQL("GRANT ALL ON SCHEMA {} TO {}").format(schema_id, ident))
            for kind in ("TABLES", "SEQUENCES"):
                conn.execute(
                    sql.SQL("GRANT ALL ON ALL {} IN SCHEMA {} TO {}").format(
                        sql.SQL(kind), schema_id, ident
                    )
                )
        # The warehouse creates indexes only when missing and its tables already exist;
        # ownership of the curated tables lets it lock and DELETE/COPY like the owner would.
        for (table,) in conn.execute(
            "SELECT quote_ident(schemaname) || '.' || quote_ident(tablename) "
            "FROM pg_tables WHERE schemaname = 'curated'"
        ).fetchall():
            conn.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(sql.SQL(table), ident))
    yield _with_user(database_url, role, DB_PASSWORD)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(ident))
        conn.execute(sql.SQL("DROP OWNED BY {}").format(ident))
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP ROLE {}").format(ident))


@pytest.fixture
def aws_secret(monkeypatch: pytest.MonkeyPatch, moto_endpoint: str) -> str:
    # moto accepts any key; what matters is that the code under test holds this one.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    return AWS_SECRET


def _assert_clean(where: str, text: str) -> None:
    for sentinel in SENTINELS:
        assert sentinel not in text, f"{where} leaks a secret: ...{_around(text, sentinel)}..."


def _around(text: str, sentinel: str) -> str:
    at = text.index(sentinel)
    return text[max(0, at - 150) : at + len(sentinel) + 50]


def _exception_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc) + repr(exc.args)


def _database_text(database_url: str) -> str:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT coalesce(json_agg(b)::text, '') FROM ingestion_batches b "
            "UNION ALL SELECT coalesce(json_agg(o)::text, '') FROM publication_outbox o "
            "UNION ALL SELECT coalesce(json_agg(n)::text, '') FROM normalized_files n"
        ).fetchall()
    return "\n".join(row[0] for row in rows)


def _staged_text(s3: Any, bucket: str) -> str:
    """The staging area's text files (rejects CSVs): what people download and share."""
    listed = s3.list_objects_v2(Bucket=bucket).get("Contents", ())
    bodies = [
        s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read().decode("utf-8", "replace")
        for item in listed
        if item["Key"].endswith(".csv")
    ]
    return "\n".join(bodies)


def test_failing_imports_leak_no_secret_in_process(
    secret_url: str,
    aws_secret: str,
    database_url: str,
    moto_endpoint: str,
    s3: Any,
    landing_bucket: str,
    staging_bucket: str,
    caplog: pytest.LogCaptureFixture,
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)
    # Every retry still runs and logs its error (what is checked here), without the backoff.
    monkeypatch.setattr(loading, "LOAD_BACKOFF", Backoff((0.0, 0.0, 0.0)))
    monkeypatch.setattr(pipeline, "STEP_BACKOFF", Backoff((0.0, 0.0, 0.0)))
    events: list[tuple[str, dict[str, Any]]] = []
    base = Settings(
        database_url=secret_url,
        s3_endpoint_url=moto_endpoint,
        staging_uri=f"s3://{staging_bucket}/stage/",
        lease_ttl_seconds=30,
        workdir=str(tmp_path / "work"),
    )

    def runtime(**changes: Any):
        return build_runtime(
            base.model_copy(update=changes), events=lambda n, p: events.append((n, dict(p)))
        )

    texts: list[tuple[str, str]] = []
    good = today_folder(landing_bucket, "acme")
    upload(s3, good, fleet_delivery(trips=60, bad_rows=True))
    committed = import_folder(runtime().ctx, ACME, good, "good")
    assert isinstance(committed, Committed), committed

    broken = today_folder(landing_bucket, "acme", dt.date(2026, 7, 23))
    files = fleet_delivery(trips=60)
    files["trips-1.csv"] = files["trips-1.csv"].replace(b"distance_km", b"distance_mi", 1)
    upload(s3, broken, files)
    failed = import_folder(runtime().ctx, ACME, broken, "broken")
    assert isinstance(failed, Failed) and "distance_mi" in failed.error
    texts.append(("pre-commit failure", failed.error))

    published = import_folder(
        runtime(refresh_sql=["SELECT 1/0"]).ctx, ACME, good, "publish", force=True
    )
    assert isinstance(published, Failed) and published.kind == "failed_publication", published
    texts.append(("publication failure", published.error))

    unreachable_warehouse = _with_user(secret_url, "fleet_secret", DB_PASSWORD, _UNREACHABLE_PORT)
    nowhere = runtime(warehouse_url=unreachable_warehouse)
    outcome = import_folder(nowhere.ctx, ACME, good, "no-warehouse")
    assert isinstance(outcome, Failed), outcome
    texts.append(("warehouse unreachable", outcome.error))

    # S3 unreachable, with credentials read from a file that does not exist.
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "no-such-credentials")
    try:
        no_s3 = runtime()
        no_s3.ctx.s3 = s3_client(
            f"http://127.0.0.1:{_UNREACHABLE_PORT}", S3Limits(max_attempts=1)
        )
        outcome = import_folder(no_s3.ctx, ACME, good, "no-s3")
        assert isinstance(outcome, Failed), outcome
        texts.append(("S3 unreachable", outcome.error))
    finally:
        del os.environ["AWS_SHARED_CREDENTIALS_FILE"]

    # Operational database unreachable, and URLs libpq cannot even parse.
    for label, url in (
        ("database unreachable", unreachable_warehouse),
        ("bad port", secret_url.replace(f":{urlsplit(secret_url).port}/", ":notaport/")),
    ):
        with pytest.raises(FleetImportError) as raised:
            BatchRepository(url).list()
        texts.append((label, _exception_text(raised.value)))
        with pytest.raises(FleetImportError) as raised:
            runtime(warehouse_url=url).ctx.warehouse.slice_owner("acme", "fleet_s3:s3://b/x/")
        texts.append((f"warehouse {label}", _exception_text(raised.value)))

    for label, text in texts:
        _assert_clean(label, text)
    logged = caplog.text + "\n".join(
        f"{r.getMessage()} {r.exc_text or ''} {r.args!r}" for r in caplog.records
    )
    _assert_clean("logs", logged)
    _assert_clean("events", json.dumps(events, default=str))
    _assert_clean("batch details and outbox", _database_text(database_url))
    _assert_clean("staged rejects", _staged_text(s3, staging_bucket))


@pytest.mark.slow
@pytest.mark.e2e  # the CLI as child processes: `make test-e2e`
def test_cli_and_prefect_records_leak_no_secret(
    secret_url: str,
    aws_secret: str,
    flow_env: str,
    moto_endpoint: str,
    s3: Any,
    landing_bucket: str,
    staging_bucket: str,
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterExpectedStartTime
    from prefect.settings import PREFECT_API_URL

    started = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    env = {
        **os.environ,
        "COLUMNS": "200",
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "PREFECT_LOGGING_LEVEL": "DEBUG",
        "FLEET_DATABASE_URL": secret_url,
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
    }
    unreachable = _with_user(secret_url, "fleet_secret", DB_PASSWORD, _UNREACHABLE_PORT)

    def cli(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "fleet_cli", *args],
            capture_output=True,
            text=True,
            timeout=300,
            env={**env, **extra},
        )
        _assert_clean(f"`{' '.join(args)}` ({extra})", done.stdout + done.stderr)
        return done

    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=60, bad_rows=True))
    assert cli("run", "--tenant", "acme", folder).returncode == 0
    assert (
        cli(
            "run", "--tenant", "acme", folder, "--force", FLEET_REFRESH_SQL='["SELECT 1/0"]'
        ).returncode
        == 1
    )
    assert cli("run", "--tenant", "acme", folder, FLEET_WAREHOUSE_URL=unreachable).returncode == 1
    bucket, prefix = split_folder(folder)
    s3.put_object(Bucket=bucket, Key=prefix + "trips-1.csv", Body=b"")
    assert cli("run", "--tenant", "acme", folder).returncode == 1
    assert cli("run", "--tenant", "acme", folder, FLEET_DATABASE_URL=unreachable).returncode != 0
    assert cli("batches", "list").returncode == 0
    for batch in BatchRepository(flow_env).list():
        assert cli("batches", "show", str(batch.id)).returncode == 0
    assert cli("batches", "list", FLEET_DATABASE_URL=unreachable).returncode == 1

    _assert_clean("batch details and outbox", _database_text(flow_env))
    _assert_clean("staged rejects", _staged_text(s3, staging_bucket))
    with get_client(sync_client=True) as client:
        ours = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                expected_start_time=FlowRunFilterExpectedStartTime(after_=started)
            )
        )
        assert len(ours) >= 3  # the runs that got past the first-contact checks
        runs = client.read_flow_runs()
        _assert_clean("flow run states", json.dumps([r.model_dump(mode="json") for r in runs]))
        task_runs = client.read_task_runs()
        _assert_clean("task runs", json.dumps([t.model_dump(mode="json") for t in task_runs]))
        logs = client.read_logs()
        assert logs
        _assert_clean("Prefect logs", "\n".join(log.message for log in logs))
        artifacts = client.read_artifacts()
        assert artifacts
        _assert_clean("artifacts", json.dumps([a.model_dump(mode="json") for a in artifacts]))


def _unencoded_at_url(database_url: str) -> str:
    """A URL whose password holds an '@' nobody percent-encoded: libpq then takes the rest
    of the password for the host name, and its error message quotes that host."""
    parts = urlsplit(database_url)
    return parts._replace(netloc=f"fleet:p@{DB_PASSWORD}@{parts.hostname}:{parts.port}").geturl()


def test_operational_store_errors_do_not_quote_a_mangled_password(database_url: str) -> None:
    with pytest.raises(FleetImportError) as raised:
        BatchRepository(_unencoded_at_url(database_url)).list()
    _assert_clean("operational store error", _exception_text(raised.value))


def test_warehouse_errors_do_not_quote_a_mangled_password(database_url: str) -> None:
    from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse

    with pytest.raises(FleetImportError) as raised:
        PostgresWarehouse(_unencoded_at_url(database_url)).slice_owner("acme", "fleet_s3:s3://b/x/")
    _assert_clean("warehouse error", _exception_text(raised.value))
