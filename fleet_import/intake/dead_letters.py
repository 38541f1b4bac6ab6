"""Where the relay sets aside the messages it cannot read, so that it can delete them.

A dead letter is called with the message body and the reason; it must raise when the
message was not kept, and the relay then leaves the message on the queue.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["DeadLetter", "FileDeadLetter", "SqsDeadLetter"]

_DEAD_LETTER_BODY_LIMIT = 200_000  # SQS messages are at most 256 KiB; keep room for the envelope

DeadLetter = Callable[[str, str], None]


class SqsDeadLetter:
    """Sets malformed messages aside in an SQS queue (give it a long retention period)."""

    def __init__(self, sqs: Any, queue_url: str) -> None:
        self._sqs = sqs
        self.queue_url = queue_url

    def __call__(self, body: str, reason: str) -> None:
        self._sqs.send_message(
            QueueUrl=self.queue_url,
            MessageBody=body[:_DEAD_LETTER_BODY_LIMIT] or "(empty body)",
            MessageAttributes={
                "reason": {"DataType": "String", "StringValue": reason[:1024] or "malformed"}
            },
        )

    def __repr__(self) -> str:
        return f"SqsDeadLetter({self.queue_url!r})"


class FileDeadLetter:
    """Appends malformed messages to a local JSON Lines file, one `{at, reason, body}` a line."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def __call__(self, body: str, reason: str) -> None:
        line = json.dumps(
            {"at": datetime.now(UTC).isoformat(), "reason": reason, "body": body},
            ensure_ascii=False,
        )
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as out:
                out.write(line + "\n")
                out.flush()

    def __repr__(self) -> str:
        return f"FileDeadLetter({str(self.path)!r})"
