"""S3 object notifications from SQS, relayed as `aws.s3.object.created` events.

S3 delivers at least once, in no particular order, sometimes twice; SQS redelivers whatever
was not deleted. So the relay is at-least-once too and makes duplicates harmless instead of
trying to prevent them: every event carries an id derived from bucket, key and ETag, and a
message is deleted only after each of its events was accepted. What the relay cannot parse
is set aside (dead-letter) and deleted, so one bad message never blocks the queue.

What the relay leaves alone leaves a trace: a record outside the landing layout, and a
repeat of an event this relay already had accepted (not sent again), each become a
`fleet.delivery.skipped` event with the tenant, folder and reason.

Reading a notification is fleet_import.s3_notifications (its names are re-exported here).
This module knows nothing about Prefect: the caller passes the functions that emit.
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from fleet_import.errors import InvalidInput
from fleet_import.intake.dead_letters import DeadLetter
from fleet_import.intake.landing import (
    DEFAULT_LAYOUT,
    DELIVERY_SKIPPED_EVENT,
    LandingLayout,
    Unimportable,
    skipped_payload,
)
from fleet_import.intake.notifications import (
    MalformedMessage,
    S3ObjectCreated,
    TestEvent,
    parse_s3_notification,
)
from fleet_import.publication.events import EventSink
from fleet_import.retry import doubling
from fleet_import.tenants.binding import DELIVERY_REFUSED_EVENT, Refused, bind
from fleet_import.tenants.registry import TenantRegistry

__all__ = ["EVENT_NAME", "Relay", "RelayStats", "queue_region"]

logger = logging.getLogger(__name__)

EVENT_NAME = "aws.s3.object.created"
DEFAULT_WAIT_SECONDS = 20  # the SQS maximum: fewest empty receives
DEFAULT_MAX_MESSAGES = 10  # the SQS maximum per receive
_POLL_BACKOFF = doubling(1.0, 60.0)
"""The wait after failed polls in a row (SQS or the event API down): 1, 2, 4... s, at most 60 s."""
# run_forever looks at `stop` this often, then lets a message in hand finish for this long.
_STOP_CHECK_SECONDS = 0.1
_STOP_GRACE_SECONDS = 0.2
# Event ids accepted lately: a repeat of one is not sent again (S3 and SQS repeat within
# minutes; a restarted relay sends a repeat, which Prefect and the delivery key absorb).
_RECENT_EVENT_IDS = 10_000
_AWS_QUEUE_URL = re.compile(r"https://sqs[.-]([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/")


def queue_region(queue_url: str) -> str | None:
    """The region of an AWS queue URL (`https://sqs.eu-west-1.amazonaws.com/...`), else None."""
    match = _AWS_QUEUE_URL.match(queue_url)
    return match.group(1) if match else None


@dataclass
class RelayStats:
    """What one receive did; `add` sums them over a relay's life."""

    received: int = 0
    emitted: int = 0
    deleted: int = 0
    test_events: int = 0
    skipped: int = 0  # records whose key is outside the landing layout or filtered out
    duplicates: int = 0  # records whose event this relay had already had accepted
    dead_lettered: int = 0
    emit_failures: int = 0  # messages left on the queue for redelivery
    delete_failures: int = 0

    def add(self, other: RelayStats) -> None:
        for counter in fields(self):
            setattr(self, counter.name, getattr(self, counter.name) + getattr(other, counter.name))


Emit = Callable[[S3ObjectCreated], None]
KeyFilter = Callable[[S3ObjectCreated], bool]


def _related(record: S3ObjectCreated) -> bool:
    return record.related


