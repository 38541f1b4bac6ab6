"""A new user's first mistakes, made through the real command (in this process; a child
where Prefect's own start is what is tested): every
misconfiguration is refused before anything starts, all problems at once, one line each,
exit 78, no traceback, quickly; a service that does not answer is one line with the next
step; and under the flow the run ends Failed with that line, not Prefect's wrapper."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
from alembic.script import ScriptDirectory

from tests import pgtools
from tests.cli.run_cli import (
    CONFIGURATION_ERROR,
    CPU_BOUND_SECONDS,
    FOLDER,
    SECRET,
    assert_refused,
    error_lines,
    fleet,
)
from tests.cli.run_cli import closed_port_url as _closed_port_url
from tests.prefect_server import free_port


def test_run_names_every_problem_at_once_before_starting_anything(tmp_path: Path) -> None:
    result, cpu_seconds = fleet(
        "run", "--tenant", "acme", FOLDER,
        FLEET_DATABASE_URL="mysql://root:hunter2@db/fleet",
        FLEET_LEASE_TTL_SECONDS="soon",
        FLEET_S3_ENDPOINT_URL="localhost:9000",
        PREFECT_HOME=str(tmp_path / "prefect"),
    )
    assert_refused(
        result,
        cpu_seconds,
        "error: FLEET_LEASE_TTL_SECONDS: input should be a valid number",
        "error: FLEET_DATABASE_URL: expected a PostgreSQL URL like postgresql://user@host:5432/"
        "dbname, got a mysql:// URL",
        "error: FLEET_STAGING_URI: not set: an s3://bucket/prefix/ (or a local directory)",
        "error: FLEET_S3_ENDPOINT_URL: expected an http(s) URL like http://host:9000",
    )
    assert len(error_lines(result)) == 4
    assert "hunter2" not in result.stderr  # a value is never echoed: it may hold a password
    assert not (tmp_path / "prefect").exists()  # Prefect was never started


def test_a_contract_file_is_read_before_prefect_starts(tmp_path: Path) -> None:
    contracts = tmp_path / "contracts.yaml"
    contracts.write_text(
        "datasets:\n  - name: tyre_changes\n    file_glob: 'tyres*'\n    natual_key: [id]\n"
    )
    result, cpu_seconds = fleet(
        "resume", "00000000-0000-0000-0000-000000000001",
        FLEET_CONTRACTS=str(contracts),
        FLEET_STAGING_URI="s3://fleet-staging/stage/",
    )
    assert_refused(result, cpu_seconds, "error: FLEET_CONTRACTS: ", "unknown field")
    assert len(error_lines(result)) == 1


def test_redshift_settings_are_checked_together() -> None:
    result, cpu_seconds = fleet(
        "run", "--tenant", "acme", FOLDER,
        FLEET_WAREHOUSE="redshift",
        FLEET_STAGING_URI="/tmp/local-staging",
    )
    assert_refused(
        result,
        cpu_seconds,
        "error: FLEET_REDSHIFT_HOST: not set",
        "error: FLEET_REDSHIFT_IAM_ROLE: not set",
        "error: FLEET_REDSHIFT_STAGING_URI: expected an s3://bucket/prefix/",
    )


def test_a_malformed_staging_uri_and_prefect_url() -> None:
    result, cpu_seconds = fleet(
        "run", "--tenant", "acme", FOLDER,
        FLEET_STAGING_URI="s3://B/stage/",
        PREFECT_API_URL="127.0.0.1:4200/api",
    )
    assert_refused(
        result,
        cpu_seconds,
        "error: FLEET_STAGING_URI: expected s3://bucket/prefix/",
        "error: PREFECT_API_URL: expected an http(s) URL like http://host:4200/api",
    )


def test_batches_and_relay_check_their_settings_too() -> None:
    batches, cpu_seconds = fleet("batches", "list", FLEET_DATABASE_URL="postgres//nohost")
    assert_refused(batches, cpu_seconds, "error: FLEET_DATABASE_URL: expected a PostgreSQL URL")
    relay, cpu_seconds = fleet("relay", "--queue-url", "fleet-landing", "--once")
    assert_refused(relay, cpu_seconds, "error: FLEET_RELAY_QUEUE_URL (--queue-url): expected")


def test_an_unreachable_database_is_one_line_with_the_next_step() -> None:
    """It names the host:port it tried (a connection refused has no SQLSTATE to show)."""
    url = _closed_port_url()
    result, cpu_seconds = fleet(
        "run", "--tenant", "acme", FOLDER, FLEET_DATABASE_URL=url,
        FLEET_STAGING_URI="s3://fleet-staging/stage/",
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert error_lines(result) == [
        f"error: operational database error (OperationalError): could not connect to "
        f"127.0.0.1:{urlsplit(url).port} (is the server up, is FLEET_DATABASE_URL right, are "
        "there free connections?): check FLEET_DATABASE_URL (host:port) and that the server runs"
    ]
    assert "s3cret-pw" not in result.stderr
    assert cpu_seconds < CPU_BOUND_SECONDS


def test_an_unmigrated_database_says_run_db_upgrade(empty_database_url: str) -> None:
    result, cpu_seconds = fleet("batches", "list", FLEET_DATABASE_URL=empty_database_url)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    (line,) = error_lines(result)
    assert 'relation "ingestion_batches" does not exist' in line
    assert line.endswith(": run `fleet-import db upgrade`")
    assert cpu_seconds < CPU_BOUND_SECONDS

    debug, _ = fleet("--debug", "batches", "list", FLEET_DATABASE_URL=empty_database_url)
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    env_debug, _ = fleet("batches", "list", FLEET_DATABASE_URL=empty_database_url, FLEET_DEBUG="1")
    assert "Traceback" in env_debug.stderr
    assert error_lines(env_debug)[-1] == line


def test_a_prefect_api_that_does_not_answer(database_url: str) -> None:
    result, cpu_seconds = fleet(
        "run", "--tenant", "acme", FOLDER,
        FLEET_DATABASE_URL=database_url,
        FLEET_STAGING_URI="s3://fleet-staging/stage/",
        PREFECT_API_URL=f"http://127.0.0.1:{free_port()}/api",
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    (line,) = error_lines(result)
    assert line.startswith("error: the Prefect API at PREFECT_API_URL does not answer")
    assert "unset it to run on a temporary local API" in line
    assert cpu_seconds < CPU_BOUND_SECONDS


def test_a_command_that_reads_the_store_says_no_block_was_read(database_url: str) -> None:
    """batches list needs no Prefect, yet a registered block may name its database: with
    the API down it says that it read none, instead of quietly listing another database."""
    result, _ = fleet(
        "batches", "list",
        FLEET_DATABASE_URL=database_url,
        PREFECT_API_URL=f"http://127.0.0.1:{free_port()}/api",
    )
    assert result.returncode == 0, result.stderr
    (warning,) = error_lines(result)
    assert warning.startswith("warning: the Prefect API at http://127.0.0.1:"), warning
    assert "no Prefect block was read" in warning


@pytest.mark.usefixtures("prefect_api")
def test_under_the_flow_the_run_fails_with_that_line(
    monkeypatch: pytest.MonkeyPatch, database_url: str
) -> None:
    from flows.import_s3_folder import import_s3_folder
    from flows.resume_publication import resume_publication

    monkeypatch.delenv("FLEET_STAGING_URI", raising=False)
    monkeypatch.setenv("FLEET_DATABASE_URL", database_url)
    state = import_s3_folder(tenant_id="acme", folder=FOLDER, return_state=True)
    assert state.is_failed()
    assert state.message.startswith("FLEET_STAGING_URI: not set")

    monkeypatch.setenv("FLEET_STAGING_URI", "s3://fleet-staging/stage/")
    monkeypatch.setenv("FLEET_DATABASE_URL", _closed_port_url())
    for state in (
        import_s3_folder(tenant_id="acme", folder=FOLDER, return_state=True),
        resume_publication(batch_id="00000000-0000-0000-0000-000000000001", return_state=True),
    ):
        assert state.is_failed()
        assert "encountered an exception" not in state.message
        assert state.message.endswith(
            "check FLEET_DATABASE_URL (host:port) and that the server runs"
        )


def test_the_temporary_prefect_api_that_does_not_start_says_how_to_point_at_a_server(
    database_url: str, tmp_path: Path
) -> None:
    result, cpu_seconds = fleet(
        "run", "--tenant", "acme", FOLDER,
        FLEET_DATABASE_URL=database_url,
        FLEET_STAGING_URI=str(tmp_path / "staging"),
        PREFECT_HOME=str(tmp_path / "prefect"),
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="1",  # a start that cannot finish
        in_child=True,  # Prefect reads its own settings once, from a fresh environment
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert (
        "error: the temporary Prefect API did not start within 1 s: start one "
        "(`prefect server start`) and set PREFECT_API_URL=http://127.0.0.1:4200/api"
    ) in error_lines(result)


def test_an_unmigrated_database_stops_run_before_prefect(
    empty_database_url: str, tmp_path: Path
) -> None:
    result, cpu_seconds = fleet(
        "run", "--tenant", "acme", FOLDER,
        FLEET_DATABASE_URL=empty_database_url,
        FLEET_STAGING_URI="s3://fleet-staging/stage/",
        PREFECT_HOME=str(tmp_path / "prefect"),
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    head = ScriptDirectory.from_config(pgtools.alembic_config(empty_database_url))
    assert error_lines(result) == [
        f"error: operational database: never migrated, head is {head.get_current_head()}: "
        "run `fleet-import db upgrade`"
    ]
    assert not (tmp_path / "prefect").exists()
    assert cpu_seconds < CPU_BOUND_SECONDS


def test_the_configuration_exit_code_is_the_one_in_the_table() -> None:
    from fleet_cli.guard import CONFIGURATION_ERROR as guard_code
    from flows.reporting import ExitCode

    assert ExitCode.CONFIGURATION_ERROR == guard_code == CONFIGURATION_ERROR


def test_an_unreachable_warehouse_is_one_line_naming_its_variable(database_url: str) -> None:
    """FLEET_WAREHOUSE_URL alone: the line once asked whether FLEET_DATABASE_URL was right."""
    url = _closed_port_url()
    result, cpu_seconds = fleet(
        "run", "--tenant", "acme", FOLDER,
        FLEET_DATABASE_URL=database_url,
        FLEET_WAREHOUSE_URL=url,
        FLEET_STAGING_URI="s3://fleet-staging/stage/",
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert error_lines(result) == [
        f"error: warehouse error (OperationalError): could not reach the warehouse at "
        f"127.0.0.1:{urlsplit(url).port} (is it up, is FLEET_WAREHOUSE_URL right, are there "
        "free connections?): check FLEET_WAREHOUSE_URL (host:port) and that the server runs"
    ]
    assert "s3cret-pw" not in result.stderr
    assert cpu_seconds < CPU_BOUND_SECONDS


STAGING = "s3://fleet-staging/stage/"
PREFLIGHT = {  # what `run` checks before its flow, broken: (env, exit code, error raised)
    "settings": lambda _: (
        {"FLEET_DATABASE_URL": f"mysql://root:{SECRET}@db/fleet"},
        CONFIGURATION_ERROR,
        "SettingsInvalid",
    ),
    "Prefect API": lambda _: (
        {"FLEET_STAGING_URI": STAGING, "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"},
        1,
        "httpx.ConnectError",
    ),
    "operational database": lambda _: (
        {"FLEET_STAGING_URI": STAGING, "FLEET_DATABASE_URL": _closed_port_url()},
        1,
        "OperationalStoreError",
    ),
    "warehouse": lambda database_url: (
        {
            "FLEET_STAGING_URI": STAGING,
            "FLEET_DATABASE_URL": database_url,
            "FLEET_WAREHOUSE_URL": _closed_port_url(),
        },
        1,
        "WarehouseError",
    ),
}


@pytest.mark.parametrize("failure", PREFLIGHT)
def test_debug_adds_the_traceback_to_a_preflight_failure(failure: str, database_url: str) -> None:
    """README: `--debug` (or FLEET_DEBUG=1) adds the traceback to a foreseen error's line;
    the checks before the flow printed their lines alone."""
    env, code, raised = PREFLIGHT[failure](database_url)
    plain, _ = fleet("run", "--tenant", "acme", FOLDER, **env)
    assert plain.returncode == code and "Traceback" not in plain.stderr
    lines = error_lines(plain)
    assert lines and all(line.startswith("error: ") for line in lines), lines
    for shown in (
        fleet("--debug", "run", "--tenant", "acme", FOLDER, **env)[0],
        fleet("run", "--tenant", "acme", FOLDER, FLEET_DEBUG="1", **env)[0],
    ):
        assert shown.returncode == code
        assert shown.stderr.startswith("Traceback (most recent call last):"), shown.stderr
        assert f"{raised}: " in shown.stderr
        assert error_lines(shown)[-len(lines) :] == lines  # then the same lines
        assert SECRET not in shown.stderr
