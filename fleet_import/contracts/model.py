"""Dataset contracts: which files of a folder feed which curated table, with which columns.

The Fleet datasets ship here. Users add their own without editing this module: a YAML file
or a Python module exposing `DATASETS`, named in FLEET_CONTRACTS (comma-separated), read by
`fleet_import.contracts.files`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cache, partial
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from fleet_import.contracts.checks import Check, ProfileDrift
from fleet_import.contracts.describe import describe, label
from fleet_import.errors import ConfigurationError

if TYPE_CHECKING:
    import pyarrow as pa

ColumnType = Literal["string", "int64", "float64", "bool", "timestamptz", "date"]
"""The simple column types; `decimal(p,s)` (read by `_column_type`) is the one with arguments."""
FileFormat = Literal["csv", "csv.gz", "parquet", "jsonl"]
DriftPolicy = Literal["reject", "ignore", "evolve", "review"]
"""What a file's columns that its contract does not name do (fleet_import.contracts.drift):
refuse the file, load without them, add them to the curated table, or hold the batch for
review and add them on approval."""



@cache
def arrow_types() -> dict[str, pa.DataType]:
    """The simple column types as Arrow's. pyarrow is imported when a contract's Arrow
    types are first needed, not when a contract file is checked (issue #28: a settings
    error answers without it)."""
    import pyarrow as pa

    return {
        "string": pa.string(),
        "int64": pa.int64(),
        "float64": pa.float64(),
        "bool": pa.bool_(),
        "timestamptz": pa.timestamp("us", tz="UTC"),
        "date": pa.date32(),
    }


# Longest suffix first, so that "x.csv.gz" is csv.gz and not an unknown ".gz".
FORMAT_SUFFIXES: tuple[tuple[str, FileFormat], ...] = (
    (".csv.gz", "csv.gz"),
    (".csv", "csv"),
    (".parquet", "parquet"),
    (".jsonl", "jsonl"),
)
DECIMAL_MAX_PRECISION = 38
"""Arrow's decimal128 and Redshift's DECIMAL hold at most 38 digits (PostgreSQL more)."""
_DECIMAL = re.compile(r"decimal\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)", re.IGNORECASE)
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")
DEFAULT_MAX_REJECT_RATIO = 0.05
DEFAULT_MIN_ROWS_RATIO = 0.5
"""Slice guard: a replacement with fewer rows than this fraction of the slice it replaces is
held for review (fleet_import.importing.guards)."""
GUARD_FIELDS = frozenset({"min_rows_ratio", "allow_empty", "checks", "profile_drift"})
"""Judged against the slice a load replaces (the guards, the content gate's checks and drift
rules), never part of the normalized output: left out of `contract_version`, so tuning a
guard does not invalidate the cache."""
VARCHAR_MAX_BYTES = 65535
"""The widest string a warehouse column holds: Redshift's VARCHAR(65535), counted in bytes."""
UTF8_MAX_BYTES_PER_CHAR = 4


class ContractError(ConfigurationError):
    """A dataset contract is invalid."""


def _identifier(what: str, value: object) -> str:
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise ContractError(
            f"invalid {what} {value!r}: expected a lower-case identifier of at most 63 characters"
        )
    return value


def _one_of(what: str, choices: Sequence[str], value: object) -> object:
    if value not in choices:
        raise ContractError(f"unknown {what} {value!r} (one of {', '.join(sorted(choices))})")
    return value


def _as_written(kinds: tuple[type, ...], expected: str, value: object) -> object:
    # No coercion (0 stays 0, not 0.0; 2 stays 2, not "2"): these values feed
    # contract_version, the cache key, which must not change for a contract that did not.
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ContractError(f"invalid value {value!r} (expected {expected})")
    return value


