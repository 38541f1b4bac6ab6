"""Redshift's `COPY ... FROM 's3://...' FORMAT AS PARQUET`, as the emulator
(tests/redshift_emulator.py) runs it: parse the statement, read the Parquet objects (or a
manifest's), check them the way Redshift would, and turn the rows into the input of
PostgreSQL's `COPY FROM STDIN`: binary where every column's Arrow type is the one its column
reads (a third of the server's CPU of CSV, so the emulator's COPYs take less of the cores
that other sessions' locked commits need), CSV otherwise.

Checks (AWS "COPY from columnar data formats", "Character types"): only IAM_ROLE authorises;
Parquet columns match the table by position and count; manifest entries of Parquet files
carry `meta.content_length`; VARCHAR(n) holds n **bytes** (UTF-8), and COPY from Parquet has
neither TRUNCATECOLUMNS nor MAXERROR, so one value longer in bytes fails the whole COPY.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from fleet_import.warehouse.postgres.binary_copy import (
    BATCH_ROWS,
    SIGNATURE,
    TRAILER,
    CopyEncoder,
    EncodeError,
)

COPY_S3 = re.compile(
    r"^\s*COPY\s+(?P<table>(?:\"(?:[^\"]|\"\")+\"|[\w$]+)(?:\.(?:\"(?:[^\"]|\"\")+\"|[\w$]+))?)"
    r"\s*(?:\((?P<columns>[^)]*)\))?\s+FROM\s+'(?P<uri>s3://(?:[^']|'')*)'(?P<options>.*)$",
    re.IGNORECASE | re.DOTALL,
)
_CSV_CHUNK = 1 << 20
_LITERAL = re.compile(r"'(?:[^']|'')*'")
PARQUET_OPTIONS = frozenset(
    {"IAM_ROLE", "CREDENTIALS", "FORMAT", "AS", "PARQUET", "MANIFEST", "ACCEPTINVCHARS"}
    | {"FILLRECORD", "STATUPDATE", "ON", "OFF", "TRUE", "FALSE", "EXPLICIT_IDS"}
    | {"SERIALIZETOJSON"}
)
"""COPY's parameters for Parquet (AWS "COPY from columnar data formats": ACCEPTINVCHARS,
FILLRECORD, FROM, IAM_ROLE/CREDENTIALS, STATUPDATE, MANIFEST, EXPLICIT_IDS; SERIALIZETOJSON
for nested columns), their keyword arguments and FORMAT AS PARQUET itself."""
TargetColumn = tuple[str, "int | None", "int | None"]
"""(name, VARCHAR width in bytes or None, PostgreSQL type oid) of a column COPY fills."""

_TYPE_NAMES = {
    16: "BOOLEAN",
    20: "BIGINT",
    21: "SMALLINT",
    23: "INTEGER",
    25: "TEXT",
    700: "REAL",
    701: "DOUBLE PRECISION",
    1042: "CHAR",
    1043: "VARCHAR",
    1082: "DATE",
    1114: "TIMESTAMP",
    1184: "TIMESTAMPTZ",
    1700: "NUMERIC",
}
_INTEGERS = {
    21: (pa.int8(), pa.int16(), pa.uint8()),
    23: (pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16()),
    20: (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32()),
}


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


_ACCEPTS = {
    **{oid: _is_text for oid in (25, 1042, 1043)},
    **{oid: (lambda t, ok=ok: t in ok) for oid, ok in _INTEGERS.items()},
    700: pa.types.is_float32,
    701: pa.types.is_floating,
    16: pa.types.is_boolean,
    1082: pa.types.is_date32,
    1114: pa.types.is_timestamp,
    1184: pa.types.is_timestamp,
    1700: pa.types.is_decimal,
}
"""Which Arrow (Parquet) types each column type reads, by type oid."""


class CopyFailed(Exception):
    """A COPY the emulator could not run; becomes an ErrorResponse (SQLSTATE XX000)."""


def read_copy(
    sql: str, get_object: Callable[[str], bytes]
) -> tuple[str, list[str], pa.Table, list[tuple[str, pa.Schema]]]:
    """(target table, its column list if given, the rows by position, each file's URI and
    schema) of a COPY."""
    match = COPY_S3.match(sql)
    assert match is not None
    options = match["options"].upper()
    if not re.search(r"\bFORMAT\s+(AS\s+)?PARQUET\b", options):
        raise CopyFailed("the emulator only loads FORMAT AS PARQUET")
    if not re.search(r"\bIAM_ROLE\s+'", options) or re.search(
        r"\b(CREDENTIALS|ACCESS_KEY_ID|SECRET_ACCESS_KEY|SESSION_TOKEN)\b", options
    ):
        raise CopyFailed("COPY must authorise with IAM_ROLE only")
    check_options(match["options"])
    uri = match["uri"].replace("''", "'")
    objects = [uri]
    manifest = None
    if re.search(r"\bMANIFEST\b", options):
        manifest = json.loads(get_object(uri))
        objects = []
        for entry in manifest["entries"]:
            if entry.get("meta", {}).get("content_length") is None:
                raise CopyFailed("manifest entries of Parquet files need meta.content_length")
            objects.append(entry["url"])
    bodies = [get_object(o) for o in objects]
    if manifest is not None:
        for entry, body in zip(manifest["entries"], bodies, strict=True):
            if len(body) != entry["meta"]["content_length"]:
                raise CopyFailed(f"content_length of {entry['url']} is wrong")
    try:
        tables = [pq.read_table(io.BytesIO(body)) for body in bodies]
    except Exception as exc:  # noqa: BLE001 - an unreadable file fails the COPY
        raise CopyFailed(f"cannot read Parquet: {exc}") from None
    widths = {t.num_columns for t in tables}
    if len(widths) > 1:
        raise CopyFailed(f"Parquet files of one COPY differ in column count: {widths}")
    columns = [c.strip() for c in (match["columns"] or "").split(",") if c.strip()]
    schemas = [(uri, t.schema) for uri, t in zip(objects, tables, strict=True)]
    return match["table"], columns, _concat_positionally(tables), schemas


def check_options(options: str) -> None:
    """Only the parameters AWS lists for COPY from columnar formats; the first other one
    fails the COPY ("REGION argument is not supported for PARQUET based COPY")."""
    words = re.findall(r"[A-Za-z_]+", _LITERAL.sub(" ", options))
    for word in words:
        if word.upper() not in PARQUET_OPTIONS:
            raise CopyFailed(f"{word.upper()} argument is not supported for PARQUET based COPY")


def check_types(schemas: Sequence[tuple[str, pa.Schema]], target: Sequence[TargetColumn]) -> None:
    """Each file's Parquet type against its column's (Spectrum reads the file with the
    table's types and refuses what does not match, where PostgreSQL would coerce), and no
    nanosecond timestamps (Spectrum misreads them, apache/arrow#38000)."""
    for uri, schema in schemas:
        for field, (name, _, oid) in zip(schema, target, strict=False):
            arrow_type = field.type
            if pa.types.is_timestamp(arrow_type) and arrow_type.unit == "ns":
                raise CopyFailed(
                    _incompatible(uri, name, oid, arrow_type)
                    + " (nanosecond timestamps are misread by Spectrum: write microseconds)"
                )
            accepts = _ACCEPTS.get(oid)
            if accepts is not None and not pa.types.is_null(arrow_type) and not accepts(arrow_type):
                raise CopyFailed(_incompatible(uri, name, oid, arrow_type))


def _incompatible(uri: str, name: str, oid: int | None, arrow_type: pa.DataType) -> str:
    column_type = _TYPE_NAMES.get(oid or 0, str(oid))
    return (
        f"Spectrum Scan Error: File '{uri}' has an incompatible Parquet schema for column "
        f"'{name}'. Column type: {column_type}, Parquet schema: {arrow_type}"
    )


def check_columns(table: str, rows: pa.Table, target: Sequence[tuple[str, int | None]]) -> None:
    """`target`: (column, VARCHAR width in bytes or None) of the columns COPY fills, in order."""
    if rows.num_columns != len(target):
        raise CopyFailed(
            f"Spectrum Scan Error: the Parquet files have {rows.num_columns} columns,"
            f" table {table} has {len(target)}"
        )
    for position, (name, width) in enumerate(target):
        column = rows.column(position)
        if width is None or not (
            pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
        ):
            continue
        longest = pc.max(pc.binary_length(column)).as_py() or 0
        if longest > width:
            raise CopyFailed(
                f"Spectrum Scan Error: the length of the data column {name} is longer than the"
                f" length defined in the table. Table: {width}, Data: {longest}"
            )


def _concat_positionally(tables: list[pa.Table]) -> pa.Table:
    """One table of all files, by position (names are ignored, as Redshift ignores them)."""
    if not tables:
        return pa.table({})
    names = [f"c{i}" for i in range(tables[0].num_columns)]
    return pa.concat_tables([t.rename_columns(names) for t in tables], promote_options="permissive")


# PostgreSQL type oids (pg_type) a column of each Arrow type can be fed in COPY BINARY, as
# fleet_import's encoder writes it: text/varchar, int8, float8, bool, timestamp[tz], date,
# numeric (a Redshift DECIMAL, read from Parquet's decimal128 as it is).
_TEXT_OIDS = frozenset({25, 1043})
_TIMESTAMP_OIDS = frozenset({1114, 1184})


def _binary_oids(arrow_type: pa.DataType) -> frozenset[int]:
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return _TEXT_OIDS
    if pa.types.is_timestamp(arrow_type) and arrow_type.unit == "us":
        return _TIMESTAMP_OIDS  # UTC microseconds either way; a TIMESTAMP reads them as UTC
    for is_type, oid in (
        (pa.types.is_int64, 20),
        (pa.types.is_float64, 701),
        (pa.types.is_boolean, 16),
        (pa.types.is_date32, 1082),
        (pa.types.is_decimal128, 1700),
    ):
        if is_type(arrow_type):
            return frozenset({oid})
    return frozenset()


def copy_input(table: pa.Table, type_oids: Sequence[int | None]) -> tuple[str, list[bytes]]:
    """(COPY format, its data) of the rows, for columns of PostgreSQL types `type_oids`."""
    if table.num_rows and all(
        oid in _binary_oids(column.type)
        for column, oid in zip(table.columns, type_oids, strict=True)
    ):
        try:
            encoder = CopyEncoder(table.schema)
            chunks = [
                encoder.encode(batch).tobytes()
                for batch in table.to_batches(max_chunksize=BATCH_ROWS)
            ]
            return "binary", [SIGNATURE, *chunks, TRAILER]
        except EncodeError:
            pass  # a value out of PostgreSQL's range: CSV, and PostgreSQL's own error
    return "csv", list(csv_chunks(table))


def csv_chunks(table: pa.Table) -> Iterator[bytes]:
    if not table.num_rows:
        return
    # Naive UTC timestamps: PostgreSQL reads them in the session zone, which is UTC.
    columns = [
        c.cast(pa.timestamp(c.type.unit)) if pa.types.is_timestamp(c.type) and c.type.tz else c
        for c in table.columns
    ]
    table = pa.table(columns, names=table.column_names)
    sink = io.BytesIO()
    pacsv.write_csv(table, sink, pacsv.WriteOptions(include_header=False))
    data = sink.getvalue()
    for start in range(0, len(data), _CSV_CHUNK):
        yield data[start : start + _CSV_CHUNK]
