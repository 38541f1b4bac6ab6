"""Issue 40, "The first hour": what a new user meets in the first hour, through the command.

`resume` takes the 8-digit prefix `batches list` prints; `batches show` and `tenants show`
print words, not Python values; `slices list` says what each slice holds now. Each command
runs in this process (tests/cli/run_cli.py) against a real PostgreSQL; no flow runs here
(the stand-in for `resume`'s flow records what it was asked)."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from prefect.states import Completed

from fleet_import.scope import Tenant, source_scope
from fleet_import.store.details import FailureKind
from fleet_import.store.models import (
    Batch,
    Reserved,
)
from fleet_import.store.repository import BatchRepository
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse
from tests import pgtools
from tests.cli.run_cli import Ran, closed_port_url, fleet

FOLDER = "s3://fleet-landing/{tenant}/fleet/2026-07-22/"


def _env(database_url: str, **extra: str) -> dict[str, str]:
    return {
        "FLEET_DATABASE_URL": database_url,
        "FLEET_STAGING_URI": "s3://fleet-staging/stage/",
        **extra,
    }


def _no_traceback(ran: Ran) -> None:
    assert "Traceback" not in ran.stdout + ran.stderr, ran.stdout + ran.stderr


def _failed_publication(repo: BatchRepository, tenant: str = "acme") -> Batch:
    reserved = repo.reserve(
        Tenant.named(tenant), source_scope(FOLDER.format(tenant=tenant)), f"d-{uuid.uuid4()}"
    )
    assert isinstance(reserved, Reserved)
    owner = f"test:{uuid.uuid4().hex}"
    repo.acquire_lease(reserved.batch.id, owner, 300)
    repo.mark_committed(reserved.batch.id, owner, row_counts={"trips": 12_345, "vehicles": 40})
    return repo.mark_failed(reserved.batch.id, owner, FailureKind.FAILED_PUBLICATION, "boom")


# -- resume takes a prefix ------------------------------------------------------------------


@pytest.fixture
def resumed(monkeypatch) -> list[str]:
    """The resume-publication flow replaced: the batch ids it was asked to resume."""
    asked: list[str] = []

    def resume_publication(*, batch_id: str, return_state: bool) -> Any:
        asked.append(batch_id)
        return Completed(message=f"batch {batch_id} published")

    stand_in = SimpleNamespace(resume_publication=resume_publication)
    monkeypatch.setitem(sys.modules, "flows.resume_publication", stand_in)
    return asked


def test_resume_takes_the_8_digit_prefix_batches_list_prints(
    database_url: str, db: psycopg.Connection[Any], resumed: list[str]
) -> None:
    batch = _failed_publication(BatchRepository(database_url))
    prefix = str(batch.id)[:8]
    assert prefix == "00000001"  # ordered ids: a new database's first batch

    ran, cpu_seconds = fleet("resume", prefix, **_env(database_url))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert resumed == [str(batch.id)]
    assert ran.stdout == f"Completed: batch {batch.id} published\n"
    _no_traceback(ran)
    assert cpu_seconds < 10


def test_resume_refuses_an_unknown_or_ambiguous_prefix_in_one_line(
    database_url: str, db: psycopg.Connection[Any], resumed: list[str]
) -> None:
    repo = BatchRepository(database_url)
    twins = ["abcd1234-0000-4000-8000-100000000000", "abcd1234-0000-4000-8000-200000000000"]
    for twin in twins:
        old = _failed_publication(repo).id
        db.execute("UPDATE ingestion_batches SET id = %s WHERE id = %s", (twin, old))

    unknown, _ = fleet("resume", "0000ffff", **_env(database_url))
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert unknown.stderr == "error: no batch id starts with '0000ffff'\n"
    ambiguous, _ = fleet("resume", "abcd1234", **_env(database_url))
    assert ambiguous.returncode == 2 and ambiguous.stdout == ""
    (line,) = ambiguous.stderr.splitlines()
    assert line.startswith("error: 'abcd1234' is ambiguous: batches ") and twins[1] in line
    not_an_id, _ = fleet("resume", "not-a-uuid", **_env(database_url))
    assert not_an_id.returncode == 2 and "'not-a-uuid' is not a batch id" in not_an_id.stderr
    for ran in (unknown, ambiguous, not_an_id):
        _no_traceback(ran)
    assert resumed == []  # no flow started


# -- batches show and tenants show print words ---------------------------------------------


def test_batches_show_prints_rows_per_dataset_and_yes_no(database_url: str) -> None:
    repo = BatchRepository(database_url)
    committed = _failed_publication(repo)
    shown, _ = fleet("batches", "show", str(committed.id)[:8], **_env(database_url))
    assert shown.returncode == 0, shown.stderr
    lines = {
        label: value.strip()
        for label, _, value in (line.partition("  ") for line in shown.stdout.splitlines())
    }
    assert lines["committed"] == "yes"
    assert lines["rows"] == "trips 12,345, vehicles 40"
    assert lines["created"].endswith(" UTC") and "+00:00" not in shown.stdout

    globex = source_scope(FOLDER.format(tenant="globex"))
    reserved = repo.reserve(Tenant.named("globex"), globex, "d")
    assert isinstance(reserved, Reserved)
    fresh, _ = fleet("batches", "show", str(reserved.batch.id), **_env(database_url))
    assert fresh.returncode == 0, fresh.stderr
    assert "committed  no" in fresh.stdout and "rows       none yet" in fresh.stdout
    for python in ("{}", "False", "True", "None"):
        assert python not in shown.stdout + fresh.stdout, python
    _no_traceback(fresh)


def test_tenants_show_says_which_database_and_why(tmp_path: Path) -> None:
    registry = tmp_path / "tenants.yaml"
    registry.write_text("tenants:\n  acme: {}\n  globex: {database: globex_dw}\n")
    env = {"FLEET_TENANTS": str(registry), "FLEET_WAREHOUSE_URL": "postgresql://u@h/dw"}

    shared, _ = fleet("tenants", "show", "acme", **env)
    assert shared.returncode == 0, shared.stderr
    assert "warehouse database: dw (the shared warehouse database)\n" in shared.stdout
    own, _ = fleet("tenants", "show", "globex", **env)
    assert "warehouse database: globex_dw (its own, as the tenant registry names it)\n" in (
        own.stdout
    )
    unregistered, _ = fleet("tenants", "show", "acme", FLEET_WAREHOUSE_URL="postgresql://u@h/dw")
    assert "registry: none (FLEET_TENANTS is unset)" in unregistered.stdout
    for ran in (shared, own, unregistered):
        assert ran.returncode == 0, ran.stderr
        assert "enabled: yes\n" in ran.stdout and "overrides: none\n" in ran.stdout
        for python in ("None", "True", "False", "[]", "{}"):
            assert python not in ran.stdout, (python, ran.stdout)
        _no_traceback(ran)


# -- slices list ----------------------------------------------------------------------------


def _register(url: str, tenant: str, batch: uuid.UUID, rows: dict[str, int]) -> None:
    """A slice in the registry of the warehouse at `url`, as a commit records it."""
    PostgresWarehouse(url).ensure_tables([])  # the registry
    with psycopg.connect(url, autocommit=True) as conn:
        for dataset, count in rows.items():
            conn.execute(
                "INSERT INTO curated.ingestion_slices (tenant_id, source_scope, dataset, "
                "batch_id, row_count, committed_at, target_table) VALUES "
                "(%s, %s, %s, %s, %s, '2026-07-22 06:30:00+00', %s)",
                (tenant, source_scope(FOLDER.format(tenant=tenant)), dataset, str(batch), count,
                 f"curated.fleet_{dataset}"),
            )


def test_slices_list_says_so_when_nothing_is_loaded(database_url: str) -> None:
    env = _env(database_url, FLEET_WAREHOUSE_URL="")
    empty, _ = fleet("slices", "list", **env)  # no registry yet: a first hour's warehouse
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.startswith("no slice loaded yet (the slice registry is empty): ")
    assert "fleet-import run --tenant TENANT FOLDER" in empty.stdout
    PostgresWarehouse(database_url).ensure_tables([])
    none_for_acme, _ = fleet("slices", "list", "--tenant", "acme", **env)
    assert none_for_acme.returncode == 0, none_for_acme.stderr
    assert none_for_acme.stdout.startswith("tenant acme has no slice loaded yet: ")
    as_json, _ = fleet("slices", "list", "--json", **env)
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == []
    for ran in (empty, none_for_acme, as_json):
        _no_traceback(ran)


def test_slices_list_shows_each_slice_from_every_tenant_database(
    pg_server_url: str, database_url: str, tmp_path: Path
) -> None:
    """acme's slice is in the shared database, globex's in its own (the registry's)."""
    name = pgtools.unique_name("globex_dw")
    globex_url = pgtools.create_database(pg_server_url, name)
    try:
        acme, globex = uuid.uuid4(), uuid.uuid4()
        _register(database_url, "acme", acme, {"trips": 5_003, "vehicles": 40})
        _register(globex_url, "globex", globex, {"trips": 12})
        registry = tmp_path / "tenants.yaml"
        registry.write_text(f"tenants:\n  acme: {{}}\n  globex: {{database: {name}}}\n")
        env = _env(database_url, FLEET_WAREHOUSE_URL="", FLEET_TENANTS=str(registry))

        listed, _ = fleet("slices", "list", **env)
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert lines[0].split() == ["tenant", "folder", "batch", "rows", "loaded", "UTC"]
        assert lines[1].split() == [
            "acme", FOLDER.format(tenant="acme"), str(acme)[:8], "trips", "5,003",
            "2026-07-22", "06:30",
        ]  # fmt: skip
        assert lines[2].split() == ["vehicles", "40"]  # the slice's next dataset
        assert lines[3].split() == [
            "globex", FOLDER.format(tenant="globex"), str(globex)[:8], "trips", "12",
            "2026-07-22", "06:30",
        ]  # fmt: skip
        assert str(acme) not in listed.stdout

        only, _ = fleet("slices", "list", "--tenant", "globex", "--json", **env)
        assert only.returncode == 0, only.stderr
        (record,) = json.loads(only.stdout)
        assert record == {
            "tenant_id": "globex",
            "folder": FOLDER.format(tenant="globex"),
            "source_scope": source_scope(FOLDER.format(tenant="globex")),
            "batch_id": str(globex),
            "rows": {"trips": 12},
            "loaded_at": "2026-07-22T06:30:00+00:00",
            "database": name,
        }
        for ran in (listed, only):
            _no_traceback(ran)
    finally:
        pgtools.drop_database(pg_server_url, name)


def test_slices_list_usage_errors_say_what_to_give(database_url: str) -> None:
    bad, _ = fleet("slices", "list", "--tenant", "Not A Slug", **_env(database_url))
    (line,) = bad.stderr.splitlines()
    assert line.startswith("error: ") and "Not A Slug" in line
    template = f"{database_url.rsplit('/', 1)[0]}/{{database}}"
    unknown, _ = fleet("slices", "list", **_env(database_url, FLEET_WAREHOUSE_URL=template))
    (line,) = unknown.stderr.splitlines()
    assert line.startswith("error: the warehouse names a database per tenant") and (
        line.endswith("give --tenant")
    )
    for ran in (bad, unknown):
        assert ran.returncode == 2 and ran.stdout == ""
        _no_traceback(ran)


@pytest.mark.parametrize("warehouse_url_set", [False, True])
def test_slices_list_names_the_setting_its_warehouse_comes_from(
    warehouse_url_set: bool,
) -> None:
    """With FLEET_WAREHOUSE_URL unset the warehouse is FLEET_DATABASE_URL's database, and a
    warehouse that does not answer says so: the line asked whether FLEET_WAREHOUSE_URL, a
    variable the user never set, was right."""
    url = closed_port_url()
    setting = "FLEET_WAREHOUSE_URL" if warehouse_url_set else "FLEET_DATABASE_URL"
    ran, _ = fleet("slices", "list", **_env(url, **({setting: url} if warehouse_url_set else {})))
    assert ran.returncode == 1 and ran.stdout == "", ran.stdout
    (line,) = ran.stderr.splitlines()
    assert line == (
        f"error: warehouse error (OperationalError): could not reach the warehouse at "
        f"127.0.0.1:{urlsplit(url).port} (is it up, is {setting} right, are there free "
        f"connections?): check {setting} (host:port) and that the server runs"
    )
    _no_traceback(ran)


# -- the demo says how to start clean -------------------------------------------------------


def test_demo_fresh_deletes_only_what_the_demo_keeps(tmp_path: Path) -> None:
    from flows.demo import NotADemoHome, clear_demo_home

    home = tmp_path / ".fleet-demo"
    assert clear_demo_home(home) is False  # nothing to delete
    for directory in ("pgdata", "prefect", "work"):
        (home / directory).mkdir(parents=True)
    (home / "pgdata" / "PG_VERSION").write_text("16\n")
    (home / "tenants.yaml").write_text("tenants: {}\n")
    assert clear_demo_home(home) is True and not home.exists()

    (home / "pgdata").mkdir(parents=True)
    (home / "notes.txt").write_text("mine\n")
    with pytest.raises(NotADemoHome, match=r"notes\.txt"):
        clear_demo_home(home)
    assert (home / "notes.txt").exists() and (home / "pgdata").exists()


def test_the_demo_says_how_to_start_clean(tmp_path: Path, capsys) -> None:
    from flows.demo import earlier_runs_note, run_demo, start_clean_hint

    home = tmp_path / ".fleet-demo"
    for said in (start_clean_hint(home), earlier_runs_note(home)):
        assert "fleet-import demo --fresh" in said and f"deletes {home}" in said
    assert earlier_runs_note(home).startswith(f"{home} holds the batches of earlier demo runs")

    home.mkdir()
    (home / "notes.txt").write_text("mine\n")
    assert run_demo(home, fresh=True) == 1  # refused before any service starts
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {home} holds more than the demo writes (notes.txt)")


def test_demo_fresh_through_the_command(monkeypatch) -> None:
    import flows.demo

    asked: list[bool] = []

    def run_demo(*, fresh: bool = False) -> int:
        asked.append(fresh)
        return 0

    monkeypatch.setattr(flows.demo, "run_demo", run_demo)
    fresh, _ = fleet("demo", "--fresh")
    plain, _ = fleet("demo")
    assert fresh.returncode == plain.returncode == 0, fresh.stderr + plain.stderr
    assert asked == [True, False]
    helped, _ = fleet("demo", "--help")
    assert helped.returncode == 0 and "--fresh" in helped.stdout
    for ran in (fresh, plain, helped):
        _no_traceback(ran)
