"""fleet-import core: load tenants' S3 folders into stamped warehouse slices. No Prefect here."""

from __future__ import annotations

import os
import sys
from contextlib import suppress

_ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"


def _arrow_on_jemalloc() -> None:
    """Arrow's default allocator in the pyarrow wheels (mimalloc) reserves 1 GiB regions and
    keeps freed pages in them. `pa.set_memory_pool` alone does not move Arrow's C++ readers
    and writers (CSV, Parquet) off it: they use the pool named by ARROW_DEFAULT_MEMORY_POOL
    when pyarrow is imported, so the variable is set for that import. A 2M-row delivery
    peaked at 345-377 MB this way, against 374-438 MB with the Python-level pool alone, and
    the 1M-row CSV benchmark ran about 10% faster (2026-11-29).

    An explicit ARROW_DEFAULT_MEMORY_POOL still wins; if pyarrow was imported before this
    package, only the Python-level pool can still be changed."""
    chosen = os.environ.get(_ARROW_POOL_VARIABLE)
    if chosen:
        return
    # Linux wheels carry jemalloc; where one may not, pyarrow would warn about the variable.
    if "pyarrow" not in sys.modules and sys.platform.startswith("linux"):
        os.environ[_ARROW_POOL_VARIABLE] = "jemalloc"
        try:
            import pyarrow  # noqa: F401 - reads the variable now
        finally:
            del os.environ[_ARROW_POOL_VARIABLE]
    import pyarrow as pa

    with suppress(NotImplementedError):  # built without jemalloc: keep its default
        pa.set_memory_pool(pa.jemalloc_memory_pool())


def _few_malloc_arenas() -> None:
    """glibc gives every thread that allocates its own arena and keeps what each frees;
    normalisers, the COPY encoder and its reader thread allocate from numpy, so a load's
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
