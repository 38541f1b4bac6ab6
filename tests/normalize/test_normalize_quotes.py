"""Every physical line of a CSV file is accounted for, whatever its quotes do (issue 11.5).

A quote left open used to swallow the lines after it into one reject (or, up to the end of
the file, into nothing at all). Local files only: no database, no S3.
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
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_import.contracts.fleet import TRIPS
from fleet_import.normalize import csv as normalize_csv
from fleet_import.normalize.malformed import unbalanced_quote_line
from fleet_import.normalize.output import NormalizedFile
from fleet_import.normalize.rows import SOURCE_LINE_COLUMN, FileRejected, Reject
from tests.normalize_helpers import HEADER, csv_line, output, run, trip, trips_csv

WIDTH = len(TRIPS.columns)
_UNBALANCED = re.compile(r"unbalanced quote opened on line (\d+)")
_TOO_LONG = re.compile(r"the record on line (\d+) does not end within (\d+) bytes")


def lines_of(result: NormalizedFile) -> list[int]:
    return output(result).column(SOURCE_LINE_COLUMN).to_pylist()


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
    """Nothing tells this record from a value that spans lines on purpose: it is one record,
    here rejected on its first line, lines 6 and 7 being its continuation lines."""
    rows = [csv_line(trip(i)) for i in range(1, 8)]
    rows[3] = rows[3].replace("D1", '"D1')  # line 5 opens a quote in driver_id...
    rows[5] = rows[5].replace("D0,", 'D0",')  # ...and line 7 closes it there

    result = run(tmp_path, HEADER + "\n" + "".join(rows))

    assert lines_of(result) == [2, 3, 4, 8]
    reject = result.rejects[0]
    assert (result.reject_count, reject.line, reject.column) == (1, 5, "driver_id")
    assert reject.reason == "longer than 64 characters"


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


def test_a_record_longer_than_a_block_fails_the_file_naming_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(normalize_csv, "MIN_BLOCK_BYTES", 512)
    rows = [csv_line(trip(i)) for i in range(1, 41)]
    rows[11] = rows[11].replace("D", '"D')  # line 13, and nothing closes it

    with pytest.raises(FileRejected) as caught:
        run(tmp_path, HEADER + "\n" + "".join(rows), batch_rows=3)

    message = str(caught.value)
    assert "trips.csv: unreadable CSV: the record on line 13 does not end within 512" in message
    assert "quote opened on line 13" in message


# --- the identity, over generated files --------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One record as Arrow reads it (`newlines_in_values`): lines `start`..`end`, where
    `end` counts every "\\n" inside its quoted values, a last one ending the file included."""

    start: int
    end: int
    fields: int
    balanced: bool  # no quote that spans a line break is left open or closed by a stray one
    size: int  # bytes


def parse(text: str) -> list[Record]:
    """A character-by-character model of Arrow's CSV parser, for the record boundaries.

    A quote opens a quoted value at the start of a field only; inside, `""` is a quote and
    a lone quote closes it. A closing quote followed by something other than a delimiter or
    a line end is a stray one: the field goes on unquoted. The files generated below end
    lines with "\\n" or "\\r\\n" only, so physical lines are what "\\n" separates.
    """
    records: list[Record] = []
    position, line, end = 0, 1, len(text)
    while position < end:
        first, start_line, fields, balanced = position, line, 1, True
        state, breaks_in_quote = "field", 0
        while position < end:
            char = text[position]
            position += 1
            if state == "quoted":
                if char == '"':
                    state = "closed"
                elif char == "\n":
                    line, breaks_in_quote = line + 1, breaks_in_quote + 1
                continue
            if state == "closed":
                if char == '"':
                    state = "quoted"
                    continue
                if char not in ",\r\n":
                    balanced = balanced and not breaks_in_quote
                    state = "unquoted"
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
                state = "unquoted"
        else:
            # The line end that ends the file, inside a quote left open, swallowed no line.
            if state == "quoted" and breaks_in_quote - text.endswith("\n") > 0:
                balanced = False
        records.append(Record(start_line, line, fields, balanced, position - first))
        line += 1
    return records


