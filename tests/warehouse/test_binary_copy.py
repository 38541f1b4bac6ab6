"""The COPY BINARY encoder, proven against a real PostgreSQL and against psycopg's own text
COPY of the same values: every type, NULLs, unicode, empty strings, extreme values."""

from __future__ import annotations

import contextvars
import datetime as dt
import math
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_import.config import libpq_url
from fleet_import.warehouse.postgres import binary_copy
from fleet_import.warehouse.postgres.binary_copy import (
    CopyEncoder,
    EncodeError,
    ParquetSource,
    SourceError,
    stream_parquet,
    text_field,
    uuid_field,
)

UTC = dt.UTC
SCHEMA = pa.schema(
    [
        ("s", pa.string()),
        ("i", pa.int64()),
        ("f", pa.float64()),
        ("b", pa.bool_()),
        ("t", pa.timestamp("us", tz="UTC")),
        ("d", pa.date32()),
    ]
)
PG_COLUMNS = "s text, i bigint, f double precision, b boolean, t timestamptz, d date"
BATCH_ID = uuid.UUID("0123e456-89ab-4def-8123-456789abcdef")
STAMPS = (text_field("acme"), text_field("fleet_s3:s3://b/ünï/"), uuid_field(BATCH_ID))
STAMP_COLUMNS = "tenant text, scope text, batch uuid"
STAMP_VALUES = ("acme", "fleet_s3:s3://b/ünï/", BATCH_ID)

