"""The S3 -> SQS -> Prefect event relay, against moto's server sending real notifications."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote_plus

import pytest

from fleet_import.intake.dead_letters import FileDeadLetter, SqsDeadLetter
from fleet_import.intake.landing import DEFAULT_LAYOUT, LandingLayout
from fleet_import.intake.notifications import (
    MalformedMessage,
    S3ObjectCreated,
    TestEvent,
    event_id,
    parse_s3_notification,
)
from fleet_import.intake.relay import EVENT_NAME, Relay, RelayStats
from tests.s3fixtures import moto_client, notify_queue_of, put_objects

_DEADLINE_SECONDS = 15.0


# --- helpers -------------------------------------------------------------------------------


def _record(
    key: str,
    *,
    bucket: str = "fleet-landing",
    etag: str = "0123abcd",
    event_name: str = "ObjectCreated:Put",
    size: int = 3,
) -> dict[str, Any]:
    """One record as S3 writes it: the key form-encoded."""
    return {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "eventTime": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "eventName": event_name,
        "s3": {
            "bucket": {"name": bucket},
            "object": {"key": quote_plus(key), "size": size, "eTag": etag},
        },
    }


def _body(*records: dict[str, Any]) -> str:
    return json.dumps({"Records": list(records)})


class Collector:
    """A relay emitter that records events; `fail` raises instead for the next N calls."""

    def __init__(self) -> None:
        self.events: list[S3ObjectCreated] = []
        self.fail = 0

    def __call__(self, record: S3ObjectCreated) -> None:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("event API unreachable")
        self.events.append(record)


class Sink:
    """The relay's event sink: records the fleet.delivery.skipped events it is given."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, name: str, payload: Any) -> None:
        self.events.append((name, dict(payload)))


def _drain(relay: Relay, until: Callable[[RelayStats], bool]) -> RelayStats:
    """Poll until `until(totals)` holds (moto delivers notifications before put returns, but
    a receive may return fewer messages than are waiting)."""
    deadline = time.monotonic() + _DEADLINE_SECONDS
    totals = RelayStats()
    while not until(totals):
        assert time.monotonic() < deadline, f"relay did not get there: {totals}"
        totals.add(relay.poll_once())
    return totals


def _queue_depth(sqs: Any, queue_url: str) -> int:
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


# --- fixtures ------------------------------------------------------------------------------


def _make_queue(sqs: Any, **attributes: str) -> Iterator[str]:
    url = sqs.create_queue(QueueName=f"fleet-relay-{uuid.uuid4().hex[:12]}", Attributes=attributes)[
        "QueueUrl"
    ]
    yield url
    sqs.delete_queue(QueueUrl=url)


@pytest.fixture
def queue_url(sqs: Any) -> Iterator[str]:
    yield from _make_queue(sqs, VisibilityTimeout="1")


@pytest.fixture
def dlq_url(sqs: Any) -> Iterator[str]:
    yield from _make_queue(sqs)


@pytest.fixture
def notifying_bucket(s3: Any, sqs: Any, landing_bucket: str, queue_url: str) -> str:
    """The landing bucket sending every ObjectCreated notification to `queue_url`."""
    notify_queue_of(s3, sqs, landing_bucket, queue_url)
    return landing_bucket


@pytest.fixture
def dead_letters(tmp_path) -> FileDeadLetter:
    return FileDeadLetter(tmp_path / "dead" / "letters.jsonl")


def _relay(sqs: Any, queue_url: str, emit: Any, dead_letter: Any, **kwargs: Any) -> Relay:
    return Relay(sqs, queue_url, emit, dead_letter=dead_letter, wait_seconds=1, **kwargs)


def _lines(dead_letter: FileDeadLetter) -> list[dict[str, Any]]:
    if not dead_letter.path.exists():
        return []
    return [json.loads(line) for line in dead_letter.path.read_text("utf-8").splitlines()]


# --- parsing (no server) -------------------------------------------------------------------


