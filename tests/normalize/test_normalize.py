"""Normalization of source files: types, rejects with exact lines, file-level failures,
duplicate keys, reject ratio, reports. Local files only: no database, no S3."""

from __future__ import annotations

import csv
import datetime as dt
import gc
import gzip
import io
import json
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleet_import.contracts.fleet import TRIPS
from fleet_import.contracts.model import Column, DatasetContract
from fleet_import.normalize import csv as normalize_csv
from fleet_import.normalize import file as normalize
from fleet_import.normalize.duplicates import (
    HashBuckets,
    find_duplicate_keys,
    find_duplicates,
    key_hashes,
)
from fleet_import.normalize.file import (
    RejectRatioExceeded,
    check_reject_ratio,
    normalize_file,
    summarize_rejects,
    write_rejects,
)
from fleet_import.normalize.output import NormalizedFile
from fleet_import.normalize.rows import (
    SOURCE_LINE_COLUMN,
    SOURCE_LINE_COUNT_COLUMN,
    FileRejected,
    Reject,
    output_schema,
)
from tests.normalize_helpers import HEADER, TRIP_COLUMNS, csv_line, output, run, trip, trips_csv

UTC = dt.UTC

# Every column type and constraint, for the cases the Fleet datasets do not exercise.
ALL_TYPES = DatasetContract(
    name="all_types",
    file_glob="all_types*",
    target_table="curated.all_types",
    natural_key=("id",),
    columns=(
        Column("id", "string", nullable=False, max_length=8),
        Column("count", "int64", min_value=0),
        Column("ratio", "float64"),
        Column("active", "bool"),
        Column("seen_at", "timestamptz"),
        Column("day", "date"),
    ),
)


# --- test data -----------------------------------------------------------------------------


def generated_trips(rows: int) -> Iterator[str]:
    """A large valid CSV, generated quickly, in pieces."""
    yield HEADER + "\n"
    for i in range(rows):
        yield (
            f"T{i:08d},V{i % 500},D{i % 90},2026-07-{1 + i % 28:02d}T{i % 24:02d}:15:00Z,,"
            f"{i % 300}.5,{i},{i + 300},completed\n"
        )


def only_reject(result: NormalizedFile) -> Reject:
    assert result.reject_count == 1, result.rejects
    return result.rejects[0]


# --- formats -------------------------------------------------------------------------------


def test_csv_rows_become_typed_columns_in_contract_order(tmp_path: Path) -> None:
    content = trips_csv(2) + csv_line(trip(3, driver_id="", ended_at="", distance_km=""))

    result = run(tmp_path, content)

    table = output(result)
    assert table.schema == output_schema(TRIPS)
    assert table.schema.names == [*TRIP_COLUMNS, SOURCE_LINE_COLUMN, SOURCE_LINE_COUNT_COLUMN]
    assert (result.row_count, result.reject_count, result.rejects) == (3, 0, [])
    first = table.to_pylist()[0]
    assert first["started_at"] == dt.datetime(2026, 7, 22, 8, 15, tzinfo=UTC)
    assert first["ended_at"] == dt.datetime(2026, 7, 22, 8, 45, 30, 250000, tzinfo=UTC)
    assert first["distance_km"] == 12.5
    assert first["start_odometer_km"] == 1000.0
    assert table.column(SOURCE_LINE_COLUMN).to_pylist() == [2, 3, 4]
    last = table.to_pylist()[2]
    assert (last["driver_id"], last["ended_at"], last["distance_km"]) == (None, None, None)


def test_csv_gz_reads_like_csv(tmp_path: Path) -> None:
    content = trips_csv(5)
    plain = run(tmp_path, content)
    packed = run(tmp_path, gzip.compress(content.encode()), name="trips.csv.gz", fmt="csv.gz")

    assert output(packed).equals(output(plain))
    assert packed.row_count == 5


def test_file_objects_are_read_and_left_open(tmp_path: Path) -> None:
    content = trips_csv(3).encode()
    for fmt, data in (("csv", content), ("csv.gz", gzip.compress(content))):
        source = io.BytesIO(data)
        result = normalize_file(
            source,
            source_key=f"trips.{fmt}",
            fmt=fmt,  # type: ignore[arg-type]
            contract=TRIPS,
            out_path=tmp_path / f"{fmt}.parquet",
        )
        gc.collect()  # Arrow's file wrappers close what they wrap when collected
        assert result.row_count == 3
        assert not source.closed


