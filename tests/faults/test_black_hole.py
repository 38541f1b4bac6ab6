"""A black-holed warehouse (nothing answers, nothing is refused or reset) at the slice's COMMIT
and at its COPY. Before the wait bound the worker waited for ever (the COMMIT's answer never
comes; its TCP peer keeps acknowledging, so nothing on the client side ended it). Bounded, it
ends as it must: a COMMIT with no answer is `CommitUnknown` (the stamp decides later), a COPY
with no answer fails the batch before commit; the invariants hold after recovery.

The proxy's black hole still acknowledges packets (it is a process, not the network), so what
ends the wait here is the reply bound (`FLEET_WAREHOUSE_REPLY_TIMEOUT_SECONDS`, set short);
on a real network the TCP keepalive and user timeouts end it sooner (docs/faults.md)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fleet_import.contracts.fleet import FLEET_DATASETS
from fleet_import.importing import load
from fleet_import.importing.claim import settle_abandoned_batches
from fleet_import.importing.context import CommitUnknown, Failed
from fleet_import.importing.driver import import_folder
from fleet_import.importing.runtime import Runtime
from fleet_import.retry import Backoff
from fleet_import.store.models import BatchStatus
from tests.faults.conftest import (
    AFTER_STAMP,
    LEASE_TTL_SECONDS,
    SLICE_COMMIT,
    batch_rows,
    recovered_invariants,
)
from tests.faults.proxy import FaultProxy
from tests.faults.test_warehouse_matrix import ACME, _runtime, truth_now
from tests.redshift_emulator import SETUPS, RedshiftEmulator
from tests.redshift_grants import give
from tests.reliability.conftest import REFRESH_TABLE, Source, connect, refresh_count

pytestmark = [pytest.mark.faults, pytest.mark.slow]

REPLY_TIMEOUT_SECONDS = 3.0
PHASES = {"commit": (SLICE_COMMIT, AFTER_STAMP), "copy": (r"^\s*copy\b", None)}


@pytest.mark.parametrize("phase", ["commit", "copy"])
def test_a_black_holed_warehouse_ends_the_run_within_its_bound(
    phase: str,
    monkeypatch: pytest.MonkeyPatch,
    warehouse_proxy: FaultProxy,
    warehouse: Any,
    source: Source,
    database_url: str,
    moto_endpoint: str,
    staging_bucket: str,
    tmp_path: Any,
) -> None:
    # Each of the slice load's attempts waits out the bound; the waits between them are not
    # what this proves (the matrix's copy cell rides out an outage with the real ones).
    monkeypatch.setattr(load, "LOAD_BACKOFF", Backoff((0.1,) * load.LOAD_BACKOFF.retries))
    rt = _runtime(
        database_url,
        warehouse_proxy,
        moto_endpoint,
        staging_bucket,
        str(tmp_path),
        warehouse_reply_timeout_seconds=REPLY_TIMEOUT_SECONDS,
        commit_readback_seconds=2,
    )
    _black_hole_then_recover(rt, warehouse_proxy, phase, source, database_url)


@pytest.mark.parametrize("emulator", [SETUPS[0]], ids=["-".join(SETUPS[0])], indirect=True)
def test_a_black_holed_redshift_commit_ends_as_unknown_within_its_bound(
    emulator: RedshiftEmulator,
    redshift_proxy: FaultProxy,
    source: Source,
    database_url: str,
    moto_endpoint: str,
    staging_bucket: str,
    tmp_path: Any,
) -> None:
    """redshift_connector's socket timeout (FLEET_WAREHOUSE_REPLY_TIMEOUT_SECONDS) bounds it."""
    rt = _runtime(
        database_url,
        redshift_proxy,
        moto_endpoint,
        staging_bucket,
        str(tmp_path),
        emulator,
        warehouse_reply_timeout_seconds=REPLY_TIMEOUT_SECONDS,
        commit_readback_seconds=2,
    )
    rt.ctx.warehouse.ensure_tables(FLEET_DATASETS.values())
    with connect(database_url) as conn:
        give(conn, emulator.user, REFRESH_TABLE)
    _black_hole_then_recover(rt, redshift_proxy, "commit", source, database_url)


def _black_hole_then_recover(
    rt: Runtime, warehouse_proxy: FaultProxy, phase: str, source: Source, database_url: str
) -> None:
    match, after = PHASES[phase]
    fired = warehouse_proxy.black_hole_on(match, after=after)
    first = import_folder(rt.ctx, ACME, source.folder, "d1")  # returns: the wait is bounded
    assert fired.is_set(), first
    # The network comes back; the black-holed sessions are cut (the server rolls them back:
    # until then a Redshift session's LOCKs would block even this read). Nothing else yet.
    warehouse_proxy.pass_through()
    assert truth_now(database_url, source) == [], first
    [(batch_id, status, lease, details)] = batch_rows(database_url)
    if phase == "commit":  # the COMMIT never reached the server: unknown, then not committed
        assert isinstance(first, CommitUnknown), first
        assert status == BatchStatus.RUNNING and lease is None and "commit_unknown" in details
    else:
        assert isinstance(first, Failed) and not first.resumable, first
        assert status == BatchStatus.FAILED
        assert details["failure"]["kind"] == "failed_pre_commit", details
        assert "warehouse" in details["failure"]["error"], details

    time.sleep(LEASE_TTL_SECONDS + 0.5)
    settle_abandoned_batches(rt.ctx, "drain", limit=10)  # the unknown commit: not stamped
    import_folder(rt.ctx, ACME, source.folder, "d2")  # the next delivery loads it
    assert recovered_invariants(database_url, source) == []
    assert refresh_count(database_url) == 1
    # Not stamped: the first batch ends failed (never committed), a new one loads the slice.
    statuses = [row[1] for row in batch_rows(database_url)]
    assert statuses == [BatchStatus.FAILED, BatchStatus.SUCCEEDED], statuses
