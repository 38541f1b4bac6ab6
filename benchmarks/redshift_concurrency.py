"""Redshift slice commits under concurrency, through the emulator (tests/redshift_emulator.py,
which has Redshift's table write locks, snapshots and 1023s).

For N = 1, 4 and 16 tenants, each replaces its own slice (vehicles, `--rows` trips, a fifth
as many fuel transactions) in the same curated tables: first the N one after another, then
the same N at once. Each tenant runs in a process of its own, as each flow run does, with its
own RedshiftWarehouse; the "cluster" (the emulator, in this process) and S3 (moto) run in
processes apart from them, as Redshift and S3 do. A round before the measured ones loads
every slice once, so every measured commit replaces one.
Reported per N: the makespan (N at once / N one after another, same run), the longest any
transaction held a table lock, the slice transactions replayed (1023 or a lost connection),
and the slices that failed.

The last line is exactly
`redshift concurrency: n=16 makespan=X.XX max_lock_hold_s=Y.Y retries=Z failed=F`.

    .venv/bin/python benchmarks/redshift_concurrency.py [--rows 100000] [--database-url URL]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import sys
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from _harness import REPO, fresh_database, moto_s3_process, progress

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fleet_import.contracts import FLEET_DATASETS  # noqa: E402
from fleet_import.warehouse import DatasetLoad, WarehouseError  # noqa: E402
from fleet_import.warehouse.redshift import RedshiftWarehouse  # noqa: E402
from tests.redshift_emulator import RedshiftEmulator  # noqa: E402
from tests.warehouse_helpers import fleet_loads  # noqa: E402

BUCKET = "bench-redshift-staging"
ROLE = "arn:aws:iam::123456789012:role/bench-copy"
SCOPE = "fleet_s3:s3://bench-landing/{tenant}/fleet/2026-11-30/"
TENANTS = (1, 4, 16)


@dataclass
class Round:
    seconds: float
    max_lock_hold: float
    retries: int
    failed: int
    errors: list[str]


def _commit(connect: dict[str, Any], endpoint: str, loads: list[DatasetLoad], tenant: str) -> str:
    """One tenant's slice replacement, in a pool process: its error, else the number of
    slice transactions it replayed."""
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    warehouse = RedshiftWarehouse(
        connect, s3=s3, staging_uri=f"s3://{BUCKET}/stage/", iam_role=ROLE
    )
    try:
        warehouse.commit_slice(
            tenant_id=tenant,
            source_scope=SCOPE.format(tenant=tenant),
            batch_id=uuid.uuid4(),
            datasets=loads,
        )
    except WarehouseError as exc:
        return f"{tenant}: {exc}"
    return f"{warehouse.replays}"


def _run_round(
    pool: ProcessPoolExecutor,
    emulator: RedshiftEmulator,
    endpoint: str,
    loads: list[DatasetLoad],
    tenants: int,
    *,
    together: bool,
) -> Round:
    emulator.lock_holds.clear()
    connect = emulator.connect_kwargs()
    names = [f"tenant-{i:02d}" for i in range(tenants)]
    started = time.perf_counter()
    if together:
        futures = [pool.submit(_commit, connect, endpoint, loads, n) for n in names]
        outcomes = [future.result() for future in futures]
    else:
        outcomes = [pool.submit(_commit, connect, endpoint, loads, n).result() for n in names]
    seconds = time.perf_counter() - started
    errors = [o for o in outcomes if not o.isdigit()]
    retries = sum(int(o) for o in outcomes if o.isdigit())
    return Round(seconds, max(emulator.lock_holds, default=0.0), retries, len(errors), errors)


def _warm(_: int) -> None:
    """Make a pool process start (imports done) before anything is timed."""
    time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="trips rows per tenant")
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    counts = {"vehicles": 1_000, "trips": args.rows, "fuel_transactions": args.rows // 5}
    with (
        moto_s3_process() as endpoint,
        fresh_database(args.database_url, "fleet_bench_rs") as url,
        tempfile.TemporaryDirectory(prefix="bench-redshift-") as tmp,
        ProcessPoolExecutor(max(TENANTS), mp_context=multiprocessing.get_context("spawn")) as pool,
    ):
        list(pool.map(_warm, range(max(TENANTS))))
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        loads = fleet_loads(Path(tmp), counts)
        with RedshiftEmulator(url, s3) as emulator:
            RedshiftWarehouse(
                emulator.connect_kwargs(), s3=s3, staging_uri=f"s3://{BUCKET}/stage/", iam_role=ROLE
            ).ensure_tables(FLEET_DATASETS.values())
            progress(f"loading {max(TENANTS)} slices once ({counts})")
            _run_round(pool, emulator, endpoint, loads, max(TENANTS), together=False)
            lines: list[str] = []
            for tenants in TENANTS:
                progress(f"n={tenants}: one after another")
                serial = _run_round(pool, emulator, endpoint, loads, tenants, together=False)
                progress(f"n={tenants}: at once")
                together = _run_round(pool, emulator, endpoint, loads, tenants, together=True)
                for error in together.errors[:3]:
                    progress(f"  failed: {error[:300]}")
                print(
                    f"n={tenants:2d} serial={serial.seconds:6.2f}s"
                    f" together={together.seconds:6.2f}s"
                    f" lock_hold_serial={serial.max_lock_hold:4.1f}s"
                    f" retries_serial={serial.retries} failed_serial={serial.failed}",
                    flush=True,
                )
                lines.append(
                    f"redshift concurrency: n={tenants} "
                    f"makespan={together.seconds / serial.seconds:.2f} "
                    f"max_lock_hold_s={together.max_lock_hold:.1f} "
                    f"retries={together.retries} failed={together.failed}"
                )
                print(lines[-1], flush=True)


if __name__ == "__main__":
    main()
