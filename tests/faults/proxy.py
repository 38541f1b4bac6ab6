"""A small TCP fault proxy for tests (Toxiproxy is not installable here: tests NOTES).

It sits in front of one host:port and the test tells it what the network does next:

- `pass_through()`: forward both ways (the default);
- `reset_all()`: cut every open connection with a TCP reset;
- `black_hole()`: accept, never answer (nothing is forwarded either way, new or open);
- `delay(seconds)`: hold every forwarded chunk that long (latency);
- `stall(seconds)`: forward nothing for that long from now, then carry on (a 2 s stall);
- `refuse(seconds)`: refuse new connections for that long (the listener is closed);
- `lose_reply(match, after=..., then_refuse=...)`: armed once; when a client sends a
  PostgreSQL message whose SQL matches `match` (a simple Query, or the Bind of a statement
  parsed earlier: redshift_connector caches prepared statements; a Bind is matched as the
  statement's SQL, a newline, then its parameters as sent), on a
  connection that sent a message matching `after` before, it is forwarded with the rest of
  its exchange, the server's whole reply up to its ReadyForQuery is swallowed, the
  connection is cut, and new connections are refused for `then_refuse` seconds;
- `reset_on(match, after=...)`, `stall_on(match, seconds, after=...)`: armed once the same
  way, cut the connection before the matching message reaches the server, or hold it;
- `black_hole_on(match, after=...)`: armed once the same way; from the matching message on,
  the proxy is a black hole (that message never reaches the server, nothing comes back, new
  connections are accepted and never answered) until `pass_through()`. The client's TCP
  peer (this proxy) still acknowledges every packet, so only a client-side wait bound ends
  the wait: what TCP keepalives end on a real network never fires here.

It speaks just enough of the PostgreSQL wire protocol to find message boundaries; it
answers SSLRequest / GSSENCRequest with "N" itself, so clients talk in clear text to it.
For other protocols (S3, the Prefect API: `raw=True`) the byte-level faults work and the
message triggers do not apply. Threads, not asyncio: a test drives it from plain code.
"""

from __future__ import annotations

import contextlib
import re
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from tests.faults.pgwire import GSSENC_REQUEST, SSL_REQUEST, Messages, cstrings

_CHUNK = 65536
_POLL = 0.05
_REPLY_ENDS = (b"Z", b"G", b"W")
"""Where a swallowed reply ends: ReadyForQuery, or CopyIn/CopyBoth (the server waits for
the client's rows then: nothing more comes until the client, which heard nothing, sends)."""
_SWALLOW_SECONDS = 5.0
"""A reply that never ends (a long query) is cut after this long anyway."""


@dataclass
class _Trigger:
    match: re.Pattern[bytes]
    after: re.Pattern[bytes] | None
    action: str  # "lose_reply" | "reset" | "stall" | "black_hole"
    seconds: float  # lose_reply: refuse new connections this long after; stall: hold this long
    fired: threading.Event = field(default_factory=threading.Event)


