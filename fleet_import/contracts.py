"""Dataset contracts: which files of a folder feed which curated table, with which columns.

The Fleet datasets ship here. Users add their own without editing this module: a YAML file
or a Python module exposing `DATASETS`, named in FLEET_CONTRACTS (comma-separated).
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa

from fleet_import.errors import InvalidInput

ColumnType = Literal["string", "int64", "float64", "bool", "timestamptz", "date"]
FileFormat = Literal["csv", "csv.gz", "parquet", "jsonl"]

ARROW_TYPES: dict[str, pa.DataType] = {
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
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")
DEFAULT_MAX_REJECT_RATIO = 0.05


class ContractError(InvalidInput):
    """A dataset contract is invalid."""


def _identifier(what: str, value: str) -> str:
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise ContractError(
            f"invalid {what} {value!r}: expected a lower-case identifier of at most 63 characters"
        )
    return value


@dataclass(frozen=True)
class Column:
    name: str
    type: ColumnType
    nullable: bool = True
    min_value: float | None = None
    allowed: tuple[str, ...] | None = None
    max_length: int | None = None

    def __post_init__(self) -> None:
        _identifier("column name", self.name)
        if self.type not in ARROW_TYPES:
            raise ContractError(
                f"column {self.name!r}: unknown type {self.type!r} (one of {sorted(ARROW_TYPES)})"
            )
        if self.allowed is not None:
            object.__setattr__(self, "allowed", tuple(self.allowed))

    @property
    def arrow_type(self) -> pa.DataType:
        return ARROW_TYPES[self.type]


@dataclass(frozen=True)
class DatasetContract:
    name: str
    file_glob: str
    columns: tuple[Column, ...]
    natural_key: tuple[str, ...]
    target_table: str
    formats: tuple[FileFormat, ...] = ("csv", "csv.gz", "parquet", "jsonl")
    max_reject_ratio: float = DEFAULT_MAX_REJECT_RATIO
    required: bool = True
    version: str = "1"
    description: str = ""
    _fingerprint: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _identifier("dataset name", self.name)
        object.__setattr__(self, "columns", tuple(self.columns))
        object.__setattr__(self, "natural_key", tuple(self.natural_key))
        object.__setattr__(self, "formats", tuple(self.formats))
        schema, _, table = self.target_table.partition(".")
        _identifier("target schema", schema)
        _identifier("target table", table)
        names = [column.name for column in self.columns]
        if len(set(names)) != len(names):
            raise ContractError(f"dataset {self.name!r}: duplicate column names")
        if not self.columns:
            raise ContractError(f"dataset {self.name!r}: no columns")
        for key in self.natural_key:
            if key not in names:
                raise ContractError(f"dataset {self.name!r}: natural key {key!r} is not a column")
        for fmt in self.formats:
            if fmt not in dict(FORMAT_SUFFIXES).values():
                raise ContractError(f"dataset {self.name!r}: unknown format {fmt!r}")
        if not 0 <= self.max_reject_ratio <= 1:
            raise ContractError(f"dataset {self.name!r}: max_reject_ratio must be within 0..1")
        payload = json.dumps(
            {k: v for k, v in asdict(self).items() if k not in ("description", "_fingerprint")},
            sort_keys=True,
            default=str,
        )
        digest = hashlib.sha256(payload.encode()).hexdigest()[:12]
        object.__setattr__(self, "_fingerprint", digest)

    @property
    def contract_version(self) -> str:
        """Changes whenever anything that shapes the normalised output changes."""
        return f"{self.version}-{self._fingerprint}"

    @property
    def column_names(self) -> list[str]:
        return [column.name for column in self.columns]

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema(
            [pa.field(c.name, c.arrow_type, nullable=c.nullable) for c in self.columns]
        )

    def matches(self, file_name: str) -> bool:
        return (
            fnmatch.fnmatchcase(file_name, self.file_glob)
            and file_format(file_name) in self.formats
        )


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
                raise ContractError(f"dataset {contract.name!r} is defined twice")
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


def contract_from_dict(raw: Mapping[str, Any]) -> DatasetContract:
    try:
        columns = tuple(
            Column(**{**column, "allowed": column.get("allowed")}) for column in raw["columns"]
        )
        return DatasetContract(**{**raw, "columns": columns})
    except (KeyError, TypeError) as exc:
        raise ContractError(
            f"dataset definition {raw.get('name', '?')!r} is invalid: {exc}"
        ) from None


def load_contracts(spec: str) -> list[DatasetContract]:
    """Datasets from a YAML file (`path.yaml`, a list or `{datasets: [...]}`) or a module
    (`package.module`, exposing `DATASETS`)."""
    if spec.endswith((".yaml", ".yml")):
        import yaml

        path = Path(spec)
        if not path.is_file():
            raise ContractError(f"contract file {spec!r} does not exist")
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        items = raw.get("datasets", []) if isinstance(raw, dict) else raw
        if not isinstance(items, list):
            raise ContractError(f"contract file {spec!r}: expected a list of datasets")
        return [contract_from_dict(item) for item in items]
    try:
        module = importlib.import_module(spec)
    except ImportError as exc:
        raise ContractError(f"cannot import contract module {spec!r}: {exc}") from None
    datasets = getattr(module, "DATASETS", None)
    if datasets is None:
        raise ContractError(f"contract module {spec!r} has no DATASETS")
    return [d if isinstance(d, DatasetContract) else contract_from_dict(d) for d in datasets]


def contracts_in_force(extra_specs: str | None = None) -> ContractSet:
    """The Fleet datasets plus whatever FLEET_CONTRACTS names."""
    contracts = FLEET_DATASETS
    for spec in filter(None, (s.strip() for s in (extra_specs or "").split(","))):
        contracts = contracts.with_extra(load_contracts(spec))
    return contracts


_FUEL_TYPES = ("diesel", "petrol", "electric", "hybrid", "lpg", "cng")

VEHICLES = DatasetContract(
    name="vehicles",
    file_glob="vehicles*",
    target_table="curated.fleet_vehicles",
    natural_key=("vehicle_id",),
    description="The tenant's vehicle register.",
    columns=(
        Column("vehicle_id", "string", nullable=False, max_length=64),
        Column("vin", "string", nullable=False, max_length=17),
        Column("registration", "string", max_length=16),
        Column("make", "string", max_length=64),
        Column("model", "string", max_length=64),
        Column("model_year", "int64", min_value=1950),
        Column("fuel_type", "string", nullable=False, allowed=_FUEL_TYPES),
        Column("status", "string", nullable=False, allowed=("active", "maintenance", "retired")),
        Column("odometer_km", "float64", min_value=0),
        Column("updated_at", "timestamptz", nullable=False),
    ),
)

TRIPS = DatasetContract(
    name="trips",
    file_glob="trips*",
    target_table="curated.fleet_trips",
    natural_key=("trip_id",),
    description="Completed, cancelled and ongoing trips.",
    columns=(
        Column("trip_id", "string", nullable=False, max_length=64),
        Column("vehicle_id", "string", nullable=False, max_length=64),
        Column("driver_id", "string", max_length=64),
        Column("started_at", "timestamptz", nullable=False),
        Column("ended_at", "timestamptz"),
        Column("distance_km", "float64", min_value=0),
        Column("start_odometer_km", "float64", min_value=0),
        Column("end_odometer_km", "float64", min_value=0),
        Column(
            "status", "string", nullable=False, allowed=("completed", "cancelled", "in_progress")
        ),
    ),
)

FUEL_TRANSACTIONS = DatasetContract(
    name="fuel_transactions",
    file_glob="fuel_transactions*",
    target_table="curated.fleet_fuel_transactions",
    natural_key=("transaction_id",),
    description="Fuel card transactions.",
    columns=(
        Column("transaction_id", "string", nullable=False, max_length=64),
        Column("vehicle_id", "string", nullable=False, max_length=64),
        Column("driver_id", "string", max_length=64),
        Column("transacted_at", "timestamptz", nullable=False),
        Column("fuel_type", "string", nullable=False, allowed=_FUEL_TYPES),
        Column("litres", "float64", nullable=False, min_value=0),
        Column("price_per_litre", "float64", min_value=0),
        Column("total_amount", "float64", nullable=False),
        Column("currency", "string", nullable=False, max_length=3),
        Column("station_id", "string", max_length=64),
        Column("odometer_km", "float64", min_value=0),
    ),
)

FLEET_DATASETS = ContractSet([VEHICLES, TRIPS, FUEL_TRANSACTIONS])
