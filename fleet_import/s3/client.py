"""The core's S3 client, and the one listing of a prefix's direct children.

Discovery lists one delivery folder and the sweep walks the landing zone folder by folder;
both need every page of a `Delimiter="/"` listing, so both use `list_children`. Errors are
translated by each caller (sources._s3_errors), which knows what it was doing and what a
refusal means there, so botocore errors leave this module as they are.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeAlias

import boto3
import botocore.loaders
import botocore.session
from botocore.config import Config

# mypy_boto3_s3.S3Client where the stubs are installed; they are not a dependency.
S3Client: TypeAlias = Any

# botocore retries throttling, 5xx and dropped connections itself (adaptive mode also slows
# the client down under throttling); what is still failing after that reaches the caller.
_MAX_ATTEMPTS = 8
_CONNECT_TIMEOUT_SECONDS = 10.0
_READ_TIMEOUT_SECONDS = 60.0
_SERVICE_MODELS = botocore.loaders.create_loader()


def s3_client(
    endpoint_url: str | None = None,
    *,
    max_attempts: int | None = None,
    connect_timeout: float = _CONNECT_TIMEOUT_SECONDS,
    read_timeout: float = _READ_TIMEOUT_SECONDS,
) -> S3Client:
    """An S3 client whose retries absorb throttling, so callers only see what persists."""
    config = Config(
        retries={"mode": "adaptive", "max_attempts": max_attempts or _MAX_ATTEMPTS},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
    )
    # A session per client (boto3's default session is not safe to share between threads, and
    # a shared one would pin the credentials it first resolved), but one loader of botocore's
    # service models: parsing them again costs more than everything else a client needs.
    botocore_session = botocore.session.get_session()
    botocore_session.register_component("data_loader", _SERVICE_MODELS)
    session = boto3.session.Session(botocore_session=botocore_session)
    return session.client("s3", endpoint_url=endpoint_url, config=config)


class Children(NamedTuple):
    """What a prefix holds directly, from every page of its listing."""

    objects: list[dict[str, Any]]  # list_objects_v2 `Contents` entries
    folders: list[str]  # the sub-folders' full key prefixes, each ending in '/'


def list_children(s3: S3Client, bucket: str, prefix: str) -> Children:
    """The objects and sub-folders directly under `prefix`, however many pages they take.

    The prefix's own placeholder object (the key `prefix` itself, which consoles create for
    an empty "folder") is not a child. Read eagerly, so that an error on any page is raised
    inside the caller's error translation.
    """
    objects: list[dict[str, Any]] = []
    folders: list[str] = []
    paginator = s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
        objects.extend(o for o in page.get("Contents", ()) if o["Key"] != prefix)
        folders.extend(p["Prefix"] for p in page.get("CommonPrefixes", ()))
    return Children(objects, folders)
