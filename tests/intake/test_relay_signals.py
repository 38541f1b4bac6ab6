"""`fleet-import relay` as systemd runs it: a real process, stopped by a signal.

The event API is a small stand-in answering `POST /api/events` (what the relay's emitter
calls), so that a test can hold an emit in flight while the signal arrives.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleet_import.intake.notifications import event_id
from tests.intake import test_relay
from tests.intake.test_relay import _body, _queue_depth, _record
from tests.s3fixtures import REGION

_REPO_ROOT = Path(__file__).resolve().parents[2]
_STARTUP_SECONDS = 60.0  # importing Prefect on a loaded CI machine
_STOP_BOUND_SECONDS = 1.5  # the relay promises about one second; the rest is slack
_READY_LINE = "relaying S3 notifications from"

# The SQS client and the queue (1 s visibility timeout) of the relay's own tests.
queue_url = test_relay.queue_url


class EventApi:
    """Accepts events like the Prefect API (204), after `delay` seconds; records the ids of
    the events that arrived and of those it accepted."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.arrived: list[str] = []
        self.accepted: list[str] = []
        self.arrival = threading.Event()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if not self.path.endswith("/events"):
                    self.send_error(404)
                    return
                ids = [event["id"] for event in json.loads(body)]
                api.arrived.extend(ids)
                api.arrival.set()
                time.sleep(api.delay)
                self.send_response(204)
                self.end_headers()
                api.accepted.extend(ids)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api"


@pytest.fixture
def event_api() -> Iterator[EventApi]:
    api = EventApi()
    serving = threading.Thread(target=api.server.serve_forever, daemon=True)
    serving.start()
    yield api
    api.server.shutdown()
    api.server.server_close()


class RelayProcess:
    """`python -m fleet_cli relay` with the default 20 s long poll, its stderr collected."""

    def __init__(self, queue_url: str, moto_endpoint: str, api_url: str, home: Path) -> None:
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": REGION,
            "PREFECT_API_URL": api_url,
            "PREFECT_HOME": str(home / "prefect"),
            "PREFECT_CLIENT_CSRF_SUPPORT_ENABLED": "false",
            "PREFECT_CLIENT_MAX_RETRIES": "0",
            "PYTHONUNBUFFERED": "1",
        }
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fleet_cli",
                "relay",
                "--queue-url",
                queue_url,
                "--endpoint-url",
                moto_endpoint,
                "--dead-letter-file",
                str(home / "dead.jsonl"),
            ],
            cwd=_REPO_ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        assert self.ready.wait(_STARTUP_SECONDS), self.output()

    def _read(self) -> None:
        assert self.process.stderr is not None
        with self.process.stderr:
            for line in self.process.stderr:
                self.lines.append(line)
                if _READY_LINE in line:
                    self.ready.set()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._reader.join(5)

    def output(self) -> str:
        return "".join(self.lines)

    def stop(self, signum: int) -> float:
        """Send `signum`; the seconds until the process exited (it must exit cleanly)."""
        sent = time.monotonic()
        self.process.send_signal(signum)
        try:
            code = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        elapsed = time.monotonic() - sent
        self._reader.join(5)  # the whole output, for the assertions that read it
        assert code == 0, self.output()
        return elapsed


@pytest.fixture
def start_relay(
    queue_url: str, moto_endpoint: str, event_api: EventApi, tmp_path: Path
) -> Iterator[Any]:
    started: list[RelayProcess] = []

    def start() -> RelayProcess:
        started.append(RelayProcess(queue_url, moto_endpoint, event_api.url, tmp_path))
        return started[-1]

    yield start
    for relay in started:
        relay.close()


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_relay_during_its_long_poll(start_relay: Any, signum: int) -> None:
    relay = start_relay()
    time.sleep(0.5)  # inside the 20 s receive by now

    assert relay.stop(signum) < _STOP_BOUND_SECONDS, relay.output()
    assert "relay stopped" in relay.output()


@pytest.mark.slow
def test_a_message_in_flight_at_the_signal_is_not_lost(
    start_relay: Any, sqs: Any, queue_url: str, event_api: EventApi
) -> None:
    relayed_key = "acme/fleet/2026-07-22/_SUCCESS"
    held_key = "globex/fleet/2026-07-22/_SUCCESS"
    relay = start_relay()
    sqs.send_message(QueueUrl=queue_url, MessageBody=_body(_record(relayed_key, etag="e1")))
    relayed = str(event_id("fleet-landing", relayed_key, "e1"))
    deadline = time.monotonic() + 15
    while relayed not in event_api.accepted or _queue_depth(sqs, queue_url):
        assert time.monotonic() < deadline, relay.output()
        time.sleep(0.05)

    # The next message's emit is still waiting for the API when the signal arrives.
    event_api.delay = 5.0
    event_api.arrival.clear()
    held_body = _body(_record(held_key, etag="e2"))
    sqs.send_message(QueueUrl=queue_url, MessageBody=held_body)
    assert event_api.arrival.wait(15), relay.output()

    assert relay.stop(signal.SIGTERM) < _STOP_BOUND_SECONDS, relay.output()

    # Received but never accepted, so never deleted: back after the 1 s visibility timeout.
    assert str(event_id("fleet-landing", held_key, "e2")) not in event_api.accepted
    back = sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=5, VisibilityTimeout=30)
    assert [message["Body"] for message in back.get("Messages", [])] == [held_body]
    assert event_api.accepted == [relayed]  # the first was relayed once and deleted