class Relay:
    """Receives S3 notifications from one SQS queue and emits one event per new object.

    `emit` must return only once the event was accepted and raise otherwise: the message is
    then left on the queue and comes back after its visibility timeout.
    """

    def __init__(
        self,
        sqs: Any,
        queue_url: str,
        emit: Emit,
        *,
        dead_letter: DeadLetter,
        layout: LandingLayout = DEFAULT_LAYOUT,
        key_filter: KeyFilter = _related,
        wait_seconds: int = DEFAULT_WAIT_SECONDS,
        max_messages: int = DEFAULT_MAX_MESSAGES,
        events: EventSink | None = None,
        registry: TenantRegistry | None = None,
    ) -> None:
        if not 0 <= wait_seconds <= 20:
            raise InvalidInput(f"wait_seconds must be 0-20 (SQS long polling), not {wait_seconds}")
        if not 1 <= max_messages <= 10:
            raise InvalidInput(f"max_messages must be 1-10 (an SQS receive), not {max_messages}")
        self._sqs = sqs
        self.queue_url = queue_url
        self._emit = emit
        self._dead_letter = dead_letter
        self._layout = layout
        self._key_filter = key_filter
        self._wait_seconds = wait_seconds
        self._max_messages = max_messages
        self._events = events
        self._registry = registry  # with one, unknown and disabled tenants are refused
        self._accepted: OrderedDict[uuid.UUID, None] = OrderedDict()
        self.totals = RelayStats()

    def poll_once(self, stop: threading.Event | None = None) -> RelayStats:
        """One long-poll receive and everything it returned. SQS errors on receive propagate
        (run_forever backs off); nothing a single message holds does. Once `stop` is set the
        remaining messages are left alone: SQS redelivers them after their visibility
        timeout."""
        response = self._sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=self._max_messages,
            WaitTimeSeconds=self._wait_seconds,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        )
        stats = RelayStats()
        for message in response.get("Messages", ()):
            if stop is not None and stop.is_set():
                break
            stats.received += 1
            try:
                self._handle(message, stats)
            except Exception:  # a bug, not the message's fault: keep it and go on
                logger.exception(
                    "relaying SQS message %s failed; left on the queue", message.get("MessageId")
                )
                stats.emit_failures += 1
        self.totals.add(stats)
        return stats

    def _handle(self, message: dict[str, Any], stats: RelayStats) -> None:
        message_id = message.get("MessageId", "?")
        body = message.get("Body", "")
        try:
            parsed = parse_s3_notification(body, self._layout)
        except MalformedMessage as exc:
            logger.error("malformed SQS message %s: %s; body %.500r", message_id, exc, body)
            try:
                self._dead_letter(body, str(exc))
            except Exception:
                # Keep it: deleting would lose it; SQS's own redrive policy catches it later.
                logger.exception(
                    "could not dead-letter SQS message %s; left on the queue", message_id
                )
                return
            stats.dead_lettered += 1
            self._delete(message, stats)
            return
        if isinstance(parsed, TestEvent):
            logger.info("s3:TestEvent for bucket %s", parsed.bucket)
            stats.test_events += 1
            self._delete(message, stats)
            return
        for record in parsed:
            if not self._key_filter(record):
                self._skip(record, "ignored")
                stats.skipped += 1
                continue
            refusal = self._refusal(record)
            if refusal is not None:
                self._refuse(record, refusal)
                stats.skipped += 1
                continue
            if record.event_id in self._accepted:
                self._skip(record, "duplicate")
                stats.duplicates += 1
                continue
            try:
                self._emit(record)
            except Exception as exc:
                receives = message.get("Attributes", {}).get("ApproximateReceiveCount", "?")
                logger.warning(
                    "emitting %s for %s failed (receive %s of SQS message %s); the message "
                    "stays on the queue: %s: %s",
                    EVENT_NAME,
                    record.resource_id,
                    receives,
                    message_id,
                    type(exc).__name__,
                    exc,
                )
                stats.emit_failures += 1
                return
            stats.emitted += 1
            self._accepted[record.event_id] = None
            if len(self._accepted) > _RECENT_EVENT_IDS:
                self._accepted.popitem(last=False)
            logger.info("emitted %s %s id=%s", EVENT_NAME, record.resource_id, record.event_id)
        self._delete(message, stats)

    def _skip(self, record: S3ObjectCreated, kind: str) -> None:
        """Log, and announce as fleet.delivery.skipped, a record not relayed."""
        tenant_id, folder = record.tenant_id, record.folder
        if kind == "duplicate":
            reason = f"repeated S3 notification: event {record.event_id} was already relayed"
        elif record.related:
            reason = "filtered out by the relay's key filter"
        else:
            placed = self._layout.place(record.bucket, record.key)
            tenant_id, folder = placed.tenant_id, placed.folder
            reason = placed.reason if isinstance(placed, Unimportable) else "not a delivery"
        logger.info("skipped %s (%s): %s", record.resource_id, record.event_name, reason)
        if self._events is None:
            return
        payload = skipped_payload(
            "relay",
            tenant_id,
            folder,
            reason,
            kind,
            key=record.resource_id,
            s3_event_id=str(record.event_id),
        )
        try:
            self._events(DELIVERY_SKIPPED_EVENT, payload)
        except Exception as exc:  # a trace never holds up the queue
            logger.warning("could not announce the skip of %s: %s", record.resource_id, exc)

    def _refusal(self, record: S3ObjectCreated) -> Refused | None:
        """Why the record's folder may not be imported for the tenant its key names (the
        tenant comes from the key, so only the registry can refuse it)."""
        if record.tenant_id is None or record.folder is None:
            return None
        bound = bind(record.tenant_id, record.folder, layout=self._layout, registry=self._registry)
        return bound if isinstance(bound, Refused) else None

    def _refuse(self, record: S3ObjectCreated, refusal: Refused) -> None:
        logger.warning("refused %s: %s", record.resource_id, refusal.reason)
        if self._events is None:
            return
        payload = refusal.payload("relay", key=record.resource_id, s3_event_id=str(record.event_id))
        try:
            self._events(DELIVERY_REFUSED_EVENT, payload)
        except Exception as exc:  # a trace never holds up the queue
            logger.warning("could not announce the refusal of %s: %s", record.resource_id, exc)

    def _delete(self, message: dict[str, Any], stats: RelayStats) -> None:
        try:
            self._sqs.delete_message(
                QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"]
            )
        except (BotoCoreError, ClientError) as exc:
            # Redelivered later; its events repeat with the same ids.
            logger.warning("could not delete SQS message %s: %s", message.get("MessageId"), exc)
            stats.delete_failures += 1
            return
        stats.deleted += 1

    def run_forever(self, stop: threading.Event) -> RelayStats:
        """Poll until `stop` is set, and return within about half a second of it.

        A long poll lasts up to wait_seconds and an emit as long as the event API takes, so
        the polling runs on a daemon thread that this one abandons once `stop` is set and a
        short grace has passed. Abandoning loses nothing: a message is deleted only after its
        events were accepted, so whatever that thread received and did not delete comes back
        after the queue's visibility timeout (at worst an event repeats, with its id).

        This thread only joins the poller, never waits on `stop` itself, so a signal handler
        running on it may `stop.set()` without deadlocking on the Event's lock.
        """
        logger.info("relaying S3 notifications from %s", self.queue_url)
        poller = threading.Thread(
            target=self._poll_until, args=(stop,), name="fleet-relay-poller", daemon=True
        )
        poller.start()
        while poller.is_alive() and not stop.is_set():
            poller.join(_STOP_CHECK_SECONDS)
        poller.join(_STOP_GRACE_SECONDS)
        if poller.is_alive():
            logger.info("abandoned a receive or emit: undeleted messages will be redelivered")
        logger.info("relay stopped: %s", self.totals)
        return self.totals

    def _poll_until(self, stop: threading.Event) -> None:
        failures = 0  # failed polls in a row
        while not stop.is_set():
            try:
                stats = self.poll_once(stop)
            except Exception as exc:  # never crash: SQS down, credentials expired, a bug
                failures += 1
                pause = _POLL_BACKOFF.after(failures)
                logger.error(
                    "receiving from %s failed (%s: %s); retrying in %.0f s",
                    self.queue_url,
                    type(exc).__name__,
                    exc,
                    pause,
                    exc_info=not isinstance(exc, (BotoCoreError, ClientError)),
                )
                stop.wait(pause)
                continue
            if stats.emit_failures and not stats.emitted:
                # The event API is down: don't spin through the rest of the queue.
                failures += 1
                stop.wait(_POLL_BACKOFF.after(failures))
            else:
                failures = 0
