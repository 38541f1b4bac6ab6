"""A thousand folders on one worker (issue 50): one sweep with shards (bulk-import runs, a
task run per delivery) against today's one flow run per delivery, in the same run.

A private `prefect server` on PostgreSQL (its access log counts the API calls), the
deployments from prefect.yaml with their schedules paused, moto in a process of its own, one
`fleet-import worker --limit 2`. Tiny deliveries (6 trips, 4 fuel rows, 3 vehicles: the
orchestration is measured, not the COPY), each with its `_SUCCESS` marker, one bucket per
part so no part's sweep lists another's folders. Parts, in this order:

- `one run per folder`: a sweep with `shards=0` over `--baseline-folders` folders: one
  import-s3-folder run each (today's path), on the worker;
- `bulk, child flow runs`: bulk-import runs with `per_folder="flow"` over as many folders,
  started directly (`--shards` of them): each delivery a child import-s3-folder flow run;
- `bulk` (the figure): a sweep with `shards=--shards` over `--folders` folders
  (`--tenants` tenants x days), timed from the sweep's start to every batch succeeded;
- `one run per folder, prefect worker start` (`--stock-folders N`, last): today's path on
  Prefect's own process worker, without `fleet-import worker`'s run server;
- `core floor`: `import_folder` of `--core-folders` folders one after another in one child
  process, no Prefect: what one core does alone.

Each part is timed from its first start to the moment every one of its batches succeeded.
API calls: the server's HTTP requests in the part's window (its uvicorn access log), per
folder; events (task-run states travel as events in Prefect 3) are counted from the
server's `events` table and printed beside them, not in the last line.

    .venv/bin/python benchmarks/fleet_scale.py [--folders 1000] [--baseline-folders 40]

The last line is exactly
`fleet folders=N seconds=S per_minute=P per_minute_one_run_per_folder=Q ratio=R
prefect_api_calls_per_folder=C core_floor_per_minute=F` (one line): S, P and C of the bulk
sweep, Q today's path, R = P / Q, F the core floor. Targets: R >= 5 (or P >= 0.6 F,
whichever is lower), C <= a third of today's (printed above the last line).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _harness

DELIVERY = {"trips": 6, "fuel": 4, "vehicles": 3}
DEFAULT_FOLDERS = 1000
DEFAULT_TENANTS = 100
DEFAULT_BASELINE_FOLDERS = 40
DEFAULT_SHARDS = 2
DEFAULT_CORE_FOLDERS = 30
WORKER_LIMIT = 2
PART_TIMEOUT_SECONDS = 4 * 3600.0
_POLL_SECONDS = 1.0
_FIRST_DAY = dt.date(2026, 7, 1)
_REQUEST = re.compile(rb'"(GET|POST|PATCH|PUT|DELETE) /api/([^ ?"]*)')
_ID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _folders(s3: Any, bucket: str, tenants: int, count: int) -> list[tuple[str, str]]:
    """`count` tiny deliveries with markers: `tenants` tenants, consecutive days each."""
    from fleet_import.sample_data import fleet_delivery, today_folder
    from fleet_import.scope import split_folder

    files = {**fleet_delivery(**DELIVERY), "_SUCCESS": b""}
    days = -(-count // tenants)
    made = []
    for index in range(count):
        tenant = f"t{index % tenants:03d}"
        date = _FIRST_DAY + dt.timedelta(days=index // tenants % days)
        folder = today_folder(bucket, tenant, date)
        _, prefix = split_folder(folder)
        for name, body in files.items():
            s3.put_object(Bucket=bucket, Key=prefix + name, Body=body)
        made.append((tenant, folder))
    return made


def _succeeded(database_url: str, bucket: str) -> int:
    import psycopg

    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM ingestion_batches WHERE status = 'succeeded'"
            " AND source_scope LIKE %s",
            (f"%s3://{bucket}/%",),
        ).fetchone()
    return int(row[0]) if row else 0


class ServerCounts:
    """The Prefect server's HTTP requests (its access log) and stored events over a window."""

    def __init__(self, log: Path, prefect_url: str) -> None:
        self.log, self.prefect_url = log, prefect_url

    def _requests(self) -> list[str]:
        return [
            f"{method.decode()} /{_ID.sub(b'{id}', path).decode()}"
            for method, path in _REQUEST.findall(self.log.read_bytes())
        ]

    def _events(self) -> int:
        import psycopg

        with psycopg.connect(self.prefect_url) as conn:
            row = conn.execute("SELECT count(*) FROM events").fetchone()
        return int(row[0]) if row else 0

    def __enter__(self) -> ServerCounts:
        self.requests0, self.events0 = self._requests(), self._events()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(3)  # the last events reach the server's table
        calls = self._requests()[len(self.requests0) :]
        self.requests = len(calls)
        self.top = Counter(calls).most_common(8)
        self.events = self._events() - self.events0


