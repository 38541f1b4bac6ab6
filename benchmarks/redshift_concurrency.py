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

    .venv/bin/python benchmarks/redshift_concurrency.py [--rows 100000] [--repeat 3]
        [--isolation serializable|snapshot]
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

from fleet_import.config import DEFAULT_WAREHOUSE_LOAD_SLOTS  # noqa: E402
from fleet_import.contracts.fleet import FLEET_DATASETS  # noqa: E402
from fleet_import.errors import WarehouseError
from fleet_import.warehouse.base import DatasetLoad
from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse  # noqa: E402
from tests.redshift_emulator import ISOLATION_LEVELS, RedshiftEmulator  # noqa: E402
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


_slots: Any = None
"""In a pool process: the semaphore standing for the warehouse load slots."""


def _pool_process(slots: Any) -> None:
    global _slots
    _slots = slots


def _commit(
    connect: dict[str, Any], endpoint: str, loads: list[DatasetLoad], tenant: str, limited: bool
) -> str:
    """One tenant's slice replacement, in a pool process: its error, else the number of
    slice transactions it replayed. `limited`: inside a load slot, as the flow holds one of
    fleet-warehouse-loads around its slice load."""
    if limited:
        with _slots:
            return _commit(connect, endpoint, loads, tenant, limited=False)
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
    limited: bool = False,
) -> Round:
    emulator.lock_holds.clear()
    connect = emulator.connect_kwargs()
    names = [f"tenant-{i:02d}" for i in range(tenants)]
    started = time.perf_counter()
    if together:
        futures = [pool.submit(_commit, connect, endpoint, loads, n, limited) for n in names]
        outcomes = [future.result() for future in futures]
    else:
        outcomes = [
            pool.submit(_commit, connect, endpoint, loads, n, limited).result() for n in names
        ]
    seconds = time.perf_counter() - started
    errors = [o for o in outcomes if not o.isdigit()]
    retries = sum(int(o) for o in outcomes if o.isdigit())
    return Round(seconds, max(emulator.lock_holds, default=0.0), retries, len(errors), errors)


def _summary(rounds: list[Round]) -> Round:
    """Medians of the time and of the longest hold (the lower middle of an even count);
    every retry and failure of every round."""
    middle = (len(rounds) - 1) // 2
    return Round(
        sorted(r.seconds for r in rounds)[middle],
        sorted(r.max_lock_hold for r in rounds)[middle],
        sum(r.retries for r in rounds),
        sum(r.failed for r in rounds),
        [e for r in rounds for e in r.errors],
    )


def _warm(_: int) -> None:
    """Make a pool process start (imports done) before anything is timed."""
    time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="trips rows per tenant")
    parser.add_argument("--database-url", default=None)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds per N (one after another, then at once, alternating); report the medians"
        " of time and longest hold, and every retry and failure",
    )
    parser.add_argument(
        "--load-slots",
        type=int,
        default=DEFAULT_WAREHOUSE_LOAD_SLOTS,
        help="also run the 16 at once as deployed: at most this many in the warehouse at a"
        " time, as fleet-warehouse-loads allows (0: skip)",
    )
    parser.add_argument(
        "--isolation",
        choices=ISOLATION_LEVELS,
        default="serializable",
        help="the emulated database's isolation level (new clusters and workgroups: snapshot)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    counts = {"vehicles": 1_000, "trips": args.rows, "fuel_transactions": args.rows // 5}
    with (
        moto_s3_process() as endpoint,
        fresh_database(args.database_url, "fleet_bench_rs") as url,
        tempfile.TemporaryDirectory(prefix="bench-redshift-") as tmp,
        ProcessPoolExecutor(
            max(TENANTS),
            mp_context=(spawn := multiprocessing.get_context("spawn")),
            initializer=_pool_process,
            initargs=(spawn.Semaphore(max(1, args.load_slots)),),
        ) as pool,
    ):
        list(pool.map(_warm, range(max(TENANTS))))
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        loads = fleet_loads(Path(tmp), counts)
        with RedshiftEmulator(url, s3, isolation_level=args.isolation) as emulator:
            RedshiftWarehouse(
                emulator.connect_kwargs(), s3=s3, staging_uri=f"s3://{BUCKET}/stage/", iam_role=ROLE
            ).ensure_tables(FLEET_DATASETS.values())
            progress(f"isolation {args.isolation}: loading {max(TENANTS)} slices once ({counts})")
            _run_round(pool, emulator, endpoint, loads, max(TENANTS), together=False)
            if args.load_slots:
                tenants = max(TENANTS)
                progress(f"n={tenants}: at once, {args.load_slots} in the warehouse at a time")
                slotted = _run_round(
                    pool, emulator, endpoint, loads, tenants, together=True, limited=True
                )
                progress(
                    f"as deployed (fleet-warehouse-loads {args.load_slots}): n={tenants}"
                    f" at once {slotted.seconds:.2f}s max_lock_hold_s={slotted.max_lock_hold:.1f}"
                    f" retries={slotted.retries} failed={slotted.failed}"
                )
            for tenants in TENANTS:
                rounds: dict[bool, list[Round]] = {False: [], True: []}
                for number in range(1, args.repeat + 1):
                    for together in (False, True):
                        how = "at once" if together else "one after another"
                        progress(f"n={tenants}: {how} ({number} of {args.repeat})")
                        done = _run_round(
                            pool, emulator, endpoint, loads, tenants, together=together
                        )
                        for error in done.errors[:3]:
                            progress(f"  failed: {error[:300]}")
                        rounds[together].append(done)
                serial, together = (_summary(rounds[False]), _summary(rounds[True]))
                print(
                    f"n={tenants:2d} serial={serial.seconds:6.2f}s"
                    f" together={together.seconds:6.2f}s"
                    f" lock_hold_serial={serial.max_lock_hold:4.1f}s"
                    f" retries_serial={serial.retries} failed_serial={serial.failed}"
                    f" lock_holds_together={[round(r.max_lock_hold, 1) for r in rounds[True]]}",
                    flush=True,
                )
                print(
                    f"redshift concurrency: n={tenants} "
                    f"makespan={together.seconds / serial.seconds:.2f} "
                    f"max_lock_hold_s={together.max_lock_hold:.1f} "
                    f"retries={together.retries} failed={together.failed}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
