"""Decimal columns: exact from CSV, JSON lines and Parquet (no float round trip), values that
do not fit rejected with line, column and reason, bad specs refused at contract load."""

from __future__ import annotations

import io
import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleet_import.contracts.files import contract_from_dict
from fleet_import.contracts.model import Column, ContractError, DatasetContract
from tests.normalize_helpers import output, run

# The extremes of decimal(38,9): 29 digits before the point, 9 after.
LARGEST = Decimal("9" * 29 + "." + "9" * 9)
SMALLEST = Decimal("-" + "9" * 29 + "." + "9" * 9)  # not -LARGEST: the context rounds
TINIEST = Decimal("0.000000001")
EXACT_VALUES = [
    LARGEST,
    SMALLEST,
    TINIEST,
    -TINIEST,
    Decimal("0.000000000"),
    Decimal("12345678901234567890.123456789"),  # beyond a float's 17 digits
    Decimal("0.100000000"),  # 0.1: no binary float holds it
]

MONEY = DatasetContract(
    name="money",
    file_glob="money*",
    target_table="curated.money",
    natural_key=("id",),
    columns=(
        Column("id", "string", nullable=False),
        Column("amount", "decimal(38,9)"),
        Column("price", "decimal(12, 2)", min_value=0),
    ),
)


def _csv(rows: list[tuple[str, str, str]]) -> str:
    return "id,amount,price\n" + "".join(",".join(row) + "\n" for row in rows)


def _amounts(table: pa.Table) -> list[Decimal | None]:
    return table.column("amount").to_pylist()


def test_the_type_is_spelled_canonically() -> None:
    price = MONEY.columns[2]
    assert price.type == "decimal(12,2)" and price.decimal == (12, 2) and price.kind == "decimal"
    assert price.arrow_type == pa.decimal128(12, 2)
    assert Column("x", "DECIMAL( 12 ,2 )").type == "decimal(12,2)"
    assert MONEY.columns[0].decimal is None and MONEY.columns[0].kind == "string"


@pytest.mark.parametrize(
    ("spelled", "problem"),
    [
        ("decimal(39,2)", "precision 39 is outside 1..38"),
        ("decimal(0,0)", "precision 0 is outside 1..38"),
        ("decimal(10,-1)", "scale -1 is outside 0..10"),
        ("decimal(10,11)", "scale 11 is outside 0..10"),
        ("decimal(10)", "unknown type 'decimal(10)'"),
        ("decimal(a,b)", "unknown type 'decimal(a,b)'"),
        ("numeric(10,2)", "unknown type 'numeric(10,2)'"),
    ],
)
def test_bad_decimal_specs_are_refused_at_load_with_the_field_path(
    spelled: str, problem: str
) -> None:
    raw = {
        "name": "money",
        "file_glob": "money*",
        "target_table": "curated.money",
        "natural_key": ["id"],
        "columns": [{"name": "id", "type": "string"}, {"name": "amount", "type": spelled}],
    }
    with pytest.raises(ContractError) as refused:
        contract_from_dict(raw, "datasets[0]")
    assert str(refused.value).startswith("datasets[0] (money): columns[1].type: ")
    assert problem in str(refused.value)
    assert "decimal(p,s) with 1 <= p <= 38 and 0 <= s <= p" in str(
        pytest.raises(ContractError, Column, "x", "strng").value
    )


def test_csv_decimals_are_exact_at_the_extremes(tmp_path: Path) -> None:
    rows = [(f"r{i}", str(value), "1.50") for i, value in enumerate(EXACT_VALUES)]
    result = run(tmp_path, _csv(rows), name="money.csv", contract=MONEY)
    assert result.rejects == []
    table = output(result)
    assert table.schema.field("amount").type == pa.decimal128(38, 9)
    assert _amounts(table) == EXACT_VALUES
    assert table.column("price").to_pylist() == [Decimal("1.50")] * len(rows)


def test_csv_decimals_that_do_not_fit_are_rejected_with_line_column_and_reason(
    tmp_path: Path,
) -> None:
    rows = [
        ("ok", "1", "2.5"),
        ("places", "1.0000000001", "2"),  # line 3: ten places in a scale-9 column
        ("large", "1" + "0" * 29, "2"),  # line 4: 30 digits before the point
        ("word", "twelve", "2"),  # line 5
        ("price", "1", "1.005"),  # line 6: three places in a scale-2 column
        ("negative", "1", "-0.01"),  # line 7: below min_value 0
        ("zeros", " 2.500000000000 ", "3.10"),  # trailing zeros lose nothing
    ]
    result = run(tmp_path, _csv(rows), name="money.csv", contract=MONEY)
    found = [(r.line, r.column, r.reason, r.value) for r in result.rejects]
    assert found == [
        (
            3,
            "amount",
            "more than 9 decimal places (the column is decimal(38,9))",
            "1.0000000001",
        ),
        (
            4,
            "amount",
            "more than 29 digits before the decimal point (the column is decimal(38,9))",
            "1" + "0" * 29,
        ),
        (5, "amount", "not a valid decimal number", "twelve"),
        (6, "price", "more than 2 decimal places (the column is decimal(12,2))", "1.005"),
        (7, "price", "below minimum 0", "-0.01"),
    ]
    table = output(result)
    assert table.column("id").to_pylist() == ["ok", "zeros"]
    assert _amounts(table) == [Decimal(1), Decimal("2.5")]


