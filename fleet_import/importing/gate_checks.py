"""A contract's dataset checks evaluated on the normalized rows, column-wise with
pyarrow.compute: each gives the rows that fail it (a mask), counted against `warn_if` /
`error_if` (fleet_import.contracts.checks)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from fleet_import.contracts.checks import Check, is_column, parse_expression
from fleet_import.contracts.model import DatasetContract

_COMPARE = {
    ">": pc.greater,
    ">=": pc.greater_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    "=": pc.equal,
    "==": pc.equal,
    "!=": pc.not_equal,
}


@dataclass(frozen=True)
class Evaluated:
    """A check's outcome on one dataset: pass / warn / error / skipped, the failing rows
    (a mask over the dataset's table; None for `row_count` and a skipped check)."""

    check: Check
    outcome: str
    figure: int
    rows: int
    failing: pa.ChunkedArray | pa.Array | None
    detail: str = ""

    @property
    def figure_text(self) -> str:
        if self.check.type == "row_count":
            return f"{self.figure:,} rows"
        if self.outcome == "skipped":
            return ""
        share = 100.0 * self.figure / self.rows if self.rows else 0.0
        return f"{self.figure:,} rows ({share:.3g}%)"

    @property
    def threshold_text(self) -> str:
        warn, error = self.check.thresholds()
        parts = ([f"warn_if {warn}"] if warn else []) + ([f"error_if {error}"] if error else [])
        return ", ".join(parts)


def evaluate(
    contract: DatasetContract, table: pa.Table, tables: Mapping[str, pa.Table]
) -> list[Evaluated]:
    """Every check of `contract` on the whole of `table`; `tables`: the delivery's other
    datasets, which a `relationships` check reads. (The gate streams files through
    `failing_rows` and `judged` instead: this is the same, for a table in hand.)"""
    found = []
    for check in contract.checks:
        if check.type == "row_count":
            found.append(judged(check, table.num_rows, table.num_rows))
            continue
        known = None
        if check.type == "relationships":
            known = parent_values(check, tables)
            if known is None:
                found.append(skipped(check, table.num_rows))
                continue
        failing = failing_rows(check, table, known)
        figure = (pc.sum(failing).as_py() or 0) if table.num_rows else 0
        found.append(judged(check, figure, table.num_rows, failing))
    return found


def parent_values(check: Check, tables: Mapping[str, pa.Table]) -> pa.Array | None:
    """The values a `relationships` check's column must be among; None: no such dataset."""
    assert check.to is not None
    parent, _, key = check.to.partition(".")
    if parent not in tables or key not in tables[parent].column_names:
        return None
    return pc.unique(tables[parent][key].combine_chunks())


def skipped(check: Check, rows: int) -> Evaluated:
    parent = (check.to or "").partition(".")[0]
    detail = f"{parent} is not in this delivery: nothing to compare with"
    return Evaluated(check, "skipped", 0, rows, None, detail)


def failing_rows(check: Check, table: pa.Table, known: pa.Array | None = None) -> pa.ChunkedArray:
    """The mask of `table`'s rows that fail `check` (any type but `row_count`); `known`: a
    relationship's values (`parent_values`). Row by row but for `unique`, which needs every
    row of its columns in one table."""
    if check.type == "relationships":
        column = table[check.columns[0]]
        return pc.and_(pc.is_valid(column), pc.invert(pc.is_in(column, value_set=known)))
    if check.type == "not_null":
        return _any([pc.is_null(table[name]) for name in check.columns])
    if check.type == "accepted_values":
        column = table[check.columns[0]]
        allowed = pa.array(check.values).cast(column.type)
        return pc.and_(pc.is_valid(column), pc.invert(pc.is_in(column, value_set=allowed)))
    if check.type == "unique":
        return _repeated(table, list(check.columns))
    # expression: the rows for which the rule is false (NULL is not false: dbt's)
    assert check.expression is not None
    holds = _all([_clause(table, *clause) for clause in parse_expression(check.expression)])
    return pc.fill_null(pc.invert(holds), False)


def judged(
    check: Check, figure: int, rows: int, failing: pa.ChunkedArray | None = None
) -> Evaluated:
    """The outcome of `figure` failing rows (`row_count`: `rows`) against the thresholds."""
    warn, error = check.thresholds()
    of = 0 if check.type == "row_count" else rows  # row_count: the rows, never a share
    outcome = "pass"
    if error is not None and error.breached(figure, of):
        outcome = "error"
    elif warn is not None and warn.breached(figure, of):
        outcome = "warn"
    return Evaluated(check, outcome, figure, rows, failing)


def _any(masks: list) -> pa.ChunkedArray:
    result = masks[0]
    for mask in masks[1:]:
        result = pc.or_(result, mask)
    return result


def _all(masks: list) -> pa.ChunkedArray:
    result = masks[0]
    for mask in masks[1:]:
        result = pc.and_kleene(result, mask)
    return result


def _repeated(table: pa.Table, columns: list[str]) -> pa.ChunkedArray:
    """Rows whose (non-null) values of `columns` another row repeats."""
    keyed = table.select(columns).append_column(
        "_row", pa.array(range(table.num_rows), pa.int64())
    )
    valid = _all([pc.is_valid(keyed[name]) for name in columns])
    keyed = keyed.filter(valid)
    counts = keyed.group_by(columns).aggregate([("_row", "count")])
    twice = counts.filter(pc.greater(counts["_row_count"], 1)).select(columns)
    repeated_rows = keyed.join(twice, keys=columns, join_type="left semi")["_row"]
    rows = pa.array(range(table.num_rows), pa.int64())
    return pc.is_in(rows, value_set=repeated_rows.combine_chunks())


def _clause(table: pa.Table, left: str, op: str, right: str) -> pa.ChunkedArray:
    return _COMPARE[op](_operand(table, left), _operand(table, right))


def _operand(table: pa.Table, operand: str) -> pa.ChunkedArray | pa.Scalar:
    if is_column(operand):
        values = table[operand]
        # Decimals compare as doubles: a range rule needs no exact arithmetic.
        return values.cast(pa.float64()) if pa.types.is_decimal(values.type) else values
    if operand.startswith("'"):
        return pa.scalar(operand[1:-1])
    return pa.scalar(float(operand))