def test_a_dropped_connection_is_not_a_rejected_file(tmp_path: Path) -> None:
    """A reset stream says nothing about the file: it must stay retryable."""

    class Dropping(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, target: bytearray) -> int:  # type: ignore[override]
            raise ConnectionResetError("connection reset by peer")

    with pytest.raises(ConnectionResetError):
        normalize_file(
            Dropping(),
            source_key="trips.csv",
            fmt="csv",
            contract=TRIPS,
            out_path=tmp_path / "out.parquet",
        )
    assert list(tmp_path.iterdir()) == []


def test_parquet_columns_are_cast_to_contract_types(tmp_path: Path) -> None:
    moment = dt.datetime(2026, 7, 22, 8, 15, tzinfo=UTC)
    source = pa.table(
        {
            # Another column order, narrower and dictionary types, nanoseconds, text times.
            "status": pa.array(["completed", "cancelled", "done"]).dictionary_encode(),
            "trip_id": ["T1", "T2", "T3"],
            "vehicle_id": pa.array(["V1", "V2", "V3"], pa.large_string()),
            "driver_id": [None, "D2", "D3"],
            "started_at": pa.array([moment] * 3, pa.timestamp("ns", tz="Europe/Berlin")),
            "ended_at": ["2026-07-22T10:00:00+02:00", "not a time", None],
            "distance_km": pa.array([1.5, 2.0, 3.0], pa.float32()),
            "start_odometer_km": pa.array([100, 200, 300], pa.int32()),
            "end_odometer_km": [101.5, 202.0, 303.0],
        }
    )
    path = tmp_path / "trips.parquet"
    pq.write_table(source, path)

    result = normalize_file(
        path,
        source_key="trips.parquet",
        fmt="parquet",
        contract=TRIPS,
        out_path=tmp_path / "out.parquet",
    )

    table = output(result)
    assert table.schema == output_schema(TRIPS)
    assert table.column("trip_id").to_pylist() == ["T1"]
    row = table.to_pylist()[0]
    assert row["started_at"] == moment
    assert row["ended_at"] == dt.datetime(2026, 7, 22, 8, tzinfo=UTC)
    assert (row["distance_km"], row["start_odometer_km"], row[SOURCE_LINE_COLUMN]) == (1.5, 100, 1)
    assert [(r.line, r.column, r.reason, r.value) for r in result.rejects] == [
        (2, "ended_at", "not a valid timestamp with time zone", "not a time"),
        (3, "status", "not one of: completed, cancelled, in_progress", "done"),
    ]


