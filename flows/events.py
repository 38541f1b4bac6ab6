"""The relay's emitter: S3 arrivals become `aws.s3.object.created` Prefect events.

`prefect.events.emit_event` hands the event to a background worker and returns at once; it
logs, and does not raise, when the API is unreachable. The relay deletes an SQS message
only after its events were accepted, so it needs a send that fails loudly: this module
POSTs each event to the API's `/events` endpoint, which answers 204 only once the server
has published it to its event pipeline (where triggers read it). The event is the same one
`emit_event` would build.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.events import Event
from prefect.exceptions import EventTooLarge
from prefect.settings import get_current_settings

from fleet_import.intake.notifications import S3ObjectCreated
from fleet_import.intake.relay import EVENT_NAME

__all__ = ["PrefectEventEmitter", "build_s3_object_created", "emit_s3_object_created"]


def build_s3_object_created(record: S3ObjectCreated) -> Event:
    """The Prefect event for one new object: resource `s3://bucket/key`, labelled with the
    tenant and delivery folder that triggers and run parameters template from."""
    resource = {
        "prefect.resource.id": record.resource_id,
        "prefect.resource.name": record.key,
        "aws.s3.bucket": record.bucket,
        "aws.s3.key": record.key,
        "aws.s3.etag": record.etag,
    }
    if record.tenant_id is not None:
        resource["fleet.tenant"] = record.tenant_id
    if record.folder is not None:
        resource["fleet.folder"] = record.folder
    payload: dict[str, Any] = {
        "bucket": record.bucket,
        "key": record.key,
        "size": record.size,
        "etag": record.etag,
        "s3_event_name": record.event_name,
        "tenant_id": record.tenant_id,
        "folder": record.folder,
    }
    fields: dict[str, Any] = {
        "event": EVENT_NAME,
        "resource": resource,
        "payload": payload,
        "id": record.event_id,
    }
    if record.event_time is not None:
        # When S3 saw the object, not when the relay got to it: duplicates are identical.
        fields["occurred"] = record.event_time
    event = Event(**fields)
    limit = get_current_settings().server.events.maximum_size_bytes
    if event.size_bytes > limit:
        raise EventTooLarge(event.size_bytes, limit)
    return event


def _send(client: SyncPrefectClient, event: Event) -> None:
    # Prefect's HTTP client retries 429/502/503 itself and raises for every other non-2xx.
    client.request("POST", "/events", json=[event.model_dump(mode="json")])


class PrefectEventEmitter:
    """A relay emitter holding one API connection: `with PrefectEventEmitter() as emit:`."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._client: SyncPrefectClient | None = None

    def __enter__(self) -> PrefectEventEmitter:
        self._client = self._stack.enter_context(get_client(sync_client=True))
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._client = None
        self._stack.close()

    def __call__(self, record: S3ObjectCreated) -> None:
        if self._client is None:
            raise RuntimeError("use PrefectEventEmitter as a context manager")
        _send(self._client, build_s3_object_created(record))


@contextlib.contextmanager
def _client(client: SyncPrefectClient | None) -> Iterator[SyncPrefectClient]:
    if client is not None:
        yield client
        return
    with get_client(sync_client=True) as fresh:
        yield fresh


def emit_s3_object_created(
    record: S3ObjectCreated, client: SyncPrefectClient | None = None
) -> Event:
    """Send one event and return it once the API accepted it; raise if it did not."""
    event = build_s3_object_created(record)
    with _client(client) as api:
        _send(api, event)
    return event
