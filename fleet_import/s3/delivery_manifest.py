"""A delivery's own manifest (issue #24): the folder says which files it meant to send, in
Redshift's COPY manifest shape, so an import can tell a whole delivery from a partial one.

    {"entries": [{"url": "s3://fleet-landing/acme/fleet/2026-07-22/trips-1.csv",
                  "mandatory": true,
                  "meta": {"content_length": 12345, "record_count": 200}}]}

`record_count` (optional) is the data rows the file holds: an import whose loaded plus
rejected rows differ is held for review (importing.guards).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from fleet_import.errors import PreCommitError
from fleet_import.s3.errors import s3_errors
from fleet_import.s3.sources import Manifest
from fleet_import.scope import split_folder

MANIFEST_NAME = "_manifest.json"
_NAMES_SHOWN = 10


class DeliveryManifestMismatch(PreCommitError):
    """The folder does not hold what its manifest lists."""


@dataclass(frozen=True)
class ManifestEntry:
    url: str
    mandatory: bool
    content_length: int | None
    record_count: int | None


@dataclass(frozen=True)
class DeliveryManifest:
    name: str
    entries: tuple[ManifestEntry, ...]

    @classmethod
    def parse(cls, name: str, raw: object) -> DeliveryManifest:
        """Refuses anything not in the COPY manifest shape, naming what is wrong, and a file
        listed twice: which of its entries (sizes, row counts) describes it is anyone's guess."""
        if not isinstance(raw, Mapping) or not isinstance(raw.get("entries"), list):
            raise DeliveryManifestMismatch(f"{name}: expected an object with a list 'entries'")
        entries = []
        first_listed: dict[str, int] = {}
        for index, entry in enumerate(raw["entries"]):
            meta = entry.get("meta", {}) if isinstance(entry, Mapping) else None
            url = entry.get("url") if isinstance(entry, Mapping) else None
            if (
                not isinstance(url, str)
                or not url.startswith("s3://")
                or not isinstance(meta, Mapping)
            ):
                raise DeliveryManifestMismatch(f"{name}: entries[{index}] needs an s3:// url")
            length, count = meta.get("content_length"), meta.get("record_count")
            for field, value in (("content_length", length), ("record_count", count)):
                if value is not None and (not isinstance(value, int) or value < 0):
                    raise DeliveryManifestMismatch(
                        f"{name}: entries[{index}].meta.{field} must be a whole number"
                    )
            if url in first_listed:
                raise DeliveryManifestMismatch(
                    f"{name}: {url} is listed twice (entries[{first_listed[url]}] and "
                    f"entries[{index}])"
                )
            first_listed[url] = index
            entries.append(ManifestEntry(url, entry.get("mandatory", False) is True, length, count))
        return cls(name, tuple(entries))

    def to_json(self) -> dict[str, Any]:
        return {
            "entries": [
                {
                    "url": e.url,
                    "mandatory": e.mandatory,
                    "meta": {
                        k: v
                        for k, v in (
                            ("content_length", e.content_length),
                            ("record_count", e.record_count),
                        )
                        if v is not None
                    },
                }
                for e in self.entries
            ]
        }

    def declared_rows(self) -> dict[str, int]:
        """url -> declared data rows, for the entries that declare them."""
        return {e.url: e.record_count for e in self.entries if e.record_count is not None}

    def mismatches(self, listing: Manifest) -> list[str]:
        """What the folder's matched files and the manifest disagree on: missing mandatory
        entries, sizes that differ, files the manifest does not list."""
        bucket, _ = split_folder(listing.folder)
        sizes = {f"s3://{bucket}/{obj.key}": obj.size for obj in listing.objects}
        listed = {e.url for e in self.entries}
        return self._problems(sizes, sorted(url for url in sizes if url not in listed))

    def missing_or_short(self, folder: str, sizes: Mapping[str, int]) -> list[str]:
        """The mandatory entries absent from the folder, and sizes that differ, against
        every object its listing held (key -> bytes): why a folder discovery refused may be
        a file that never arrived (`no file for required dataset` names no file)."""
        bucket, _ = split_folder(folder)
        return self._problems({f"s3://{bucket}/{key}": size for key, size in sizes.items()}, [])

    def _problems(self, sizes: Mapping[str, int], unlisted: list[str]) -> list[str]:
        missing = [e.url for e in self.entries if e.mandatory and e.url not in sizes]
        short = [
            f"{e.url} ({sizes[e.url]:,} bytes, manifest says {e.content_length:,})"
            for e in self.entries
            if e.url in sizes and e.content_length is not None and sizes[e.url] != e.content_length
        ]
        problems = []
        for what, urls in (("missing", missing), ("size differs", short), ("unlisted", unlisted)):
            if urls:
                more = f" and {len(urls) - _NAMES_SHOWN} more" if len(urls) > _NAMES_SHOWN else ""
                problems.append(f"{what}: {', '.join(urls[:_NAMES_SHOWN])}{more}")
        return problems


def read_delivery_manifest(
    s3: Any, listing: Manifest, name: str = MANIFEST_NAME
) -> DeliveryManifest | None:
    """The folder's manifest, if discovery saw one (it is among the ignored keys)."""
    return read_listed_manifest(s3, listing.folder, listing.ignored, name)


def read_listed_manifest(
    s3: Any, folder: str, keys: Collection[str], name: str = MANIFEST_NAME
) -> DeliveryManifest | None:
    """The folder's manifest, if its listing (`keys`) holds one."""
    bucket, prefix = split_folder(folder)
    key = prefix + name
    if key not in keys:
        return None
    with s3_errors(f"cannot read the delivery manifest {key}", DeliveryManifestMismatch):
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    try:
        raw = json.loads(body)
    except ValueError as exc:
        raise DeliveryManifestMismatch(f"{name}: not valid JSON: {exc}") from None
    return DeliveryManifest.parse(name, raw)


def manifest_for(files: Mapping[str, bytes], folder: str, rows: Mapping[str, int]) -> bytes:
    """A manifest listing `files` (name -> bytes) of `folder`, with `rows` where known: what
    sample_data and the demo write."""
    entries = [
        {
            "url": f"{folder}{name}",
            "mandatory": True,
            "meta": {
                "content_length": len(data),
                **({"record_count": rows[name]} if name in rows else {}),
            },
        }
        for name, data in sorted(files.items())
    ]
    return json.dumps({"entries": entries}, indent=2).encode()
