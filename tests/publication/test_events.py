"""`fail_and_tell` is the one way a batch fails: outside the store, every call that marks a
batch failed is the `mark` of a `fail_and_tell`, so every failure is told alike (after the
store says so, never raising)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAILING = {"mark_failed", "mark_publication_expired"}
"""The store's writes that end a batch failed."""


def _failing_calls_outside_fail_and_tell(tree: ast.AST) -> list[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "fail_and_tell":
            inside.update(id(inner) for inner in ast.walk(node))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", None) in FAILING
        and id(node) not in inside
    ]


def test_every_batch_failure_outside_the_store_goes_through_fail_and_tell() -> None:
    checked = 0
    wrong = []
    for root in ("fleet_import", "flows", "fleet_cli"):
        for path in sorted((REPO / root).rglob("*.py")):
            if path.is_relative_to(REPO / "fleet_import" / "store"):
                continue
            source = path.read_text(encoding="utf-8")
            checked += sum(source.count(name) for name in FAILING)
            tree = ast.parse(source)
            wrong += [
                f"{path.relative_to(REPO)}:{line}"
                for line in _failing_calls_outside_fail_and_tell(tree)
            ]
    assert checked > 0, "no failing write found: the names above are stale"
    assert not wrong, "marks a batch failed outside fail_and_tell:\n" + "\n".join(wrong)


def test_the_check_finds_a_direct_failure() -> None:
    tree = ast.parse(
        "repo.mark_failed(b, o, k, e)\n"
        "fail_and_tell(events, lambda: repo.mark_failed(b, o, k, e), k, e)\n"
    )
    assert _failing_calls_outside_fail_and_tell(tree) == [1]
