"""Where a source file's values are: the position of each contract column (from the
header), and the physical line each row starts on. Shared by every reader."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from fleet_import.contracts.model import DatasetContract
from fleet_import.normalize.rows import FileRejected

_NUL = "\x00"


@dataclass(frozen=True)
class HeaderMatch:
    """Where each contract column is in a file, and which columns were found by an alias."""

    positions: list[int]
    """The file position of each contract column, in contract order."""
    aliases: dict[str, str]
    """Column name -> the header it was found under, for columns matched by an alias."""


@dataclass(frozen=True)
class HeaderNames:
    """What a header may say for each column: its name as written, or one of its aliases
    (earlier names of an export) in any case. Both trimmed."""

    by_name: dict[str, str]
    by_alias: dict[str, str]

    @classmethod
    def of(cls, contract: DatasetContract) -> HeaderNames:
        by_alias = {
            alias.strip().lower(): column.name
            for column in contract.columns
            for alias in column.aliases
        }
        return cls({name: name for name in contract.column_names}, by_alias)

    def column_of(self, header: str) -> str | None:
        """The column a trimmed header names, or None."""
        return self.by_name.get(header) or self.by_alias.get(header.lower())


def match_header(names: Sequence[str], contract: DatasetContract, source_key: str) -> HeaderMatch:
    """The file position of each contract column, in contract order, found by name or alias
    (HeaderNames).

    Order may differ from the contract; a missing, extra or repeated column (also: a name and
    its alias both present) rejects the whole file, because guessing what an unknown column
    means is worse than asking.
    """
    cleaned = [name.strip() for name in names]
    known = HeaderNames.of(contract)
    position: dict[str, int] = {}
    found_as: dict[str, str] = {}
    repeated: list[str] = []
    unexpected: list[str] = []
    for index, name in enumerate(cleaned):
        column = known.column_of(name)
        if column is None:
            if name not in unexpected:
                unexpected.append(name)
            else:
                repeated.append(name)
        elif column in position:
            repeated.append(name if name == found_as[column] else f"{found_as[column]}/{name}")
        else:
            position[column] = index
            found_as[column] = name
    expected = contract.column_names
    missing = [name for name in expected if name not in position]
    if not (missing or unexpected or repeated):
        aliases = {column: name for column, name in found_as.items() if name != column}
        return HeaderMatch([position[name] for name in expected], aliases)
    parts = []
    if missing:
        parts.append("missing columns: " + ", ".join(missing))
    if unexpected:
        parts.append("unexpected columns: " + ", ".join(name or '""' for name in unexpected))
    if repeated:
        parts.append("repeated columns: " + ", ".join(repeated))
    if any(_NUL in name for name in cleaned):
        # UTF-16 (what some spreadsheet exports write) reads as names with a NUL per letter.
        parts.append("the header holds NUL characters: is the file UTF-16? expected UTF-8")
    raise FileRejected(
        f"{source_key}: columns do not match dataset {contract.name!r}: " + "; ".join(parts)
    )


_counting = pa.array([], pa.int64())


def row_numbers(start: int, count: int) -> pa.Array:
    """start, start+1, ... as int64; one shared 0..n array avoids a Python range per batch."""
    global _counting
    counting = _counting  # read once: another thread may swap in a longer one meanwhile
    if len(counting) < count:
        counting = pa.array(range(max(count, 2 * len(counting))), pa.int64())
        _counting = counting
    return pc.add(counting.slice(0, count), pa.scalar(start, pa.int64()))