def check_every_line_is_accounted_for(text: str, result: NormalizedFile) -> None:
    """The identity this module is about. Lines are physical lines (the header is line 1),
    a blank one holding nothing but its line end; records are as `parse` finds them.

    Every non-blank line from 2 to the last is accounted for exactly once, as
      (a) the line of a loaded row (the line its record starts on), or
      (b) the line of a reject, or
      (c) a continuation line (any but the first) of a record that is loaded, or that is
          rejected once on its first line and on none of its other lines while its quotes
          are balanced or it has the header's number of fields (such a record is taken as
          meant: see fleet_import.normalize.malformed).
    A record whose quote left open swallowed lines, and that Arrow therefore cannot split
    into the header's fields, gets nothing from (c): each of its lines needs its own reject.
    A blank line is accounted for at most once, and never by (a) or (b).
    """
    physical = text.split("\n")
    if text.endswith("\n"):
        physical.pop()
    last = len(physical)
    blank = {number for number, line in enumerate(physical, start=1) if line in ("", "\r")}
    records = {record.start: record for record in parse(text)[1:]}
    rows = output(result).to_pylist()
    loaded = {row[SOURCE_LINE_COLUMN]: row for row in rows}
    rejected = Counter(reject.line for reject in result.rejects)
    assert len(loaded) == len(rows)
    assert not blank & (set(loaded) | set(rejected))

    accounted = Counter(list(loaded)) + rejected
    for record in records.values():
        # The line end that ends the file ends its last line, even inside an open quote.
        continuation = range(record.start + 1, min(record.end, last) + 1)
        whole = record.start in loaded or (
            rejected[record.start] == 1
            and not any(rejected[number] for number in continuation)
            and (record.balanced or record.fields == WIDTH)
        )
        if whole:
            accounted.update(continuation)
    for number in range(2, last + 1):
        assert accounted[number] in ((0, 1) if number in blank else (1,)), (number, accounted)
    assert set(accounted) <= set(range(2, last + 1))

    for number, row in loaded.items():  # a loaded row holds the lines its record spans
        record = records[number]
        breaks = sum(value.count("\n") for value in row.values() if isinstance(value, str))
        assert breaks == record.end - record.start, (number, record)
    for reject in result.rejects:  # the quote named opened inside the broken record
        if found := _UNBALANCED.match(reject.reason):
            record = next(r for r in records.values() if r.start <= reject.line <= r.end)
            opened = int(found.group(1))
            assert record.start <= opened <= record.end, (reject, record)
            assert ("swallowed" in reject.reason) == (reject.line > opened), reject
            assert not record.balanced and record.fields != WIDTH, (reject, record)


def _field(value: str, quoted: bool) -> str:
    return '"' + value.replace('"', '""') + '"' if quoted else value


@st.composite
def csv_files(draw: st.DrawFn) -> str:
    """Trips files mixing good rows, quoted fields, values spanning lines on purpose, bad
    values, rows with a field missing, blank lines, and stray quotes anywhere in a row."""
    line_end = draw(st.sampled_from(["\n", "\r\n"]))
    # Quoted fields close stray quotes early: some files quote nothing, so that one runs on.
    quoting = draw(st.sampled_from(["none", "some", "all"]))
    lines = [HEADER]
    for index in range(draw(st.integers(0, 30))):
        kind = draw(
            st.sampled_from(["ok", "ok", "multiline", "stray", "stray", "blank", "short", "bad"])
        )
        if kind == "blank":
            lines.append("")
            continue
        values = [f"T{index}", "V1", "D1", "2026-07-22T08:15:00Z", "", "1.5", "1", "2", "done"]
        values[8] = "bogus" if kind == "bad" else "completed"
        if kind == "multiline":
            inner = draw(st.sampled_from(["\n", "\r\n"]))
            values[2] = draw(st.sampled_from([f"D{inner}1", f'a,"b"{inner}{inner}c', inner]))
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
                at -= line[at - 1 : at + 1] == "\r\n"  # a lone "\r" would end a line
                line = line[:at] + '"' + line[at:]
        lines.append(line)
    return line_end.join(lines) + draw(st.sampled_from([line_end, ""]))


@settings(max_examples=150, deadline=None)
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
    options = {"batch_rows": 3} if small_blocks else {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch.object(normalize_csv, "MIN_BLOCK_BYTES", block),
    ):
        try:
            result = run(Path(tmp), data, name=f"trips.{fmt}", fmt=fmt, **options)
        except FileRejected as exc:
            found = _TOO_LONG.search(str(exc))
            assert found is not None, exc
            record = next(r for r in parse(text) if r.start == int(found.group(1)))
            assert record.size >= block - 1 and int(found.group(2)) == block, (record, exc)
            return
        check_every_line_is_accounted_for(text, result)
