"""The physical lines of a CSV file as Arrow is handed them, kept until their rows are counted.

Arrow returns parsed values, not the text they came from: a record whose quoted value spans
lines has lost the quotes that say whether it was meant (normalize.malformed decides from
its text). The window keeps the bytes Arrow was handed, numbered by physical line, so that
those rare rows can be read again as text; and it measures a line too long to parse.
LineCounter turns Arrow's row numbers into line numbers.

A physical line ends at "\\r\\n", "\\n" or "\\r", inside quoted values too: what an editor
shows, and what line numbers count. The chunks kept are the very bytes objects Arrow reads
(without a copy), so keeping them costs memory only for as long as Arrow's read-ahead runs
ahead of the rows counted; the reader releases them as it counts rows.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleet_import.normalize.header import row_numbers
from fleet_import.normalize.malformed import MalformedRecord

_LF = 0x0A
_CR = 0x0D


@dataclass
class _Chunk:
    offset: int  # of its first byte in the stream
    ends_before: int  # line ends in the stream before it
    data: bytes
    cr_before: bool  # the chunk before ended with "\r": a "\n" opening this one ends no line
    count: int = field(init=False)  # line ends in it
    _ends: np.ndarray | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        # On every chunk Arrow reads, so numpy's: bytes.count(b"\r\n") is 30 times slower.
        data = self.data
        octets = np.frombuffer(data, np.uint8)
        count = int(np.count_nonzero(octets == _LF))
        if b"\r" in data:
            carriage = octets == _CR
            paired = np.count_nonzero(carriage[:-1] & (octets[1:] == _LF))
            count += int(np.count_nonzero(carriage)) - int(paired)
        self.count = count - (self.cr_before and data.startswith(b"\n"))

    @property
    def ends_after(self) -> int:
        return self.ends_before + self.count

    def end_position(self, nth: int) -> int:
        """Stream offset just after this chunk's `nth` (1-based) line end."""
        if self._ends is None:
            self._ends = _line_ends(self.data, self.cr_before)
        return self.offset + int(self._ends[nth - 1])


def _line_ends(data: bytes, cr_before: bool) -> np.ndarray:
    """Offsets just after each line end of `data`: after "\\n" (ending "\\r\\n" too), and
    after a "\\r" that no "\\n" follows."""
    octets = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(octets == _LF)
    if cr_before and ends.size and ends[0] == 0:
        ends = ends[1:]
    carriage = np.flatnonzero(octets == _CR)
    if carriage.size:
        following = carriage + 1
        paired = np.zeros(carriage.size, bool)
        inside = following < octets.size
        paired[inside] = octets[following[inside]] == _LF
        ends = np.sort(np.concatenate([ends, carriage[~paired]]))
    return ends + 1


class LineWindow:
    """The bytes handed to Arrow from the first line not yet counted on.

    Arrow reads (`add`) on a thread of its own while the rows are counted on the caller's
    (everything else). No lock: one thread appends and the other pops, each a single deque
    operation, and the caller reads a snapshot; a lock cost the caller a GIL switch interval
    whenever Arrow's thread held it."""

    def __init__(self) -> None:
        self._chunks: deque[_Chunk] = deque()
        self._offset = 0
        self._ends = 0  # line ends in the chunks added: set after the chunk is there
        self._cr = False

    def add(self, data: bytes) -> None:
        """Only ever called by one thread at a time (Utf8Guard's reads are serialised)."""
        if not data:
            return
        chunk = _Chunk(self._offset, self._ends, data, self._cr)
        self._chunks.append(chunk)
        self._offset += len(data)
        self._cr = data.endswith(b"\r")
        self._ends = chunk.ends_after

    def text(self, first: int, last: int) -> str:
        """Lines `first` to `last` (1-based), each with its line end, as far as read."""
        chunks, ends = self._snapshot()
        start = _start_of(chunks, ends, first)
        if start is None:
            return ""
        data = _bytes(chunks, start, _start_of(chunks, ends, last + 1))
        return data.decode("utf-8", "replace")

    def tail(self, line: int) -> bytes:
        """Everything read from the start of `line` on."""
        chunks, ends = self._snapshot()
        start = _start_of(chunks, ends, line)
        return b"" if start is None else _bytes(chunks, start, None)

    def release_before(self, line: int) -> None:
        """Forget the chunks that hold nothing of `line` or the lines after it."""
        chunks = self._chunks
        while len(chunks) > 1 and chunks[0].ends_after < line - 1:
            chunks.popleft()

    def _snapshot(self) -> tuple[list[_Chunk], int]:
        ends = self._ends  # first: every chunk it counts is in the list taken after it
        return list(self._chunks), ends


def _start_of(chunks: list[_Chunk], ends: int, line: int) -> int | None:
    """Stream offset where `line` starts; None when it is not read yet."""
    if line <= 1:
        return 0
    nth = line - 1  # the line end before it
    if nth > ends:
        return None
    for chunk in chunks:
        if chunk.ends_before < nth <= chunk.ends_after:
            return chunk.end_position(nth - chunk.ends_before)
    raise AssertionError(f"line {line} was released before its row was counted")


def _bytes(chunks: list[_Chunk], start: int, end: int | None) -> bytes:
    parts = []
    for chunk in chunks:
        stop = chunk.offset + len(chunk.data)
        if stop <= start or (end is not None and chunk.offset >= end):
            continue
        low = max(start - chunk.offset, 0)
        high = len(chunk.data) if end is None else min(end - chunk.offset, len(chunk.data))
        parts.append(chunk.data[low:high])
    return b"".join(parts)


class LineCounter:
    """Turns Arrow row numbers (blank lines included) into physical line numbers."""

    def __init__(self) -> None:
        self._next_row = 1  # Arrow's number for the next row; the header is row 1
        self._breaks = 0  # line ends inside quoted values of all rows so far

    def advance(
        self,
        count: int,
        columns: list[pa.Array],
        pending: list[MalformedRecord],
        *,
        final: bool = False,
    ) -> tuple[pa.Array, pa.Array | None, list[tuple[int, MalformedRecord]]]:
        """Lines of the next `count` parsed rows, the line ends inside each (None when
        none has any: the usual case), and the lines of the malformed rows among them.

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
            return row_numbers(start + self._breaks, count), None, []

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
        return lines, inner, list(zip(skipped_lines, skipped, strict=True))

    def next_line(self, pending: list[MalformedRecord]) -> int:
        """The line of the record after every row seen so far, `pending` ones included."""
        return self._next_row + self._breaks + sum(1 + row.line_breaks for row in pending)


def _inner_breaks(columns: list[pa.Array]) -> pa.Array | None:
    """Line ends inside each row's values ("\\r\\n", "\\n" or "\\r", as outside them);
    None when there are none (the usual case)."""
    total = None
    for column in columns:
        data = column.buffers()[2] if pa.types.is_string(column.type) else None
        if data is None:
            continue
        raw = data.to_pybytes()
        if raw.find(b"\n") < 0 and raw.find(b"\r") < 0:
            continue
        counts = pc.subtract(
            pc.add(pc.count_substring(column, "\n"), pc.count_substring(column, "\r")),
            pc.count_substring(column, "\r\n"),
        )
        counts = pc.fill_null(counts, 0).cast(pa.int64())
        total = counts if total is None else pc.add(total, counts)
    if total is None or not pc.sum(total).as_py():
        return None
    return total
