"""When a delivery folder is complete: the rules a deployment names (a marker object, a
quiet period, the folder's own manifest), and `folder_completion`, the one judgement of a
folder's listing that the sweep (what to start) and the freshness check (is a late delivery
missing or only incomplete) share."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from fleet_import.errors import InvalidInput
from fleet_import.intake.manifest_rule import ManifestComplete, manifest_completion
from fleet_import.s3.client import S3Client

DEFAULT_MARKER = "_SUCCESS"
DEFAULT_QUIET_SECONDS = 300


@dataclass(frozen=True)
class Marker:
    """Complete when the folder holds this object (the producer writes it last).

    `min_age_seconds` leaves a fresh marker to the S3 event trigger for that long, so that
    the sweep only picks up deliveries whose event was lost (see prefect.yaml).
    """

    name: str = DEFAULT_MARKER
    min_age_seconds: float = 0

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise InvalidInput(f"invalid marker name {self.name!r}: one object name, no '/'")
        if self.min_age_seconds < 0:
            raise InvalidInput("the marker's minimum age cannot be negative")


@dataclass(frozen=True)
class Quiet:
    """Complete when the newest object is at least `seconds` old (by S3's LastModified)."""

    seconds: float = DEFAULT_QUIET_SECONDS

    def __post_init__(self) -> None:
        if self.seconds <= 0:
            raise InvalidInput(f"quiet period must be positive, got {self.seconds!r} seconds")


CompletionRule = Marker | Quiet | ManifestComplete


def completion_rule(
    kind: str,
    *,
    marker: str = DEFAULT_MARKER,
    quiet_seconds: float = DEFAULT_QUIET_SECONDS,
    marker_grace_seconds: float = 0,
) -> CompletionRule:
    """The rule a deployment's parameters name: "marker", "quiet" or "manifest"."""
    if kind == "marker":
        return Marker(marker, marker_grace_seconds)
    if kind == "quiet":
        return Quiet(quiet_seconds)
    if kind == "manifest":  # issue #24: the folder's own manifest says when it is whole
        return ManifestComplete()
    raise InvalidInput(
        f"unknown completion rule {kind!r}: expected 'marker', 'quiet' or 'manifest'"
    )


def _age_or_quiet(
    objects: list[dict[str, Any]], key_prefix: str, rule: Marker | Quiet, now: dt.datetime
) -> tuple[dt.datetime | None, str | None]:
    """(completed at, None) for a complete folder, (None, why not) otherwise."""
    if not objects:
        return None, "no objects yet"
    if isinstance(rule, Marker):
        marker = next((o for o in objects if o["Key"] == key_prefix + rule.name), None)
        if marker is None:
            return None, f"waiting for its {rule.name} marker"
        at = marker["LastModified"].astimezone(dt.UTC)
        age = (now - at).total_seconds()
        if age < rule.min_age_seconds:
            return None, (
                f"{rule.name} is {age:.0f}s old: left to the S3 event trigger until it is "
                f"{rule.min_age_seconds:.0f}s old"
            )
        return at, None
    newest = max(o["LastModified"] for o in objects).astimezone(dt.UTC)
    quiet_for = (now - newest).total_seconds()
    if quiet_for < rule.seconds:
        return None, f"changed {quiet_for:.0f}s ago; complete after {rule.seconds:.0f}s quiet"
    return newest, None


def folder_completion(
    s3: S3Client,
    bucket: str,
    objects: list[dict[str, Any]],
    key_prefix: str,
    rule: CompletionRule,
    now: dt.datetime,
) -> tuple[dt.datetime | None, str | None]:
    """(completed at, None) for a complete folder, (None, why not) otherwise; `objects` is
    the folder's listing (`list_children(...).objects`)."""
    if isinstance(rule, ManifestComplete):  # issue #24
        return manifest_completion(s3, bucket, objects, key_prefix, rule)
    return _age_or_quiet(objects, key_prefix, rule, now)