EXTREME_ROWS: list[tuple[Any, ...]] = [
    (
        "héllo ✓ 😀 中文",
        -(2**63),
        math.inf,
        True,
        dt.datetime(1, 1, 1, tzinfo=UTC),
        dt.date(1, 1, 1),
    ),
    (
        "",
        2**63 - 1,
        -math.inf,
        False,
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        dt.date(9999, 12, 31),
    ),
    (None, None, None, None, None, None),
    (
        "x" * 5000,
        0,
        -0.0,
        None,
        dt.datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        dt.date(1999, 12, 31),
    ),
    (
        "tab\tnew\nline\\back\"quote',comma",
        1,
        math.nan,
        True,
        dt.datetime(2000, 1, 1, tzinfo=UTC),
        dt.date(2000, 1, 1),
    ),
    (" ", -1, 5e-324, False, dt.datetime(1970, 1, 1, tzinfo=UTC), dt.date(1970, 1, 1)),
    (
        "\u00a0\u200b\U0010fffd",
        42,
        1.7976931348623157e308,
        True,
        dt.datetime(2000, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        dt.date(1600, 2, 29),
    ),
    (None, 7, None, True, None, dt.date(2024, 2, 29)),
]


@pytest.fixture(scope="module")
def conn(pg_server_url: str) -> Iterator[psycopg.Connection[Any]]:
    """One connection for the module; every test works in temp tables."""
    with psycopg.connect(libpq_url(pg_server_url), autocommit=True) as connection:
        connection.execute("SET TimeZone = 'UTC'")
        yield connection


def batch_of(rows: Sequence[tuple[Any, ...]], schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in schema]
    return pa.RecordBatch.from_arrays(
        [pa.array(list(values), field.type) for values, field in zip(columns, schema, strict=True)],
        schema=schema,
    )


def copy_binary(conn: psycopg.Connection[Any], table: str, encoded: Sequence[Any]) -> None:
    with conn.cursor().copy(f"COPY {table} FROM STDIN (FORMAT BINARY)") as copy:
        copy.write(binary_copy.SIGNATURE)
        for chunk in encoded:
            copy.write(memoryview(chunk))
        copy.write(binary_copy.TRAILER)


def load_both(
    conn: psycopg.Connection[Any], rows: Sequence[tuple[Any, ...]], *, stamps: bool = True
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(rows via our encoder, rows via psycopg's text COPY), each as PostgreSQL prints them."""
    extra = f", {STAMP_COLUMNS}" if stamps else ""
    for table in ("ours", "theirs"):
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TEMP TABLE {table} (n serial, {PG_COLUMNS}{extra})")
    encoder = CopyEncoder(SCHEMA, STAMPS if stamps else ())
    columns = "s, i, f, b, t, d" + (", tenant, scope, batch" if stamps else "")
    copy_binary(conn, f"ours ({columns})", [encoder.encode(batch_of(rows))])
    with conn.cursor().copy(f"COPY theirs ({columns}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row((*row, *STAMP_VALUES) if stamps else row)
    # Text output tells -0 from 0 and NaN from NULL, which row equality would not.
    fetch = "SELECT {}::text FROM {} ORDER BY n"
    ours = conn.execute(fetch.format("ours", "ours")).fetchall()
    theirs = conn.execute(fetch.format("theirs", "theirs")).fetchall()
    return ours, theirs


def test_every_type_round_trips_like_psycopgs_text_copy(conn: psycopg.Connection[Any]) -> None:
    ours, theirs = load_both(conn, EXTREME_ROWS)
    assert ours == theirs
    back = conn.execute("SELECT s, i, f, b, t, d, tenant, scope, batch FROM ours ORDER BY n")
    for got, row in zip(back.fetchall(), EXTREME_ROWS, strict=True):
        assert got[6:] == STAMP_VALUES
        for value, expected in zip(got[:6], row, strict=True):
            if isinstance(expected, float) and math.isnan(expected):
                assert math.isnan(value)
            else:
                assert value == expected
                if isinstance(expected, float):
                    assert math.copysign(1, value) == math.copysign(1, expected)


def test_without_constant_fields(conn: psycopg.Connection[Any]) -> None:
    ours, theirs = load_both(conn, EXTREME_ROWS, stamps=False)
    assert ours == theirs


def test_sliced_arrays_respect_their_offsets(conn: psycopg.Connection[Any]) -> None:
    batch = batch_of(EXTREME_ROWS)
    encoder = CopyEncoder(SCHEMA, STAMPS)
    for start, length in [(1, 3), (3, 5), (2, 0), (7, 1)]:
        sliced = encoder.encode(batch.slice(start, length))
        fresh = encoder.encode(batch_of(EXTREME_ROWS[start : start + length]))
        assert sliced.tobytes() == fresh.tobytes()


def test_null_strings_that_own_bytes_are_written_as_null(conn: psycopg.Connection[Any]) -> None:
    # Arrow allows a null slot to span bytes of the data buffer: "bb" here belongs to nobody.
    offsets = pa.py_buffer(np.array([0, 1, 3, 4], dtype=np.int32).tobytes())
    validity = pa.py_buffer(np.packbits([1, 0, 1, 0, 0, 0, 0, 0], bitorder="little").tobytes())
    strings = pa.StringArray.from_buffers(3, offsets, pa.py_buffer(b"abbc"), validity)
    schema = pa.schema([("s", pa.string())])
    conn.execute("DROP TABLE IF EXISTS strings")
    conn.execute("CREATE TEMP TABLE strings (n serial, s text)")
    encoder = CopyEncoder(schema)
    copy_binary(
        conn, "strings (s)", [encoder.encode(pa.RecordBatch.from_arrays([strings], schema=schema))]
    )
    assert conn.execute("SELECT s FROM strings ORDER BY n").fetchall() == [("a",), (None,), ("c",)]


def test_large_strings_and_chunks_of_many_batches(conn: psycopg.Connection[Any]) -> None:
    schema = pa.schema([("s", pa.large_string()), ("i", pa.int64())])
    conn.execute("DROP TABLE IF EXISTS many")
    conn.execute("CREATE TEMP TABLE many (s text, i bigint)")
    encoder = CopyEncoder(schema)
    chunks = []
    for start in range(0, 30_000, 10_000):
        numbers = range(start, start + 10_000)
        chunks.append(
            encoder.encode(
                pa.RecordBatch.from_arrays(
                    [
                        pa.array([f"v{n}" * (n % 5) for n in numbers], pa.large_string()),
                        pa.array(list(numbers), pa.int64()),
                    ],
                    schema=schema,
                )
            )
        )
    copy_binary(conn, "many", chunks)
    count, bad = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE s <> repeat('v' || i, (i % 5)::int)) FROM many"
    ).fetchone()
    assert (count, bad) == (30_000, 0)


def test_empty_batch_and_empty_stream(conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    encoder = CopyEncoder(SCHEMA, STAMPS)
    assert encoder.encode(batch_of([])).size == 0
    written: list[bytes] = []
    assert stream_parquet([], encoder, lambda data: written.append(bytes(data))) == 0
    assert b"".join(written) == binary_copy.SIGNATURE + binary_copy.TRAILER
    conn.execute("DROP TABLE IF EXISTS nothing")
    conn.execute(f"CREATE TEMP TABLE nothing ({PG_COLUMNS}, {STAMP_COLUMNS})")
    copy_binary(conn, "nothing", [])
    assert conn.execute("SELECT count(*) FROM nothing").fetchone() == (0,)


_CALLER = contextvars.ContextVar("caller", default="not the caller's context")


def test_sources_are_pulled_on_the_reader_thread_in_the_callers_context() -> None:
    """A lazy `sources` runs on the reader thread; it sees the caller's context variables
    (a Prefect task's run context, for one)."""
    encoder = CopyEncoder(SCHEMA, STAMPS)
    seen: list[tuple[str, str]] = []

    def sources() -> Iterator[ParquetSource]:
        seen.append((threading.current_thread().name, _CALLER.get()))
        yield from ()

    token = _CALLER.set("the caller's context")
    try:
        assert stream_parquet(sources(), encoder, lambda data: None) == 0
    finally:
        _CALLER.reset(token)
    assert seen == [("parquet-copy-reader", "the caller's context")]


@pytest.mark.parametrize(
    ("arrow_type", "value"),
    [
        (pa.timestamp("us", tz="UTC"), -(2**63)),
        (pa.timestamp("us", tz="UTC"), -211_813_488_000_000_000 - 946_684_800_000_000 - 1),
        (pa.date32(), -(2**31)),
        (pa.date32(), -2_451_545 - 10_957 - 1),
        (pa.date32(), 2**31 - 1),
    ],
)
def test_values_outside_postgresqls_range_are_refused(arrow_type: pa.DataType, value: int) -> None:
    schema = pa.schema([("v", arrow_type)])
    storage = pa.int64() if arrow_type.bit_width == 64 else pa.int32()
    batch = pa.RecordBatch.from_arrays(
        [pa.array([0, value], storage).cast(arrow_type)], schema=schema
    )
    with pytest.raises(EncodeError, match="outside PostgreSQL's range"):
        CopyEncoder(schema).encode(batch)


def test_extreme_values_inside_the_range_are_accepted(conn: psycopg.Connection[Any]) -> None:
    lowest_ts = -211_813_488_000_000_000 + 946_684_800_000_000
    lowest_day = -2_451_545 + 10_957
    schema = pa.schema([("t", pa.timestamp("us", tz="UTC")), ("d", pa.date32())])
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([lowest_ts, 2**63 - 1], pa.int64()).cast(schema.field("t").type),
            pa.array([lowest_day, 2_145_031_948 + 10_957], pa.int32()).cast(pa.date32()),
        ],
        schema=schema,
    )
    conn.execute("DROP TABLE IF EXISTS edges")
    conn.execute("CREATE TEMP TABLE edges (t timestamptz, d date)")
    copy_binary(conn, "edges", [CopyEncoder(schema).encode(batch)])
    rows = conn.execute("SELECT t::text, d::text FROM edges ORDER BY edges.t").fetchall()
    assert rows[0] == ("4714-11-24 00:00:00+00 BC", "4714-11-24 BC")
    assert rows[1] == ("294247-01-10 04:00:54.775807+00", "5874897-12-31")


def test_unsupported_type_is_refused() -> None:
    with pytest.raises(EncodeError, match="no binary COPY encoding"):
        CopyEncoder(pa.schema([("x", pa.int32())]))
    with pytest.raises(EncodeError, match="no binary COPY encoding"):
        CopyEncoder(pa.schema([("x", pa.timestamp("ns", tz="UTC"))]))


# -- property: any values PostgreSQL accepts come back as psycopg's text COPY has them --

_TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40
)
_TIMESTAMPS = st.datetimes(
    min_value=dt.datetime(1, 1, 1),
    max_value=dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
    timezones=st.just(UTC),
)
_ROW = st.tuples(
    st.none() | _TEXT,
    st.none() | st.integers(-(2**63), 2**63 - 1),
    st.none() | st.floats(allow_nan=True, allow_infinity=True),
    st.none() | st.booleans(),
    st.none() | _TIMESTAMPS,
    st.none() | st.dates(),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=st.lists(_ROW, max_size=25))
