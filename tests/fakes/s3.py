"""The S3 calls the core makes, on a dict: `list_objects_v2` with a delimiter, in pages of
`MaxKeys` (`page_size` by default, S3's 1000 at most) continued by token, and its paginator
(`PaginationConfig`'s `PageSize`); `get_object` pinned by `IfMatch`, `put_object`,
`delete_object`, and multipart uploads, whose ETag is S3's (the MD5 of the parts' MD5s and
their count), not the object's MD5. Refusals are botocore's own `ClientError`s with S3's
codes, so fleet_import/s3/sources.py translates them exactly as it does a real answer.
tests/contract/test_s3_contract.py holds it to moto's server. For tests of the algorithm with
no moto server: the staging area is a local directory (`StagingArea(str(path))`), which needs
no S3 at all.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import io
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

_PAGE_SIZE = 1000  # what S3 returns per page at most
_MIN_PART_SIZE = 5 * 1024 * 1024  # of every part of a multipart upload but the last


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
        self._uploads: dict[str, tuple[str, str, dict[int, bytes]]] = {}
        """upload id -> (bucket, key, part number -> body): multipart uploads in progress."""

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
        self._store(Bucket, Key, bytes(Body), etag, "PutObject")
        return {"ETag": f'"{etag}"'}

    def _store(self, bucket: str, key: str, body: bytes, etag: str, operation: str) -> None:
        with self._lock:
            self._bucket(bucket, operation)[key] = StoredObject(body, etag, dt.datetime.now(dt.UTC))

    # -- multipart uploads: an ETag that is no MD5 of the object, as S3's ------------------

    def create_multipart_upload(self, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803
        with self._lock:
            self._bucket(Bucket, "CreateMultipartUpload")
            upload_id = uuid.uuid4().hex
            self._uploads[upload_id] = (Bucket, Key, {})
        return {"Bucket": Bucket, "Key": Key, "UploadId": upload_id}

    def upload_part(
        self, Bucket: str, Key: str, UploadId: str, PartNumber: int, Body: bytes  # noqa: N803
    ) -> dict[str, Any]:
        with self._lock:
            upload = self._uploads.get(UploadId)
            if upload is None or upload[:2] != (Bucket, Key):
                raise client_error("NoSuchUpload", 404, "UploadPart")
            upload[2][PartNumber] = bytes(Body)
        return {"ETag": f'"{hashlib.md5(Body, usedforsecurity=False).hexdigest()}"'}

    def complete_multipart_upload(
        self, Bucket: str, Key: str, UploadId: str, MultipartUpload: Mapping[str, Any]  # noqa: N803
    ) -> dict[str, Any]:
        with self._lock:
            upload = self._uploads.pop(UploadId, None)
        if upload is None or upload[:2] != (Bucket, Key):
            raise client_error("NoSuchUpload", 404, "CompleteMultipartUpload")
        stored = upload[2]
        named = [(part["PartNumber"], part["ETag"].strip('"')) for part in MultipartUpload["Parts"]]
        bodies = []
        for number, etag in named:
            body = stored.get(number)
            if body is None or hashlib.md5(body, usedforsecurity=False).hexdigest() != etag:
                raise client_error("InvalidPart", 400, "CompleteMultipartUpload")
            bodies.append(body)
        if any(len(body) < _MIN_PART_SIZE for body in bodies[:-1]):
            raise client_error("EntityTooSmall", 400, "CompleteMultipartUpload")
        digests = b"".join(hashlib.md5(b, usedforsecurity=False).digest() for b in bodies)
        etag = f"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{len(bodies)}"
        self._store(Bucket, Key, b"".join(bodies), etag, "CompleteMultipartUpload")
        return {"Bucket": Bucket, "Key": Key, "ETag": f'"{etag}"'}

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

    def list_objects_v2(
        self,
        Bucket: str,  # noqa: N803
        Prefix: str = "",  # noqa: N803
        Delimiter: str | None = None,  # noqa: N803
        MaxKeys: int | None = None,  # noqa: N803
        ContinuationToken: str | None = None,  # noqa: N803
    ) -> dict[str, Any]:
        """One page: at most MaxKeys keys and folders (a folder takes a key's place), after
        the continuation token (here the last name the previous page listed)."""
        self._fault("ListObjectsV2")
        limit = min(self.page_size if MaxKeys is None else MaxKeys, _PAGE_SIZE)
        entries = [
            entry
            for entry in self._entries(Bucket, Prefix, Delimiter)
            if ContinuationToken is None or entry[0] > ContinuationToken
        ]
        chunk = entries[:limit]
        page: dict[str, Any] = {
            "Name": Bucket,
            "Prefix": Prefix,
            "MaxKeys": limit,
            "KeyCount": len(chunk),
            "IsTruncated": len(entries) > limit,
        }
        contents = [entry for _, entry in chunk if entry is not None]
        prefixes = [{"Prefix": name} for name, entry in chunk if entry is None]
        if contents:
            page["Contents"] = contents
        if prefixes:
            page["CommonPrefixes"] = prefixes
        if Delimiter:
            page["Delimiter"] = Delimiter
        if page["IsTruncated"]:
            page["NextContinuationToken"] = chunk[-1][0]
        if ContinuationToken is not None:
            page["ContinuationToken"] = ContinuationToken
        return page

    def _entries(
        self, bucket: str, prefix: str, delimiter: str | None
    ) -> list[tuple[str, dict[str, Any] | None]]:
        """(name, Contents entry) of each key, (folder, None) of each folder, by name."""
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
        return entries


class _ListPaginator:
    def __init__(self, s3: MemoryS3) -> None:
        self._s3 = s3

    def paginate(
        self,
        Bucket: str,  # noqa: N803
        Prefix: str = "",  # noqa: N803
        Delimiter: str | None = None,  # noqa: N803
        PaginationConfig: Mapping[str, Any] | None = None,  # noqa: N803
    ) -> Iterator[dict[str, Any]]:
        """Page after page, as botocore's paginator follows the continuation tokens."""
        page_size = (PaginationConfig or {}).get("PageSize")
        token = None
        while True:
            page = self._s3.list_objects_v2(
                Bucket=Bucket,
                Prefix=Prefix,
                Delimiter=Delimiter,
                MaxKeys=page_size,
                ContinuationToken=token,
            )
            yield page
            if not page["IsTruncated"]:
                return
            token = page["NextContinuationToken"]
