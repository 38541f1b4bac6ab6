"""CSV (plain or gzip) to SourceBatch stream, with exact physical line numbers.

Arrow's streaming reader parses, single-threaded so that rows arrive in order and the row
numbers it gives malformed rows are known. Arrow numbers rows, not lines: a quoted value
spanning lines is one row. The line of a row is therefore its Arrow row number plus the
line ends inside quoted values before it, which LineCounter adds up. "Line" means the
1-based physical line on which the record starts (the header is line 1); a line ends at
"\\r\\n", "\\n" or "\\r", inside quoted values too.

Every line is accounted for: it is one of the lines of a record that is loaded (its row
names them: `_source_line_count`) or rejected (its reject names the last: `last_line`), a
line an unbalanced quote swallowed, rejected on its own (normalize.malformed, which also
says when a record may span lines: the rows Arrow returns spanning lines are read again as
text to judge their quotes), or a blank record, which holds no data. A record longer than
the limit (FLEET_CSV_MAX_LINE_BYTES) fails the file, naming its line and that line's length.

Arrow reads the bytes through Utf8Guard, which keeps invalid UTF-8 from aborting the file,
works around an Arrow bug that corrupts quoted CRLFs at block boundaries, and keeps what it
hands out by physical line (normalize.physical_lines) until its rows are counted.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterator
from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from fleet_import.config import DEFAULT_CSV_MAX_LINE_BYTES
from fleet_import.contracts.drift import allows_new_columns
from fleet_import.contracts.model import DatasetContract
from fleet_import.normalize.header import extra_column_types, match_header, row_numbers
from fleet_import.normalize.malformed import (
    MalformedRecord,
    malformed_rejects,
    swallowed_rejects,
    unbalanced_quote_line,
)
from fleet_import.normalize.physical_lines import LineCounter, LineWindow
from fleet_import.normalize.rows import (
    REASON_UTF8,
    FileRejected,
    Reject,
    SourceBatch,
    last_lines,
    raw_text,
    unreadable,
)

_READ_BYTES = 1 << 20
# The block size's floor (the longest record read is FLEET_CSV_MAX_LINE_BYTES, at least).
MIN_BLOCK_BYTES = 1 << 20
_MAX_BLOCK_BYTES = 1 << 24
_BLOCK_BYTES_PER_ROW = 16
_REPLACEMENT = "\ufffd"
_CR = 0x0D
# Arrow's error for a record that does not end within one block boundary.
_STRADDLING = "straddling object straddles two block boundaries"
# A line too long to parse is read on this far to say how long it is.
_MEASURE_BYTES = 1 << 30
_LINE_END = re.compile(rb"\r\n|\r|\n")
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
    max_line_bytes: int = DEFAULT_CSV_MAX_LINE_BYTES,
) -> Iterator[SourceBatch]:
    """`max_line_bytes`: the longest record sure to be read (FLEET_CSV_MAX_LINE_BYTES); a
    longer one may fail the file, which then names its line and that line's length."""
    invalid: list[MalformedRecord] = []

    def on_invalid(row: pacsv.InvalidRow) -> str:
        invalid.append(
            MalformedRecord(row.number, row.expected_columns, row.actual_columns, row.text)
        )
        return "skip"

    guard = Utf8Guard(stream)
    width = len(contract.columns)
    read_as_text = width + (_EXTRA_COLUMNS_READ if allows_new_columns(contract) else 0)
    try:
        reader = pacsv.open_csv(
            guard,
            read_options=pacsv.ReadOptions(
                use_threads=False,
                # Arrow needs a whole record within one block boundary.
                block_size=max(block_bytes(batch_rows), max_line_bytes),
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

    counter = LineCounter()
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
                raise _record_too_long(source_key, line, max_line_bytes, guard) from exc
            raise _unreadable_csv(source_key, exc) from exc
        first = positions is None
        if positions is None:
            header = match_header(_header(batch), contract, source_key)
            positions, aliases = header.positions, header.aliases
            extra = extra_column_types(
                contract, dict.fromkeys(header.extra, contract.new_column_type), source_key
            )
            extra_at = list(header.extra.values())
        lines, breaks, skipped = counter.advance(batch.num_rows, batch.columns, invalid)
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
            breaks = None if breaks is None else breaks.slice(1)
        rows = _Rows(columns, ignored, lines, breaks)
        rejects = _rejects(source_key, skipped) + rows.judge(guard.window, source_key)
        guard.window.release_before(counter.next_line([]))
        batch_read = SourceBatch(
            rows.columns,
            rows.lines,
            rejects,
            aliases=aliases,
            extra_columns=extra,
            line_counts=rows.line_counts(),
        )
        yield _tidy(batch_read, guard.replaced, contract, source_key)
    _, _, skipped = counter.advance(0, [], invalid, final=True)
    if skipped:
        empty = [pa.array([], pa.string()) for _ in range(width)]
        yield SourceBatch(empty, pa.array([], pa.int64()), _rejects(source_key, skipped))


def _header(batch: pa.RecordBatch) -> list[str]:
    values = [batch.column(i)[0].as_py() for i in range(batch.num_columns)]
    return ["" if value is None else str(value) for value in values]


def _rejects(source_key: str, skipped: list[tuple[int, MalformedRecord]]) -> list[Reject]:
    return [reject for line, row in skipped for reject in malformed_rejects(source_key, line, row)]


class _Rows:
    """The rows Arrow parsed from one block, as the reader judges them against their text.

    `columns`: the contract's, `ignored`: the file's beyond them (not loaded, but a value
    there makes a row no blank one), `breaks`: the line ends inside each row (None: none
    has any, the usual case)."""

    def __init__(
        self,
        columns: list[pa.Array],
        ignored: list[pa.Array],
        lines: pa.Array,
        breaks: pa.Array | None,
    ) -> None:
        self.columns, self.ignored, self.lines, self.breaks = columns, ignored, lines, breaks

    def judge(self, window: LineWindow, source_key: str) -> list[Reject]:
        """Drop what is not a row: a blank record (silently), and a record spanning lines
        whose quotes are not well-formed (each line its own reject: normalize.malformed),
        which is rare, and the only one read again as text."""
        dropped: pa.BooleanArray | None = None
        rejects: list[Reject] = []
        if self.breaks is not None:
            spanning = pc.indices_nonzero(pc.greater(self.breaks, 0))
            firsts = self.lines.take(spanning).to_pylist()
            breaks = self.breaks.take(spanning).to_pylist()
            broken = []
            for row, first, count in zip(spanning.to_pylist(), firsts, breaks, strict=True):
                text = window.text(first, first + count)
                opened = unbalanced_quote_line(text)
                if opened is not None:
                    broken.append(row)
                    rejects += swallowed_rejects(source_key, first, text, opened)
            if broken:
                rows = row_numbers(0, len(self.lines))
                dropped = pc.is_in(rows, value_set=pa.array(broken, pa.int64()))
        every = [*self.columns, *self.ignored]
        if self.columns and all(column.null_count for column in every):
            blank = self.columns[0].is_null()
            for column in every[1:]:
                blank = pc.and_(blank, column.is_null())
            # Every value empty: a blank line, or one of bare delimiters (what spreadsheets
            # write for a row they kept empty). No data, so no row, and no reject either.
            if blank.true_count:
                dropped = blank if dropped is None else pc.or_(dropped, blank)
        if dropped is not None:
            keep = pc.invert(dropped)
            self.columns = [column.filter(keep) for column in self.columns]
            self.ignored = [column.filter(keep) for column in self.ignored]
            self.lines = self.lines.filter(keep)
            self.breaks = None if self.breaks is None else self.breaks.filter(keep)
        return rejects

    def line_counts(self) -> pa.Array | None:
        """The physical lines each row was read from; None: one each."""
        if self.breaks is None or not pc.sum(self.breaks).as_py():
            return None
        return pc.add(self.breaks, 1).cast(pa.int32())


def _record_too_long(source_key: str, line: int, limit: int, guard: Utf8Guard) -> FileRejected:
    """Arrow needs a whole record within one block boundary. Every row before this record
    has been read, so it starts on the next line: either that line is too long, or a quoted
    value on it runs on over the lines after it."""
    length, whole = guard.line_length(line)
    shown = f"{length:,} bytes" if whole else f"over {length:,} bytes"
    limit_shown = f"{limit:,} bytes (FLEET_CSV_MAX_LINE_BYTES raises it)"
    if length > limit:
        problem = f"line {line} is {shown} long, over the limit for a CSV line of {limit_shown}"
    else:
        problem = (
            f"the record on line {line} runs on past the limit for a CSV line of "
            f"{limit_shown}, though line {line} itself is {shown} long: a quoted value "
            f"that spans lines and never closes?"
        )
    return FileRejected(f"{source_key}: unreadable CSV: {problem}")


def _unreadable_csv(source_key: str, exc: BaseException) -> FileRejected:
    detail = str(exc)
    if "Empty CSV file" in detail:
        return FileRejected(f"{source_key}: empty file")
    if any(word in detail.lower() for word in ("compressed", "zlib", "gzip", "inflate")):
        return unreadable(source_key, "truncated or corrupt gzip data", exc)
    return unreadable(source_key, "unreadable CSV", exc)


def _tidy(
    batch: SourceBatch, replaced_utf8: bool, contract: DatasetContract, source_key: str
) -> SourceBatch:
    """Reject rows holding bytes that were not UTF-8."""
    if not replaced_utf8:
        return batch
    columns, lines, counts, rejects = batch.columns, batch.lines, batch.line_counts, batch.rejects
    taken = None
    for column, values in zip(contract.columns, columns, strict=True):
        bad = pc.fill_null(pc.match_substring(values, _REPLACEMENT), False)
        new = bad if taken is None else pc.and_not(bad, taken)
        if not new.true_count:
            continue
        rows = pc.indices_nonzero(new)
        found = lines.take(rows)
        rejects = rejects + [
            Reject(source_key, line, column.name, REASON_UTF8, value, last)
            for line, value, last in zip(
                found.to_pylist(),
                raw_text(values.take(rows)),
                last_lines(found, None if counts is None else counts.take(rows)),
                strict=True,
            )
        ]
        taken = new if taken is None else pc.or_(taken, new)
    if taken is None:
        return batch
    keep = pc.invert(taken)
    return SourceBatch(
        [column.filter(keep) for column in columns],
        lines.filter(keep),
        rejects,
        aliases=batch.aliases,
        extra_columns=batch.extra_columns,
        line_counts=None if counts is None else counts.filter(keep),
    )


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
    with a line break, which Arrow needs to see a header-only file as a header. What it
    hands out is kept in `window` until the reader counted its rows.
    Arrow reads on a thread of its own: reads are serialised.
    """

    def __init__(self, raw: BinaryIO | pa.NativeFile) -> None:
        self._raw = raw
        self._carry = b""
        self._pending = bytearray()
        self._eof = False
        self._last = b"\n"
        self._lock = threading.Lock()
        self.replaced = False
        self.window = LineWindow()

    def read(self, size: int | None = -1) -> bytes:
        with self._lock:
            out = self._read(size)
            self.window.add(out)
            return out

    def line_length(self, line: int) -> tuple[int, bool]:
        """The bytes of physical line `line` (without its line end), read on to its end;
        and whether its end was found (else it is longer, by _MEASURE_BYTES at least). What
        is read on is only counted. Holds the lock: whatever Arrow read is in the window."""
        with self._lock:
            data = self.window.tail(line)
            length = 0
            while True:
                end = _LINE_END.search(data)
                if end is not None:
                    return length + end.start(), True
                length += len(data)
                if length > _MEASURE_BYTES:
                    return length, False
                data = self._read(_READ_BYTES)
                if not data:
                    return length, True

    def _read(self, size: int | None) -> bytes:
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
