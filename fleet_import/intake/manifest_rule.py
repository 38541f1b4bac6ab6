"""The sweep's `manifest` completion rule (issue #24): a folder is complete once it holds
its delivery manifest and every mandatory entry is present at its declared size."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from fleet_import.errors import FleetImportError, InvalidInput
from fleet_import.s3.client import S3Client
from fleet_import.s3.delivery_manifest import MANIFEST_NAME, DeliveryManifest

_NAMES_SHOWN = 5


@dataclass(frozen=True)
class ManifestComplete:
    """Complete when the manifest `name` is there and all it marks mandatory arrived whole."""

    name: str = MANIFEST_NAME

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise InvalidInput(f"invalid manifest name {self.name!r}: one object name, no '/'")


def manifest_completion(
    s3: S3Client,
    bucket: str,
    objects: list[dict[str, Any]],
    key_prefix: str,
    rule: ManifestComplete,
) -> tuple[dt.datetime | None, str | None]:
    """(completed at, None) for a complete folder, (None, why not) otherwise."""
    key = key_prefix + rule.name
    if not any(o["Key"] == key for o in objects):
        return None, f"waiting for its {rule.name} manifest"
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        manifest = DeliveryManifest.parse(rule.name, json.loads(body))
    except (ValueError, FleetImportError) as exc:
        return None, f"its {rule.name} cannot be read: {exc}"
    except Exception as exc:  # noqa: BLE001 - an S3 error: the next sweep looks again
        return None, f"its {rule.name} cannot be read now: {type(exc).__name__}"
    sizes = {f"s3://{bucket}/{o['Key']}": o["Size"] for o in objects}
    waiting = [
        entry.url
        for entry in manifest.entries
        if entry.mandatory
        and (
            entry.url not in sizes
            or (entry.content_length is not None and sizes[entry.url] != entry.content_length)
        )
    ]
    if waiting:
        more = f" and {len(waiting) - _NAMES_SHOWN} more" if len(waiting) > _NAMES_SHOWN else ""
        return None, (
            f"waiting for {len(waiting)} file(s) its manifest lists: "
            f"{', '.join(waiting[:_NAMES_SHOWN])}{more}"
        )
    return max(o["LastModified"] for o in objects).astimezone(dt.UTC), None
