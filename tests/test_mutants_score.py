"""tests/mutants.py's reading of pytest's exit: a mutant counts as killed only when a test
failed, including when xdist's -x ended the run at that failure with exit 2."""

from __future__ import annotations

from tests.mutants import score

XDIST_STOPPED = """\
FAILED tests/faults/test_outage_matrix.py::test_x[copy-postgres] - AssertionError
!!!!!!!!!!!! xdist.dsession.Interrupted: stopping after 1 failures !!!!!!!!!!!!!
1 failed, 88 passed in 434.50s (0:07:14)
"""


def test_a_failed_test_kills_the_mutant() -> None:
    assert score(1, "FAILED tests/a.py::t - AssertionError\n") == "killed"
    assert score(2, XDIST_STOPPED) == "killed"


def test_a_passing_suite_lets_it_survive_and_a_timeout_is_said() -> None:
    assert score(0, "10 passed\n") == "survived"
    assert score(None, "") == "timeout"


def test_an_interrupted_or_broken_run_says_nothing_about_the_mutant() -> None:
    fixture_error = XDIST_STOPPED.replace("FAILED", "ERROR")
    assert score(2, fixture_error) == "error"
    collection_error = "ERROR collecting tests/a.py\nInterrupted: 1 error during collection\n"
    assert score(2, collection_error) == "error"
    assert score(5, "no tests ran\n") == "error"
