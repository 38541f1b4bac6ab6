"""The CLI as users run it against a real database: in this process (typer's runner), a
child process where the terminal's width is what is tested (rich reads it once, at start),
and with the flow replaced for the final state line of `run` and `resume`."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import uuid
from types import SimpleNamespace

import pytest
from alembic.script import ScriptDirectory
from prefect.states import Completed, Failed, State
from typer.testing import CliRunner

from fleet_cli.cli import app
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.details import FailureKind
from fleet_import.store.models import (
    Batch,
    Reserved,
)
from fleet_import.store.repository import BatchRepository
from tests import pgtools
from tests.cli.run_cli import Ran, invoke


def run_cli(*args: str, database_url: str, columns: int | None = None) -> Ran:
    """`columns`: the command in a child whose terminal is that wide."""
    if columns is None:
        return invoke(args, {"FLEET_DATABASE_URL": database_url})
    env = {**os.environ, "FLEET_DATABASE_URL": database_url, "COLUMNS": str(columns)}
    child = subprocess.run(
        [sys.executable, "-m", "fleet_cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return Ran(child.returncode, child.stdout, child.stderr)


def test_db_upgrade_then_batches_list(empty_database_url: str) -> None:
    upgraded = run_cli("db", "upgrade", database_url=empty_database_url)
    assert upgraded.returncode == 0, upgraded.stderr
    head = ScriptDirectory.from_config(pgtools.alembic_config(empty_database_url))
    assert f"revision {head.get_current_head()}" in upgraded.stdout
    again = run_cli("db", "upgrade", database_url=empty_database_url)
    assert again.returncode == 0, again.stderr

    repo = BatchRepository(empty_database_url)
    acme = repo.reserve(Tenant.named("acme"), source_scope("s3://fleet-landing/acme/a/"), "d1")
    globex = repo.reserve(
        Tenant.named("globex"), source_scope("s3://fleet-landing/globex/a/"), "d1"
    )
    repo.mark_failed(globex.batch.id, None, FailureKind.ENQUEUE_FAILED, "no worker")

    listed = run_cli("batches", "list", database_url=empty_database_url)
    assert listed.returncode == 0, listed.stderr
    assert str(acme.batch.id) in listed.stdout and str(globex.batch.id) in listed.stdout
    assert "failed (enqueue_failed)" in listed.stdout

    only_acme = run_cli("batches", "list", "--tenant", "acme", database_url=empty_database_url)
    assert str(acme.batch.id) in only_acme.stdout and "globex" not in only_acme.stdout
    failed = run_cli("batches", "list", "--status", "failed", database_url=empty_database_url)
    assert str(globex.batch.id) in failed.stdout and str(acme.batch.id) not in failed.stdout


def test_unreachable_database_is_a_clear_error(pg_server_url: str) -> None:
    from tests.pgtools import with_dbname

    result = run_cli("batches", "list", database_url=with_dbname(pg_server_url, "nope_missing"))
    assert result.returncode == 1
    assert "error:" in result.stderr and "operational database error" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_status_is_rejected(database_url: str) -> None:
    result = run_cli("batches", "list", "--status", "exploded", database_url=database_url)
    assert result.returncode == 2
    assert "exploded" in result.stderr


def test_usage_errors_exit_2(database_url: str) -> None:
    no_tenant = run_cli("run", "s3://fleet-landing/acme/a/", database_url=database_url)
    assert no_tenant.returncode == 2 and "--tenant" in no_tenant.stderr
    not_an_id = run_cli("batches", "show", "[/bold]", database_url=database_url)
    assert not_an_id.returncode == 2
    assert "'[/bold]' is not a batch id" in not_an_id.stderr, not_an_id.stderr


def test_batches_list_and_show_print_data_verbatim(database_url: str) -> None:
    """Rich markup in a scope, delivery key, file name, reject or failure is data."""
    repo = BatchRepository(database_url)
    scope = source_scope("s3://lz1/a/[bold]x/")  # short: no column is cut
    reserved = repo.reserve(Tenant.named("acme"), scope, "[/bold]")
    assert isinstance(reserved, Reserved)
    batch_id, owner = reserved.batch.id, f"test:{uuid.uuid4().hex}"
    repo.acquire_lease(batch_id, owner, 30)
    key = "s3://lz1/a/[bold]x/trips [bold]x.csv"
    reject = {"file": key, "line": 7, "column": "[/bold]", "reason": "[red]bad", "value": "[/red]"}
    repo.update_details(
        batch_id,
        owner,
        {
            "phase": "[/bold]",
            "summary": {
                "files": [
                    {"key": key, "dataset": "trips", "rows": 3, "rejects": 1, "cache_hit": False}
                ]
            },
            "rejects": {"count": 1, "uri": "s3://stage/[/red]/rejects.csv", "sample": [reject]},
        },
    )
    repo.mark_failed(batch_id, owner, FailureKind.FAILED_PRE_COMMIT, f"{key}: [/red] :fire:")

    listed = run_cli("batches", "list", database_url=database_url)
    assert listed.returncode == 0, listed.stderr
    assert scope in listed.stdout and "[/bold]" in listed.stdout, listed.stdout

    shown = run_cli("batches", "show", str(batch_id), database_url=database_url)
    assert shown.returncode == 0, shown.stderr
    for verbatim in (
        scope,
        "[/bold]",  # delivery key, phase, column
        "trips [bold]x.csv",
        "[red]bad",
        "[/red] :fire:",
        "(all: s3://stage/[/red]/rejects.csv)",
    ):
        assert verbatim in shown.stdout, (verbatim, shown.stdout)


# -- 80 columns, --json, id prefixes ---------------------------------------------------------


def _failed_publication(repo: BatchRepository, tenant: str, leaf: str, error: str) -> Batch:
    scope = source_scope(f"s3://fleet-landing/{tenant}/fleet/{leaf}/")
    reserved = repo.reserve(Tenant.named(tenant), scope, f"delivery-{uuid.uuid4()}")
    assert isinstance(reserved, Reserved)
    owner = f"flow-run-{uuid.uuid4()}:{uuid.uuid4().hex[:8]}"  # as long as a real owner
    repo.acquire_lease(reserved.batch.id, owner, 300)
    repo.mark_committed(reserved.batch.id, owner, row_counts={"trips": 12_345})
    return repo.mark_failed(reserved.batch.id, owner, FailureKind.FAILED_PUBLICATION, error)


def test_batches_list_reads_whole_in_80_columns(database_url: str) -> None:
    repo = BatchRepository(database_url)
    batches = [
        _failed_publication(repo, tenant, leaf, "division by zero")
        for tenant, leaf in (("acme-logistics", "2026-07-22"), ("globex", "2026-07-23"))
    ]

    narrow = run_cli("batches", "list", database_url=database_url, columns=80)
    assert narrow.returncode == 0, narrow.stderr
    lines = narrow.stdout.splitlines()
    assert "…" not in narrow.stdout and max(len(line) for line in lines) <= 80, narrow.stdout
    for batch in batches:
        created = batch.created_at.astimezone(dt.UTC).strftime("%m-%d %H:%M")
        (line,) = [line for line in lines if line.startswith(str(batch.id)[:8] + " ")]
        for whole in ("failed (failed_publication)", batch.tenant_id, created):
            assert whole in line, (whole, narrow.stdout)
        assert (batch.source_scope or "").endswith(f"/{line.split()[2]}/"), narrow.stdout
        assert str(batch.id) not in narrow.stdout  # the 8-digit prefix `show` takes back
    assert {"2026-07-22", "2026-07-23"} <= set(narrow.stdout.split())

    wide = run_cli("batches", "list", database_url=database_url)
    assert wide.returncode == 0, wide.stderr
    for batch in batches:
        assert str(batch.id) in wide.stdout and (batch.source_scope or "") in wide.stdout
    assert "12,345" in wide.stdout and "committed" in wide.stdout  # rows and phase


def test_json_is_all_that_is_printed(database_url: str) -> None:
    repo = BatchRepository(database_url)
    batch = _failed_publication(repo, "acme", "2026-07-22", "division by zero [/bold]")

    listed = run_cli("batches", "list", "--json", database_url=database_url)
    assert listed.returncode == 0, listed.stderr
    (record,) = json.loads(listed.stdout)
    assert record["id"] == str(batch.id) and record["status"] == "failed"
    assert record["failure_kind"] == "failed_publication" and record["rows"] == 12_345
    assert record["source_scope"] == batch.source_scope and record["phase"] == "committed"
    assert dt.datetime.fromisoformat(record["created_at"]) == batch.created_at
    assert record["execution_lease_expires_at"] is not None
    empty = run_cli("batches", "list", "--json", "--tenant", "nobody", database_url=database_url)
    assert json.loads(empty.stdout) == []

    shown = run_cli("batches", "show", str(batch.id)[:8], "--json", database_url=database_url)
    assert shown.returncode == 0, shown.stderr
    detail = json.loads(shown.stdout)
    assert detail.keys() >= record.keys() | {"details", "publication"}
    assert {k: detail[k] for k in record if k != "updated_at"} == {
        k: v for k, v in record.items() if k != "updated_at"
    }
    assert detail["details"]["failure"]["error"] == "division by zero [/bold]"
    assert detail["details"]["row_counts"] == {"trips": 12_345}


def test_show_takes_a_unique_id_prefix(database_url: str, db) -> None:
    repo = BatchRepository(database_url)
    ids = [_failed_publication(repo, "acme", leaf, "x").id for leaf in ("d1", "d2", "d3")]
    twins = ["abcd1234-0000-4000-8000-100000000000", "abcd1234-0000-4000-8000-200000000000"]
    for old, new in zip(ids, twins, strict=False):
        db.execute("UPDATE ingestion_batches SET id = %s WHERE id = %s", (new, old))

    shown = run_cli("batches", "show", str(ids[2])[:8], database_url=database_url)
    assert shown.returncode == 0, shown.stderr
    assert str(ids[2]) in shown.stdout
    unique = run_cli("batches", "show", "ABCD1234-0000-4000-8000-2", database_url=database_url)
    assert unique.returncode == 0 and twins[1] in unique.stdout, unique.stderr

    ambiguous = run_cli("batches", "show", "abcd1234", database_url=database_url)
    assert ambiguous.returncode == 2 and ambiguous.stdout == ""
    assert "'abcd1234' is ambiguous" in ambiguous.stderr
    assert twins[0] in ambiguous.stderr and twins[1] in ambiguous.stderr
    unknown = run_cli("batches", "show", "0000ffff", database_url=database_url)
    assert unknown.returncode == 2 and "no batch id starts with '0000ffff'" in unknown.stderr
    too_short = run_cli("batches", "show", "abc", database_url=database_url)
    assert too_short.returncode == 2 and "at least 4 hex digits" in too_short.stderr


def test_show_keeps_the_first_failure_beside_the_resume_and_expiry(database_url: str, db) -> None:
    repo = BatchRepository(database_url)
    batch = _failed_publication(repo, "acme", "2026-07-22", "division by zero")
    later = {
        "last_failure": batch.details["failure"],
        "resumes": 1,
        "publication_expired": True,
        "failure": {
            "kind": "failed_publication",
            "error": "publication expired: batch b owns the slice [/red]",
            "at": "2099-01-01T00:00:00.000000Z",
        },
        "summary": {
            "files": [
                {
                    "key": "s3://fleet-landing/acme/fleet/2026-07-22/trips-2026-07-22-0001.csv.gz",
                    "dataset": "trips",
                    "rows": 12_345,
                    "rejects": 0,
                    "cache_hit": False,
                }
            ]
        },
    }
    db.execute(
        "UPDATE ingestion_batches SET details = details || %s::jsonb WHERE id = %s",
        (json.dumps(later), batch.id),
    )

    shown = run_cli("batches", "show", str(batch.id), database_url=database_url, columns=80)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    labelled = [
        "failure before resume  failed_publication: division by zero",
        "resumes                1",
        "failure                failed_publication: publication expired",
        "publication expired    yes",
    ]
    where = [out.find(text) for text in labelled]
    assert -1 not in where and where == sorted(where), out  # labelled, newest last
    assert "[/red]" in out and "…" not in out  # a long file key wraps, whole


# -- the final state line of `run` and `resume` -----------------------------------------------

STATES = [
    (Completed(message="batch b succeeded: 3 trips"), 0),
    (
        Failed(
            message="failed_pre_commit: s3://b/a/trips [bold]x.csv: unexpected columns: [/bold]"
        ),
        1,
    ),
    (Failed(name="NotResumable", message="batch [b] already succeeded"), 1),
    (Completed(name="Skipped", message="fleet_s3:s3://b/[bold]a/ is held by batch h; skipped"), 3),
    (Completed(name="NotClaimed", message="batch b is executed by [/red]"), 3),
    (Completed(name="Committed", message="batch b committed [/bold]; publication is pending"), 4),
    (Completed(name="Unheard-of", message="a state the table does not know"), 1),
]


def _replace_flow(monkeypatch, module: str, name: str, state: State) -> None:
    """The CLI imports the flow when a command runs: a stand-in module returns `state`.
    The settings and the operational database it checks first are the test's own."""
    monkeypatch.setenv("FLEET_STAGING_URI", "s3://fleet-staging/stage/")
    monkeypatch.setitem(
        sys.modules, f"flows.{module}", SimpleNamespace(**{name: lambda **_: state})
    )


@pytest.mark.parametrize(("state", "code"), STATES, ids=[s.name for s, _ in STATES])
def test_run_prints_the_final_state_verbatim_and_exits_with_its_code(
    monkeypatch, state: State, code: int, database_url: str
) -> None:
    monkeypatch.setenv("FLEET_DATABASE_URL", database_url)
    _replace_flow(monkeypatch, "import_s3_folder", "import_s3_folder", state)
    result = CliRunner().invoke(app, ["run", "--tenant", "acme", "s3://fleet-landing/acme/a/"])
    assert result.exit_code == code, result.output
    assert result.stdout == f"{state.name}: {state.message}\n"


@pytest.mark.parametrize(("state", "code"), STATES, ids=[s.name for s, _ in STATES])
def test_resume_prints_the_final_state_verbatim_and_exits_with_its_code(
    monkeypatch, state: State, code: int, database_url: str
) -> None:
    monkeypatch.setenv("FLEET_DATABASE_URL", database_url)
    _replace_flow(monkeypatch, "resume_publication", "resume_publication", state)
    result = CliRunner().invoke(app, ["resume", str(uuid.uuid4())])
    assert result.exit_code == code, result.output
    assert result.stdout == f"{state.name}: {state.message}\n"
