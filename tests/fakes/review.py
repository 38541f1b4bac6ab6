"""`fleet_import.store.review_repository.ReviewRepository` in memory, on a `MemoryStore`'s
rows: the review decided once, the held list, what later deliveries say of a held batch,
what the retention keeps and what a default rollback may load (review.sql, section by
section; tests/contract/test_review_contract.py holds both to the same assertions).

`record_review` is also what `MemoryBatchRepository.mark_committed` runs for an approval's
batch, in the same "transaction", as the real commit does."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from fleet_import.store.batch_state import HeldSince
from fleet_import.store.models import Batch
from fleet_import.store.review_repository import review_params
from tests.fakes.state import MemoryStore, Row, as_json, batch_of, utc_text

_MISSING, _ABSENT = object(), object()  # two keys no jsonb value equals, nor each other


def _held_waiting(row: Row) -> bool:
    """Held, and neither approved nor rejected yet."""
    return _is_held(row) and row["details"].get("review") is None


def _is_held(row: Row) -> bool:
    failure = row["details"].get("failure") or {}
    return row["status"] == "failed" and failure.get("kind") == "held"


def _newest_first(rows: Iterable[Row]) -> list[Row]:
    """ORDER BY created_at DESC, id."""
    ordered = sorted(rows, key=lambda row: row["id"])
    return sorted(ordered, key=lambda row: row["created_at"], reverse=True)


def record_review_row(
    store: MemoryStore,
    batch_id: uuid.UUID,
    decision: str,
    by_batch: uuid.UUID | None = None,
    facts: Mapping[str, Any] | None = None,
) -> Row | None:
    """`record_review`'s UPDATE, the caller holding the store's lock."""
    params = review_params(batch_id, decision, by_batch, facts)
    row = store.batch_rows.get(batch_id)
    if row is None or not _is_held(row):
        return None
    review = row["details"].get("review")
    if review is not None and (
        review.get("decision") != decision or review.get("batch_id") != params["by_batch"]
    ):
        return None
    now = store.clock.now()
    decided = {**as_json(params["review"].obj), "at": utc_text(now)}
    row.update(details={**row["details"], "review": decided}, updated_at=now)
    return row


class MemoryReviewRepository:
    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def record_review(
        self,
        batch_id: uuid.UUID,
        decision: str,
        by_batch: uuid.UUID | None = None,
        facts: Mapping[str, Any] | None = None,
    ) -> Batch | None:
        with self.store.transaction("record_review"):
            row = record_review_row(self.store, batch_id, decision, by_batch, facts)
            return None if row is None else batch_of(row)

    def held_batches(self, tenant: str | None = None, limit: int = 50) -> list[Batch]:
        with self.store.transaction("held_batches"):
            rows = [
                row
                for row in self.store.batch_rows.values()
                if _held_waiting(row) and (tenant is None or row["tenant_id"] == tenant)
            ]
            return [batch_of(row) for row in _newest_first(rows)[: int(limit)]]

    def held_since(self, ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, HeldSince]:
        wanted = list(dict.fromkeys(ids))
        found: dict[uuid.UUID, HeldSince] = {}
        with self.store.transaction("held_since"):
            for held_id in wanted:
                held = self.store.batch_rows.get(held_id)
                later = None if held is None else self._listed_since(held)
                if held is None or later is None:
                    continue
                content = ((held["details"].get("failure") or {}).get("held") or {}).get(
                    "content"
                ) or {}
                seen = (later["details"].get("manifest") or {}).get("fingerprint")
                # jsonb `=`: NULL (and so false) where either side lacks the key.
                versions = later["details"].get("contract_versions", _MISSING)
                same = (
                    content.get("fingerprint") is not None
                    and seen == content["fingerprint"]
                    and versions == content.get("contract_versions", _ABSENT)
                )
                found[held_id] = HeldSince(later["id"], same, later["status"] == "succeeded")
        return found

    def _listed_since(self, held: Row) -> Row | None:
        """The newest later batch of the held batch's scope that recorded a manifest
        fingerprint, not counting the held batch's own approval."""
        later = [
            row
            for row in self.store.batch_rows.values()
            if row["tenant_id"] == held["tenant_id"]
            and row["source_scope"] == held["source_scope"]
            and row["created_at"] > held["created_at"]
            and (row["details"].get("manifest") or {}).get("fingerprint") is not None
            and row["delivery_key"] != f"approve:{held['id']}"
        ]
        return max(later, key=lambda row: (row["created_at"], row["id"]), default=None)

    def retained_batches(
        self, batch_id: uuid.UUID, keep_seconds: float, keep_count: int = 1
    ) -> list[Batch]:
        with self.store.transaction("retained_batches"):
            cur = self.store.batch_rows.get(batch_id)
            if cur is None:
                return []
            scoped = [
                row
                for row in self.store.batch_rows.values()
                if row["tenant_id"] == cur["tenant_id"]
                and row["source_scope"] == cur["source_scope"]
                and row["id"] != cur["id"]
            ]
            earlier = [
                row
                for row in scoped
                if row["created_at"] < cur["created_at"] and row["status"] == "succeeded"
            ]
            earlier.sort(key=lambda row: (row["created_at"], row["id"]), reverse=True)
            since = self.store.clock.now() - dt.timedelta(seconds=float(keep_seconds))
            kept = [
                row
                for recency, row in enumerate(earlier, start=1)
                if recency <= int(keep_count) or row["updated_at"] >= since
            ]
            later = [row for row in scoped if row["created_at"] > cur["created_at"]]
            kept += [row for row in later if _held_waiting(row)]
            return [batch_of(row) for row in _newest_first(kept)]

    def rollback_candidates(
        self, tenant_id: str, scope: str, owner: uuid.UUID | None, limit: int = 20
    ) -> list[Batch]:
        with self.store.transaction("rollback_candidates"):
            scoped = [
                row
                for row in self.store.batch_rows.values()
                if row["tenant_id"] == tenant_id and row["source_scope"] == scope
            ]

            by_id = {row["id"]: row for row in scoped}

            def content_id(row: Row) -> uuid.UUID | None:
                """A batch's content: its own, or for a rollback that of the batch it rolled
                back to, followed through rollbacks to rollbacks (None in a cycle, which the
                SQL's recursion never leaves)."""
                seen = {row["id"]}
                while (target := row["details"].get("rolled_back_to")) is not None:
                    loaded = by_id.get(uuid.UUID(target))
                    if loaded is None:
                        return uuid.UUID(target)
                    if loaded["id"] in seen:
                        return None
                    seen.add(loaded["id"])
                    row = loaded
                return row["id"]

            hidden = {
                content_id(by_id[uuid.UUID(replaced)])
                for row in scoped
                if row["status"] == "succeeded"
                and (replaced := row["details"].get("rollback_replaced")) is not None
                and uuid.UUID(replaced) in by_id
            }
            if owner in by_id:
                hidden.add(content_id(by_id[owner]))
            hidden.discard(None)
            candidates = [
                row
                for row in scoped
                if row["status"] == "succeeded"
                and row["id"] != owner
                and content_id(row) is not None
                and content_id(row) not in hidden
            ]
            return [batch_of(row) for row in _newest_first(candidates)[: int(limit)]]