def test_parse_decodes_keys_and_locates_the_delivery_folder() -> None:
    key = "acme/fleet/2026-07-22/trips 1+2 é.csv"
    [record] = parse_s3_notification(_body(_record(key, etag='"abc"')))
    assert record.key == key
    assert record.resource_id == f"s3://fleet-landing/{key}"
    assert record.etag == "abc"  # quotes stripped: the same id as a listing's ETag
    assert (record.tenant_id, record.folder) == (
        "acme",
        "s3://fleet-landing/acme/fleet/2026-07-22/",
    )
    assert record.event_id == event_id("fleet-landing", key, '"abc"')
    assert record.event_time is not None and record.event_time.tzinfo is not None


def test_event_id_is_deterministic_and_content_sensitive() -> None:
    first = event_id("b", "acme/fleet/2026-07-22/_SUCCESS", "e1")
    assert first == event_id("b", "acme/fleet/2026-07-22/_SUCCESS", "e1")
    assert first != event_id("b", "acme/fleet/2026-07-22/_SUCCESS", "e2")
    assert first != event_id("b2", "acme/fleet/2026-07-22/_SUCCESS", "e1")
    assert first.version == 5


@pytest.mark.parametrize(
    "key",
    [
        "README.txt",  # bucket root
        "acme/fleet/2026-07-22/",  # a console "folder" object
        "acme/fleet/2026-07-22/sub/file.csv",  # deeper than a delivery folder
        "acme/other/2026-07-22/file.csv",
        "Acme/fleet/2026-07-22/file.csv",  # not a tenant id
        "acme/fleet/2026-13-40/file.csv",  # not a date
        "acme/fleet/not-a-date/file.csv",
    ],
)
def test_keys_outside_the_layout_are_unrelated(key: str) -> None:
    [record] = parse_s3_notification(_body(_record(key)))
    assert not record.related and record.tenant_id is None and record.folder is None


def test_a_configured_layout_with_prefix() -> None:
    layout = LandingLayout(prefix="landing/v1/", pattern="{tenant}/*/")
    [inside, outside] = parse_s3_notification(
        _body(_record("landing/v1/globex/batch-7/_SUCCESS"), _record("globex/batch-7/_SUCCESS")),
        layout,
    )
    assert (inside.tenant_id, inside.folder) == (
        "globex",
        "s3://fleet-landing/landing/v1/globex/batch-7/",
    )
    assert not outside.related
    # The sweep's spelling of the same layout, and a prefix without its slash.
    sweep_style = LandingLayout(prefix="/landing/v1", pattern="{prefix}{tenant}/*/")
    assert sweep_style.locate("fleet-landing", "landing/v1/globex/batch-7/_SUCCESS") == (
        "globex",
        "s3://fleet-landing/landing/v1/globex/batch-7/",
    )
    assert LandingLayout(pattern="{prefix}{tenant}/fleet/{date}/").locate(
        "b-1", "acme/fleet/2026-07-22/x.csv"
    ) == ("acme", "s3://b-1/acme/fleet/2026-07-22/")
    with pytest.raises(ValueError, match="must contain"):
        LandingLayout(pattern="fleet/{date}/")
    with pytest.raises(ValueError, match="date twice"):
        LandingLayout(pattern="{tenant}/{date}/{yyyy-mm-dd}/")


def test_test_events_other_event_types_and_sns_envelopes() -> None:
    test = json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": "b-1"})
    assert parse_s3_notification(test) == TestEvent("b-1")
    removed = _record("acme/fleet/2026-07-22/a.csv", event_name="ObjectRemoved:Delete")
    assert parse_s3_notification(_body(removed)) == []
    envelope = json.dumps(
        {"Type": "Notification", "Message": _body(_record("acme/fleet/2026-07-22/a.csv"))}
    )
    [record] = parse_s3_notification(envelope)
    assert record.tenant_id == "acme"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("not json {", "not JSON"),
        ("[1, 2]", "JSON list"),
        (json.dumps({"hello": "world"}), "no Records"),
        (json.dumps({"Records": []}), "no Records"),
        (json.dumps({"Records": ["x"]}), "record 0 is not an object"),
        (json.dumps({"Records": [{"s3": {}}]}), "no eventName"),
        (
            json.dumps({"Records": [{"eventName": "ObjectCreated:Put", "s3": {"bucket": {}}}]}),
            "no s3.bucket.name",
        ),
        (
            _body({**_record("k/x"), "s3": {"bucket": {"name": "b"}, "object": {}}}),
            "no s3.object.key",
        ),
        (
            _body({**_record("k/x"), "s3": {"bucket": {"name": "b"}, "object": {"key": "k"}}}),
            "eTag",
        ),
        (
            _body(
                {
                    **_record("k/x"),
                    "s3": {"bucket": {"name": "b"}, "object": {"key": "%FF", "eTag": "e"}},
                }
            ),
            "UTF-8",
        ),  # noqa: E501
        (json.dumps({"Type": "Notification", "Message": "{"}), "SNS Message is not JSON"),
    ],
)
def test_malformed_messages_name_the_problem(body: str, reason: str) -> None:
    with pytest.raises(MalformedMessage, match=reason):
        parse_s3_notification(body)


