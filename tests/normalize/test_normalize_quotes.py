"""Every physical line of a CSV file is accounted for, whatever its quotes do (issues 11.5
and 46.2).

A quote left open used to swallow the lines after it into one reject (or, up to the end of
the file, into nothing at all); a stray quote closed by another lines below into the right
number of columns made one value of the lines between, loaded or rejected on its first
line alone. Local files only: no database, no S3 (tests/importing/test_line_accounting.py
has the same identity through a real PostgreSQL load).
"""

from __future__ import annotations

import gzip
import re
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fleet_import.contracts.fleet import TRIPS
from fleet_import.normalize import csv as normalize_csv
from fleet_import.normalize.malformed import unbalanced_quote_line
from fleet_import.normalize.output import NormalizedFile
from fleet_import.normalize.rows import (
    SOURCE_LINE_COLUMN,
    SOURCE_LINE_COUNT_COLUMN,
    FileRejected,
    Reject,
)
from tests.normalize_helpers import HEADER, csv_line, output, run, trip, trips_csv

WIDTH = len(TRIPS.columns)
_UNBALANCED = re.compile(r"unbalanced quote opened on line (\d+)")
_TOO_LONG = re.compile(
    r"(?:line (\d+) is [\d,]+ bytes long, over|the record on line (\d+) runs on past) "
    r"the limit for a CSV line of ([\d,]+) bytes \(FLEET_CSV_MAX_LINE_BYTES raises it\)"
)
_LINE_END = re.compile(r"\r\n|\r|\n")


def lines_of(result: NormalizedFile) -> list[int]:
    return output(result).column(SOURCE_LINE_COLUMN).to_pylist()


def spans_of(result: NormalizedFile) -> list[tuple[int, int]]:
    """(first line, line count) of each loaded row."""
    table = output(result)
    return list(
        zip(
            table.column(SOURCE_LINE_COLUMN).to_pylist(),
            table.column(SOURCE_LINE_COUNT_COLUMN).to_pylist(),
            strict=True,
        )
    )


def swallowed(opened: int, line: int, text: str, file: str = "trips.csv") -> Reject:
    reason = f"unbalanced quote opened on line {opened}"
    if line > opened:
        reason += " swallowed this line"
    return Reject(file, line, None, reason, text)


# --- where a quote breaks ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ('a,"b\nc",d', None),  # a value spanning lines, as meant
        ('a,"b""\nc""",d', None),  # doubled quotes inside it
        ('a,"b"x,d', None),  # closed badly, but on its own line: nothing swallowed
        ('a,"b\nc', 0),  # never closed: ran to the end of the file
        ('a,"b\nc"x,d', 0),  # "closed" by a stray quote followed by text
        ('a,"b\r\nc"x', 0),
        ('a,"b"x,"c\nd', 0),
        ('"a\nb",c,"d\ne\nf', 1),  # after a value spanning lines, as meant
    ],
)
def test_unbalanced_quote_line(text: str, line: int | None) -> None:
    assert unbalanced_quote_line(text) == line


# --- the reported shapes, small ----------------------------------------------------------------


@pytest.mark.parametrize(("fmt", "line_end"), [("csv", "\n"), ("csv", "\r\n"), ("csv.gz", "\n")])
def test_a_quote_left_open_rejects_every_line_it_swallowed(
    tmp_path: Path, fmt: str, line_end: str
) -> None:
    rows = [csv_line(trip(i)).rstrip("\n") for i in range(1, 8)]
    rows[3] = rows[3].replace("D1", '"D1')  # line 5
    content = (line_end.join([HEADER, *rows]) + line_end).encode()
    if fmt == "csv.gz":
        content = gzip.compress(content)

    result = run(tmp_path, content, name=f"trips.{fmt}", fmt=fmt)

    assert lines_of(result) == [2, 3, 4]
    assert result.rejects == [swallowed(5, n, rows[n - 2], f"trips.{fmt}") for n in range(5, 9)]
    assert result.row_count + result.reject_count == len(rows)