def _column_type(value: object) -> object:
    """A simple type as it is, or `decimal(p,s)` spelled canonically (no spaces, lower case),
    so that `decimal(12, 2)` and `DECIMAL(12,2)` are one contract version."""
    simple = get_args(ColumnType)
    if value in simple:
        return value
    found = _DECIMAL.fullmatch(value.strip()) if isinstance(value, str) else None
    if found is None:
        raise ContractError(
            f"unknown type {value!r} (one of {', '.join(sorted(simple))}), or "
            f"decimal(p,s) with 1 <= p <= {DECIMAL_MAX_PRECISION} and 0 <= s <= p"
        )
    precision, scale = int(found[1]), int(found[2])
    if not 1 <= precision <= DECIMAL_MAX_PRECISION:
        raise ContractError(
            f"invalid type {value!r}: precision {precision} is outside "
            f"1..{DECIMAL_MAX_PRECISION} (the most digits a Redshift DECIMAL holds)"
        )
    if not 0 <= scale <= precision:
        raise ContractError(
            f"invalid type {value!r}: scale {scale} is outside 0..{precision} (the precision)"
        )
    return f"decimal({precision},{scale})"


def decimal_spec(column_type: str) -> tuple[int, int] | None:
    """(precision, scale) of a `decimal(p,s)` type as the contract holds it; None otherwise."""
    found = _DECIMAL.fullmatch(column_type)
    return None if found is None else (int(found[1]), int(found[2]))


def _target_table(value: object) -> str:
    schema, _, table = value.partition(".") if isinstance(value, str) else (value, "", "")
    _identifier("target schema", schema)
    _identifier("target table", table)
    return str(value)


def _rule(check: Callable[..., object], *args: Any) -> BeforeValidator:
    return BeforeValidator(partial(check, *args))


_FORMATS: tuple[FileFormat, ...] = get_args(FileFormat)
_Number = Annotated[int | float, _rule(_as_written, (int, float), "a number")]
_Version = Annotated[str | int | float, _rule(_as_written, (str, int, float), "text or a number")]
_Format = Annotated[FileFormat, _rule(_one_of, "format", _FORMATS)]
_Policy = Annotated[DriftPolicy, _rule(_one_of, "drift policy", get_args(DriftPolicy))]


class _BuiltInPython(type(BaseModel)):  # type: ignore[misc]
    """Builds a contract as the dataclasses did: positional arguments in field order
    (`Column("id", "string")`), and a bad value raises ContractError. Definitions read from
    YAML do not pass here (model_validate), so their errors keep the whole field path."""

    def __call__(cls, *args: Any, **data: Any) -> Any:
        names = list(cls.model_fields)
        if len(args) > len(names) or data.keys() & set(names[: len(args)]):
            raise TypeError(f"{cls.__name__}: too many or repeated arguments")
        data.update(zip(names, args, strict=False))
        try:
            return super().__call__(**data)
        except ValidationError as exc:
            raise ContractError(describe(exc, cls, label(cls._what, data))) from None


class _Contract(BaseModel, metaclass=_BuiltInPython):
    model_config = ConfigDict(frozen=True, extra="forbid")
    _what: ClassVar[str]


