"""The one retry rule: a fixed ladder of delays, each stretched by up to `jitter` at random,
so that workers that failed together do not retry together. Every retry loop of the core
(the driver's steps, the slice load, the Redshift transactions, the commit's read-back, the
outboxes' steps, the relay's polling) and the flow's Prefect task retries take their delays
from a `Backoff`; only transient errors are retried."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

DEFAULT_JITTER = 0.5
"""Stretch each delay by up to half: enough to spread workers that conflicted at once."""


@dataclass(frozen=True)
class Backoff:
    """`delays[i]` is the wait before retry i+1; `len(delays)` is how many retries there are."""

    delays: tuple[float, ...]
    jitter: float = DEFAULT_JITTER

    @property
    def retries(self) -> int:
        return len(self.delays)

    def pause(self, retry: int) -> float:
        """The wait before retry number `retry` (0-based), jitter included."""
        return self.delays[retry] * (1 + random.random() * self.jitter)

    def after(self, failures: int) -> float:
        """The wait after `failures` failures in a row, the ladder's last delay once past
        its end: for what is retried without end (an outbox's step, the relay's polling),
        where `retries` bounds nothing. Needs at least one delay."""
        return self.pause(min(max(failures, 1), len(self.delays)) - 1)

    def wait(self, retry: int, what: str, error: BaseException, log: logging.Logger) -> None:
        """Log why, then sleep before retry number `retry`."""
        seconds = self.pause(retry)
        log.warning("%s failed (attempt %d: %s); again in %.1fs", what, retry + 1, error, seconds)
        time.sleep(seconds)

    def call(
        self,
        fn: Callable[[], T],
        *,
        retryable: Callable[[Exception], bool],
        what: str,
        log: logging.Logger,
    ) -> T:
        """`fn()`, run again after each backoff while it raises a retryable error."""
        for retry in range(self.retries + 1):
            try:
                return fn()
            except Exception as exc:
                if retry == self.retries or not retryable(exc):
                    raise
                self.wait(retry, what, exc, log)
        raise AssertionError("unreachable")


NO_RETRY = Backoff(())

def doubling(first: float, cap: float, *, jitter: float = 0.0) -> Backoff:
    """Delays doubling from `first` up to `cap`, the cap the last: read with `after`, the
    wait of a retry without end (no jitter by default: it waits for a service, not a
    conflict between workers)."""
    delays = [first]
    while 0 < delays[-1] < cap:
        delays.append(min(delays[-1] * 2, cap))
    return Backoff(tuple(delays), jitter=jitter)


_SPANNING_FIRST = 1.0
_SPANNING_CAP = 10.0
_SPANNING_JITTER = 0.2
"""A read that waits out an outage is one cheap query per worker: little jitter needed, and
the outage's end is seen within a few seconds."""


def spanning(
    seconds: float, *, first: float = _SPANNING_FIRST, cap: float = _SPANNING_CAP
) -> Backoff:
    """Delays doubling from `first` (each at most `cap`) that add up to `seconds` before
    jitter: retries across an outage of about that long, then give up."""
    delays: list[float] = []
    delay, left = first, seconds
    while left > 0:
        step = min(delay, cap, left)
        delays.append(step)
        left -= step
        delay *= 2
    return Backoff(tuple(delays), jitter=_SPANNING_JITTER)