def _part(
    name: str,
    start: Callable[[], None],
    database_url: str,
    bucket: str,
    count: int,
    counts: ServerCounts,
) -> dict[str, float]:
    load = os.getloadavg()[0]
    with counts:
        started = time.monotonic()
        start()
        deadline = started + PART_TIMEOUT_SECONDS
        done = 0
        while done < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: {done} of {count} succeeded after the timeout")
            time.sleep(_POLL_SECONDS)
            done = _succeeded(database_url, bucket)
        seconds = time.monotonic() - started
    figures = {
        "folders": count,
        "seconds": seconds,
        "per_minute": count / seconds * 60,
        "api_calls_per_folder": counts.requests / count,
        "events_per_folder": counts.events / count,
        "load": load,
        "load_after": os.getloadavg()[0],
    }
    top = ", ".join(f"{call} {n / count:.2f}" for call, n in counts.top)
    print(
        f"part={name!r} "
        + " ".join(
            f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()
        ),
        flush=True,
    )
    print(f"  most frequent API calls per folder: {top}", flush=True)
    return figures


def core_floor(spec: dict[str, Any]) -> None:
    """In the child: `import_folder` of each folder in turn, no Prefect; prints seconds."""
    from fleet_import.importing.context import Committed
    from fleet_import.importing.driver import import_folder
    from fleet_import.scope import Tenant

    ctx = _harness.core_context(spec)
    started = time.monotonic()
    for tenant, folder in spec["folders"]:
        outcome = import_folder(ctx, Tenant.named(tenant), folder, f"core:{folder}")
        if not isinstance(outcome, Committed) or not outcome.published:
            raise RuntimeError(f"import did not succeed: {outcome}")
    print(f"{_harness.RESULT_PREFIX}{json.dumps({'seconds': time.monotonic() - started})}")


def _core_part(spec: dict[str, Any], folders: list[tuple[str, str]]) -> dict[str, float]:
    import subprocess

    load = os.getloadavg()[0]
    child = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        json.dumps({**spec, "folders": folders}),
    ]
    done = subprocess.run(child, capture_output=True, text=True, check=False, timeout=3600)
    results = [line for line in done.stdout.splitlines() if line.startswith(_harness.RESULT_PREFIX)]
    if done.returncode != 0 or not results:
        raise RuntimeError(f"core floor failed:\n{done.stdout}\n{done.stderr}")
    seconds = json.loads(results[-1].removeprefix(_harness.RESULT_PREFIX))["seconds"]
    figures = {
        "folders": len(folders),
        "seconds": seconds,
        "per_minute": len(folders) / seconds * 60,
        "load": load,
    }
    print("part='core floor' " + " ".join(f"{k}={v:.2f}" for k, v in figures.items()), flush=True)
    return figures


