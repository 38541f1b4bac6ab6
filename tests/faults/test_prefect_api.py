"""The Prefect API gone during a flow run: `fleet-import run` as a process, its
PREFECT_API_URL pointing at a fault proxy in front of the test's Prefect API, which is cut
(every connection reset, new ones refused for a while) while the slice is being COPYed. The
import either completes and its run reports when the API is back, or fails with one line;
either way the batch is never left running with a live lease and no worker, and what the
exit code says is what the batch is."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from fleet_import.store.models import BatchStatus
from flows.reporting import ExitCode
from tests.faults.conftest import (
    CLI_TIMEOUT_SECONDS,
    REPO,
    batch_rows,
    recovered_invariants,
    run_cli,
)
from tests.faults.proxy import FaultProxy
from tests.reliability.conftest import Source, connect, refresh_count

pytestmark = [pytest.mark.faults, pytest.mark.slow]

OUTAGES = {"short": 5.0, "past-the-lease": 12.0}
"""Refused this long after the cut; the lease TTL is 4 s (tests/faults/conftest.py)."""
COPY_STALL_SECONDS = 4.0


@pytest.fixture
def prefect_proxy(cli_env: dict[str, str]) -> Iterator[FaultProxy]:
    parts = urlsplit(cli_env["PREFECT_API_URL"])
    with FaultProxy((parts.hostname or "127.0.0.1", parts.port or 80), protocol="raw") as proxy:
        yield proxy


def _through(url: str, proxy: FaultProxy) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"127.0.0.1:{proxy.port}"))


def _run_state(out: str) -> str | None:
    """The final state, as the Prefect API has it, of the flow run the CLI printed."""
    from prefect.client.orchestration import get_client

    [run_id] = set(re.findall(r"/runs/flow-run/([0-9a-f-]{36})", out))
    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).state_name


def _live_leases(database_url: str) -> list[str]:
    with connect(database_url) as conn:
        rows = conn.execute(
            "SELECT id::text FROM ingestion_batches WHERE status = 'running' "
            "AND execution_lease_id IS NOT NULL AND execution_lease_expires_at > now()"
        ).fetchall()
    return [row[0] for row in rows]


@pytest.mark.parametrize(
    "outage",
    [pytest.param("short", marks=pytest.mark.faults_sample), "past-the-lease"],
)
def test_the_prefect_api_cut_mid_run(
    cli_env: dict[str, str],
    warehouse_proxy: FaultProxy,
    prefect_proxy: FaultProxy,
    source: Source,
    database_url: str,
    outage: str,
) -> None:
    env = {**cli_env, "PREFECT_API_URL": _through(cli_env["PREFECT_API_URL"], prefect_proxy)}
    copying = warehouse_proxy.stall_on(r"^\s*copy\b", COPY_STALL_SECONDS)
    child = subprocess.Popen(
        [sys.executable, "-m", "fleet_cli", "run", "--tenant", "acme", source.folder],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert copying.wait(CLI_TIMEOUT_SECONDS), "the import never reached its COPY"
        prefect_proxy.refuse(OUTAGES[outage])
        prefect_proxy.reset_all()  # the API is gone, mid-run
        out, _ = child.communicate(timeout=CLI_TIMEOUT_SECONDS)
    finally:
        child.kill()
    prefect_proxy.pass_through()
    assert "Traceback" not in out, out
    assert _live_leases(database_url) == [], out  # no holder left behind the process
    [(_batch_id, status, _lease, details)] = batch_rows(database_url)
    if child.returncode == ExitCode.SUCCEEDED:  # and its run says so, the API being back
        assert status == BatchStatus.SUCCEEDED, out
        assert _run_state(out) == "Completed", out
    else:  # the one line names the Prefect API, and the batch is what it says
        assert child.returncode != ExitCode.SUCCEEDED and "Prefect API" in out, out
        assert status != BatchStatus.SUCCEEDED or "failure" not in details, out
    # Whatever the first run said, the next one leaves everything true.
    time.sleep(4.5)
    again = run_cli(cli_env, "run", "--tenant", "acme", source.folder)
    assert not again.traceback, again.out
    assert recovered_invariants(database_url, source) == []
    assert refresh_count(database_url) == 1
    print(f"first run: exit {child.returncode}, batch {status}; rerun: exit {again.returncode}")
