"""Source files to SourceBatch streams: opening (gzip, spooling unseekable Parquet) and the
JSON-lines and Parquet readers. CSV lives in normalize_csv.
"""

from __future__ import annotations

import codecs
import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from decimal import Decimal
from pathlib import Path
from typing import IO, Any, BinaryIO

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from fleet_import.config import DEFAULT_CSV_MAX_LINE_BYTES
from fleet_import.contracts.drift import allows_new_columns, type_from_arrow
from fleet_import.contracts.model import Column, DatasetContract, FileFormat
from fleet_import.normalize.csv import ReadOnlyStream, block_bytes, read_csv
from fleet_import.normalize.header import (
    HeaderNames,
    extra_column_types,
    match_header,
    row_numbers,
)
from fleet_import.normalize.rows import (
    REASON_UTF8,
    FileRejected,
    Reject,
    SourceBatch,
    is_text,
    unreadable,
)

Source = str | Path | BinaryIO
_SPOOL_BYTES = 1 << 20
_PARQUET_BUFFER_BYTES = 1 << 20
# Arrow parses the blocks of a chunk in parallel and keeps their order; a longer line
# fails the fast path and is read by the line-by-line path.
_JSON_BLOCK_BYTES = 1 << 20
_JSON_CHUNK_BLOCKS = 4
# What the Arrow JSON fast path reads each column as; text columns are parsed afterwards.
_JSON_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "timestamptz": pa.string(),
    "date": pa.string(),
    "int64": pa.int64(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
}


def read_batches(
    source: Source,
    *,
    fmt: FileFormat,
    source_key: str,
    contract: DatasetContract,
    batch_rows: int,
    max_line_bytes: int = DEFAULT_CSV_MAX_LINE_BYTES,
) -> Iterator[SourceBatch]:
    """The file's rows in batches; opens the source and closes what it opened.
    `max_line_bytes`: the longest CSV line sure to be read (normalize.csv)."""
    if fmt == "parquet":
        with _seekable(source, source_key) as handle:
            yield from read_parquet(
                handle, source_key=source_key, contract=contract, batch_rows=batch_rows
            )
        return
    if fmt not in ("csv", "csv.gz", "jsonl"):
        raise ValueError(f"unknown file format {fmt!r}")
    with _stream(source, source_key) as stream:
        if fmt == "jsonl":
            yield from read_jsonl(
                stream, source_key=source_key, contract=contract, batch_rows=batch_rows
            )
            return
        yield from read_csv(
            stream,
            source_key=source_key,
            contract=contract,
            batch_rows=batch_rows,
            max_line_bytes=max_line_bytes,
        )


def _check_path(path: Path, source_key: str) -> None:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise unreadable(source_key, "unreadable", exc) from exc
    if size == 0:
        raise FileRejected(f"{source_key}: empty file")


@contextmanager
def _stream(source: Source, source_key: str) -> Iterator[Any]:
    """The file's bytes, decompressed when its content is gzip: the content decides, not
    the name (a gzip file named .csv is read as what it is, and a .csv.gz that is plain text
    too). Content that is no text at all (another archive, UTF-16) is refused, named."""
    with ExitStack() as stack:
        if isinstance(source, str | Path):
            _check_path(Path(source), source_key)
            try:
                raw: Any = stack.enter_context(open(source, "rb"))  # noqa: SIM115
            except OSError as exc:
                raise unreadable(source_key, "unreadable", exc) from exc
        else:
            raw = source
        head = _read_head(raw, source_key)
        kind = _content_kind(head)
        if kind is not None:
            raise FileRejected(f"{source_key}: the file holds {kind}, not UTF-8 text")
        stream: Any = _Prefixed(raw, head)
        if head.startswith(_GZIP_MAGIC):
            stream = stack.enter_context(
                pa.CompressedInputStream(pa.PythonFile(stream, mode="r"), "gzip")
            )
        yield stream


_GZIP_MAGIC = b"\x1f\x8b"
# What a file's first bytes say it is, where that is no text a reader here could take.
_NOT_TEXT = (
    (b"PK\x03\x04", "a zip archive"),
    (b"BZh", "bzip2 data"),
    (b"\xfd7zXZ\x00", "xz data"),
    (b"\x28\xb5\x2f\xfd", "zstd data"),
    (b"PAR1", "a Parquet file"),
    (b"\xff\xfe", "UTF-16 text (its byte order mark)"),
    (b"\xfe\xff", "UTF-16 text (its byte order mark)"),
)
_HEAD_BYTES = 6


def _content_kind(head: bytes) -> str | None:
    return next((kind for magic, kind in _NOT_TEXT if head.startswith(magic)), None)


def _read_head(raw: Any, source_key: str) -> bytes:
    """The first bytes of the file (fewer only at its end)."""
    head = b""
    try:
        while len(head) < _HEAD_BYTES:
            data = raw.read(_HEAD_BYTES - len(head))
            if not data:
                break
            head += data
    except (pa.ArrowException, OSError) as exc:
        raise unreadable(source_key, "unreadable", exc) from exc
    return head


