"""The landing-zone sweep at scale: 10,000 delivery folders in moto, swept with the lookback
window and, as the baseline in the same run, over every folder.

The landing zone is `--tenants` x `--days` dated folders (100 x 100 by default), each with a
`_SUCCESS` marker; the folders of the window also hold a small delivery, so the sweep
fingerprints them and plans them against a fresh operational database. Each sweep is
`find_ready_folders` + `plan_sweep` as the flow runs them, on the production S3 client;
LIST requests (every page) are counted by a botocore event hook on that client.

    .venv/bin/python benchmarks/sweep_scale.py [--tenants 100] [--days 100] [--lookback 3]
        [--no-baseline] [--database-url postgresql://postgres@127.0.0.1:5432/postgres]

The last line is `sweep folders=N seconds=X list_calls=Y` for the windowed sweep.
moto answers a LIST by scanning every key of the bucket, so its seconds per LIST grow with
the bucket; the LIST count is what S3 bills and what grows, or not, with history.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._harness import fresh_database, moto_s3, progress
from fleet_import.intake.completion import Marker
from fleet_import.intake.sweep import find_ready_folders, plan_sweep
from fleet_import.s3.client import s3_client
from fleet_import.sample_data import fleet_delivery
from fleet_import.store.sweep_repository import SweepRepository

BUCKET = "fleet-landing-bench"
_PUT_THREADS = 32


class ListCalls:
    """LIST requests a client sent, every page, counted by a botocore event hook."""

    def __init__(self, s3: Any) -> None:
        self.count = 0
        s3.meta.events.register("before-call.s3.ListObjectsV2", self._seen)

    def _seen(self, **kwargs: Any) -> None:
        self.count += 1


def _objects(tenants: int, days: int, lookback: int, today: dt.date) -> dict[str, bytes]:
    """A marker in every folder; a small delivery too in the window's folders."""
    delivery = fleet_delivery(trips=20, fuel=5, vehicles=5)
    objects: dict[str, bytes] = {}
    for t in range(tenants):
        for d in range(days):
            prefix = f"tenant-{t:04d}/fleet/{today - dt.timedelta(days=d)}/"
            objects[prefix + "_SUCCESS"] = b""
            if d <= lookback:
                objects.update({prefix + name: body for name, body in delivery.items()})
    return objects


def _put_client(endpoint: str) -> Any:
    """A plain client with a connection per putting thread."""
    config = Config(max_pool_connections=_PUT_THREADS, retries={"max_attempts": 3})
    return boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)


def _put_all(s3: Any, objects: dict[str, bytes]) -> None:
    with ThreadPoolExecutor(_PUT_THREADS) as pool:
        list(
            pool.map(
                lambda item: s3.put_object(Bucket=BUCKET, Key=item[0], Body=item[1]),
                objects.items(),
            )
        )


def _sweep(s3: Any, calls: ListCalls, repo: SweepRepository, lookback: int) -> dict[str, Any]:
    calls.count = 0
    started = time.perf_counter()
    scan = find_ready_folders(s3, BUCKET, completion=Marker(), lookback_days=lookback)
    plan = plan_sweep(scan, repo)
    return {
        "seconds": time.perf_counter() - started,
        "list_calls": calls.count,
        "listings": scan.listings,
        "ready": len(scan.ready),
        "started": len(plan.start),
        "skipped": len(plan.skip),
        "window": "..".join(map(str, scan.window)) if scan.window else "every-folder",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--days", type=int, default=100)
    parser.add_argument("--lookback", type=int, default=3)
    parser.add_argument("--no-baseline", action="store_true", help="skip the every-folder sweep")
    parser.add_argument("--database-url", default=None, help="PostgreSQL server (admin URL)")
    args = parser.parse_args()
    folders = args.tenants * args.days
    today = dt.datetime.now(dt.UTC).date()

    with fresh_database(args.database_url) as url, moto_s3() as endpoint:
        s3 = s3_client(endpoint)
        s3.create_bucket(Bucket=BUCKET)
        objects = _objects(args.tenants, args.days, args.lookback, today)
        progress(f"putting {len(objects)} objects into {folders} folders")
        started = time.perf_counter()
        _put_all(_put_client(endpoint), objects)
        progress(f"put in {time.perf_counter() - started:.1f} s")
        calls = ListCalls(s3)
        repo = SweepRepository(url)
        _sweep(s3, calls, repo, args.lookback)  # warm: connections, imports, moto's caches
        results = {"window": _sweep(s3, calls, repo, args.lookback)}
        if not args.no_baseline:
            progress("baseline: every folder")
            results["every"] = _sweep(s3, calls, repo, 0)

    for name, result in results.items():
        print(f"{name:6s} " + " ".join(f"{key}={value}" for key, value in result.items()))
    window = results["window"]
    if "every" in results:
        every = results["every"]
        print(
            f"ratio every/window: list_calls={every['list_calls'] / window['list_calls']:.1f}"
            f" seconds={every['seconds'] / window['seconds']:.1f}"
        )
    print(
        f"sweep folders={folders} seconds={window['seconds']:.2f} list_calls={window['list_calls']}"
    )


if __name__ == "__main__":
    main()
