"""Concurrency soak: 8 worker processes (half through the import-s3-folder flow, half
through the core's import_folder: one driver) import 50 folders of 5 tenants for a fixed time,
while the test kills workers (SIGKILL mid-import) and stalls them past their lease (SIGSTOP,
then SIGCONT: a zombie that must notice it lost the lease). Deliveries repeat at random,
with the same key (a duplicate) and with another key (a replacement).

Invariants are checked while it runs and at the end; after a final drain and reruns every
folder's slice must be exactly its source. Duration: FLEET_SOAK_SECONDS (default 20).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL

from fleet_import.importing.context import Committed, Skipped
from fleet_import.importing.driver import import_folder
from fleet_import.scope import Tenant
from fleet_import.store.models import BatchStatus
from fleet_import.store.repository import BatchRepository
from tests.reliability import soak_worker
from tests.reliability.conftest import (
    REFRESH_SQL,
    REPO,
    Source,
    connect,
    create_refresh_table,
    invariant_violations,
    make_source,
    registry,
    running_batches,
    slice_differences,
    upload_sources,
    worker_command,
    worker_env,
)

pytestmark = pytest.mark.crash  # `make test-crash`, in CI; not in `make test`
_SECONDS = float(os.environ.get("FLEET_SOAK_SECONDS", "20"))
_WORKERS = 8
_TENANTS = 5
_FOLDERS_PER_TENANT = 10
_KEYS_PER_FOLDER = 2  # two deliveries per folder, each delivered again at random
_TTL = 1.0
_STALL = 2.5 * _TTL  # longer than the lease: the stalled worker is taken over
_CHECK_EVERY = 2.0
_HOT_FOLDERS = 4
_SEED = int(os.environ.get("FLEET_SOAK_SEED", "20260722"))


def sources_for(bucket: str) -> list[Source]:
    return [
        make_source(
            bucket,
            f"tenant-{t}",
            f"2026-07-{f + 1:02d}",
            seed=100 * t + f,
            trips=20 + (7 * f) % 30,
            fuel=5 + f,
            vehicles=4,
        )
        for t in range(_TENANTS)
        for f in range(_FOLDERS_PER_TENANT)
    ]


def read_log(path: Path) -> list[dict]:
    records = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # torn by a SIGKILL
    return records


@pytest.mark.slow
@pytest.mark.soak
def test_soak_workers_killed_and_stalled_never_break_the_invariants(
    prefect_api: None,
    database_url: str,
    warehouse,
    s3,
    child_config: dict,
    landing_bucket: str,
    tmp_path: Path,
) -> None:
    rng = random.Random(_SEED)
    create_refresh_table(database_url)
    sources = sources_for(landing_bucket)
    upload_sources(s3, sources)
    plan = [
        [source.tenant_id, source.folder, f"{source.tenant_id}/{source.folder[-11:-1]}/{k}"]
        for source in sources
        for k in range(_KEYS_PER_FOLDER)
    ]
    # Half the picks go to a few hot folders, so workers collide on scopes and batches.
    plan += plan[: _HOT_FOLDERS * _KEYS_PER_FOLDER] * (len(sources) // _HOT_FOLDERS)
    log = tmp_path / "outcomes.jsonl"
    config = {
        **child_config,
        "mode": "loop",
        "ttl": _TTL,
        "refresh_sql": REFRESH_SQL,
        "plan": plan,
        "log": str(log),
        "deadline": time.time() + _SECONDS,
        "prefect_api_url": PREFECT_API_URL.value(),
    }
    spawned = 0

    def spawn(slot: int) -> subprocess.Popen:
        nonlocal spawned
        spawned += 1
        # The child keeps its own copy of the descriptor; ours closes at once.
        with (tmp_path / f"w{slot}.{spawned}.stderr").open("w") as stderr:
            return subprocess.Popen(
                worker_command(
                    {
                        **config,
                        "worker": f"w{slot}.{spawned}",
                        "seed": rng.random(),
                        # Odd slots run the import-s3-folder flow, even ones the core.
                        "path": "flow" if slot % 2 else "core",
                    }
                ),
                env=worker_env(),
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )

    workers = {slot: spawn(slot) for slot in range(_WORKERS)}
    stalled: dict[int, float] = {}  # slot -> when to SIGCONT
    kills = stalls = checks = 0
    violations: list[str] = []
    next_check = time.monotonic() + _CHECK_EVERY
    try:
        while time.time() < config["deadline"]:
            time.sleep(rng.uniform(0.2, 0.6))
            now = time.monotonic()
            for slot, until in list(stalled.items()):
                if now >= until:
                    workers[slot].send_signal(signal.SIGCONT)
                    del stalled[slot]
            slot = rng.randrange(_WORKERS)
            roll = rng.random()
            if roll < 0.2 and slot not in stalled:
                workers[slot].send_signal(signal.SIGKILL)
                workers[slot].wait()
                workers[slot] = spawn(slot)
                kills += 1
            elif roll < 0.35 and slot not in stalled:
                workers[slot].send_signal(signal.SIGSTOP)
                stalled[slot] = now + _STALL
                stalls += 1
            if now >= next_check:
                violations += [f"t+{checks}: {v}" for v in invariant_violations(database_url)]
                checks += 1
                next_check = now + _CHECK_EVERY
    finally:
        for slot in stalled:
            workers[slot].send_signal(signal.SIGCONT)
        for proc in workers.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert violations == []

    records = read_log(log)
    outcomes = Counter(r["outcome"] for r in records)
    errors = Counter(r["error"].split(":")[0] for r in records if r["outcome"] == "Error")
    crashes = [r for r in records if r["outcome"] == "Crash"]
    print(
        f"\nsoak {_SECONDS:.0f}s: {len(records)} runs {dict(outcomes)}, errors {dict(errors)}, "
        f"{kills} kills, {stalls} stalls, {spawned} processes, {checks} mid-run checks"
    )
    assert crashes == [], crashes[:3]
    assert outcomes["Committed"] > 0 and kills > 0

    # At the end, before any repair: every committed slice is exactly its source.
    final_checks = invariant_violations(database_url)
    assert final_checks == []
    by_scope = {(s.tenant_id, s.scope): s for s in sources}
    with connect(database_url) as conn:
        stamped = registry(conn)
        wrong = [problem for key in stamped for problem in slice_differences(conn, by_scope[key])]
    assert wrong == []

    # Drain and rerun: a batch left running is continued by its own delivery (after its
    # lease expired); committed ones are finished by a drain; then every folder is loaded.
    time.sleep(_TTL + 0.3)
    ctx, publisher = soak_worker.build({**config, "worker": "final"})
    publisher.drain("final-drain", lease_ttl=_TTL)
    repo = BatchRepository(database_url)
    for batch_id, tenant_id, _scope in running_batches(database_url):
        batch = repo.get(batch_id)
        outcome = import_folder(
            ctx,
            Tenant.named(tenant_id),
            batch.source_scope.removeprefix("fleet_s3:"),
            batch.delivery_key,
        )
        assert isinstance(outcome, Committed) and outcome.published, (batch_id, outcome)
    for source in sources:
        owner = ctx.warehouse.slice_owner(source.tenant_id, source.scope)
        if owner is None or repo.get(owner).status != BatchStatus.SUCCEEDED:
            outcome = import_folder(ctx, Tenant.named(source.tenant_id), source.folder, "final")
            assert isinstance(outcome, Committed | Skipped), outcome

    assert running_batches(database_url) == []
    assert invariant_violations(database_url, final=True) == []
    with connect(database_url) as conn:
        stamped = registry(conn)
        assert set(stamped) == set(by_scope)
        wrong = [p for key, source in by_scope.items() for p in slice_differences(conn, source)]
    assert wrong == []
