"""Typing of source rows against a contract, with one reject for every row that fails.

Vectorised on purpose: the happy path is a handful of Arrow kernels per column and block,
and Python only touches the rows that are rejected. Readers (normalize_readers) hand over
columns as text (CSV, JSON lines) or already typed (Parquet, JSON fast path); both go
through the same checks so that a value means the same thing whatever the file format.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleet_import.contracts.model import DECIMAL_MAX_PRECISION, Column, DatasetContract
from fleet_import.errors import PreCommitError
from fleet_import.normalize.casting import cast_each, fill_false
from fleet_import.normalize.decimals import REASON_NOT_DECIMAL, WELL_FORMED, unfit_problems

SOURCE_LINE_COLUMN = "_source_line"
# The physical lines a row was read from, from its _source_line on: 1 unless a quoted value
# spans lines (normalize.malformed has the rule).
SOURCE_LINE_COUNT_COLUMN = "_source_line_count"
# Rows per Arrow batch when reading or writing normalized data: memory follows this.
DEFAULT_BATCH_ROWS = 65_536
_VALUE_LIMIT = 200
_UTC = dt.UTC
# The warehouses store years 1..9999; Arrow's ISO parser happily returns year 0.
_TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
_MIN_TIMESTAMP = pa.scalar(dt.datetime(1, 1, 1, tzinfo=_UTC), _TIMESTAMP_TYPE)
_MAX_TIMESTAMP = pa.scalar(
    dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=_UTC), _TIMESTAMP_TYPE
)
_MIN_DATE = pa.scalar(dt.date(1, 1, 1), pa.date32())
_MAX_DATE = pa.scalar(dt.date(9999, 12, 31), pa.date32())

_TRUE_WORDS = pa.array(["true", "t", "yes", "y", "1"])
_FALSE_WORDS = pa.array(["false", "f", "no", "n", "0"])
# Prefilters for the slow path: what Arrow's cast accepts, so that the bisection below only
# has to find the rare well-formed but impossible values (February 30, int64 overflow).
_WELL_FORMED = {
    "int64": r"^-?\d+$",
    "float64": r"(?i)^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$|^[+-]?(inf|infinity|nan)$",
    "timestamptz": (
        r"^\d{4}-\d{2}-\d{2}[T ]\d{2}(:\d{2}(:\d{2}(\.\d{1,6})?)?)?(Z|[+-]\d{2}(:?\d{2})?)$"
    ),
    "date": r"^\d{4}-\d{2}-\d{2}$",
    "decimal": WELL_FORMED,
}
_NAIVE_TIMESTAMP = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}(:\d{2}(:\d{2}(\.\d+)?)?)?)?$"
_EXCESS_FRACTION = r"(\.\d{6})\d+"
_PARSE_REASONS = {
    "int64": "not a valid integer",
    "float64": "not a valid number",
    "timestamptz": "not a valid timestamp with time zone",
    "date": "not a valid date (YYYY-MM-DD)",
    "bool": "not a valid boolean",
    "decimal": REASON_NOT_DECIMAL,
}
_CAST_REASONS = {
    "string": "not representable as text",
    "int64": "not a valid integer",
    "float64": "not a valid number",
    "timestamptz": "timestamp out of range",
    "date": "date out of range",
    "bool": "not a valid boolean",
    "decimal": REASON_NOT_DECIMAL,
}
REASON_MISSING = "required value missing"
REASON_UTF8 = "invalid UTF-8"
REASON_NAIVE_TIMESTAMP = "timestamp without time zone"
# PostgreSQL and Redshift text (and jsonb, where batch details live) cannot hold U+0000: a
# NUL that reaches them fails the COPY without naming the row, or the write of the failure
# itself, which would leave the batch running. Values holding one are rejected, and text we
# store about the input (rejects, file errors) shows it escaped.
REASON_NUL = "contains a NUL character"
_NUL = "\x00"
_NUL_SHOWN = "\\x00"


def without_nul(text: str) -> str:
    """Text safe to store in PostgreSQL: NUL characters written as a visible \\x00."""
    return text.replace(_NUL, _NUL_SHOWN) if _NUL in text else text


@dataclass(frozen=True)
class Reject:
    """One source row that is not loaded, and why; `value` is the offending raw value."""

    file: str
    line: int | None
    column: str | None
    reason: str
    value: str | None
    last_line: int | None = None
    """The last physical line of a rejected record that spans lines (a quoted value holding
    line ends); None for a record on one line."""

    def __post_init__(self) -> None:
        if self.last_line is not None and (self.line is None or self.last_line <= self.line):
            object.__setattr__(self, "last_line", None)
        # Every field can hold source text (a JSON key names the column): see REASON_NUL.
        for name in ("file", "column", "reason", "value"):
            text = getattr(self, name)
            if text is not None and _NUL in text:
                object.__setattr__(self, name, without_nul(text))
        if self.value is not None and len(self.value) > _VALUE_LIMIT:
            object.__setattr__(self, "value", self.value[:_VALUE_LIMIT])


class FileRejected(PreCommitError):
    """The file cannot be loaded at all (unreadable, corrupt, or not shaped like its contract)."""

    def __init__(self, message: str | None = None) -> None:
        # Messages quote the file (its header, Arrow's view of a bad record): see REASON_NUL.
        super().__init__(None if message is None else without_nul(message))


def unreadable(source_key: str, problem: str, exc: BaseException) -> FileRejected:
    """The FileRejected for a read error. Connection trouble (a dropped S3 stream) is
    re-raised as it is instead: it says nothing about the file, and a retry may succeed."""
    if isinstance(exc, ConnectionError | TimeoutError):
        raise exc
    return FileRejected(f"{source_key}: {problem} ({exc})")


@dataclass
class SourceBatch:
    """Rows as a reader found them: one array per contract column (text or typed, in
    contract order), the 1-based source line of each row, and rows the reader rejected."""

    columns: list[pa.Array]
    lines: pa.Array
    rejects: list[Reject] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)
    """Column -> the header (or JSON key) it was found under, where that was an alias."""
    extra_columns: dict[str, str] = field(default_factory=dict)
    """Columns (or JSON keys) the contract does not name -> their contract type, where its
    drift policy lets a file hold them (contracts.drift): not loaded, reported."""
    line_counts: pa.Array | None = None
    """The physical lines each row was read from (int32; more than 1 where a quoted value
    spans lines); None: one each, the usual case."""


# (rows flagged, reason) pairs, in the order they should win for a row.
Problems = list[tuple[pa.BooleanArray, str]]


def output_schema(contract: DatasetContract) -> pa.Schema:
    return contract.arrow_schema.append(
        pa.field(SOURCE_LINE_COLUMN, pa.int64(), nullable=False)
    ).append(pa.field(SOURCE_LINE_COUNT_COLUMN, pa.int32(), nullable=False))


_all_ones = pa.array([], pa.int32())


def _ones(count: int) -> pa.Array:
    """`count` ones (int32): a slice of one shared array, as header.row_numbers does."""
    global _all_ones
    ones = _all_ones  # read once: another thread may swap in a longer one meanwhile
    if len(ones) < count:
        ones = pa.array(np.ones(max(count, 2 * len(ones)), np.int32))
        _all_ones = ones
    return ones.slice(0, count)


def last_lines(lines: pa.Array, counts: pa.Array | None) -> list[int | None]:
    """Each row's last physical line where it spans more than one, else None."""
    if counts is None:
        return [None] * len(lines)
    last = pc.subtract(pc.add(lines, counts.cast(pa.int64())), 1)
    return pc.if_else(pc.greater(counts, 1), last, pa.scalar(None, pa.int64())).to_pylist()


