"""The temporary Prefect API that `run` (and every command that runs a flow) starts when no
PREFECT_API_URL is set gets a start-up wait that holds on a busy 2-core machine; an
operator's own value wins (issue #28). Its failure's one line is tested through the CLI in
test_first_contact.py."""

from __future__ import annotations

import os

import pytest

from fleet_cli.guard import EPHEMERAL_STARTUP_TIMEOUT_SECONDS, prefect_ready

VARIABLE = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"


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
