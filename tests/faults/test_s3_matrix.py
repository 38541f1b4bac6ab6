"""The fault matrix for S3: phase x fault, each cell one import through the real runtime
with an HTTP-aware fault proxy between it and moto (the databases stay direct). botocore is
S3's one retry layer (fleet_import.s3.client), with test limits: 1 s to connect, 4 s per
read, 3 attempts, so a call gives up within `LIMITS.call_bound` (18 s).

Phases, by the request each fault is armed on: discover (the folder's listing), get (the
first GET of a delivered file, while normalizing), upload (the first PUT to the staging
area, a normalized file), publication (retire_superseded's delete of the staged files of
the batch two contents back: its own test, as a first delivery deletes nothing).
Faults: a reset before moto sees the request, a 2 s stall, an outage longer than the lease
TTL but shorter than the bound (6 s of black hole), a black hole longer than the bound
(until the test lifts it), and throttling (two 503 SlowDown answers).

What must hold: every fault within the bound is ridden out by botocore and the run
succeeds; past the bound the run fails before commit, transient, with one line naming S3
and what to check; after recovery (the next delivery, the drain) the invariants of the
other matrices hold.

One cell per distinct recovery path (`CELLS`, `PUBLICATION_CELLS`); the rest of phase x
fault meet the same code (botocore's standard retries, the same at each call):
- discover, black_hole: the listing past the bound: failed before commit, one line, exactly
  botocore's attempts sent.
- discover, stall: a 2 s stall inside one read is waited out (a stall at a GET or a PUT is
  the same read).
- get, black_hole: a file's GET past the bound: failed before commit, and no further file
  starts (at most FILES_AT_ONCE calls wait out the bound).
- get, outage: 6 s dark while normalizing: botocore's later attempts get through while the
  heartbeat keeps the lease (an outage at the listing or a PUT is the same retry).
- get, throttle: two 503 SlowDown answers ridden out (the same retry at any call).
- upload, black_hole: a staging PUT past the bound through boto3's transfer manager, which
  retries nothing on top: failed before commit.
- upload, reset: a staging PUT reset before moto saw it: retried by botocore (a reset at a
  listing or a GET is the same retry).
- publication, black_hole: retire_superseded's delete past the bound: `failed_publication`,
  the slice the new batch's, resumed.
- publication, outage: the same delete dark for 6 s: ridden out, published.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from fleet_import.config import DEFAULT_NORMALIZE_WORKERS, Settings
from fleet_import.importing.claim import settle_abandoned_batches
from fleet_import.importing.context import Committed, Failed
from fleet_import.importing.driver import import_folder
from fleet_import.importing.resume import resume_batch
from fleet_import.importing.runtime import Runtime, build_runtime
from fleet_import.s3.client import S3Limits
from fleet_import.scope import Tenant
from fleet_import.store.details import FailureKind
from tests.faults import httpwire
from tests.faults.conftest import (
    LEASE_TTL_SECONDS,
    batch_rows,
    matrix_cells,
    recovered_invariants,
    wait_out_abandoned,
)
from tests.faults.proxy import FaultProxy
from tests.faults.test_warehouse_matrix import STALL_SECONDS, truth_now
from tests.reliability.conftest import (
    REFRESH_SQL,
    Source,
    connect,
    make_source,
    refresh_count,
    slice_differences,
    upload_sources,
)

pytestmark = [pytest.mark.faults, pytest.mark.slow]

LIMITS = S3Limits(connect_timeout=1.0, read_timeout=4.0, max_attempts=3)
"""Short, so a black hole costs a cell seconds; a 2 s stall is still inside one read."""
S3_LIMITS_ENV = {
    "FLEET_S3_CONNECT_TIMEOUT_SECONDS": str(LIMITS.connect_timeout),
    "FLEET_S3_READ_TIMEOUT_SECONDS": str(LIMITS.read_timeout),
    "FLEET_S3_MAX_ATTEMPTS": str(LIMITS.max_attempts),
}
OUTAGE_SECONDS = 6.0
"""Longer than the lease TTL (the heartbeat, on the operational database, keeps the lease),
shorter than the bound: botocore's later attempts get through."""
THROTTLED_ANSWERS = 2  # fewer than the attempts: the last one gets through
BLACK_HOLE_SECONDS = 3600.0  # lifted by pass_through
PHASES = {
    "discover": r"^GET [^\s]*list-type=2",
    "get": r"^GET [^?\s]*/acme/fleet/[^?\s]+\.\w+ HTTP",
    "upload": r"^PUT [^?\s]*/stage/",
}
RETIRE = r"^POST [^\s]*\?delete"
"""retire_superseded's DeleteObjects of the files only the replaced batch used."""
FAULTS = ("reset", "stall", "outage", "black_hole", "throttle")
CELLS = {
    ("discover", "black_hole"): "failed before commit, botocore's attempts only",
    ("discover", "stall"): "waited out",
    ("get", "black_hole"): "failed before commit, no further file started",
    ("get", "outage"): "botocore's later attempts get through",
    ("get", "throttle"): "SlowDown ridden out",
    ("upload", "black_hole"): "failed before commit, the transfer manager retries nothing",
    ("upload", "reset"): "retried by botocore",
}
"""Each kept cell and the recovery path it stands for (the module's docstring)."""
PUBLICATION_CELLS = {
    ("publication", "black_hole"): "failed_publication, resumed",
    ("publication", "outage"): "ridden out, published",
}
SAMPLED = {("get", "throttle")}
"""The cells `make test` runs too; `make test-faults` runs them all."""
FILES_AT_ONCE = DEFAULT_NORMALIZE_WORKERS
"""Files normalized at once, each making one S3 call at a time (the runtime and the flow)."""
ACME = Tenant.named("acme")


