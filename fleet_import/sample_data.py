"""Deterministic Fleet sample deliveries, for the demo, the tests and the benchmarks."""

from __future__ import annotations

import datetime as dt
import gzip
import io
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from fleet_import.contracts.fleet import FUEL_TRANSACTIONS, TRIPS, VEHICLES
from fleet_import.contracts.model import DatasetContract

_EPOCH = np.datetime64("2026-07-01T00:00:00", "s")
_STATUSES = np.array(["completed", "cancelled", "in_progress"])
_FUEL = np.array(["diesel", "petrol", "electric", "hybrid"])


def _iso(seconds: np.ndarray) -> pa.Array:
    stamps = (_EPOCH + seconds.astype("timedelta64[s]")).astype(str)
    return pa.array(np.char.add(stamps, "Z"))


def trips_table(rows: int, *, start: int = 0, seed: int = 7, vehicles: int = 50) -> pa.Table:
    rng = np.random.default_rng(seed + start)
    ids = np.arange(start, start + rows)
    started = rng.integers(0, 30 * 86_400, rows)
    duration = rng.integers(60, 4 * 3_600, rows)
    distance = np.round(rng.uniform(0.5, 250.0, rows), 3)
    odometer = np.round(rng.uniform(1_000, 300_000, rows), 1)
    driver = np.char.add("D", (ids % 97).astype(str)).astype(object)
    driver[ids % 11 == 0] = None
    table = {
        "trip_id": pa.array(np.char.add("T", ids.astype(str))),
        "vehicle_id": pa.array(np.char.add("V", (ids % vehicles).astype(str))),
        "driver_id": pa.array(driver, pa.string()),
        "started_at": _iso(started),
        "ended_at": _iso(started + duration),
        "distance_km": pa.array(distance),
        "start_odometer_km": pa.array(odometer),
        "end_odometer_km": pa.array(np.round(odometer + distance, 1)),
        "status": pa.array(_STATUSES[ids % 3]),
    }
    return pa.table(table).select(TRIPS.column_names)


def vehicles_table(count: int, *, seed: int = 3) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = np.arange(count)
    table = {
        "vehicle_id": pa.array(np.char.add("V", ids.astype(str))),
        "vin": pa.array([f"1FLEET{i:011d}" for i in ids]),
        "registration": pa.array([f"AB{i:04d}CD" for i in ids]),
        "make": pa.array(np.array(["Volvo", "Scania", "Ford", "Tesla"])[ids % 4]),
        "model": pa.array(np.array(["FH16", "R450", "Transit", "Semi"])[ids % 4]),
        "model_year": pa.array(2015 + ids % 10),
        "fuel_type": pa.array(_FUEL[ids % 4]),
        "status": pa.array(
            np.array(["active", "maintenance", "retired"])[(ids % 7 == 0) * 1 + (ids % 13 == 0) * 1]
        ),
        "odometer_km": pa.array(np.round(rng.uniform(1_000, 300_000, count), 1)),
        "updated_at": _iso(rng.integers(0, 86_400, count)),
    }
    return pa.table(table).select(VEHICLES.column_names)


def fuel_table(rows: int, *, seed: int = 5, vehicles: int = 50) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = np.arange(rows)
    litres = np.round(rng.uniform(5, 400, rows), 2)
    price = np.round(rng.uniform(1.4, 2.1, rows), 3)
    driver = np.char.add("D", (ids % 97).astype(str)).astype(object)
    driver[ids % 5 == 0] = None
    table = {
        "transaction_id": pa.array(np.char.add("F", ids.astype(str))),
        "vehicle_id": pa.array(np.char.add("V", (ids % vehicles).astype(str))),
        "driver_id": pa.array(driver, pa.string()),
        "transacted_at": _iso(rng.integers(0, 30 * 86_400, rows)),
        "fuel_type": pa.array(_FUEL[ids % 2]),
        "litres": pa.array(litres),
        # Money as the contract types it: rounded floats cast to decimals land exactly.
        "price_per_litre": pa.array(price).cast(pa.decimal128(10, 4)),
        "total_amount": pa.array(np.round(litres * price, 2)).cast(pa.decimal128(12, 2)),
        "currency": pa.array(np.full(rows, "EUR")),
        "station_id": pa.array(np.char.add("S", (ids % 31).astype(str))),
        "odometer_km": pa.array(np.round(rng.uniform(1_000, 300_000, rows), 1)),
    }
    return pa.table(table).select(FUEL_TRANSACTIONS.column_names)


def csv_bytes(table: pa.Table, *, gzipped: bool = False) -> bytes:
    sink = io.BytesIO()
    pacsv.write_csv(table, sink, pacsv.WriteOptions(quoting_style="needed"))
    data = sink.getvalue()
    return gzip.compress(data, compresslevel=1) if gzipped else data


def parquet_bytes(table: pa.Table, contract: DatasetContract | None = None) -> bytes:
    """Parquet as a producer would write it: typed columns when the contract is given."""
    if contract is not None:
        table = table.cast(contract.arrow_schema)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def fleet_delivery(
    *, trips: int = 200, fuel: int = 80, vehicles: int = 20, bad_rows: bool = False
) -> dict[str, bytes]:
    """One folder's files: vehicles.csv, trips-{n}.csv(.gz), fuel_transactions.jsonl-free CSV.

    With bad_rows, a few rows are broken in ways a real delivery breaks (a bad timestamp, a
    negative distance, an unknown status), each of which must become a reject.
    """
    files = {
        "vehicles.csv": csv_bytes(vehicles_table(vehicles)),
        "trips-1.csv": csv_bytes(trips_table(trips // 2, vehicles=vehicles)),
        "trips-2.csv.gz": csv_bytes(
            trips_table(trips - trips // 2, start=trips // 2, vehicles=vehicles), gzipped=True
        ),
        "fuel_transactions.parquet": parquet_bytes(
            fuel_table(fuel, vehicles=vehicles), FUEL_TRANSACTIONS
        ),
    }
    if bad_rows:
        files["trips-1.csv"] += (
            b"TBAD1,V1,D1,yesterday,2026-07-02T10:00:00Z,12.5,1000,1012.5,completed\n"
            b"TBAD2,V1,,2026-07-02T09:00:00Z,2026-07-02T10:00:00Z,-4,1000,996,completed\n"
            b"TBAD3,V2,D2,2026-07-02T09:00:00Z,,7.0,1000,1007,teleported\n"
        )
    return files


def trips_csv_files(total_rows: int, files: int) -> Iterator[tuple[str, bytes]]:
    per_file = -(-total_rows // files)
    for index in range(files):
        start = index * per_file
        rows = min(per_file, total_rows - start)
        if rows > 0:
            yield f"trips-{index:03d}.csv", csv_bytes(trips_table(rows, start=start))


def with_manifest(files: dict[str, bytes], folder: str) -> dict[str, bytes]:
    """The files plus the delivery manifest (`_manifest.json`) that lists them whole."""
    from fleet_import.s3.delivery_manifest import MANIFEST_NAME, manifest_for

    return {**files, MANIFEST_NAME: manifest_for(files, folder, {})}


def today_folder(bucket: str, tenant_id: str, day: dt.date | None = None) -> str:
    return f"s3://{bucket}/{tenant_id}/fleet/{(day or dt.date(2026, 7, 22)).isoformat()}/"
