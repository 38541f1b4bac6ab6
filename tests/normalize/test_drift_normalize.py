"""Normalizing files whose columns drifted from their contract (issue #25, part 1): the
columns beyond it are found and typed, left out of the output, or rejected by policy; an
optional column a file lacks is NULL. No server needed."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleet_import.contracts.drift import DriftConflict, evolved, new_columns, type_from_arrow
from fleet_import.contracts.model import Column, DatasetContract
from fleet_import.normalize.file import normalize_file
from fleet_import.normalize.rows import FileRejected

READINGS = DatasetContract(
    name="readings",
    file_glob="readings*",
    target_table="curated.readings",
    natural_key=("id",),
    columns=(Column("id", "string", nullable=False), Column("note", "string", optional=True)),
)


def under(policy: str, **update) -> DatasetContract:
    return READINGS.model_copy(update={"on_new_columns": policy, **update})


def normalize(tmp_path: Path, contract: DatasetContract, fmt: str, data: bytes | str):
    source = data if isinstance(data, str) else io.BytesIO(data)
    file = normalize_file(
        source, source_key=f"k.{fmt}", fmt=fmt, contract=contract, out_path=tmp_path / "out.pq"
    )
    return file, pq.read_table(file.parquet_path).to_pylist()


def test_csv_extra_columns_are_reported_not_loaded_and_keep_non_blank_rows(tmp_path) -> None:
    file, rows = normalize(tmp_path, under("ignore"), "csv", b"id,co2,Plate No\n1,5,x\n,6,\n,,\n")
    assert file.extra_columns == {"co2": "string", "Plate No": "string"}
    # Line 3 holds a value only in an ignored column: a row (rejected: id is required),
    # never a blank line dropped uncounted; line 4 is blank.
    assert [(r["id"], r["note"], r["_source_line"]) for r in rows] == [("1", None, 2)]
    assert [(r.line, r.column) for r in file.rejects] == [(3, "id")]


def test_reject_refuses_extra_columns_and_a_missing_required_one(tmp_path) -> None:
    with pytest.raises(FileRejected, match="unexpected columns: co2"):
        normalize(tmp_path, READINGS, "csv", b"id,co2\n1,5\n")
    with pytest.raises(FileRejected, match="missing columns: id$"):
        normalize(tmp_path, under("ignore"), "csv", b"note,co2\n1,5\n")


def test_jsonl_unknown_keys_under_ignore_and_reject(tmp_path) -> None:
    file, rows = normalize(tmp_path, under("ignore"), "jsonl", b'{"id": "1", "co2": 5}\n')
    assert file.extra_columns == {"co2": "string"} and rows[0]["id"] == "1"
    file, rows = normalize(tmp_path, READINGS, "jsonl", b'{"id": "1", "co2": 5}\n')
    assert rows == [] and file.rejects[0].reason == "unexpected field"


def test_parquet_new_columns_are_typed_from_the_schema(tmp_path) -> None:
    table = pa.table(
        {
            "id": ["a"],
            "litres": pa.array([1.5], pa.float32()),
            "cost": pa.array([1], pa.decimal128(9, 2)),
            "seen": pa.array([0], pa.timestamp("us")),  # no zone: no contract type
        }
    )
    pq.write_table(table, tmp_path / "in.parquet")
    file, _ = normalize(tmp_path, under("ignore"), "parquet", str(tmp_path / "in.parquet"))
    assert file.extra_columns == {"litres": "float64", "cost": "decimal(9,2)", "seen": "string"}
    with pytest.raises(FileRejected, match="'seen': its type has no contract type"):
        normalize(tmp_path, under("evolve"), "parquet", str(tmp_path / "in.parquet"))
    assert type_from_arrow(pa.dictionary(pa.int8(), pa.string())) == "string"


def test_evolve_refuses_a_new_column_that_is_no_identifier(tmp_path) -> None:
    with pytest.raises(FileRejected, match="new columns cannot be added.*'Plate No'"):
        normalize(tmp_path, under("evolve"), "csv", b"id,Plate No\n1,x\n")


def test_an_evolved_contract_loads_the_values_typed_and_a_new_version(tmp_path) -> None:
    contract = under("evolve", new_column_type="int64")
    grown = evolved(contract, {"co2": "int64"})
    assert grown.column_names == ["id", "note", "co2"] and grown.evolved_columns == ("co2",)
    assert grown.contract_version != contract.contract_version
    assert evolved(grown, {"co2": "int64"}) is grown  # nothing new: the same contract
    file, rows = normalize(tmp_path, grown, "csv", b"id,co2\n1,5\n2,x\n")
    assert file.extra_columns == {}
    assert [(r["id"], r["co2"]) for r in rows] == [("1", 5)]
    assert [(r.line, r.column, r.reason) for r in file.rejects] == [
        (3, "co2", "not a valid integer")
    ]
    file, rows = normalize(tmp_path, grown, "csv", b"id\n1\n")  # an older file: NULL
    assert rows[0]["co2"] is None


def test_new_columns_of_a_delivery_in_name_order_and_conflicting_types() -> None:
    found = [("a.csv", {"zeta": "string", "alpha": "int64"}), ("b.csv", {"id": "string"})]
    assert list(new_columns(READINGS, found)) == ["alpha", "zeta"]
    with pytest.raises(DriftConflict, match="'alpha' is int64 in a.csv but string in c.pq"):
        new_columns(READINGS, [*found, ("c.pq", {"alpha": "string"})])


def test_the_drift_keys_at_their_defaults_leave_versions_alone() -> None:
    plain = READINGS.model_copy(
        update={"columns": (Column("id", "string", nullable=False), Column("note", "string"))}
    )
    assert plain.model_copy(update={"on_new_columns": "reject"}).contract_version == (
        plain.contract_version
    )
    assert READINGS.contract_version != plain.contract_version  # optional shapes the output
