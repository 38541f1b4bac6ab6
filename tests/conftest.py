from __future__ import annotations

import contextlib
import logging
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from fleet_import.retry import Backoff
from fleet_import.scope import Tenant
from fleet_import.store.repository import BatchRepository
from tests import pgtools
from tests.no_servers import SERVER_FIXTURES, SERVER_MARKERS, refuse_servers
from tests.pgpool import DatabasePool

# Prefect's test harness runs its server ephemeral, without the repossessor that frees the
# load slot of a process killed mid-load (flows/common.py): with the limits on, the crash
# tests' dead holders would leave every later load of their tenant waiting. The limits'
# own tests (tests/workers) turn them on; their children inherit this otherwise.
os.environ.setdefault("FLEET_WAREHOUSE_LOAD_SLOTS", "0")
os.environ.setdefault("FLEET_TENANT_LOAD_SLOTS", "0")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `fast` every test that uses no server fixture and no server marker
    (tests/no_servers.py): `make test-fast` runs `-m fast`."""
    for item in items:
        if any(item.get_closest_marker(name) for name in SERVER_MARKERS):
            continue
        if SERVER_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.fast)


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    """Admin URL of the PostgreSQL server the suite runs against."""
    return pgtools.server_url()


@pytest.fixture(scope="session")
def migrated_template(pg_server_url: str) -> Iterator[str]:
    """A database migrated to head once per session (per xdist worker), cloned per test."""
    # Unique per session: two pytest runs on one server must not drop each other's template.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    name = pgtools.unique_name(f"fleet_template_{worker}")
    url = pgtools.create_database(pg_server_url, name)
    pgtools.migrate(url)
    yield name
    pgtools.drop_database(pg_server_url, name)


@pytest.fixture(scope="session")
def database_pool(pg_server_url: str, migrated_template: str) -> Iterator[DatabasePool | None]:
    """This worker's reusable test databases (tests/pgpool.py); FLEET_TEST_FRESH_DATABASES=1
    clones the template for every test instead."""
    if os.environ.get("FLEET_TEST_FRESH_DATABASES") == "1":
        yield None
        return
    pool = DatabasePool(pg_server_url, migrated_template)
    yield pool
    pool.close()


@pytest.fixture
def database_url(
    pg_server_url: str, migrated_template: str, database_pool: DatabasePool | None
) -> Iterator[str]:
    """An operational database at head with nothing in it, private to this test."""
    if database_pool is None:
        name = pgtools.unique_name("test")
        url = pgtools.create_database(pg_server_url, name, template=migrated_template)
        yield url
        pgtools.drop_database(pg_server_url, name)
        return
    name = database_pool.take()
    yield pgtools.with_dbname(pg_server_url, name)
    database_pool.give_back(name)


@pytest.fixture
def empty_database_url(pg_server_url: str) -> Iterator[str]:
    """A fresh database with no tables, for migration tests."""
    name = pgtools.unique_name("empty")
    url = pgtools.create_database(pg_server_url, name)
    yield url
    pgtools.drop_database(pg_server_url, name)


@pytest.fixture
def db(database_url: str):
    """An autocommit connection to the test's database, for assertions."""
    import psycopg

    from fleet_import.config import libpq_url

    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        yield conn


@pytest.fixture
def repo(database_url: str) -> BatchRepository:
    return BatchRepository(database_url)


@pytest.fixture
def acme() -> Tenant:
    return Tenant("acme", "company-acme", "tenant_acme")


@pytest.fixture
def globex() -> Tenant:
    return Tenant("globex", "company-globex", "tenant_globex")


from tests.s3fixtures import *  # noqa: E402,F403  (moto server, s3 client, bucket fixtures)

_REDSHIFT_COPY_ROLE = "arn:aws:iam::123456789012:role/fleet-redshift-copy"
WAREHOUSE_SETTINGS = pytest.StashKey[dict[str, str]]()
"""The FLEET_* settings of the test's warehouse when it is not the default PostgreSQL one."""


