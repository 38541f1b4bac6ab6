"""A folder belongs to at most one tenant, the one whose registered prefix holding it is the
most specific, for any registry of nested prefixes (docs/security.md: a tenant given a prefix
inside another's bucket owns it alone)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_import.intake.landing import DEFAULT_LAYOUT
from fleet_import.scope import Tenant
from fleet_import.tenants.binding import Refused, bind, folder_owner
from fleet_import.tenants.registry import load_registry

TENANTS = ("acme", "globex", "initech", "umbrella")
# Few, overlapping names ("a" and "ab") so that generated prefixes nest and look alike.
_SEGMENTS = st.lists(st.sampled_from(["a", "ab", "b"]), max_size=3)
_PREFIXES = st.lists(
    _SEGMENTS.map(lambda segments: "".join(f"{s}/" for s in segments)), min_size=1, max_size=6,
    unique=True,
).map(lambda paths: [f"s3://shared/{path}" for path in paths])


@st.composite
def registries(draw: st.DrawFn) -> dict[str, str]:
    """Registered prefix -> its owner: distinct prefixes, nested at random."""
    prefixes = draw(_PREFIXES)
    return {prefix: draw(st.sampled_from(TENANTS)) for prefix in prefixes}


def _registry_text(owners: dict[str, str]) -> str:
    lines = ["tenants:"]
    for tenant_id in TENANTS:  # every tenant registered, some with no prefix of their own
        prefixes = [prefix for prefix, owner in owners.items() if owner == tenant_id]
        lines += [f"  {tenant_id}:", f"    landing_prefixes: [{', '.join(prefixes)}]"]
    return "\n".join(lines) + "\n"


@settings(max_examples=300, deadline=None)
@given(owners=registries(), folder_path=st.lists(st.sampled_from(["a", "ab", "b"]), max_size=4))
def test_a_folder_binds_to_the_owner_of_its_most_specific_prefix_alone(
    tmp_path_factory: pytest.TempPathFactory, owners: dict[str, str], folder_path: list[str]
) -> None:
    path = tmp_path_factory.mktemp("registry") / "tenants.yaml"
    path.write_text(_registry_text(owners))
    registry = load_registry(path)
    folder = "s3://shared/" + "".join(f"{s}/" for s in folder_path) + "2026-07-22/"

    holding = [prefix for prefix in owners if folder.startswith(prefix)]
    expected = owners[max(holding, key=len)] if holding else None
    outcomes = {t: bind(t, folder, layout=DEFAULT_LAYOUT, registry=registry) for t in TENANTS}
    bound = [t for t, outcome in outcomes.items() if isinstance(outcome, Tenant)]
    assert bound == ([expected] if expected else []), (folder, owners, outcomes)
    assert folder_owner(folder, DEFAULT_LAYOUT, registry) == expected
    for tenant_id, outcome in outcomes.items():
        if tenant_id != expected:
            assert isinstance(outcome, Refused), outcome
            assert outcome.owner_tenant_id == expected
            assert outcome.kind == ("other_tenant" if expected else "outside")
