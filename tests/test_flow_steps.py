"""The import flow's step runner (flows/prefect_steps.PrefectSteps) under Prefect's test
harness: what the core's CoreSteps promises holds for the flow's tasks too."""

from __future__ import annotations

import threading
import time

import pytest
from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from fleet_import.errors import PreCommitError
from fleet_import.importing.driver import Step
from flows.prefect_steps import PrefectSteps

pytestmark = pytest.mark.slow

_WAIT_SECONDS = 10.0
"""Only a broken test waits this long."""
_MARGIN_SECONDS = 0.2
"""After the flow saw the failure: for the failed task's worker to run its done callbacks."""


def test_a_failed_item_starts_no_further_items_of_a_map(prefect_api: None) -> None:
    """Two at a time, four items; the first fails while the second still runs. The two
    queued items never start, so an S3 that stopped answering costs a run one call's bound,
    not one per queued file (before, the freed worker took the next file at once)."""
    started: list[str] = []
    second_started, failure_seen = threading.Event(), threading.Event()

    def item(name: str) -> str:
        started.append(name)
        if name == "first":
            assert second_started.wait(_WAIT_SECONDS)
            raise PreCommitError("first fails")
        second_started.set()
        if name == "second":  # under way until the flow has seen first fail
            assert failure_seen.wait(_WAIT_SECONDS)
            time.sleep(_MARGIN_SECONDS)
        return name

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=2))
    def mapped() -> str:
        items = [("first",), ("second",), ("third",), ("fourth",)]
        try:
            list(PrefectSteps().map(Step("item", retried=False), item, items))
        except PreCommitError as exc:
            failure_seen.set()
            return str(exc)
        return "no failure"

    assert mapped() == "first fails"
    assert sorted(started) == ["first", "second"]
