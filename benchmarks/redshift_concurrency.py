"""Redshift slice commits under concurrency, through the emulator (tests/redshift_emulator.py,
which has Redshift's table write locks, snapshots and 1023s).

For N = 1, 4 and 16 tenants, each replaces its own slice (vehicles, `--rows` trips, a fifth
as many fuel transactions) in the same curated tables: first the N one after another, then
the same N at once (threads, each with its own RedshiftWarehouse and connections). A round
before the measured ones loads every slice once, so every measured commit replaces one.
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
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from _harness import REPO, fresh_database, moto_s3, progress

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


class _Replays(logging.Handler):
    """Counts the writer's "replaying" warnings: one per slice transaction run again."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "replay" in record.getMessage():
            self.count += 1


@dataclass
class Round:
    seconds: float
    max_lock_hold: float
    retries: int
    failed: int
    errors: list[str]


def _warehouse(emulator: RedshiftEmulator, s3: Any) -> RedshiftWarehouse:
    return RedshiftWarehouse(
        emulator.connect_kwargs(), s3=s3, staging_uri=f"s3://{BUCKET}/stage/", iam_role=ROLE
    )


def _run_round(
    emulator: RedshiftEmulator, s3: Any, loads: list[DatasetLoad], tenants: int, *, together: bool
) -> Round:
    replays = _Replays()
    logging.getLogger("fleet_import.warehouse.redshift").addHandler(replays)
    emulator.lock_holds.clear()
    errors: list[str] = []

    def commit(tenant: str) -> None:
        try:
            _warehouse(emulator, s3).commit_slice(
                tenant_id=tenant,
                source_scope=SCOPE.format(tenant=tenant),
                batch_id=uuid.uuid4(),
                datasets=loads,
            )
        except WarehouseError as exc:
            errors.append(f"{tenant}: {exc}")

    names = [f"tenant-{i:02d}" for i in range(tenants)]
    started = time.perf_counter()
    if together:
        threads = [threading.Thread(target=commit, args=(name,)) for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        for name in names:
            commit(name)
    seconds = time.perf_counter() - started
    logging.getLogger("fleet_import.warehouse.redshift").removeHandler(replays)
    return Round(seconds, max(emulator.lock_holds, default=0.0), replays.count, len(errors), errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="trips rows per tenant")
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    # The writer's warnings are what _Replays counts: let them through, but not to stderr.
    writer_log = logging.getLogger("fleet_import.warehouse.redshift")
    writer_log.setLevel(logging.WARNING)
    writer_log.propagate = False
    counts = {"vehicles": 1_000, "trips": args.rows, "fuel_transactions": args.rows // 5}
    with (
        moto_s3() as endpoint,
        fresh_database(args.database_url, "fleet_bench_rs") as url,
        tempfile.TemporaryDirectory(prefix="bench-redshift-") as tmp,
    ):
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        loads = fleet_loads(Path(tmp), counts)
        with RedshiftEmulator(url, s3) as emulator:
            _warehouse(emulator, s3).ensure_tables(FLEET_DATASETS.values())
            progress(f"loading {max(TENANTS)} slices once ({counts})")
            _run_round(emulator, s3, loads, max(TENANTS), together=False)
            lines: list[str] = []
            for tenants in TENANTS:
                progress(f"n={tenants}: one after another")
                serial = _run_round(emulator, s3, loads, tenants, together=False)
                progress(f"n={tenants}: at once")
                together = _run_round(emulator, s3, loads, tenants, together=True)
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
