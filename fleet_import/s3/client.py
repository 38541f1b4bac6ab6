"""The core's S3 client, and the one listing of a prefix's direct children.

Discovery lists one delivery folder and the sweep walks the landing zone folder by folder;
both need every page of a `Delimiter="/"` listing, so both use `list_children`. Errors are
translated by each caller (`s3.errors.s3_errors`), which knows what it was doing and what a
refusal means there, so botocore errors leave this module as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

import boto3
import botocore.loaders
import botocore.session
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from fleet_import.config import (
    DEFAULT_S3_CONNECT_TIMEOUT_SECONDS,
    DEFAULT_S3_MAX_ATTEMPTS,
    DEFAULT_S3_READ_TIMEOUT_SECONDS,
    Settings,
)

# mypy_boto3_s3.S3Client where the stubs are installed; they are not a dependency.
S3Client: TypeAlias = Any

# botocore is the one layer that retries S3 (throttling such as 503 SlowDown, 5xx, timeouts,
# dropped connections), per request: what still fails after it is marked `retried`
# (errors.FleetImportError) and no step runner, Prefect task or transfer manager retries it
# again. Standard mode, not adaptive: adaptive's client-side rate limiter may sleep for as
# long as it likes, which no bound could state.
_RETRY_MODE = "standard"
_BACKOFF_CAP_SECONDS = 20.0
"""botocore standard mode's backoff before retry i (1-based): rand(0, 1) x min(2**(i-1), 20)."""
TRANSFER_CONFIG = TransferConfig(num_download_attempts=1)
"""upload_file / download_file: s3transfer retries a download's timeouts 5 times over
botocore's own attempts by default; once is botocore's job."""
_SERVICE_MODELS = botocore.loaders.create_loader()


@dataclass(frozen=True)
class S3Limits:
    """How long one S3 call may take to give up: its attempts, and each one's timeouts."""

    connect_timeout: float = DEFAULT_S3_CONNECT_TIMEOUT_SECONDS
    read_timeout: float = DEFAULT_S3_READ_TIMEOUT_SECONDS
    max_attempts: int = DEFAULT_S3_MAX_ATTEMPTS

    @classmethod
    def of(cls, settings: Settings) -> S3Limits:
        return cls(
            settings.s3_connect_timeout_seconds,
            settings.s3_read_timeout_seconds,
            settings.s3_max_attempts,
        )

    @property
    def call_bound(self) -> float:
        """The longest one S3 call takes against an endpoint that never answers: every
        attempt waits out its connect and read timeouts, plus the backoff between them."""
        backoff = sum(
            min(2.0**retry, _BACKOFF_CAP_SECONDS) for retry in range(self.max_attempts - 1)
        )
        return self.max_attempts * (self.connect_timeout + self.read_timeout) + backoff


def s3_client(endpoint_url: str | None = None, limits: S3Limits | None = None) -> S3Client:
    """An S3 client whose own retries are the only ones S3 gets, bounded by `limits`."""
    limits = limits or S3Limits()
    config = Config(
        retries={"mode": _RETRY_MODE, "total_max_attempts": limits.max_attempts},
        connect_timeout=limits.connect_timeout,
        read_timeout=limits.read_timeout,
    )
    # A session per client (boto3's default session is not safe to share between threads, and
    # a shared one would pin the credentials it first resolved), but one loader of botocore's
    # service models: parsing them again costs more than everything else a client needs.
    botocore_session = botocore.session.get_session()
    botocore_session.register_component("data_loader", _SERVICE_MODELS)
    session = boto3.session.Session(botocore_session=botocore_session)
    return session.client("s3", endpoint_url=endpoint_url, config=config)


def settings_s3_client(settings: Settings) -> S3Client:
    """The client every part of the product builds from its settings."""
    return s3_client(settings.s3_endpoint_url, S3Limits.of(settings))


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
