"""Column aliases: a renamed export keeps loading through a column's earlier header names,
matched trimmed and in any case, and the alias that matched is recorded; CSV, JSON lines
and Parquet headers."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleet_import.contracts.files import contract_from_dict
from fleet_import.contracts.model import Column, ContractError, DatasetContract
from fleet_import.normalize.rows import FileRejected
from tests.normalize_helpers import output, run

PAYMENTS = DatasetContract(
    name="payments",
    file_glob="payments*",
    target_table="curated.payments",
    natural_key=("payment_id",),
    columns=(
        Column("payment_id", "string", nullable=False, aliases=("id",)),
        Column("total_amount", "decimal(12,2)", aliases=("totalAmount", " total ")),
        Column("currency", "string"),
    ),
)


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def test_a_renamed_csv_header_loads_through_its_aliases(tmp_path: Path) -> None:
    body = " ID ,TOTALAMOUNT,currency\nP1,12.50,EUR\nP2,3,EUR\n"
    result = run(tmp_path, body, name="payments.csv", contract=PAYMENTS)
    assert result.rejects == []
    assert result.aliases == {"payment_id": "ID", "total_amount": "TOTALAMOUNT"}
    table = output(result)
    assert table.column_names[:3] == ["payment_id", "total_amount", "currency"]
    assert table.column("payment_id").to_pylist() == ["P1", "P2"]
    assert [str(v) for v in table.column("total_amount").to_pylist()] == ["12.50", "3.00"]


def test_names_load_as_before_and_record_no_alias(tmp_path: Path) -> None:
    body = "payment_id,total_amount,currency\nP1,1,EUR\n"
    result = run(tmp_path, body, name="payments.csv", contract=PAYMENTS)
    assert result.rejects == [] and result.aliases == {}


def test_a_name_and_its_alias_both_present_reject_the_file(tmp_path: Path) -> None:
    body = "payment_id,id,total_amount,currency\nP1,P1,1,EUR\n"
    with pytest.raises(FileRejected, match="repeated columns: payment_id/id"):
        run(tmp_path, body, name="payments.csv", contract=PAYMENTS)
    # An unknown header still rejects the file, naming it.
    with pytest.raises(FileRejected, match="unexpected columns: amount"):
        run(tmp_path, "id,amount,currency\nP1,1,EUR\n", name="payments.csv", contract=PAYMENTS)


def test_jsonl_keys_match_aliases(tmp_path: Path) -> None:
    body = (
        '{"id": "P1", "totalAmount": 12.5, "currency": "EUR"}\n'
        '{"payment_id": "P2", "Total": 1.25, "currency": "EUR"}\n'
        '{"id": "P3", "payment_id": "P3", "currency": "EUR"}\n'
    )
    result = run(tmp_path, body, name="payments.jsonl", fmt="jsonl", contract=PAYMENTS)
    assert [(r.line, r.column, r.reason) for r in result.rejects] == [
        (3, "payment_id", "field 'payment_id' given twice (by its name and an alias)")
    ]
    assert result.aliases == {"payment_id": "id", "total_amount": "totalAmount"}
    table = output(result)
    assert table.column("payment_id").to_pylist() == ["P1", "P2"]
    assert [str(v) for v in table.column("total_amount").to_pylist()] == ["12.50", "1.25"]


def test_parquet_columns_match_aliases(tmp_path: Path) -> None:
    table = pa.table({"Id": ["P1"], "currency": ["EUR"], "totalamount": ["7.10"]})
    result = run(
        tmp_path, _parquet(table), name="payments.parquet", fmt="parquet", contract=PAYMENTS
    )
    assert result.rejects == []
    assert result.aliases == {"payment_id": "Id", "total_amount": "totalamount"}
    assert output(result).column("payment_id").to_pylist() == ["P1"]


def test_aliases_load_from_yaml_and_keep_the_contract_version() -> None:
    raw = {
        "name": "payments",
        "file_glob": "payments*",
        "target_table": "curated.payments",
        "natural_key": ["payment_id"],
        "columns": [
            {"name": "payment_id", "type": "string", "aliases": ["id"]},
            {"name": "total_amount", "type": "decimal(12,2)"},
        ],
    }
    with_alias = contract_from_dict(raw)
    assert with_alias.columns[0].aliases == ("id",)
    without = contract_from_dict(
        {**raw, "columns": [{"name": "payment_id", "type": "string"}, raw["columns"][1]]}
    )
    # Aliases decide whether a header matches, not what a loaded file holds: the cache stays.
    assert with_alias.contract_version == without.contract_version


@pytest.mark.parametrize(
    ("aliases", "problem"),
    [
        ({"a": ["x"], "b": ["X"]}, "aliases that name more than one column: x"),
        ({"a": ["b"]}, "aliases that name more than one column: b"),
        ({"a": [" "]}, "an alias is empty"),
        ({"a": "x"}, "columns[0].aliases: invalid value 'x' (expected a list)"),
    ],
)
def test_ambiguous_aliases_are_refused_at_load(aliases: dict[str, object], problem: str) -> None:
    raw = {
        "name": "pairs",
        "file_glob": "pairs*",
        "target_table": "curated.pairs",
        "natural_key": ["a"],
        "columns": [
            {
                "name": name,
                "type": "string",
                **({"aliases": aliases[name]} if name in aliases else {}),
            }
            for name in ("a", "b")
        ],
    }
    with pytest.raises(ContractError, match="^datasets\\[0\\] \\(pairs\\): ") as refused:
        contract_from_dict(raw, "datasets[0]")
    assert problem in str(refused.value)
