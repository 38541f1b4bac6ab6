"""Named points where a test can kill the process (FLEET_FAILPOINTS=name[,name]).

Off by default; when off, `hit` is one set lookup on an empty frozenset.
"""

from __future__ import annotations

import os

_ACTIVE = frozenset(filter(None, os.environ.get("FLEET_FAILPOINTS", "").split(",")))
_EXIT_CODE = 86


def hit(name: str) -> None:
    if name in _ACTIVE:
        os._exit(_EXIT_CODE)
