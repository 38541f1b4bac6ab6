"""warehouse.shape without a database: how each difference between a table and its contract
is planned (in place, deep copy, refused) and which rows the cast check finds, as SQL."""

from __future__ import annotations

import pytest

from fleet_import.contracts.model import Column, DatasetContract
from fleet_import.warehouse.shape import TableColumn, invalid_predicate, plan_table

CONTRACT = DatasetContract(
    name="ledger",
    file_glob="ledger*",
    target_table="curated.ledger",
    natural_key=("id",),
    columns=(
        Column("id", "string", nullable=False, max_length=8),
        Column("amount", "decimal(12,2)", nullable=False),
        Column("note", "string"),
    ),
)
STAMPS = [
    TableColumn("tenant_id", "character varying(256)"),
    TableColumn("source_scope", "character varying(1024)"),
    TableColumn("ingestion_batch_id", "character varying(36)"),
]
EXPECTED = [
    TableColumn("id", "character varying(32)"),
    TableColumn("amount", "numeric(12,2)"),
    TableColumn("note", "character varying(65535)"),
    *STAMPS,
]


def _widens(has: TableColumn, wants: TableColumn) -> bool:
    """Redshift's rule: only a wider VARCHAR changes in place."""
    return (
        has.type.startswith("character varying(")
        and wants.type.startswith("character varying(")
        and int(has.type[18:-1]) < int(wants.type[18:-1])
    )


def _plan(found: list[TableColumn]):  # type: ignore[no-untyped-def]
    return plan_table(CONTRACT, found, EXPECTED, in_place=_widens)


def test_a_matching_or_missing_table_needs_nothing() -> None:
    assert _plan(EXPECTED).state == "matches" and _plan(EXPECTED).method is None
    assert _plan([]).state == "missing" and _plan([]).method is None


def test_float_to_decimal_is_a_deep_copy_and_a_wider_varchar_in_place() -> None:
    found = [TableColumn("id", "character varying(16)"), TableColumn("amount", "double precision")]
    plan = _plan([*found, EXPECTED[2], *STAMPS])
    assert [(c.column, c.how) for c in plan.changes] == [
        ("id", "in place"),
        ("amount", "deep copy"),
    ]
    assert plan.method == "deep copy"
    widened = _plan([found[0], *EXPECTED[1:]])
    assert widened.method == "in place"


def test_added_reordered_dropped_and_unconvertible_columns() -> None:
    added = _plan([EXPECTED[0], EXPECTED[1], *STAMPS])
    assert [(c.column, c.how, c.reason) for c in added.changes] == [
        ("note", "deep copy", "added, as NULL")
    ]
    reordered = _plan([EXPECTED[1], EXPECTED[0], *EXPECTED[2:]])
    assert reordered.changes == () and reordered.reordered and reordered.method == "deep copy"
    dropped = _plan([*EXPECTED[:3], TableColumn("extra", "bigint"), *STAMPS])
    assert dropped.method == "refused"
    assert "its values would be lost" in dropped.spelled()
    text = _plan([EXPECTED[0], TableColumn("amount", "character varying(20)"), *EXPECTED[2:]])
    assert [(c.column, c.how) for c in text.changes] == [("amount", "refused")]
    assert "no cast from character varying(20) to numeric(12,2)" in text.spelled()
    stamp = _plan([*EXPECTED[:5], TableColumn("ingestion_batch_id", "uuid")])
    assert stamp.method == "refused" and "a stamp column" in stamp.spelled()


@pytest.mark.parametrize(
    ("column", "has", "wants", "max_bytes", "predicate"),
    [
        (
            Column("a", "decimal(12,2)", nullable=False),
            "double precision",
            "numeric(12,2)",
            None,
            '("a" IS NOT NULL AND NOT (ABS("a") < 9999999999.995)) OR "a" IS NULL',
        ),
        (
            Column("a", "decimal(5,5)"),
            "numeric(10,2)",
            "numeric(5,5)",
            None,
            '"a" IS NOT NULL AND NOT (ABS("a") < 0.999995)',
        ),
        (
            Column("a", "int64"),
            "double precision",
            "bigint",
            None,
            '"a" IS NOT NULL AND NOT ("a" = ROUND("a") AND ABS("a") < 9223372036854775807)',
        ),
        (Column("a", "float64"), "bigint", "double precision", None, "FALSE"),
        (Column("a", "string"), "bigint", "text", None, "FALSE"),
        (
            Column("a", "string", max_length=2),
            "character varying(65535)",
            "character varying(8)",
            8,
            'OCTET_LENGTH(CAST("a" AS VARCHAR(65535))) > 8',
        ),
        (Column("a", "bool", nullable=False), "boolean", "boolean", None, '"a" IS NULL'),
        (Column("a", "int64"), "text", "bigint", None, None),
        (Column("a", "bool"), "timestamp with time zone", "boolean", None, None),
    ],
)
def test_the_rows_a_cast_would_not_carry(
    column: Column, has: str, wants: str, max_bytes: int | None, predicate: str | None
) -> None:
    assert invalid_predicate('"a"', has, column, wants, max_bytes) == predicate
