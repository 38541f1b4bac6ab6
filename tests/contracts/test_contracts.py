"""Dataset contracts as pydantic models: a bad contract file is refused with the field path
that is wrong, and the shipped contracts keep the versions that key the normalized cache."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet_import.contracts.files import contract_from_dict, load_contracts
from fleet_import.contracts.fleet import FLEET_DATASETS, TRIPS
from fleet_import.contracts.model import Column, ContractError, DatasetContract
from fleet_import.errors import InvalidInput

# Before contracts became pydantic models; the normalized-file cache is keyed by these.
SHIPPED_VERSIONS = {
    "vehicles": "1-5cdfb81d36aa",
    "trips": "1-8b8b96f0de8a",
    # 2: total_amount and price_per_litre became decimals (was "1-6befe20924ea").
    "fuel_transactions": "2-ec0579e5a2fe",
}


# As a user writes it, in YAML.
TYRES = """
name: tyres
file_glob: "tyres*"
target_table: curated.fleet_tyres
natural_key: [change_id]
columns:
  - {name: change_id, type: string, nullable: false}
  - {name: vehicle_id, type: string}
  - {name: changed_at, type: timestamptz}
  - {name: tread_mm, type: float64, min_value: 0}
"""


def _tyres(**changes: Any) -> dict[str, Any]:
    return {**yaml.safe_load(TYRES), **changes}


def _with_column(**column: Any) -> dict[str, Any]:
    """Tyres whose fourth column (columns[3]) is `column`."""
    raw = _tyres()
    raw["columns"][3] = column
    return raw


def _refusal(tmp_path: Path, second: Any) -> str:
    """The message for a contract file whose second dataset is `second`."""
    spec = tmp_path / "contracts.yaml"
    spec.write_text(yaml.safe_dump({"datasets": [_tyres(name="wheels"), second]}), "utf-8")
    with pytest.raises(ContractError) as refused:
        load_contracts(str(spec))
    return str(refused.value)


def test_shipped_contract_versions_are_unchanged() -> None:
    assert {name: c.contract_version for name, c in FLEET_DATASETS.items()} == SHIPPED_VERSIONS


def test_numbers_are_kept_as_written_so_user_contract_versions_hold(tmp_path: Path) -> None:
    spec = tmp_path / "contracts.yaml"
    raw = _tyres(version=2, max_reject_ratio=0)
    spec.write_text(yaml.safe_dump({"datasets": [raw]}), "utf-8")
    (loaded,) = load_contracts(str(spec))
    assert loaded.version == 2 and loaded.max_reject_ratio == 0
    assert isinstance(loaded.max_reject_ratio, int)
    assert isinstance(loaded.columns[3].min_value, int)
    assert loaded.contract_version == "2-bd708bfc3ccf"  # what the dataclasses computed


def test_a_good_file_loads_lists_as_tuples(tmp_path: Path) -> None:
    spec = tmp_path / "contracts.yaml"
    spec.write_text(yaml.safe_dump([_tyres()]), "utf-8")
    (tyres,) = load_contracts(str(spec))
    assert tyres.natural_key == ("change_id",) and tyres.formats[0] == "csv"
    assert tyres.column_names == ["change_id", "vehicle_id", "changed_at", "tread_mm"]
    assert tyres.arrow_schema.field("change_id").nullable is False


def test_unknown_type(tmp_path: Path) -> None:
    message = _refusal(tmp_path, _with_column(name="tread_mm", type="strng"))
    assert message.startswith(
        f"{tmp_path / 'contracts.yaml'}: datasets[1] (tyres): columns[3].type: "
        "unknown type 'strng' (one of bool, date, float64, int64, string, timestamptz)"
    )


def test_bad_identifier(tmp_path: Path) -> None:
    message = _refusal(tmp_path, _with_column(name="Tread mm", type="float64"))
    assert "datasets[1] (tyres): columns[3].name: invalid column name 'Tread mm'" in message
    message = _refusal(tmp_path, _tyres(target_table="curated.x; drop table y"))
    assert "datasets[1] (tyres): target_table: invalid target table 'x; drop table y'" in message


def test_misspelt_key(tmp_path: Path) -> None:
    message = _refusal(tmp_path, _with_column(name="tread_mm", type="float64", nulable=True))
    assert "datasets[1] (tyres): columns[3].nulable: unknown field (did you mean 'nullable'?)" in (
        message
    )
    message = _refusal(tmp_path, _tyres(natual_key=["change_id"]))
    assert "datasets[1] (tyres): natual_key: unknown field (did you mean 'natural_key'?)" in message


def test_a_misspelt_top_level_key_is_not_an_empty_file(tmp_path: Path) -> None:
    spec = tmp_path / "contracts.yaml"
    spec.write_text(yaml.safe_dump({"dataset": [_tyres()]}), "utf-8")
    with pytest.raises(ContractError, match=r"contracts.yaml: dataset: unknown field"):
        load_contracts(str(spec))


def test_missing_required_field(tmp_path: Path) -> None:
    message = _refusal(tmp_path, _with_column(name="tread_mm"))
    assert "datasets[1] (tyres): columns[3].type: required, but missing" in message
    raw = _tyres()
    del raw["target_table"]
    assert "datasets[1] (tyres): target_table: required, but missing" in _refusal(tmp_path, raw)


@pytest.mark.parametrize(
    ("ratio", "problem"),
    [
        (1.5, "must be within 0..1, not 1.5"),
        (-0.1, "must be within 0..1, not -0.1"),
        ("5%", "invalid value '5%' (expected a number)"),
        (True, "invalid value True (expected a number)"),
    ],
)
def test_bad_max_reject_ratio(tmp_path: Path, ratio: Any, problem: str) -> None:
    message = _refusal(tmp_path, _tyres(max_reject_ratio=ratio))
    assert f"datasets[1] (tyres): max_reject_ratio: {problem}" in message


def test_wrong_nesting(tmp_path: Path) -> None:
    as_mapping = _tyres(columns={"change_id": {"type": "string"}})
    assert "datasets[1] (tyres): columns: invalid value {'change_id': {'type': 'string'}} " in (
        _refusal(tmp_path, as_mapping)
    )
    names_only = _tyres(columns=["change_id", "tread_mm"])
    assert "datasets[1] (tyres): columns[0]: invalid value 'change_id' (expected a mapping" in (
        _refusal(tmp_path, names_only)
    )
    column_keys_on_the_dataset = _tyres(type="string")
    assert "datasets[1] (tyres): type: unknown field (one of name, file_glob, columns," in (
        _refusal(tmp_path, column_keys_on_the_dataset)
    )
    assert "datasets[1]: invalid value 'tyres' (expected a mapping" in _refusal(tmp_path, "tyres")


def test_every_mistake_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    spec = tmp_path / "contracts.yaml"
    bad = [_tyres(name="a", required="no"), _tyres(name="b", formats=["csv", "xls"])]
    spec.write_text(yaml.safe_dump({"datasets": bad}), "utf-8")
    with pytest.raises(ContractError) as refused:
        load_contracts(str(spec))
    assert str(refused.value) == (
        f"{spec}: datasets[0] (a): required: invalid value 'no' (expected true or false); "
        "datasets[1] (b): formats[1]: unknown format 'xls' (one of csv, csv.gz, jsonl, parquet)"
    )


def test_a_file_that_is_not_yaml(tmp_path: Path) -> None:
    spec = tmp_path / "contracts.yaml"
    spec.write_text("datasets: [\n", "utf-8")
    with pytest.raises(ContractError, match=r"contracts.yaml: not valid YAML"):
        load_contracts(str(spec))


def test_module_contracts_name_the_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "site_contracts.py").write_text(
        f"DATASETS = [{_tyres()!r}, {_tyres(name='wheels', natural_key=['nope'])!r}]\n", "utf-8"
    )
    with pytest.raises(ContractError) as refused:
        load_contracts("site_contracts")
    assert str(refused.value) == (
        "site_contracts: DATASETS[1] (wheels): natural_key: natural key 'nope' is not a column"
    )
    (tmp_path / "built_contracts.py").write_text(
        "from fleet_import.contracts.model import Column\nCOLUMN = Column('x', 'strng')\n", "utf-8"
    )
    monkeypatch.delitem(sys.modules, "built_contracts", raising=False)
    with pytest.raises(ContractError, match=r"^built_contracts: column \(x\): type: unknown"):
        load_contracts("built_contracts")


def test_contracts_built_in_python() -> None:
    positional = Column("k", "string", False, None, ("a",), 8)
    assert positional == Column(
        name="k", type="string", nullable=False, allowed=["a"], max_length=8
    )
    with pytest.raises(ContractError, match=r"^column \(k\): type: unknown type 'text'"):
        Column("k", "text")
    with pytest.raises(TypeError):
        Column("k", "string", name="j")
    with pytest.raises(ContractError) as refused:
        DatasetContract(
            name="x",
            file_glob="x*",
            target_table="curated.x",
            natural_key=("k",),
            columns=(Column("k", "string"), Column("k", "int64")),
        )
    assert str(refused.value) == "dataset (x): columns: duplicate column names: k"
    assert isinstance(refused.value, InvalidInput)
    with pytest.raises(ValueError, match="frozen"):
        TRIPS.name = "journeys"  # type: ignore[misc]


def test_contract_from_dict_names_the_field() -> None:
    with pytest.raises(ContractError, match=r"^dataset \(tyres\): columns\[3\]\.max_length: "):
        contract_from_dict(_with_column(name="tread_mm", type="float64", max_length="64"))


@pytest.mark.parametrize(
    ("column", "problem"),
    [
        (
            {"max_length": 16384},
            "columns[0].max_length: 16384 characters may take 65536 bytes in UTF-8, more than a "
            "Redshift VARCHAR holds (65535 bytes): use at most 16383, or leave max_length out",
        ),
        ({"max_length": 0}, "columns[0].max_length: must be at least 1, not 0"),
        ({"allowed": []}, "columns[0].allowed: no allowed values: every row would be rejected"),
        (
            {"allowed": ["ok", "é" * 32768]},
            "columns[0].allowed: allowed value 'éééééééééééééééééééé'... takes 65536 bytes in "
            "UTF-8, more than a Redshift VARCHAR holds (65535 bytes)",
        ),
    ],
)
def test_a_width_no_redshift_varchar_holds_is_refused_at_load(
    tmp_path: Path, column: dict[str, Any], problem: str
) -> None:
    raw = _tyres()
    raw["columns"][0].update(column)
    assert f"datasets[1] (tyres): {problem}" in _refusal(tmp_path, raw)


def test_string_widths_are_utf8_bytes() -> None:
    assert Column("a", "string").max_bytes == 65535
    assert Column("a", "string", max_length=16383).max_bytes == 65532
    assert Column("a", "string", allowed=("ok", "übel")).max_bytes == 5
    assert Column("a", "string", allowed=("long enough",), max_length=2).max_bytes == 8


def test_drift_keys_are_validated_with_their_field_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #25: on_new_columns, new_column_type and optional, in YAML and in a module."""
    (evolving,) = [contract_from_dict(_tyres(on_new_columns="evolve", new_column_type="int64"))]
    assert (evolving.on_new_columns, evolving.new_column_type) == ("evolve", "int64")
    assert evolving.contract_version != contract_from_dict(_tyres()).contract_version
    message = _refusal(tmp_path, _tyres(on_new_columns="sometimes"))
    assert message.endswith(
        "datasets[1] (tyres): on_new_columns: unknown drift policy 'sometimes' "
        "(one of evolve, ignore, reject, review)"
    ), message
    message = _refusal(tmp_path, _tyres(new_column_type="varchar(256)"))
    assert "datasets[1] (tyres): new_column_type: unknown type 'varchar(256)'" in message
    message = _refusal(
        tmp_path,
        _with_column(name="tread_mm", type="float64", nullable=False, optional=True),
    )
    assert "datasets[1] (tyres): columns[3].optional: an optional column must be nullable" in (
        message
    )
    message = _refusal(tmp_path, _tyres(evolved_columns=["tread_mm"]))
    assert "datasets[1] (tyres): evolved_columns: set by the `evolve` drift policy" in message

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "drift_contracts.py").write_text(
        f"DATASETS = [{_tyres(on_new_columns='discard')!r}]\n", "utf-8"
    )
    with pytest.raises(ContractError) as refused:
        load_contracts("drift_contracts")
    assert str(refused.value).startswith(
        "drift_contracts: DATASETS[0] (tyres): on_new_columns: unknown drift policy 'discard'"
    )
    with pytest.raises(ContractError, match=r"^column \(k\): optional: an optional column"):
        Column("k", "string", nullable=False, optional=True)
