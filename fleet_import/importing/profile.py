"""A dataset's profile, and the drift rules that compare it with the replaced slice's.

A profile is computed column-wise with pyarrow.compute on the normalised rows the slice is
about to hold: rows; per column the null %, the distinct count, min / max / mean / sum for
numbers (decimals exact, as text), and every value with its count for a string column of at
most `LOW_CARDINALITY` values. It is JSON, stored with the batch (store.gates) and read back
as the next delivery's baseline.

Distinct counts (`DISTINCT_METHOD`): exact for strings, booleans and dates (a hash count; a
single-column natural key is its non-null rows, duplicates being gone); for numbers and
timestamps, exact up to `_EXACT_DISTINCT_ROWS` rows and above that the distinct values of
the first `_EXACT_DISTINCT_ROWS` rows, a lower bound (`distinct_lower_bound`): hashing a
million distinct doubles costs more than the rest of the profile, and no rule needs more
(a column went constant is min = max, exact).
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from fleet_import.contracts.checks import LOW_CARDINALITY, DriftRule, ProfileDrift
from fleet_import.contracts.model import DatasetContract
from fleet_import.importing.gate_results import GateResult

_NUMBERS = frozenset({"int64", "float64", "decimal"})
_ORDERED = frozenset({"timestamptz", "date"})
_MIN_ROWS_CONSTANT = 10
"""A slice of fewer rows says nothing by holding one value: `went_constant` needs this many."""
_EXACT_DISTINCT_ROWS = 100_000
DISTINCT_METHOD = (
    f"exact; numbers and timestamps over {_EXACT_DISTINCT_ROWS:,} rows: a lower bound, the "
    f"distinct values of the first {_EXACT_DISTINCT_ROWS:,}"
)


def _json(value: Any) -> Any:
    """A scalar as JSON keeps it: decimals as text (exact), times as ISO text."""
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, float) and value != value:  # NaN
        return None
    return value


def profile_table(table: pa.Table, contract: DatasetContract) -> dict[str, Any]:
    """The profile of the rows `table` holds, for the columns of `contract`."""
    rows = table.num_rows
    columns: dict[str, dict[str, Any]] = {}
    for column in contract.columns:
        if column.name not in table.column_names:
            continue
        values = table[column.name]
        nulls = values.null_count
        entry: dict[str, Any] = {
            "type": column.type,
            "null_pct": round(100.0 * nulls / rows, 3) if rows else 0.0,
            **_distinct(values, column.kind, contract.natural_key == (column.name,)),
        }
        if column.kind in _NUMBERS | _ORDERED and rows > nulls:
            extremes = pc.min_max(values)
            entry["min"] = _json(extremes["min"].as_py())
            entry["max"] = _json(extremes["max"].as_py())
            if entry["min"] == entry["max"]:
                entry["distinct"] = 1  # constant, whatever the bound said
        if column.kind in _NUMBERS:
            entry["sum"] = _json(pc.sum(values).as_py()) if rows > nulls else 0
            entry["mean"] = _json(pc.mean(values).as_py()) if rows > nulls else None
        if column.kind == "string" and entry["distinct"] <= LOW_CARDINALITY:
            counts = pc.value_counts(values.drop_null()) if rows > nulls else None
            entry["top"] = (
                {str(v): int(n) for v, n in zip(*_pairs(counts), strict=True)} if counts else {}
            )
        columns[column.name] = entry
    return {"rows": rows, "distinct_method": DISTINCT_METHOD, "columns": columns}


def _distinct(values: pa.ChunkedArray, kind: str, is_key: bool) -> dict[str, Any]:
    valid = len(values) - values.null_count
    if is_key:
        return {"distinct": valid}
    if kind in _NUMBERS | _ORDERED and len(values) > _EXACT_DISTINCT_ROWS:
        head = values.slice(0, _EXACT_DISTINCT_ROWS)
        found = pc.count_distinct(head, mode="only_valid").as_py()
        return {"distinct": found, "distinct_lower_bound": True}
    return {"distinct": pc.count_distinct(values, mode="only_valid").as_py()}


def _pairs(counts: pa.StructArray) -> tuple[list[Any], list[int]]:
    return counts.field("values").to_pylist(), counts.field("counts").to_pylist()


def drift_results(
    contract: DatasetContract,
    rules: ProfileDrift,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
) -> list[GateResult]:
    """Each drift rule breached, per column: the new profile against the replaced slice's.
    None breached, or no baseline (a folder's first load): one `pass` result that says so."""
    if old is None:
        return [
            GateResult(contract.name, "profile", "pass", "", "", "no previous profile: first load")
        ]
    results = []
    old_columns = old.get("columns", {})
    for name, now in new.get("columns", {}).items():
        before = old_columns.get(name)
        if before is None or name in rules.ignore_columns:
            continue
        results += _column_drift(contract.name, name, rules, now, before, new.get("rows", 0))
    if not results:
        note = "no drift rule breached against the replaced slice"
        return [GateResult(contract.name, "profile", "pass", "", "", note)]
    return results


def _column_drift(
    dataset: str,
    column: str,
    rules: ProfileDrift,
    now: Mapping[str, Any],
    before: Mapping[str, Any],
    rows: int,
) -> list[GateResult]:
    found: list[GateResult] = []

    def judge(rule: DriftRule, name: str, breached: bool, figure: str, limit: str) -> None:
        if rule.severity != "off" and breached:  # passes are summed once (`drift_results`)
            found.append(
                GateResult(dataset, f"{name}({column})", rule.severity, figure, limit, "")
            )

    rule = rules.null_rate_up
    up = float(now["null_pct"]) - float(before["null_pct"])
    figure = f"null {before['null_pct']:g}% -> {now['null_pct']:g}%"
    judge(rule, "null_rate_up", up > float(rule.limit or 0), figure, f"> +{rule.limit:g} points")
    for stat, rule in (("sum", rules.sum_moved), ("mean", rules.mean_moved)):
        moved = _moved_pct(before.get(stat), now.get(stat))
        if moved is not None:
            figure = f"{stat} {before[stat]} -> {now[stat]} ({moved:+.1f}%)"
            limit = f"> {rule.limit:g}%"
            judge(rule, f"{stat}_moved", abs(moved) > float(rule.limit or 0), figure, limit)
    if "top" in before and int(before["distinct"]) <= LOW_CARDINALITY:
        new_values = sorted(set(now.get("top") or {}) - set(before["top"]))
        if "top" not in now:  # now too many values to list: some are new
            new_values = [f"{now['distinct']} distinct values"]
        figure = ", ".join(new_values[:5]) if new_values else "none"
        judge(rules.new_value, "new_value", bool(new_values), figure, "any")
    was_varied = int(before["distinct"]) > 1
    constant = int(now["distinct"]) == 1 and rows >= _MIN_ROWS_CONSTANT
    if was_varied:
        figure = f"distinct {before['distinct']} -> {now['distinct']}"
        judge(rules.went_constant, "went_constant", constant, figure, "1 value")
    return found


def _moved_pct(before: Any, now: Any) -> float | None:
    """The change from `before` to `now` in % of `before`; None when not comparable."""
    if before is None or now is None:
        return None
    old, new = float(before), float(now)
    if old == 0:
        return None
    return 100.0 * (new - old) / abs(old)
