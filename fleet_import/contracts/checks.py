"""The content gate's declarations: dataset checks (dbt's vocabulary: `not_null`, `unique`,
`accepted_values`, `relationships`, `expression`, `row_count`, each with `warn_if` /
`error_if`) and the drift rules that compare a new slice's profile with the replaced one's.

Judged against the normalized data before the slice commit (fleet_import.importing.gate),
never part of the normalized output: left out of `contract_version`, so tuning a check does
not invalidate the cache. Kept apart from contracts.model, which only holds them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
)

from fleet_import.errors import ConfigurationError

CheckType = Literal[
    "not_null", "unique", "accepted_values", "relationships", "expression", "row_count"
]
Severity = Literal["error", "warn", "off"]
_THRESHOLD = re.compile(r"\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)?)\s*(%?)\s*")
_OPERAND = r"([a-z_][a-z0-9_]*|-?\d+(?:\.\d+)?|'[^']*')"
_CLAUSE = re.compile(rf"\s*{_OPERAND}\s*(>=|<=|==|!=|>|<|=)\s*{_OPERAND}\s*")
DEFAULT_ERROR_IF = "> 0"
"""dbt's default: any failing row is an error."""


class GateDeclarationError(ConfigurationError):
    """A check or drift rule of a contract is invalid."""


class Threshold(BaseModel):
    """`> 0`, `>= 5%`, `< 1000`: compared with a check's figure (failing rows, or the rows
    for `row_count`); a percentage is of the dataset's rows."""

    model_config = ConfigDict(frozen=True)
    op: str
    value: float
    percent: bool

    @classmethod
    def parse(cls, text: str) -> Threshold:
        found = _THRESHOLD.fullmatch(text)
        if found is None:
            raise GateDeclarationError(
                f"invalid threshold {text!r}: expected an operator and a count or a "
                "percentage, e.g. '> 0', '>= 5%', '< 1000'"
            )
        return cls(op=found[1], value=float(found[2]), percent=bool(found[3]))

    def breached(self, figure: int, rows: int) -> bool:
        measured = 100.0 * figure / rows if self.percent and rows else float(figure)
        return compare(measured, self.op, self.value)

    def __str__(self) -> str:
        return f"{self.op} {self.value:g}{'%' if self.percent else ''}"


def compare(left: float, op: str, right: float) -> bool:
    return {
        ">": left > right,
        ">=": left >= right,
        "<": left < right,
        "<=": left <= right,
        "==": left == right,
        "=": left == right,
        "!=": left != right,
    }[op]


def parse_expression(text: str) -> list[tuple[str, str, str]]:
    """`a >= b and c > 0` as (left, op, right) clauses; operands are column names, numbers
    or 'quoted strings'. No other syntax: it is evaluated column-wise, never by eval."""
    clauses = []
    for part in re.split(r"\s+and\s+", text.strip(), flags=re.IGNORECASE):
        found = _CLAUSE.fullmatch(part)
        if found is None:
            raise GateDeclarationError(
                f"invalid expression clause {part!r}: expected `column op value` or "
                "`column op column` (op one of > >= < <= = !=), clauses joined by `and`"
            )
        clauses.append((found[1], found[2], found[3]))
    return clauses


def is_column(operand: str) -> bool:
    return bool(re.fullmatch(r"[a-z_][a-z0-9_]*", operand))


