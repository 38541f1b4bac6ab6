"""Every field of the contract format, given a value of the wrong kind in a contract file, is
refused with its field path (issue 25, part 5): the fields are read from the models, so a
field added later (a drift policy, `optional`) is checked without editing this test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet_import.contracts.files import load_contracts
from fleet_import.contracts.model import Column, ContractError, DatasetContract

DATASET = {
    "name": "tyres",
    "file_glob": "tyres*",
    "target_table": "curated.fleet_tyres",
    "natural_key": ["change_id"],
    "columns": [
        {"name": "change_id", "type": "string", "nullable": False},
        {"name": "tread_mm", "type": "float64"},
    ],
}
WRONG = {"a": ["mapping", "where", "no", "field", "takes", "one"]}
"""No field of either model takes a mapping but `profile_drift`, whose rules have no `a`."""


def _refusal(tmp_path: Path, dataset: dict[str, Any]) -> str:
    spec = tmp_path / "contracts.yaml"
    spec.write_text(yaml.safe_dump({"datasets": [DATASET, dataset]}), "utf-8")
    with pytest.raises(ContractError) as refused:
        load_contracts(str(spec))
    return str(refused.value)


def test_the_valid_base_loads(tmp_path: Path) -> None:
    spec = tmp_path / "contracts.yaml"
    spec.write_text(yaml.safe_dump({"datasets": [DATASET]}), "utf-8")
    assert [c.name for c in load_contracts(str(spec))] == ["tyres"]


@pytest.mark.parametrize("field", list(DatasetContract.model_fields))
def test_every_dataset_field_is_refused_with_its_path(tmp_path: Path, field: str) -> None:
    message = _refusal(tmp_path, {**DATASET, "name": "wheels", field: WRONG})
    where = "datasets[1]" if field == "name" else "datasets[1] (wheels)"
    assert message.startswith(f"{tmp_path / 'contracts.yaml'}: {where}: {field}")
    assert f"{field}: " in message or f"{field}.a: unknown field" in message


@pytest.mark.parametrize("field", list(Column.model_fields))
def test_every_column_field_is_refused_with_its_path(tmp_path: Path, field: str) -> None:
    columns = [DATASET["columns"][0], {**DATASET["columns"][1], field: WRONG}]
    message = _refusal(tmp_path, {**DATASET, "name": "wheels", "columns": columns})
    assert f"datasets[1] (wheels): columns[1].{field}: " in message


@pytest.mark.parametrize("model", [DatasetContract, Column])
def test_an_unknown_field_is_refused_with_its_path(tmp_path: Path, model: type) -> None:
    if model is Column:
        columns = [DATASET["columns"][0], {**DATASET["columns"][1], "nulable": True}]
        message = _refusal(tmp_path, {**DATASET, "name": "wheels", "columns": columns})
        assert "datasets[1] (wheels): columns[1].nulable: unknown field" in message
    else:
        message = _refusal(tmp_path, {**DATASET, "name": "wheels", "natural_keys": ["x"]})
        assert "datasets[1] (wheels): natural_keys: unknown field" in message


_SECOND = DATASET["columns"][1]


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"formats": ["csv", "xls"]}, "formats[1]: unknown format 'xls'"),
        ({"natural_key": ["change_id", 3]}, "natural_key[1]: invalid value 3 (expected text)"),
        ({"natural_key": ["nope"]}, "natural_key: natural key 'nope' is not a column"),
        ({"columns": [_SECOND, "x"]}, "columns[1]: invalid value 'x' (expected a mapping"),
        (
            {"columns": [_SECOND, {**_SECOND, "name": "b", "aliases": ["x", 2]}]},
            "columns[1].aliases[1]: invalid value 2 (expected text)",
        ),
        (
            {"columns": [_SECOND, {**_SECOND, "name": "b", "allowed": ["x", 2]}]},
            "columns[1].allowed[1]: invalid value 2 (expected text)",
        ),
        (
            {"columns": [_SECOND, {**_SECOND, "name": "b", "type": "decimal(12,-2)"}]},
            "columns[1].type: invalid type 'decimal(12,-2)': scale -2 is outside 0..12",
        ),
    ],
)
def test_a_bad_element_of_a_list_is_refused_with_its_index(
    tmp_path: Path, changes: dict[str, Any], problem: str
) -> None:
    message = _refusal(tmp_path, {**DATASET, "name": "wheels", **changes})
    assert f"datasets[1] (wheels): {problem}" in message
