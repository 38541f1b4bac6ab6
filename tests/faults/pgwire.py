"""Just enough of the PostgreSQL wire protocol for the fault proxy: whole messages out of a
byte stream, in either direction (the client's first message has no type byte)."""

from __future__ import annotations

import struct
from collections.abc import Iterator

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104


class Messages:
    """Splits one direction of a PostgreSQL stream into whole messages."""

    def __init__(self, *, startup: bool) -> None:
        self._buffer = b""
        self._startup = startup  # the client's first message has no type byte

    def feed(self, data: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(type, whole message bytes) for each complete message; type b"" for startup."""
        self._buffer += data
        while True:
            if self._startup:
                if len(self._buffer) < 4:
                    return
                (length,) = struct.unpack("!I", self._buffer[:4])
                if len(self._buffer) < length:
                    return
                message, self._buffer = self._buffer[:length], self._buffer[length:]
                (code,) = struct.unpack("!I", message[4:8]) if length >= 8 else (0,)
                if code not in (SSL_REQUEST, GSSENC_REQUEST):
                    self._startup = False
                yield b"", message
                continue
            if len(self._buffer) < 5:
                return
            (length,) = struct.unpack("!I", self._buffer[1:5])
            if len(self._buffer) < 1 + length:
                return
            message, self._buffer = self._buffer[: 1 + length], self._buffer[1 + length :]
            yield message[:1], message


def cstrings(body: bytes, count: int) -> list[bytes]:
    parts = body.split(b"\0", count)
    return parts[:count]
