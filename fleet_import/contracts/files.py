"""Users' dataset contracts, from the YAML files and Python modules FLEET_CONTRACTS names,
checked whole: one run reports every mistake of a file. A file defines new datasets
(`datasets`) and extends those already in force (`extend`: contracts.extension)."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from fleet_import.contracts.describe import describe, label
from fleet_import.contracts.extension import DatasetExtension, extend, extensions_from
from fleet_import.contracts.fleet import FLEET_DATASETS
from fleet_import.contracts.model import ContractError, ContractSet, DatasetContract


def contract_from_dict(raw: Mapping[str, Any], where: str = "dataset") -> DatasetContract:
    """A dataset from its plain definition; `where` says where it was found, for the message."""
    if isinstance(raw, Mapping) and raw.get("evolved_columns"):
        raise ContractError(
            f"{label(where, raw)}: evolved_columns: set by the `evolve` drift policy from "
            "the curated table, not in a contract file (name the column in `columns`)"
        )
    try:
        return DatasetContract.model_validate(raw)
    except ValidationError as exc:
        raise ContractError(describe(exc, DatasetContract, label(where, raw))) from None


def _contracts_from(items: Iterable[Any], source: str, listed_as: str) -> list[DatasetContract]:
    """Every definition is checked, so one run reports all of a file's mistakes."""
    contracts, problems = [], []
    for index, item in enumerate(items):
        try:
            contracts.append(
                item
                if isinstance(item, DatasetContract)
                else contract_from_dict(item, f"{listed_as}[{index}]")
            )
        except ContractError as exc:
            problems.append(str(exc))
    if problems:
        raise ContractError(f"{source}: " + "; ".join(problems))
    return contracts


class ContractFile(NamedTuple):
    """What one FLEET_CONTRACTS entry holds: new datasets, and extensions of datasets."""

    datasets: list[DatasetContract]
    extensions: dict[str, DatasetExtension]


_FILE_FIELDS = ("datasets", "extend")


def _read_yaml(spec: str) -> tuple[Any, Any]:
    import yaml

    path = Path(spec)
    if not path.is_file():
        raise ContractError(f"contract file {spec!r} does not exist")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ContractError(f"{spec}: not valid YAML: {exc}") from None
    extensions = None
    if isinstance(raw, dict):
        unknown = sorted(map(str, raw.keys() - set(_FILE_FIELDS)))
        if unknown:
            fields = ", ".join(_FILE_FIELDS)
            raise ContractError(f"{spec}: {', '.join(unknown)}: unknown field (one of {fields})")
        raw, extensions = raw.get("datasets") or [], raw.get("extend")
    if not isinstance(raw, list):
        raise ContractError(f"contract file {spec!r}: expected a list of datasets")
    return raw, extensions


def read_contract_file(spec: str) -> ContractFile:
    """Datasets and extensions from a YAML file (`path.yaml`: a list of datasets, or
    `{datasets: [...], extend: {name: {...}}}`) or a module (`package.module`, exposing
    `DATASETS` and/or `EXTEND`)."""
    if spec.endswith((".yaml", ".yml")):
        datasets, extensions = _read_yaml(spec)
        return ContractFile(
            _contracts_from(datasets, spec, "datasets"), extensions_from(extensions, spec)
        )
    try:
        module = importlib.import_module(spec)
    except ImportError as exc:
        raise ContractError(f"cannot import contract module {spec!r}: {exc}") from None
    except ContractError as exc:  # a DatasetContract(...) the module builds as it loads
        raise ContractError(f"{spec}: {exc}") from None
    datasets = getattr(module, "DATASETS", None)
    extensions = getattr(module, "EXTEND", None)
    if datasets is None and extensions is None:
        raise ContractError(f"contract module {spec!r} has no DATASETS (nor EXTEND)")
    return ContractFile(
        _contracts_from(datasets or [], spec, "DATASETS"),
        extensions_from(extensions, spec, "EXTEND"),
    )


def load_contracts(spec: str) -> list[DatasetContract]:
    """The datasets one FLEET_CONTRACTS entry defines (its extensions checked too)."""
    return read_contract_file(spec).datasets


def contracts_in_force(extra_specs: str | None = None) -> ContractSet:
    """The Fleet datasets plus whatever FLEET_CONTRACTS names, in its order: each entry's
    datasets, then its extensions of any dataset defined so far (a shipped one too)."""
    contracts = FLEET_DATASETS
    for spec in filter(None, (s.strip() for s in (extra_specs or "").split(","))):
        loaded = read_contract_file(spec)
        contracts = extend(contracts.with_extra(loaded.datasets), loaded.extensions, spec)
    return contracts
