"""A sweep's imports split into shards: bounded, balanced, each import exactly once, and the
shard's start key stable for the same deliveries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_import.intake.shards import shard_imports
from fleet_import.intake.sweep import PlannedImport

_imports = st.lists(
    st.builds(
        lambda tenant, day, key: PlannedImport(
            tenant_id=tenant,
            folder=f"s3://fleet-landing/{tenant}/fleet/2026-07-{day:02d}/",
            fingerprint="f" * 12,
            idempotency_key=f"sweep:{tenant}:{day}:{key}",
        ),
        st.sampled_from(["acme", "globex", "initech", "umbrella"]),
        st.integers(min_value=1, max_value=28),
        st.integers(min_value=0, max_value=3),
    ),
    unique_by=lambda p: p.idempotency_key,
    max_size=60,
)


@given(_imports, st.integers(min_value=1, max_value=12))
def test_every_import_lands_in_exactly_one_of_at_most_n_balanced_shards(
    planned: list[PlannedImport], shards: int
) -> None:
    result = shard_imports(planned, shards)
    assert len(result) == min(shards, len(planned))
    members = [p for shard in result for p in shard.imports]
    assert sorted(members, key=id) == sorted(planned, key=id)
    sizes = [len(shard.imports) for shard in result]
    assert all(sizes) and (not sizes or max(sizes) - min(sizes) <= 1)
    # A tenant's folders load oldest first: (tenant, folder) order across the shards.
    order = [(p.tenant_id, p.folder) for p in members]
    assert order == sorted(order)


@given(_imports.filter(bool), st.integers(min_value=1, max_value=4), st.randoms())
def test_the_shard_key_names_its_deliveries_not_their_order(
    planned: list[PlannedImport], shards: int, random
) -> None:
    keys = {shard.idempotency_key for shard in shard_imports(planned, shards)}
    shuffled = list(planned)
    random.shuffle(shuffled)
    assert {shard.idempotency_key for shard in shard_imports(shuffled, shards)} == keys
    assert len(keys) == min(shards, len(planned))  # different deliveries, different keys


def test_a_shard_carries_each_delivery_as_the_per_folder_import_would() -> None:
    planned = PlannedImport("acme", "s3://fleet-landing/acme/fleet/2026-07-22/", "f", "sweep:k")
    [shard] = shard_imports([planned], 4)
    assert shard.deliveries == [planned.parameters]
    with pytest.raises(ValueError, match="at least 1"):
        shard_imports([planned], 0)
