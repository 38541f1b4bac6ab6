"""The issue 26 scenario through the CLI: a fault proxy between `fleet-import run` and the
warehouse PostgreSQL forwards the slice's COMMIT, swallows the server's answer, cuts the
connection and refuses connections for a while. The slice did commit: the batch must end
succeeded (the same batch, published once, nothing loaded twice), with no traceback."""

from __future__ import annotations

import pytest

from fleet_import.store.models import BatchStatus
from flows.reporting import ExitCode
from tests.faults.conftest import (
    AFTER_STAMP,
    LEASE_TTL_SECONDS,
    SLICE_COMMIT,
    batch_rows,
    recovered_invariants,
    run_cli,
)
from tests.faults.proxy import FaultProxy
from tests.reliability.conftest import Source, refresh_count

pytestmark = [pytest.mark.faults, pytest.mark.slow]


@pytest.mark.parametrize("outage_seconds", [25.0])
def test_a_lost_commit_answer_across_an_outage_ends_succeeded(
    cli_env: dict[str, str],
    warehouse_proxy: FaultProxy,
    source: Source,
    database_url: str,
    outage_seconds: float,
) -> None:
    fired = warehouse_proxy.lose_reply(SLICE_COMMIT, after=AFTER_STAMP, then_refuse=outage_seconds)
    run = run_cli(cli_env, "run", "--tenant", "acme", source.folder)
    assert fired.is_set(), run.out
    assert run.returncode == ExitCode.SUCCEEDED, run.out
    assert not run.traceback, run.out
    [(batch_id, status, lease, details)] = batch_rows(database_url)  # no second batch
    assert status == BatchStatus.SUCCEEDED and lease is None
    assert details["summary"]["recovered_from_stamp"] is True  # the load ran once
    assert refresh_count(database_url) == 1  # its publication ran once
    assert recovered_invariants(database_url, source) == []


def _left_unknown(cli_env: dict[str, str], proxy: FaultProxy, source: Source, url: str) -> str:
    """The outage outlasts the read-back: the batch is left running, lease released."""
    proxy.lose_reply(SLICE_COMMIT, after=AFTER_STAMP, then_refuse=600)
    env = {**cli_env, "FLEET_COMMIT_READBACK_SECONDS": "3"}
    run = run_cli(env, "run", "--tenant", "acme", "--delivery-key", "d1", source.folder)
    assert run.returncode == ExitCode.COMMIT_UNKNOWN, run.out
    assert not run.traceback, run.out
    assert "whether its slice committed is unknown" in run.out, run.out
    [(batch_id, status, lease, details)] = batch_rows(url)
    assert status == BatchStatus.RUNNING and lease is None
    assert "commit_unknown" in details and "failure" not in details
    proxy.pass_through()  # the warehouse is back
    return str(batch_id)


@pytest.mark.parametrize("settled_by", ["same-delivery", "another-delivery", "drain"])
def test_an_outage_longer_than_the_read_back_is_settled_later(
    cli_env: dict[str, str],
    warehouse_proxy: FaultProxy,
    source: Source,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    settled_by: str,
) -> None:
    import time

    batch_id = _left_unknown(cli_env, warehouse_proxy, source, database_url)
    if settled_by == "same-delivery":
        run = run_cli(cli_env, "run", "--tenant", "acme", "--delivery-key", "d1", source.folder)
        assert run.returncode == ExitCode.SUCCEEDED, run.out
    elif settled_by == "another-delivery":
        time.sleep(LEASE_TTL_SECONDS + 1)  # a released lease is abandoned after one TTL
        run = run_cli(cli_env, "run", "--tenant", "acme", source.folder)
        # The holder is settled from its stamp; this delivery's content is then loaded.
        assert run.returncode == ExitCode.ALREADY_LOADED, run.out
    else:
        from flows.drain_publications import drain_publications

        for name in ("FLEET_WAREHOUSE_URL", "FLEET_LEASE_TTL_SECONDS", "FLEET_REFRESH_SQL"):
            monkeypatch.setenv(name, cli_env[name])
        time.sleep(LEASE_TTL_SECONDS + 1)
        drain_publications(limit=10)
        run = None
    assert run is None or not run.traceback, run.out
    [(settled_id, status, _lease, details)] = batch_rows(database_url)
    assert str(settled_id) == batch_id and status == BatchStatus.SUCCEEDED
    assert details["summary"]["recovered_from_stamp"] is True
    assert refresh_count(database_url) == 1
    assert recovered_invariants(database_url, source) == []
