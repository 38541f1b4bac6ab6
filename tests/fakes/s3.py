"""The S3 calls the core makes, on a dict: paginated `list_objects_v2` with a delimiter,
`get_object` pinned by `IfMatch`, `put_object` and `delete_object`. Refusals are botocore's
own `ClientError`s with S3's codes, so fleet_import/s3/sources.py translates them exactly as
it does a real answer. For tests of the algorithm with no moto server: the staging area is a
local directory (`StagingArea(str(path))`), which needs no S3 at all.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

_PAGE_SIZE = 1000  # what S3 returns per page at most


@dataclass(frozen=True)
class StoredObject:
    body: bytes
    etag: str
    last_modified: dt.datetime


def client_error(code: str, status: int, operation: str) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        operation,
    )


class MemoryS3:
    def __init__(self, page_size: int = _PAGE_SIZE) -> None:
        self.buckets: dict[str, dict[str, StoredObject]] = {}
        self.page_size = page_size
        self.faults: dict[str, ClientError] = {}
        """operation -> the error its next call raises (e.g. `client_error("SlowDown", 503,
        "GetObject")`)."""
        self._lock = threading.Lock()

    def _fault(self, operation: str) -> None:
        failure = self.faults.pop(operation, None)
        if failure is not None:
            raise failure

    def _bucket(self, name: str, operation: str) -> dict[str, StoredObject]:
        if name not in self.buckets:
            raise client_error("NoSuchBucket", 404, operation)
        return self.buckets[name]

    def create_bucket(self, Bucket: str) -> None:  # noqa: N803 - boto3's argument names
        self.buckets.setdefault(Bucket, {})

    def put_object(self, Bucket: str, Key: str, Body: bytes = b"") -> dict[str, Any]:  # noqa: N803
        etag = hashlib.md5(Body, usedforsecurity=False).hexdigest()
        with self._lock:
            self._bucket(Bucket, "PutObject")[Key] = StoredObject(
                bytes(Body), etag, dt.datetime.now(dt.UTC)
            )
        return {"ETag": f'"{etag}"'}

    def put_objects(self, bucket: str, objects: Mapping[str, bytes]) -> None:
        self.create_bucket(bucket)
        for key, body in objects.items():
            self.put_object(Bucket=bucket, Key=key, Body=body)

    def delete_object(self, Bucket: str, Key: str) -> None:  # noqa: N803
        with self._lock:
            self._bucket(Bucket, "DeleteObject").pop(Key, None)

    def get_object(self, Bucket: str, Key: str, IfMatch: str | None = None) -> dict[str, Any]:  # noqa: N803
        self._fault("GetObject")
        with self._lock:
            stored = self._bucket(Bucket, "GetObject").get(Key)
        if stored is None:
            raise client_error("NoSuchKey", 404, "GetObject")
        if IfMatch is not None and IfMatch.strip('"') != stored.etag:
            raise client_error("PreconditionFailed", 412, "GetObject")
        return {
            "Body": io.BytesIO(stored.body),
            "ContentLength": len(stored.body),
            "ETag": f'"{stored.etag}"',
        }

    def get_paginator(self, operation: str) -> _ListPaginator:
        if operation != "list_objects_v2":
            raise NotImplementedError(operation)
        return _ListPaginator(self)

    def list_page(self, bucket: str, prefix: str, delimiter: str | None) -> list[dict[str, Any]]:
        """Every page of one listing, as `list_objects_v2` answers them."""
        self._fault("ListObjectsV2")
        with self._lock:
            objects = sorted(self._bucket(bucket, "ListObjectsV2").items())
        entries: list[tuple[str, dict[str, Any] | None]] = []
        folders: set[str] = set()
        for key, stored in objects:
            if not key.startswith(prefix):
                continue
            rest = key[len(prefix) :]
            if delimiter and delimiter in rest:
                folder = prefix + rest.split(delimiter, 1)[0] + delimiter
                if folder not in folders:
                    folders.add(folder)
                    entries.append((folder, None))
                continue
            entry = {
                "Key": key,
                "Size": len(stored.body),
                "ETag": f'"{stored.etag}"',
                "LastModified": stored.last_modified,
            }
            entries.append((key, entry))
        pages = []
        for start in range(0, max(len(entries), 1), self.page_size):
            chunk = entries[start : start + self.page_size]
            page: dict[str, Any] = {"KeyCount": len(chunk)}
            contents = [entry for _, entry in chunk if entry is not None]
            prefixes = [{"Prefix": name} for name, entry in chunk if entry is None]
            if contents:
                page["Contents"] = contents
            if prefixes:
                page["CommonPrefixes"] = prefixes
            pages.append(page)
        return pages


class _ListPaginator:
    def __init__(self, s3: MemoryS3) -> None:
        self._s3 = s3

    def paginate(
        self,
        Bucket: str,  # noqa: N803
        Prefix: str = "",  # noqa: N803
        Delimiter: str | None = None,  # noqa: N803
    ) -> Iterator[dict[str, Any]]:
        yield from self._s3.list_page(Bucket, Prefix, Delimiter)
