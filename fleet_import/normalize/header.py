"""Where a source file's values are: the position of each contract column (from the
header), and the physical line each row starts on. Shared by every reader."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from fleet_import.contracts.model import DatasetContract
from fleet_import.normalize.rows import FileRejected

_NUL = "\x00"


def match_header(names: Sequence[str], contract: DatasetContract, source_key: str) -> list[int]:
    """The file position of each contract column, in contract order.

    Order may differ from the contract; a missing, extra or repeated column rejects the
    whole file, because guessing what an unknown column means is worse than asking.
    """
    cleaned = [name.strip() for name in names]
    position: dict[str, int] = {}
    repeated: list[str] = []
    for index, name in enumerate(cleaned):
        if name in position:
            repeated.append(name)
        else:
            position[name] = index
    expected = contract.column_names
    missing = [name for name in expected if name not in position]
    unexpected = [name for name in position if name not in set(expected)]
    if not (missing or unexpected or repeated):
        return [position[name] for name in expected]
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