# --- the relay against moto's S3 -> SQS notifications -------------------------------------

_FOLDER_KEYS = [
    "acme/fleet/2026-07-22/vehicles fleet.csv",  # a space: '+' in the notification
    "acme/fleet/2026-07-22/trips+extra.csv",  # a real '+': '%2B'
    "acme/fleet/2026-07-22/fahrer-ü-é-日本.jsonl",  # non-ASCII
    "acme/fleet/2026-07-22/_SUCCESS",
]


def test_a_folder_upload_emits_one_event_per_object(
    s3: Any, sqs: Any, notifying_bucket: str, queue_url: str, dead_letters: FileDeadLetter
) -> None:
    put_objects(s3, notifying_bucket, {key: b"x" * (i + 1) for i, key in enumerate(_FOLDER_KEYS)})
    s3.put_object(Bucket=notifying_bucket, Key="scratch/notes.txt", Body=b"unrelated")
    events = Collector()
    skips = Sink()
    relay = _relay(sqs, queue_url, events, dead_letters, events=skips)

    totals = _drain(relay, lambda t: t.emitted == 4 and t.skipped == 1 and t.test_events == 1)

    assert sorted(e.key for e in events.events) == sorted(_FOLDER_KEYS)
    for event in events.events:
        head = s3.head_object(Bucket=notifying_bucket, Key=event.key)
        assert event.etag == head["ETag"].strip('"')
        assert event.size == head["ContentLength"]
        assert event.event_id == event_id(notifying_bucket, event.key, head["ETag"])
        assert event.resource_id == f"s3://{notifying_bucket}/{event.key}"
        assert event.tenant_id == "acme"
        assert event.folder == f"s3://{notifying_bucket}/acme/fleet/2026-07-22/"
        assert event.event_name == "ObjectCreated:Put"
    assert totals.deleted == totals.received == 6 and totals.dead_lettered == 0
    assert _queue_depth(sqs, queue_url) == 0
    # The object outside the layout leaves a trace an operator can find.
    etag = s3.head_object(Bucket=notifying_bucket, Key="scratch/notes.txt")["ETag"]
    assert skips.events == [
        (
            "fleet.delivery.skipped",
            {
                "source": "relay",
                "tenant_id": None,
                "folder": f"s3://{notifying_bucket}/scratch/",
                "kind": "ignored",
                "reason": "not in a delivery folder of the layout {tenant}/fleet/{yyyy-mm-dd}/",
                "key": f"s3://{notifying_bucket}/scratch/notes.txt",
                "s3_event_id": str(event_id(notifying_bucket, "scratch/notes.txt", etag)),
            },
        )
    ]

    time.sleep(1.2)  # past the visibility timeout: nothing deleted may come back
    assert relay.poll_once() == RelayStats()
    assert len(events.events) == 4
    assert _lines(dead_letters) == []


