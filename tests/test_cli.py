"""The CLI as users run it: a real subprocess against a real database (and in-process, with
the flow replaced, for the final state line of `run` and `resume`)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from types import SimpleNamespace

import pytest
from prefect.states import Completed, Failed, State
from typer.testing import CliRunner

from fleet_cli.cli import app
from fleet_import.batches import BatchRepository, FailureKind, Reserved
from fleet_import.scope import Tenant, source_scope


def run_cli(*args: str, database_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLEET_DATABASE_URL": database_url, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "fleet_cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_db_upgrade_then_batches_list(empty_database_url: str) -> None:
    upgraded = run_cli("db", "upgrade", database_url=empty_database_url)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "revision 0004" in upgraded.stdout
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
    """The CLI imports the flow when a command runs: a stand-in module returns `state`."""
    monkeypatch.setitem(
        sys.modules, f"flows.{module}", SimpleNamespace(**{name: lambda **_: state})
    )


@pytest.mark.parametrize(("state", "code"), STATES, ids=[s.name for s, _ in STATES])
def test_run_prints_the_final_state_verbatim_and_exits_with_its_code(
    monkeypatch, state: State, code: int
) -> None:
    _replace_flow(monkeypatch, "import_s3_folder", "import_s3_folder", state)
    result = CliRunner().invoke(app, ["run", "--tenant", "acme", "s3://b/a/"])
    assert result.exit_code == code, result.output
    assert result.stdout == f"{state.name}: {state.message}\n"


@pytest.mark.parametrize(("state", "code"), STATES, ids=[s.name for s, _ in STATES])
def test_resume_prints_the_final_state_verbatim_and_exits_with_its_code(
    monkeypatch, state: State, code: int
) -> None:
    _replace_flow(monkeypatch, "resume_publication", "resume_publication", state)
    result = CliRunner().invoke(app, ["resume", str(uuid.uuid4())])
    assert result.exit_code == code, result.output
    assert result.stdout == f"{state.name}: {state.message}\n"
