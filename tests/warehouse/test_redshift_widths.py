"""String widths in bytes, as Redshift counts them: normalization rejects what a column
cannot hold (one such value would fail the whole COPY), and a contract that grew widens its
table through the real driver against the emulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleet_import.contracts.fleet import VEHICLES
from fleet_import.contracts.model import VARCHAR_MAX_BYTES, Column, DatasetContract
from fleet_import.errors import WarehouseError
from fleet_import.normalize.rows import Reject
from fleet_import.warehouse.base import DatasetLoad, LoadFile
from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse
from tests.normalize_helpers import output, run
from tests.redshift_emulator import RedshiftEmulator
from tests.warehouse_helpers import commit

ROLE = "arn:aws:iam::123456789012:role/fleet-redshift-copy"
NOTES = DatasetContract(
    name="notes",
    file_glob="notes*",
    target_table="curated.fleet_notes",
    natural_key=("id",),
    columns=(
        Column("id", "string", nullable=False, max_length=8),
        Column("grade", "string", allowed=("bien", "très bien")),
        Column("note", "string"),  # unbounded: VARCHAR(65535), in bytes
    ),
)
FITS = "é" * (VARCHAR_MAX_BYTES // 2) + "a"  # 32768 characters, 65535 bytes
TOO_WIDE = "é" * (VARCHAR_MAX_BYTES // 2 + 1)  # 32768 characters, 65536 bytes


def test_a_value_wider_in_bytes_than_its_column_is_a_reject(tmp_path: Path) -> None:
    csv = f"id,grade,note\nn1,très bien,{FITS}\nn2,bien,{TOO_WIDE}\nn3,,short\n"
    result = run(tmp_path, csv, name="notes.csv", contract=NOTES)
    assert result.rejects == [
        Reject(
            "notes.csv",
            3,
            "note",
            f"longer than {VARCHAR_MAX_BYTES} bytes in UTF-8 (the width of its warehouse column)",
            TOO_WIDE[:200],
        )
    ]
    assert output(result).column("id").to_pylist() == ["n1", "n3"]


def test_typed_parquet_strings_are_measured_in_bytes_too(tmp_path: Path) -> None:
    table = pa.table({"id": ["n1", "n2"], "grade": ["bien", None], "note": [TOO_WIDE, FITS]})
    source = tmp_path / "notes.parquet"
    pq.write_table(table, source)
    result = run(tmp_path, source.read_bytes(), name="notes.parquet", fmt="parquet", contract=NOTES)
    assert [(r.line, r.column) for r in result.rejects] == [(1, "note")]  # row 1
    assert result.row_count == 1


def _warehouse(emulator: RedshiftEmulator, s3: Any, bucket: str) -> RedshiftWarehouse:
    return RedshiftWarehouse(
        emulator.connect_kwargs(), s3=s3, staging_uri=f"s3://{bucket}/r/", iam_role=ROLE
    )


def _widths(db: psycopg.Connection[Any], table: str) -> dict[str, int | None]:
    rows = db.execute(
        "SELECT column_name, character_maximum_length FROM information_schema.columns"
        " WHERE table_schema = 'curated' AND table_name = %s",
        [table],
    ).fetchall()
    return dict(rows)


def test_ensure_tables_widens_the_varchars_of_a_grown_contract(
    emulator: RedshiftEmulator, s3: Any, staging_bucket: str, db: psycopg.Connection[Any]
) -> None:
    _warehouse(emulator, s3, staging_bucket).ensure_tables([VEHICLES])
    assert _widths(db, "fleet_vehicles")["vin"] == 68
    create = next(q for q in emulator.queries if '"curated"."fleet_vehicles" (' in q)
    assert create.endswith('DISTSTYLE EVEN SORTKEY ("tenant_id", "source_scope")')
    grown = VEHICLES.model_copy(
        update={
            "columns": tuple(
                c.model_copy(update={"max_length": 40}) if c.name == "vin" else c
                for c in VEHICLES.columns
            )
        }
    )
    _warehouse(emulator, s3, staging_bucket).ensure_tables([grown])
    assert _widths(db, "fleet_vehicles")["vin"] == 160
    assert [q for q in emulator.queries if q.startswith("ALTER")] == [
        'ALTER TABLE "curated"."fleet_vehicles" ALTER COLUMN "vin" TYPE VARCHAR(160)'
    ]
    _warehouse(emulator, s3, staging_bucket).ensure_tables([VEHICLES])  # narrower: kept
    assert _widths(db, "fleet_vehicles")["vin"] == 160


def _grown(contract: DatasetContract, column: str, max_length: int) -> DatasetContract:
    columns = tuple(
        c.model_copy(update={"max_length": max_length}) if c.name == column else c
        for c in contract.columns
    )
    return contract.model_copy(update={"columns": columns})


@pytest.mark.parametrize("encoding", ["bytedict", "text32k"])  # of the four refused
def test_widening_a_column_whose_encoding_refuses_it_re_encodes_it_first(
    emulator: RedshiftEmulator,
    s3: Any,
    staging_bucket: str,
    db: psycopg.Connection[Any],
    encoding: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 27, gap 4: our tables are created without encodings (ENCODE AUTO), which may
    give a low-cardinality VARCHAR one of the encodings ALTER COLUMN ... TYPE refuses. The
    loader does not stick: refused (0A000), it re-encodes the column ZSTD and widens it."""
    _warehouse(emulator, s3, staging_bucket).ensure_tables([VEHICLES])
    emulator.encodings[("curated.fleet_vehicles", "vin")] = encoding  # what AUTO chose
    emulator.queries.clear()
    _warehouse(emulator, s3, staging_bucket).ensure_tables([_grown(VEHICLES, "vin", 40)])
    assert _widths(db, "fleet_vehicles")["vin"] == 160
    widen = 'ALTER TABLE "curated"."fleet_vehicles" ALTER COLUMN "vin" TYPE VARCHAR(160)'
    assert [q for q in emulator.queries if q.startswith("ALTER")] == [
        widen,
        'ALTER TABLE "curated"."fleet_vehicles" ALTER COLUMN "vin" ENCODE ZSTD',
        widen,
    ]
    assert emulator.encodings[("curated.fleet_vehicles", "vin")] == "zstd"
    assert f"{encoding.upper()} encoding" in caplog.text
    emulator.refusals.clear()  # the first widening was refused on purpose


