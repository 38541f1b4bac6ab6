"""Load `.sql` files whose statements are named by `-- name --` section lines."""

from __future__ import annotations

import re
from importlib.resources import files

_SECTION = re.compile(r"^-- ([a-z_][a-z0-9_]*) --$", re.MULTILINE)


def load_queries(package: str, filename: str) -> dict[str, str]:
    text = files(package).joinpath(filename).read_text(encoding="utf-8")
    parts = _SECTION.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"{filename}: query {name!r} is defined twice")
        queries[name] = body.strip()
    return queries
