"""Named points where a test can kill or hold the process: FLEET_FAILPOINTS=spec[,spec].

`name` kills the process there (os._exit); `name=kill` sends it SIGKILL, as the OOM
killer or `kill -9` would; `name=wait:PATH` holds it there until PATH exists (at most a
minute), so a test can overlap two runs deterministically; `name=raise` raises a
RuntimeError there, a stand-in for a bug. Off by default; when off, `hit` is one
truthiness check.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

_EXIT_CODE = 86
_WAIT_LIMIT_SECONDS = 60.0
_WAIT_POLL_SECONDS = 0.05


def _parse(raw: str) -> dict[str, str]:
    actions: dict[str, str] = {}
    for spec in filter(None, (part.strip() for part in raw.split(","))):
        name, _, action = spec.partition("=")
        actions[name] = action or "exit"
    return actions


_ACTIVE: dict[str, str] = {}


def read_environment() -> None:
    """FLEET_FAILPOINTS, read at import and again by a process forked to run a flow
    (`fleet-import worker`'s run server), which gets its run's environment after the import."""
    global _ACTIVE
    _ACTIVE = _parse(os.environ.get("FLEET_FAILPOINTS", ""))


read_environment()


def hit(name: str, detail: str = "") -> None:
    """`hit("in_step_", step)` names the point `in_step_<step>`; the name is only built when
    a failpoint is active, so a run without any pays one truthiness check."""
    if not _ACTIVE:
        return
    action = _ACTIVE.get(name + detail)
    if action is None:
        return
    if action.startswith("wait:"):
        release = Path(action.removeprefix("wait:"))
        deadline = time.monotonic() + _WAIT_LIMIT_SECONDS
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(_WAIT_POLL_SECONDS)
        return
    if action == "raise":
        raise RuntimeError(f"failpoint {name}{detail}")
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(_EXIT_CODE)