def test_parquet_from_an_unseekable_stream(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    pq.write_table(output(run(tmp_path, trips_csv(4))).select(TRIP_COLUMNS), buffer)

    class Unseekable(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self._data = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def readinto(self, target: bytearray) -> int:  # type: ignore[override]
            chunk = self._data.read(len(target))
            target[: len(chunk)] = chunk
            return len(chunk)

    result = normalize_file(
        Unseekable(buffer.getvalue()),
        source_key="trips.parquet",
        fmt="parquet",
        contract=TRIPS,
        out_path=tmp_path / "stream.parquet",
    )
    assert result.row_count == 4


def test_jsonl_fast_path_types_and_lines(tmp_path: Path) -> None:
    rows = [
        {**trip(i), "distance_km": 12.5, "start_odometer_km": 1000, "end_odometer_km": None}
        for i in range(1, 4)
    ]
    content = "".join(json.dumps(row) + "\n" for row in rows)

    result = run(tmp_path, content, name="trips.jsonl", fmt="jsonl")

    table = output(result)
    assert table.schema == output_schema(TRIPS)
    assert result.row_count == 3 and result.rejects == []
    assert table.column(SOURCE_LINE_COLUMN).to_pylist() == [1, 2, 3]
    assert table.column("distance_km").to_pylist() == [12.5] * 3
    assert table.column("ended_at")[0].as_py() == dt.datetime(
        2026, 7, 22, 8, 45, 30, 250000, tzinfo=UTC
    )


def test_jsonl_line_by_line_path_means_the_same_as_the_fast_path(tmp_path: Path) -> None:
    rows = [
        {**trip(1), "distance_km": 1.5, "driver_id": None},
        {**trip(2), "distance_km": -1},  # below minimum
        {**trip(3), "started_at": "2026-07-22 10:00:00+02:00", "end_odometer_km": 7},
    ]
    content = "".join(json.dumps(row) + "\n" for row in rows)

    fast = run(tmp_path, content, name="fast.jsonl", fmt="jsonl")
    slow = run(tmp_path, content.replace("\n", "\n\n", 1), name="slow.jsonl", fmt="jsonl")

    assert (
        output(fast)
        .drop_columns([SOURCE_LINE_COLUMN])
        .equals(output(slow).drop_columns([SOURCE_LINE_COLUMN]))
    )
    assert output(fast).column(SOURCE_LINE_COLUMN).to_pylist() == [1, 3]
    assert output(slow).column(SOURCE_LINE_COLUMN).to_pylist() == [1, 4]
    assert [(r.line, r.reason) for r in fast.rejects] == [(2, "below minimum 0")]
    assert [(r.line, r.reason) for r in slow.rejects] == [(3, "below minimum 0")]


def test_jsonl_bad_lines_are_rejects_with_their_line(tmp_path: Path) -> None:
    lines = [
        json.dumps(trip(1)),  # 1: numbers as strings are fine
        '{"trip_id": "T2", "vehicle_id": ',  # 2: cut off
        "",  # 3: blank lines are skipped
        json.dumps([1, 2]),  # 4
        json.dumps({**trip(5), "colour": "red"}),  # 5
        json.dumps({**trip(6), "distance_km": {"km": 1}}),  # 6
        json.dumps({**trip(7), "distance_km": 7}),  # 7
        json.dumps({**trip(8), "started_at": "2026-07-22T08:15:00"}),  # 8
    ]
    content = "\n".join(lines).encode() + b"\n" + b'{"trip_id": "T\xff9"}\n'  # 9

    result = run(tmp_path, content, name="trips.jsonl", fmt="jsonl")

    assert output(result).column(SOURCE_LINE_COLUMN).to_pylist() == [1, 7]
    assert [(r.line, r.column, r.reason) for r in result.rejects] == [
        (2, None, "invalid JSON"),
        (4, None, "not a JSON object"),
        (5, "colour", "unexpected field"),
        (6, "distance_km", "expected a single value, found an object or array"),
        (8, "started_at", "timestamp without time zone"),
        (9, None, "invalid UTF-8"),
    ]
    assert all(r.file == "trips.jsonl" for r in result.rejects)


# --- bad rows ------------------------------------------------------------------------------

BAD_VALUES = [
    # (column, value, reason)
    ("started_at", "2026-07-22T08:15:00", "timestamp without time zone"),
    ("started_at", "2026-07-22", "timestamp without time zone"),
    ("started_at", "yesterday", "not a valid timestamp with time zone"),
    ("started_at", "2026-02-30T08:15:00Z", "not a valid timestamp with time zone"),
    ("ended_at", "0000-01-01T00:00:00Z", "timestamp out of range"),
    ("trip_id", "", "required value missing"),
    ("started_at", "", "required value missing"),
    ("status", "   ", "not one of: completed, cancelled, in_progress"),
    ("distance_km", "twelve", "not a valid number"),
    ("distance_km", '"12,5"', "not a valid number"),
    ("distance_km", "NaN", "not a finite number"),
    ("distance_km", "inf", "not a finite number"),
    ("distance_km", "-Infinity", "not a finite number"),
    ("distance_km", "-0.5", "below minimum 0"),
    ("status", "done", "not one of: completed, cancelled, in_progress"),
    ("vehicle_id", "V" * 65, "longer than 64 characters"),
]


@pytest.mark.parametrize(("column", "value", "reason"), BAD_VALUES)
def test_bad_value_rejects_its_row_with_line_column_and_reason(
    tmp_path: Path, column: str, value: str, reason: str
) -> None:
    # Header on line 1, three good rows, the bad one on line 5, a good one after it.
    content = trips_csv(3) + csv_line(trip(4, **{column: value})) + csv_line(trip(5))

    result = run(tmp_path, content)

    reject = only_reject(result)
    expected_value = value.strip('"') or None
    assert reject == Reject("trips.csv", 5, column, reason, expected_value)
    assert result.row_count == 4
    assert output(result).column("trip_id").to_pylist() == ["T1", "T2", "T3", "T5"]


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("T4,V1,D1,2026-07-22T08:15:00Z,,1,2\n", "expected 9 columns, found 7"),
        ("T4,V1,D1,2026-07-22T08:15:00Z,,1,2,3,completed,extra\n", "expected 9 columns, found 10"),
    ],
)
def test_wrong_column_count_rejects_the_row(tmp_path: Path, row: str, reason: str) -> None:
    result = run(tmp_path, trips_csv(3) + row + csv_line(trip(5)))

    assert only_reject(result) == Reject("trips.csv", 5, None, reason, row.rstrip("\n"))
    assert result.row_count == 4