class _Connection:
    """One client connection and its upstream, pumped by two threads."""

    def __init__(self, proxy: FaultProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream: socket.socket | None = None
        self.closed = threading.Event()
        self.swallowing = False  # the trigger went: drop the server's reply up to "Z"
        self.seen_after = False
        self.statements: dict[bytes, bytes] = {}  # prepared statement name -> its SQL
        self.trigger: _Trigger | None = None

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True, name="fault-proxy-conn").start()

    def _run(self) -> None:
        if self.proxy.mode == "black_hole":
            self._sink()
            return
        try:
            self.upstream = socket.create_connection(self.proxy.upstream, timeout=10)
            self.upstream.settimeout(None)
        except OSError:
            self.reset()
            return
        threading.Thread(target=self._pump_server, daemon=True).start()
        self._pump_client()

    def _sink(self) -> None:
        """Read and discard until the client gives up or the proxy stops."""
        while not self.closed.is_set():
            if not self._readable(self.client):
                continue
            try:
                if not self.client.recv(_CHUNK):
                    break
            except OSError:
                break
        self.close()

    def _readable(self, sock: socket.socket) -> bool:
        try:
            ready, _, _ = select.select([sock], [], [], _POLL)
        except (OSError, ValueError):
            self.closed.set()
            return False
        return bool(ready)

    def _hold(self) -> bool:
        """Wait out a stall, a delay or a black hole; False once the connection closed."""
        proxy = self.proxy
        while not self.closed.is_set():
            if proxy.mode == "black_hole" or time.monotonic() < proxy.stalled_until:
                time.sleep(_POLL)
                continue
            if proxy.latency:
                time.sleep(proxy.latency)
            return not self.closed.is_set()
        return False

    def _pump_client(self) -> None:
        messages = Messages(startup=True)
        assert self.upstream is not None
        while not self.closed.is_set():
            if not self._readable(self.client):
                continue
            try:
                data = self.client.recv(_CHUNK)
            except OSError:
                break
            if not data:
                break
            out = bytearray(data if self.proxy.raw else b"")
            for kind, message in [] if self.proxy.raw else messages.feed(data):
                if kind == b"" and len(message) == 8:
                    (code,) = struct.unpack("!I", message[4:8])
                    if code in (SSL_REQUEST, GSSENC_REQUEST):
                        self._send(self.client, b"N")  # no encryption: stay readable
                        continue
                fired = self._watch(kind, message)
                if fired is not None and fired.action == "reset":
                    self.reset()  # the message and what follows never reach the server
                    return
                if fired is not None and fired.action == "stall":
                    time.sleep(fired.seconds)
                if fired is not None and fired.action == "black_hole":
                    self.proxy.mode = "black_hole"  # _hold keeps this message, and all after
                out += message
            if out and (not self._hold() or not self._send(self.upstream, bytes(out))):
                break
        self.close()

    def _watch(self, kind: bytes, message: bytes) -> _Trigger | None:
        """The trigger, if this message fires it (then a lost reply starts swallowing)."""
        sql = self._sql_of(kind, message[5:])
        if sql is None:
            return None
        trigger = self.proxy.trigger
        if trigger is None or trigger.fired.is_set() or self.swallowing:
            return None
        if trigger.after is not None and not self.seen_after:
            self.seen_after = bool(trigger.after.search(sql))
            return None
        if not trigger.match.search(sql):
            return None
        self.proxy.trigger = None
        trigger.fired.set()
        if trigger.action == "lose_reply":
            self.trigger = trigger
            self.swallowing = True
        return trigger

    def _sql_of(self, kind: bytes, body: bytes) -> bytes | None:
        if kind == b"Q":
            return body.rstrip(b"\0")
        if kind == b"P":  # remembered; it runs at its Bind (a Parse may go alone, synced)
            name, query = cstrings(body, 2)
            self.statements[name] = query
            return None
        if kind == b"B":  # the statement's SQL, then its parameters as sent
            _portal, name = cstrings(body, 2)
            sql = self.statements.get(name)
            return None if sql is None else sql + b"\n" + body
        return None

    def _pump_server(self) -> None:
        messages = Messages(startup=False)
        assert self.upstream is not None
        swallow_started: float | None = None
        while not self.closed.is_set():
            if self.swallowing:
                swallow_started = swallow_started or time.monotonic()
                if time.monotonic() - swallow_started > _SWALLOW_SECONDS:
                    self._cut_after_trigger()
                    return
            if not self._readable(self.upstream):
                continue
            try:
                data = self.upstream.recv(_CHUNK)
            except OSError:
                break
            if not data:
                break
            if self.swallowing:
                if any(kind in _REPLY_ENDS for kind, _ in messages.feed(data)):
                    self._cut_after_trigger()
                    return
                continue
            if not self.proxy.raw:
                list(messages.feed(data))  # keep the message boundaries in step
            if not self._hold() or not self._send(self.client, data):
                break
        self.close()

    def _cut_after_trigger(self) -> None:
        trigger = self.trigger
        if trigger is not None and trigger.seconds > 0:
            self.proxy.refuse(trigger.seconds)
        self.reset()

    @staticmethod
    def _send(sock: socket.socket, data: bytes) -> bool:
        try:
            sock.sendall(data)
        except OSError:
            return False
        return True

    def reset(self) -> None:
        """Cut with a TCP reset (SO_LINGER 0), both sides."""
        for sock in (self.client, self.upstream):
            if sock is None:
                continue
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close()

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            if sock is None:
                continue
            with contextlib.suppress(OSError):
                sock.close()
        self.proxy._forget(self)