def test_jsonl_decimals_are_exact_on_the_fast_and_the_line_by_line_path(tmp_path: Path) -> None:
    numbers = "".join(
        f'{{"id": "n{i}", "amount": {value}, "price": 1.25}}\n'
        for i, value in enumerate(EXACT_VALUES)
    )
    fast = run(tmp_path, numbers, name="money.jsonl", fmt="jsonl", contract=MONEY)
    assert fast.rejects == [] and _amounts(output(fast)) == EXACT_VALUES
    # A blank line sends the chunk down the line-by-line path, which reads numbers exactly too.
    slow = run(
        tmp_path,
        numbers + "\n" + '{"id": "s", "amount": "7.5", "price": 0.1}\n',
        name="money-slow.jsonl",
        fmt="jsonl",
        contract=MONEY,
    )
    assert slow.rejects == []
    table = output(slow)
    assert _amounts(table) == [*EXACT_VALUES, Decimal("7.5")]
    assert table.column("price").to_pylist()[-1] == Decimal("0.10")


def test_jsonl_decimals_that_do_not_fit_are_rejected(tmp_path: Path) -> None:
    lines = [
        {"id": "ok", "amount": 1, "price": 2},
        {"id": "places", "amount": 1, "price": 2.345},
    ]
    body = "".join(json.dumps(line) + "\n" for line in lines)
    result = run(tmp_path, body, name="money.jsonl", fmt="jsonl", contract=MONEY)
    assert [(r.line, r.column, r.reason) for r in result.rejects] == [
        (2, "price", "more than 2 decimal places (the column is decimal(12,2))")
    ]


def test_parquet_decimals_are_read_as_they_are(tmp_path: Path) -> None:
    table = pa.table(
        {
            "id": pa.array([f"p{i}" for i in range(len(EXACT_VALUES))]),
            "amount": pa.array(EXACT_VALUES, pa.decimal128(38, 9)),
            # Narrower decimals and integers widen exactly into the column's type.
            "price": pa.array([Decimal("1.5")] * len(EXACT_VALUES), pa.decimal128(5, 1)),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    result = run(tmp_path, sink.getvalue(), name="money.parquet", fmt="parquet", contract=MONEY)
    assert result.rejects == []
    typed = output(result)
    assert _amounts(typed) == EXACT_VALUES
    assert typed.column("price").type == pa.decimal128(12, 2)


def test_parquet_integers_become_decimals_exactly(tmp_path: Path) -> None:
    table = pa.table(
        {
            "id": ["a", "b", "c"],
            "amount": pa.array([2**63 - 1, -(2**63), 0], pa.int64()),
            "price": pa.array([12, 10**10, 7], pa.int64()),  # 10^10: 11 digits, one too many
        }
    )
    result = run(tmp_path, _parquet(table), name="money.parquet", fmt="parquet", contract=MONEY)
    assert [(r.line, r.column, r.reason) for r in result.rejects] == [
        (
            2,  # Parquet rows count from 1: there is no header line
            "price",
            "more than 10 digits before the decimal point (the column is decimal(12,2))",
        )
    ]
    typed = output(result)
    assert _amounts(typed) == [Decimal(2**63 - 1), Decimal(0)]
    assert typed.column("price").to_pylist() == [Decimal("12.00"), Decimal("7.00")]


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def test_parquet_decimals_that_do_not_fit_are_rejected_and_floats_refused(tmp_path: Path) -> None:
    wide = pa.table(
        {
            "id": ["fits", "places"],
            "amount": pa.array([Decimal("1.5"), Decimal("1.5")], pa.decimal128(10, 1)),
            "price": pa.array([Decimal("1.250"), Decimal("1.255")], pa.decimal128(10, 3)),
        }
    )
    sink = io.BytesIO()
    pq.write_table(wide, sink)
    result = run(tmp_path, sink.getvalue(), name="money.parquet", fmt="parquet", contract=MONEY)
    assert [(r.line, r.column, r.reason) for r in result.rejects] == [
        (2, "price", "more than 2 decimal places (the column is decimal(12,2))")
    ]
    assert output(result).column("price").to_pylist() == [Decimal("1.25")]

    floats = wide.set_column(2, "price", pa.array([1.25, 1.5]))
    sink = io.BytesIO()
    pq.write_table(floats, sink)
    with pytest.raises(Exception, match=r"price is double, expected decimal\(12,2\)"):
        run(tmp_path, sink.getvalue(), name="money-f.parquet", fmt="parquet", contract=MONEY)


def test_a_value_written_with_too_many_zeros_is_rejected_for_that(tmp_path: Path) -> None:
    padded = "1." + "0" * 40  # fits decimal(12,2) as 1.00, but no decimal128 parses it
    result = run(tmp_path, _csv([("z", "1", padded)]), name="money.csv", contract=MONEY)
    assert [(r.line, r.column, r.reason) for r in result.rejects] == [
        (2, "price", "more than 38 digits written (zeros included): not read exactly")
    ]
