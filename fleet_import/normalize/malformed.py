"""Rejects for CSV records that Arrow could not split into the header's number of columns.

Most such records are one line with a field too many or too few: one reject, on that line.
A quote left open is different. With `newlines_in_values`, Arrow reads on through the
following lines, up to a later quote or the end of the file, and hands over the whole
stretch as one malformed record. Those lines were never one record, so every non-blank
physical line of the stretch becomes a reject of its own, on its own line, naming the line
where the quote opened; the reject ratio then decides the batch as for any other reject.

Quoting as Arrow applies it: a quote opens a quoted value only at the start of a field;
inside, `""` is a quote; the next lone quote closes it. The quote is balanced when that
closing quote is followed by a delimiter, a line end or the end of the record. It is
unbalanced when it never closes (it ran to the end of the file) or when its closing quote
is followed by anything else (Arrow then goes on reading the field unquoted, up to the next
delimiter): that closing quote was itself a stray one. Only an unbalanced quote whose value
spans a line break swallows lines. A multi-line record whose quotes are balanced is taken
as meant, one record, and rejected once on its first line like any malformed record.

What cannot be told apart: a stray quote closed by a later one so that the stretch happens
to split into exactly the header's columns. Arrow returns it as a well-formed record whose
value holds line breaks, and nothing of its quotes is left to tell it from a legitimate
multi-line value; it is one record, loaded or (far more likely, as a swallowed line makes a
long value that is rarely of the column's type) rejected once on its first line, the lines
after that being its continuation lines, as for any multi-line record.
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
        """Line breaks inside the record, so that the lines after it keep their numbers.

        Inside quoted values a line break is "\\n" (as for well-formed records); lines an
        unbalanced quote swallowed end as Arrow would have read them without it."""
        if self.quote_line is None:
            return self.text.count("\n")
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
    """The rejects for a malformed record starting on `line`: one for the record, or one
    per non-blank line an unbalanced quote swallowed (blank lines are not data anywhere)."""
    if record.quote_line is None:
        reason = f"expected {record.expected} columns, found {record.actual}"
        return [Reject(source_key, line, None, reason, record.text)]
    opened = line + record.quote_line
    rejects = []
    for number, text in enumerate(_LINE_END.split(record.text), start=line):
        if not text:
            continue
        reason = f"unbalanced quote opened on line {opened}"
        if number > opened:
            reason += " swallowed this line"
        elif number < opened:  # a value spanning lines, as meant, before it: rare
            reason += " breaks the record this line is part of"
        rejects.append(Reject(source_key, number, None, reason, text))
    return rejects
