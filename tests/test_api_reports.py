"""flows/api_reports.py without a Prefect API: which errors mean the API is gone, a report
that finds it gone is dropped (a bug still raises), and a flow body that meets it ends in a
Failed state with one line, kept for the command that ran it (issue #26)."""

from __future__ import annotations

import httpx
import pytest
from prefect.states import State

from flows.api_reports import api_unreachable, last_computed_state, report
from flows.reporting import fails_with_one_line

_REQUEST = httpx.Request("POST", "http://127.0.0.1:4200/api/flow_runs/x/set_state")


def _status(code: int) -> httpx.HTTPStatusError:
    response = httpx.Response(code, request=_REQUEST)
    return httpx.HTTPStatusError(f"{code}", request=_REQUEST, response=response)


@pytest.mark.parametrize(
    ("exc", "gone"),
    [
        (httpx.ConnectError("[Errno 111] Connection refused"), True),
        (httpx.ReadTimeout("timed out"), True),
        (_status(503), True),
        (_status(422), False),  # the API answered: our request was wrong, a bug
        (ValueError("x"), False),
    ],
)
def test_what_counts_as_the_api_gone(exc: Exception, gone: bool) -> None:
    assert api_unreachable(exc) is gone


def test_a_report_that_finds_the_api_gone_is_dropped_and_a_bug_still_raises() -> None:
    def refused() -> int:
        raise httpx.ConnectError("[Errno 111] Connection refused")

    def bug() -> int:
        raise KeyError("artifact")

    assert report("the progress", lambda: 7) == 7
    assert report("the progress", refused) is None
    with pytest.raises(KeyError):
        report("the progress", bug)


def test_a_flow_body_that_meets_the_api_gone_ends_failed_with_one_line() -> None:
    @fails_with_one_line
    def body() -> State:
        raise httpx.ConnectError("[Errno 111] Connection refused")

    state = body()
    assert isinstance(state, State) and state.is_failed()
    assert state.message == (
        "the Prefect API does not answer (ConnectError): check PREFECT_API_URL"
    )
    assert last_computed_state() is state