def test_a_repeated_notification_is_relayed_once_and_leaves_a_trace(
    sqs: Any, queue_url: str, dead_letters: FileDeadLetter
) -> None:
    body = _body(_record("acme/fleet/2026-07-22/_SUCCESS", etag="feedface"))
    for _ in range(2):
        sqs.send_message(QueueUrl=queue_url, MessageBody=body)
    events = Collector()
    skips = Sink()

    totals = _drain(
        _relay(sqs, queue_url, events, dead_letters, events=skips), lambda t: t.deleted == 2
    )

    the_id = event_id("fleet-landing", "acme/fleet/2026-07-22/_SUCCESS", "feedface")
    assert [e.event_id for e in events.events] == [the_id]
    assert totals.emitted == 1 and totals.duplicates == 1
    [(name, payload)] = skips.events
    assert name == "fleet.delivery.skipped"
    assert payload["kind"] == "duplicate" and payload["source"] == "relay"
    assert payload["tenant_id"] == "acme"
    assert payload["folder"] == "s3://fleet-landing/acme/fleet/2026-07-22/"
    assert payload["reason"] == f"repeated S3 notification: event {the_id} was already relayed"
    assert _queue_depth(sqs, queue_url) == 0

    # A relay that did not see it (restarted) sends it again, with the same id.
    sqs.send_message(QueueUrl=queue_url, MessageBody=body)
    _drain(_relay(sqs, queue_url, events, dead_letters), lambda t: t.deleted == 1)
    assert [e.event_id for e in events.events] == [the_id, the_id]


_POISON = [
    "this is not JSON",
    json.dumps({"Message": "JSON without Records"}),
    _body(
        {**_record("acme/fleet/2026-07-22/a.csv"), "s3": {"bucket": {"name": "b"}, "object": {}}}
    ),
]


def test_poison_messages_are_dead_lettered_and_the_batch_goes_on(
    sqs: Any, queue_url: str, dead_letters: FileDeadLetter, caplog: pytest.LogCaptureFixture
) -> None:
    good = _body(_record("acme/fleet/2026-07-22/_SUCCESS"))
    sqs.send_message_batch(
        QueueUrl=queue_url,
        Entries=[{"Id": str(i), "MessageBody": body} for i, body in enumerate([*_POISON, good])],
    )
    events = Collector()
    relay = _relay(sqs, queue_url, events, dead_letters)

    with caplog.at_level(logging.ERROR, logger="fleet_import.intake.relay"):
        totals = _drain(relay, lambda t: t.received == 4)

    assert [e.key for e in events.events] == ["acme/fleet/2026-07-22/_SUCCESS"]
    assert totals.dead_lettered == 3 and totals.deleted == 4
    assert sorted(line["body"] for line in _lines(dead_letters)) == sorted(_POISON)
    assert all(line["reason"] and line["at"] for line in _lines(dead_letters))
    assert len([r for r in caplog.records if "malformed SQS message" in r.message]) == 3
    assert _queue_depth(sqs, queue_url) == 0


def test_dead_letters_can_go_to_an_sqs_queue(sqs: Any, queue_url: str, dlq_url: str) -> None:
    sqs.send_message(QueueUrl=queue_url, MessageBody=_POISON[0])
    relay = _relay(sqs, queue_url, Collector(), SqsDeadLetter(sqs, dlq_url))

    _drain(relay, lambda t: t.dead_lettered == 1)

    [dead] = sqs.receive_message(
        QueueUrl=dlq_url, MessageAttributeNames=["All"], WaitTimeSeconds=1
    )["Messages"]
    assert dead["Body"] == _POISON[0]
    assert "not JSON" in dead["MessageAttributes"]["reason"]["StringValue"]
    assert _queue_depth(sqs, queue_url) == 0


def test_a_failing_dead_letter_path_keeps_the_message(sqs: Any, queue_url: str) -> None:
    def broken(body: str, reason: str) -> None:
        raise OSError("disk full")

    sqs.send_message(QueueUrl=queue_url, MessageBody=_POISON[0])
    relay = _relay(sqs, queue_url, Collector(), broken)

    totals = _drain(relay, lambda t: t.received == 1)

    assert totals.deleted == 0 and totals.dead_lettered == 0
    assert _queue_depth(sqs, queue_url) == 1


