"""Trips as CSV text, and one file normalized to Parquet: the test data of the normalization
tests, shared by the modules that test CSV parsing from different sides."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from fleet_import.contracts.fleet import TRIPS
from fleet_import.contracts.model import DatasetContract
from fleet_import.normalize.file import normalize_file
from fleet_import.normalize.output import NormalizedFile

TRIP_COLUMNS = TRIPS.column_names
HEADER = ",".join(TRIP_COLUMNS)


def trip(index: int, **changes: str) -> dict[str, str]:
    """A valid trip as CSV text values; `changes` makes it wrong in one place."""
    values = {
        "trip_id": f"T{index}",
        "vehicle_id": f"V{index % 7}",
        "driver_id": f"D{index % 3}",
        "started_at": "2026-07-22T08:15:00Z",
        "ended_at": "2026-07-22 10:45:30.25+02:00",
        "distance_km": "12.5",
        "start_odometer_km": "1000",
        "end_odometer_km": "1012.5",
        "status": "completed",
    }
    values.update(changes)
    return values


def csv_line(values: dict[str, str]) -> str:
    return ",".join(values.values()) + "\n"


def trips_csv(rows: int, *, start: int = 1) -> str:
    return HEADER + "\n" + "".join(csv_line(trip(i)) for i in range(start, start + rows))


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def run(
    tmp_path: Path,
    content: str | bytes,
    *,
    name: str = "trips.csv",
    fmt: str = "csv",
    contract: DatasetContract = TRIPS,
    **options: int,
) -> NormalizedFile:
    source = write(tmp_path, name, content)
    return normalize_file(
        source,
        source_key=name,
        fmt=fmt,  # type: ignore[arg-type]
        contract=contract,
        out_path=tmp_path / f"{name}.out.parquet",
        **options,
    )


def output(result: NormalizedFile) -> pa.Table:
    return pq.read_table(result.parquet_path)
