"""How Prefect's server decides that an event's resource matches a trigger's `match`
(prefect.server.events.schemas.events.matches), without Prefect: the sweep's tests check the
marker triggers it deploys against it where no server evaluates triggers."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any


def marker_event_matches(resource_id: str | None, pattern: str | Sequence[str]) -> bool:
    """Whether a trigger's `match` value accepts this resource id, as Prefect decides it:
    fnmatch globs (case-sensitive; `*` also crosses `/`), a leading `!` negates, a list
    matches when any of its patterns does, and a missing label never matches."""
    if resource_id is None:
        return False
    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    for candidate in patterns:
        positive = not candidate.startswith("!")
        matched = fnmatch.fnmatchcase(resource_id, candidate.removeprefix("!"))
        if matched == positive:
            return True
    return False


def resource_matches(resource: Mapping[str, str], match: Mapping[str, Any]) -> bool:
    """A whole `match` specification: every label must match (Prefect's
    ResourceSpecification.matches)."""
    return all(marker_event_matches(resource.get(label), value) for label, value in match.items())
