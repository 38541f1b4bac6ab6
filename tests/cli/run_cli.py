"""The `fleet-import` command as a new user runs it: a subprocess in a clean environment,
timed, and what a refused or failed first contact must look like."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.prefect_server import free_port

CONFIGURATION_ERROR = 78
# Generous: the bound catches a command that starts Prefect or waits on a network before
# checking its settings (28 s before), not a slow machine. The time is printed either way.
FAST_ENOUGH_SECONDS = 30.0
FOLDER = "s3://fleet-landing/acme/fleet/2026-07-22/"
SECRET = "s3cret-pw"


def closed_port_url() -> str:
    """A PostgreSQL URL with a password, on a port nothing listens on."""
    return f"postgresql://postgres:{SECRET}@127.0.0.1:{free_port()}/fleet"


def fleet(*args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """The CLI in a clean environment (no FLEET_* or PREFECT_* from the caller but `env`)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "PREFECT_"))}
    clean.update(COLUMNS="200", **env)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "fleet_cli", *args],
        capture_output=True,
        text=True,
        env=clean,
        timeout=300,
    )
    seconds = time.monotonic() - started
    print(f"fleet-import {' '.join(args)}: exit {result.returncode} in {seconds:.2f}s")
    return result, seconds


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def assert_refused(result: subprocess.CompletedProcess[str], seconds: float, *lines: str) -> None:
    assert result.returncode == CONFIGURATION_ERROR, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    printed = error_lines(result)
    for line in lines:
        assert any(line in p for p in printed), (line, printed)
    assert all(p.startswith("error: ") for p in printed), printed
    assert seconds < FAST_ENOUGH_SECONDS