def test_invalid_utf8_rejects_the_row_only(tmp_path: Path) -> None:
    bad = csv_line(trip(4, driver_id="D\x00")).encode().replace(b"\x00", b"\xff\xfe")
    content = trips_csv(3).encode() + bad + csv_line(trip(5, driver_id="Zoë")).encode()

    result = run(tmp_path, content)

    reject = only_reject(result)
    assert (reject.line, reject.column, reject.reason) == (5, "driver_id", "invalid UTF-8")
    assert output(result).column("driver_id").to_pylist()[-1] == "Zoë"


def test_invalid_utf8_in_a_malformed_row_is_still_one_reject(tmp_path: Path) -> None:
    content = trips_csv(2).encode() + b"T3,\xff\n" + csv_line(trip(4)).encode()

    result = run(tmp_path, content)

    assert (only_reject(result).line, only_reject(result).reason) == (
        4,
        "expected 9 columns, found 2",
    )
    assert result.row_count == 3


def test_a_row_failing_twice_is_one_reject_for_its_first_column(tmp_path: Path) -> None:
    content = trips_csv(1) + csv_line(trip(2, vehicle_id="", status="done"))

    reject = only_reject(run(tmp_path, content))

    assert (reject.line, reject.column, reject.reason) == (
        3,
        "vehicle_id",
        "required value missing",
    )


def test_long_values_are_truncated_in_rejects(tmp_path: Path) -> None:
    reject = only_reject(run(tmp_path, trips_csv(1) + csv_line(trip(2, status="x" * 500))))

    assert reject.value == "x" * 200


def test_timestamps_in_iso_forms_become_utc(tmp_path: Path) -> None:
    forms = {
        "2026-07-22T08:15:00Z": dt.datetime(2026, 7, 22, 8, 15, tzinfo=UTC),
        "2026-07-22 08:15:00+02:00": dt.datetime(2026, 7, 22, 6, 15, tzinfo=UTC),
        "2026-07-22T08:15:00.123456-0530": dt.datetime(2026, 7, 22, 13, 45, 0, 123456, tzinfo=UTC),
        "2026-07-22T08:15:00.123456789Z": dt.datetime(2026, 7, 22, 8, 15, 0, 123456, tzinfo=UTC),
        " 2026-07-22T08:15Z ": dt.datetime(2026, 7, 22, 8, 15, tzinfo=UTC),
    }
    rows = [trip(i, started_at=text) for i, text in enumerate(forms)]
    content = HEADER + "\n" + "".join(csv_line(row) for row in rows)

    result = run(tmp_path, content)

    assert result.rejects == []
    assert output(result).column("started_at").to_pylist() == list(forms.values())


def test_other_column_types_and_their_rejects(tmp_path: Path) -> None:
    content = (
        "id,count,ratio,active,seen_at,day\n"
        "a,1,0.5,true,2026-07-22T08:15:00Z,2026-07-22\n"  # 2
        "b, 7 ,1e3,No,,\n"  # 3: surrounding blanks are ignored outside text columns
        "c,1.5,,,,\n"  # 4
        "d,-1,,,,\n"  # 5
        "e,99999999999999999999,,,,\n"  # 6
        "f,,,maybe,,\n"  # 7
        "g,,,,,2026-02-30\n"  # 8
        "h,,,,,22/07/2026\n"  # 9
        "waytoolong,,,,,\n"  # 10
    )

    result = run(tmp_path, content, name="all_types.csv", contract=ALL_TYPES)

    assert output(result).to_pylist() == [
        {
            "id": "a",
            "count": 1,
            "ratio": 0.5,
            "active": True,
            "seen_at": dt.datetime(2026, 7, 22, 8, 15, tzinfo=UTC),
            "day": dt.date(2026, 7, 22),
            SOURCE_LINE_COLUMN: 2,
            SOURCE_LINE_COUNT_COLUMN: 1,
        },
        {
            "id": "b",
            "count": 7,
            "ratio": 1000.0,
            "active": False,
            "seen_at": None,
            "day": None,
            SOURCE_LINE_COLUMN: 3,
            SOURCE_LINE_COUNT_COLUMN: 1,
        },
    ]
    assert [(r.line, r.column, r.reason) for r in result.rejects] == [
        (4, "count", "not a valid integer"),
        (5, "count", "below minimum 0"),
        (6, "count", "not a valid integer"),
        (7, "active", "not a valid boolean"),
        (8, "day", "not a valid date (YYYY-MM-DD)"),
        (9, "day", "not a valid date (YYYY-MM-DD)"),
        (10, "id", "longer than 8 characters"),
    ]