def test_a_stray_quote_closed_by_a_later_one_rejects_the_lines_between(tmp_path: Path) -> None:
    rows = [csv_line(trip(i)) for i in range(1, 8)]
    rows[3] = rows[3].replace("D1", '"D1')  # line 5 opens a quote...
    rows[5] = rows[5].replace(",2026-07-22T08", ',"2026-07-22T08')  # ...line 7 closes it badly
    # Arrow reads lines 5-7 as one record of 8 fields; line 8 is read as usual again.

    result = run(tmp_path, HEADER + "\n" + "".join(rows))

    assert lines_of(result) == [2, 3, 4, 8]
    assert result.rejects == [swallowed(5, n, rows[n - 2].rstrip("\n")) for n in (5, 6, 7)]


def test_a_stray_quote_closed_into_the_right_column_count_is_one_record(tmp_path: Path) -> None:
    """Nothing tells this record from a value that spans lines on purpose (its quotes are
    RFC 4180's): it is one record, here rejected once, naming lines 5 to 7."""
    rows = [csv_line(trip(i)) for i in range(1, 8)]
    rows[3] = rows[3].replace("D1", '"D1')  # line 5 opens a quote in driver_id...
    rows[5] = rows[5].replace("D0,", 'D0",')  # ...and line 7 closes it there

    result = run(tmp_path, HEADER + "\n" + "".join(rows))

    assert lines_of(result) == [2, 3, 4, 8]
    reject = result.rejects[0]
    assert (result.reject_count, reject.line, reject.last_line) == (1, 5, 7)
    assert (reject.column, reject.reason) == ("driver_id", "longer than 64 characters")


def test_a_stray_quote_closed_by_a_stray_one_rejects_each_line_between(tmp_path: Path) -> None:
    """Issue 46.2, as found: `"D5` on line 51 and `D8"x` on line 54 made one driver of four
    lines with the header's number of columns. Arrow returns it as a well-formed record; its
    closing quote is followed by `x`, so it is no quoted value as RFC 4180 writes one, and
    each of its lines is rejected on its own. Nothing is lost: 2,996 rows and 4 rejects."""
    rows = [csv_line(trip(i)) for i in range(3000)]
    rows[51 - 2] = rows[51 - 2].replace(",D", ',"D', 1)
    rows[54 - 2] = rows[54 - 2].replace(",D", ',D8"x', 1)

    result = run(tmp_path, HEADER + "\n" + "".join(rows))

    assert result.row_count == 2996
    assert result.rejects == [
        swallowed(51, line, rows[line - 2].rstrip("\n")) for line in (51, 52, 53, 54)
    ]
    assert set(lines_of(result)) == set(range(2, 3002)) - {51, 52, 53, 54}
    assert {count for _, count in spans_of(result)} == {1}


@pytest.mark.parametrize("inner", ["\n", "\r\n", "\r"])
def test_a_value_spanning_lines_as_meant_is_loaded_with_every_line_it_covers(
    tmp_path: Path, inner: str
) -> None:
    rows = [csv_line(trip(i)) for i in range(1, 5)]
    rows[1] = rows[1].replace(",D2,", f',"D{inner}""2""{inner}{inner}x",')  # lines 3-6

    result = run(tmp_path, HEADER + "\n" + "".join(rows))

    assert spans_of(result) == [(2, 1), (3, 4), (7, 1), (8, 1)]
    assert output(result).column("driver_id")[1].as_py() == f'D{inner}"2"{inner}{inner}x'
    assert result.rejects == []


def test_a_quote_left_open_on_the_last_line_swallowed_no_line(tmp_path: Path) -> None:
    """Found by the identity below: a value spanning lines 2-3 as meant, then a quote that
    opens on line 3 and runs only into the line end that ends the file. Nothing after it was
    swallowed: one record, rejected once on line 2, its text holding both lines."""
    first = "T0,V1,D1,2026-07-22T08:15:00Z,,1.5,1,2,completed"
    second = 'T1,V1,D1",2026-07-22T08:15:00Z,",1.5,1,2,completed'
    text = f'{HEADER}\n"{first}\n{second}\n'

    result = run(tmp_path, text)

    assert result.row_count == 0
    [reject] = result.rejects
    assert (reject.line, reject.reason) == (2, "expected 9 columns, found 3")
    assert reject.value == f'"{first}\n{second}'
    check_every_line_is_accounted_for(text, result)


