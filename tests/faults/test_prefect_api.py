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
    LEASE_TTL_SECONDS,
    REPO,
    batch_rows,
    recovered_invariants,
    run_cli,
)
from tests.faults.proxy import FaultProxy
from tests.reliability.conftest import REFRESH_SQL, Source, connect, refresh_count

pytestmark = [pytest.mark.faults, pytest.mark.slow]

OUTAGES = {"short": 5.0, "past-the-lease": 12.0}
"""Refused this long after the cut; the lease TTL is 4 s (tests/faults/conftest.py)."""
COPY_STALL_SECONDS = 4.0
CLIENT_RETRIES = "1"
"""PREFECT_CLIENT_MAX_RETRIES for the outage past them: one retry after 2 s (jittered), not
the default 5 (2+4+8+16+32 s): the same httpx.ConnectError at the end, a minute sooner."""
GONE_SECONDS = 600.0
"""Past the client's retries: the API stays refused until the command has ended."""
ENDS_WITHIN_SECONDS = 45.0
"""After the cut; before the fix the exit alone waited about 7 s per undelivered event."""
LOAD_SLOTS_ON = {"FLEET_WAREHOUSE_LOAD_SLOTS": "4", "FLEET_TENANT_LOAD_SLOTS": "2"}
"""The load slots, off in the suite (the test API frees no dead holder's slot), on where the
API is cut before they are taken: nothing is held when the API goes."""
CUT_AT = {  # the warehouse statement held while the API is cut, and how the batch ends
    # before the load, with load slots on: none can be taken, so it fails before commit
    "claim": (r"from\s+\S*ingestion_slices", BatchStatus.FAILED),
    # a progress update inside the slice load is the next API call
    "copy": (r"^\s*copy\b", BatchStatus.SUCCEEDED),
    # only the artifacts and the final state remain
    "publication": (re.escape(REFRESH_SQL), BatchStatus.SUCCEEDED),
}


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


@pytest.mark.parametrize("outage", ["short", "past-the-lease"])  # `make test-faults` only
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


@pytest.mark.parametrize(
    "phase", ["claim", "copy", "publication"]
)
def test_the_prefect_api_gone_past_its_client_retries(
    cli_env: dict[str, str],
    warehouse_proxy: FaultProxy,
    prefect_proxy: FaultProxy,
    source: Source,
    database_url: str,
    phase: str,
) -> None:
    """The API cut, and refused until `fleet-import run` has ended. The import's work does
    not need it, so once loading the batch succeeds once; before the load it cannot take a
    load slot and fails before commit. Either way the command ends within a bound and says
    in one line what the batch is and that its run could not be reported, exit code the
    batch's. Before: a progress update raised inside the slice load and failed the batch
    (ConnectError), the engine's traceback was printed with exit 1 for a batch that had
    succeeded, and the exit waited out every queued event (~7 s each)."""
    env = {
        **cli_env,
        "PREFECT_API_URL": _through(cli_env["PREFECT_API_URL"], prefect_proxy),
        "PREFECT_CLIENT_MAX_RETRIES": CLIENT_RETRIES,
        **(LOAD_SLOTS_ON if phase == "claim" else {}),
    }
    statement, ends = CUT_AT[phase]
    held = warehouse_proxy.stall_on(statement, COPY_STALL_SECONDS)
    child = subprocess.Popen(
        [sys.executable, "-m", "fleet_cli", "run", "--tenant", "acme", source.folder],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert held.wait(CLI_TIMEOUT_SECONDS), f"the import never reached its {phase}"
        prefect_proxy.refuse(GONE_SECONDS)
        prefect_proxy.reset_all()
        cut = time.monotonic()
        out, _ = child.communicate(timeout=CLI_TIMEOUT_SECONDS)
        ended_after = time.monotonic() - cut
    finally:
        child.kill()
        prefect_proxy.pass_through()  # the API is back
    assert "Traceback" not in out, out
    assert _live_leases(database_url) == [], out
    [(batch_id, status, _lease, details)] = batch_rows(database_url)
    assert status == ends, out
    [line] = [line for line in out.splitlines() if "could not be reported" in line]
    assert "Prefect API" in line and "check PREFECT_API_URL" in line, line
    if ends == BatchStatus.SUCCEEDED:
        assert child.returncode == ExitCode.SUCCEEDED, out
        assert line.startswith(f"Completed: batch {batch_id} succeeded"), line
        assert refresh_count(database_url) == 1  # published once
    else:  # failed before commit, saying why: nothing of it in the warehouse
        assert child.returncode == ExitCode.FAILED, out
        assert line.startswith("Failed: failed_pre_commit"), line
        assert "Prefect API" in details["failure"]["error"], details
    assert ended_after < ENDS_WITHIN_SECONDS, (ended_after, out)
    time.sleep(LEASE_TTL_SECONDS)  # the API is back; whatever is left, the rerun settles
    again = run_cli(cli_env, "run", "--tenant", "acme", source.folder)
    loaded = ExitCode.ALREADY_LOADED if ends == BatchStatus.SUCCEEDED else ExitCode.SUCCEEDED
    assert again.returncode == loaded and not again.traceback, again.out
    assert recovered_invariants(database_url, source) == []
    assert refresh_count(database_url) == 1
    # ... and tells the first run, which the API never heard end, how its batch ended
    assert _run_state(out) == ("Completed" if ends == BatchStatus.SUCCEEDED else "Failed")
    print(f"{phase}: exit {child.returncode} {ended_after:.1f} s after the cut; {line}")
