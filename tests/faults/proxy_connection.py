"""The fault proxy's connections (tests/faults/proxy.py): one client connection and its
upstream, pumped by two threads, and the armed fault (`Trigger`) each message is checked
against. What the network does is the proxy's state; a connection reads it."""

from __future__ import annotations

import contextlib
import re
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tests.faults import httpwire
from tests.faults.pgwire import GSSENC_REQUEST, SSL_REQUEST, Messages, cstrings

if TYPE_CHECKING:
    from tests.faults.proxy import FaultProxy

_CHUNK = 65536
POLL = 0.05
_REPLY_ENDS = (b"Z", b"G", b"W")
"""Where a swallowed reply ends: ReadyForQuery, or CopyIn/CopyBoth (the server waits for
the client's rows then: nothing more comes until the client, which heard nothing, sends)."""
_SWALLOW_SECONDS = 5.0
"""A reply that never ends (a long query) is cut after this long anyway."""


@dataclass
class Trigger:
    match: re.Pattern[bytes]
    after: re.Pattern[bytes] | None
    action: str  # "lose_reply" | "reset" | "stall" | "dark" | "black_hole" | "throttle"
    seconds: float  # lose_reply, reset: refused after; stall, dark: how long; throttle: times
    fired: threading.Event = field(default_factory=threading.Event)


class Connection:
    """One client connection and its upstream, pumped by two threads."""

    def __init__(self, proxy: FaultProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream: socket.socket | None = None
        self.closed = threading.Event()
        self.swallowing = False  # the trigger went: drop the server's reply up to "Z"
        self.seen_after = False
        self.statements: dict[bytes, bytes] = {}  # prepared statement name -> its SQL
        self.trigger: Trigger | None = None

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True, name="fault-proxy-conn").start()

    def _run(self) -> None:
        if self.proxy.dark:
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
        """Read and discard until the client gives up or the proxy stops (HTTP: each request
        head is recorded, as a retry the black hole swallowed)."""
        requests = httpwire.Requests() if self.proxy.protocol == "http" else None
        while not self.closed.is_set():
            if not self._readable(self.client):
                if not self.proxy.dark:  # the outage is over: new connections go through
                    break
                continue
            try:
                data = self.client.recv(_CHUNK)
            except OSError:
                break
            if not data:
                break
            for kind, message in requests.feed(data) if requests else ():
                if kind == httpwire.HEAD:
                    self.proxy._saw(message)
        self.close()

    def _readable(self, sock: socket.socket) -> bool:
        try:
            ready, _, _ = select.select([sock], [], [], POLL)
        except (OSError, ValueError):
            self.closed.set()
            return False
        return bool(ready)

    def _hold(self) -> bool:
        """Wait out a stall, a delay or a black hole; False once the connection closed."""
        proxy = self.proxy
        while not self.closed.is_set():
            if proxy.dark or time.monotonic() < proxy.stalled_until:
                time.sleep(POLL)
                continue
            if proxy.latency:
                time.sleep(proxy.latency)
            return not self.closed.is_set()
        return False

    def _pump_client(self) -> None:
        http = self.proxy.protocol == "http"
        raw = self.proxy.protocol == "raw"
        messages = httpwire.Requests() if http else Messages(startup=True)
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
            out = bytearray(data if raw else b"")
            for kind, message in [] if raw else messages.feed(data):
                if not http and kind == b"" and len(message) == 8:
                    (code,) = struct.unpack("!I", message[4:8])
                    if code in (SSL_REQUEST, GSSENC_REQUEST):
                        self._send(self.client, b"N")  # no encryption: stay readable
                        continue
                fired = self._watch(kind, message)
                if http and kind == httpwire.HEAD:
                    self.proxy._saw(message)
                if fired is not None and fired.action == "reset":
                    if fired.seconds > 0:  # an outage from here: the door closes first
                        self.proxy.refuse(fired.seconds)
                    self.reset()  # the message and what follows never reach the server
                    return
                if fired is not None and fired.action == "stall":
                    time.sleep(fired.seconds)
                if fired is not None and fired.action == "throttle":
                    self._send(self.client, httpwire.slow_down())
                    self.close()  # what followed the request goes nowhere
                    return
                out += message
            if out and (not self._hold() or not self._send(self.upstream, bytes(out))):
                break
        self.close()

    def _watch(self, kind: bytes, message: bytes) -> Trigger | None:
        """The trigger, if this message fires it (then a lost reply starts swallowing)."""
        sql = self._sql_of(kind, message)
        if sql is None:
            return None
        trigger = self.proxy.trigger
        if trigger is None or self.swallowing:
            return None
        if trigger.fired.is_set() and trigger.action != "throttle":  # throttle: `times` times
            return None
        if trigger.after is not None and not self.seen_after:
            self.seen_after = bool(trigger.after.search(sql))
            return None
        if not trigger.match.search(sql):
            return None
        if trigger.action == "throttle" and trigger.seconds > 1:
            trigger.seconds -= 1  # armed for the next matching request too
        else:
            self.proxy.trigger = None
        trigger.fired.set()
        if trigger.action == "dark":
            self.proxy.go_dark(trigger.seconds)
        if trigger.action == "black_hole":
            self.proxy.black_hole()  # _hold keeps this message, and all after
        if trigger.action == "lose_reply":
            self.trigger = trigger
            self.swallowing = True
        return trigger

    def _sql_of(self, kind: bytes, message: bytes) -> bytes | None:
        if self.proxy.protocol == "http":
            return message if kind == httpwire.HEAD else None
        body = message[5:]
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
            if self.proxy.protocol == "postgres":
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
