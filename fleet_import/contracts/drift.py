"""Schema drift: columns a file holds that its dataset contract does not name, and what the
contract's `on_new_columns` policy makes of them.

`reject` refuses the file (normalize.header); `ignore` loads the contract's columns and
reports the others; `evolve` adds them to the curated table as nullable columns; `review`
holds the batch until someone approves that change. A contract that evolved is the declared
one plus the added columns (`evolved`): optional and nullable, after the declared ones, so
its `contract_version` differs, and the normalized-file cache and the already-loaded check
see the change. The added columns themselves live in the curated table: what it holds after
its stamp columns is what `evolved` is given again on the next import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pyarrow as pa

from fleet_import.contracts.model import DECIMAL_MAX_PRECISION, Column, DatasetContract
from fleet_import.errors import PreCommitError

ADDS_COLUMNS = frozenset({"evolve", "review"})
"""The policies under which a new column ends up in the curated table."""


class DriftConflict(PreCommitError):
    """Files of one delivery give a new column different types."""


def allows_new_columns(contract: DatasetContract) -> bool:
    return contract.on_new_columns != "reject"


def adds_columns(contract: DatasetContract) -> bool:
    return contract.on_new_columns in ADDS_COLUMNS


def type_from_arrow(data_type: pa.DataType) -> str | None:
    """The contract type a Parquet column of this type evolves into; None when it has none
    (a timestamp without time zone, a list, ...): such a column cannot be added."""
    if pa.types.is_dictionary(data_type):
        data_type = data_type.value_type
    if pa.types.is_integer(data_type):
        return "int64"
    if pa.types.is_floating(data_type):
        return "float64"
    if pa.types.is_boolean(data_type):
        return "bool"
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return "string"
    if pa.types.is_timestamp(data_type) and data_type.tz is not None:
        return "timestamptz"
    if pa.types.is_date(data_type):
        return "date"
    if pa.types.is_decimal(data_type) and data_type.precision <= DECIMAL_MAX_PRECISION:
        return f"decimal({data_type.precision},{max(data_type.scale, 0)})"
    return None


def evolved(contract: DatasetContract, added: Mapping[str, str]) -> DatasetContract:
    """The contract with these columns (name -> type) added: nullable and optional (files
    of before the change lack them), in the order given, after any added before."""
    new = [name for name in added if name not in contract.column_names]
    if not new:
        return contract
    columns = [Column(name, added[name], nullable=True, optional=True) for name in new]
    return contract.model_copy(
        update={
            "columns": (*contract.columns, *columns),
            "evolved_columns": (*contract.evolved_columns, *new),
        }
    )


def new_columns(
    contract: DatasetContract, found: Iterable[tuple[str, Mapping[str, str]]]
) -> dict[str, str]:
    """The columns (name -> type) the files of one dataset hold beyond its contract, by
    name (the order they are added in: one order wherever the columns are listed, batch
    details included, whose JSON keeps no order); `found` is (source key, its extra
    columns) per file. Two files that type one column differently raise DriftConflict."""
    columns: dict[str, str] = {}
    where: dict[str, str] = {}
    for source_key, extra in found:
        for name, column_type in extra.items():
            if name in contract.column_names:
                continue
            if name in columns and columns[name] != column_type:
                raise DriftConflict(
                    f"dataset {contract.name!r}: new column {name!r} is {columns[name]} in "
                    f"{where[name]} but {column_type} in {source_key}"
                )
            columns.setdefault(name, column_type)
            where.setdefault(name, source_key)
    return dict(sorted(columns.items()))
