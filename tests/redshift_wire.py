"""The PostgreSQL wire protocol as the Redshift emulator (tests/redshift_emulator.py) speaks
it: framing messages, reading them, ErrorResponse bodies, SQL literals and identifiers."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field

SERVER_VERSION = "8.0.2"
"""What Redshift reports as `server_version` (redshift_connector parses it)."""


def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def cstrings(body: bytes) -> list[bytes]:
    return body.split(b"\0")


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def error_fields(body: bytes) -> dict[str, str]:
    return {f[:1].decode(): f[1:].decode() for f in body.split(b"\0") if f}


def error_from(fields: dict[str, str]) -> bytes:
    return b"".join(k.encode() + v.encode() + b"\0" for k, v in fields.items()) + b"\0"


def identifier(key: str) -> str:
    return ".".join('"' + part.replace('"', '""') + '"' for part in key.split(".", 1))


def error_body(sqlstate: str, message: str) -> bytes:
    return b"SERROR\0C" + sqlstate.encode() + b"\0M" + message.encode() + b"\0\0"


async def read_message(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    kind = await reader.readexactly(1)
    (length,) = struct.unpack("!i", await reader.readexactly(4))
    return kind, await reader.readexactly(length - 4)


@dataclass
class Result:
    rows: list[list[bytes | None]] = field(default_factory=list)
    tag: bytes = b""
    error: bytes | None = None  # raw ErrorResponse body
