"""The batch record (`fleet_import.store.details`): every key declared once, the JSON on disk
what earlier versions wrote, any stored row readable by every view."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_import.errors import DetailsInvalid
from fleet_import.store.batch_state import (
    committed_answer,
    hold_of,
    review_line,
    review_state,
    shown_status,
)
from fleet_import.store.details import BatchDetails, FailureKind
from tests.helpers import stored_batch

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_UNDECLARED = st.text(min_size=1, max_size=10).filter(lambda k: k not in BatchDetails.model_fields)


def test_a_patch_names_only_declared_keys_and_checks_their_types() -> None:
    with pytest.raises(TypeError, match="declare no rows_loaded"):
        BatchDetails.patch(rows_loaded=3)
    with pytest.raises(DetailsInvalid, match="resumes"):
        BatchDetails.patch(resumes="twice")


@given(extra=st.dictionaries(_UNDECLARED, _JSON, max_size=4))
def test_a_stored_row_keeps_what_this_version_does_not_know(extra: dict[str, Any]) -> None:
    """A newer writer's keys survive a round trip through this reader."""
    stored = BatchDetails.parse({"version": 1, **extra}).to_json()
    assert {k: stored[k] for k in extra} == extra


@given(
    fields=st.fixed_dictionaries(
        {},
        optional={
            "resumes": st.integers(0, 5),
            "superseded_by": st.uuids().map(str),
            "approves": st.uuids().map(str),
            "commit_attempted": st.booleans(),
            "rollback_replaced": st.none() | st.uuids().map(str),
            "row_counts": st.dictionaries(st.sampled_from(["trips", "fuel"]), st.integers(0, 9)),
        },
    )
)
def test_a_patch_writes_exactly_what_it_is_given(fields: dict[str, Any]) -> None:
    """No default is filled in: merged into a stored row, a patch changes only its keys."""
    assert BatchDetails.patch(**fields) == fields


def test_a_new_batch_stores_what_earlier_versions_stored() -> None:
    assert BatchDetails.parse({"version": 1}).to_json() == {
        "version": 1,
        "phase": "reserved",
        "row_counts": {},
        "warehouse_committed": False,
        "publication": {},
        "publication_expired": False,
    }


_FAILURE = st.fixed_dictionaries(
    {"kind": st.sampled_from([*FailureKind, "purge_failed", "k"]), "error": st.text(max_size=20)},
    optional={
        "at": st.text(max_size=5),
        "held": st.fixed_dictionaries(
            {},
            optional={
                "breaches": st.lists(st.dictionaries(st.text(max_size=4), _JSON), max_size=2),
                "content": st.dictionaries(st.text(max_size=4), _JSON, max_size=2),
            },
        ),
        "refused": st.text(max_size=5),
    },
)
_DETAILS = st.fixed_dictionaries(
    {},
    optional={
        "phase": st.sampled_from(["reserved", "normalised", "committed", "published", "[/b]"]),
        "redshift_committed": st.booleans(),
        "warehouse_committed": st.booleans(),
        "failure": _FAILURE,
        "last_failure": _FAILURE,
        "resumes": st.integers(0, 3),
        "superseded_by": st.uuids().map(str),
        "publication_expired": st.booleans(),
        "review": st.fixed_dictionaries(
            {"decision": st.sampled_from(["approved", "rejected"])},
            optional={"batch_id": st.uuids().map(str), "note": st.text(max_size=8)},
        ),
        "rejects": st.fixed_dictionaries({"count": st.integers(0, 9)}),
        "row_counts": st.dictionaries(st.sampled_from(["trips", "vehicles"]), st.integers(0, 99)),
    },
)


@settings(max_examples=200)
@given(status=st.sampled_from(["running", "failed", "succeeded"]), details=_DETAILS)
def test_every_view_reads_any_row_earlier_versions_could_store(status: str, details: dict) -> None:
    """The answers the views show come from the record; none refuses a row it meets, and a
    held batch is exactly a failed one whose failure kind is `held`."""
    batch = stored_batch(status, details, id=uuid.uuid4())
    shown = shown_status(batch)
    assert committed_answer(batch) in ("yes", "no", "unknown until settled")
    held = status == "failed" and details.get("failure", {}).get("kind") == FailureKind.HELD
    assert (hold_of(batch) is not None) == held
    assert (review_state(batch) is not None) == held
    assert (review_line(batch) is not None) == held
    if held and not details.get("superseded_by") and not details.get("publication_expired"):
        assert shown.startswith("held (")
    assert batch.record.rows == sum(details.get("row_counts", {}).values())