def test_random_rows_round_trip(conn: psycopg.Connection[Any], rows: list[tuple[Any, ...]]) -> None:
    ours, theirs = load_both(conn, rows)
    assert ours == theirs


# -- streaming Parquet --------------------------------------------------------------------


def write_parquet(path: Path, rows: Sequence[tuple[Any, ...]], **kwargs: Any) -> Path:
    batch = batch_of(rows)
    lines = pa.array(range(2, len(rows) + 2), pa.int64())
    table = pa.Table.from_batches([batch]).append_column("_source_line", lines)
    pq.write_table(table, path, **kwargs)
    return path


def test_stream_drops_excluded_lines_and_reports_progress(
    conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    rows = [(f"r{n}", n, n / 2, n % 2 == 0, None, None) for n in range(1_010)]
    first = write_parquet(tmp_path / "a.parquet", rows[:1_000], row_group_size=100)
    second = write_parquet(tmp_path / "b.parquet", rows[1_000:])
    conn.execute("DROP TABLE IF EXISTS streamed")
    conn.execute(f"CREATE TEMP TABLE streamed ({PG_COLUMNS}, {STAMP_COLUMNS})")
    progress: list[int] = []
    with conn.cursor() as cursor:
        with cursor.copy("COPY streamed FROM STDIN (FORMAT BINARY)") as copy:
            written = stream_parquet(
                [ParquetSource(first, frozenset({2, 3, 1_001})), ParquetSource(second)],
                CopyEncoder(SCHEMA, STAMPS),
                copy.write,
                batch_rows=128,
                on_batch=progress.append,
            )
        assert written == cursor.rowcount == 997 + 10
    assert progress == sorted(progress) and progress[-1] == written
    missing = conn.execute(
        "SELECT i FROM generate_series(0, 1009) AS i EXCEPT SELECT i FROM streamed ORDER BY 1"
    ).fetchall()
    assert missing == [(0,), (1,), (999,)]


def test_stream_casts_compatible_types(conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    path = tmp_path / "ns.parquet"
    table = pa.table(
        {
            "s": pa.array(["a", None], pa.large_string()),
            "i": pa.array([1, 2], pa.int64()),
            "f": pa.array([0.5, None], pa.float64()),
            "b": pa.array([True, False]),
            "t": pa.array([1_000, 2_000], pa.timestamp("ns", tz="Europe/Paris")),
            "d": pa.array([dt.date(2020, 1, 1), None], pa.date32()),
            "_source_line": pa.array([2, 3], pa.int64()),
        }
    )
    pq.write_table(table, path)
    chunks: list[bytes] = []
    assert (
        stream_parquet(
            [ParquetSource(path)], CopyEncoder(SCHEMA), lambda b: chunks.append(bytes(b))
        )
        == 2
    )
    conn.execute("DROP TABLE IF EXISTS cast_rows")
    conn.execute(f"CREATE TEMP TABLE cast_rows ({PG_COLUMNS})")
    with conn.cursor().copy("COPY cast_rows FROM STDIN (FORMAT BINARY)") as copy:
        for chunk in chunks:
            copy.write(chunk)
    assert conn.execute("SELECT s, t FROM cast_rows ORDER BY i").fetchall() == [
        ("a", dt.datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC)),
        (None, dt.datetime(1970, 1, 1, 0, 0, 0, 2, tzinfo=UTC)),
    ]


def test_a_failed_write_stops_the_reader_taking_sources(tmp_path: Path) -> None:
    """Once the COPY fails, the reader takes no further source: each may be a file still to
    normalize. Files without rows (nothing to put, so nothing that would notice) included."""
    full = write_parquet(tmp_path / "full.parquet", [("a", 1, 1.0, True, None, None)])
    empty = write_parquet(tmp_path / "empty.parquet", [])
    write_failed = threading.Event()
    taken: list[int] = []

    def sources() -> Iterator[ParquetSource]:
        yield ParquetSource(full)
        assert write_failed.wait(10)
        time.sleep(0.2)  # the writer's failure has ended the stream by now
        for number in range(10):
            taken.append(number)
            yield ParquetSource(empty)

    def write(data: memoryview) -> None:
        if len(data) > len(binary_copy.SIGNATURE):  # the first rows, after the header
            write_failed.set()
            raise OSError("the COPY failed")

    with pytest.raises(OSError, match="the COPY failed"):
        stream_parquet(sources(), CopyEncoder(SCHEMA), write)
    assert taken in ([], [0])  # at most the one being taken when the writer failed


def test_stream_refuses_unexpected_columns(tmp_path: Path) -> None:
    path = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1], "_source_line": [2]}), path)
    with pytest.raises(SourceError, match="expected"):
        stream_parquet([ParquetSource(path)], CopyEncoder(SCHEMA), lambda _: None)


