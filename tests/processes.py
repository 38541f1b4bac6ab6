"""Real processes for concurrency tests."""

from __future__ import annotations

from multiprocessing.process import BaseProcess
from typing import Any


def results_of(processes: list[BaseProcess], out: Any, timeout: float = 60) -> list[Any]:
    """Start the processes, take one result per process from the queue `out`, then require
    every process to have exited cleanly. Results come in the order they were put."""
    for process in processes:
        process.start()
    results = [out.get(timeout=timeout) for _ in processes]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    return results