@pytest.fixture
def warehouse(request: pytest.FixtureRequest, database_url: str):
    """The warehouse in the test's own database (schema `curated`): PostgreSQL, or (param
    "redshift") Redshift through the emulator (tests/redshift_emulator.py, a provisioned
    cluster) over that same database, staging its COPYs in the staging bucket. A test runs on
    both with tests.warehouse_helpers.WAREHOUSE_BACKENDS."""
    from fleet_import.contracts.fleet import FLEET_DATASETS

    backend = getattr(request, "param", "postgres")
    if backend == "postgres":
        from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse

        warehouse = PostgresWarehouse(database_url)
        warehouse.ensure_tables(FLEET_DATASETS.values())
        yield warehouse
        return
    from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse
    from tests.redshift_emulator import RedshiftEmulator

    assert backend == "redshift", backend
    s3 = request.getfixturevalue("s3")
    staging_bucket = request.getfixturevalue("staging_bucket")
    staging_uri = f"s3://{staging_bucket}/redshift/"
    with RedshiftEmulator(database_url, s3) as emulator:
        warehouse = RedshiftWarehouse(
            emulator.connect_kwargs(password="pw"),
            s3=s3,
            staging_uri=staging_uri,
            iam_role=_REDSHIFT_COPY_ROLE,
            retry_delays=(0.0, 0.0, 0.0),
        )
        warehouse.ensure_tables(FLEET_DATASETS.values())
        # What flow_env hands the flows (and the CLI's children): this same warehouse.
        request.node.stash[WAREHOUSE_SETTINGS] = {
            "FLEET_WAREHOUSE": "redshift",
            "FLEET_REDSHIFT_HOST": "127.0.0.1",
            "FLEET_REDSHIFT_PORT": str(emulator.port),
            "FLEET_REDSHIFT_DATABASE": emulator.database,
            "FLEET_REDSHIFT_USER": emulator.user,
            "FLEET_REDSHIFT_PASSWORD": "pw",
            "FLEET_REDSHIFT_SSL": "false",
            "FLEET_REDSHIFT_IAM_ROLE": _REDSHIFT_COPY_ROLE,
            "FLEET_REDSHIFT_STAGING_URI": staging_uri,
        }
        yield warehouse


@pytest.fixture
def import_ctx(repo, warehouse, s3, staging_bucket, tmp_path, database_url):
    from fleet_import.importing.context import ImportContext
    from fleet_import.s3.staging import StagingArea
    from fleet_import.store.gates import GateRepository

    events: list[tuple[str, dict]] = []
    ctx = ImportContext(
        repo=repo,
        warehouse=warehouse,
        s3=s3,
        staging=StagingArea(f"s3://{staging_bucket}/stage/", s3),
        lease_ttl=30,
        events=lambda name, payload: events.append((name, dict(payload))),
        workdir=tmp_path / "work",
        gates=GateRepository(database_url),
    )
    ctx.recorded_events = events  # type: ignore[attr-defined]
    return ctx


@pytest.fixture
def outbox(database_url: str):
    from fleet_import.store.outbox import OutboxRepository

    return OutboxRepository(database_url)


@pytest.fixture
def publishing_ctx(import_ctx, outbox):
    """import_ctx with the default publication steps (refresh, notify, retire)."""
    from fleet_import.publication.publisher import Publisher

    import_ctx.publisher = Publisher(
        import_ctx.repo,
        outbox,
        import_ctx.warehouse,
        events=import_ctx.events,
        staging=import_ctx.staging,
        backoff=Backoff((0.0,)),
    )
    return import_ctx


HEALTH_CHECK_READ_SECONDS = 30.0


