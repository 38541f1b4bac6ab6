"""S3 source folders: list one delivery, match its files to dataset contracts, read them back.

Discovery turns a folder into a `Manifest` (key, size, etag per file) whose fingerprint says
whether a delivery was already loaded. Reads pin the etag recorded in the manifest, so a file
replaced between discovery and normalization fails the batch instead of mixing two deliveries.
Every S3 call runs inside `s3.errors.s3_errors`, so a botocore error leaves as a pre-commit
error (terminal or configuration) or a transient (retryable) one; no botocore exception
leaves this module.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from fleet_import.contracts.model import FORMAT_SUFFIXES, ContractError, ContractSet, file_format
from fleet_import.errors import (
    DetailsInvalid,
    ErrorKind,
    PreCommitError,
    TransientError,
    transient_variant_of,
)
from fleet_import.s3.client import Children, S3Client, list_children
from fleet_import.s3.errors import s3_errors
from fleet_import.scope import canonical_folder, split_folder

_COPY_CHUNK_BYTES = 1024 * 1024
# Error messages list what a folder holds; a delivery of thousands of files must not make
# an unreadable message (or an oversized Prefect state message).
_MAX_NAMES_IN_MESSAGE = 20
_MANIFEST_VERSION = 1


@dataclass(frozen=True)
class SourceObject:
    """One file of a delivery as discovery saw it; the etag pins that exact content."""

    key: str
    name: str
    size: int
    etag: str
    last_modified: datetime
    dataset: str
    fmt: str

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "name": self.name,
            "size": self.size,
            "etag": self.etag,
            "last_modified": self.last_modified.isoformat(),
            "dataset": self.dataset,
            "fmt": self.fmt,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SourceObject:
        last_modified = datetime.fromisoformat(raw["last_modified"])
        if last_modified.tzinfo is None:
            raise ValueError(f"last_modified {raw['last_modified']!r} has no time zone")
        return cls(
            key=str(raw["key"]),
            name=str(raw["name"]),
            size=int(raw["size"]),
            etag=str(raw["etag"]),
            last_modified=last_modified,
            dataset=str(raw["dataset"]),
            fmt=str(raw["fmt"]),
        )


@dataclass(frozen=True)
class Manifest:
    """What one folder delivered: the matched files, and what was seen but not read."""

    folder: str
    objects: tuple[SourceObject, ...]
    ignored: tuple[str, ...]

    @property
    def fingerprint(self) -> str:
        """Identifies the delivery's content: same file names, etags and sizes give the same
        value, whatever the upload order or timestamps. It does not include the folder, so
        pair it with the source scope."""
        entries = sorted([obj.name, obj.etag, obj.size] for obj in self.objects)
        payload = json.dumps(entries, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def by_dataset(self) -> dict[str, list[SourceObject]]:
        grouped: dict[str, list[SourceObject]] = {}
        for obj in self.objects:
            grouped.setdefault(obj.dataset, []).append(obj)
        return {dataset: grouped[dataset] for dataset in sorted(grouped)}

    def load_order(self) -> tuple[SourceObject, ...]:
        """The objects grouped by dataset (each group in key order), so that each dataset's
        files follow one another and a warehouse can load them in one COPY."""
        return tuple(obj for group in self.by_dataset().values() for obj in group)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": _MANIFEST_VERSION,
            "folder": self.folder,
            "fingerprint": self.fingerprint,
            "objects": [obj.to_json() for obj in self.objects],
            "ignored": list(self.ignored),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Manifest:
        """The manifest stored in a batch's details; a tampered or truncated one is refused."""
        try:
            if raw.get("version") != _MANIFEST_VERSION:
                raise ValueError(f"unsupported manifest version {raw.get('version')!r}")
            manifest = cls(
                folder=canonical_folder(raw["folder"]),
                objects=tuple(
                    sorted((SourceObject.from_json(o) for o in raw["objects"]), key=_by_key)
                ),
                ignored=tuple(str(key) for key in raw.get("ignored", ())),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DetailsInvalid(f"stored manifest is invalid: {exc!r}") from None
        stored = raw.get("fingerprint")
        if stored is not None and stored != manifest.fingerprint:
            raise DetailsInvalid(
                f"stored manifest of {manifest.folder} does not match its fingerprint"
            )
        return manifest


def _by_key(obj: SourceObject) -> str:
    return obj.key


class DiscoveryError(PreCommitError):
    """The source folder cannot be imported as it is."""

    bucket_named_by = "the folder's bucket (s3://bucket/prefix/)"

    def __init__(
        self,
        message: str | None = None,
        *,
        folder: str | None = None,
        problems: Sequence[str] = (),
        sizes: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.folder = folder
        self.problems = tuple(problems)
        self.sizes = dict(sizes or {})
        """Every object the folder's listing held (key -> bytes), matched or not: what its
        own delivery manifest is held against to say which file is missing."""


@transient_variant_of(DiscoveryError)
class TransientDiscoveryError(DiscoveryError, TransientError):
    """The source folder could not be listed this time; worth a retry."""

    default_kind = ErrorKind.TRANSIENT


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(repr(name) for name in names[:_MAX_NAMES_IN_MESSAGE])
    more = len(names) - _MAX_NAMES_IN_MESSAGE
    return shown + (f" and {more} more" if more > 0 else "")


def discover(
    s3: S3Client, folder: str, contracts: ContractSet, listing: Children | None = None
) -> Manifest:
    """List a folder and match its files to datasets; refuse a delivery that cannot load.

    `listing` is the folder's listing when the caller already has it (the sweep), so a
    folder costs one LIST."""
    canonical = canonical_folder(folder)
    bucket, prefix = split_folder(canonical)
    if listing is None:
        with s3_errors(f"cannot list {canonical}", DiscoveryError):
            listing = list_children(s3, bucket, prefix)
    contents, sub_folders = listing

    objects: list[SourceObject] = []
    ignored: list[str] = list(sub_folders)
    problems: list[str] = []
    file_names: list[str] = []
    sizes: dict[str, int] = {}
    seen_datasets: set[str] = set()
    for item in contents:
        key: str = item["Key"]
        # S3 only returns keys under the prefix; a store that did otherwise must not make us
        # read a sibling folder.
        if not key.startswith(prefix):
            continue
        name = key[len(prefix) :]
        if "/" in name:  # a store that ignores Delimiter: still never read sub-folders
            ignored.append(key)
            continue
        file_names.append(name)
        sizes[key] = int(item["Size"])
        globbed = [c.name for c in contracts.values() if fnmatch.fnmatchcase(name, c.file_glob)]
        if not globbed:
            ignored.append(key)
            continue
        seen_datasets.update(globbed)
        try:
            contract = contracts.match(name)
        except ContractError as exc:
            problems.append(str(exc))
            continue
        if contract is None:
            problems.append(_format_problem(name, globbed, contracts))
            continue
        if item["Size"] == 0:
            problems.append(f"file {name!r} ({contract.name}) is empty (0 bytes)")
            continue
        fmt = file_format(name)
        assert fmt is not None  # contract.matches() only accepts known formats
        objects.append(
            SourceObject(
                key=key,
                name=name,
                size=int(item["Size"]),
                etag=str(item["ETag"]).strip('"'),
                last_modified=item["LastModified"].astimezone(UTC),
                dataset=contract.name,
                fmt=fmt,
            )
        )

    if not file_names and not sub_folders:
        problem = f"folder {canonical} is empty"
        raise DiscoveryError(problem, folder=canonical, problems=[problem])
    missing = [c for c in contracts.values() if c.required and c.name not in seen_datasets]
    if missing:
        expected = ", ".join(f"{c.name} ({c.file_glob})" for c in missing)
        found = _names(sorted(file_names)) if file_names else "no files"
        if sub_folders:
            found += f"; sub-folders, which are not read: {_names(sorted(sub_folders))}"
        problems.append(f"no file for required dataset(s) {expected}; found {found}")
    if problems:
        raise DiscoveryError(
            f"cannot import {canonical}: " + "; ".join(problems),
            folder=canonical,
            problems=problems,
            sizes=sizes,
        )
    return Manifest(
        folder=canonical,
        objects=tuple(sorted(objects, key=_by_key)),
        ignored=tuple(sorted(ignored)),
    )


def _format_problem(name: str, datasets: list[str], contracts: ContractSet) -> str:
    fmt = file_format(name)
    if fmt is None:
        known = ", ".join(suffix for suffix, _ in FORMAT_SUFFIXES)
        return (
            f"file {name!r} looks like dataset {' / '.join(datasets)} but its extension is not "
            f"supported (expected one of {known})"
        )
    accepted = sorted({f for d in datasets for f in contracts[d].formats})
    return (
        f"file {name!r} looks like dataset {' / '.join(datasets)} but format {fmt} is not "
        f"accepted there (accepted: {', '.join(accepted)})"
    )


class _VerifiedBody(io.RawIOBase):
    """The object's bytes; a connection lost mid-stream surfaces as a TransientError."""

    def __init__(self, body: Any, action: str, expected_size: int) -> None:
        super().__init__()
        self._body = body
        self._action = action
        self._expected_size = expected_size
        self._read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        with s3_errors(f"cannot {self._action}", PreCommitError):
            chunk = self._body.read(len(view))
        size = len(chunk)
        view[:size] = chunk
        self._read += size
        if size == 0 and len(view) > 0 and self._read != self._expected_size:
            raise TransientError(
                f"cannot {self._action}: the stream ended after {self._read} of "
                f"{self._expected_size} bytes"
            )
        return size

    def readall(self) -> bytes:
        # RawIOBase.readall reads 8 KiB at a time; S3 objects deserve bigger gulps.
        chunks = []
        while chunk := self.read(_COPY_CHUNK_BYTES):
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        if not self.closed:
            self._body.close()
        super().close()


def open_object(s3: S3Client, obj: SourceObject, bucket: str) -> BinaryIO:
    """A stream of exactly the content discovery saw (pinned by etag), for sequential readers."""
    action = f"read s3://{bucket}/{obj.key}"
    with s3_errors(f"cannot {action}", PreCommitError):
        response = s3.get_object(Bucket=bucket, Key=obj.key, IfMatch=f'"{obj.etag}"')
    body = response["Body"]
    if response.get("ContentLength") != obj.size:
        body.close()
        raise PreCommitError(
            f"cannot {action}: it is {response.get('ContentLength')} bytes, the manifest "
            f"recorded {obj.size}"
        )
    return io.BufferedReader(_VerifiedBody(body, action, obj.size), _COPY_CHUNK_BYTES)


def download_object(s3: S3Client, obj: SourceObject, bucket: str, dest: Path) -> Path:
    """The object in a local file, for readers that seek (Parquet). `dest` appears complete or
    not at all: bytes go to a temporary sibling that is renamed once the size checks out."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")
    try:
        with open_object(s3, obj, bucket) as source, partial.open("wb") as target:
            shutil.copyfileobj(source, target, _COPY_CHUNK_BYTES)
        written = partial.stat().st_size
        if written != obj.size:
            raise TransientError(
                f"cannot read s3://{bucket}/{obj.key}: downloaded {written} of {obj.size} bytes"
            )
        partial.replace(dest)
    finally:
        partial.unlink(missing_ok=True)
    return dest
