"""CSV (plain or gzip) to SourceBatch stream, with exact physical line numbers.

Arrow's streaming reader parses, single-threaded so that rows arrive in order and the row
numbers it gives malformed rows are known. Arrow numbers rows, not lines: a quoted value
spanning lines is one row. The line of a row is therefore its Arrow row number plus the
line breaks inside quoted values before it, which _LineCounter adds up. "Line" means the
1-based physical line on which the record starts (the header is line 1), with line ends
as Arrow reads them ("\\n", "\\r\\n" or "\\r") and "\\n" inside quoted values.

Every non-blank line is accounted for: it starts a record that is loaded or rejected, it
continues a multi-line record, or an unbalanced quote swallowed it and it is rejected on
its own (normalize_malformed). A record that does not end within a parse block fails the
file, naming the line it starts on.

Arrow reads the bytes through Utf8Guard, which keeps invalid UTF-8 from aborting the file
and works around an Arrow bug that corrupts quoted CRLFs at block boundaries.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from fleet_import.contracts.drift import allows_new_columns
from fleet_import.contracts.model import DatasetContract
from fleet_import.normalize.header import extra_column_types, match_header, row_numbers
from fleet_import.normalize.malformed import MalformedRecord, malformed_rejects
from fleet_import.normalize.rows import (
    REASON_UTF8,
    FileRejected,
    Reject,
    SourceBatch,
    raw_text,
    unreadable,
)

_READ_BYTES = 1 << 20
# Arrow needs a whole record inside one block: this is also the longest record accepted.
MIN_BLOCK_BYTES = 1 << 20
_MAX_BLOCK_BYTES = 1 << 24
_BLOCK_BYTES_PER_ROW = 16
_REPLACEMENT = "\ufffd"
_CR = 0x0D
# Arrow's error for a record that does not end within one block.
_STRADDLING = "straddling object straddles two block boundaries"
# Columns read as text beyond the contract's when its drift policy allows new ones (else
# they reject the file, whatever their type); more than this many are typed by Arrow.
_EXTRA_COLUMNS_READ = 1024


def block_bytes(batch_rows: int) -> int:
    """Bytes per parse block: about batch_rows narrow rows, so memory follows batch_rows."""
    return min(max(batch_rows * _BLOCK_BYTES_PER_ROW, MIN_BLOCK_BYTES), _MAX_BLOCK_BYTES)


def read_csv(
    stream: BinaryIO | pa.NativeFile,
    *,
    source_key: str,
    contract: DatasetContract,
    batch_rows: int,
) -> Iterator[SourceBatch]:
    invalid: list[MalformedRecord] = []

    def on_invalid(row: pacsv.InvalidRow) -> str:
        invalid.append(
            MalformedRecord(row.number, row.expected_columns, row.actual_columns, row.text)
        )
        return "skip"

    guard = Utf8Guard(stream)
    width = len(contract.columns)
    read_as_text = width + (_EXTRA_COLUMNS_READ if allows_new_columns(contract) else 0)
    block_size = block_bytes(batch_rows)
    try:
        reader = pacsv.open_csv(
            guard,
            read_options=pacsv.ReadOptions(
                use_threads=False,
                block_size=block_size,
                # The header is read as data, so that it is parsed like any row and counted.
                autogenerate_column_names=True,
            ),
            parse_options=pacsv.ParseOptions(
                newlines_in_values=True,
                ignore_empty_lines=False,  # blank lines must count as rows to count lines
                invalid_row_handler=on_invalid,
            ),
            convert_options=pacsv.ConvertOptions(
                # Columns beyond the contract's width reject the file, whatever their type.
                column_types={f"f{i}": pa.string() for i in range(read_as_text)},
                strings_can_be_null=True,
                quoted_strings_can_be_null=True,
                null_values=[""],
            ),
        )
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable_csv(source_key, exc) from exc

    counter = _LineCounter()
    positions: list[int | None] | None = None
    aliases: dict[str, str] = {}
    extra: dict[str, str] = {}
    extra_at: list[int] = []
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        except (pa.ArrowException, OSError) as exc:
            if _STRADDLING in str(exc):
                line = counter.next_line(invalid)
                raise _record_too_long(source_key, line, block_size, exc) from exc
            raise _unreadable_csv(source_key, exc) from exc
        first = positions is None
        if positions is None:
            header = match_header(_header(batch), contract, source_key)
            positions, aliases = header.positions, header.aliases
            extra = extra_column_types(
                contract, dict.fromkeys(header.extra, contract.new_column_type), source_key
            )
            extra_at = list(header.extra.values())
        lines, skipped = counter.advance(batch.num_rows, batch.columns, invalid)
        columns = [
            batch.column(position)
            if position is not None
            else pa.nulls(batch.num_rows, pa.string())
            for position in positions
        ]
        # Not loaded, but a row holding a value only there is no blank line.
        ignored = [batch.column(position) for position in extra_at]
        if first:
            columns = [column.slice(1) for column in columns]
            ignored = [column.slice(1) for column in ignored]
            lines = lines.slice(1)
        rejects = _rejects(source_key, skipped)
        batch_read = SourceBatch(columns, lines, rejects, aliases=aliases, extra_columns=extra)
        yield _tidy(batch_read, guard.replaced, contract, source_key, ignored)
    _, skipped = counter.advance(0, [], invalid, final=True)
    if skipped:
        empty = [pa.array([], pa.string()) for _ in range(width)]
        yield SourceBatch(empty, pa.array([], pa.int64()), _rejects(source_key, skipped))


def _header(batch: pa.RecordBatch) -> list[str]:
    values = [batch.column(i)[0].as_py() for i in range(batch.num_columns)]
    return ["" if value is None else str(value) for value in values]


def _rejects(source_key: str, skipped: list[tuple[int, MalformedRecord]]) -> list[Reject]:
    return [reject for line, row in skipped for reject in malformed_rejects(source_key, line, row)]


def _record_too_long(
    source_key: str, line: int, block_size: int, exc: BaseException
) -> FileRejected:
    """Arrow needs a whole record inside one block. Every row before this record has been
    read, so it starts on the next line; most often a quote opened there never closes."""
    problem = (
        f"unreadable CSV: the record on line {line} does not end within {block_size} bytes "
        f"(is a quote opened on line {line} never closed?)"
    )
    return unreadable(source_key, problem, exc)


def _unreadable_csv(source_key: str, exc: BaseException) -> FileRejected:
    detail = str(exc)
    if "Empty CSV file" in detail:
        return FileRejected(f"{source_key}: empty file")
    if any(word in detail.lower() for word in ("compressed", "zlib", "gzip", "inflate")):
        return unreadable(source_key, "truncated or corrupt gzip data", exc)
    return unreadable(source_key, "unreadable CSV", exc)


def _tidy(
    batch: SourceBatch,
    replaced_utf8: bool,
    contract: DatasetContract,
    source_key: str,
    ignored: list[pa.Array] | None = None,
) -> SourceBatch:
    """Drop blank records silently and reject rows holding bytes that were not UTF-8.
    `ignored`: the file's columns beyond the contract's (a record is blank in those too)."""
    columns, lines, rejects = batch.columns, batch.lines, batch.rejects
    every = [*columns, *(ignored or [])]
    if columns and all(column.null_count for column in every):
        blank = columns[0].is_null()
        for column in every[1:]:
            blank = pc.and_(blank, column.is_null())
        if blank.true_count:
            keep = pc.invert(blank)
            columns = [column.filter(keep) for column in columns]
            lines = lines.filter(keep)
    if replaced_utf8:
        taken = None
        for column, values in zip(contract.columns, columns, strict=True):
            bad = pc.fill_null(pc.match_substring(values, _REPLACEMENT), False)
            new = bad if taken is None else pc.and_not(bad, taken)
            if not new.true_count:
                continue
            rows = pc.indices_nonzero(new)
            rejects = rejects + [
                Reject(source_key, line, column.name, REASON_UTF8, value)
                for line, value in zip(
                    lines.take(rows).to_pylist(), raw_text(values.take(rows)), strict=True
                )
            ]
            taken = new if taken is None else pc.or_(taken, new)
        if taken is not None:
            keep = pc.invert(taken)
            columns = [column.filter(keep) for column in columns]
            lines = lines.filter(keep)
    return SourceBatch(
        columns, lines, rejects, aliases=batch.aliases, extra_columns=batch.extra_columns
    )


class _LineCounter:
    """Turns Arrow row numbers (blank lines included) into physical line numbers."""

    def __init__(self) -> None:
        self._next_row = 1  # Arrow's number for the next row; the header is row 1
        self._breaks = 0  # line breaks inside quoted values of all rows so far

    def advance(
        self,
        count: int,
        columns: list[pa.Array],
        pending: list[MalformedRecord],
        *,
        final: bool = False,
    ) -> tuple[pa.Array, list[tuple[int, MalformedRecord]]]:
        """Lines of the next `count` parsed rows, and of the malformed rows among them.

        Arrow may report malformed rows of the next block before returning this one, so
        only those numbered within this stretch are taken from `pending`.
        """
        start = self._next_row
        taken = 0
        while taken < len(pending) and (final or pending[taken].number < start + count + taken):
            taken += 1
        skipped = pending[:taken]
        del pending[:taken]
        inner = _inner_breaks(columns)
        self._next_row += count + taken
        if not skipped and inner is None:
            return row_numbers(start + self._breaks, count), []

        # Rare path: malformed rows, or quoted values spanning lines, in this stretch.
        before = [min(max(row.number - start - j, 0), count) for j, row in enumerate(skipped)]
        skipped_breaks = [row.line_breaks for row in skipped]
        cumulative = pc.cumulative_sum(inner) if inner is not None else None
        skipped_lines = []
        breaks_of_skipped = 0
        for row, rows_before, breaks in zip(skipped, before, skipped_breaks, strict=True):
            inner_before = 0
            if cumulative is not None and rows_before:
                inner_before = cumulative[rows_before - 1].as_py()
            skipped_lines.append(row.number + self._breaks + inner_before + breaks_of_skipped)
            breaks_of_skipped += breaks
        lines = row_numbers(start + self._breaks, count)
        if inner is not None:
            lines = pc.add(lines, pc.subtract(cumulative, inner))
        if skipped and count:
            shift = [0] * count
            for rows_before, breaks in zip(before, skipped_breaks, strict=True):
                if rows_before < count:
                    shift[rows_before] += 1 + breaks
            lines = pc.add(lines, pc.cumulative_sum(pa.array(shift, pa.int64())))
        self._breaks += breaks_of_skipped + (pc.sum(inner).as_py() if inner is not None else 0)
        return lines, list(zip(skipped_lines, skipped, strict=True))

    def next_line(self, pending: list[MalformedRecord]) -> int:
        """The line of the record after every row seen so far, `pending` ones included."""
        return self._next_row + self._breaks + sum(1 + row.line_breaks for row in pending)


def _inner_breaks(columns: list[pa.Array]) -> pa.Array | None:
    """Line breaks inside each row's values; None when there are none (the usual case)."""
    total = None
    for column in columns:
        data = column.buffers()[2] if pa.types.is_string(column.type) else None
        if data is None or data.to_pybytes().find(b"\n") < 0:
            continue
        counts = pc.fill_null(pc.count_substring(column, "\n"), 0).cast(pa.int64())
        total = counts if total is None else pc.add(total, counts)
    if total is None or not pc.sum(total).as_py():
        return None
    return total


