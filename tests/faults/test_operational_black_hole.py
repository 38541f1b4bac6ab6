"""A black-holed operational database (nothing answers, nothing is refused or reset) at the
reservation and at the commit record after the slice's COMMIT (issue #26: nothing stuck
after an outage). Before the store's reply bound the worker waited for ever in that
statement: the heartbeat's fence kept the warehouse safe, but the process never ended.
Bounded, the run ends with the store's one line naming FLEET_DATABASE_URL, and the next
delivery or the drain recovers the batch: loaded once, published once.

The proxy's black hole acknowledges packets (it is a process, not the network), so what
ends the wait here is the reply bound (`FLEET_DATABASE_REPLY_TIMEOUT_SECONDS`, set short);
on a real network the TCP keepalive and user timeouts end it sooner (docs/faults.md)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from fleet_import.bounded_connection import CONNECT_TIMEOUT_SECONDS
from fleet_import.errors import FleetImportError
from fleet_import.explain import explain
from fleet_import.importing.claim import settle_abandoned_batches
from fleet_import.importing.driver import import_folder
from fleet_import.store.repository import BatchRepository
from flows.reporting import ExitCode
from tests.faults.conftest import LEASE_TTL_SECONDS, batch_rows, recovered_invariants
from tests.faults.paths import run_cell
from tests.faults.proxy import FaultProxy, proxied_url
from tests.faults.test_operational_matrix import ACME, PHASES, operational_runtime
from tests.faults.test_warehouse_matrix import truth_now
from tests.reliability.conftest import Source, refresh_count

pytestmark = [pytest.mark.faults, pytest.mark.slow]

REPLY_TIMEOUT_SECONDS = 2.0
RUN_LIMIT_SECONDS = 60.0
"""How long a first run is waited for: past it, the run is stuck (an unbounded wait never
ends)."""
BOUNDS = {
    "claim": REPLY_TIMEOUT_SECONDS + 3,
    "record": REPLY_TIMEOUT_SECONDS + 2 * CONNECT_TIMEOUT_SECONDS + LEASE_TTL_SECONDS + 5,
}
"""Within its bound: at the reservation, the reply bound; after the commit record, the
reply bound, then two calls into the same black hole (the batch read back, the lease
released: each ends at its connect timeout) and the heartbeat's last beat."""
ONE_LINE = "check FLEET_DATABASE_URL (host:port) and that the server runs"


@pytest.mark.faults_sample  # seconds: `make test` runs it too
def test_a_store_call_into_a_black_hole_ends_at_its_reply_bound(
    operational_proxy: FaultProxy, database_url: str
) -> None:
    repo = BatchRepository(proxied_url(database_url, operational_proxy), REPLY_TIMEOUT_SECONDS)
    repo.list()  # connected and answered: the bound is on the answer, not on the work
    fired = operational_proxy.black_hole_on("ingestion_batches")
    started = time.monotonic()
    with pytest.raises(FleetImportError) as raised:
        repo.list()
    waited = time.monotonic() - started
    assert fired.is_set()
    assert REPLY_TIMEOUT_SECONDS <= waited < REPLY_TIMEOUT_SECONDS + 2, waited
    line = explain(raised.value)
    assert line is not None and "\n" not in line, line
    assert "no answer within 2 s (FLEET_DATABASE_REPLY_TIMEOUT_SECONDS)" in line, line
    assert line.endswith(ONE_LINE), line


@pytest.mark.parametrize("phase", ["claim", "record"])
def test_a_black_holed_operational_database_ends_the_run_within_its_bound(
    phase: str,
    operational_proxy: FaultProxy,
    warehouse: Any,
    source: Source,
    database_url: str,
    moto_endpoint: str,
    staging_bucket: str,
    tmp_path: Any,
) -> None:
    proxy = operational_proxy
    rt = operational_runtime(
        database_url,
        proxy,
        moto_endpoint,
        staging_bucket,
        str(tmp_path),
        database_reply_timeout_seconds=REPLY_TIMEOUT_SECONDS,
    )
    fired = proxy.black_hole_on(PHASES[phase])
    ended: list[object] = []

    def first_import() -> None:
        try:
            ended.append(import_folder(rt.ctx, ACME, source.folder, "d1"))
        except FleetImportError as exc:  # foreseen: the CLI prints it as one line
            ended.append(exc)

    started = time.monotonic()
    worker = threading.Thread(target=first_import, daemon=True)
    worker.start()
    worker.join(RUN_LIMIT_SECONDS)
    took = time.monotonic() - started
    proxy.pass_through()  # the database is back (a hung run's connections are cut too)
    assert fired.is_set(), ended
    assert not worker.is_alive(), f"the run still waited after {RUN_LIMIT_SECONDS} s"
    [first] = ended
    assert isinstance(first, FleetImportError), first
    line = explain(first)
    assert line is not None and "\n" not in line and line.endswith(ONE_LINE), line
    if phase == "claim":  # after the commit record, the read-back's connect times out last
        assert "FLEET_DATABASE_REPLY_TIMEOUT_SECONDS" in line, line
    assert truth_now(database_url, source, holders=False) == [], first
    print(f"{phase}: ended in {took:.1f} s (its bound {BOUNDS[phase]:g} s): {line}")

    time.sleep(LEASE_TTL_SECONDS + 0.5)  # a batch left without its executor is abandoned
    import_folder(rt.ctx, ACME, source.folder, "d2")
    settle_abandoned_batches(rt.ctx, "drain", limit=10)
    rt.publisher.drain("drain", lease_ttl=rt.ctx.lease_ttl, limit=10)
    assert recovered_invariants(database_url, source) == []
    assert refresh_count(database_url) == 1  # published once
    if phase == "record":  # the slice the first batch committed is kept: loaded once
        assert [status for _, status, _, _ in batch_rows(database_url)] == ["succeeded"]


def test_a_black_holed_commit_record_ends_fleet_import_run_with_one_line(
    cli_env: dict[str, str],
    operational_proxy: FaultProxy,
    warehouse: Any,
    source: Source,
    database_url: str,
    moto_endpoint: str,
    staging_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    report = run_cell(
        "cli",
        "operational",
        "record",
        "black_hole",
        proxy=operational_proxy,
        cli_env=cli_env,
        source=source,
        database_url=database_url,
        moto_endpoint=moto_endpoint,
        staging_bucket=staging_bucket,
        monkeypatch=monkeypatch,
        tmp_path=tmp_path,
        env_overrides={"FLEET_DATABASE_REPLY_TIMEOUT_SECONDS": str(REPLY_TIMEOUT_SECONDS)},
    )
    assert report.code == ExitCode.FAILED, report.out
    assert report.message.endswith(ONE_LINE), report.out  # one line: run_cell checked
    # The commit-slice step's own failure (logged), at the bound the child was given:
    assert f"no answer within {REPLY_TIMEOUT_SECONDS:g} s" in report.out, report.out
    assert refresh_count(database_url) == 1
