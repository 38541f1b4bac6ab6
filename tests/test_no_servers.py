"""The fast selection's promise: with FLEET_TEST_NO_SERVERS set (`make test-fast`), no way
the suite has of reaching or starting a server gets that far, the embedded PostgreSQL
fallback above all."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import pgtools
from tests.no_servers import NO_SERVERS_ENV, ServerRefused
from tests.prefect_server import prefect_server
from tests.s3fixtures import moto_server


@pytest.fixture
def no_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NO_SERVERS_ENV, "1")
    # Were the refusal missing, this would make the look-up start pgserver: nothing answers.
    monkeypatch.setenv("FLEET_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/postgres")


def test_no_server_is_reached_or_started(no_servers: None, tmp_path: Path) -> None:
    with pytest.raises(ServerRefused, match="PostgreSQL"):
        pgtools.server_url()
    with pytest.raises(ServerRefused, match="moto"), moto_server():
        pass
    with pytest.raises(ServerRefused, match="Prefect server"), prefect_server(tmp_path):
        pass


def test_this_test_is_in_the_fast_selection(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("fast") is not None
