"""Duplicate natural keys across a delivery's normalized files: every copy of a repeated key
is rejected (never silently deduplicated). A first pass hashes each file's keys (vectorised
FNV-1a, computable ahead, while the slice loads) into buckets on disk; only rows whose hash
repeats are read again and compared by value.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from fleet_import.contracts.model import DatasetContract
from fleet_import.normalize.rows import (
    DEFAULT_BATCH_ROWS,
    SOURCE_LINE_COLUMN,
    SOURCE_LINE_COUNT_COLUMN,
    Reject,
    last_lines,
)

if TYPE_CHECKING:
    from fleet_import.normalize.output import NormalizedFile

DUPLICATE_REASON = "duplicate natural key"
# (file index << _FILE_SHIFT) | line orders rows of a delivery in one int64.
_FILE_SHIFT = 40


def find_duplicate_keys(files: Sequence[NormalizedFile], contract: DatasetContract) -> list[Reject]:
    """Every row whose natural key occurs more than once in the delivery, each naming
    another place the key occurs."""
    return find_duplicates(files, contract)[0]


def find_duplicates(
    files: Sequence[NormalizedFile],
    contract: DatasetContract,
    repeated: np.ndarray | None = None,
) -> tuple[list[Reject], pa.Table]:
    """The duplicate-key rejects, and the repeated keys themselves (typed, one row each) so
    a loader can drop every copy of them.

    Memory matters here (a delivery can hold millions of keys): a first pass keeps a 64-bit
    hash per row, in `HashBuckets` on disk (`repeated` is their `repeated()` where a caller
    hashed the files earlier), and only rows whose hash repeats are read again and compared
    exactly, so a collision never makes a false reject."""
    keys = list(contract.natural_key)
    key_schema = pa.schema([contract.arrow_schema.field(key).with_nullable(True) for key in keys])
    nothing: tuple[list[Reject], pa.Table] = ([], key_schema.empty_table())
    if not keys or not files:
        return nothing
    if repeated is None:
        with HashBuckets(files[0].parquet_path.parent) as buckets:
            for normalized in files:
                buckets.add(key_hashes(normalized, contract))
            repeated = buckets.repeated()
    if not repeated.size:
        return nothing
    tables = []
    for index, normalized in enumerate(files):
        # Rare (some hash repeats): hashing the file again costs less than keeping every
        # file's hashes for the common case.
        candidates = np.isin(key_hashes(normalized, contract), repeated)
        if not candidates.any():
            continue
        table, lines, spans = _read_keys(normalized, keys)
        mask = pa.array(candidates)
        position = pc.add(lines.filter(mask), pa.scalar(index << _FILE_SHIFT))
        table = table.filter(mask).cast(key_schema).append_column("_position", position)
        tables.append(table.append_column("_lines", spans.filter(mask)))
    rows = pa.concat_tables(tables)
    for key in keys:  # as in SQL, a missing key equals nothing
        if rows.column(key).null_count:
            rows = rows.filter(rows.column(key).is_valid())
    counts = rows.group_by(keys).aggregate([("_position", "count"), ("_position", "min")])
    repeated_keys = counts.filter(pc.greater(counts.column("_position_count"), 1))
    if not repeated_keys.num_rows:
        return nothing
    rows = rows.join(repeated_keys, keys=keys, join_type="inner")
    is_first = pc.equal(rows.column("_position"), rows.column("_position_min"))
    later = rows.filter(pc.invert(is_first)).group_by(keys).aggregate([("_position", "min")])
    later = later.rename_columns([*keys, "_second"])
    rows = rows.join(later, keys=keys, join_type="inner")
    is_first = pc.equal(rows.column("_position"), rows.column("_position_min"))
    other = pc.if_else(is_first, rows.column("_second"), rows.column("_position_min"))
    rows = rows.append_column("_other", other).sort_by("_position").combine_chunks()
    rejects = _duplicate_rejects(rows, keys, [normalized.source_key for normalized in files])
    return rejects, repeated_keys.select(keys).cast(key_schema)


_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
# A key with a NULL part equals nothing (as in SQL): it gets a hash no other row shares.
_NULL_HASH_BASE = np.uint64(1 << 63)


def key_hashes(normalized: NormalizedFile, contract: DatasetContract) -> np.ndarray:
    """One 64-bit hash of the natural key per row of a normalized file, in row order (a key
    with a missing part gets a value no other row of the file shares). Read a row group at
    a time, so memory follows the row group, not the file."""
    keys = list(contract.natural_key)
    parquet = pq.ParquetFile(normalized.parquet_path)
    parts = [np.empty(0, np.uint64)]
    first_row = 0
    for batch in parquet.iter_batches(batch_size=DEFAULT_BATCH_ROWS, columns=keys):
        parts.append(_key_hashes(pa.Table.from_batches([batch]), keys, first_row))
        first_row += batch.num_rows
    return np.concatenate(parts)


def _read_keys(
    normalized: NormalizedFile, keys: list[str]
) -> tuple[pa.Table, pa.ChunkedArray, pa.ChunkedArray]:
    """The keys, lines and line counts of a normalized file's rows (a file normalized before
    rows had line counts: one line each)."""
    names = pq.read_schema(normalized.parquet_path).names
    counted = SOURCE_LINE_COUNT_COLUMN in names
    columns = [*keys, SOURCE_LINE_COLUMN, *([SOURCE_LINE_COUNT_COLUMN] if counted else [])]
    table = pq.read_table(normalized.parquet_path, columns=columns)
    spans = (
        table.column(SOURCE_LINE_COUNT_COLUMN)
        if counted
        else pa.chunked_array([pa.array(np.ones(table.num_rows, np.int32))])
    )
    return table.select(keys), table.column(SOURCE_LINE_COLUMN), spans


def _key_hashes(table: pa.Table, keys: list[str], first_row: int = 0) -> np.ndarray:
    """FNV-1a over each key's text, vectorised by byte position (keys are short)."""
    combined = np.full(table.num_rows, _FNV_OFFSET, dtype=np.uint64)
    null = np.zeros(table.num_rows, dtype=bool)
    for key in keys:
        column = pc.cast(table.column(key), pa.large_string()).combine_chunks()
        null |= np.asarray(column.is_null())
        offsets = np.frombuffer(column.buffers()[1], dtype=np.int64)[
            column.offset : column.offset + len(column) + 1
        ]
        starts, lengths = offsets[:-1], np.diff(offsets)
        width = int(lengths.max(initial=0))
        # Zero-padded, so that byte `position` of every row can be read at once; rows
        # shorter than that keep their value (np.copyto's mask): whole-array passes, twice as
        # fast as narrowing the rows by fancy indexing at each position.
        padded = np.zeros(int(offsets[-1]) + width, dtype=np.uint8)
        if column.buffers()[2] is not None:
            data = np.frombuffer(column.buffers()[2], dtype=np.uint8, count=int(offsets[-1]))
            padded[: data.size] = data
        value = np.full(len(column), _FNV_OFFSET, dtype=np.uint64)
        for position in range(width):
            mixed = (value ^ padded[starts + position]) * _FNV_PRIME
            np.copyto(value, mixed, where=lengths > position)
        combined = (combined ^ value) * _FNV_PRIME ^ lengths.astype(np.uint64)
    combined[null] = _NULL_HASH_BASE + (first_row + np.nonzero(null)[0]).astype(np.uint64)
    return combined


