"""A local OpenLineage endpoint for the lineage tests, and the spec's rules to check what
it receives against.

The openlineage-python wheel ships no JSON schema file (only the generated attrs classes and
the schema URLs they name), so `SPEC` transcribes the required-field rules of the
OpenLineage 2-0-2 spec for a RunEvent, its run, job, datasets and facets; `VALIDATOR`
checks them (formats too: date-time, uri, uuid) with jsonschema.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jsonschema

_FACET = {
    "type": "object",
    "required": ["_producer", "_schemaURL"],
    "properties": {
        "_producer": {"type": "string", "format": "uri"},
        "_schemaURL": {"type": "string", "format": "uri"},
    },
}
_DATASET = {
    "type": "object",
    "required": ["namespace", "name"],
    "properties": {
        "namespace": {"type": "string", "minLength": 1},
        "name": {"type": "string", "minLength": 1},
        "facets": {"type": "object", "additionalProperties": _FACET},
        "inputFacets": {"type": "object", "additionalProperties": _FACET},
        "outputFacets": {"type": "object", "additionalProperties": _FACET},
    },
}
SPEC = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["eventTime", "producer", "schemaURL", "run", "job"],
    "properties": {
        "eventTime": {"type": "string", "format": "date-time"},
        "producer": {"type": "string", "format": "uri"},
        "schemaURL": {"type": "string", "format": "uri"},
        "eventType": {"enum": ["START", "RUNNING", "COMPLETE", "ABORT", "FAIL", "OTHER"]},
        "run": {
            "type": "object",
            "required": ["runId"],
            "properties": {
                "runId": {"type": "string", "format": "uuid"},
                "facets": {"type": "object", "additionalProperties": _FACET},
            },
        },
        "job": {
            "type": "object",
            "required": ["namespace", "name"],
            "properties": {
                "namespace": {"type": "string", "minLength": 1},
                "name": {"type": "string", "minLength": 1},
                "facets": {"type": "object", "additionalProperties": _FACET},
            },
        },
        "inputs": {"type": "array", "items": _DATASET},
        "outputs": {"type": "array", "items": _DATASET},
    },
}
VALIDATOR = jsonschema.Draft202012Validator(
    SPEC, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
)


class Receiver:
    """A lineage endpoint on 127.0.0.1 (Marquez's POST /api/v1/lineage) that can go down
    (its socket closed: connection refused) and come back on the same port."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self.start()

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        received = self.events

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path != "/api/v1/lineage":
                    self.send_response(404)
                else:
                    received.append(json.loads(body))
                    self.send_response(201)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
        self._server = None