def convert_batch(
    batch: SourceBatch, contract: DatasetContract, source_key: str
) -> tuple[pa.RecordBatch, list[Reject]]:
    """The rows that satisfy the contract, typed, plus one reject per row that does not.

    A row failing in several columns is reported once, for its first failing column in
    contract order, so that reject counts are row counts.
    """
    typed: list[pa.Array] = []
    flagged: list[tuple[pa.BooleanArray, int, str]] = []
    for index, (column, values) in enumerate(zip(contract.columns, batch.columns, strict=True)):
        converted, problems = _convert_column(values, column)
        typed.append(converted)
        flagged.extend((mask, index, reason) for mask, reason in problems)
    rejects = list(batch.rejects)
    taken: pa.BooleanArray | None = None
    for mask, index, reason in flagged:
        new = mask if taken is None else pc.and_not(mask, taken)
        if not new.true_count:
            continue
        rows = pc.indices_nonzero(new)
        lines = batch.lines.take(rows)
        counts = None if batch.line_counts is None else batch.line_counts.take(rows)
        raw = raw_text(batch.columns[index].take(rows))
        name = contract.columns[index].name
        rejects.extend(
            Reject(source_key, line, name, reason, value, last)
            for line, value, last in zip(
                lines.to_pylist(), raw, last_lines(lines, counts), strict=True
            )
        )
        taken = new if taken is None else pc.or_(taken, new)
    counts = batch.line_counts
    if counts is None:
        counts = _ones(len(batch.lines))
    accepted = pa.RecordBatch.from_arrays(
        [*typed, batch.lines, counts], schema=output_schema(contract)
    )
    if taken is not None:
        accepted = accepted.filter(pc.invert(taken))
        rejects.sort(key=lambda reject: reject.line or 0)
    return accepted, rejects


