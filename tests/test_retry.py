"""The one retry rule's ladders: a doubling ladder read past its end keeps its cap, so the
outboxes (5, 10, 20... s, at most 600 s) and the relay's polling (1, 2, 4... s, at most
60 s) wait as they did when each computed its own."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleet_import.retry import Backoff, doubling

seconds = st.floats(min_value=0.001, max_value=1000.0)


@given(
    first=seconds, stretch=st.floats(min_value=1.0, max_value=1000.0), failures=st.integers(0, 80)
)
def test_a_doubling_ladder_doubles_from_its_first_delay_up_to_its_cap(
    first: float, stretch: float, failures: int
) -> None:
    cap = first * stretch
    assert doubling(first, cap).after(failures) == min(cap, first * 2 ** max(0, failures - 1))


def test_the_outboxes_and_the_relay_keep_their_waits() -> None:
    assert [doubling(5.0, 600.0).after(n) for n in range(1, 11)] == [
        5.0,
        10.0,
        20.0,
        40.0,
        80.0,
        160.0,
        320.0,
        600.0,
        600.0,
        600.0,
    ]
    assert [doubling(1.0, 60.0).after(n) for n in range(1, 9)] == [
        1.0,
        2.0,
        4.0,
        8.0,
        16.0,
        32.0,
        60.0,
        60.0,
    ]


@given(delay=seconds, jitter=st.floats(min_value=0.0, max_value=1.0), failures=st.integers(0, 9))
def test_past_its_ladder_a_backoff_waits_its_last_delay(
    delay: float, jitter: float, failures: int
) -> None:
    wait = Backoff((delay / 2, delay), jitter=jitter).after(failures + 2)
    assert delay <= wait <= delay * (1 + jitter)