def test_blank_lines_a_quote_swallowed_are_not_rejected(tmp_path: Path) -> None:
    content = trips_csv(1) + 'T2,V1,"D1\n\nT3\n\n'  # lines 3-6

    result = run(tmp_path, content)

    assert lines_of(result) == [2]
    assert result.rejects == [swallowed(3, 3, 'T2,V1,"D1'), swallowed(3, 5, "T3")]


def test_lines_before_the_unbalanced_quote_are_rejected_with_its_record(tmp_path: Path) -> None:
    content = trips_csv(1) + 'T2,"two\nlines",2026-07-22T08:15:00Z,"oops\nT3\n'  # lines 3-6

    result = run(tmp_path, content)

    opened = "unbalanced quote opened on line 4"
    assert [(r.line, r.reason, r.value) for r in result.rejects] == [
        (3, f"{opened} breaks the record this line is part of", 'T2,"two'),
        (4, opened, 'lines",2026-07-22T08:15:00Z,"oops'),
        (5, f"{opened} swallowed this line", "T3"),
    ]


def test_lines_after_a_swallowed_stretch_keep_their_numbers_with_cr_line_ends(
    tmp_path: Path,
) -> None:
    rows = [csv_line(trip(i)).rstrip("\n") for i in range(1, 7)]
    rows[1] = rows[1].replace("D2", '"D2')  # line 3
    rows[2] = rows[2].replace(",2026-07-22T08", ',"2026-07-22T08')  # line 4 closes it badly
    content = "\r".join([HEADER, *rows]) + "\r"

    result = run(tmp_path, content)

    assert lines_of(result) == [2, 5, 6, 7]
    assert result.rejects == [swallowed(3, 3, rows[1]), swallowed(3, 4, rows[2])]


def test_a_record_longer_than_the_limit_fails_the_file_naming_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quote that never closes runs on past the limit: the line itself is short."""
    monkeypatch.setattr(normalize_csv, "MIN_BLOCK_BYTES", 512)
    rows = [csv_line(trip(i)) for i in range(1, 41)]
    rows[11] = rows[11].replace("D", '"D')  # line 13, and nothing closes it

    with pytest.raises(FileRejected) as caught:
        run(tmp_path, HEADER + "\n" + "".join(rows), batch_rows=3, max_line_bytes=512)

    assert str(caught.value) == (
        "trips.csv: unreadable CSV: the record on line 13 runs on past the limit for a CSV "
        f"line of 512 bytes (FLEET_CSV_MAX_LINE_BYTES raises it), though line 13 itself is "
        f"{len(rows[11]) - 1} bytes long: a quoted value that spans lines and never closes?"
    )


def test_a_line_of_exactly_the_limit_is_within_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit is the longest line sure to be read: a line of exactly that length is not
    over it, so a record that fails from it is one whose quote runs on."""
    monkeypatch.setattr(normalize_csv, "MIN_BLOCK_BYTES", 512)
    rows = [csv_line(trip(i)) for i in range(1, 41)]
    opened = rows[11].replace("D", '"D').rstrip("\n")  # line 13, and nothing closes it
    rows[11] = opened.replace("completed", "completed" + "x" * (512 - len(opened))) + "\n"
    assert len(rows[11]) - 1 == 512

    with pytest.raises(FileRejected) as caught:
        run(tmp_path, HEADER + "\n" + "".join(rows), batch_rows=3, max_line_bytes=512)

    assert "the record on line 13 runs on past the limit for a CSV line of 512 bytes" in str(
        caught.value
    )
    assert "though line 13 itself is 512 bytes long" in str(caught.value)


