"""The contention benchmark's baseline is wrong in the way it claims: under the same race
(contenders on their own connections passing a barrier together), SELECT-then-INSERT
reserves one scope twice, while our reservation never does."""

from __future__ import annotations

import pytest

from benchmarks.contention import race

_CONTENDERS = 16
_ROUNDS = 15


@pytest.mark.slow
def test_naive_select_then_insert_double_reserves_and_ours_never_does(database_url: str) -> None:
    naive = race(database_url, "naive", contenders=_CONTENDERS, rounds=_ROUNDS)
    ours = race(database_url, "ours", contenders=_CONTENDERS, rounds=_ROUNDS)
    ours_connect = race(database_url, "ours+connect", contenders=_CONTENDERS, rounds=5)
    assert naive.double_reservations > 0, naive.line()
    assert ours.double_reservations == 0 and ours.reservations >= _ROUNDS, ours.line()
    assert ours_connect.double_reservations == 0 and ours_connect.reservations >= 5