@pytest.fixture(scope="session")
def prefect_api():
    """One temporary Prefect API server (SQLite) per test session / xdist worker."""
    from prefect.testing.utilities import prefect_test_harness

    refuse_servers("Prefect's test harness")
    services = logging.getLogger("prefect._internal.concurrency")
    services.addFilter(_with_traceback)
    with contextlib.ExitStack() as harness:
        with _patient_health_check():
            harness.enter_context(prefect_test_harness(server_startup_timeout=120))
        yield
    services.removeFilter(_with_traceback)


@contextlib.contextmanager
def _patient_health_check() -> Iterator[None]:
    """The harness polls its server's /health with httpx's default 5 s read timeout and
    gives up on the first ReadTimeout (only refused connections are waited out): on a
    loaded 2-core host a server still starting answered later than that, and every test of
    that xdist worker errored (seen with make test-crash and test-faults run at once). Its
    polls may wait HEALTH_CHECK_READ_SECONDS while it starts; only that module's httpx is
    replaced, and only while the harness starts."""
    import httpx
    import prefect.server.api.server as prefect_server_module

    class PatientClient(httpx.Client):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("timeout", HEALTH_CHECK_READ_SECONDS)
            super().__init__(*args, **kwargs)

    patient_httpx = types.SimpleNamespace(**vars(httpx))
    patient_httpx.Client = PatientClient
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prefect_server_module, "httpx", patient_httpx)
        yield


def _with_traceback(record: logging.LogRecord) -> bool:
    """Prefect logs a background service's failure without its traceback unless at DEBUG;
    the record is made inside the `except`, so the exception is still at hand to attach.
    (Prefect passes `exc_info=False` there, not None: a dropped event was seen without why.)"""
    if str(record.msg).startswith("Service %r failed") and not record.exc_info:
        record.exc_info = sys.exc_info()
    return True


EVENTS_DRAIN_SECONDS = 60


@pytest.fixture(autouse=True)
def prefect_events_drained(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test that talks to the harness ends by draining Prefect's events worker, within
    a bound. The worker is a process-wide singleton holding one websocket to the API: left
    running, a connection one test wedged (seen in CI on a loaded machine) failed every
    later test's events in that xdist worker, and the harness's own unbounded drain at the
    session's end then hung past the timeout. Drained, the next test starts a fresh one."""
    yield
    if "prefect_api" not in request.fixturenames:
        return
    from prefect.events.worker import EventsWorker

    _, pending = EventsWorker.drain_all(timeout=EVENTS_DRAIN_SECONDS)
    if pending:
        logging.getLogger(__name__).warning(
            "Prefect's events worker did not drain in %s s", EVENTS_DRAIN_SECONDS
        )


@pytest.fixture
def flow_env(
    request, monkeypatch, prefect_api, database_url, moto_endpoint, staging_bucket, warehouse
):
    """Settings the flows read from the environment, pointing at this test's services (and
    its warehouse: Redshift through the emulator when `warehouse` is parametrized so)."""
    monkeypatch.setenv("FLEET_DATABASE_URL", database_url)
    monkeypatch.setenv("FLEET_S3_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("FLEET_STAGING_URI", f"s3://{staging_bucket}/stage/")
    monkeypatch.setenv("FLEET_LEASE_TTL_SECONDS", "30")
    for name, value in request.node.stash.get(WAREHOUSE_SETTINGS, {}).items():
        monkeypatch.setenv(name, value)
    return database_url


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fault matrix's size and run time (every cell run, on any xdist worker). Here, not in
    tests/faults/conftest.py: under xdist the controller, which prints the summary, collects
    nothing, so it never loads that conftest and `make test-faults` printed no size."""
    cells = [
        report
        for report in terminalreporter.stats.get("passed", [])
        + terminalreporter.stats.get("failed", [])
        if report.when == "call"
        and "tests/faults/test_" in report.nodeid
        and "_matrix" in report.nodeid
    ]
    if cells:
        seconds = sum(report.duration for report in cells)
        failed = sum(report.failed for report in cells)
        terminalreporter.write_line(
            f"fault matrix: {len(cells)} cells run, {failed} failed, {seconds:.0f} s of cell time"
        )
