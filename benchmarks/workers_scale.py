"""Scale-out on process workers: folders per minute with 1 and with 3 workers, and what
Prefect costs per run.

A private `prefect server` (on PostgreSQL), the deployments applied from prefect.yaml with
`blocks.register`, and N process workers (`fleet-import worker --limit 2`), each a process
of its own, as in tests/workers/test_scale.py. Per round, `--folders` tiny deliveries (a few
rows each: the orchestration is measured, not the COPY) are started at once with
`run_deployment` (no S3 events: the trigger's latency is not measured here), and the round
is timed from the first start to the moment every one of its batches has succeeded. Each
round has tenants of its own, so nothing is already loaded.

Per flow run, from the Prefect API: `start_to_first_task` is the flow run's start to its
first task's start (the run's process starting, imports, settings and blocks, the claim in
PostgreSQL); `last_task_to_exit` is its last task's end to the flow run's end (artifacts,
the final state). Both are medians over every run of every round.

    .venv/bin/python benchmarks/workers_scale.py [--folders 12] [--workers 1,3]

The last line is exactly (one line)
`workers folders=F per_minute_1=X per_minute_3=Y ratio_3_over_1=R`
` start_to_first_task_s=A last_task_to_exit_s=B`.
On a 2-core host three workers share two cores with the server, PostgreSQL and moto: the
ratio says how much of the third worker's share the host can give, not what a cluster gets.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import boto3
import psycopg

from benchmarks import _harness
from fleet_import.contracts.fleet import FLEET_DATASETS
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import source_scope
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse

DEFAULT_FOLDERS = 12
DEFAULT_WORKERS = (1, 3)
WORKER_LIMIT = 2
DELIVERY = {"trips": 6, "fuel": 4, "vehicles": 3}
ROUND_TIMEOUT_SECONDS = 900.0
_POLL_SECONDS = 0.2


def _succeeded(database_url: str, scopes: set[str]) -> bool:
    with psycopg.connect(database_url) as conn:
        done = {
            scope
            for (scope,) in conn.execute(
                "SELECT source_scope FROM ingestion_batches WHERE status = 'succeeded'"
            )
        }
    return scopes <= done


def _overheads(flow_run_ids: list[Any]) -> tuple[list[float], list[float]]:
    """(flow-run start to first task start, last task end to flow-run end), in seconds."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    to_first, from_last = [], []
    with get_client(sync_client=True) as client:
        for run_id in flow_run_ids:
            deadline = time.monotonic() + 60
            run = client.read_flow_run(run_id)
            while run.end_time is None and time.monotonic() < deadline:
                time.sleep(0.5)
                run = client.read_flow_run(run_id)
            tasks = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))
            )
            starts = [t.start_time for t in tasks if t.start_time]
            ends = [t.end_time for t in tasks if t.end_time]
            if run.start_time and run.end_time and starts and ends:
                to_first.append((min(starts) - run.start_time).total_seconds())
                from_last.append((run.end_time - max(ends)).total_seconds())
    return to_first, from_last


def _round(
    cluster: Any,
    server: Any,
    env: dict[str, str],
    s3: Any,
    landing: str,
    database_url: str,
    workers: int,
    folders: int,
    logs: Path,
    tenants: list[str] | None = None,
    stock: bool = False,
) -> tuple[float, list[Any]]:
    from prefect.deployments import run_deployment

    tenants = tenants or [f"w{workers}t{index:02d}" for index in range(folders)]
    runs = [(tenant, today_folder(landing, tenant)) for tenant in tenants]
    for _, folder in runs:
        prefix = folder.removeprefix(f"s3://{landing}/")
        for name, body in fleet_delivery(**DELIVERY).items():
            s3.put_object(Bucket=landing, Key=prefix + name, Body=body)
    scopes = {source_scope(folder) for _, folder in runs}
    with ExitStack() as stack:
        for index in range(workers):
            stack.enter_context(
                cluster.worker(
                    server, f"bench-w{workers}-{index}", env, logs, WORKER_LIMIT, stock=stock
                )
            )
        time.sleep(2)  # the workers' first poll; not the runs' time
        started = time.monotonic()
        flow_runs = [
            run_deployment(
                "import-s3-folder/import-s3-folder",
                parameters={"tenant_id": tenant, "folder": folder},
                timeout=0,
            ).id
            for tenant, folder in runs
        ]
        cluster.wait_for(
            lambda: _succeeded(database_url, scopes),
            ROUND_TIMEOUT_SECONDS,
            f"{folders} folders on {workers} workers",
            poll=_POLL_SECONDS,
        )
        seconds = time.monotonic() - started
    return seconds, flow_runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folders", type=int, default=DEFAULT_FOLDERS)
    parser.add_argument("--workers", default=",".join(map(str, DEFAULT_WORKERS)))
    parser.add_argument("--database-url", default=None, help="PostgreSQL server (admin URL)")
    args = parser.parse_args(argv)
    counts = [int(part) for part in args.workers.split(",")]

    pgtools = _harness.pgtools()
    cluster = _harness._tests_module("workers.cluster")
    admin_url = args.database_url or pgtools.server_url()
    results: dict[int, float] = {}
    to_first: list[float] = []
    from_last: list[float] = []
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="workers-scale-")))
        database_url = stack.enter_context(_harness.fresh_database(admin_url))
        PostgresWarehouse(database_url).ensure_tables(FLEET_DATASETS.values())
        endpoint = stack.enter_context(_harness.moto_s3())
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        landing, staging = "fleet-landing-bench", "fleet-staging-bench"
        for bucket in (landing, staging):
            s3.create_bucket(Bucket=bucket)
        server, _ = _harness.prefect_server_on_postgres(stack, root, admin_url)
        env = cluster.flow_env(database_url, endpoint, staging)
        cluster.deploy(server, env)
        from prefect.settings import PREFECT_API_URL, temporary_settings

        stack.enter_context(temporary_settings(updates={PREFECT_API_URL: server.api_url}))
        logs = root / "logs"
        logs.mkdir()
        for workers in counts:
            _harness.progress(f"{args.folders} folders on {workers} worker(s)")
            seconds, flow_runs = _round(
                cluster, server, env, s3, landing, database_url, workers, args.folders, logs
            )
            results[workers] = args.folders / seconds * 60
            first, last = _overheads(flow_runs)
            to_first += first
            from_last += last
            print(
                f"workers={workers} folders={args.folders} seconds={seconds:.1f} "
                f"folders_per_minute={results[workers]:.1f} "
                f"start_to_first_task_s={statistics.median(first):.2f} "
                f"last_task_to_exit_s={statistics.median(last):.2f}",
                flush=True,
            )
    one, three = results.get(1), results.get(3)
    ratio = f"{three / one:.2f}" if one and three else "n/a"
    print(
        f"workers folders={args.folders} per_minute_1={one or 0:.1f} "
        f"per_minute_3={three or 0:.1f} ratio_3_over_1={ratio} "
        f"start_to_first_task_s={statistics.median(to_first):.2f} "
        f"last_task_to_exit_s={statistics.median(from_last):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
