"""What `retire_superseded` keeps (issue #24): the normalized files of the scope's last
succeeded batches, so a rollback can load one again, and of held batches that wait for
review, so an approval loads them without parsing. The same publication step that deletes
staging today enforces it: a file leaves once no retained batch uses it any more, at the
first success of the scope after that, so nothing leaks.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from fleet_import.scope import split_folder
from fleet_import.store.models import Batch, FileInUse
from fleet_import.store.review_repository import ReviewRepository

DEFAULT_RETAIN_SECONDS = 7 * 24 * 3600.0
MIN_RETAINED_SUCCESSES = 1
"""The previous success is always kept, however old: one bad delivery is always undone."""


@dataclass(frozen=True)
class Retention:
    reviews: ReviewRepository
    keep_seconds: float = DEFAULT_RETAIN_SECONDS
    keep_count: int = MIN_RETAINED_SUCCESSES

    def files_kept(self, batch_id: uuid.UUID) -> list[FileInUse]:
        """The files the scope's retained batches were (or would be) loaded from, while
        `batch_id` publishes its slice."""
        batches = self.reviews.retained_batches(
            batch_id, self.keep_seconds, max(self.keep_count, MIN_RETAINED_SUCCESSES)
        )
        return [file for batch in batches for file in files_in_use(batch) or []]


def files_in_use(batch: Batch) -> list[FileInUse] | None:
    """What the batch's slice was loaded from: each manifest object as (`s3://bucket/key`,
    etag, contract version), the version None where the details do not record it (then every
    entry of that key and etag counts as in use); None if there is no manifest."""
    manifest = batch.record.manifest
    if manifest is None or not isinstance(manifest.get("folder"), str):
        return None
    bucket, _ = split_folder(manifest["folder"])
    versions = batch.record.contract_versions or {}
    return [
        FileInUse(f"s3://{bucket}/{obj['key']}", obj.get("etag"), versions.get(obj.get("dataset")))
        for obj in manifest.get("objects", [])
    ]
