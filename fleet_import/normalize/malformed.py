"""Rejects for CSV records whose quotes broke, and the rule for a value that spans lines.

Most records Arrow cannot split into the header's number of columns are one line with a
field too many or too few: one reject, on that line. A quote left open is different. With
`newlines_in_values`, Arrow reads on through the following lines, up to a later quote or
the end of the file, and hands over the whole stretch as one record. Those lines were never
one record, so every non-blank physical line of the stretch becomes a reject of its own, on
its own line, naming the line where the quote opened; the reject ratio then decides the
batch as for any other reject.

Quoting as Arrow applies it: a quote opens a quoted value only at the start of a field;
inside, `""` is a quote; the next lone quote closes it. The quote is balanced when that
closing quote is followed by a delimiter, a line end or the end of the record. It is
unbalanced when it never closes (it ran to the end of the file) or when its closing quote
is followed by anything else (Arrow then goes on reading the field unquoted, up to the next
delimiter): that closing quote was itself a stray one.

**The rule for a value that spans lines** (RFC 4180's quoting): a record is one record over
several physical lines only when every quoted value in it that holds a line end is balanced:
opened at the start of a field, quotes inside it doubled, closed right before a delimiter, a
line end or the end of the file. Such a record is taken as meant, whatever its number of
columns: loaded, its row covering every line it spans (`_source_line_count`), or rejected
once, its reject naming its first and last line (`Reject.last_line`). Any other record that
spans lines was made by a stray quote: each of its non-blank lines is rejected on its own.
That holds whether or not Arrow could split the stretch: a stray quote closed by a later one
so that the stretch happens to split into exactly the header's columns (`"D5` on one line,
`D8"x` three lines below) is a well-formed record to Arrow, so its text is read again
(normalize.physical_lines) and judged here like any other.

What remains indistinguishable: a stray quote opened at the start of a field and closed by
another stray quote right before a delimiter, lines below, is quoting as RFC 4180 writes a
value that spans lines on purpose. That record is one record (almost always rejected once,
naming all its lines, as a swallowed line makes a long value that is rarely of the column's
type), never lines lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fleet_import.normalize.rows import Reject

# Outside quoted values Arrow ends a line at "\r\n", "\n" or "\r".
_LINE_END = re.compile(r"\r\n|\r|\n")
# A quoted value from its opening quote: its text, then the closing quote ("" if none).
_QUOTED = re.compile(r'"([^"]*(?:""[^"]*)*)("?)')
# The rest of a field read without quoting: up to a delimiter or a line end.
_UNQUOTED = re.compile(r"[^,\r\n]*")


@dataclass(frozen=True)
class MalformedRecord:
    """A record Arrow reported to the invalid-row handler, and where its quotes broke."""

    number: int  # Arrow's 1-based row number; the header is row 1
    expected: int
    actual: int
    text: str  # as Arrow read it, without the line end that closes it
    # Line (0-based, within `text`) where an unbalanced quote that swallowed lines opened.
    quote_line: int | None = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "quote_line", unbalanced_quote_line(self.text))

    @property
    def line_breaks(self) -> int:
        """Line ends inside the record, so that the lines after it keep their numbers: a
        physical line ends at "\\r\\n", "\\n" or "\\r", inside quoted values too."""
        return len(_LINE_END.findall(self.text))


def unbalanced_quote_line(text: str) -> int | None:
    """The line of `text` (0-based) on which the first unbalanced quote whose value spans
    a line break opened; None when no quote swallowed a line (the usual case)."""
    if "\n" not in text and "\r" not in text:
        return None
    position, end = 0, len(text)
    while True:  # at the start of a field
        if text.startswith('"', position):
            opening = position
            quoted = _match(_QUOTED, text, opening)
            position = _match(_UNQUOTED, text, quoted.end()).end()
            balanced = bool(quoted.group(2)) and position == quoted.end()
            if not balanced and _LINE_END.search(quoted.group(1)):
                return len(_LINE_END.findall(text, 0, opening))
        else:
            position = _match(_UNQUOTED, text, position).end()
        if position >= end:
            return None
        position += 1  # the delimiter


def _match(pattern: re.Pattern[str], text: str, position: int) -> re.Match[str]:
    """`pattern.match` for the patterns above, which match any text (if only emptily)."""
    found = pattern.match(text, position)
    if found is None:
        raise AssertionError(f"{pattern.pattern!r} must match any text")
    return found


def malformed_rejects(source_key: str, line: int, record: MalformedRecord) -> list[Reject]:
    """The rejects for a malformed record starting on `line`: one for the record (naming
    its last line too when a balanced quoted value spans lines), or one per non-blank line
    an unbalanced quote swallowed (blank lines are not data anywhere)."""
    if record.quote_line is None:
        reason = f"expected {record.expected} columns, found {record.actual}"
        last = line + record.line_breaks
        return [Reject(source_key, line, None, reason, record.text, last if last > line else None)]
    return swallowed_rejects(source_key, line, record.text, record.quote_line)


def swallowed_rejects(source_key: str, line: int, text: str, quote_line: int) -> list[Reject]:
    """One reject per non-blank line of `text` (the record starting on `line`, whose
    unbalanced quote opened on its line `quote_line`, 0-based), each on its own line."""
    opened = line + quote_line
    rejects = []
    for number, part in enumerate(_LINE_END.split(text), start=line):
        if not part:
            continue
        reason = f"unbalanced quote opened on line {opened}"
        if number > opened:
            reason += " swallowed this line"
        elif number < opened:  # a value spanning lines, as meant, before it: rare
            reason += " breaks the record this line is part of"
        rejects.append(Reject(source_key, number, None, reason, part))
    return rejects
