"""Extending a dataset already in force (a shipped Fleet dataset, or one an earlier
FLEET_CONTRACTS file defined) without redefining it: more aliases for its columns, and its
drift policy, and its content gate (more checks, its drift rules tuned). A renamed export
column or a tenant's new columns then need no code change.

Only what leaves the loaded data as the contract says may be extended: an alias changes
which headers match, never what a loaded file holds (the contract keeps its version); a
drift policy decides what columns the contract does not name do (a policy other than the
default is a contract version of its own, as in a contract file); checks and drift rules
judge the loaded data and never change it (the version stays). Columns, types, keys and
ratios stay the definition's: redefining those is a new dataset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import StrictStr, ValidationError

from fleet_import.contracts.checks import Check, GateDeclarationError, ProfileDrift
from fleet_import.contracts.describe import describe
from fleet_import.contracts.model import (
    ContractError,
    ContractSet,
    DatasetContract,
    _column_type,
    _Contract,
    _Policy,
    _rule,
)


class DatasetExtension(_Contract):
    _what = "extension"

    aliases: dict[StrictStr, tuple[StrictStr, ...]] = {}
    """Column name -> more earlier header names of it (added to the definition's)."""
    on_new_columns: _Policy | None = None
    new_column_type: Annotated[str, _rule(_column_type)] | None = None
    checks: tuple[Check, ...] = ()
    """More content-gate checks, after the definition's."""
    profile_drift: dict[StrictStr, Any] | None = None
    """Drift rules tuned: rule -> {limit, severity}, or ignore_columns (ProfileDrift.tuned)."""


def extensions_from(
    raw: object, where: str, listed_as: str = "extend"
) -> dict[str, DatasetExtension]:
    """`extend:` of a contract file (dataset name -> extension), every entry checked."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ContractError(
            f"{where}: {listed_as}: expected a mapping of dataset names to extensions"
        )
    extensions, problems = {}, []
    for name, fields in raw.items():
        try:
            extensions[str(name)] = DatasetExtension.model_validate(fields)
        except ValidationError as exc:
            problems.append(describe(exc, DatasetExtension, f"{where}: {listed_as}.{name}"))
    if problems:
        raise ContractError("; ".join(problems))
    return extensions


def extend(
    contracts: ContractSet, extensions: Mapping[str, DatasetExtension], where: str
) -> ContractSet:
    """`contracts` with each named dataset extended (unknown datasets or columns refused)."""
    for name in extensions:
        if name not in contracts:
            raise ContractError(
                f"{where}: extend.{name}: no dataset {name!r} is in force to extend "
                f"(one of {', '.join(contracts)}); define a new dataset under `datasets`"
            )
    return ContractSet(
        extended(contract, extensions[name], f"{where}: extend.{name}")
        if name in extensions
        else contract
        for name, contract in contracts.items()
    )


def extended(
    contract: DatasetContract, extension: DatasetExtension, where: str
) -> DatasetContract:
    unknown = sorted(extension.aliases.keys() - set(contract.column_names))
    if unknown:
        raise ContractError(
            f"{where}: aliases: {', '.join(unknown)}: no such column of dataset "
            f"{contract.name!r} (one of {', '.join(contract.column_names)})"
        )
    shape: dict[str, Any] = contract.model_dump()
    for column in shape["columns"]:
        column["aliases"] = (*column["aliases"], *extension.aliases.get(column["name"], ()))
    for field in ("on_new_columns", "new_column_type"):
        value = getattr(extension, field)
        if value is not None:
            shape[field] = value
    shape["checks"] = [*shape["checks"], *(c.model_dump() for c in extension.checks)]
    try:
        drift = contract.profile_drift.tuned(extension.profile_drift)
    except ValidationError as exc:
        raise ContractError(describe(exc, ProfileDrift, f"{where}: profile_drift")) from None
    except GateDeclarationError as exc:
        raise ContractError(f"{where}: profile_drift: {exc}") from None
    shape["profile_drift"] = drift.model_dump()
    try:  # validated again: an alias may now name two columns
        return DatasetContract.model_validate(shape)
    except ValidationError as exc:
        raise ContractError(describe(exc, DatasetContract, where)) from None
