"""The endpoint as commands serve it: beside the relay or a worker (`--metrics-port`,
`serving_metrics`) for as long as they run, and `fleet-import metrics serve` refusing a
port it cannot bind with the next step."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest

from fleet_cli.metrics_commands import serving_metrics
from tests.cli.run_cli import clean_environment, invoke


def test_serving_beside_a_command_while_it_runs(database_url: str) -> None:
    with clean_environment({"FLEET_DATABASE_URL": database_url}):
        with serving_metrics(0, "127.0.0.1") as port:
            assert port
            url = f"http://127.0.0.1:{port}/metrics"
            with urllib.request.urlopen(url, timeout=30) as response:
                text = response.read().decode()
            assert "fleet_import_store_up 1.0" in text
            assert "fleet_import_batches" in text
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(url, timeout=5)
        with serving_metrics(None) as nothing:
            assert nothing is None


def test_a_port_taken_is_refused_with_the_next_step(database_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ran = invoke(
            ["metrics", "serve", "--addr", "127.0.0.1", "--port", str(port)],
            {"FLEET_DATABASE_URL": database_url},
        )
    assert ran.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in ran.stderr
    assert "choose another --port" in ran.stderr
