"""The fault matrix for the operational database: phase x fault, each cell one import
through the real runtime with a fault proxy between it and the operational PostgreSQL (the
warehouse stays direct). A foreseen failure may end the first run (a fleet-import error,
never anything else); what is recorded must be true at once, and after recovery (the next
delivery, the drain, a lease TTL later) the invariants hold.

Phases, by the statement (and its parameters) each fault is armed on: claim (the
reservation), discover (the manifest recorded), normalize (a normalized file cached),
record (the commit recorded), publication (an outbox step claimed), succeed (the batch
succeeded), release (its lease released, the run's last statement). Faults: reset, 2 s
stall, lost reply (then 2 s refused), outage (a reset, then refused for longer than the
lease TTL: the heartbeat cannot renew the lease meanwhile).

One cell per distinct recovery path (`CELLS`); the rest of phase x fault meet the same code:
- claim, reset: the reservation never reached the server: nothing reserved, the run ends
  with the store's one line. An outage there ends the same way.
- claim, lost_reply: reserved, the answer lost: a batch nobody leased, abandoned after one
  TTL and settled by the drain.
- discover, outage: the manifest record's step retries outlast the outage. A reset or a
  lost answer (the update is idempotent) is their first attempt.
- normalize, outage: cache entries fail while the heartbeat cannot renew the lease: the
  cache only saves work, and the load goes on. A reset or a lost answer to one entry is the
  same skipped entry.
- record, reset: the commit record never reached the server: retried, then published.
- record, lost_reply: recorded, the answer lost, the retry refused: the run ends with the
  store's line; the drain finds the commit recorded and publishes it.
- record, outage: not recorded and the database gone: the run ends with the store's line;
  the takeover finds the slice stamped, records the commit and publishes it.
- publication, reset: a step claim never reached the server: the run ends with the store's
  line, the drain publishes. An outage there ends the same way.
- publication, lost_reply: the step claimed, the answer lost: the claim ends with the
  lease, and the drain claims the step anew.
- succeed, lost_reply: succeeded, the answer lost: read back, the run reports the success.
- succeed, outage: not succeeded, the database gone: read back across the outage, then
  succeeded. A reset there is its first half.
- release, reset: the lease's release fails: nothing the run reports changes, the lease of
  the settled batch expires. A lost answer or an outage there is the same.
- record, stall: a 2 s stall is waited out; at any other statement, the same wait.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from fleet_import.config import Settings
from fleet_import.errors import FleetImportError
from fleet_import.importing.claim import settle_abandoned_batches
from fleet_import.importing.context import Committed, Failed
from fleet_import.importing.driver import import_folder
from fleet_import.importing.resume import resume_batch
from fleet_import.importing.runtime import Runtime, build_runtime
from fleet_import.scope import Tenant
from tests.faults.conftest import (
    LEASE_TTL_SECONDS,
    matrix_cells,
    recovered_invariants,
    wait_out_abandoned,
)
from tests.faults.proxy import FaultProxy, proxied_url
from tests.faults.test_warehouse_matrix import arm_fault, truth_now
from tests.reliability.conftest import REFRESH_SQL, Source, refresh_count

pytestmark = [pytest.mark.faults, pytest.mark.slow]

PHASES = {
    "claim": r"insert\s+into\s+ingestion_batches",
    "discover": r"(?s)update\s+ingestion_batches.*discovered",
    "normalise": r"insert\s+into\s+normalized_files",
    "record": r"'warehouse_committed',\s*true",
    "publication": r"with\s+head\s+as",
    "succeed": r"SET status\s*=\s*'succeeded'",  # mark_succeeded, not a step reading successes
    "release": r"SET execution_lease_id = NULL, execution_lease_expires_at = NULL, updated_at",
}
CELLS = {
    ("claim", "reset"): "nothing reserved",
    ("claim", "lost_reply"): "reserved, never leased: abandoned, settled by the drain",
    ("discover", "outage"): "the step's retries outlast the outage",
    ("normalise", "outage"): "cache entries skipped, the lease unrenewed",
    ("record", "reset"): "the record retried",
    ("record", "lost_reply"): "recorded: the drain publishes",
    ("record", "outage"): "not recorded: the takeover records the stamped commit",
    ("publication", "reset"): "no claim: the drain publishes",
    ("publication", "lost_reply"): "a claim that ends with the lease",
    ("succeed", "lost_reply"): "succeeded: read back",
    ("succeed", "outage"): "read back across the outage, then succeeded",
    ("release", "reset"): "the lease expires",
    ("record", "stall"): "waited out",
}
"""Each kept cell and the recovery path it stands for (the module's docstring)."""
ENDS_WITH_THE_STORES_LINE = {
    ("claim", "reset"),
    ("claim", "lost_reply"),
    ("record", "lost_reply"),
    ("record", "outage"),
    ("publication", "reset"),
    ("publication", "lost_reply"),
}
"""The cells whose first run ends with the store's one line (what the drain, the takeover or
the next run then finish); in every other cell the first run recovers by itself and
reports the batch committed and published."""
SAMPLED = {("record", "lost_reply")}
ACME = Tenant.named("acme")


def operational_runtime(
    database_url: str,
    proxy: FaultProxy,
    moto_endpoint: str,
    staging_bucket: str,
    workdir: str,
    **overrides: Any,
) -> Runtime:
    """The runtime `fleet-import run` builds, its operational database through `proxy`."""
    settings = Settings(
        database_url=proxied_url(database_url, proxy),
        warehouse_url=database_url,
        s3_endpoint_url=moto_endpoint,
        staging_uri=f"s3://{staging_bucket}/stage/",
        lease_ttl_seconds=LEASE_TTL_SECONDS,
        refresh_sql=[REFRESH_SQL],
        workdir=workdir,
        warehouse_load_slots=0,
        tenant_load_slots=0,
        **overrides,
    )
    return build_runtime(settings)


@pytest.mark.parametrize(("phase", "fault"), matrix_cells(CELLS, SAMPLED))
def test_an_operational_database_fault_is_reported_truly_and_recovered(
    phase: str,
    fault: str,
    operational_proxy: FaultProxy,
    warehouse: Any,
    source: Source,
    database_url: str,
    moto_endpoint: str,
    staging_bucket: str,
    tmp_path: Any,
) -> None:
    proxy = operational_proxy
    rt = operational_runtime(database_url, proxy, moto_endpoint, staging_bucket, str(tmp_path))
    fired = arm_fault(proxy, fault, PHASES[phase])
    try:
        first: object = import_folder(rt.ctx, ACME, source.folder, "d1")
    except FleetImportError as exc:  # foreseen: the CLI prints it as one line
        first = exc
    assert fired.is_set(), f"the {fault} at {phase} never happened: {first}"
    assert truth_now(database_url, source, holders=False) == [], first
    # The success is read back across the outage; a lease left unreleased at the end only
    # expires (the batch is settled by then): neither changes what the run reports.
    if (phase, fault) in ENDS_WITH_THE_STORES_LINE:
        assert isinstance(first, FleetImportError), first
    else:
        assert isinstance(first, Committed) and first.published, first

    proxy.pass_through()
    if isinstance(first, Failed) and first.resumable:
        resume_batch(rt.ctx, rt.outbox, first.batch_id)
    wait_out_abandoned(database_url)  # a batch left without its executor is abandoned
    import_folder(rt.ctx, ACME, source.folder, "d2")
    settle_abandoned_batches(rt.ctx, "drain", limit=10)
    rt.publisher.drain("drain", lease_ttl=rt.ctx.lease_ttl, limit=10)

    assert recovered_invariants(database_url, source) == []
    print(f"{phase} {fault}: {first}")  # what the first run told its caller (-rP shows it)
    assert 1 <= refresh_count(database_url) <= 2  # a publication step runs at least once


def test_a_connection_cut_mid_statement_is_told_as_lost_not_as_refused(
    operational_proxy: FaultProxy, database_url: str
) -> None:
    from fleet_import.store.repository import BatchRepository

    repo = BatchRepository(proxied_url(database_url, operational_proxy))
    assert operational_proxy.reset_on("ingestion_batches")
    with pytest.raises(FleetImportError, match="the connection was lost mid-statement"):
        repo.list()
    operational_proxy.refuse(30)
    time.sleep(0.3)  # the proxy closes its door at its next poll
    with pytest.raises(FleetImportError, match="could not connect"):
        repo.list()
