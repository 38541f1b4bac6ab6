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
- `dark_on(match, seconds)`: armed once, a black hole for `seconds` from the matching
  message (an outage that starts at a chosen point);
- `black_hole_on(match, after=...)`: armed once the same way; from the matching message on,
  the proxy is a black hole (that message never reaches the server, nothing comes back, new
  connections are accepted and never answered) until `pass_through()`. The client's TCP
  peer (this proxy) still acknowledges every packet, so only a client-side wait bound ends
  the wait: what TCP keepalives end on a real network never fires here;
- `throttle_on(match, times)` (HTTP only): the next `times` matching requests are answered
  503 SlowDown by the proxy, as S3 throttles, and their connection closed.

With HTTP, `requests` keeps every request head a client sent (the black hole's too) and
whether the proxy was dark then: what each retry layer really sent.

It speaks just enough of the PostgreSQL wire protocol to find message boundaries; it
answers SSLRequest / GSSENCRequest with "N" itself, so clients talk in clear text to it.
With `protocol="http"` (S3 through moto, the Prefect API) a message is an HTTP request,
matched by its head (request line and headers: tests/faults/httpwire.py); `lose_reply`
does not apply there. With `protocol="raw"` (the Prefect API, whose websockets are not
requests) bytes go as they come: only the byte-level faults apply. Threads, not asyncio: a
test drives it from plain code.
"""

from __future__ import annotations

import re
import select
import socket
import threading
import time
from contextlib import suppress
from urllib.parse import urlsplit, urlunsplit

from psycopg.conninfo import conninfo_to_dict

from fleet_import.config import libpq_url, masked_url
from tests.faults.proxy_connection import POLL, Connection, Trigger


class FaultProxy:
    """A TCP proxy in front of `upstream` (host, port), listening on 127.0.0.1:`port`
    (0: any free port). Use as a context manager, or start() / stop()."""

    def __init__(
        self, upstream: tuple[str, int], port: int = 0, *, protocol: str = "postgres"
    ) -> None:
        self.upstream = upstream
        self.protocol = protocol  # "postgres" | "http" | "raw"
        self.mode = "pass"
        self.dark_until = 0.0
        self.latency = 0.0
        self.stalled_until = 0.0
        self.trigger: Trigger | None = None
        self._refusing_until = 0.0
        self._lock = threading.Lock()
        self._door = threading.Lock()
        """Held while the listener is closed or opened."""
        self._connections: set[Connection] = set()
        self._stopped = threading.Event()
        self._listener: socket.socket | None = self._listen(port)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True, name="fault-proxy")
        self.accepted = 0
        self.requests: list[tuple[bytes, bool]] = []
        """HTTP: every request head a client sent, in order, and whether the proxy was dark
        then (the head that starts an outage counts as dark): what a retry layer sent."""

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
        with self._door:
            self._close_listener()

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
        self.mode, self.latency, self.stalled_until, self.dark_until = "pass", 0.0, 0.0, 0.0
        self._refusing_until = 0.0
        self.trigger = None
        deadline = time.monotonic() + 5
        while self._listener is None and time.monotonic() < deadline:
            time.sleep(POLL / 5)

    def reset_all(self) -> None:
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.reset()

    def black_hole(self) -> None:
        self.mode = "black_hole"

    def go_dark(self, seconds: float) -> None:
        """A black hole for `seconds` from now, then forwarding again."""
        self.dark_until = time.monotonic() + seconds

    @property
    def dark(self) -> bool:
        return self.mode == "black_hole" or time.monotonic() < self.dark_until

    def delay(self, seconds: float) -> None:
        self.latency = seconds

    def stall(self, seconds: float) -> None:
        self.stalled_until = time.monotonic() + seconds

    def refuse(self, seconds: float) -> None:
        """Refuse new connections for `seconds`: the listener is closed before this returns,
        so a client that connects after what follows (a cut) is refused, however late the
        accepting thread runs on a busy host."""
        with self._door:
            self._refusing_until = time.monotonic() + seconds
            self._close_listener()

    @property
    def refusing(self) -> bool:
        return time.monotonic() < self._refusing_until

    def lose_reply(
        self, match: str | bytes, *, after: str | bytes | None = None, then_refuse: float = 0.0
    ) -> threading.Event:
        """Arm the lost-reply fault (see the module docstring); the event is set when the
        matching message went by. Patterns are case-insensitive regular expressions."""
        return self._arm("lose_reply", match, after, then_refuse)

    def reset_on(
        self, match: str | bytes, *, after: str | bytes | None = None, then_refuse: float = 0.0
    ) -> threading.Event:
        """Armed once: cut the connection with a reset when the matching message comes, before
        the server sees it; then refuse new connections for `then_refuse` seconds (an outage
        that starts mid-step)."""
        return self._arm("reset", match, after, then_refuse)

    def stall_on(
        self, match: str | bytes, seconds: float, *, after: str | bytes | None = None
    ) -> threading.Event:
        """Armed once: hold the matching message `seconds` before forwarding it."""
        return self._arm("stall", match, after, seconds)

    def dark_on(self, match: str | bytes, seconds: float) -> threading.Event:
        """Armed once: a black hole for `seconds` from the matching message (held too)."""
        return self._arm("dark", match, None, seconds)

    def black_hole_on(
        self, match: str | bytes, *, after: str | bytes | None = None
    ) -> threading.Event:
        """Armed once: from the matching message on, a black hole (see the module docstring)."""
        return self._arm("black_hole", match, after, 0.0)

    def throttle_on(self, match: str | bytes, times: int) -> threading.Event:
        """HTTP: answer the next `times` matching requests 503 SlowDown, unforwarded."""
        return self._arm("throttle", match, None, float(times))

    def _arm(
        self, action: str, match: str | bytes, after: str | bytes | None, seconds: float
    ) -> threading.Event:
        def pattern(text: str | bytes) -> re.Pattern[bytes]:
            raw = text.encode() if isinstance(text, str) else text
            return re.compile(raw, re.IGNORECASE)

        trigger = Trigger(pattern(match), pattern(after) if after else None, action, seconds)
        self.trigger = trigger
        return trigger.fired

    # -- accepting ---------------------------------------------------------------------

    def _listen(self, port: int) -> socket.socket:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        return listener

    def _close_listener(self) -> None:
        """Closed: connections are refused outright."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def _accept(self) -> None:
        while not self._stopped.is_set():
            with self._door:
                if self._listener is None and not self.refusing:
                    with suppress(OSError):  # the port not free again yet: the next round
                        self._listener = self._listen(self.port)
                listener = self._listener
            if listener is None:
                time.sleep(POLL)
                continue
            try:
                ready, _, _ = select.select([listener], [], [], POLL)
                if not ready:
                    continue
                client, _ = listener.accept()
            except (OSError, ValueError):  # closed meanwhile by refuse()
                continue
            connection = Connection(self, client)
            with self._lock:
                self._connections.add(connection)
                self.accepted += 1
            connection.start()

    def _saw(self, head: bytes) -> None:
        with self._lock:
            self.requests.append((head, self.dark))

    def _forget(self, connection: Connection) -> None:
        with self._lock:
            self._connections.discard(connection)

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._connections)


