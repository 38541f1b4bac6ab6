"""Process-wide allocator choices made on import of `fleet_import` (see its __init__)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_NORMALIZE_A_CSV = """
import os, sys, tempfile
from pathlib import Path

import fleet_import  # first, as every entry point does
import pyarrow as pa

from fleet_import.contracts.fleet import TRIPS
from fleet_import.normalize.file import normalize_file
from fleet_import.sample_data import csv_bytes, trips_table

work = Path(tempfile.mkdtemp())
(work / "trips.csv").write_bytes(csv_bytes(trips_table(20_000, start=0)))
out = work / "trips.parquet"
normalize_file(work / "trips.csv", source_key="k", fmt="csv", contract=TRIPS, out_path=out)
print(pa.default_memory_pool().backend_name, pa.mimalloc_memory_pool().max_memory(),
      os.environ.get("ARROW_DEFAULT_MEMORY_POOL"))
"""


def _normalize_in_child(env: dict[str, str]) -> list[str]:
    child_env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    result = subprocess.run(
        [sys.executable, "-c", _NORMALIZE_A_CSV],
        env={**child_env, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="jemalloc is chosen on Linux")
def test_arrow_cpp_readers_and_writers_allocate_from_jemalloc() -> None:
    """Arrow's C++ code (the CSV reader, the Parquet writer) uses the pool named when
    pyarrow is imported, not the one `pa.set_memory_pool` names: nothing may come from
    mimalloc, and the variable set for the import is not left for child processes."""
    backend, mimalloc_peak, variable = _normalize_in_child({})
    assert (backend, mimalloc_peak, variable) == ("jemalloc", "0", "None")


def test_an_explicit_arrow_pool_wins() -> None:
    backend, _, variable = _normalize_in_child({"ARROW_DEFAULT_MEMORY_POOL": "system"})
    assert (backend, variable) == ("system", "system")