def raw_text(values: pa.Array) -> list[str | None]:
    """Values as a person should see them in a reject report."""
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type):
        return [
            None if v is None else v.decode("utf-8", "backslashreplace") for v in values.to_pylist()
        ]
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        return values.to_pylist()
    try:
        return pc.cast(values, pa.string()).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return [None if v is None else str(v) for v in values.to_pylist()]


def is_text(data_type: pa.DataType) -> bool:
    """Whether values of this type are parsed as text rather than cast."""
    if pa.types.is_dictionary(data_type):
        data_type = data_type.value_type
    return (
        pa.types.is_string(data_type)
        or pa.types.is_large_string(data_type)
        or pa.types.is_string_view(data_type)
        or pa.types.is_binary(data_type)
        or pa.types.is_large_binary(data_type)
        or pa.types.is_binary_view(data_type)
    )


def _convert_column(values: pa.Array, column: Column) -> tuple[pa.Array, Problems]:
    problems: Problems = []
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if is_text(values.type):
        values, bad_utf8 = _as_utf8(values)
        if bad_utf8 is not None:
            problems.append((bad_utf8, REASON_UTF8))
        typed, found = _parse_text(_empty_to_null(values), column)
    else:
        typed, found = _cast_typed(values, column)
    problems.extend(found)
    problems.extend(_constraint_problems(typed, column))
    return typed, [(mask, reason) for mask, reason in problems if mask.true_count]


def _as_utf8(values: pa.Array) -> tuple[pa.Array, pa.BooleanArray | None]:
    if pa.types.is_string(values.type):
        return values, None
    if pa.types.is_large_string(values.type) or pa.types.is_string_view(values.type):
        return values.cast(pa.string()), None
    return cast_each(values, pa.string())


def _empty_to_null(values: pa.Array) -> pa.Array:
    """Empty text is a missing value, for every column type."""
    empty = pc.equal(pc.binary_length(values), 0)
    if not empty.true_count:
        return values
    return pc.if_else(empty, pa.scalar(None, values.type), values)


def _parse_text(values: pa.Array, column: Column) -> tuple[pa.Array, Problems]:
    if column.type == "string":
        return values, []
    if column.type == "bool":
        return _parse_bool(values)
    target = column.arrow_type
    try:
        typed = pc.cast(values, target)
        # Arrow also reads hexadecimal integers ("0xFF..FF" as -1): leave them to the
        # slow path, which rejects them, so that a value means the same in every block.
        if (
            column.type != "int64"
            or not pc.any(pc.match_substring(values, "x", ignore_case=True)).as_py()
        ):
            return typed, []
    except pa.ArrowInvalid:
        pass
    # Slow path, for blocks holding at least one bad value: classify every value.
    text = _empty_to_null(pc.utf8_trim_whitespace(values))
    if column.type == "timestamptz":
        # Nanosecond sources: keep the microseconds the warehouse can store.
        text = pc.replace_substring_regex(text, _EXCESS_FRACTION, r"\1")
    well_formed = fill_false(pc.match_substring_regex(text, _WELL_FORMED[column.kind]))
    candidates = pc.if_else(well_formed, text, pa.scalar(None, pa.string()))
    typed, failed = cast_each(candidates, target)
    invalid = pc.and_not(text.is_valid(), well_formed)
    problems: Problems = []
    if failed is not None and column.decimal is not None:
        problems += unfit_problems(candidates, failed, *column.decimal)
    elif failed is not None:
        invalid = pc.or_(invalid, failed)
    if column.type == "timestamptz":
        naive = fill_false(pc.match_substring_regex(text, _NAIVE_TIMESTAMP))
        problems.append((pc.and_(invalid, naive), REASON_NAIVE_TIMESTAMP))
    problems.append((invalid, _PARSE_REASONS[column.kind]))
    return typed, problems


