"""Issue 16, item 5: fleet-import as deployed, on three workers at once.

A real `prefect server`, the deployments applied from prefect.yaml, three process workers
started as separate processes, the S3 relay on moto's SQS. Three tenants deliver ten folders
each at once; their markers start imports through the S3 trigger while a sweep started at
the same moment starts imports of the same folders. One worker is SIGKILLed in the middle of
a load (its run waits just before the warehouse commit); after its lease expires, a rerun of
that delivery completes it. Every folder ends with exactly one succeeded batch, every slice
holds its delivery's rows once, and no scope ever has two running batches.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections import Counter
from typing import Any

import psycopg
import pytest

from fleet_import.sample_data import fleet_delivery
from fleet_import.scope import source_scope
from tests.prefect_server import asyncpg_url, prefect_server
from tests.s3fixtures import _empty_and_delete, put_objects
from tests.workers.cluster import (
    LANDING_BUCKET,
    deploy,
    flow_env,
    kill_worker,
    notify_queue,
    relay,
    wait_for,
    worker,
)

pytestmark = [pytest.mark.workers, pytest.mark.slow, pytest.mark.timeout(900)]
pytest.importorskip("psutil", reason="the workers extra (distributed) brings it")

TENANTS = ("north", "south", "west")
FOLDERS_PER_TENANT = 10
# Tiny deliveries: the test is about orchestration, not throughput.
DELIVERY = {"trips": 6, "fuel": 4, "vehicles": 3}
ROWS = {"fleet_trips": 6, "fleet_fuel_transactions": 4, "fleet_vehicles": 3}
KEYS = {
    "fleet_trips": "trip_id",
    "fleet_fuel_transactions": "transaction_id",
    "fleet_vehicles": "vehicle_id",
}
# Bounded, not tight: a flow run costs its process several CPU seconds, and 2 cores run
# about 45 of them here (30 deliveries, the sweep and the imports it starts, the rerun).
_ALL_DONE_SECONDS = 600.0


def _folders() -> list[tuple[str, str]]:
    """(tenant, folder): ten recent days per tenant, so the sweep's lookback sees some."""
    today = dt.date.today()
    return [
        (
            tenant,
            f"s3://{LANDING_BUCKET}/{tenant}/fleet/{(today - dt.timedelta(days=d)).isoformat()}/",
        )
        for tenant in TENANTS
        for d in range(FOLDERS_PER_TENANT)
    ]


_T0 = time.monotonic()


def _say(message: str) -> None:
    """Progress on stderr (`pytest -s` shows it): where a slow run spent its time."""
    print(f"[{time.monotonic() - _T0:6.1f}s] {message}", file=sys.stderr, flush=True)


def _batches(database_url: str) -> list[tuple[str, str, str, Any]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT tenant_id, source_scope, status, details->>'phase' FROM ingestion_batches"
        ).fetchall()


def _diagnosis(database_url: str, scopes: dict[str, str]) -> str:
    """Why a delivery did not succeed: its batches, and every flow run of its folder."""
    from prefect.client.orchestration import get_client

    batches = _batches(database_url)
    done = {scope for _, scope, status, _ in batches if status == "succeeded"}
    lines = []
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(limit=200)
    for scope in sorted(set(scopes) - done):
        folder = scope.removeprefix("fleet_s3:")
        lines.append(f"{scope}: batches {[b[2:] for b in batches if b[1] == scope]}")
        for run in runs:
            if run.parameters.get("folder") == folder:
                message = run.state.message if run.state else ""
                lines.append(f"  run {run.name} {run.state_name} {message!r}")
        limits = client.read_global_concurrency_limits(limit=50)
        workers = client.read_workers_for_work_pool("fleet-process-pool")
    states = Counter(run.state_name for run in runs)
    lines.append(f"all flow runs: {dict(states)}")
    lines.append(f"limits: {[(lim.name, lim.active_slots, lim.limit) for lim in limits]}")
    lines.append(f"workers: {[(w.name, w.status, w.last_heartbeat_time) for w in workers]}")
    return "\n".join(lines)


def _log_tails(logs: Any, lines: int = 25) -> str:
    return "\n".join(
        f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        for log in sorted(logs.glob("*.log"))
        if log.name != "relay.log"
    )


def _run_deployment(name: str, **parameters: Any) -> None:
    from prefect.deployments import run_deployment

    run_deployment(name, parameters=parameters, timeout=0)


@pytest.fixture
def fleet_landing(s3: Any) -> Any:
    """The bucket prefect.yaml's trigger watches, emptied and removed afterwards."""
    s3.create_bucket(Bucket=LANDING_BUCKET)
    yield LANDING_BUCKET
    _empty_and_delete(s3, LANDING_BUCKET)


@pytest.fixture
def prefect_database(pg_server_url: str) -> Any:
    """A database of its own for the Prefect server."""
    from tests import pgtools

    name = pgtools.unique_name("prefect")
    yield pgtools.create_database(pg_server_url, name)
    pgtools.drop_database(pg_server_url, name)