def test_hexadecimal_integers_are_rejected_even_in_clean_blocks(tmp_path: Path) -> None:
    """Arrow's cast reads "0xFFFFFFFFFFFFFFFF" as -1; no block may accept it silently."""
    content = "id,count,ratio,active,seen_at,day\na,16,,,,\nb,0xFFFFFFFFFFFFFFFF,,,,\n"

    result = run(tmp_path, content, name="all_types.csv", contract=ALL_TYPES)

    assert [(r.line, r.column, r.reason) for r in result.rejects] == [
        (3, "count", "not a valid integer")
    ]


# --- line numbers --------------------------------------------------------------------------


def test_lines_are_physical_lines(tmp_path: Path) -> None:
    content = (
        HEADER
        + "\r\n"  # 1
        + csv_line(trip(1))  # 2
        + "\n"  # 3: blank
        + 'T2,V1,"multi\nline\ndriver",2026-07-22T08:15:00Z,,1,2,3,completed\n'  # 4-6
        + "T3,V1\n"  # 7: malformed
        + '"T4\nstill T4",V1\n'  # 8-9: malformed and spanning lines
        + csv_line(trip(5, status="bad"))  # 10
        + ",,,,,,,,\n"  # 11: an empty record, skipped like a blank line
        + csv_line(trip(6))  # 12
    )

    result = run(tmp_path, content)

    assert output(result).column(SOURCE_LINE_COLUMN).to_pylist() == [2, 4, 12]
    assert [(r.line, r.reason) for r in result.rejects] == [
        (7, "expected 9 columns, found 2"),
        (8, "expected 9 columns, found 2"),
        (10, "not one of: completed, cancelled, in_progress"),
    ]


def test_lines_stay_exact_across_many_parse_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Arrow reports malformed rows of the next block early; lines must not drift."""
    monkeypatch.setattr(normalize_csv, "MIN_BLOCK_BYTES", 512)
    rng = random.Random(7)
    parts = [HEADER + "\n"]
    line = 2
    expected_accepted, expected_rejected = [], []
    for i in range(1500):
        kind = rng.choice(["ok"] * 6 + ["blank", "short", "multiline", "bad", "utf8"])
        if kind == "blank":
            parts.append("\n")
            line += 1
            continue
        if kind == "short":
            text = f"T{i},V1\n"
        elif kind == "multiline":
            value = "x\n" * rng.randint(1, 3) + "y"
            text = f'T{i},V1,"{value}",2026-07-22T08:15:00Z,,1,2,3,completed\n'
        elif kind == "bad":
            text = csv_line(trip(i, distance_km="oops"))
        elif kind == "utf8":
            text = csv_line(trip(i, driver_id="\udcff"))
        else:
            text = csv_line(trip(i))
        (expected_accepted if kind in ("ok", "multiline") else expected_rejected).append(line)
        parts.append(text)
        line += text.count("\n")
    content = "".join(parts).encode("utf-8", "surrogateescape")

    result = run(tmp_path, content, batch_rows=3)

    assert output(result).column(SOURCE_LINE_COLUMN).to_pylist() == expected_accepted
    assert [r.line for r in result.rejects] == expected_rejected


def test_crlf_inside_quotes_survives_block_boundaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """apache/arrow#51368: Arrow drops the "\\n" of a quoted CRLF split between blocks."""
    block = 256
    monkeypatch.setattr(normalize_csv, "MIN_BLOCK_BYTES", block)
    head = HEADER + "\r\n" + csv_line(trip(1)).replace("\n", "\r\n")  # lines 1-2
    prefix = len(head) + len('T2,V1,"')
    for residue in (block - 1, 0, block - 2):  # "\r" last in a block, first, inside
        padding = "p" * ((residue - prefix) % block)
        multi = f'T2,V1,"{padding}\r\nb",2026-07-22T08:15:00Z,,1,2,3,completed\r\n'  # 3-4
        content = head + multi + csv_line(trip(3))  # line 5
        assert content.index("\r\nb") % block == residue

        result = run(tmp_path, content, batch_rows=1)

        rows = output(result).to_pylist()
        assert rows[1]["driver_id"] == padding + "\r\nb", residue
        assert [row[SOURCE_LINE_COLUMN] for row in rows] == [2, 3, 5]


# --- whole files ---------------------------------------------------------------------------


def test_header_mismatch_lists_missing_and_unexpected_columns(tmp_path: Path) -> None:
    header = HEADER.replace("driver_id", "driver").replace(",status", "")
    content = header + "\nT1,V1,D1,2026-07-22T08:15:00Z,,1,2,3\n"

    with pytest.raises(FileRejected) as caught:
        run(tmp_path, content)

    message = str(caught.value)
    assert "trips.csv" in message
    assert "missing columns: driver_id, status" in message
    assert "unexpected columns: driver" in message
    assert not (tmp_path / "trips.csv.out.parquet").exists()


