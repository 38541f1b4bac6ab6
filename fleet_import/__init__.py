"""fleet-import core: load tenants' S3 folders into stamped warehouse slices. No Prefect here."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import types
from contextlib import suppress
from typing import Any

_ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"


def _arrow_on_jemalloc() -> None:
    """Arrow's default allocator in the pyarrow wheels (mimalloc) reserves 1 GiB regions and
    keeps freed pages in them. `pa.set_memory_pool` alone does not move Arrow's C++ readers
    and writers (CSV, Parquet) off it: they use the pool named by ARROW_DEFAULT_MEMORY_POOL
    when pyarrow is imported, so the variable is set for that import. A 2M-row delivery
    peaked at 345-377 MB this way, against 374-438 MB with the Python-level pool alone, and
    the 1M-row CSV benchmark ran about 10% faster (2026-11-29).

    pyarrow is not imported here: a command refused for its settings never needs it (issue
    #28: answer in well under 2 s). `_ArrowPoolOnImport` sets the variable around pyarrow's
    own first import, whenever that comes. An explicit ARROW_DEFAULT_MEMORY_POOL still
    wins; if pyarrow was imported before this package, only the Python-level pool can still
    be changed."""
    if os.environ.get(_ARROW_POOL_VARIABLE):
        return
    if "pyarrow" in sys.modules:
        _jemalloc_pool()
    elif sys.platform.startswith("linux"):  # Linux wheels carry jemalloc; others may not
        sys.meta_path.insert(0, _ArrowPoolOnImport())


def _jemalloc_pool() -> None:
    import pyarrow as pa

    with suppress(NotImplementedError):  # built without jemalloc: keep its default
        pa.set_memory_pool(pa.jemalloc_memory_pool())


class _ArrowPoolOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the first `import pyarrow` it leaves the meta path, and runs
    pyarrow's own loader with ARROW_DEFAULT_MEMORY_POOL=jemalloc set for that import only
    (child processes do not inherit it)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> Any:
        if name != "pyarrow":
            return None
        with suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or os.environ.get(_ARROW_POOL_VARIABLE):
            return spec
        exec_module = spec.loader.exec_module

        def exec_with_jemalloc(module: types.ModuleType) -> None:
            os.environ[_ARROW_POOL_VARIABLE] = "jemalloc"
            try:
                exec_module(module)
            finally:
                del os.environ[_ARROW_POOL_VARIABLE]
            _jemalloc_pool()

        spec.loader.exec_module = exec_with_jemalloc  # type: ignore[method-assign]
        return spec


def _few_malloc_arenas() -> None:
    """glibc gives every thread that allocates its own arena and keeps what each frees;
    normalizers, the COPY encoder and its reader thread allocate from numpy, so a load's
    peak grew with the thread count (2M rows: up to 390 MB with 8 arenas, about 355 MB with
    2). An explicit MALLOC_ARENA_MAX still wins; other C libraries are left alone."""
    if os.environ.get("MALLOC_ARENA_MAX") or not sys.platform.startswith("linux"):
        return
    import ctypes

    m_arena_max = -8  # from <malloc.h>
    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(m_arena_max, 2)


_arrow_on_jemalloc()
_few_malloc_arenas()