class Column(_Contract):
    _what = "column"

    name: Annotated[str, _rule(_identifier, "column name")]
    type: Annotated[str, _rule(_column_type)]
    nullable: StrictBool = True
    min_value: _Number | None = None
    allowed: tuple[StrictStr, ...] | None = None
    max_length: StrictInt | None = None
    aliases: tuple[StrictStr, ...] = ()
    """Earlier header names of this column (matched trimmed, case-insensitively), so that
    a renamed export keeps loading."""
    optional: StrictBool = False
    """A file may lack this (nullable) column: its rows then hold NULL there. Any other
    column a file lacks rejects the file."""

    @field_validator("optional")
    @classmethod
    def _optional_nullable(cls, optional: bool, info: ValidationInfo) -> bool:
        if optional and info.data.get("nullable") is False:
            raise ContractError("an optional column must be nullable (a file may lack it)")
        return optional

    @field_validator("aliases")
    @classmethod
    def _aliases_named(cls, aliases: tuple[str, ...]) -> tuple[str, ...]:
        if any(not alias.strip() for alias in aliases):
            raise ContractError("an alias is empty")
        return aliases

    @field_validator("max_length")
    @classmethod
    def _length_fits(cls, max_length: int | None) -> int | None:
        # Refused here, at load, rather than by a CREATE TABLE or a COPY in production.
        if max_length is None:
            return None
        if max_length < 1:
            raise ContractError(f"must be at least 1, not {max_length}")
        if max_length * UTF8_MAX_BYTES_PER_CHAR > VARCHAR_MAX_BYTES:
            most = VARCHAR_MAX_BYTES // UTF8_MAX_BYTES_PER_CHAR
            raise ContractError(
                f"{max_length} characters may take {max_length * UTF8_MAX_BYTES_PER_CHAR} "
                f"bytes in UTF-8, more than a Redshift VARCHAR holds ({VARCHAR_MAX_BYTES} "
                f"bytes): use at most {most}, or leave max_length out (values are then "
                f"limited to {VARCHAR_MAX_BYTES} bytes)"
            )
        return max_length

    @field_validator("allowed")
    @classmethod
    def _allowed_fit(cls, allowed: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if allowed is None:
            return None
        if not allowed:
            raise ContractError("no allowed values: every row would be rejected")
        longest = max(allowed, key=lambda value: len(value.encode()))
        if len(longest.encode()) > VARCHAR_MAX_BYTES:
            raise ContractError(
                f"allowed value {longest[:20]!r}... takes {len(longest.encode())} bytes in "
                f"UTF-8, more than a Redshift VARCHAR holds ({VARCHAR_MAX_BYTES} bytes)"
            )
        return allowed

    @property
    def kind(self) -> str:
        """The type without its arguments: `decimal` for every `decimal(p,s)`."""
        return "decimal" if self.decimal is not None else self.type

    @property
    def decimal(self) -> tuple[int, int] | None:
        """(precision, scale) of a decimal column; None for the other types."""
        return decimal_spec(self.type)

    @property
    def arrow_type(self) -> pa.DataType:
        import pyarrow as pa

        spec = self.decimal
        return arrow_types()[self.type] if spec is None else pa.decimal128(*spec)

    @property
    def max_bytes(self) -> int:
        """The most UTF-8 bytes a value of this string column may take: the width of its
        Redshift VARCHAR, which counts bytes. The longest allowed value's when `allowed`
        bounds it, 4 per character of `max_length` (UTF-8's most), else the widest VARCHAR;
        normalization rejects longer values, so a COPY never meets one."""
        bounds = [VARCHAR_MAX_BYTES]
        if self.allowed is not None:
            bounds.append(max(1, *(len(value.encode()) for value in self.allowed)))
        if self.max_length is not None:
            bounds.append(self.max_length * UTF8_MAX_BYTES_PER_CHAR)
        return min(bounds)


class DatasetContract(_Contract):
    _what = "dataset"

    name: Annotated[str, _rule(_identifier, "dataset name")]
    file_glob: StrictStr
    columns: tuple[Column, ...]
    natural_key: tuple[StrictStr, ...]
    target_table: Annotated[str, _rule(_target_table)]
    formats: tuple[_Format, ...] = _FORMATS
    max_reject_ratio: _Number = DEFAULT_MAX_REJECT_RATIO
    min_rows_ratio: _Number = DEFAULT_MIN_ROWS_RATIO
    allow_empty: StrictBool = False
    required: StrictBool = True
    version: _Version = "1"
    description: StrictStr = ""
    on_new_columns: _Policy = "reject"
    """Columns a file holds that the contract does not name (fleet_import.contracts.drift)."""
    new_column_type: Annotated[str, _rule(_column_type)] = "string"
    """The type an evolved column gets from a CSV or JSON-lines file (Parquet says its own)."""
    evolved_columns: tuple[StrictStr, ...] = ()
    """Set by drift, never written in a contract file: the columns (last of `columns`) that
    `evolve` added to the curated table, after its stamp columns."""
    checks: tuple[Check, ...] = ()
    """The content gate's dataset checks (contracts.checks, importing.gate)."""
    profile_drift: ProfileDrift = ProfileDrift()
    """The content gate's drift rules against the replaced slice's profile."""

    @field_validator("columns")
    @classmethod
    def _distinct_columns(cls, columns: tuple[Column, ...]) -> tuple[Column, ...]:
        if not columns:
            raise ContractError("no columns")
        names = [column.name for column in columns]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ContractError(f"duplicate column names: {', '.join(twice)}")
        # A header name must lead to one column: names and aliases, compared as matched.
        headers = [
            header
            for column in columns
            for header in {column.name, *(alias.strip().lower() for alias in column.aliases)}
        ]
        ambiguous = sorted({header for header in headers if headers.count(header) > 1})
        if ambiguous:
            raise ContractError(f"aliases that name more than one column: {', '.join(ambiguous)}")
        return columns

    @field_validator("natural_key")
    @classmethod
    def _key_of_columns(cls, key: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        names = [column.name for column in info.data.get("columns", ())]
        for part in key:
            if names and part not in names:  # no names: the columns were refused already
                raise ContractError(f"natural key {part!r} is not a column")
        return key

    @field_validator("checks")
    @classmethod
    def _checks_of_columns(cls, checks: tuple[Check, ...], info: ValidationInfo) -> tuple:
        names = [column.name for column in info.data.get("columns", ())]
        problems = [p for check in checks for p in check.problems(names)] if names else []
        if problems:
            raise ContractError("; ".join(problems))
        return checks

    @field_validator("max_reject_ratio", "min_rows_ratio")
    @classmethod
    def _ratio(cls, ratio: float) -> float:
        if not 0 <= ratio <= 1:
            raise ContractError(f"must be within 0..1, not {ratio!r}")
        return ratio

    @property
    def contract_version(self) -> str:
        """Changes whenever anything that shapes the normalized output changes."""
        # Computed on each call, so a model_copy(update=...) never carries a stale version.
        shape = self.model_dump(exclude={"description", *GUARD_FIELDS})
        for column in shape["columns"]:
            # Aliases decide only whether a header matches, never what a loaded file holds:
            # a contract that gains one keeps its version (and its cached outputs).
            column.pop("aliases")
            _drop_default(column, "optional", False)
        # Drift's keys at their defaults leave the version as it was before they existed,
        # so that contracts which do not use them keep their cached outputs.
        for key, default in _DRIFT_DEFAULTS.items():
            _drop_default(shape, key, default)
        payload = json.dumps(shape, sort_keys=True, default=str)
        return f"{self.version}-{hashlib.sha256(payload.encode()).hexdigest()[:12]}"

    @property
    def column_names(self) -> list[str]:
        return [column.name for column in self.columns]

    @property
    def arrow_schema(self) -> pa.Schema:
        import pyarrow as pa

        return pa.schema(
            [pa.field(c.name, c.arrow_type, nullable=c.nullable) for c in self.columns]
        )

    def matches(self, file_name: str) -> bool:
        return (
            fnmatch.fnmatchcase(file_name, self.file_glob)
            and file_format(file_name) in self.formats
        )


_DRIFT_DEFAULTS = {"on_new_columns": "reject", "new_column_type": "string", "evolved_columns": ()}


def _drop_default(shape: dict[str, Any], key: str, default: object) -> None:
    if shape.get(key) in (default, list(default) if isinstance(default, tuple) else default):
        shape.pop(key)


def file_format(file_name: str) -> FileFormat | None:
    lowered = file_name.lower()
    for suffix, fmt in FORMAT_SUFFIXES:
        if lowered.endswith(suffix):
            return fmt
    return None


class ContractSet(Mapping[str, DatasetContract]):
    """The datasets in force, by name."""

    def __init__(self, contracts: Iterable[DatasetContract]) -> None:
        self._by_name: dict[str, DatasetContract] = {}
        for contract in contracts:
            if contract.name in self._by_name:
                raise ContractError(
                    f"dataset {contract.name!r} is defined twice: to add aliases or a drift "
                    f"policy to a dataset in force, extend it (`extend: {{{contract.name}: "
                    "{aliases: {column: [header]}, on_new_columns: ignore}}`)"
                )
            self._by_name[contract.name] = contract

    def __getitem__(self, name: str) -> DatasetContract:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def match(self, file_name: str) -> DatasetContract | None:
        """The contract a file feeds; None for files no dataset claims (they are ignored)."""
        matched = [c for c in self._by_name.values() if c.matches(file_name)]
        if len(matched) > 1:
            names = ", ".join(c.name for c in matched)
            raise ContractError(f"file {file_name!r} matches several datasets: {names}")
        return matched[0] if matched else None

    def with_extra(self, extra: Iterable[DatasetContract]) -> ContractSet:
        return ContractSet([*self._by_name.values(), *extra])