class FaultProxy:
    """A TCP proxy in front of `upstream` (host, port), listening on 127.0.0.1:`port`
    (0: any free port). Use as a context manager, or start() / stop()."""

    def __init__(self, upstream: tuple[str, int], port: int = 0, *, raw: bool = False) -> None:
        self.upstream = upstream
        self.raw = raw  # not PostgreSQL (HTTP: S3, the Prefect API): bytes as they come
        self.mode = "pass"
        self.latency = 0.0
        self.stalled_until = 0.0
        self.trigger: _Trigger | None = None
        self._refusing_until = 0.0
        self._lock = threading.Lock()
        self._connections: set[_Connection] = set()
        self._stopped = threading.Event()
        self._listener: socket.socket | None = self._listen(port)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True, name="fault-proxy")
        self.accepted = 0

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        self.reset_all()
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    # -- what the network does next --------------------------------------------------------

    def pass_through(self) -> None:
        """Forward again; a closed door is open again when this returns. Connections caught
        in a black hole are cut first, what they held dropped (their clients gave up; on a
        real network a late packet of theirs, the held COMMIT, never arrives either)."""
        if self.mode == "black_hole":
            self.reset_all()
        self.mode, self.latency, self.stalled_until = "pass", 0.0, 0.0
        self._refusing_until = 0.0
        self.trigger = None
        deadline = time.monotonic() + 5
        while self._listener is None and time.monotonic() < deadline:
            time.sleep(_POLL / 5)

    def reset_all(self) -> None:
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.reset()

    def black_hole(self) -> None:
        self.mode = "black_hole"

    def delay(self, seconds: float) -> None:
        self.latency = seconds

    def stall(self, seconds: float) -> None:
        self.stalled_until = time.monotonic() + seconds

    def refuse(self, seconds: float) -> None:
        self._refusing_until = time.monotonic() + seconds

    @property
    def refusing(self) -> bool:
        return time.monotonic() < self._refusing_until

    def lose_reply(
        self, match: str | bytes, *, after: str | bytes | None = None, then_refuse: float = 0.0
    ) -> threading.Event:
        """Arm the lost-reply fault (see the module docstring); the event is set when the
        matching message went by. Patterns are case-insensitive regular expressions."""
        return self._arm("lose_reply", match, after, then_refuse)

    def reset_on(self, match: str | bytes, *, after: str | bytes | None = None) -> threading.Event:
        """Armed once: cut the connection with a reset when the matching message comes, before
        the server sees it."""
        return self._arm("reset", match, after, 0.0)

    def stall_on(
        self, match: str | bytes, seconds: float, *, after: str | bytes | None = None
    ) -> threading.Event:
        """Armed once: hold the matching message `seconds` before forwarding it."""
        return self._arm("stall", match, after, seconds)

    def black_hole_on(
        self, match: str | bytes, *, after: str | bytes | None = None
    ) -> threading.Event:
        """Armed once: from the matching message on, a black hole (see the module docstring)."""
        return self._arm("black_hole", match, after, 0.0)

    def _arm(
        self, action: str, match: str | bytes, after: str | bytes | None, seconds: float
    ) -> threading.Event:
        def pattern(text: str | bytes) -> re.Pattern[bytes]:
            raw = text.encode() if isinstance(text, str) else text
            return re.compile(raw, re.IGNORECASE)

        trigger = _Trigger(pattern(match), pattern(after) if after else None, action, seconds)
        self.trigger = trigger
        return trigger.fired

    # -- accepting ---------------------------------------------------------------------

    def _listen(self, port: int) -> socket.socket:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        return listener

    def _accept(self) -> None:
        while not self._stopped.is_set():
            if self.refusing:
                if self._listener is not None:  # closed: connections are refused outright
                    self._listener.close()
                    self._listener = None
                time.sleep(_POLL)
                continue
            if self._listener is None:
                try:
                    self._listener = self._listen(self.port)
                except OSError:
                    time.sleep(_POLL)
                    continue
            ready, _, _ = select.select([self._listener], [], [], _POLL)
            if not ready:
                continue
            try:
                client, _ = self._listener.accept()
            except OSError:
                continue
            connection = _Connection(self, client)
            with self._lock:
                self._connections.add(connection)
                self.accepted += 1
            connection.start()

    def _forget(self, connection: _Connection) -> None:
        with self._lock:
            self._connections.discard(connection)

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._connections)


def proxied_url(url: str, proxy: FaultProxy) -> str:
    """`url` (postgresql://user@host:port/db...) pointed at the proxy, in clear text."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@" if userinfo else ""
    netloc += f"127.0.0.1:{proxy.port}"
    query = parts.query
    if "sslmode=" not in query:
        query = f"{query}&sslmode=disable" if query else "sslmode=disable"
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
