"""`batches approve / reject` and `slices rollback` go through the guard every command does
first (fleet_cli/guard.py): settings before anything starts (exit 78), then the operational
database, each failure one line with the next step, no traceback, secrets never echoed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.run_cli import (
    CPU_BOUND_SECONDS,
    FOLDER,
    SECRET,
    assert_refused,
    closed_port_url,
    error_lines,
    fleet,
)

BATCH = "00000000-0000-0000-0000-000000000001"
REVIEW_COMMANDS = {
    "approve": ("batches", "approve", BATCH),
    "reject": ("batches", "reject", BATCH),
    "rollback": ("slices", "rollback", "--tenant", "acme", FOLDER),
}


@pytest.mark.parametrize("command", REVIEW_COMMANDS)
def test_settings_are_checked_before_anything_starts(command: str, tmp_path: Path) -> None:
    result, cpu_seconds = fleet(
        *REVIEW_COMMANDS[command],
        FLEET_DATABASE_URL="mysql://root:hunter2@db/fleet",
        PREFECT_HOME=str(tmp_path / "prefect"),
    )
    assert_refused(
        result,
        cpu_seconds,
        "error: FLEET_DATABASE_URL: expected a PostgreSQL URL",
        "error: FLEET_STAGING_URI: not set",
    )
    assert len(error_lines(result)) == 2
    assert "hunter2" not in result.stderr
    assert not (tmp_path / "prefect").exists()  # Prefect was never started


@pytest.mark.parametrize("command", REVIEW_COMMANDS)
def test_the_database_option_is_checked_too(command: str) -> None:
    args = REVIEW_COMMANDS[command]
    result, cpu_seconds = fleet(
        *args[:2], "--database-url", "postgres//nohost", *args[2:],
        FLEET_STAGING_URI="s3://fleet-staging/stage/",
    )
    assert_refused(result, cpu_seconds, "error: FLEET_DATABASE_URL: expected a PostgreSQL URL")


@pytest.mark.parametrize("command", REVIEW_COMMANDS)
def test_an_unreachable_database_is_one_line(command: str, tmp_path: Path) -> None:
    result, cpu_seconds = fleet(
        *REVIEW_COMMANDS[command],
        FLEET_DATABASE_URL=closed_port_url(),
        FLEET_STAGING_URI="s3://fleet-staging/stage/",
        PREFECT_HOME=str(tmp_path / "prefect"),
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    (line,) = error_lines(result)
    assert line.startswith("error: operational database error"), line
    assert line.endswith("check FLEET_DATABASE_URL (host:port) and that the server runs")
    assert SECRET not in result.stderr
    assert not (tmp_path / "prefect").exists()
    assert cpu_seconds < CPU_BOUND_SECONDS


@pytest.mark.parametrize("command", REVIEW_COMMANDS)
def test_an_unmigrated_database_says_run_db_upgrade(
    command: str, empty_database_url: str, tmp_path: Path
) -> None:
    result, cpu_seconds = fleet(
        *REVIEW_COMMANDS[command],
        FLEET_DATABASE_URL=empty_database_url,
        FLEET_STAGING_URI="s3://fleet-staging/stage/",
        PREFECT_HOME=str(tmp_path / "prefect"),
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    (line,) = error_lines(result)
    assert line.startswith("error: operational database: never migrated"), line
    assert line.endswith(": run `fleet-import db upgrade`")
    assert not (tmp_path / "prefect").exists()
    assert cpu_seconds < CPU_BOUND_SECONDS