class HashBuckets:
    """A delivery's key hashes on disk, split by their top bits into buckets: finding the
    repeated ones sorts one bucket at a time, so memory stays flat however many rows the
    delivery holds (the whole array was 40 MB at 5M rows, 1.04-1.08x the 1M-row peak RSS)."""

    _BITS = 6  # 64 buckets: under 1 MB each at 5M rows

    def __init__(self, parent: Path) -> None:
        parent.mkdir(parents=True, exist_ok=True)
        self._directory = Path(tempfile.mkdtemp(prefix="key-hashes-", dir=parent))
        self._shift = np.uint64(64 - self._BITS)

    def __enter__(self) -> HashBuckets:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self._directory, ignore_errors=True)

    def _path(self, bucket: int) -> Path:
        return self._directory / f"{bucket:02d}.u64"

    def add(self, hashes: np.ndarray) -> None:
        """Append one file's hashes, each to its bucket (sorted first, so a bucket's share
        is one contiguous run)."""
        ordered = np.sort(hashes)
        bounds = np.searchsorted(
            ordered >> self._shift, np.arange((1 << self._BITS) + 1, dtype=np.uint64)
        )
        for bucket in range(1 << self._BITS):
            start, end = bounds[bucket], bounds[bucket + 1]
            if end > start:
                with self._path(bucket).open("ab") as out:
                    ordered[start:end].tofile(out)

    def repeated(self) -> np.ndarray:
        """Every hash added more than once, sorted."""
        found = [np.empty(0, np.uint64)]
        for bucket in range(1 << self._BITS):
            path = self._path(bucket)
            if path.exists():
                values = np.fromfile(path, np.uint64)
                values.sort()
                same = values[1:] == values[:-1]
                found.append(np.unique(values[1:][same]))
        return np.concatenate(found)


def _duplicate_rejects(rows: pa.Table, keys: list[str], source_keys: list[str]) -> list[Reject]:
    """Reasons are assembled by Arrow: a delivery holding a file twice makes millions."""
    names = pa.array(source_keys, pa.string())
    line_bits = pa.scalar((1 << _FILE_SHIFT) - 1, pa.int64())
    shift = pa.scalar(_FILE_SHIFT, pa.int64())

    def file_of(position: pa.Array) -> pa.Array:
        return names.take(pc.shift_right(position, shift))

    def line_of(position: pa.Array) -> pa.Array:
        return pc.bit_wise_and(position, line_bits)

    texts = [pc.cast(rows.column(key), pa.string()) for key in keys]
    shown = pc.binary_join_element_wise(
        *[
            pc.binary_join_element_wise(f"{key}='", text, "'", "")
            for key, text in zip(keys, texts, strict=True)
        ],
        ", ",
    )
    count = rows.column("_position_count")
    extra = pc.cast(pc.subtract(count, 2), pa.string())
    more = pc.if_else(
        pc.greater(count, 2), pc.binary_join_element_wise(" and ", extra, " more", ""), ""
    )
    other = rows.column("_other")
    reasons = pc.binary_join_element_wise(
        f"{DUPLICATE_REASON} ",
        shown,
        " (also at ",
        file_of(other),
        " line ",
        pc.cast(line_of(other), pa.string()),
        more,
        ")",
        "",
    )
    values = pc.binary_join_element_wise(*texts, ", ")
    position = rows.column("_position")
    column = ",".join(keys)
    lines = line_of(position)
    return [
        Reject(source_key, line, column, reason, value, last)
        for source_key, line, reason, value, last in zip(
            file_of(position).to_pylist(),
            lines.to_pylist(),
            reasons.to_pylist(),
            values.to_pylist(),
            last_lines(lines, rows.column("_lines")),
            strict=True,
        )
    ]
