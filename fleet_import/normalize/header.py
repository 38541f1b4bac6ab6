"""Where a source file's values are: the position of each contract column (from the
header), and the physical line each row starts on. Shared by every reader."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from fleet_import.contracts.drift import adds_columns, allows_new_columns
from fleet_import.contracts.model import Column, ContractError, DatasetContract
from fleet_import.normalize.rows import FileRejected

_NUL = "\x00"


@dataclass(frozen=True)
class HeaderMatch:
    """Where each contract column is in a file, and which columns were found by an alias."""

    positions: list[int | None]
    """The file position of each contract column, in contract order; None for an optional
    column the file lacks (its rows hold NULL there)."""
    aliases: dict[str, str]
    """Column name -> the header it was found under, for columns matched by an alias."""
    extra: dict[str, int] = field(default_factory=dict)
    """Columns the contract does not name -> their position, where its drift policy lets a
    file hold them (contracts.drift); empty under `reject`, which refuses the file."""


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

    Order may differ from the contract; a missing column (unless `optional`), a repeated
    one (also: a name and its alias both present) or, under the `reject` drift policy, an
    extra one rejects the whole file, because guessing what an unknown column means is
    worse than asking. The other policies say what an extra column means (contracts.drift).
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
    lacking = {column.name for column in contract.columns if column.optional}
    missing = [name for name in expected if name not in position and name not in lacking]
    extra: dict[str, int] = {}
    if allows_new_columns(contract) and "" not in unexpected:
        extra = {name: cleaned.index(name) for name in unexpected}
        unexpected = []
    if not (missing or unexpected or repeated):
        aliases = {column: name for column, name in found_as.items() if name != column}
        return HeaderMatch([position.get(name) for name in expected], aliases, extra)
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


def extra_column_types(
    contract: DatasetContract, types: Mapping[str, str | None], source_key: str
) -> dict[str, str]:
    """The contract type of each column a file holds beyond its contract (`types`: from the
    Parquet schema, or None for a type with no contract type). Under `evolve` and `review`
    such a column becomes a table column: a name that is no identifier, or a type that has
    no contract type, rejects the file, naming it."""
    if not adds_columns(contract):
        return {name: found or contract.new_column_type for name, found in types.items()}
    problems = []
    for name, found in types.items():
        try:
            Column(name, found or contract.new_column_type)
        except ContractError as exc:
            problems.append(f"{name!r}: {exc}")
        if found is None:
            problems.append(f"{name!r}: its type has no contract type (name it in the contract)")
    if problems:
        raise FileRejected(
            f"{source_key}: new columns cannot be added to dataset {contract.name!r} "
            f"(on_new_columns {contract.on_new_columns}): " + "; ".join(problems)
        )
    return {name: found for name, found in types.items() if found is not None}


_counting = pa.array([], pa.int64())


def row_numbers(start: int, count: int) -> pa.Array:
    """start, start+1, ... as int64; one shared 0..n array avoids a Python range per batch."""
    global _counting
    counting = _counting  # read once: another thread may swap in a longer one meanwhile
    if len(counting) < count:
        counting = pa.array(range(max(count, 2 * len(counting))), pa.int64())
        _counting = counting
    return pc.add(counting.slice(0, count), pa.scalar(start, pa.int64()))
