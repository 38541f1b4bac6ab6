"""Our side of load_throughput.py, run in a child process: one `import_folder` of a folder,
timed from just before it starts to its return, with its phases from the progress callback."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from _delivery import TENANT
from _harness import Measurement, Window, progress

from fleet_import.contracts.files import contracts_in_force
from fleet_import.contracts.fleet import TRIPS
from fleet_import.contracts.model import ContractSet
from fleet_import.importing.context import AlreadyLoaded, Committed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.importing.guards import GuardOverride
from fleet_import.s3.client import s3_client
from fleet_import.s3.staging import StagingArea
from fleet_import.scope import Tenant
from fleet_import.store.gates import GateRepository
from fleet_import.store.repository import BatchRepository
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse

LEASE_TTL_SECONDS = 120.0
# (name, from mark, to mark): a mark is the first or last progress message of a kind.
_PHASES = (
    ("reserve + lease", "start", "first listing"),
    ("list, open the slice, normalize the first file", "first listing", "first normalized"),
    ("COPY of every file (normalizing the rest overlaps)", "first normalized", "last loaded"),
    ("duplicate check + COMMIT + record commit + succeed", "last loaded", "end"),
)


_RSS_SAMPLE_SECONDS = 0.05


class RssTrace:
    """Samples this process's RSS while the import runs and remembers where the peak was:
    the seconds since the start and the last progress message seen before it."""

    def __init__(self) -> None:
        self.last_message = "start"
        self.peak_mb, self.peak_at, self.peak_after = 0.0, 0.0, "start"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-trace", daemon=True)

    def _run(self) -> None:
        started = time.perf_counter()
        while not self._stop.wait(_RSS_SAMPLE_SECONDS):
            status = Path("/proc/self/status").read_text()
            rss = int(status.split("VmRSS:")[1].split()[0]) / 1024
            if rss > self.peak_mb:
                self.peak_mb, self.peak_after = rss, self.last_message
                self.peak_at = time.perf_counter() - started

    def __enter__(self) -> RssTrace:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def details(self) -> dict[str, Any]:
        return {
            "rss_peak_sampled_mb": round(self.peak_mb),
            "rss_peak_at_s": round(self.peak_at, 2),
            "rss_peak_after": self.peak_after,
            **arrow_pools(),
        }


def arrow_pools() -> dict[str, Any]:
    """The pool Arrow's Python calls took and the MB Arrow's C++ code took from mimalloc,
    which is 0 when it ran on the pool fleet_import chose (tests/test_allocators.py)."""
    import pyarrow as pa

    return {
        "arrow_pool": pa.default_memory_pool().backend_name,
        "arrow_mimalloc_peak_mb": round(pa.mimalloc_memory_pool().max_memory() / 2**20),
    }


class TimedStaging(StagingArea):
    """The staging area, adding up the seconds spent uploading (summed over workers)."""

    def __init__(self, uri: str, s3: Any) -> None:
        super().__init__(uri, s3)
        self._lock = threading.Lock()
        self.put_seconds = 0.0
        self.put_bytes = 0

    def put_file(self, local: Path, name: str) -> str:
        started = time.perf_counter()
        try:
            return super().put_file(local, name)
        finally:
            with self._lock:
                self.put_seconds += time.perf_counter() - started
                self.put_bytes += local.stat().st_size


def measure_ours(spec: dict[str, Any]) -> Measurement:
    """One `import_folder`: a cold load (`expect` "committed"), the rerun of an unchanged
    folder (`expect` "already_loaded": no batch, no warehouse work), or its forced rerun
    (`force`, `expect` "cache_hits": every file from the normalized-file cache, nothing
    parsed, the slice replaced by the same rows under a new batch)."""
    s3 = s3_client(spec["endpoint"])
    staging = TimedStaging(spec["staging_uri"], s3)
    marks: dict[str, float] = {}
    label = spec["label"]
    trace = RssTrace()

    def on_progress(message: str, fraction: float | None) -> None:
        now = time.perf_counter()
        kind = message.split(" ", 1)[0]
        marks.setdefault(f"first {kind}", now)
        marks[f"last {kind}"] = now
        trace.last_message = message
        if kind != "loaded":
            progress(f"{label}: {message}")

    warehouse = PostgresWarehouse(spec["database_url"])
    ctx = ImportContext(
        repo=BatchRepository(spec["database_url"]),
        warehouse=warehouse,
        s3=s3,
        staging=staging,
        contracts=contracts_in_force() if spec.get("all_datasets") else ContractSet([TRIPS]),
        lease_ttl=LEASE_TTL_SECONDS,
        workdir=Path(spec["workdir"]),
        progress=on_progress,
        gates=GateRepository(spec["database_url"]),  # the content gate keeps its profiles
    )
    # `no_gate`: the core without the content gate, what the gate's cost is measured against.
    skip_gate = GuardOverride(no_gate=True, reason="no_gate") if spec.get("no_gate") else None
    with Window() as window, trace:
        marks["start"] = time.perf_counter()
        outcome = import_folder(
            ctx,
            Tenant.named(TENANT),
            spec["folder"],
            spec["delivery_key"],
            force=bool(spec.get("force")),
            guard=skip_gate,
        )
        marks["end"] = time.perf_counter()
    pools = arrow_pools()
    if pools["arrow_mimalloc_peak_mb"] and os.environ.get("ARROW_DEFAULT_MEMORY_POOL") is None:
        raise RuntimeError(
            f"Arrow's C++ code took {pools['arrow_mimalloc_peak_mb']} MB from mimalloc, which "
            "no fleet-import process does: import fleet_import before pyarrow in the child"
        )
    if spec.get("expect") == "already_loaded":
        if not isinstance(outcome, AlreadyLoaded) or warehouse.copies:
            raise RuntimeError(f"the unchanged rerun did not end AlreadyLoaded: {outcome}")
        return window.measurement(label, 0, phases={}, stage_upload_seconds_summed=0.0)
    if not isinstance(outcome, Committed) or not outcome.published:
        raise RuntimeError(f"import did not succeed: {outcome}")
    files = outcome.summary["files"]
    hits = [bool(entry["cache_hit"]) for entry in files]
    if spec.get("expect") == "cache_hits":
        if not all(hits):
            raise RuntimeError("a forced rerun parsed a file: every file should be a cache hit")
    elif any(hits):
        raise RuntimeError("a normalized file came from the cache: measure the cold path")
    phases = {
        name: round(marks[end] - marks[begin], 3)
        for name, begin, end in _PHASES
        if begin in marks and end in marks
    }
    return window.measurement(
        label,
        outcome.row_counts[TRIPS.name],
        phases=phases,
        stage_upload_seconds_summed=round(staging.put_seconds, 3),
        staged_mib=round(staging.put_bytes / 2**20, 1),
        gate_seconds=(outcome.summary.get("seconds") or {}).get("gate", 0.0),
        **trace.details(),
    )
