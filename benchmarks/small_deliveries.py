"""What a tiny delivery costs end to end: the core, `fleet-import run` against a server, and
folders per minute on one process worker (issue 30, deliverable 1).

One private `prefect server` (on PostgreSQL), the deployments from prefect.yaml, one moto S3
in this process (its CPU is not counted in what is measured). Per round, interleaved:

- `core`: `import_folder` of a tiny delivery (20 vehicles, 200 trips, 80 fuel rows,
  `fleet_import.sample_data.fleet_delivery()`, every Fleet dataset) in a child process,
  timed from just before it starts to its return (imports and interpreter start not timed);
- `run`: `fleet-import run` of a twin folder (another tenant) against the server, timed from
  the command's start to its exit, with the CPU-seconds of its whole process tree
  (`resource.getrusage(RUSAGE_CHILDREN)` around it); per flow run, the task runs and
  artifacts the server holds;
- `workers`: `benchmarks/workers_scale.py`'s round on one worker (its delivery, folder count
  and worker limit), folders per minute;
- `floor`: Prefect's own floor, the same way: a flow of one no-op task run against the same
  server in a fresh interpreter, wall and CPU-seconds, with where its wall went (importing
  Prefect, the engine's start, from the flow's return to the call's, and the exit).

    .venv/bin/python benchmarks/small_deliveries.py [--repeat 1] [--folders 12]

The last line is exactly
`small core_s=A run_s=B run_cpu_s=C per_minute_1_worker=D` (medians over the rounds).
Targets: B <= A + 1.5, C <= 1.5, D >= 3x the figure before issue 30 (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _harness

TINY = {"vehicles": 20, "trips": 200, "fuel": 80}
_CHILD_TIMEOUT_SECONDS = 300.0


def measure_core(spec: dict[str, Any]) -> _harness.Measurement:
    """In the child: one `import_folder` of the tiny folder, every Fleet dataset."""
    from fleet_import.importing.context import Committed
    from fleet_import.importing.driver import import_folder
    from fleet_import.scope import Tenant

    ctx = _harness.core_context(spec)
    with _harness.Window() as window:
        outcome = import_folder(ctx, Tenant.named(spec["tenant"]), spec["folder"], "bench-core")
    if not isinstance(outcome, Committed) or not outcome.published:
        raise RuntimeError(f"import did not succeed: {outcome}")
    return window.measurement("core", sum(outcome.row_counts.values()))


def _put_tiny(s3: Any, folder: str) -> None:
    from fleet_import.sample_data import fleet_delivery
    from fleet_import.scope import split_folder

    bucket, prefix = split_folder(folder)
    for name, body in fleet_delivery(**TINY).items():
        s3.put_object(Bucket=bucket, Key=prefix + name, Body=body)


def _core(bench: dict[str, Any], tenant: str) -> float:
    from fleet_import.sample_data import today_folder

    folder = today_folder(bench["landing"], tenant)
    _put_tiny(bench["s3"], folder)
    spec = {**bench["spec"], "tenant": tenant, "folder": folder}
    child = [str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    return _harness.run_child(child, _CHILD_TIMEOUT_SECONDS).seconds


def _run_counts(tenant: str) -> dict[str, int]:
    """Task runs and artifacts of the tenant's one flow run, as the server holds them."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterTags,
    )

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"tenant:{tenant}"]))
        )
        if not runs:
            return {}
        ids = [runs[0].id]
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=ids))
        )
    return {"task_runs": len(tasks), "artifacts": len(artifacts)}


