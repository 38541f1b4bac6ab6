"""The S3 the core reads, asserted against moto's server and against MemoryS3 alike, on what
an S3 does that a dict would not: a multipart upload's ETag is no MD5 of the object, a
listing comes in pages and continues by token, a missing key or bucket is S3's own error, a
changed object changes its ETag and a read pinned to the old one is refused."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.fakes.s3 import MemoryS3

PART = 5 * 1024 * 1024  # S3's smallest part but the last


@pytest.fixture(params=[pytest.param("moto", marks=pytest.mark.server), "memory"])
def bucket_s3(request: pytest.FixtureRequest) -> tuple[Any, str]:
    """(client, an empty bucket of its own)."""
    if request.param == "moto":
        return request.getfixturevalue("s3"), request.getfixturevalue("landing_bucket")
    s3 = MemoryS3()
    s3.create_bucket(Bucket="fleet-landing")
    return s3, "fleet-landing"


def _error(raised: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response = raised.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def _listed_etags(s3: Any, bucket: str, prefix: str) -> dict[str, str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"]: o["ETag"] for page in pages for o in page.get("Contents", ())}


def test_a_multipart_upload_s_etag_is_not_the_md5_of_its_body(bucket_s3) -> None:
    s3, bucket = bucket_s3
    parts = [b"a" * PART, b"tail"]
    upload = s3.create_multipart_upload(Bucket=bucket, Key="d/trips-1.csv")["UploadId"]
    done = [
        {
            "PartNumber": number,
            "ETag": s3.upload_part(
                Bucket=bucket, Key="d/trips-1.csv", UploadId=upload, PartNumber=number, Body=body
            )["ETag"],
        }
        for number, body in enumerate(parts, start=1)
    ]
    s3.complete_multipart_upload(
        Bucket=bucket, Key="d/trips-1.csv", UploadId=upload, MultipartUpload={"Parts": done}
    )
    digests = b"".join(hashlib.md5(part, usedforsecurity=False).digest() for part in parts)
    expected = f'"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-2"'
    assert _listed_etags(s3, bucket, "d/") == {"d/trips-1.csv": expected}
    read = s3.get_object(Bucket=bucket, Key="d/trips-1.csv", IfMatch=expected)
    assert read["ETag"] == expected and read["ContentLength"] == PART + 4
    assert read["Body"].read() == b"".join(parts)


def test_a_listing_comes_in_pages_that_continue_by_token(bucket_s3) -> None:
    s3, bucket = bucket_s3
    for name in ("a.csv", "b.csv", "c.csv", "sub/x.csv", "sub/y.csv", "t.csv"):
        s3.put_object(Bucket=bucket, Key=f"d/{name}", Body=name.encode())
    s3.put_object(Bucket=bucket, Key="e/other.csv", Body=b"x")
    pages = list(
        s3.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix="d/", Delimiter="/", PaginationConfig={"PageSize": 2}
        )
    )
    listed = [
        [o["Key"] for o in page.get("Contents", ())] + [p["Prefix"] for p in
                                                         page.get("CommonPrefixes", ())]
        for page in pages
    ]
    # A folder takes a place in a page as a key does.
    assert listed == [["d/a.csv", "d/b.csv"], ["d/c.csv", "d/sub/"], ["d/t.csv"]]
    assert [page["KeyCount"] for page in pages] == [2, 2, 1]

    first = s3.list_objects_v2(Bucket=bucket, Prefix="d/", MaxKeys=4)
    assert first["IsTruncated"] is True and first["KeyCount"] == 4
    rest = s3.list_objects_v2(
        Bucket=bucket, Prefix="d/", MaxKeys=4, ContinuationToken=first["NextContinuationToken"]
    )
    assert rest["IsTruncated"] is False and "NextContinuationToken" not in rest
    keys = [o["Key"] for o in first["Contents"] + rest["Contents"]]
    assert keys == [f"d/{n}" for n in ("a.csv", "b.csv", "c.csv", "sub/x.csv", "sub/y.csv",
                                      "t.csv")]
    empty = s3.list_objects_v2(Bucket=bucket, Prefix="nothing/")
    assert empty["KeyCount"] == 0 and "Contents" not in empty and empty["IsTruncated"] is False


def test_a_missing_key_or_bucket_is_s3_s_own_error(bucket_s3) -> None:
    s3, bucket = bucket_s3
    with pytest.raises(ClientError) as missing:
        s3.get_object(Bucket=bucket, Key="d/never.csv")
    assert _error(missing) == ("NoSuchKey", 404)
    s3.delete_object(Bucket=bucket, Key="d/never.csv")  # deleting nothing is no error
    with pytest.raises(ClientError) as no_bucket:
        s3.get_object(Bucket=f"no-such-{uuid.uuid4().hex[:12]}", Key="d/a.csv")
    assert _error(no_bucket) == ("NoSuchBucket", 404)
    with pytest.raises(ClientError) as no_bucket_listed:
        list(s3.get_paginator("list_objects_v2").paginate(Bucket=f"no-such-{uuid.uuid4().hex}"))
    assert _error(no_bucket_listed) == ("NoSuchBucket", 404)


def test_a_changed_object_changes_its_etag_and_refuses_the_old_one(bucket_s3) -> None:
    s3, bucket = bucket_s3
    first = s3.put_object(Bucket=bucket, Key="d/trips-1.csv", Body=b"one")["ETag"]
    assert first == f'"{hashlib.md5(b"one", usedforsecurity=False).hexdigest()}"'
    assert s3.put_object(Bucket=bucket, Key="d/trips-1.csv", Body=b"one")["ETag"] == first
    changed = s3.put_object(Bucket=bucket, Key="d/trips-1.csv", Body=b"two")["ETag"]
    assert changed != first
    assert _listed_etags(s3, bucket, "d/") == {"d/trips-1.csv": changed}
    with pytest.raises(ClientError) as stale:
        s3.get_object(Bucket=bucket, Key="d/trips-1.csv", IfMatch=first)
    assert _error(stale) == ("PreconditionFailed", 412)
    assert s3.get_object(Bucket=bucket, Key="d/trips-1.csv", IfMatch=changed)["Body"].read() == (
        b"two"
    )