def test_thirty_deliveries_on_three_workers_one_killed_mid_load(
    tmp_path,
    prefect_database,
    database_url,
    warehouse,
    moto_endpoint,
    s3,
    sqs,
    staging_bucket,
    fleet_landing,
) -> None:
    queue_url = notify_queue(s3, sqs, fleet_landing, f"fleet-workers-{tmp_path.name[-12:]}")
    env = flow_env(database_url, moto_endpoint, staging_bucket)
    logs = tmp_path / "logs"
    logs.mkdir()
    folders = _folders()
    scopes = {source_scope(folder): tenant for tenant, folder in folders}
    never = tmp_path / "never-released"  # a failpoint waits at most a minute for it
    with prefect_server(
        tmp_path / "prefect",
        PREFECT_SERVER_DATABASE_CONNECTION_URL=asyncpg_url(prefect_database),
    ) as server:
        _say("server up")
        deploy(server, env)
        _say("deployed")
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with (
            temporary_settings(updates={PREFECT_API_URL: server.api_url}),
            relay(server, queue_url, moto_endpoint, logs),
            worker(
                server,
                "w3",
                {**env, "FLEET_FAILPOINTS": f"before_warehouse_commit=wait:{never}"},
                logs,
                limit=1,
            ) as doomed,
        ):
            started = time.monotonic()
            files = {}
            for _, folder in folders:
                prefix = folder.removeprefix(f"s3://{LANDING_BUCKET}/")
                files.update(
                    {prefix + name: body for name, body in fleet_delivery(**DELIVERY).items()}
                )
            put_objects(s3, LANDING_BUCKET, files)
            # The markers last, all at once: 30 deliveries complete at the same moment.
            put_objects(
                s3,
                LANDING_BUCKET,
                {
                    folder.removeprefix(f"s3://{LANDING_BUCKET}/") + "_SUCCESS": b""
                    for _, folder in folders
                },
            )
            _say("30 folders uploaded")
            # w3, alone so far, loads one delivery and stops just before its commit.
            [victim] = wait_for(
                lambda: [
                    scope
                    for _, scope, status, phase in _batches(database_url)
                    if status == "running" and phase == "normalised"
                ],
                timeout=120,
                what="a load on w3 to reach its commit",
            )
            _say(f"w3 holds {victim} before its commit")
            with worker(server, "w1", env, logs), worker(server, "w2", env, logs):
                # A sweep overlapping the events: it starts imports of the same folders.
                _run_deployment("sweep-landing-zone/sweep-landing-zone", marker_grace_seconds=0)
                killed = kill_worker(doomed)
                _say(f"w3 killed with its flow runs {killed}")
                assert killed, "w3 had no flow run process to kill"
                # Its lease (5 s) expires; a rerun of the delivery takes the batch over.
                time.sleep(6)
                tenant = scopes[victim]
                _run_deployment(
                    "import-s3-folder/import-s3-folder",
                    tenant_id=tenant,
                    folder=victim.removeprefix("fleet_s3:"),
                )
                most_running = 0

                def all_succeeded() -> bool:
                    nonlocal most_running
                    batches = _batches(database_url)
                    running = Counter(s for _, s, status, _ in batches if status == "running")
                    most_running = max(most_running, *running.values(), 0)
                    done = {s for _, s, status, _ in batches if status == "succeeded"}
                    return done >= set(scopes)

                _say("rerun of the killed delivery started")
                try:
                    wait_for(all_succeeded, _ALL_DONE_SECONDS, "all deliveries to succeed", poll=1)
                except TimeoutError as exc:
                    raise AssertionError(
                        f"{exc}\n{_diagnosis(database_url, scopes)}\n{_log_tails(logs)}"
                    ) from None
                elapsed = time.monotonic() - started
    print(f"30 deliveries on 3 workers (one killed) in {elapsed:.0f}s")

    batches = _batches(database_url)
    succeeded = Counter(scope for _, scope, status, _ in batches if status == "succeeded")
    assert succeeded == dict.fromkeys(scopes, 1), "each delivery succeeded exactly once"
    assert most_running <= 1  # sampled every second; the unique index makes it so
    assert not [b for b in batches if b[2] == "running"]
    # The killed load's batch was failed as abandoned or continued; nothing else failed.
    failed = [scope for _, scope, status, _ in batches if status == "failed"]
    assert set(failed) <= {victim}, failed
    with psycopg.connect(database_url) as conn:
        for table, rows in ROWS.items():
            counts = dict(
                conn.execute(
                    f"SELECT source_scope, count(*) FROM curated.{table} GROUP BY 1"
                ).fetchall()
            )
            assert counts == dict.fromkeys(scopes, rows), table
            duplicates = conn.execute(
                f"SELECT tenant_id, source_scope, {KEYS[table]} FROM curated.{table} "
                "GROUP BY 1, 2, 3 HAVING count(*) > 1"
            ).fetchall()
            assert duplicates == [], table
            owners = conn.execute(
                f"SELECT count(DISTINCT ingestion_batch_id) FROM curated.{table} "
                "GROUP BY source_scope HAVING count(DISTINCT ingestion_batch_id) > 1"
            ).fetchall()
            assert owners == [], table
