"""A dataset's profile, and the drift rules that compare it with the replaced slice's.

A profile is computed column-wise with pyarrow.compute on the normalized rows the slice is
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
_DISTINCT_TRACKED = 100_000
DISTINCT_METHOD = (
    f"exact up to {_DISTINCT_TRACKED:,} values for strings; numbers and timestamps over "
    f"{_EXACT_DISTINCT_ROWS:,} rows: a lower bound, the distinct values of the first "
    f"{_EXACT_DISTINCT_ROWS:,} rows"
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


class _Column:
    """One column's running figures over the files added so far."""

    def __init__(self, kind: str, scale: int | None, is_key: bool) -> None:
        self.kind, self.scale, self.is_key = kind, scale, is_key
        self.nulls = 0
        self.valid = 0
        self.total: Any = 0
        self.low: Any = None
        self.high: Any = None
        self.head: list[pa.ChunkedArray] = []  # numbers, times: the first rows, for distinct
        self.head_rows = 0
        self.counts: pa.Table | None = None  # strings: each value and its rows
        self.tracked = True  # strings: `counts` holds every value seen (up to _DISTINCT_TRACKED)
        self.floor = 0  # strings past tracking: the most distinct values one state held

    def add(self, values: pa.ChunkedArray) -> None:
        nulls = values.null_count
        self.nulls += nulls
        self.valid += len(values) - nulls
        if self.is_key or len(values) == nulls:
            return
        if self.kind in _NUMBERS | _ORDERED | {"bool"}:
            extremes = pc.min_max(values)
            low, high = extremes["min"].as_py(), extremes["max"].as_py()
            self.low = low if self.low is None else min(self.low, low)
            self.high = high if self.high is None else max(self.high, high)
            if self.kind in _NUMBERS:
                self.total += pc.sum(values).as_py()
            if self.head_rows < _EXACT_DISTINCT_ROWS:
                taken = values.slice(0, _EXACT_DISTINCT_ROWS - self.head_rows)
                self.head.append(taken)
                self.head_rows += len(taken)
            return
        if self.tracked:
            counts = pc.value_counts(values.drop_null())
            part = pa.table({"values": counts.field("values"), "n": counts.field("counts")})
            merged = part if self.counts is None else pa.concat_tables([self.counts, part])
            self.counts = merged.group_by("values").aggregate([("n", "sum")]).rename_columns(
                ["values", "n"]
            )
            if self.counts.num_rows > _DISTINCT_TRACKED:
                self.tracked, self.floor, self.counts = False, self.counts.num_rows, None
        else:
            self.floor = max(self.floor, pc.count_distinct(values, mode="only_valid").as_py())

    def entry(self, column_type: str, rows: int) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "type": column_type,
            "null_pct": round(100.0 * self.nulls / rows, 3) if rows else 0.0,
        }
        if self.is_key:
            entry["distinct"] = self.valid  # duplicates are gone: each row its own
        elif self.kind in _NUMBERS | _ORDERED | {"bool"}:
            head = pa.chunked_array([c for h in self.head for c in h.chunks]) if self.head else None
            found = pc.count_distinct(head, mode="only_valid").as_py() if head else 0
            entry["distinct"] = 1 if self.low is not None and self.low == self.high else found
            if self.valid > _EXACT_DISTINCT_ROWS and entry["distinct"] > 1:
                entry["distinct_lower_bound"] = True
        elif self.tracked:
            entry["distinct"] = self.counts.num_rows if self.counts is not None else 0
        else:
            entry["distinct"], entry["distinct_lower_bound"] = self.floor, True
        if self.kind in _NUMBERS | _ORDERED and self.low is not None:
            entry["min"], entry["max"] = _json(self.low), _json(self.high)
        if self.kind in _NUMBERS:
            entry["sum"] = _json(self.total)
            entry["mean"] = _json(self._mean()) if self.valid else None
        if self.kind == "string" and self.tracked and entry["distinct"] <= LOW_CARDINALITY:
            entry["top"] = {}
            if self.counts is not None:
                counts = self.counts.sort_by([("n", "descending")])
                pairs = zip(counts["values"].to_pylist(), counts["n"].to_pylist(), strict=True)
                entry["top"] = {str(value): int(n) for value, n in pairs}
        return entry

    def _mean(self) -> Any:
        if isinstance(self.total, decimal.Decimal):
            exponent = decimal.Decimal(1).scaleb(-(self.scale or 0))
            return (self.total / self.valid).quantize(exponent, decimal.ROUND_HALF_EVEN)
        return float(self.total) / self.valid


class ProfileBuilder:
    """A dataset's profile built file by file, so memory holds one file at a time."""

    def __init__(self, contract: DatasetContract) -> None:
        self._contract = contract
        self.rows = 0
        key = contract.natural_key
        self._columns = {
            column.name: _Column(
                column.kind,
                column.decimal[1] if column.decimal else None,
                key == (column.name,),
            )
            for column in contract.columns
        }

    def add(self, table: pa.Table) -> None:
        self.rows += table.num_rows
        for name, running in self._columns.items():
            if name in table.column_names:
                running.add(table[name])

    def profile(self) -> dict[str, Any]:
        columns = {
            column.name: self._columns[column.name].entry(column.type, self.rows)
            for column in self._contract.columns
        }
        return {"rows": self.rows, "distinct_method": DISTINCT_METHOD, "columns": columns}


def profile_table(table: pa.Table, contract: DatasetContract) -> dict[str, Any]:
    """The profile of the rows `table` holds, for the columns of `contract`."""
    builder = ProfileBuilder(contract)
    builder.add(table)
    return builder.profile()


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
