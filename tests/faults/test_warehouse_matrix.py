"""The fault matrix for the warehouse (PostgreSQL, and Redshift through the emulator, as a
provisioned cluster: the lost COMMIT of tests/faults/test_lost_commit_redshift.py covers
Serverless too): each cell one import through the real runtime (`build_runtime`: what
`fleet-import run` builds, minus Prefect) with a fault proxy between it and the warehouse.
After the fault, what the first run reports must be true at once; then recovery (resume of
a failed publication, the next delivery, the drain) and the invariants: nothing running,
the slice row-exact and owned by exactly one succeeded batch, every batch's status what the
stamp says.

Phases, by the warehouse message each fault is armed on:
- claim: the first read of the slice registry (`already_loaded`, the stamp);
- normalize: the slice's scope lock (Redshift: its first temp table), taken while the files
  are still being normalized;
- copy: the first COPY FROM STDIN;
- commit: the slice transaction's COMMIT (after the registry is stamped);
- publication: the refresh statement of `refresh_dependants`.
(discover and record touch no warehouse: their cells belong to S3 and the operational
database.) Faults: a reset before the server sees the message, a 2 s stall, a lost reply
(forwarded, answer swallowed, connection cut, new connections refused for 2 s), and an
outage (a reset, then every connection refused for longer than the lease TTL).

One cell per distinct recovery path (`CELLS`); the rest of phase x fault meet the same code:
- claim, outage: the claim step's retries (the step runner's backoff) outlast the warehouse
  gone past the lease TTL. A reset or a lost answer to that read is their first attempt.
- normalize, reset: the slice, opened while files are still normalized, loses its
  connection: the load starts again, reusing the files normalized meanwhile (on Redshift:
  its session opened again).
- copy, outage: a COPY cut, then the warehouse gone past the TTL: the slice load's retries
  outlast it while the heartbeat keeps the lease. A reset or a lost answer mid-COPY (the
  transaction never committed) is their first attempt.
- commit, lost_reply: the COMMIT ran and its answer was lost: the stamp, read back, says
  committed; the commit is recorded, nothing loaded again.
- commit, outage: the COMMIT never reached the server, then the warehouse is gone past the
  TTL: the read-back spans the outage, finds no stamp, and the batch loads again. A reset at
  the COMMIT is its first half.
- publication, reset: a step's statement fails: `failed_publication`, and the resume runs
  the step. An outage there ends the same way.
- publication, lost_reply: the step ran and its answer was lost: resumed, it runs once more
  (publication steps are at least once).
- commit, stall: a 2 s stall is waited out (no bound is shorter than the reply timeout);
  a stall at any other message meets the same wait.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleet_import.config import Settings
from fleet_import.contracts.fleet import FLEET_DATASETS
from fleet_import.importing.claim import settle_abandoned_batches
from fleet_import.importing.context import Committed, Failed
from fleet_import.importing.driver import import_folder
from fleet_import.importing.resume import resume_batch
from fleet_import.importing.runtime import Runtime, build_runtime
from fleet_import.scope import Tenant
from tests.faults.conftest import (
    AFTER_STAMP,
    LEASE_TTL_SECONDS,
    SLICE_COMMIT,
    batch_rows,
    matrix_cells,
    recovered_invariants,
    wait_out_abandoned,
)
from tests.faults.proxy import FaultProxy, proxied_url
from tests.redshift_emulator import SETUPS, RedshiftEmulator
from tests.redshift_grants import give
from tests.reliability.conftest import REFRESH_SQL, REFRESH_TABLE, Source, connect, refresh_count

pytestmark = [pytest.mark.faults, pytest.mark.slow]

PHASES = {
    "claim": (r"from\s+\S*ingestion_slices", None),
    "normalise": (r"hashtext\(", None),
    "copy": (r"^\s*copy\b", None),
    "commit": (SLICE_COMMIT, AFTER_STAMP),
    "publication": (REFRESH_TABLE.split(".")[1], None),
}
REDSHIFT_PHASES = {**PHASES, "normalise": (r"create\s+temp", None)}
ROLE = "arn:aws:iam::123456789012:role/fleet-redshift-copy"
FAULTS = ("reset", "stall", "lost_reply")
"""The faults of every path (tests/faults/paths.py: the flow and the CLI too)."""
RUNTIME_FAULTS = (*FAULTS, "outage")
"""The core runtime's cells add an outage longer than the lease TTL."""
STALL_SECONDS = 2.0
REFUSE_AFTER_LOST_REPLY = 2.0
OUTAGE_SECONDS = 1.5 * LEASE_TTL_SECONDS
"""Reset at the phase's message, then every connection refused this long: past the lease
TTL, so a lease nobody renews would have expired (the heartbeat renews it meanwhile, on the
operational database, when only the warehouse is down)."""
CELLS = {
    ("claim", "outage"): "the claim step's retries outlast the outage",
    ("normalise", "reset"): "the slice opened again while files normalize",
    ("copy", "outage"): "the slice load's retries outlast the outage",
    ("commit", "lost_reply"): "committed: the stamp read back",
    ("commit", "outage"): "not committed: the read-back spans the outage, loaded again",
    ("publication", "reset"): "failed_publication, resumed",
    ("publication", "lost_reply"): "the step ran: resumed, it runs once more",
    ("commit", "stall"): "waited out",
}
"""Each kept cell and the recovery path it stands for (the module's docstring says why the
others of phase x fault are the same path)."""
RECOVERED_BY_THE_FIRST_RUN = {cell for cell in CELLS if cell[0] != "publication"}
"""The cells whose first run recovers on its own (retries, the stamp read back, the slice
loaded again): it reports the slice committed. A publication fault leaves that run
failed_publication, resumable."""
SAMPLED = {("commit", "lost_reply")}
"""The cells `make test` runs too, on PostgreSQL; on Redshift the lost COMMIT of
test_lost_commit_redshift.py is the sampled cell, in both modes. `make test-faults` runs
them all."""
ACME = Tenant.named("acme")