def test_ensure_tables_refuses_a_type_no_alter_can_mend(
    emulator: RedshiftEmulator, s3: Any, staging_bucket: str, db: psycopg.Connection[Any]
) -> None:
    _warehouse(emulator, s3, staging_bucket).ensure_tables([VEHICLES])
    db.execute("ALTER TABLE curated.fleet_vehicles ALTER COLUMN model_year TYPE integer")
    with pytest.raises(WarehouseError) as caught:
        _warehouse(emulator, s3, staging_bucket).ensure_tables([VEHICLES])
    assert "table curated.fleet_vehicles does not match dataset 'vehicles'" in str(caught.value)
    assert "model_year integer" in str(caught.value) and "model_year bigint" in str(caught.value)
    assert caught.value.transient is False


def test_a_normalized_file_loads_where_the_raw_value_would_fail_the_copy(
    emulator: RedshiftEmulator, s3: Any, staging_bucket: str, tmp_path: Path
) -> None:
    """The emulator's COPY counts bytes, as Redshift's does: the over-wide value fails the
    whole COPY unless normalization rejected its row first."""
    redshift = _warehouse(emulator, s3, staging_bucket)
    redshift.ensure_tables([NOTES])
    csv = f"id,grade,note\nn1,très bien,{FITS}\nn2,bien,{TOO_WIDE}\n"
    normalized = run(tmp_path, csv, name="notes.csv", contract=NOTES)
    done = commit(redshift, [DatasetLoad(NOTES, (LoadFile(normalized.parquet_path),))])
    assert done.row_counts == {"notes": 1}
    raw = pa.table(
        {"id": ["n2"], "grade": ["bien"], "note": [TOO_WIDE], "_source_line": pa.array([3])}
    )
    pq.write_table(raw, tmp_path / "raw.parquet")
    with pytest.raises(WarehouseError) as caught:
        commit(redshift, [DatasetLoad(NOTES, (LoadFile(tmp_path / "raw.parquet"),))])
    assert "longer than the length defined in the table" in str(caught.value)
    assert caught.value.transient is False
