"""S3 event notifications as SQS delivers them, read into the records the relay emits.

S3 -> SQS (or S3 -> SNS -> SQS) bodies: the `ObjectCreated:*` records with their keys
decoded and placed in their delivery folder by the landing layout, the `s3:TestEvent`, and
a MalformedMessage naming what is wrong with anything else. Each object version gets one
deterministic event id, so every repeat of its notification is the same event.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote_plus

from fleet_import.errors import FleetImportError
from fleet_import.intake.landing import DEFAULT_LAYOUT, LandingLayout

__all__ = [
    "MalformedMessage",
    "S3ObjectCreated",
    "TestEvent",
    "event_id",
    "parse_s3_notification",
]

# Fixed forever: changing it changes every event id and defeats de-duplication.
_EVENT_ID_NAMESPACE = uuid.UUID("5b0b3c52-8f5e-4c0e-9f55-2f1d8e7c6a01")


class MalformedMessage(FleetImportError, ValueError):
    """The SQS message is not an S3 event notification the relay can read."""


@dataclass(frozen=True)
class TestEvent:
    """`s3:TestEvent`: S3 checking that it may write to the queue; carries no object."""

    __test__ = False  # not a pytest test class, whatever its name says

    bucket: str | None


@dataclass(frozen=True)
class S3ObjectCreated:
    """One `ObjectCreated:*` record: the key decoded, tenant and folder found by the layout
    (None when the key does not belong to a tenant delivery folder)."""

    bucket: str
    key: str
    size: int | None
    etag: str
    event_name: str
    tenant_id: str | None = None
    folder: str | None = None
    event_time: datetime | None = None

    @property
    def resource_id(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @property
    def event_id(self) -> uuid.UUID:
        return event_id(self.bucket, self.key, self.etag)

    @property
    def related(self) -> bool:
        return self.tenant_id is not None and self.folder is not None


def event_id(bucket: str, key: str, etag: str) -> uuid.UUID:
    """The same object version always gets the same event id, however often S3 or SQS
    repeat its notification; new content (a new ETag) is a new event."""
    return uuid.uuid5(_EVENT_ID_NAMESPACE, "\n".join((bucket, key, etag.strip('"'))))


def _unwrap(document: Any) -> Any:
    """S3 -> SNS -> SQS puts the S3 document, as a string, in the SNS envelope's Message."""
    if isinstance(document, dict) and document.get("Type") == "Notification":
        message = document.get("Message")
        if not isinstance(message, str):
            raise MalformedMessage("SNS notification without a string Message")
        try:
            return json.loads(message)
        except ValueError as exc:
            raise MalformedMessage(f"SNS Message is not JSON: {exc}") from None
    return document


def _event_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _record(index: int, record: Any, layout: LandingLayout) -> S3ObjectCreated | None:
    where = f"record {index}"
    if not isinstance(record, dict):
        raise MalformedMessage(f"{where} is not an object")
    event_name = record.get("eventName")
    if not isinstance(event_name, str) or not event_name:
        raise MalformedMessage(f"{where} has no eventName")
    # Strip the optional "s3:" some producers (and EventBridge replays) put in front.
    event_name = event_name.removeprefix("s3:")
    s3 = record.get("s3")
    bucket = s3.get("bucket") if isinstance(s3, dict) else None
    obj = s3.get("object") if isinstance(s3, dict) else None
    bucket_name = bucket.get("name") if isinstance(bucket, dict) else None
    raw_key = obj.get("key") if isinstance(obj, dict) else None
    if not isinstance(bucket_name, str) or not bucket_name:
        raise MalformedMessage(f"{where} has no s3.bucket.name")
    if not isinstance(raw_key, str) or not raw_key:
        raise MalformedMessage(f"{where} has no s3.object.key")
    if not event_name.startswith("ObjectCreated:"):
        return None  # removals, restores, replication: not arrivals
    etag = obj.get("eTag", obj.get("etag"))
    if not isinstance(etag, str) or not etag.strip('"'):
        raise MalformedMessage(f"{where} ({raw_key!r}) has no s3.object.eTag")
    size = obj.get("size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int)):
        raise MalformedMessage(f"{where} ({raw_key!r}) has a non-integer size {size!r}")
    # S3 form-encodes keys in notifications: ' ' is '+', a real '+' is '%2B'.
    key = unquote_plus(raw_key, errors="strict")
    location = layout.locate(bucket_name, key)
    return S3ObjectCreated(
        bucket=bucket_name,
        key=key,
        size=size,
        etag=etag.strip('"'),
        event_name=event_name,
        tenant_id=location[0] if location else None,
        folder=location[1] if location else None,
        event_time=_event_time(record.get("eventTime")),
    )


def parse_s3_notification(
    body: str, layout: LandingLayout = DEFAULT_LAYOUT
) -> list[S3ObjectCreated] | TestEvent:
    """The `ObjectCreated:*` records of an S3 notification (other event types are dropped),
    or the TestEvent S3 sends when notifications are configured.

    Raises MalformedMessage when the body is not such a notification, naming what is wrong.
    """
    try:
        document = _unwrap(json.loads(body))
    except ValueError as exc:
        if isinstance(exc, MalformedMessage):
            raise
        raise MalformedMessage(f"message body is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise MalformedMessage(f"message body is a JSON {type(document).__name__}, not an object")
    if document.get("Event") == "s3:TestEvent":
        bucket = document.get("Bucket")
        return TestEvent(bucket if isinstance(bucket, str) else None)
    records = document.get("Records")
    if not isinstance(records, list) or not records:
        raise MalformedMessage("message has no Records (and is not an s3:TestEvent)")
    try:
        parsed = [_record(index, record, layout) for index, record in enumerate(records)]
    except UnicodeDecodeError:
        raise MalformedMessage("an object key's percent-encoding is not valid UTF-8") from None
    return [record for record in parsed if record is not None]