def _parse_bool(values: pa.Array) -> tuple[pa.Array, Problems]:
    words = _empty_to_null(pc.utf8_lower(pc.utf8_trim_whitespace(values)))
    true = pc.is_in(words, value_set=_TRUE_WORDS)
    false = pc.is_in(words, value_set=_FALSE_WORDS)
    typed = pc.if_else(true, True, pc.if_else(false, False, pa.scalar(None, pa.bool_())))
    invalid = pc.and_not(words.is_valid(), pc.or_(true, false))
    return typed, [(invalid, _PARSE_REASONS["bool"])]


def _cast_typed(values: pa.Array, column: Column) -> tuple[pa.Array, Problems]:
    target = column.arrow_type
    if values.type == target:
        return values, []
    if pa.types.is_null(values.type):
        return pa.nulls(len(values), target), []
    if column.type == "timestamptz" and getattr(values.type, "unit", None) == "ns":
        # ns -> us only drops sub-microsecond digits the warehouse cannot store anyway.
        return pc.cast(values, target, safe=False), []
    if column.decimal is not None and pa.types.is_integer(values.type):
        # Arrow casts an integer only to a decimal with room for every value of its type
        # (19 digits for int64), so go through one; the rescale below checks the values.
        values = pc.cast(values, pa.decimal128(DECIMAL_MAX_PRECISION, 0))
    typed, failed = cast_each(values, target)
    if failed is None:
        return typed, []
    if column.decimal is not None:
        return typed, unfit_problems(values, failed, *column.decimal)
    return typed, [(failed, _CAST_REASONS[column.type])]


def _constraint_problems(typed: pa.Array, column: Column) -> Problems:
    problems: Problems = []
    if column.type == "timestamptz":
        problems += _outside(typed, _MIN_TIMESTAMP, _MAX_TIMESTAMP, "timestamp out of range")
    elif column.type == "date":
        problems += _outside(typed, _MIN_DATE, _MAX_DATE, "date out of range")
    elif column.type == "float64" and typed.null_count < len(typed):
        problems.append((fill_false(pc.invert(pc.is_finite(typed))), "not a finite number"))
    if not column.nullable and typed.null_count:
        problems.append((typed.is_null(), REASON_MISSING))
    if column.min_value is not None and column.kind in ("int64", "float64", "decimal"):
        # Decimals are compared exactly: as the decimal the contract wrote, not a float.
        bound = float(column.min_value)
        minimum = pa.scalar(Decimal(repr(bound)) if column.decimal else bound)
        problems += _outside(typed, minimum, None, f"below minimum {column.min_value:g}")
    if column.type == "string" and typed.null_count < len(typed):
        problems.append((fill_false(pc.match_substring(typed, _NUL)), REASON_NUL))
        if column.max_length is not None:
            problems += _too_long(typed, column.max_length)
        if column.allowed is not None:
            allowed = pa.array(column.allowed, pa.string())
            outside = pc.and_not(typed.is_valid(), pc.is_in(typed, value_set=allowed))
            problems.append((outside, "not one of: " + ", ".join(column.allowed)))
        problems += _too_wide(typed, column.max_bytes)
    return problems


def _outside(
    typed: pa.Array, low: pa.Scalar | None, high: pa.Scalar | None, reason: str
) -> Problems:
    """Flag values outside [low, high]; a single min_max pass when all are inside."""
    if typed.null_count == len(typed):
        return []
    extremes = pc.min_max(typed)
    masks = []
    if low is not None and pc.less(extremes["min"], low).as_py():
        masks.append(pc.less(typed, low))
    if high is not None and pc.greater(extremes["max"], high).as_py():
        masks.append(pc.greater(typed, high))
    return [(fill_false(mask), reason) for mask in masks]


def _too_long(typed: pa.Array, max_length: int) -> Problems:
    # Bytes bound characters from above: the cheap byte count settles the common case.
    if pc.max(pc.binary_length(typed)).as_py() <= max_length:
        return []
    long = fill_false(pc.greater(pc.utf8_length(typed), max_length))
    return [(long, f"longer than {max_length} characters")]


def _too_wide(typed: pa.Array, max_bytes: int) -> Problems:
    # Redshift's VARCHAR counts bytes, and one longer value fails the whole COPY.
    lengths = pc.binary_length(typed)
    if pc.max(lengths).as_py() <= max_bytes:
        return []
    wide = fill_false(pc.greater(lengths, max_bytes))
    return [(wide, f"longer than {max_bytes} bytes in UTF-8 (the width of its warehouse column)")]
