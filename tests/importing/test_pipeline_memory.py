"""Memory is bounded by batch size, not by delivery size: 2M rows under 400 MB peak RSS."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from fleet_import.sample_data import csv_bytes, fuel_table, trips_csv_files, vehicles_table
from fleet_import.scope import split_folder
from tests.import_child import run_import_child

_ROWS = 2_000_000
_MAX_RSS_MB = 400


@pytest.mark.slow
@pytest.mark.e2e  # a whole import of 2M rows in a child process: 17-25 s of both cores
def test_two_million_rows_load_under_400_mb(
    s3,
    moto_endpoint: str,
    landing_bucket: str,
    staging_bucket: str,
    database_url: str,
    warehouse,
    tmp_path,
) -> None:
    folder = f"s3://{landing_bucket}/acme/fleet/2026-07-22/"
    bucket, prefix = split_folder(folder)
    s3.put_object(Bucket=bucket, Key=prefix + "vehicles.csv", Body=csv_bytes(vehicles_table(50)))
    s3.put_object(
        Bucket=bucket, Key=prefix + "fuel_transactions.csv", Body=csv_bytes(fuel_table(100))
    )

    def put(item: tuple[str, bytes]) -> None:
        s3.put_object(Bucket=bucket, Key=prefix + item[0], Body=item[1])

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(put, trips_csv_files(_ROWS, 8)))

    child = run_import_child(
        database_url,
        moto_endpoint,
        staging_bucket,
        folder,
        "big",
        workdir=tmp_path / "work",
        ttl=60,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.splitlines()[0] == "Committed", child.stdout
    rss_mb = int(re.search(r"maxrss_kb=(\d+)", child.stdout).group(1)) / 1024
    print(f"peak RSS for {_ROWS:,} rows: {rss_mb:.0f} MB")
    assert rss_mb < _MAX_RSS_MB
    assert warehouse.slice_counts("acme", "fleet_s3:" + folder)["trips"] == _ROWS
