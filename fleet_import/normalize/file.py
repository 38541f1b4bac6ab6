"""Source files to typed Parquet per dataset contract, with a reject for every bad row.

Streaming: memory follows `batch_rows`, not the file size. Readers (normalize_readers,
normalize_csv) yield raw batches with their source lines; normalize_rows types them with
vectorised Arrow kernels. This module writes the output and judges a delivery as a whole:
the share of rejected rows (duplicate natural keys across its files: duplicate_keys.py).
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import asdict
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from fleet_import.config import DEFAULT_CSV_MAX_LINE_BYTES
from fleet_import.contracts.model import DatasetContract, FileFormat
from fleet_import.errors import PreCommitError
from fleet_import.normalize.duplicates import (
    DUPLICATE_REASON,
)
from fleet_import.normalize.output import NormalizedFile
from fleet_import.normalize.readers import read_batches
from fleet_import.normalize.rows import (
    DEFAULT_BATCH_ROWS,
    Reject,
    convert_batch,
    output_schema,
)

# Snappy: what every Parquet consumer (Redshift COPY and Spectrum included) reads.
_COMPRESSION = "snappy"
_PARTIAL_SUFFIX = ".partial"
_REJECT_FIELDS = ("file", "line", "column", "reason", "value", "last_line")


class RejectRatioExceeded(PreCommitError):
    """Too many rows of a dataset were rejected to load the delivery."""

    def __init__(
        self,
        message: str | None = None,
        *,
        dataset: str | None = None,
        ratio: float | None = None,
        limit: float | None = None,
    ) -> None:
        super().__init__(message)
        self.dataset = dataset
        self.ratio = ratio
        self.limit = limit


def normalize_file(
    source: str | Path | BinaryIO,
    *,
    source_key: str,
    fmt: FileFormat,
    contract: DatasetContract,
    out_path: Path,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    max_line_bytes: int = DEFAULT_CSV_MAX_LINE_BYTES,
) -> NormalizedFile:
    """Type one source file into `out_path` (contract columns, then `_source_line` and
    `_source_line_count`: the physical lines each row was read from).

    The output appears only when the whole file was read: a FileRejected midway (say a
    truncated gzip) leaves nothing behind that a cache could mistake for a result.
    """
    if batch_rows < 1:
        raise ValueError("batch_rows must be positive")
    out_path = Path(out_path)
    partial = out_path.with_name(out_path.name + _PARTIAL_SUFFIX)
    schema = output_schema(contract)
    rejects: list[Reject] = []
    aliases: dict[str, str] = {}
    extra: dict[str, str] = {}
    try:
        batches = read_batches(
            source,
            fmt=fmt,
            source_key=source_key,
            contract=contract,
            batch_rows=batch_rows,
            max_line_bytes=max_line_bytes,
        )
        with (
            closing(batches),
            pq.ParquetWriter(
                partial,
                schema,
                compression=_COMPRESSION,
                # Dictionaries pay off for repetitive text only; for numbers and
                # timestamps they cost most of the write time and grow the file.
                use_dictionary=[c.name for c in contract.columns if c.type == "string"],
            ) as writer,
            # Exits first, so a write still in flight ends before the writer closes.
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="normalize-write") as executor,
        ):
            groups = _RowGroups(writer, schema, batch_rows, executor)
            for batch in batches:
                for column, header in batch.aliases.items():
                    aliases.setdefault(column, header)
                for column, column_type in batch.extra_columns.items():
                    extra.setdefault(column, column_type)
                accepted, batch_rejects = convert_batch(batch, contract, source_key)
                rejects.extend(batch_rejects)
                groups.add(accepted)
            row_count = groups.close()
        os.replace(partial, out_path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    rejects.sort(key=lambda reject: reject.line or 0)
    return NormalizedFile(
        source_key=source_key,
        dataset=contract.name,
        parquet_path=out_path,
        row_count=row_count,
        reject_count=len(rejects),
        rejects=rejects,
        aliases=aliases,
        extra_columns=extra,
    )


class _RowGroups:
    """Buffers typed batches so that every row group but the last holds batch_rows rows.

    Each row group is written on a helper thread (Arrow releases the GIL) while the next
    one is read and typed; at most one is in flight, so memory stays bounded.
    """

    def __init__(
        self, writer: pq.ParquetWriter, schema: pa.Schema, rows: int, executor: Executor
    ) -> None:
        self._writer = writer
        self._schema = schema
        self._rows = rows
        self._executor = executor
        self._in_flight: Future[None] | None = None
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self.written = 0

    def add(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        while self._pending_rows >= self._rows:
            self._write(self._rows)

    def close(self) -> int:
        if self._pending_rows:
            self._write(self._pending_rows)
        self._wait()
        return self.written

    def _write(self, count: int) -> None:
        table = pa.Table.from_batches(self._pending, schema=self._schema)
        self._wait()
        self._in_flight = self._executor.submit(
            self._writer.write_table, table.slice(0, count), row_group_size=count
        )
        rest = table.slice(count)
        self._pending = rest.to_batches()
        self._pending_rows = rest.num_rows
        self.written += count

    def _wait(self) -> None:
        if self._in_flight is not None:
            in_flight, self._in_flight = self._in_flight, None
            in_flight.result()


def check_reject_ratio(contract: DatasetContract, accepted_rows: int, rejected_rows: int) -> None:
    """Fail the delivery when the dataset's rejected share exceeds its contract's limit."""
    total = accepted_rows + rejected_rows
    if not total:
        return
    ratio = rejected_rows / total
    limit = contract.max_reject_ratio
    if ratio > limit:
        raise RejectRatioExceeded(
            f"dataset {contract.name!r}: {rejected_rows} of {total} rows rejected "
            f"({ratio:.2%}), above the limit of {limit:.2%}",
            dataset=contract.name,
            ratio=ratio,
            limit=limit,
        )


def write_rejects(rejects: Iterable[Reject], path: Path) -> int:
    """All rejects as CSV (file,line,column,reason,value,last_line), for people to read; the
    count. `last_line` is empty but for a record that spans lines."""
    count = 0
    with Path(path).open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(_REJECT_FIELDS)
        for reject in rejects:
            values = (getattr(reject, name) for name in _REJECT_FIELDS)
            writer.writerow(["" if value is None else value for value in values])
            count += 1
    return count


def summarize_rejects(rejects: Sequence[Reject], sample: int = 20) -> dict[str, Any]:
    """A small JSON-able digest for batch details and UI artifacts."""
    return {
        "count": len(rejects),
        "by_reason": dict(Counter(_reason_kind(r.reason) for r in rejects).most_common()),
        "by_file": dict(Counter(r.file for r in rejects).most_common()),
        "by_column": dict(Counter(r.column or "" for r in rejects).most_common()),
        "sample": [asdict(reject) for reject in rejects[:sample]],
    }


def _reason_kind(reason: str) -> str:
    """Reasons without the per-row detail, so that counting them stays bounded."""
    return DUPLICATE_REASON if reason.startswith(DUPLICATE_REASON) else reason