def test_a_failed_emit_leaves_the_message_for_redelivery(
    sqs: Any, queue_url: str, dead_letters: FileDeadLetter
) -> None:
    sqs.send_message(QueueUrl=queue_url, MessageBody=_body(_record("acme/fleet/2026-07-22/x.csv")))
    events = Collector()
    events.fail = 1
    relay = _relay(sqs, queue_url, events, dead_letters)

    first = _drain(relay, lambda t: t.received == 1)
    assert first.emit_failures == 1 and first.deleted == 0 and events.events == []
    assert _queue_depth(sqs, queue_url) == 1  # in flight until the visibility timeout ends

    second = _drain(relay, lambda t: t.emitted == 1)  # re-received after ~1 s
    assert second.deleted == 1
    assert [e.key for e in events.events] == ["acme/fleet/2026-07-22/x.csv"]
    assert _queue_depth(sqs, queue_url) == 0


def test_a_message_is_deleted_only_when_all_its_records_were_emitted(
    sqs: Any, queue_url: str, dead_letters: FileDeadLetter
) -> None:
    keys = [f"acme/fleet/2026-07-22/part-{i}.csv" for i in range(3)]
    sqs.send_message(QueueUrl=queue_url, MessageBody=_body(*[_record(k) for k in keys]))

    class FailSecond(Collector):
        def __call__(self, record: S3ObjectCreated) -> None:
            if record.key == keys[1] and not getattr(self, "failed", False):
                self.failed = True
                raise ConnectionError("lost")
            super().__call__(record)

    events = FailSecond()
    relay = _relay(sqs, queue_url, events, dead_letters)
    _drain(relay, lambda t: t.deleted == 1)

    # Every record is emitted once: the first, accepted before the failure, is a duplicate
    # when the message comes back; the rest are sent then. At least once, never lost.
    assert [e.key for e in events.events] == keys
    assert relay.totals.duplicates == 1


def test_an_unexpected_error_keeps_only_that_message(
    sqs: Any, queue_url: str, dead_letters: FileDeadLetter
) -> None:
    def key_filter(record: S3ObjectCreated) -> bool:
        if record.key.endswith("bug.csv"):
            raise RuntimeError("a bug in a filter")
        return record.related

    for name in ("bug.csv", "fine.csv"):
        sqs.send_message(
            QueueUrl=queue_url, MessageBody=_body(_record(f"acme/fleet/2026-07-22/{name}"))
        )
    events = Collector()
    relay = _relay(sqs, queue_url, events, dead_letters, key_filter=key_filter)

    totals = _drain(relay, lambda t: t.received >= 2 and t.emitted == 1)

    assert [e.key for e in events.events] == ["acme/fleet/2026-07-22/fine.csv"]
    assert totals.emit_failures >= 1
    assert _queue_depth(sqs, queue_url) == 1


def test_run_forever_survives_receive_errors_and_stops(
    sqs: Any, queue_url: str, dead_letters: FileDeadLetter, caplog: pytest.LogCaptureFixture
) -> None:
    missing = queue_url.rsplit("/", 1)[0] + "/no-such-queue"
    relay = _relay(sqs, missing, Collector(), dead_letters)
    stop = threading.Event()
    with caplog.at_level(logging.ERROR, logger="fleet_import.intake.relay"):
        worker = threading.Thread(target=relay.run_forever, args=(stop,))
        worker.start()
        deadline = time.monotonic() + _DEADLINE_SECONDS
        while not any("failed" in r.message for r in caplog.records):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stop.set()
        worker.join(timeout=5)
    assert not worker.is_alive()


def test_relay_rejects_out_of_range_sqs_settings(sqs: Any, queue_url: str) -> None:
    with pytest.raises(ValueError, match="wait_seconds"):
        Relay(sqs, queue_url, Collector(), dead_letter=print, wait_seconds=21)
    with pytest.raises(ValueError, match="max_messages"):
        Relay(sqs, queue_url, Collector(), dead_letter=print, max_messages=11)


def test_default_layout_is_the_documented_one() -> None:
    assert DEFAULT_LAYOUT.pattern == "{tenant}/fleet/{yyyy-mm-dd}/"
    assert DEFAULT_LAYOUT.prefix == ""


# --- Prefect: the real emitter against the test harness -------------------------------------


def _read_event(event_uuid: uuid.UUID) -> Any:
    from prefect.events.filters import EventFilter, EventIDFilter

    return _read_events(EventFilter(id=EventIDFilter(id=[event_uuid])))