def arm_fault(proxy: FaultProxy, fault: str, match: str, after: str | None = None) -> Any:
    """One of RUNTIME_FAULTS, or a black hole until `pass_through()`, armed on the message
    `match` finds (after `after`'s)."""
    if fault == "black_hole":
        return proxy.black_hole_on(match, after=after)
    if fault == "reset":
        return proxy.reset_on(match, after=after)
    if fault == "outage":
        return proxy.reset_on(match, after=after, then_refuse=OUTAGE_SECONDS)
    if fault == "stall":
        return proxy.stall_on(match, STALL_SECONDS, after=after)
    return proxy.lose_reply(match, after=after, then_refuse=REFUSE_AFTER_LOST_REPLY)


def _arm(proxy: FaultProxy, phase: str, fault: str, phases: dict[str, Any] = PHASES) -> Any:
    match, after = phases[phase]
    return arm_fault(proxy, fault, match, after)


def _runtime(
    database_url: str,
    proxy: FaultProxy,
    moto_endpoint: str,
    staging_bucket: str,
    tmp: str,
    emulator: RedshiftEmulator | None = None,
    **overrides: Any,
) -> Runtime:
    if emulator is None:
        backend: dict[str, Any] = {"warehouse_url": proxied_url(database_url, proxy)}
    else:
        backend = {
            "warehouse": "redshift",
            "redshift_host": "127.0.0.1",
            "redshift_port": proxy.port,
            "redshift_database": emulator.database,
            "redshift_user": emulator.user,
            "redshift_password": "unused-trust-auth",
            "redshift_ssl": False,
            "redshift_iam_role": ROLE,
        }
    settings = Settings(
        database_url=database_url,
        **backend,
        s3_endpoint_url=moto_endpoint,
        staging_uri=f"s3://{staging_bucket}/stage/",
        lease_ttl_seconds=LEASE_TTL_SECONDS,
        refresh_sql=[REFRESH_SQL],
        **{
            "commit_readback_seconds": 30,
            "workdir": tmp,
            "warehouse_load_slots": 0,
            "tenant_load_slots": 0,
            **overrides,
        },
    )
    return build_runtime(settings)


