"""Our reservation under the contention benchmark's race: contenders, each on connections
of its own, pass a barrier together and reserve one scope. The unique partial index must
let exactly one win each round, and every loser must learn who holds the scope."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from benchmarks.contention import race
from fleet_import.scope import Tenant, source_scope
from fleet_import.store.details import FailureKind
from fleet_import.store.models import (
    Reserved,
    ReserveOutcome,
    ScopeBusy,
)
from fleet_import.store.repository import BatchRepository

_CONTENDERS = 16
_ROUNDS = 10
_BARRIER_TIMEOUT_SECONDS = 60.0
_TENANT = Tenant.named("acme")
_SCOPE = source_scope("s3://fleet-landing/acme/fleet/2026-07-22/")


def _race_rounds(
    database_url: str,
) -> tuple[list[list[ReserveOutcome | None]], list[list[uuid.UUID]]]:
    """Each round: all contenders reserve at once with their own delivery key; once all have
    an answer, the running batches are read and the winner releases the scope."""
    repo = BatchRepository(database_url)
    outcomes: list[list[ReserveOutcome | None]] = [[None] * _CONTENDERS for _ in range(_ROUNDS)]
    running: list[list[uuid.UUID]] = []

    def close_round() -> None:
        running.append([batch.id for batch in repo.list(status="running")])
        for outcome in outcomes[len(running) - 1]:
            if isinstance(outcome, Reserved):
                repo.mark_failed(outcome.batch.id, None, FailureKind.ENQUEUE_FAILED, "released")

    start = threading.Barrier(_CONTENDERS)
    answered = threading.Barrier(_CONTENDERS, action=close_round)

    def contender(index: int) -> None:
        own = BatchRepository(database_url)
        try:
            for round_no in range(_ROUNDS):
                start.wait(_BARRIER_TIMEOUT_SECONDS)
                key = f"c{index}-r{round_no}"
                outcomes[round_no][index] = own.reserve(_TENANT, _SCOPE, key)
                answered.wait(_BARRIER_TIMEOUT_SECONDS)
        except BaseException:
            start.abort()
            answered.abort()
            raise

    with ThreadPoolExecutor(_CONTENDERS) as pool:
        for future in [pool.submit(contender, index) for index in range(_CONTENDERS)]:
            future.result()
    return outcomes, running


@pytest.mark.slow
def test_each_round_has_one_winner_and_every_loser_is_told_who_holds_the_scope(
    database_url: str,
) -> None:
    outcomes, running = _race_rounds(database_url)

    winners = []
    for round_no, answers in enumerate(outcomes):
        reserved = [answer for answer in answers if isinstance(answer, Reserved)]
        assert len(reserved) == 1, [answer.batch.delivery_key for answer in reserved]
        winner = reserved[0]
        losers = [answer for answer in answers if answer is not winner]
        assert losers == [ScopeBusy(winner.batch.id, winner.batch.delivery_key)] * len(losers)
        assert len(losers) == _CONTENDERS - 1
        assert running[round_no] == [winner.batch.id]
        winners.append(winner.batch.id)
    assert len(set(winners)) == _ROUNDS


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ours", "ours+connect"])
def test_the_contention_benchmark_never_sees_our_reservation_held_twice(
    database_url: str, method: str
) -> None:
    result = race(database_url, method, contenders=_CONTENDERS, rounds=_ROUNDS)
    assert result.double_reservations == 0, result.line()
    assert result.reservations >= _ROUNDS, result.line()