def _pause_schedules() -> None:
    """The deployments' schedules (sweep, drain, freshness) would start runs on the worker
    in the middle of a part."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for deployment in client.read_deployments():
            for schedule in deployment.schedules:
                client.update_deployment_schedule(deployment.id, schedule.id, active=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folders", type=int, default=DEFAULT_FOLDERS)
    parser.add_argument("--tenants", type=int, default=DEFAULT_TENANTS)
    parser.add_argument("--baseline-folders", type=int, default=DEFAULT_BASELINE_FOLDERS)
    parser.add_argument("--shards", type=int, default=DEFAULT_SHARDS)
    parser.add_argument("--core-folders", type=int, default=DEFAULT_CORE_FOLDERS)
    parser.add_argument("--no-flow-runs", action="store_true", help="skip the child-flow part")
    parser.add_argument(
        "--stock-folders",
        type=int,
        default=0,
        help="also one run per folder on `prefect worker start` (no run server), last",
    )
    parser.add_argument("--database-url", default=None, help="PostgreSQL server (admin URL)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        core_floor(json.loads(args.child))
        return 0

    import boto3
    from prefect.deployments import run_deployment

    from fleet_import.contracts.fleet import FLEET_DATASETS
    from fleet_import.intake.shards import shard_imports
    from fleet_import.intake.sweep import PlannedImport
    from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse

    pgtools = _harness.pgtools()
    cluster = _harness._tests_module("workers.cluster")
    admin_url = args.database_url or pgtools.server_url()
    small = min(args.baseline_folders, args.folders)
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-scale-")))
        database_url = stack.enter_context(_harness.fresh_database(admin_url))
        PostgresWarehouse(database_url).ensure_tables(FLEET_DATASETS.values())
        endpoint = stack.enter_context(_harness.moto_s3_process())
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        buckets = {
            part: f"fleet-scale-{part}"
            for part in ("single", "flows", "bulk", "core", "stock", "stage")
        }
        for bucket in buckets.values():
            s3.create_bucket(Bucket=bucket)
        putting = args.folders + 2 * small + args.core_folders + args.stock_folders
        _harness.progress(f"putting {putting} folders")
        tenants_small = max(1, small // 10)
        made = {
            "single": _folders(s3, buckets["single"], tenants_small, small),
            "flows": _folders(s3, buckets["flows"], tenants_small, small),
            "bulk": _folders(s3, buckets["bulk"], args.tenants, args.folders),
            "stock": _folders(s3, buckets["stock"], tenants_small, args.stock_folders),
            "core": _folders(
                s3, buckets["core"], max(1, args.core_folders // 10), args.core_folders
            ),
        }
        server, prefect_url = _harness.prefect_server_on_postgres(
            stack,
            root,
            admin_url,
            PREFECT_SERVER_LOGGING_LEVEL="INFO",  # uvicorn's access log: the API calls
        )
        env = cluster.flow_env(database_url, endpoint, buckets["stage"])
        env["FLEET_LEASE_TTL_SECONDS"] = "60"  # a loaded host must not lose leases
        cluster.deploy(server, env)
        from prefect.settings import PREFECT_API_URL, temporary_settings

        stack.enter_context(temporary_settings(updates={PREFECT_API_URL: server.api_url}))
        _pause_schedules()
        counts = ServerCounts(root / "prefect" / "server.log", prefect_url)
        logs = root / "logs"
        logs.mkdir()
        ours = stack.enter_context(ExitStack())
        ours.enter_context(cluster.worker(server, "fleet-scale", env, logs, WORKER_LIMIT))
        time.sleep(3)  # the worker's first poll

        def sweep(bucket: str, shards: int) -> Callable[[], None]:
            parameters = {
                "bucket": bucket,
                "lookback_days": 0,
                "marker_grace_seconds": 0,
                "shards": shards,
            }
            return lambda: run_deployment(
                "sweep-landing-zone/sweep-landing-zone", parameters=parameters, timeout=0
            )

        def child_flows() -> None:
            planned = [
                PlannedImport(tenant, folder, "-", f"bench:{folder}")
                for tenant, folder in made["flows"]
            ]
            for shard in shard_imports(planned, args.shards):
                run_deployment(
                    "bulk-import/bulk-import",
                    parameters={"deliveries": shard.deliveries, "per_folder": "flow"},
                    timeout=0,
                )

        results: dict[str, dict[str, float]] = {}
        _harness.progress(f"one run per folder: {small} folders")
        results["single"] = _part(
            "one run per folder", sweep(buckets["single"], 0), database_url,
            buckets["single"], small, counts,
        )  # fmt: skip
        if not args.no_flow_runs:
            _harness.progress(f"bulk, child flow runs: {small} folders")
            results["flows"] = _part(
                "bulk, child flow runs", child_flows, database_url, buckets["flows"], small,
                counts,
            )  # fmt: skip
        _harness.progress(f"bulk sweep: {args.folders} folders in {args.shards} shards")
        results["bulk"] = _part(
            f"bulk sweep, {args.shards} shards, task runs", sweep(buckets["bulk"], args.shards),
            database_url, buckets["bulk"], args.folders, counts,
        )  # fmt: skip
        if args.stock_folders:
            ours.close()  # the run server's worth: the per-folder path on Prefect's worker
            with cluster.worker(server, "fleet-scale-stock", env, logs, WORKER_LIMIT, stock=True):
                time.sleep(3)
                _harness.progress(f"one run per folder, stock worker: {args.stock_folders}")
                results["stock"] = _part(
                    "one run per folder, prefect worker start", sweep(buckets["stock"], 0),
                    database_url, buckets["stock"], args.stock_folders, counts,
                )  # fmt: skip
        _harness.progress(f"core floor: {args.core_folders} folders")
        results["core"] = _core_part(
            {
                "endpoint": endpoint,
                "database_url": database_url,
                "staging_uri": f"s3://{buckets['stage']}/core/",
                "workdir": str(root / "core-work"),
            },
            made["core"],
        )
    bulk, single, core = results["bulk"], results["single"], results["core"]
    calls_ratio = bulk["api_calls_per_folder"] / max(single["api_calls_per_folder"], 1e-9)
    print(
        f"api calls per folder: bulk {bulk['api_calls_per_folder']:.2f} against one run per "
        f"folder {single['api_calls_per_folder']:.2f} ({calls_ratio:.2f}x; target <= 0.33); "
        f"per_minute over the core floor {bulk['per_minute'] / core['per_minute']:.2f} "
        "(target >= 0.6 where ratio < 5)",
        flush=True,
    )
    print(
        f"fleet folders={args.folders} seconds={bulk['seconds']:.1f} "
        f"per_minute={bulk['per_minute']:.1f} "
        f"per_minute_one_run_per_folder={single['per_minute']:.1f} "
        f"ratio={bulk['per_minute'] / single['per_minute']:.2f} "
        f"prefect_api_calls_per_folder={bulk['api_calls_per_folder']:.2f} "
        f"core_floor_per_minute={core['per_minute']:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