@pytest.fixture
def s3_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    host, port = moto_endpoint.removeprefix("http://").rsplit(":", 1)
    with FaultProxy((host, int(port)), protocol="http") as proxy:
        yield proxy


def arm_s3(proxy: FaultProxy, phase: str, fault: str) -> Any:
    match = PHASES.get(phase, RETIRE)
    if fault == "reset":
        return proxy.reset_on(match)
    if fault == "stall":
        return proxy.stall_on(match, STALL_SECONDS)
    if fault == "outage":
        return proxy.dark_on(match, OUTAGE_SECONDS)
    if fault == "black_hole":
        return proxy.dark_on(match, BLACK_HOLE_SECONDS)
    return proxy.throttle_on(match, THROTTLED_ANSWERS)


def caught_calls(proxy: FaultProxy) -> list[list[bytes]]:
    """The S3 calls a black hole caught (one botocore invocation each, by its
    `amz-sdk-invocation-id`), each as the request lines of its attempts."""
    attempts: dict[bytes | None, list[bytes]] = defaultdict(list)
    caught: dict[bytes | None, None] = {}
    for head, dark in proxy.requests:
        invocation = httpwire.header(head, b"amz-sdk-invocation-id")
        attempts[invocation].append(head.split(b"\r\n", 1)[0])
        if dark:
            caught[invocation] = None
    return [attempts[invocation] for invocation in caught]


def retried_above_botocore(proxy: FaultProxy) -> list[str]:
    """What the requests a black hole caught say of the layers above botocore: each call it
    caught sent exactly LIMITS.max_attempts requests, and no request was sent by two calls
    (a step runner's or a Prefect task's retry calls S3 again: a new invocation of the same
    request); and it caught no more calls than files are normalized at once (a failed file
    starts no further files, each of which would wait out the bound again)."""
    calls = caught_calls(proxy)
    calls_of: dict[bytes, int] = defaultdict(int)
    problems = [] if calls else ["the black hole caught no S3 call"]
    for attempts in calls:
        if len(attempts) != LIMITS.max_attempts:
            problems.append(f"{len(attempts)} attempts of {attempts[0]!r}")
        calls_of[attempts[0]] += 1
    problems += [f"{n} calls of {line!r}" for line, n in calls_of.items() if n > 1]
    if len(calls) > FILES_AT_ONCE:
        lines = sorted(attempts[0] for attempts in calls)
        problems.append(f"{len(calls)} calls waited out the bound, not {FILES_AT_ONCE}: {lines}")
    return problems


def _runtime(
    database_url: str, proxy: FaultProxy, staging_bucket: str, tmp: str, **extra: Any
) -> Runtime:
    settings = Settings(
        database_url=database_url,
        warehouse_url=database_url,
        s3_endpoint_url=f"http://127.0.0.1:{proxy.port}",
        s3_connect_timeout_seconds=LIMITS.connect_timeout,
        s3_read_timeout_seconds=LIMITS.read_timeout,
        s3_max_attempts=LIMITS.max_attempts,
        staging_uri=f"s3://{staging_bucket}/stage/",
        lease_ttl_seconds=LEASE_TTL_SECONDS,
        refresh_sql=[REFRESH_SQL],
        workdir=tmp,
        warehouse_load_slots=0,
        tenant_load_slots=0,
        **extra,
    )
    return build_runtime(settings)


