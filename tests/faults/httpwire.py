"""Just enough of HTTP/1.1 for the fault proxy in front of S3 (moto): where each request's
head starts in the client's byte stream (bodies are skipped by Content-Length or chunked
framing), so a fault can be armed on a request (`GET /bucket?list-type=2`, `PUT .../stage/`),
and the 503 SlowDown S3 sends when it throttles."""

from __future__ import annotations

from collections.abc import Iterator

HEAD = b"H"
"""The kind of a request's head (request line and headers); body bytes have kind b""."""

SLOW_DOWN = (
    b"HTTP/1.1 503 Slow Down\r\n"
    b"Content-Type: application/xml\r\n"
    b"Connection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s"
)
_SLOW_DOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


def header(head: bytes, name: bytes) -> bytes | None:
    """The value of header `name` (lower-case) in a request head, or None."""
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def slow_down() -> bytes:
    """S3's throttling answer, closing the connection (the client opens another)."""
    return SLOW_DOWN % (len(_SLOW_DOWN_BODY), _SLOW_DOWN_BODY)


class Requests:
    """Splits a client's HTTP/1.1 stream into (HEAD, head bytes) and (b"", body bytes)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._body_left = 0  # bytes of the current body (or chunk, with its CRLF) to pass
        self._chunked = False
        self._trailers = False  # after the last chunk: trailer lines up to an empty one

    def feed(self, data: bytes) -> Iterator[tuple[bytes, bytes]]:
        self._buffer += data
        while self._buffer:
            if self._body_left:
                piece = self._buffer[: self._body_left]
                self._buffer = self._buffer[len(piece) :]
                self._body_left -= len(piece)
                yield b"", piece
            elif self._trailers:
                end = self._buffer.find(b"\r\n")
                if end < 0:
                    return
                line, self._buffer = self._buffer[: end + 2], self._buffer[end + 2 :]
                self._trailers = line != b"\r\n"
                yield b"", line
            elif self._chunked:
                end = self._buffer.find(b"\r\n")
                if end < 0:
                    return
                line, self._buffer = self._buffer[: end + 2], self._buffer[end + 2 :]
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size:
                    self._body_left = size + 2
                else:
                    self._chunked, self._trailers = False, True
                yield b"", line
            else:
                end = self._buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head, self._buffer = self._buffer[: end + 4], self._buffer[end + 4 :]
                self._start_body(head)
                yield HEAD, head

    def _start_body(self, head: bytes) -> None:
        for line in head.lower().split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip() == b"content-length":
                self._body_left = int(value.strip() or b"0")
            elif name.strip() == b"transfer-encoding" and b"chunked" in value:
                self._chunked = True