def test_a_line_too_long_to_measure_is_said_to_be_over_what_was_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the limit a line is read on only so far (_MEASURE_BYTES, 1 GiB) to say how long
    it is, in reads of _READ_BYTES (never the rest of a huge line at once): a longer one is
    said to be over what was read, never a length it is not."""
    monkeypatch.setattr(normalize_csv, "MIN_BLOCK_BYTES", 512)
    monkeypatch.setattr(normalize_csv, "_READ_BYTES", 1000)
    monkeypatch.setattr(normalize_csv, "_MEASURE_BYTES", 50_000)
    rows = [csv_line(trip(i)) for i in range(1, 41)]
    rows[11] = rows[11].replace("completed", "completed" + "x" * 200_000)  # line 13

    with pytest.raises(FileRejected) as caught:
        run(tmp_path, HEADER + "\n" + "".join(rows), batch_rows=3, max_line_bytes=512)

    said = re.search(r"line 13 is over ([\d,]+) bytes long, over the limit", str(caught.value))
    assert said is not None, str(caught.value)
    assert 50_000 < int(said.group(1).replace(",", "")) <= 51_000


def test_a_too_long_last_line_without_a_line_end_is_measured_to_the_end_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end of the file ends the last line: its length is exact, not a floor."""
    monkeypatch.setattr(normalize_csv, "MIN_BLOCK_BYTES", 512)
    monkeypatch.setattr(normalize_csv, "_READ_BYTES", 1000)
    rows = [csv_line(trip(i)) for i in range(1, 41)]
    last = rows[-1].replace("completed", "completed" + "x" * 20_000).rstrip("\n")  # line 41

    with pytest.raises(FileRejected) as caught:
        run(tmp_path, HEADER + "\n" + "".join(rows[:-1]) + last, batch_rows=3, max_line_bytes=512)

    assert f"line 41 is {len(last):,} bytes long, over the limit" in str(caught.value)


@pytest.mark.parametrize("fmt", ["csv", "csv.gz"])
def test_a_line_longer_than_the_limit_is_named_with_its_length_not_a_quote(
    tmp_path: Path, fmt: str
) -> None:
    """Issue 46.8: a 5 MB line failed the batch asking whether a quote was never closed."""
    rows = [csv_line(trip(i)) for i in range(1, 200)]
    rows[99] = rows[99].replace("completed", "completed" + "x" * (5 << 20))  # line 101
    content = (HEADER + "\n" + "".join(rows)).encode()
    if fmt == "csv.gz":
        content = gzip.compress(content)
    length = len(rows[99]) - 1

    with pytest.raises(FileRejected) as caught:
        run(tmp_path, content, name=f"trips.{fmt}", fmt=fmt)

    assert str(caught.value) == (
        f"trips.{fmt}: unreadable CSV: line 101 is {length:,} bytes long, over the limit for "
        "a CSV line of 1,048,576 bytes (FLEET_CSV_MAX_LINE_BYTES raises it)"
    )
    assert "quote" not in str(caught.value)
    raised = run(tmp_path, content, name=f"trips.{fmt}", fmt=fmt, max_line_bytes=6 << 20)
    assert (raised.row_count, raised.reject_count) == (198, 1)
    assert (raised.rejects[0].line, raised.rejects[0].column) == (101, "status")