class Check(BaseModel):
    """One dataset check. `columns`: the column set of `not_null`/`unique`, the one column
    of `accepted_values`/`relationships`; `to`: `dataset.column` a relationship's values
    must be in; `expression`: the row rule every row must meet."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: CheckType
    name: StrictStr = ""
    columns: tuple[StrictStr, ...] = ()
    values: tuple[StrictStr, ...] = ()
    to: StrictStr | None = None
    expression: StrictStr | None = None
    warn_if: StrictStr | None = None
    error_if: StrictStr | None = None

    @field_validator("warn_if", "error_if")
    @classmethod
    def _threshold(cls, value: str | None) -> str | None:
        if value is not None:
            Threshold.parse(value)
        return value

    @field_validator("expression")
    @classmethod
    def _expression(cls, value: str | None) -> str | None:
        if value is not None:
            parse_expression(value)
        return value

    @property
    def label(self) -> str:
        """What a view names the check by: its name, else its type and columns."""
        if self.name:
            return self.name
        what = self.expression or ",".join(self.columns)
        return f"{self.type}({what})" if what else self.type

    def thresholds(self) -> tuple[Threshold | None, Threshold | None]:
        """(warn, error); error defaults to `> 0` when neither is given."""
        warn = Threshold.parse(self.warn_if) if self.warn_if else None
        error = Threshold.parse(self.error_if) if self.error_if else None
        if warn is None and error is None:
            error = Threshold.parse(DEFAULT_ERROR_IF)
        return warn, error

    def problems(self, columns: Sequence[str]) -> list[str]:
        """What is wrong with this check for a dataset of these columns."""
        needs_one = self.type in ("accepted_values", "relationships")
        problems = []
        if self.type in ("not_null", "unique") and not self.columns:
            problems.append(f"{self.type}: name its columns")
        if needs_one and len(self.columns) != 1:
            problems.append(f"{self.type}: name exactly one column")
        if self.type == "accepted_values" and not self.values:
            problems.append("accepted_values: list its values")
        if self.type == "relationships" and (self.to is None or self.to.count(".") != 1):
            problems.append("relationships: `to` must be dataset.column")
        if self.type == "expression" and not self.expression:
            problems.append("expression: give the row rule")
        named = list(self.columns)
        for left, _, right in parse_expression(self.expression) if self.expression else []:
            named += [operand for operand in (left, right) if is_column(operand)]
        unknown = sorted(set(named) - set(columns))
        if unknown:
            problems.append(f"{self.label}: no such column {', '.join(unknown)}")
        return problems


def _severity(value: object) -> object:
    # YAML 1.1 reads a bare `off` as false: take it as meant.
    return "off" if value is False else value


class DriftRule(BaseModel):
    """One comparison of a new slice's profile with the replaced slice's: `limit` (points
    of null rate, or percent of change) and what a breach does (`severity`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    limit: StrictFloat | StrictInt | None = None
    severity: Annotated[Severity, BeforeValidator(_severity)] = "error"


class ProfileDrift(BaseModel):
    """The drift rules of a dataset, on by default. `null_rate_up`: a column's null % up by
    more than `limit` points; `sum_moved`/`mean_moved`: a number column's sum or mean moved
    by more than `limit` %; `new_value`: a value not seen before in a column of at most
    `LOW_CARDINALITY` values; `went_constant`: a column of several values now holds one."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    null_rate_up: DriftRule = DriftRule(limit=25, severity="error")
    sum_moved: DriftRule = DriftRule(limit=100, severity="warn")
    mean_moved: DriftRule = DriftRule(limit=300, severity="error")
    new_value: DriftRule = DriftRule(severity="warn")
    went_constant: DriftRule = DriftRule(severity="warn")
    ignore_columns: tuple[StrictStr, ...] = ()
    """Columns no drift rule looks at (ids, free text)."""

    def tuned(self, raw: object) -> ProfileDrift:
        """These rules with `raw` (a mapping of rule -> {limit, severity}, or ignore_columns) over
        them: how an extension or a tenant's override tunes them."""
        if raw is None:
            return self
        if not isinstance(raw, dict):
            raise GateDeclarationError("profile_drift: expected a mapping of rules")
        shape = self.model_dump()
        for key, value in raw.items():
            if isinstance(value, dict) and isinstance(shape.get(key), dict):
                shape[key] = {**shape[key], **value}
            else:
                shape[key] = value
        return ProfileDrift.model_validate(shape)


LOW_CARDINALITY = 20
"""A string column with at most this many distinct values has them all profiled (top
values), and a new one is a drift."""
