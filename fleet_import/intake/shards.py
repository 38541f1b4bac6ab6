"""A sweep's imports split into a bounded number of shards (issue 50): each shard is one
flow run that imports its folders one by one, so a thousand deliveries cost a few flow runs,
not a thousand. Every folder keeps its own delivery key, claim and batch; a shard only groups
them.

A tenant's folders stay together and in date order where the sizes allow: its deliveries
then load oldest first, as one-run-per-folder imports would when started in order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from fleet_import.intake.sweep import PlannedImport

SHARD_KEY_PREFIX = "bulk:"


@dataclass(frozen=True)
class Shard:
    """The imports of one bulk flow run, and the key that makes its start idempotent."""

    imports: tuple[PlannedImport, ...]

    @property
    def idempotency_key(self) -> str:
        """Stable for the same deliveries in any order: a sweep repeated over an unchanged
        plan finds the shard it started, not a second one."""
        keys = sorted(planned.idempotency_key for planned in self.imports)
        digest = hashlib.sha256(json.dumps(keys).encode("utf-8")).hexdigest()
        return SHARD_KEY_PREFIX + digest

    @property
    def deliveries(self) -> list[dict[str, str]]:
        """The bulk flow's `deliveries` parameter: each import's own parameters."""
        return [planned.parameters for planned in self.imports]


def shard_imports(planned: Sequence[PlannedImport], shards: int) -> list[Shard]:
    """At most `shards` non-empty shards whose sizes differ by at most one, in (tenant,
    folder) order: every planned import in exactly one shard."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, not {shards}")
    ordered = sorted(planned, key=lambda p: (p.tenant_id, p.folder, p.idempotency_key))
    count = min(shards, len(ordered))
    if count == 0:
        return []
    size, extra = divmod(len(ordered), count)
    result, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        result.append(Shard(tuple(ordered[start:end])))
        start = end
    return result
