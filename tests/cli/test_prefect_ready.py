"""The temporary Prefect API that `run` (and every command that runs a flow) starts when no
PREFECT_API_URL is set gets a start-up wait that holds on a busy 2-core machine; an
operator's own value wins (issue #28). Its telemetry is off: its report to Prefect's servers
logged an ERROR into the run's output (issue 40). Its failure's one line is tested through the
CLI in test_first_contact.py."""

from __future__ import annotations

import os

import pytest

import fleet_cli.guard
from fleet_cli.guard import EPHEMERAL_STARTUP_TIMEOUT_SECONDS, prefect_ready
from tests.cli.run_cli import FOLDER, closed_port_url, error_lines, fleet

VARIABLE = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
ANALYTICS = "PREFECT_SERVER_ANALYTICS_ENABLED"


def test_no_api_url_raises_the_temporary_servers_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv(VARIABLE, "")  # recorded, so that what prefect_ready sets is undone
    monkeypatch.delenv(VARIABLE)
    prefect_ready()
    assert os.environ[VARIABLE] == EPHEMERAL_STARTUP_TIMEOUT_SECONDS
    assert float(EPHEMERAL_STARTUP_TIMEOUT_SECONDS) >= 60  # Prefect's default was too short


def test_an_operators_wait_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv(VARIABLE, "300")
    prefect_ready()
    assert os.environ[VARIABLE] == "300"


@pytest.mark.parametrize(("given", "started_with"), [({}, "false"), ({ANALYTICS: "true"}, "true")])
def test_the_temporary_api_starts_without_telemetry(
    monkeypatch: pytest.MonkeyPatch, given: dict[str, str], started_with: str
) -> None:
    """Through `run`: what the environment holds once the checks before Prefect's start have
    passed (the temporary server inherits it), read where they end, at the database check:
    starting the server itself would take 15-27 s."""
    seen: dict[str, str | None] = {}
    services_ready = fleet_cli.guard.services_ready

    def spy(settings: object) -> None:
        seen.update((name, os.environ.get(name)) for name in (ANALYTICS, "PREFECT_API_URL"))
        services_ready(settings)  # type: ignore[arg-type]

    monkeypatch.setattr(fleet_cli.guard, "services_ready", spy)
    result, _ = fleet(
        "run", "--tenant", "acme", FOLDER, **given,
        FLEET_DATABASE_URL=closed_port_url(), FLEET_STAGING_URI="s3://fleet-staging/stage/",
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = error_lines(result)
    assert line.startswith("error: operational database error (OperationalError): could not")
    assert seen == {ANALYTICS: started_with, "PREFECT_API_URL": None}
