"""`extend:` in a FLEET_CONTRACTS file: a dataset in force (a shipped one) gains aliases and
a drift policy; anything else, an unknown dataset or column, is refused with where it is."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from fleet_import.contracts.files import contracts_in_force
from fleet_import.contracts.fleet import FLEET_DATASETS, TRIPS
from fleet_import.contracts.model import ContractError


def _in_force(tmp_path: Path, text: str) -> object:
    spec = tmp_path / "extend.yaml"
    spec.write_text(text, "utf-8")
    return contracts_in_force(str(spec))


def _refusal(tmp_path: Path, text: str) -> str:
    with pytest.raises(ContractError) as refused:
        _in_force(tmp_path, text)
    return str(refused.value)


def test_aliases_keep_the_version_and_a_policy_makes_one(tmp_path: Path) -> None:
    aliased = _in_force(tmp_path, "extend:\n  trips:\n    aliases: {distance_km: [km]}\n")
    trips = aliased["trips"]  # type: ignore[index]
    assert trips.contract_version == TRIPS.contract_version  # cached outputs still serve
    assert dict((c.name, c.aliases) for c in trips.columns)["distance_km"] == ("km",)
    evolving = _in_force(
        tmp_path, "extend:\n  trips:\n    on_new_columns: evolve\n    new_column_type: int64\n"
    )
    trips = evolving["trips"]  # type: ignore[index]
    assert (trips.on_new_columns, trips.new_column_type) == ("evolve", "int64")
    assert trips.contract_version != TRIPS.contract_version
    assert evolving["vehicles"] is FLEET_DATASETS["vehicles"]  # type: ignore[index]


def test_what_an_extension_cannot_do_is_refused_where_it_is(tmp_path: Path) -> None:
    assert "no dataset 'tripz' is in force to extend" in _refusal(
        tmp_path, "extend:\n  tripz: {on_new_columns: ignore}\n"
    )
    assert "extend.trips: aliases: distance: no such column of dataset 'trips'" in _refusal(
        tmp_path, "extend:\n  trips:\n    aliases: {distance: [km]}\n"
    )
    assert "extend.trips: columns: unknown field" in _refusal(
        tmp_path, "extend:\n  trips:\n    columns: []\n"
    )
    assert "extend.trips: on_new_columns: unknown drift policy 'sometimes'" in _refusal(
        tmp_path, "extend:\n  trips:\n    on_new_columns: sometimes\n"
    )
    # An alias that is another column's name makes one header lead to two columns.
    assert "aliases that name more than one column: driver_id" in _refusal(
        tmp_path, "extend:\n  trips:\n    aliases: {vehicle_id: [driver_id]}\n"
    )


def test_redefining_a_shipped_dataset_says_how_to_extend_it(tmp_path: Path) -> None:
    redefined = TRIPS.model_dump(mode="json")
    message = _refusal(tmp_path, yaml.safe_dump({"datasets": [redefined]}))
    assert "'trips' is defined twice" in message and "extend: {trips:" in message


@given(st.lists(st.from_regex(r"[a-z][a-z0-9_ ]{0,12}[a-z0-9]", fullmatch=True), max_size=3))
def test_an_alias_never_changes_the_contract_version(aliases: list[str]) -> None:
    """Property: whatever aliases an extension adds (if the contract takes them), the
    version that keys the normalized-file cache is the shipped one."""
    from fleet_import.contracts.extension import DatasetExtension, extended

    try:
        trips = extended(TRIPS, DatasetExtension(aliases={"status": tuple(aliases)}), "here")
    except ContractError:
        return  # an alias naming another column: refused, never a silent version change
    assert trips.contract_version == TRIPS.contract_version
