"""The content gate's checks, column-wise (importing.gate_checks), against a row-by-row
reading of dbt's definitions, for any table (hypothesis); thresholds and declarations."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_import.contracts.checks import Check, Threshold
from fleet_import.contracts.files import contract_from_dict
from fleet_import.contracts.model import ContractError
from fleet_import.importing.gate_checks import evaluate

KEYS = st.one_of(st.none(), st.sampled_from(["a", "b", "c", "d"]))
NUMBERS = st.one_of(st.none(), st.integers(-5, 5))
ROWS = st.lists(st.tuples(KEYS, KEYS, NUMBERS), max_size=40)

DATASET = {
    "name": "things",
    "file_glob": "things*",
    "target_table": "curated.things",
    "natural_key": [],
    "columns": [
        {"name": "k", "type": "string"},
        {"name": "j", "type": "string"},
        {"name": "v", "type": "int64"},
    ],
}


def contract(*checks: dict):
    return contract_from_dict({**DATASET, "checks": list(checks)})


def figures(rows: list[tuple], parents: list[str], *checks: dict) -> list[int]:
    table = pa.table(
        {
            "k": pa.array([r[0] for r in rows], pa.string()),
            "j": pa.array([r[1] for r in rows], pa.string()),
            "v": pa.array([r[2] for r in rows], pa.int64()),
        }
    )
    tables = {"parents": pa.table({"k": pa.array(parents, pa.string())})}
    return [found.figure for found in evaluate(contract(*checks), table, tables)]


@settings(max_examples=150, deadline=None)
@given(ROWS, st.lists(st.sampled_from(["a", "b", "c"]), max_size=3))
def test_each_check_counts_the_rows_dbt_would_select(rows: list[tuple], parents: list[str]):
    pairs = Counter((k, j) for k, j, _ in rows if k is not None and j is not None)
    expected = [
        sum(1 for k, j, _ in rows if k is None or j is None),  # not_null k, j
        sum(1 for k, j, _ in rows if k is not None and j is not None and pairs[(k, j)] > 1),
        sum(1 for k, _, _ in rows if k is not None and k not in ("a", "b")),
        sum(1 for k, _, _ in rows if k is not None and k not in parents),
        sum(1 for _, _, v in rows if v is not None and not (v > -2 and v <= 3)),
        len(rows),
    ]
    assert (
        figures(
            rows,
            parents,
            {"type": "not_null", "columns": ["k", "j"]},
            {"type": "unique", "columns": ["k", "j"]},
            {"type": "accepted_values", "columns": ["k"], "values": ["a", "b"]},
            {"type": "relationships", "columns": ["k"], "to": "parents.k"},
            {"type": "expression", "expression": "v > -2 and v <= 3"},
            {"type": "row_count", "error_if": "< 1"},
        )
        == expected
    )


def test_a_relationship_to_a_dataset_the_delivery_lacks_is_skipped_and_says_why() -> None:
    table = pa.table({"k": ["a"], "j": ["b"], "v": [1]})
    check = {"type": "relationships", "columns": ["k"], "to": "vehicles.vehicle_id"}
    (found,) = evaluate(contract(check), table, {})
    assert found.outcome == "skipped"
    assert found.detail == "vehicles is not in this delivery: nothing to compare with"


@pytest.mark.parametrize(
    ("text", "figure", "rows", "breached"),
    [
        ("> 0", 1, 100, True),
        ("> 0", 0, 100, False),
        ("> 5%", 5, 100, False),
        ("> 5%", 6, 100, True),
        (">= 5%", 5, 100, True),
        ("< 10", 9, 0, True),
    ],
)
def test_thresholds_count_or_take_a_share_of_the_rows(
    text: str, figure: int, rows: int, breached: bool
) -> None:
    assert Threshold.parse(text).breached(figure, rows) is breached


def test_warn_below_error_and_the_default_error() -> None:
    check = Check(type="not_null", columns=("k",), warn_if="> 0", error_if="> 50%")
    table = pa.table({"k": [None, "a", "b", "c"], "j": ["x"] * 4, "v": [1] * 4})
    (found,) = evaluate(contract(check.model_dump()), table, {})
    assert (found.outcome, found.figure_text) == ("warn", "1 rows (25%)")
    assert found.threshold_text == "warn_if > 0, error_if > 50%"
    assert Check(type="not_null", columns=("k",)).thresholds()[1] == Threshold.parse("> 0")


@pytest.mark.parametrize(
    ("check", "named"),
    [
        ({"type": "unique", "columns": ["nope"]}, "unique(nope): no such column nope"),
        ({"type": "not_null"}, "not_null: name its columns"),
        ({"type": "relationships", "columns": ["k"], "to": "x"}, "`to` must be dataset.column"),
        ({"type": "expression", "expression": "v >> 1"}, "invalid expression clause 'v >> 1'"),
        ({"type": "row_count", "error_if": "lots"}, "invalid threshold 'lots'"),
        ({"type": "nonsense"}, "checks[0].type"),
        ({"type": "unique", "columns": ["k"], "eror_if": "> 0"}, "did you mean 'error_if'"),
    ],
)
def test_a_wrong_check_is_refused_when_the_contract_loads(check: dict, named: str) -> None:
    with pytest.raises(ContractError) as refused:
        contract(check)
    assert named in str(refused.value)
    assert str(refused.value).startswith("dataset (things): checks")


@settings(max_examples=100, deadline=None)
@given(ROWS, st.lists(st.integers(0, 40), max_size=4))
def test_a_profile_built_file_by_file_is_the_whole_tables(rows: list[tuple], cuts: list[int]):
    """The gate profiles a dataset one file at a time: any split of its rows into files gives
    the profile of the whole (sums of integers exact, so equal, in any order)."""
    from fleet_import.importing.profile import ProfileBuilder, profile_table

    table = pa.table(
        {
            "k": pa.array([r[0] for r in rows], pa.string()),
            "j": pa.array([r[1] for r in rows], pa.string()),
            "v": pa.array([r[2] for r in rows], pa.int64()),
        }
    )
    things = contract()
    builder = ProfileBuilder(things)
    bounds = sorted({0, len(rows), *(min(c, len(rows)) for c in cuts)})
    for start, end in zip(bounds, bounds[1:], strict=False):
        builder.add(table.slice(start, end - start))
    assert builder.profile() == profile_table(table, things)