def truth_now(database_url: str, source: Source, *, holders: bool = True) -> list[str]:
    """What may never be reported, even before recovery: a batch failed while its stamp owns
    the slice, or (`holders`) running with no holder and no unknown commit to settle (a
    worker cut from the operational database leaves its batch to the takeover instead)."""
    problems: list[str] = []
    with connect(database_url) as conn:
        owners = {
            str(owner)
            for (owner,) in conn.execute(
                "SELECT DISTINCT batch_id::text FROM curated.ingestion_slices "
                "WHERE tenant_id = %s AND source_scope = %s",
                (source.tenant_id, source.scope),
            )
        }
    for batch_id, status, lease, details in batch_rows(database_url):
        failure = (details.get("failure") or {}).get("kind")
        if status == "failed" and failure != "failed_publication" and str(batch_id) in owners:
            problems.append(f"batch {batch_id} is {failure} but its stamp owns the slice")
        if holders and status == "running" and lease is None and "commit_unknown" not in details:
            problems.append(f"batch {batch_id} is running with no holder")
    return problems


@pytest.mark.parametrize(("phase", "fault"), matrix_cells(CELLS, SAMPLED))
def test_a_warehouse_fault_is_reported_truly_and_recovered(
    phase: str,
    fault: str,
    warehouse_proxy: FaultProxy,
    warehouse: Any,
    source: Source,
    database_url: str,
    moto_endpoint: str,
    staging_bucket: str,
    tmp_path: Any,
) -> None:
    rt = _runtime(database_url, warehouse_proxy, moto_endpoint, staging_bucket, str(tmp_path))
    _cell(rt, warehouse_proxy, phase, fault, source, database_url, PHASES)


@pytest.mark.parametrize("emulator", [SETUPS[0]], ids=["-".join(SETUPS[0])], indirect=True)
@pytest.mark.parametrize(("phase", "fault"), matrix_cells(CELLS, set()))
def test_a_redshift_fault_is_reported_truly_and_recovered(
    phase: str,
    fault: str,
    emulator: RedshiftEmulator,
    redshift_proxy: FaultProxy,
    source: Source,
    database_url: str,
    moto_endpoint: str,
    staging_bucket: str,
    tmp_path: Any,
) -> None:
    rt = _runtime(
        database_url, redshift_proxy, moto_endpoint, staging_bucket, str(tmp_path), emulator
    )
    rt.ctx.warehouse.ensure_tables(FLEET_DATASETS.values())
    with connect(database_url) as conn:  # the refresh statement runs as the loading user
        give(conn, emulator.user, REFRESH_TABLE)
    _cell(rt, redshift_proxy, phase, fault, source, database_url, REDSHIFT_PHASES)


def _cell(
    rt: Runtime,
    proxy: FaultProxy,
    phase: str,
    fault: str,
    source: Source,
    database_url: str,
    phases: dict[str, Any],
) -> None:
    warehouse_proxy = proxy
    fired = _arm(proxy, phase, fault, phases)
    first = import_folder(rt.ctx, ACME, source.folder, "d1")  # raises nothing
    assert fired.is_set(), f"the {fault} at {phase} never happened: {first}"
    assert truth_now(database_url, source) == [], first
    if (phase, fault) in RECOVERED_BY_THE_FIRST_RUN:
        assert isinstance(first, Committed), first
        # Only a COMMIT that did go through is recorded from its stamp; one that did not
        # (commit, outage) is loaded again.
        assert first.recovered == ((phase, fault) == ("commit", "lost_reply")), first
    else:
        assert isinstance(first, Failed) and first.resumable, first
    if fault == "stall":  # a 2 s stall is waited out: the run just succeeds
        assert isinstance(first, Committed) and first.published, first

    warehouse_proxy.pass_through()
    if isinstance(first, Failed) and first.resumable:
        resume_batch(rt.ctx, rt.outbox, first.batch_id)
    import_folder(rt.ctx, ACME, source.folder, "d2")  # the next delivery of the folder
    wait_out_abandoned(database_url)
    settle_abandoned_batches(rt.ctx, "drain", limit=10)
    rt.publisher.drain("drain", lease_ttl=rt.ctx.lease_ttl, limit=10)

    assert recovered_invariants(database_url, source) == []
    print(f"{phase} {fault}: {first}")  # what the first run told its caller (-rP shows it)
    refreshes = refresh_count(database_url)
    # A publication step runs at least once; a lost answer to it runs it once more.
    assert refreshes == 1 or (phase, fault) == ("publication", "lost_reply") and refreshes == 2