def postgres_address(url: str) -> tuple[str, int]:
    """Where `url`'s PostgreSQL listens on TCP: a proxy's upstream. A server on a Unix
    socket (the host a directory, or no host) is refused rather than guessed at: the proxy
    speaks TCP, and every test server (the embedded one too: tests/pgtools.py) has a port."""
    params = conninfo_to_dict(libpq_url(url))
    host = str(params.get("host") or "")
    if not host or host.startswith("/") or "," in host:
        raise ValueError(
            f"the fault proxy needs a PostgreSQL on one TCP host and port, not "
            f"{host or 'the default Unix socket'} ({masked_url(url)})"
        )
    return host, int(params.get("port") or 5432)


_SERVER_PARAMETERS = frozenset({"host", "hostaddr", "port"})
"""Query parameters that name a server: libpq lets them override the URL's host and port."""


def proxied_url(url: str, proxy: FaultProxy) -> str:
    """`url` (postgresql://user@host:port/db...) pointed at the proxy, in clear text: its
    host and port replaced, query parameters naming another server dropped."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@" if userinfo else ""
    netloc += f"127.0.0.1:{proxy.port}"
    # Each parameter kept as written: decoding and encoding again could change it for libpq.
    query = [p for p in parts.query.split("&") if p and p.split("=")[0] not in _SERVER_PARAMETERS]
    if not any(p.split("=")[0] == "sslmode" for p in query):
        query.append("sslmode=disable")
    return urlunsplit(parts._replace(netloc=netloc, query="&".join(query)))
