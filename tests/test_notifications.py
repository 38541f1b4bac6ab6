"""Notifications through Prefect automations, against a real `prefect server`: the
automations `python -m blocks.register --notify` creates send a held batch, a failed
publication and a late tenant, as the flows' event sink emits them, to a saved
notification block pointing at a local webhook receiver; a failure before commit is not
sent (the alert rules and `batches list` cover it); registering again updates in place."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from blocks.notifications import NOTICES
from tests.prefect_server import PrefectServer, prefect_server, run

pytestmark = [pytest.mark.e2e, pytest.mark.server, pytest.mark.timeout(600)]

_WAIT_SECONDS = 120.0
_QUIET_SECONDS = 10.0
BATCH = "00000001-0000-4000-8000-000000000001"

SAVE_BLOCK = """
import sys
from prefect.blocks.notifications import CustomWebhookNotificationBlock
CustomWebhookNotificationBlock(
    name="fleet-test", url=sys.argv[1], allow_private_urls=True,
    json_data={"subject": "{{subject}}", "body": "{{body}}"},
).save("ops", overwrite=True)
"""
EMIT = f"""
from flows.common import prefect_event_sink
from fleet_import.publication.events import event_payload
import uuid
scope = "fleet_s3:s3://fleet-landing/acme/fleet/2026-07-22/"
batch = uuid.UUID("{BATCH}")
prefect_event_sink("fleet.batch.held", event_payload(
    "acme", scope, batch, kind="held", error="held for review: trips would go from 100 to 3"))
prefect_event_sink("fleet.batch.failed", event_payload(
    "acme", scope, batch, kind="failed_publication", error="notify: connection refused"))
prefect_event_sink("fleet.batch.failed", event_payload(
    "globex", scope, batch, kind="failed_pre_commit", error="a bad header"))
prefect_event_sink("fleet.tenant.late", {{
    "tenant_id": "globex", "dataset": "trips", "expected_at": "2026-07-22T04:00:00+00:00",
    "found": "no folder dated 2026-07-22"}})
"""


@pytest.fixture
def received() -> Iterator[tuple[str, list[dict]]]:
    bodies: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            length = int(self.headers.get("Content-Length") or 0)
            bodies.append(json.loads(self.rfile.read(length) or b"{}"))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", bodies
    finally:
        server.shutdown()
        server.server_close()


def python(server: PrefectServer, code: str, *args: str) -> str:
    done = run([sys.executable, "-c", code, *args], server.env())
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_held_failed_publication_and_late_reach_the_webhook(
    tmp_path: Path, received: tuple[str, list[dict]]
) -> None:
    url, bodies = received
    with prefect_server(tmp_path / "prefect") as server:
        python(server, SAVE_BLOCK, url)
        register = [sys.executable, "-m", "blocks.register", "--notify", "custom-webhook/ops"]
        first = run(register, server.env())
        assert first.returncode == 0, first.stdout + first.stderr
        assert all(f"automation {n.name} created" in first.stdout for n in NOTICES), first.stdout
        again = run(register, server.env())
        assert all(f"automation {n.name} updated" in again.stdout for n in NOTICES), again.stdout
        missing = run([*register[:-1], "custom-webhook/nobody"], server.env())
        assert missing.returncode == 2 and "no such block" in missing.stderr

        python(server, EMIT)
        deadline = time.monotonic() + _WAIT_SECONDS
        while len(bodies) < len(NOTICES) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(_QUIET_SECONDS)  # anything else would have arrived by now
    by_subject = {body["subject"]: body["body"] for body in bodies}
    assert len(bodies) == len(NOTICES), bodies
    assert by_subject["fleet-import: a batch is held for review."] == (
        f"tenant acme, batch {BATCH}: held for review: trips would go from 100 to 3"
    )
    assert by_subject["fleet-import: a publication failed."] == (
        f"tenant acme, batch {BATCH}: notify: connection refused (fleet-import resume {BATCH}"
        " finishes it)"
    )
    assert by_subject["fleet-import: a tenant is late."] == (
        "tenant globex, dataset trips: expected by 2026-07-22T04:00:00+00:00; found: no folder"
        " dated 2026-07-22"
    )