# --- the identity, over generated files --------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One record as Arrow reads it (`newlines_in_values`): lines `start`..`end`, where
    `end` counts every line end inside its quoted values, a last one ending the file
    included."""

    start: int
    end: int
    fields: int
    balanced: bool  # every quoted value holding a line end is closed as RFC 4180 closes one
    size: int  # characters
    empty: bool  # every field empty (quoted empty ones too): a blank record


def parse(text: str) -> list[Record]:
    """A character-by-character model of Arrow's CSV parser, for the record boundaries.

    A quote opens a quoted value at the start of a field only; inside, `""` is a quote and
    a lone quote closes it. A closing quote followed by something other than a delimiter or
    a line end is a stray one: the field goes on unquoted. A line ends at "\\r\\n", "\\r"
    or "\\n", inside quoted values too (physical lines). A quote still open at the end of
    the file is never closed as RFC 4180 closes one.
    """
    records: list[Record] = []
    position, line, end = 0, 1, len(text)
    while position < end:
        first, start_line, fields, balanced, empty = position, line, 1, True, True
        state, breaks_in_quote = "field", 0
        while position < end:
            char = text[position]
            position += 1
            if state == "quoted":
                if char == '"':
                    state = "closed"
                    continue
                empty = False
                if char == "\r" and text.startswith("\n", position):
                    position += 1
                if char in "\r\n":
                    line, breaks_in_quote = line + 1, breaks_in_quote + 1
                continue
            if state == "closed":
                if char == '"':
                    state, empty = "quoted", False
                    continue
                if char not in ",\r\n":
                    balanced = balanced and not breaks_in_quote
                    state, empty = "unquoted", False
                    continue
            if char == ",":
                fields, state = fields + 1, "field"
            elif char == "\n":
                break
            elif char == "\r":
                position += text.startswith("\n", position)
                break
            elif state == "field" and char == '"':
                state, breaks_in_quote = "quoted", 0
            else:
                state, empty = "unquoted", False
        else:
            # A quote still open at the end of the file never closed: whether or not its
            # value holds a line end (the reader ends the last line for Arrow, in it).
            if state == "quoted":
                balanced = False
        records.append(Record(start_line, line, fields, balanced, position - first, empty))
        line += 1
    return records


def check_every_line_is_accounted_for(text: str, result: NormalizedFile) -> None:
    """The identity this module is about. Lines are physical lines (the header is line 1);
    records are as `parse` finds them. Every line from 2 to the last is covered exactly once:
    by a loaded row (`_source_line` and the `_source_line_count` lines after it) or by a
    reject (`line` to `last_line`). A blank line (nothing but its line end) or a blank
    record on one line (every field empty: `,,,`) may be covered by nothing: it holds no
    data. Besides:
      - a loaded row is one whole record, and one spanning lines has balanced quotes;
      - a reject naming lines `line`..`last_line` is one whole record;
      - a reject naming an unbalanced quote lies in a record whose quotes are not balanced.
    """
    physical = _LINE_END.split(text)
    if text.endswith(("\n", "\r")):
        physical.pop()
    last = len(physical)
    records = {record.start: record for record in parse(text)[1:]}
    blank = {number for number, line in enumerate(physical, start=1) if not line}
    blank |= {r.start for r in records.values() if r.empty and r.start == r.end}

    def whole(record: Record) -> range:
        return range(record.start, min(record.end, last) + 1)

    covered: Counter[int] = Counter()
    rows = output(result).to_pylist()
    for row in rows:
        first, count = row[SOURCE_LINE_COLUMN], row[SOURCE_LINE_COUNT_COLUMN]
        covered.update(range(first, first + count))
        record = records[first]
        assert range(first, first + count) == whole(record), (row, record)
        texts = [value for value in row.values() if isinstance(value, str)]
        assert sum(len(_LINE_END.findall(value)) for value in texts) == count - 1, row
        assert count == 1 or (record.balanced and record.fields == WIDTH), (row, record)
    for reject in result.rejects:
        assert reject.line is not None
        span = range(reject.line, (reject.last_line or reject.line) + 1)
        covered.update(span)
        if reject.last_line is not None:
            assert span == whole(records[reject.line]), reject
        if found := _UNBALANCED.match(reject.reason):
            record = next(r for r in records.values() if reject.line in whole(r))
            opened = int(found.group(1))
            assert opened in whole(record), (reject, record)
            assert ("swallowed" in reject.reason) == (reject.line > opened), reject
            assert not record.balanced, (reject, record)
    for number in range(2, last + 1):
        assert covered[number] == 1 or (number in blank and not covered[number]), (
            number,
            covered[number],
            physical[number - 1],
        )
    assert set(covered) <= set(range(2, last + 1)), covered


def _field(value: str, quoted: bool) -> str:
    return '"' + value.replace('"', '""') + '"' if quoted else value


LINE_ENDS = ["\n", "\r\n", "\r"]


@st.composite
def csv_files(draw: st.DrawFn, *, blank_lines: bool = True) -> str:
    """Trips files mixing good rows, quoted fields, values spanning lines on purpose (any
    line end inside), bad values, rows with a field missing, blank lines, lines of bare
    delimiters or spaces, and stray quotes anywhere in a row; line ends of one kind or mixed,
    a byte order mark or none, a last line end or none. Without `blank_lines`, no physical
    line is empty or a blank record (then every line is loaded or rejected)."""
    ends = draw(st.sampled_from([["\n"], ["\r\n"], ["\r"], LINE_ENDS]))
    # Quoted fields close stray quotes early: some files quote nothing, so that one runs on.
    quoting = draw(st.sampled_from(["none", "some", "all"]))
    lines = [HEADER]
    kinds = ["ok", "ok", "multiline", "stray", "stray", "short", "bad"]
    kinds += ["blank", "empty"] if blank_lines else []
    for index in range(draw(st.integers(0, 30))):
        kind = draw(st.sampled_from(kinds))
        if kind == "blank":
            lines.append(draw(st.sampled_from(["", "", "   "])))
            continue
        values = [f"T{index}", "V1", "D1", "2026-07-22T08:15:00Z", "", "1.5", "1", "2", "done"]
        values[8] = "bogus" if kind == "bad" else "completed"
        if kind == "empty":
            values = [""] * WIDTH
        if kind == "multiline":
            inner = draw(st.sampled_from(LINE_ENDS))
            twice = inner * (2 if blank_lines else 1)
            values[2] = draw(st.sampled_from([f"D{inner}1", f'a,"b"{twice}c', inner]))
        if kind == "short":
            values = values[:3]
        quoted = [quoting == "all"] * len(values)
        if quoting == "some":
            quoted = draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values)))
        if kind == "multiline":
            quoted[2] = True
        line = ",".join(_field(value, quote) for value, quote in zip(values, quoted, strict=True))
        if kind == "stray":
            for _ in range(draw(st.integers(1, 2))):
                at = draw(st.integers(0, len(line)))
                line = line[:at] + '"' + line[at:]
        lines.append(line)
    text = "".join(line + draw(st.sampled_from(ends)) for line in lines[:-1]) + lines[-1]
    text += draw(st.sampled_from([*ends, ""]))
    return ("\ufeff" if draw(st.booleans()) else "") + text


@settings(max_examples=200, deadline=None)
@example(  # found by it: a quote open at the end of a file with no last line end
    text=HEADER + '\n"T0","V1","D1","2026-07-22T08:15:00Z","","1.5","1","2","completed""',
    fmt="csv",
    small_blocks=False,
)
@given(
    text=csv_files(),
    fmt=st.sampled_from(["csv", "csv.gz"]),
    small_blocks=st.booleans(),
)
def test_every_physical_line_is_accounted_for(text: str, fmt: str, small_blocks: bool) -> None:
    """With small parse blocks, a record longer than a block may fail the file instead:
    then the error names the line that record starts on."""
    data = text.encode()
    if fmt == "csv.gz":
        data = gzip.compress(data)
    block = 128 if small_blocks else normalize_csv.MIN_BLOCK_BYTES
    options = {"batch_rows": 3, "max_line_bytes": block} if small_blocks else {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch.object(normalize_csv, "MIN_BLOCK_BYTES", block),
    ):
        try:
            result = run(Path(tmp), data, name=f"trips.{fmt}", fmt=fmt, **options)
        except FileRejected as exc:
            found = _TOO_LONG.search(str(exc))
            assert found is not None, exc
            line = int(found.group(1) or found.group(2))
            record = next(r for r in parse(text) if r.start == line)
            limit = int(found.group(3).replace(",", ""))
            assert record.size >= block - 1 and limit == block, (record, exc)
            return
        check_every_line_is_accounted_for(text, result)
