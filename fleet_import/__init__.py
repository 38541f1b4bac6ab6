"""fleet-import core: load tenants' S3 folders into stamped warehouse slices. No Prefect here."""

from __future__ import annotations

import os
import sys
from contextlib import suppress


def _prefer_jemalloc() -> None:
    """Arrow's default allocator here (mimalloc) keeps freed pages around; with jemalloc a
    2M-row delivery peaked at 319 MB instead of 384 MB (normalising and loading overlap).
    An explicit ARROW_DEFAULT_MEMORY_POOL still wins."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return
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


_prefer_jemalloc()
_few_malloc_arenas()