def _read_events(query: Any) -> Any:
    """The events the filter finds, once there are any (events are persisted
    asynchronously after the API accepted them)."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventOccurredFilter

    now = datetime.now(UTC)
    query.occurred = EventOccurredFilter(
        since=now - timedelta(days=1), until=now + timedelta(days=1)
    )
    deadline = time.monotonic() + 30
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_events(query, limit=10)
            if page.events:
                return page.events
            assert time.monotonic() < deadline, f"no event matches {query}"
            time.sleep(0.25)


@pytest.mark.slow
def test_the_prefect_emitter_sends_an_event_the_api_stores(prefect_api: None) -> None:
    from flows.events import emit_s3_object_created

    [record] = parse_s3_notification(_body(_record("acme/fleet/2026-07-22/_SUCCESS", etag="e1")))
    sent = emit_s3_object_created(record)

    [stored] = _read_event(record.event_id)
    assert stored.id == sent.id == record.event_id
    assert stored.event == EVENT_NAME
    assert stored.resource.id == "s3://fleet-landing/acme/fleet/2026-07-22/_SUCCESS"
    assert stored.resource["fleet.tenant"] == "acme"
    assert stored.resource["fleet.folder"] == "s3://fleet-landing/acme/fleet/2026-07-22/"
    assert stored.resource["aws.s3.etag"] == "e1"
    assert stored.payload["key"] == "acme/fleet/2026-07-22/_SUCCESS"


@pytest.mark.slow
def test_the_prefect_emitter_raises_when_the_api_is_unreachable(prefect_api: None) -> None:
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    from flows.events import PrefectEventEmitter

    [record] = parse_s3_notification(_body(_record("acme/fleet/2026-07-22/_SUCCESS")))
    with (
        temporary_settings(
            {PREFECT_API_URL: "http://127.0.0.1:9/api", PREFECT_CLIENT_MAX_RETRIES: 0}
        ),
        PrefectEventEmitter() as emit,
        pytest.raises(Exception, match="(?i)connect"),
    ):
        emit(record)


@pytest.mark.slow
def test_the_relay_command_relays_a_folder_to_prefect(
    prefect_api: None, s3: Any, notifying_bucket: str, queue_url: str, moto_endpoint: str, tmp_path
) -> None:
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
    from typer.testing import CliRunner

    from fleet_cli.cli import app

    put_objects(s3, notifying_bucket, {"acme/fleet/2026-07-22/_SUCCESS": b""})
    put_objects(s3, notifying_bucket, {"acme/fleet/2026-02-30/_SUCCESS": b""})
    sqs_poison = moto_client("sqs", moto_endpoint)
    sqs_poison.send_message(QueueUrl=queue_url, MessageBody="poison")
    dead_file = tmp_path / "dead.jsonl"

    result = CliRunner().invoke(
        app,
        [
            "relay",
            "--queue-url", queue_url,
            "--endpoint-url", moto_endpoint,
            "--dead-letter-file", str(dead_file),
            "--wait-seconds", "1",
            "--once",
        ],
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    key = "acme/fleet/2026-07-22/_SUCCESS"
    head = s3.head_object(Bucket=notifying_bucket, Key=key)
    [stored] = _read_event(event_id(notifying_bucket, key, head["ETag"]))
    assert stored.resource.id == f"s3://{notifying_bucket}/{key}"
    assert [json.loads(line)["body"] for line in dead_file.read_text().splitlines()] == ["poison"]
    # The marker of a folder with an impossible date is skipped, with a trace in Prefect.
    bad = f"s3://{notifying_bucket}/acme/fleet/2026-02-30/"
    [skipped] = _read_events(
        EventFilter(
            event=EventNameFilter(name=["fleet.delivery.skipped"]),
            resource=EventResourceFilter(id=[f"fleet.delivery.{bad}"]),
        )
    )
    assert skipped.resource["fleet.tenant"] == "acme"
    assert skipped.resource["fleet.folder"] == bad
    assert skipped.payload["kind"] == "ignored"
    assert skipped.payload["reason"] == "'2026-02-30' is not a yyyy-mm-dd date"