class ReadOnlyStream:
    """What Arrow's `PythonFile` needs of a forward-only reader besides `read`. Closing it
    leaves the stream it reads from to that stream's owner."""

    closed = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


class Utf8Guard(ReadOnlyStream):
    """A read-only stream that passes valid UTF-8 through and turns invalid bytes into U+FFFD.

    Arrow hands malformed rows to the invalid-row handler as Python str, so a row that is
    malformed and also holds invalid UTF-8 would abort the whole file. After a replacement
    (`replaced`), cells holding U+FFFD are rejected as invalid UTF-8. The stream also ends
    with a line break, which Arrow needs to see a header-only file as a header.
    """

    def __init__(self, raw: BinaryIO | pa.NativeFile) -> None:
        self._raw = raw
        self._carry = b""
        self._pending = bytearray()
        self._eof = False
        self._last = b"\n"
        self.replaced = False

    def read(self, size: int | None = -1) -> bytes:
        wanted = sys.maxsize if size is None or size < 0 else size
        while len(self._pending) < wanted and not self._eof:
            chunk = self._raw.read(max(min(wanted, _MAX_BLOCK_BYTES), _READ_BYTES))
            self._pending += self._checked(chunk) if chunk else self._finish()
        cut = min(wanted, len(self._pending))
        more = cut < len(self._pending) or not self._eof
        if cut > 1 and more and self._pending[cut - 1] == _CR:
            # Arrow drops a "\n" that opens a block after one ending in "\r", even inside
            # a quoted value (apache/arrow#51368): never end a block there.
            cut -= 1
        with memoryview(self._pending) as view:
            out = bytes(view[:cut])
        del self._pending[:cut]
        return out

    def _checked(self, chunk: bytes) -> bytes:
        data = self._carry + chunk if self._carry else chunk
        cut = _complete_utf8_prefix(data)
        head, self._carry = (data, b"") if cut == len(data) else (data[:cut], data[cut:])
        if not head.isascii():
            try:
                head.decode("utf-8")
            except UnicodeDecodeError:
                self.replaced = True
                head = head.decode("utf-8", "replace").encode("utf-8")
        if head:
            self._last = head[-1:]
        return head

    def _finish(self) -> bytes:
        self._eof = True
        tail = b""
        if self._carry:
            self.replaced = True
            tail = self._carry.decode("utf-8", "replace").encode("utf-8")
            self._last = tail[-1:]
        if self._last != b"\n":
            tail += b"\n"
        return tail


def _complete_utf8_prefix(data: bytes) -> int:
    """Length of `data` without a multi-byte sequence cut off at its end by a read."""
    end = len(data)
    for back in range(1, min(4, end) + 1):
        byte = data[end - back]
        if byte < 0x80:
            return end
        if byte >= 0xC0:
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return end if back >= need else end - back
    return end