@pytest.mark.parametrize(("phase", "fault"), matrix_cells(CELLS, SAMPLED))
def test_an_s3_fault_is_retried_within_the_bound_and_reported_truly(
    phase: str,
    fault: str,
    s3_proxy: FaultProxy,
    warehouse: Any,
    source: Source,
    database_url: str,
    staging_bucket: str,
    tmp_path: Any,
) -> None:
    rt = _runtime(database_url, s3_proxy, staging_bucket, str(tmp_path))
    fired = arm_s3(s3_proxy, phase, fault)
    first = import_folder(rt.ctx, ACME, source.folder, "d1")  # raises nothing
    assert fired.is_set(), f"the {fault} at {phase} never happened: {first}"
    assert truth_now(database_url, source) == [], first
    if fault == "black_hole":  # past the bound: failed before commit, one line naming S3
        assert isinstance(first, Failed), first
        assert first.kind == FailureKind.FAILED_PRE_COMMIT, first
        assert "S3 does not answer" in first.error, first.error
        assert "check FLEET_S3_ENDPOINT_URL" in first.error, first.error
        assert "\n" not in first.error and "Traceback" not in first.error
        assert retried_above_botocore(s3_proxy) == []
    else:  # within the bound: botocore rode it out
        assert isinstance(first, Committed) and first.published, first

    s3_proxy.pass_through()
    import_folder(rt.ctx, ACME, source.folder, "d2")  # the next delivery of the folder
    wait_out_abandoned(database_url)
    settle_abandoned_batches(rt.ctx, "drain", limit=10)
    rt.publisher.drain("drain", lease_ttl=rt.ctx.lease_ttl, limit=10)

    assert recovered_invariants(database_url, source) == []
    assert refresh_count(database_url) == 1


@pytest.mark.parametrize(("phase", "fault"), matrix_cells(PUBLICATION_CELLS, set()))
def test_an_s3_fault_in_publication_is_retried_or_left_resumable(
    phase: str,
    fault: str,
    s3_proxy: FaultProxy,
    s3: Any,
    warehouse: Any,
    source: Source,
    landing_bucket: str,
    database_url: str,
    staging_bucket: str,
    tmp_path: Any,
) -> None:
    """The one publication step that touches S3, retire_superseded, deletes the staged files
    of the batch two contents back (the previous success's are kept for rollbacks): a third
    content of the folder is loaded, and the fault is armed on that delete. Past the bound
    the slice is committed and stays the new batch's: `failed_publication`, resumable, one
    line naming S3; a resume finishes it."""
    # Files of earlier successes are kept retain_days for rollbacks: none kept past the last
    rt = _runtime(database_url, s3_proxy, staging_bucket, str(tmp_path), retain_days=0)
    name = source.folder.rstrip("/").rsplit("/", 1)[-1]
    for seed, key in ((None, "d1"), (27, "d2"), (28, "d3")):
        if seed is not None:  # another content of the folder replaces the slice
            replacement = make_source(
                landing_bucket, "acme", name, seed=seed, trips=280, fuel=30, vehicles=6
            )
            upload_sources(s3, [replacement])
        if key == "d3":  # the previous success's files are kept: d3 deletes d1's
            break
        assert isinstance(import_folder(rt.ctx, ACME, source.folder, key), Committed)
    fired = arm_s3(s3_proxy, phase, fault)
    second = import_folder(rt.ctx, ACME, source.folder, "d3")
    assert fired.is_set(), f"the {fault} at {phase} never happened: {second}"
    assert truth_now(database_url, replacement) == [], second
    if fault == "black_hole":
        assert isinstance(second, Failed) and second.resumable, second
        assert second.kind == FailureKind.FAILED_PUBLICATION, second
        assert "S3 does not answer" in second.error and "\n" not in second.error, second.error
        assert retried_above_botocore(s3_proxy) == []
        s3_proxy.pass_through()
        resumed = resume_batch(rt.ctx, rt.outbox, second.batch_id)
        assert isinstance(resumed, Committed) and resumed.published, resumed
    else:
        assert isinstance(second, Committed) and second.published, second
    s3_proxy.pass_through()

    rows = batch_rows(database_url)
    assert [status for _, status, _, _ in rows] == ["succeeded"] * 3, rows
    with connect(database_url) as conn:
        assert slice_differences(conn, replacement, owner=rows[2][0]) == []
    assert rows[1][3].get("superseded_by") == str(rows[2][0])  # retired, after the fault
    assert refresh_count(database_url) == 3  # each batch's publication ran once