def _run(bench: dict[str, Any], tenant: str) -> tuple[float, float, dict[str, int]]:
    """`fleet-import run` of a fresh tiny folder: (wall s, CPU s of its process tree)."""
    from fleet_import.sample_data import today_folder

    folder = today_folder(bench["landing"], tenant)
    _put_tiny(bench["s3"], folder)
    command = [str(Path(sys.executable).with_name("fleet-import")), "run", folder]
    profile = bench.get("profile") or ""
    if profile.endswith(".prof"):  # the same command under cProfile, its stats to that file
        command = [sys.executable, "-m", "cProfile", "-o", profile, *command]
    elif profile:  # its imports (-X importtime), their report to that file
        command = [sys.executable, "-X", "importtime", *command]
    command += ["--tenant", tenant]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        command, env=bench["run_env"], capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if profile and not profile.endswith(".prof"):
        Path(profile).write_text(done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"fleet-import run failed ({done.returncode}): {done.stdout[-2000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return seconds, cpu, _run_counts(tenant)


_FLOOR_FLOW = """
import json, sys, time
started = float(sys.argv[1])
marks = {"interpreter": time.time() - started}
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
marks["import prefect"] = time.time() - started

@task(cache_policy=NO_CACHE)
def step() -> int:
    return 1

@flow
def floor() -> int:
    marks["flow body starts"] = time.time() - started
    value = step()
    marks["flow body ends"] = time.time() - started
    return value

floor()
marks["flow call returned"] = time.time() - started
print(json.dumps(marks), flush=True)
"""


def _floor(bench: dict[str, Any]) -> tuple[float, float, dict[str, float]]:
    """Prefect's floor: a one-task flow run against the server, in a fresh interpreter, as
    `fleet-import run` is (wall s, CPU s, the seconds from its start to each mark)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-c", _FLOOR_FLOW, repr(started)],
        env=bench["run_env"],
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.time() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"the one-task flow failed ({done.returncode}): {done.stderr[-2000:]}")
    marks = json.loads(done.stdout.strip().splitlines()[-1])
    marks["process exited"] = seconds
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return seconds, cpu, marks


def _floor_split(marks: dict[str, float]) -> str:
    """Where the one-task flow's wall went, between consecutive marks."""
    names = list(marks)
    return ", ".join(
        f"{name} {marks[name] - (marks[names[i - 1]] if i else 0.0):.2f}"
        for i, name in enumerate(names)
    )


def _bound(splits: list[dict[str, float]], per_minute: float, limit: int) -> str:
    """Where one worker's folders per minute stand: the CPU the Prefect server, PostgreSQL
    and moto spend per folder is on the same cores as the runs, and a worker of `limit`
    slots holds each run for limit x 60 / folders-per-minute seconds of wall."""
    median = {name: statistics.median(s[name] for s in splits) for name in splits[0]}
    cores = os.cpu_count() or 1
    busy = median["host"] * per_minute / 60 / cores
    others = median["host"] - median["workers_and_runs"]
    return (
        f"fleet-import worker, CPU-s per folder (medians): host {median['host']:.2f} = the "
        f"worker and its flow runs {median['workers_and_runs']:.2f} + the Prefect server "
        f"{median['prefect_server']:.2f} + PostgreSQL {median['postgres']:.2f} + moto and this "
        f"benchmark {median['moto_and_bench']:.2f}; the host {busy:.0%} busy; with every core "
        f"busy, runs that cost nothing would allow {cores * 60 / others:.0f} folders/minute; "
        f"each of the {limit} slots held {limit * 60 / per_minute:.1f} s per run"
    )


def _warm(api_url: str) -> None:
    """A fresh server answers its first version request seconds late (seen: 3.3 s): that is
    the server's start, not a run's cost, so it is paid before anything is timed."""
    import httpx

    for path in ("health", "admin/version"):
        httpx.get(f"{api_url}/{path}", timeout=60.0).raise_for_status()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--folders", type=int, default=None, help="per worker round")
    parser.add_argument("--no-workers", action="store_true", help="skip the worker rounds")
    parser.add_argument("--database-url", default=None, help="PostgreSQL server (admin URL)")
    parser.add_argument(
        "--profile",
        default=None,
        help="fleet-import run's cProfile stats (a .prof path) or -X importtime report (other)",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        measure_core(json.loads(args.child)).emit()
        return 0

    import boto3

    from benchmarks import workers_scale
    from fleet_import.contracts.fleet import FLEET_DATASETS
    from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse

    folders = args.folders or workers_scale.DEFAULT_FOLDERS
    pgtools = _harness.pgtools()
    cluster = _harness._tests_module("workers.cluster")
    admin_url = args.database_url or pgtools.server_url()
    figures: dict[str, list[float]] = {
        "core": [],
        "run": [],
        "cpu": [],
        "per_minute": [],
        "per_minute_stock": [],
        "floor": [],
        "floor_cpu": [],
    }
    floor_marks: list[dict[str, float]] = []
    splits: dict[str, list[dict[str, float]]] = {"per_minute": [], "per_minute_stock": []}
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="small-")))
        database_url = stack.enter_context(_harness.fresh_database(admin_url))
        PostgresWarehouse(database_url).ensure_tables(FLEET_DATASETS.values())
        endpoint = stack.enter_context(_harness.moto_s3())
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        landing, staging = "fleet-landing-bench", "fleet-staging-bench"
        for bucket in (landing, staging):
            s3.create_bucket(Bucket=bucket)
        server, _ = _harness.prefect_server_on_postgres(stack, root, admin_url)
        env = cluster.flow_env(database_url, endpoint, staging)
        if not args.no_workers:
            cluster.deploy(server, env)
        from prefect.settings import PREFECT_API_URL, temporary_settings

        stack.enter_context(temporary_settings(updates={PREFECT_API_URL: server.api_url}))
        logs = root / "logs"
        logs.mkdir()
        bench = {
            "profile": args.profile,
            "s3": s3,
            "landing": landing,
            "spec": {
                "endpoint": endpoint,
                "database_url": database_url,
                "staging_uri": f"s3://{staging}/core/",
                "workdir": str(root / "core-work"),
            },
            "run_env": server.env(
                FLEET_DATABASE_URL=database_url,
                FLEET_S3_ENDPOINT_URL=endpoint,
                FLEET_STAGING_URI=f"s3://{staging}/run/",
                FLEET_WORKDIR=str(root / "run-work"),
                PREFECT_LOGGING_LEVEL="WARNING",
            ),
        }
        _warm(server.api_url)
        server_port = server.api_url.rsplit(":", 1)[1].split("/")[0]  # finds its process
        for number in range(args.repeat):
            load = os.getloadavg()[0]
            core = _core(bench, f"core{number:02d}")
            seconds, cpu, counts = _run(bench, f"run{number:02d}")
            line = f"round={number + 1} load={load:.1f} core_s={core:.2f} run_s={seconds:.2f}"
            line += f" run_cpu_s={cpu:.2f} " + " ".join(f"{k}={v}" for k, v in counts.items())
            floor_s, floor_cpu, marks = _floor(bench)
            figures["floor"].append(floor_s)
            figures["floor_cpu"].append(floor_cpu)
            floor_marks.append(marks)
            line += f" floor_s={floor_s:.2f} floor_cpu_s={floor_cpu:.2f}"
            figures["core"].append(core)
            figures["run"].append(seconds)
            figures["cpu"].append(cpu)
            if not args.no_workers:
                for stock in (False, True) if number % 2 else (True, False):
                    key = "per_minute_stock" if stock else "per_minute"
                    tenants = [f"r{number:02d}{key[-5:]}{index:02d}" for index in range(folders)]
                    with _harness.HostSplit("server start", server_port) as split:
                        wall, _ = workers_scale._round(
                            cluster, server, env, s3, landing, database_url, 1, folders, logs,
                            tenants, stock=stock,
                        )  # fmt: skip
                    figures[key].append(folders / wall * 60)
                    per_folder = {name: cpu / folders for name, cpu in split.cpu.items()}
                    splits[key].append(per_folder)
                    print(
                        f"  {'prefect worker start' if stock else 'fleet-import worker'}: "
                        f"{figures[key][-1]:.1f} folders/minute; CPU-s per folder: "
                        + " ".join(f"{name}={cpu:.2f}" for name, cpu in per_folder.items()),
                        flush=True,
                    )
                line += f" per_minute_stock_worker={figures['per_minute_stock'][-1]:.1f}"
                line += f" per_minute_1_worker={figures['per_minute'][-1]:.1f}"
            print(line, flush=True)
    per_minute = statistics.median(figures["per_minute"]) if figures["per_minute"] else 0.0
    if figures["per_minute"]:
        ratios = [
            ours / stock
            for ours, stock in zip(figures["per_minute"], figures["per_minute_stock"], strict=True)
        ]
        print(
            f"one worker: fleet-import worker {per_minute:.1f} folders/minute, "
            f"prefect worker start {statistics.median(figures['per_minute_stock']):.1f} "
            f"(the same deployments and limit, alternating): {statistics.median(ratios):.2f}x"
        )
        print(_bound(splits["per_minute"], per_minute, workers_scale.WORKER_LIMIT))
    median_floor = statistics.median(figures["floor"])
    typical = min(floor_marks, key=lambda marks: abs(marks["process exited"] - median_floor))
    print(
        f"floor: a flow of one no-op task against the same server took {median_floor:.2f} s "
        f"and {statistics.median(figures['floor_cpu']):.2f} CPU-s (medians; the median run: "
        f"{_floor_split(typical)})"
    )
    print(
        f"small core_s={statistics.median(figures['core']):.2f} "
        f"run_s={statistics.median(figures['run']):.2f} "
        f"run_cpu_s={statistics.median(figures['cpu']):.2f} "
        f"per_minute_1_worker={per_minute:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