class _Prefixed(ReadOnlyStream):
    """The bytes read to tell what a file holds, then the rest of the file."""

    def __init__(self, raw: Any, head: bytes) -> None:
        self._raw = raw
        self._head = head

    def read(self, size: int = -1) -> bytes:
        if not self._head:
            return self._raw.read(size)
        if size is None or size < 0:
            data, self._head = self._head + self._raw.read(), b""
            return data
        data, self._head = self._head[:size], self._head[size:]
        return data


@contextmanager
def _seekable(source: Source, source_key: str) -> Iterator[str | IO[bytes]]:
    """Parquet needs random access: paths and seekable files as they are, others spooled."""
    if isinstance(source, str | Path):
        _check_path(Path(source), source_key)
        yield str(source)
    elif source.seekable():
        yield source
    else:
        with tempfile.TemporaryFile() as spool:
            shutil.copyfileobj(source, spool, _SPOOL_BYTES)
            if not spool.tell():
                raise FileRejected(f"{source_key}: empty file")
            spool.seek(0)
            yield spool


def read_parquet(
    handle: str | IO[bytes], *, source_key: str, contract: DatasetContract, batch_rows: int
) -> Iterator[SourceBatch]:
    try:
        # buffer_size streams column chunks instead of reading each one whole.
        parquet = pq.ParquetFile(handle, buffer_size=_PARQUET_BUFFER_BYTES)
    except (pa.ArrowException, OSError) as exc:
        raise unreadable(source_key, "not a readable Parquet file", exc) from exc
    with parquet:
        yield from _parquet_batches(parquet, source_key, contract, batch_rows)


def _parquet_batches(
    parquet: pq.ParquetFile, source_key: str, contract: DatasetContract, batch_rows: int
) -> Iterator[SourceBatch]:
    schema = parquet.schema_arrow
    header = match_header(schema.names, contract, source_key)
    positions = header.positions
    extra = extra_column_types(
        contract,
        {name: type_from_arrow(schema.field(at).type) for name, at in header.extra.items()},
        source_key,
    )
    unfit = [
        _describe_unfit(column, schema.field(position).type)
        for column, position in zip(contract.columns, positions, strict=True)
        if position is not None and not _fits(schema.field(position).type, column)
    ]
    if unfit:
        raise FileRejected(
            f"{source_key}: column types do not fit dataset {contract.name!r}: " + "; ".join(unfit)
        )
    selected = [None if position is None else schema.names[position] for position in positions]
    read = [name for name in selected if name is not None]
    next_row = 1
    try:
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=read, use_threads=False):
            columns = [
                pa.nulls(batch.num_rows, column.arrow_type) if name is None else batch.column(name)
                for column, name in zip(contract.columns, selected, strict=True)
            ]
            yield SourceBatch(
                columns,
                row_numbers(next_row, batch.num_rows),
                aliases=header.aliases,
                extra_columns=extra,
            )
            next_row += batch.num_rows
    except (pa.ArrowException, OSError) as exc:
        raise unreadable(source_key, "corrupt Parquet data", exc) from exc


def _fits(data_type: pa.DataType, column: Column) -> bool:
    """Whether values of this Parquet type can become the column's type (text is parsed)."""
    if pa.types.is_dictionary(data_type):
        data_type = data_type.value_type
    if is_text(data_type) or pa.types.is_null(data_type):
        return True
    integer, floating = pa.types.is_integer(data_type), pa.types.is_floating(data_type)
    return {
        "string": integer,
        "int64": integer or floating,
        "float64": integer or floating or pa.types.is_decimal(data_type),
        "bool": pa.types.is_boolean(data_type),
        "timestamptz": pa.types.is_timestamp(data_type) and data_type.tz is not None,
        "date": pa.types.is_date(data_type),
        # Not from floats: their values are already rounded, and a cast would round again.
        "decimal": integer or pa.types.is_decimal(data_type),
    }[column.kind]


def _describe_unfit(column: Column, data_type: pa.DataType) -> str:
    detail = f"{column.name} is {data_type}, expected {column.type}"
    if pa.types.is_timestamp(data_type) and data_type.tz is None:
        detail += " (a timestamp without time zone)"
    return detail


def read_jsonl(
    stream: Any, *, source_key: str, contract: DatasetContract, batch_rows: int
) -> Iterator[SourceBatch]:
    """JSON objects, one a line; keys are column names, missing keys are nulls, and a key
    the contract does not know rejects its row (there is no header to reject the file by).

    Arrow parses chunks whose values have the contract's JSON types; a chunk with anything
    else (bad JSON, blank lines, numbers as strings, ...) is read line by line in Python,
    which defines the semantics: values become the text a CSV would hold."""
    schema = pa.schema([(column.name, _json_type(column)) for column in contract.columns])
    next_line = 1
    for chunk in _line_chunks(stream, _JSON_CHUNK_BLOCKS * block_bytes(batch_rows), source_key):
        count = chunk.count(b"\n") + (0 if chunk.endswith(b"\n") else 1)
        fast = _jsonl_fast(chunk, count, next_line, schema)
        yield fast or _jsonl_slow(chunk, next_line, contract, source_key)
        next_line += count