def test_stream_reports_a_corrupt_file(tmp_path: Path) -> None:
    good = write_parquet(tmp_path / "good.parquet", [("a", 1, 1.0, True, None, None)])
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(good.read_bytes()[:-40] + b"\x00" * 32 + b"PAR1")
    with pytest.raises(SourceError) as caught:
        stream_parquet(
            [ParquetSource(good), ParquetSource(bad)], CopyEncoder(SCHEMA), lambda _: None
        )
    assert caught.value.path == bad
    assert not [t for t in threading.enumerate() if t.name == "parquet-copy-reader"]


def test_a_failing_writer_stops_the_reader_and_memory_stays_bounded(tmp_path: Path) -> None:
    rows = [(f"r{n}", n, 0.0, True, None, None) for n in range(5_000)]
    path = write_parquet(tmp_path / "big.parquet", rows, row_group_size=50)
    encoder = CopyEncoder(SCHEMA)
    encoded = 0
    original = encoder.encode

    def counting(batch: pa.RecordBatch) -> np.ndarray:
        nonlocal encoded
        encoded += 1
        return original(batch)

    encoder.encode = counting  # type: ignore[method-assign]
    seen = 0

    def slow_then_fail(_: memoryview) -> None:
        nonlocal seen
        seen += 1
        threading.Event().wait(0.01)
        # The reader may run ahead by the queue plus the batch in its hands, no more.
        assert encoded - max(seen - 1, 0) <= binary_copy.QUEUE_DEPTH + 1
        if seen == 20:
            raise RuntimeError("database went away")

    with pytest.raises(RuntimeError, match="went away"):
        stream_parquet([ParquetSource(path)], encoder, slow_then_fail, batch_rows=50)
    assert not [t for t in threading.enumerate() if t.name == "parquet-copy-reader"]
    assert encoded < 40
