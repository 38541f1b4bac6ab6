"""Failpoints are read from the environment at import and again on request: a flow run
forked from `fleet-import worker`'s run server gets its run's environment after the
import (fleet_cli/run_server.py), and a failpoint set for that run must hold there."""

from __future__ import annotations

import pytest

from fleet_import import failpoints


def test_the_environment_read_again_arms_and_disarms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_FAILPOINTS", "somewhere=raise")
    failpoints.read_environment()
    with pytest.raises(RuntimeError, match="failpoint somewhere"):
        failpoints.hit("somewhere")
    monkeypatch.delenv("FLEET_FAILPOINTS")
    failpoints.read_environment()
    failpoints.hit("somewhere")  # off again