def _json_type(column: Column) -> pa.DataType:
    # Arrow reads a JSON number into a decimal from its text, exactly.
    return column.arrow_type if column.decimal else _JSON_TYPES[column.type]


def _line_chunks(stream: Any, size: int, source_key: str) -> Iterator[bytes]:
    """Chunks of about `size` bytes ending at a line break (the last one may not)."""
    carry = b""
    first = True
    while True:
        try:
            data = stream.read(size)
        except (pa.ArrowException, OSError) as exc:
            raise unreadable(source_key, "unreadable", exc) from exc
        if first:
            if not data:
                raise FileRejected(f"{source_key}: empty file")
            data = data.removeprefix(codecs.BOM_UTF8)
            first = False
        if not data:
            if carry:
                yield carry
            return
        data = carry + data if carry else data
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            carry = data
            continue
        carry = data[cut:]
        yield data[:cut]


def _jsonl_fast(chunk: bytes, count: int, first_line: int, schema: pa.Schema) -> SourceBatch | None:
    if chunk.startswith((b"\n", b"\r\n")) or b"\n\n" in chunk or b"\n\r\n" in chunk:
        return None  # blank lines: Arrow skips them, so rows would not map to lines
    try:
        table = pajson.read_json(
            pa.BufferReader(chunk),
            read_options=pajson.ReadOptions(use_threads=True, block_size=_JSON_BLOCK_BYTES),
            parse_options=pajson.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="error"
            ),
        )
    except pa.ArrowException:
        return None
    if table.num_rows != count:
        return None
    columns = [table.column(name).combine_chunks() for name in schema.names]
    return SourceBatch(columns, row_numbers(first_line, count))


def _jsonl_slow(
    chunk: bytes, first_line: int, contract: DatasetContract, source_key: str
) -> SourceBatch:
    names = contract.column_names
    known = HeaderNames.of(contract)
    exact = {column.name for column in contract.columns if column.decimal}
    values: list[list[str | None]] = [[] for _ in names]
    lines: list[int] = []
    rejects: list[Reject] = []
    aliases: dict[str, str] = {}
    # Keys the contract does not name, where its drift policy allows them: not loaded.
    extra: dict[str, str] | None = {} if allows_new_columns(contract) else None
    for offset, raw in enumerate(chunk.split(b"\n")):
        if not raw.strip():
            continue
        line = first_line + offset
        row = _json_row(raw, names, known, exact, aliases, extra)
        if isinstance(row, tuple):
            column, reason, value = row
            rejects.append(Reject(source_key, line, column, reason, value))
            continue
        for column_values, value in zip(values, row, strict=True):
            column_values.append(value)
        lines.append(line)
    return SourceBatch(
        [pa.array(column_values, pa.string()) for column_values in values],
        pa.array(lines, pa.int64()),
        rejects,
        aliases,
        extra_column_types(
            contract, dict.fromkeys(extra or {}, contract.new_column_type), source_key
        ),
    )


def _json_row(
    raw: bytes,
    names: list[str],
    known: HeaderNames,
    exact: set[str],
    aliases: dict[str, str],
    extra: dict[str, str] | None = None,
) -> list[str | None] | tuple[str | None, str, str]:
    """The row's values as text, or (column, reason, value) when the line is rejected.
    Keys name columns as a CSV header does (names, or aliases: recorded in `aliases`); a
    key no column has goes into `extra` when the contract's drift policy allows one.
    Numbers are read as Decimal, so that the `exact` (decimal) columns get the digits as
    written; the others get the float's text, as json.loads would give it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, REASON_UTF8, raw.decode("utf-8", "backslashreplace")
    try:
        document = json.loads(text, parse_float=Decimal)
    except ValueError:
        return None, "invalid JSON", text
    if not isinstance(document, dict):
        return None, "not a JSON object", text
    by_column: dict[str, object] = {}
    for key, value in document.items():
        column = known.column_of(key.strip())
        if column is None and extra is not None:
            extra.setdefault(key.strip(), "")
            continue
        if column is None:
            return key, "unexpected field", json.dumps(value, default=float)
        if column in by_column:
            return key, f"field {column!r} given twice (by its name and an alias)", text
        by_column[column] = value
        if key != column:
            aliases.setdefault(column, key)
    row: list[str | None] = []
    for name in names:
        value = by_column.get(name)
        if isinstance(value, dict | list):
            return (
                name,
                "expected a single value, found an object or array",
                json.dumps(value, default=float),
            )
        if isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate escape such as "\ud800"
                return name, REASON_UTF8, value.encode("utf-8", "backslashreplace").decode()
        if isinstance(value, Decimal) and name not in exact:
            value = float(value)
        row.append(_json_text(value))
    return row


def _json_text(value: object) -> str | None:
    """JSON scalars as the text a CSV would hold, so that both formats mean the same."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)  # an int, or a Decimal as written
