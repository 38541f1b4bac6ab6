"""What normalizing one source file produced: the typed Parquet to load and its rejects.
Its own module so that the duplicate check and the normalizer both use it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fleet_import.normalize.rows import Reject


@dataclass
class NormalizedFile:
    """One source file, typed: what to load (`parquet_path`) and what was left out."""

    source_key: str
    dataset: str
    parquet_path: Path
    row_count: int
    reject_count: int
    rejects: list[Reject]
    aliases: dict[str, str] = field(default_factory=dict)
    """Column -> the header (or JSON key) it was found under, where that was an alias of
    the column rather than its name: what a renamed export was matched by."""
    extra_columns: dict[str, str] = field(default_factory=dict)
    """Columns the file holds that its contract does not name -> their contract type (the
    Parquet column's, else the contract's `new_column_type`): left out of `parquet_path`,
    reported, and added to the table by the `evolve` and `review` policies."""
