"""S3 for tests: moto's real HTTP server, one per session (per xdist worker).

A real server rather than `mock_aws` so that the code under test talks HTTP exactly as in
production, and so that subprocesses (the CLI, Prefect workers) reach the same S3 through
an endpoint URL. Buckets are unique per test, so tests never see each other's objects.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import boto3
import pytest
from botocore.config import Config
from moto.server import ThreadedMotoServer

from tests.no_servers import refuse_servers

__all__ = [
    "landing_bucket",
    "moto_client",
    "moto_endpoint",
    "moto_server",
    "notify_queue_of",
    "put_objects",
    "small_pages",
    "s3",
    "sqs",
    "staging_bucket",
]

REGION = "us-east-1"
_FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
}
# Variables that could point boto3 at real credentials or a real account.
_UNSET_ENV = ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE")
_PUT_THREADS = 16
_DELETE_BATCH = 1000


@contextmanager
def fake_credentials() -> Iterator[None]:
    """Fake AWS credentials in os.environ (subprocesses inherit them), and none of the
    variables that could point boto3 at a real account."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in _FAKE_ENV.items():
            env.setenv(name, value)
        for name in _UNSET_ENV:
            env.delenv(name, raising=False)
        yield


@contextmanager
def moto_server() -> Iterator[str]:
    """http://127.0.0.1:<port> of a moto server in this process; while it runs, fake
    credentials are in os.environ so that subprocesses authenticate against it too (the
    benchmarks use it as well)."""
    refuse_servers("moto's S3/SQS server")
    with fake_credentials():
        # werkzeug logs every request at INFO to stderr; failures are easier to read without.
        request_log = logging.getLogger("werkzeug")
        previous_level = request_log.level
        request_log.setLevel(logging.WARNING)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()
            request_log.setLevel(previous_level)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


@functools.cache
def _boto_session() -> boto3.session.Session:
    # One session for the test process: a new session reloads botocore's service models
    # (tens of milliseconds per test); clients made from it are independent.
    return boto3.session.Session()


def moto_client(service: str, endpoint: str, config: Config | None = None) -> Any:
    """A boto3 client of `service` for the moto server at `endpoint` (plain boto3,
    independent of the code under test), with the fake credentials given explicitly rather
    than read from the shared session's credential cache."""
    return _boto_session().client(
        service,
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=_FAKE_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=_FAKE_ENV["AWS_SECRET_ACCESS_KEY"],
        config=config,
    )


@pytest.fixture
def s3(moto_endpoint: str) -> Any:
    """A boto3 S3 client for the moto server."""
    return moto_client(
        "s3",
        moto_endpoint,
        Config(retries={"mode": "standard", "max_attempts": 3}, max_pool_connections=_PUT_THREADS),
    )


@pytest.fixture
def sqs(moto_endpoint: str) -> Any:
    """A boto3 SQS client for the moto server."""
    return moto_client("sqs", moto_endpoint)


def notify_queue_of(s3: Any, sqs: Any, bucket: str, queue_url: str) -> None:
    """Make `bucket` send every ObjectCreated notification to the SQS queue at `queue_url`."""
    arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    s3.put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*"]}]
        },
    )


def _empty_and_delete(s3: Any, bucket: str) -> None:
    # Collect first, then delete: deleting while paginating moves the listing under the marker.
    doomed = [
        {"Key": v["Key"], "VersionId": v["VersionId"]}
        for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket)
        for v in [*page.get("Versions", ()), *page.get("DeleteMarkers", ())]
    ]
    for start in range(0, len(doomed), _DELETE_BATCH):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": doomed[start : start + _DELETE_BATCH]})
    s3.delete_bucket(Bucket=bucket)


def _bucket(s3: Any, prefix: str) -> Iterator[str]:
    name = f"{prefix}-{uuid.uuid4().hex[:16]}"
    s3.create_bucket(Bucket=name)
    yield name
    # The server lives for the whole session: free what the test stored.
    _empty_and_delete(s3, name)


@pytest.fixture
def landing_bucket(s3: Any) -> Iterator[str]:
    """A new, empty bucket where tenants' deliveries land."""
    yield from _bucket(s3, "fleet-landing")


@pytest.fixture
def staging_bucket(s3: Any) -> Iterator[str]:
    """A new, empty bucket for normalized Parquet and rejects."""
    yield from _bucket(s3, "fleet-staging")


def put_objects(s3: Any, bucket: str, objects: Mapping[str, bytes]) -> None:
    """Upload many objects at once (in parallel: a thousand sequential PUTs take seconds)."""
    items = list(objects.items())
    if len(items) <= 1:
        for key, body in items:
            s3.put_object(Bucket=bucket, Key=key, Body=body)
        return
    with ThreadPoolExecutor(max_workers=min(_PUT_THREADS, len(items))) as pool:
        # list() re-raises the first failed upload here rather than losing it.
        list(pool.map(lambda item: s3.put_object(Bucket=bucket, Key=item[0], Body=item[1]), items))


def small_pages(client: Any, keys_per_page: int) -> list[str]:
    """Every listing of `client` from now on asks S3 for pages of `keys_per_page` (MaxKeys),
    as if S3's page were that small: the code under test follows its continuation tokens the
    same way, from a few hundred objects instead of the thousands S3's own 1000 would take
    (each PUT costs moto milliseconds of the test worker's CPU). Returns the list each page
    listed is recorded in (its request's prefix), so a test proves it took several."""
    pages: list[str] = []

    def ask_for_small_pages(params: dict[str, Any], **_: Any) -> None:
        params.setdefault("MaxKeys", keys_per_page)
        pages.append(params.get("Prefix", ""))

    client.meta.events.register("provide-client-params.s3.ListObjectsV2", ask_for_small_pages)
    return pages