def test_reordered_header_with_bom_and_padding_is_accepted(tmp_path: Path) -> None:
    names = list(reversed(TRIP_COLUMNS))
    header = "\ufeff" + ",".join(f" {name}" if name == "status" else name for name in names)
    rows = "".join(",".join(reversed(list(trip(i).values()))) + "\n" for i in range(1, 3))

    result = run(tmp_path, header + "\n" + rows)

    assert result.rejects == []
    assert output(result).column("trip_id").to_pylist() == ["T1", "T2"]
    assert output(result).column(SOURCE_LINE_COLUMN).to_pylist() == [2, 3]


@pytest.mark.parametrize("trailing_newline", [True, False])
def test_header_only_file_has_no_rows(tmp_path: Path, trailing_newline: bool) -> None:
    result = run(tmp_path, HEADER + ("\n" if trailing_newline else ""))

    assert (result.row_count, result.reject_count) == (0, 0)
    assert output(result).schema == output_schema(TRIPS)


def test_last_line_without_line_break_is_read(tmp_path: Path) -> None:
    result = run(tmp_path, trips_csv(2).rstrip("\n"))

    assert result.row_count == 2


def test_truncated_gzip_rejects_the_file(tmp_path: Path) -> None:
    packed = gzip.compress("".join(generated_trips(20_000)).encode())

    with pytest.raises(FileRejected, match=r"trips\.csv\.gz.*gzip"):
        run(tmp_path, packed[: len(packed) // 2], name="trips.csv.gz", fmt="csv.gz")
    assert list(tmp_path.glob("*.parquet*")) == []


def test_what_a_file_holds_decides_how_it_is_read_not_its_name(tmp_path: Path) -> None:
    """Issue 46.8: a gzip file named .csv was read as text and failed as "UTF-16?"."""
    plain = run(tmp_path, trips_csv(2), name="trips.csv.gz", fmt="csv.gz")
    packed = run(tmp_path, gzip.compress(trips_csv(3).encode()), name="trips.csv", fmt="csv")
    assert (plain.row_count, packed.row_count, plain.rejects, packed.rejects) == (2, 3, [], [])
    assert output(packed).column(SOURCE_LINE_COLUMN).to_pylist() == [2, 3, 4]


@pytest.mark.parametrize(
    ("content", "kind"),
    [
        (b"PK\x03\x04\x14\x00\x00\x00", "a zip archive"),
        ("trip_id,vehicle_id\n".encode("utf-16"), "UTF-16 text"),
        (b"PAR1\x15\x04", "a Parquet file"),
    ],
)
def test_a_csv_that_holds_no_text_is_refused_naming_what_it_holds(
    tmp_path: Path, content: bytes, kind: str
) -> None:
    expected = rf"^trips\.csv: the file holds {kind}.*, not UTF-8 text$"
    with pytest.raises(FileRejected, match=expected):
        run(tmp_path, content)


def test_parquet_name_without_parquet_content_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(FileRejected, match=r"trips\.parquet: not a readable Parquet file"):
        run(tmp_path, trips_csv(2), name="trips.parquet", fmt="parquet")


def test_parquet_with_wrong_columns_is_rejected(tmp_path: Path) -> None:
    table = output(run(tmp_path, trips_csv(2))).select(TRIP_COLUMNS).drop_columns(["status"])
    table = table.append_column("colour", pa.array(["red", "blue"]))
    pq.write_table(table, tmp_path / "trips.parquet")

    with pytest.raises(FileRejected) as caught:
        normalize_file(
            tmp_path / "trips.parquet",
            source_key="trips.parquet",
            fmt="parquet",
            contract=TRIPS,
            out_path=tmp_path / "out.parquet",
        )
    assert "missing columns: status" in str(caught.value)
    assert "unexpected columns: colour" in str(caught.value)


def test_parquet_with_naive_timestamps_is_rejected(tmp_path: Path) -> None:
    table = output(run(tmp_path, trips_csv(2))).select(TRIP_COLUMNS)
    naive = table.column("started_at").cast(pa.timestamp("us"))
    table = table.set_column(3, "started_at", naive)
    pq.write_table(table, tmp_path / "trips.parquet")

    with pytest.raises(FileRejected, match="started_at is timestamp.*without time zone"):
        normalize_file(
            tmp_path / "trips.parquet",
            source_key="trips.parquet",
            fmt="parquet",
            contract=TRIPS,
            out_path=tmp_path / "out.parquet",
        )


@pytest.mark.parametrize("fmt", ["csv", "csv.gz", "parquet", "jsonl"])
def test_zero_byte_file_is_rejected(tmp_path: Path, fmt: str) -> None:
    with pytest.raises(FileRejected, match=rf"trips\.{fmt}: empty file"):
        run(tmp_path, b"", name=f"trips.{fmt}", fmt=fmt)


def test_zero_byte_stream_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(FileRejected, match=r"trips\.csv: empty file"):
        normalize_file(
            io.BytesIO(b""),
            source_key="trips.csv",
            fmt="csv",
            contract=TRIPS,
            out_path=tmp_path / "out.parquet",
        )


def test_missing_file_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(FileRejected, match=r"trips\.csv: unreadable"):
        normalize_file(
            tmp_path / "nope.csv",
            source_key="trips.csv",
            fmt="csv",
            contract=TRIPS,
            out_path=tmp_path / "out.parquet",
        )


# --- streaming -----------------------------------------------------------------------------


def test_large_file_streams_in_bounded_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows, batch_rows = 200_000, 10_000
    source = tmp_path / "trips.csv"
    with source.open("w") as handle:
        handle.writelines(generated_trips(rows))
    seen: list[int] = []
    convert = normalize.convert_batch

    def counting(batch, contract, source_key):  # type: ignore[no-untyped-def]
        seen.append(len(batch.lines))
        return convert(batch, contract, source_key)

    monkeypatch.setattr(normalize, "convert_batch", counting)

    result = normalize_file(
        source,
        source_key="trips.csv",
        fmt="csv",
        contract=TRIPS,
        out_path=tmp_path / "out.parquet",
        batch_rows=batch_rows,
    )

    assert (result.row_count, result.reject_count) == (rows, 0)
    assert len(seen) > 10 and max(seen) < 3 * batch_rows  # never the whole file at once
    metadata = pq.ParquetFile(result.parquet_path).metadata
    sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    assert sizes == [batch_rows] * (rows // batch_rows)
    lines = pq.read_table(result.parquet_path, columns=[SOURCE_LINE_COLUMN]).column(0)
    assert lines[0].as_py() == 2 and lines[-1].as_py() == rows + 1


# --- deliveries ----------------------------------------------------------------------------


def test_duplicate_keys_across_files_reject_every_occurrence(tmp_path: Path) -> None:
    first = run(tmp_path, trips_csv(3), name="trips-1.csv")  # T1 line 2, T2 line 3, T3 line 4
    second_content = HEADER + "\n" + csv_line(trip(9)) + csv_line(trip(2)) + csv_line(trip(3))
    second = run(tmp_path, second_content, name="trips-2.csv")  # T2 line 3, T3 line 4
    third = run(tmp_path, trips_csv(1, start=3), name="trips-3.csv")  # T3 line 2

    rejects = find_duplicate_keys([first, second, third], TRIPS)

    assert [(r.file, r.line, r.column, r.value) for r in rejects] == [
        ("trips-1.csv", 3, "trip_id", "T2"),
        ("trips-1.csv", 4, "trip_id", "T3"),
        ("trips-2.csv", 3, "trip_id", "T2"),
        ("trips-2.csv", 4, "trip_id", "T3"),
        ("trips-3.csv", 2, "trip_id", "T3"),
    ]
    reasons = [r.reason for r in rejects]
    assert reasons[0] == "duplicate natural key trip_id='T2' (also at trips-2.csv line 3)"
    assert reasons[2] == "duplicate natural key trip_id='T2' (also at trips-1.csv line 3)"
    assert (
        reasons[1] == "duplicate natural key trip_id='T3' (also at trips-2.csv line 4 and 1 more)"
    )
    assert (
        reasons[4] == "duplicate natural key trip_id='T3' (also at trips-1.csv line 4 and 1 more)"
    )


def test_duplicate_keys_within_one_file_and_none(tmp_path: Path) -> None:
    single = run(tmp_path, trips_csv(2) + csv_line(trip(1)), name="trips.csv")
    clean = run(tmp_path, trips_csv(2), name="clean.csv")

    assert [(r.line, r.reason) for r in find_duplicate_keys([single], TRIPS)] == [
        (2, "duplicate natural key trip_id='T1' (also at trips.csv line 4)"),
        (4, "duplicate natural key trip_id='T1' (also at trips.csv line 2)"),
    ]
    assert find_duplicate_keys([clean], TRIPS) == []
    assert find_duplicate_keys([], TRIPS) == []


def test_key_hashes_span_row_groups_and_agree_across_files(tmp_path: Path) -> None:
    """The first pass of the duplicate check reads a row group at a time; hashes computed
    ahead (as the pipeline does while the slice loads) give the same rejects."""
    rows = normalize.DEFAULT_BATCH_ROWS + 10
    lines = list(generated_trips(rows))
    big = run(tmp_path, "".join(lines), name="big.csv")
    assert pq.ParquetFile(big.parquet_path).metadata.num_row_groups == 2
    hashes = key_hashes(big, TRIPS)
    assert len(hashes) == rows and len(np.unique(hashes)) == rows

    repeat = run(tmp_path, lines[0] + lines[-1], name="repeat.csv")  # the header, the last row
    assert key_hashes(repeat, TRIPS).tolist() == hashes[-1:].tolist()
    with HashBuckets(tmp_path) as buckets:
        buckets.add(hashes)
        buckets.add(key_hashes(repeat, TRIPS))
        repeated = buckets.repeated()
    assert repeated.tolist() == hashes[-1:].tolist()
    ahead = find_duplicates([big, repeat], TRIPS, repeated)
    assert ahead[0] == find_duplicates([big, repeat], TRIPS)[0]
    assert [(r.file, r.line) for r in ahead[0]] == [("big.csv", rows + 1), ("repeat.csv", 2)]


def test_hash_buckets_find_every_repeat_across_buckets_and_adds(tmp_path: Path) -> None:
    """Repeats are found whichever bucket (top bits) and whichever add holds each copy; the
    buckets live on disk under `tmp_path` until closed."""
    rng = np.random.default_rng(7)
    values = rng.integers(0, 2**64 - 1, size=50_000, dtype=np.uint64, endpoint=True)
    edges = np.array([0, 1, 2**58 - 1, 2**58, 2**63, 2**64 - 1], dtype=np.uint64)
    planted = np.concatenate([values[rng.choice(values.size, 300, replace=False)], edges])
    parts = [values[:20_000], np.concatenate([values[20_000:], edges]), planted[::-1]]
    with HashBuckets(tmp_path) as buckets:
        for part in parts:
            buckets.add(part)
        assert list(tmp_path.glob("key-hashes-*/*.u64"))
        found = buckets.repeated()
    unique, counts = np.unique(np.concatenate(parts), return_counts=True)
    assert found.tolist() == unique[counts > 1].tolist()
    assert not list(tmp_path.iterdir())


def test_reject_ratio_above_the_limit_fails(tmp_path: Path) -> None:
    check_reject_ratio(TRIPS, accepted_rows=95, rejected_rows=5)  # exactly 5%: allowed
    check_reject_ratio(TRIPS, accepted_rows=0, rejected_rows=0)

    with pytest.raises(RejectRatioExceeded) as caught:
        check_reject_ratio(TRIPS, accepted_rows=94, rejected_rows=6)

    message = str(caught.value)
    assert "'trips'" in message and "6.00%" in message and "5.00%" in message
    assert (caught.value.dataset, caught.value.ratio, caught.value.limit) == ("trips", 0.06, 0.05)


def test_rejects_report_and_summary(tmp_path: Path) -> None:
    rejects = [
        Reject("a.csv", 2, "status", "not one of: x", "y"),
        Reject("a.csv", 3, None, "expected 9 columns, found 2", 'T3,"V,1"'),
        Reject(
            "b.csv",
            None,
            "trip_id",
            "duplicate natural key trip_id='T1' (also at a.csv line 2)",
            "T1",
        ),
    ]

    count = write_rejects(iter(rejects), tmp_path / "rejects.csv")

    assert count == 3
    with (tmp_path / "rejects.csv").open(newline="", encoding="utf-8") as handle:
        written = list(csv.reader(handle))
    assert written[0] == ["file", "line", "column", "reason", "value", "last_line"]
    assert written[2] == ["a.csv", "3", "", "expected 9 columns, found 2", 'T3,"V,1"', ""]
    assert written[3][1] == ""

    summary = summarize_rejects(rejects, sample=2)
    assert json.loads(json.dumps(summary)) == summary
    assert summary["count"] == 3
    assert summary["by_file"] == {"a.csv": 2, "b.csv": 1}
    assert summary["by_reason"]["duplicate natural key"] == 1
    assert summary["sample"][0] == {
        "file": "a.csv",
        "line": 2,
        "column": "status",
        "reason": "not one of: x",
        "value": "y",
        "last_line": None,
    }
    assert len(summary["sample"]) == 2
