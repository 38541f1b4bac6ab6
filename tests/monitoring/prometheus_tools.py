"""Debian's `prometheus` package (the server and `promtool`) for the tests that need it. A
machine without it skips them, unless the run requires it (FLEET_REQUIRE_PROMETHEUS, as
.ci/run sets after installing it): then a missing one fails the test instead of hiding it
as a skip."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

REQUIRE_PROMETHEUS_ENV = "FLEET_REQUIRE_PROMETHEUS"


def missing(reason: str) -> NoReturn:
    """Skip, unless the run requires Prometheus: then fail."""
    if os.environ.get(REQUIRE_PROMETHEUS_ENV):
        pytest.fail(f"{REQUIRE_PROMETHEUS_ENV} is set but {reason}")
    pytest.skip(reason)


def executable(name: str) -> str:
    """The path of `prometheus` or `promtool`, or skip/fail as `missing` says."""
    found = shutil.which(name)
    if found is None:
        missing(f"{name} is not installed (apt-get install prometheus)")
    return found
