"""The fault proxy in HTTP mode: request heads found in a client's stream (bodies skipped by
their framing), and its S3 faults against moto through a real botocore client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from fleet_import.s3.client import S3Limits, s3_client
from tests.faults.httpwire import HEAD, Requests
from tests.faults.proxy import FaultProxy

pytestmark = pytest.mark.faults


def _heads(*chunks: bytes) -> list[bytes]:
    requests = Requests()
    return [m.split(b"\r\n", 1)[0] for c in chunks for k, m in requests.feed(c) if k == HEAD]


def test_heads_are_found_across_bodies_chunks_and_split_reads() -> None:
    put = b"PUT /b/k HTTP/1.1\r\nContent-Length: 20\r\n\r\n" + b"GET /not-a-request!\n"
    chunked = (
        b"PUT /b/c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nGET /\r\n0\r\nx-amz-checksum-crc32: AAAA\r\n\r\n"
    )
    get = b"GET /b?list-type=2 HTTP/1.1\r\nHost: x\r\n\r\n"
    stream = put + chunked + get
    expected = [b"PUT /b/k HTTP/1.1", b"PUT /b/c HTTP/1.1", b"GET /b?list-type=2 HTTP/1.1"]
    assert _heads(stream) == expected
    assert _heads(*(stream[i : i + 7] for i in range(0, len(stream), 7))) == expected


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    host, port = moto_endpoint.removeprefix("http://").rsplit(":", 1)
    with FaultProxy((host, int(port)), protocol="http") as proxy:
        yield proxy


def _client(proxy: FaultProxy, attempts: int) -> Any:
    limits = S3Limits(connect_timeout=1.0, read_timeout=2.0, max_attempts=attempts)
    return s3_client(f"http://127.0.0.1:{proxy.port}", limits)


def test_a_throttle_botocore_outlasts_succeeds_and_a_longer_one_is_slow_down(
    proxy: FaultProxy, landing_bucket: str
) -> None:
    proxy.throttle_on(r"^GET [^\s]*list-type=2", 2)
    assert _client(proxy, 3).list_objects_v2(Bucket=landing_bucket)["KeyCount"] == 0
    proxy.throttle_on(r"^GET [^\s]*list-type=2", 2)
    with pytest.raises(ClientError) as throttled:
        _client(proxy, 2).list_objects_v2(Bucket=landing_bucket)
    assert throttled.value.response["Error"]["Code"] == "SlowDown"


def test_a_reset_is_retried_and_a_black_hole_costs_exactly_the_attempts(
    proxy: FaultProxy, landing_bucket: str
) -> None:
    fired = proxy.reset_on(r"^PUT [^?\s]*/k ")
    _client(proxy, 2).put_object(Bucket=landing_bucket, Key="k", Body=b"x" * 100)
    assert fired.is_set()
    proxy.black_hole()
    before = proxy.accepted
    with pytest.raises(Exception, match="Read timeout"):
        _client(proxy, 2).get_object(Bucket=landing_bucket, Key="k")
    assert proxy.accepted - before == 2  # botocore's attempts, one connection each
