"""The `fleet-import` command as a new user runs it, in a clean environment, timed, and what
a refused or failed first contact must look like.

`fleet` calls the command in this process by default (typer's runner: the same argument
parsing, settings checks, exit codes and printed lines, without a second of imports per
call); `in_child=True` starts it as a child process, for what only a process shows: which
modules it imported, Prefect's own settings read from a fresh environment. What a command
costs is its CPU time (this process's, or the child's), which a shared host does not
inflate as it does the wall clock."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from tests.prefect_server import free_port

CONFIGURATION_ERROR = 78
# Generous: the bound catches a command that starts Prefect (seconds of CPU for its imports
# and its server) before checking its settings, not a slow machine. CPU time, which two busy
# cores shared with other runs do not stretch; the wall time is printed beside it.
CPU_BOUND_SECONDS = 30.0
FOLDER = "s3://fleet-landing/acme/fleet/2026-07-22/"
SECRET = "s3cret-pw"


@dataclass(frozen=True)
class Ran:
    """What a command left: its exit code and its two streams (a child's, or the runner's)."""

    returncode: int
    stdout: str
    stderr: str


def closed_port_url() -> str:
    """A PostgreSQL URL with a password, on a port nothing listens on."""
    return f"postgresql://postgres:{SECRET}@127.0.0.1:{free_port()}/fleet"


@contextmanager
def clean_environment(env: Mapping[str, str]) -> Iterator[None]:
    """os.environ without the caller's FLEET_* and PREFECT_* but `env`, restored after:
    the command writes to it (--debug, its options for the flow it runs)."""
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith(("FLEET_", "PREFECT_"))]:
        del os.environ[key]
    os.environ.update({"COLUMNS": "200", **env})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def terminal_width(columns: int) -> Iterator[None]:
    """The command's consoles `columns` wide, as a child started with COLUMNS would see them:
    rich reads COLUMNS once, when a console is made (at its module's import)."""
    from rich.console import Console

    consoles = [
        value
        for name, module in list(sys.modules.items())
        if name.startswith("fleet_cli") and module is not None
        for value in vars(module).values()
        if isinstance(value, Console)
    ]
    widths = [console._width for console in consoles]
    for console in consoles:
        console._width = columns
    try:
        yield
    finally:
        for console, width in zip(consoles, widths, strict=True):
            console._width = width


def invoke(args: tuple[str, ...], env: Mapping[str, str]) -> Ran:
    """The command in this process, as `python -m fleet_cli` would run it; an exception the
    command let out is printed on stderr as a child's traceback would be."""
    from typer.testing import CliRunner

    import flows.common
    from fleet_cli.cli import app

    # `run` freezes the heap of the process it owns; this one runs many tests.
    keep = flows.common.freeze_startup_heap
    flows.common.freeze_startup_heap = lambda **_: None  # type: ignore[assignment]
    try:
        with clean_environment(env), terminal_width(int(env.get("COLUMNS", "200"))):
            result = CliRunner().invoke(app, list(args), prog_name="fleet-import")
    finally:
        flows.common.freeze_startup_heap = keep  # type: ignore[assignment]
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "Traceback (most recent call last):\n" + "".join(
            traceback.format_exception(result.exception)
        )
    return Ran(result.exit_code, result.stdout, stderr)


def fleet(*args: str, in_child: bool = False, **env: str) -> tuple[Ran, float]:
    """The CLI in a clean environment (no FLEET_* or PREFECT_* from the caller but `env`);
    returns what it left and the CPU seconds it took (the child's, or this process's)."""
    started, cpu_before = time.monotonic(), _cpu_seconds(in_child)
    if in_child:
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "PREFECT_"))}
        clean.update(COLUMNS="200", **env)
        child = subprocess.run(
            [sys.executable, "-m", "fleet_cli", *args],
            capture_output=True,
            text=True,
            env=clean,
            timeout=300,
        )
        result = Ran(child.returncode, child.stdout, child.stderr)
    else:
        result = invoke(args, env)
    cpu = _cpu_seconds(in_child) - cpu_before
    wall = time.monotonic() - started
    where = "child" if in_child else "in process"
    print(
        f"fleet-import {' '.join(args)}: exit {result.returncode}, {cpu:.2f} s of CPU, "
        f"{wall:.2f} s of wall ({where})"
    )
    return result, cpu


def _cpu_seconds(of_children: bool) -> float:
    """User and system time of this process, or of its children that ended."""
    if not of_children:
        return time.process_time()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def error_lines(result: Ran) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def assert_refused(result: Ran, cpu_seconds: float, *lines: str) -> None:
    assert result.returncode == CONFIGURATION_ERROR, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    printed = error_lines(result)
    for line in lines:
        assert any(line in p for p in printed), (line, printed)
    assert all(p.startswith("error: ") for p in printed), printed
    assert cpu_seconds < CPU_BOUND_SECONDS


def invoke_with_test_settings(*args: str, **extra: str) -> Ran:
    """The command in this process with the FLEET_* settings the test set (`flow_env`'s) and
    the Prefect test harness's API, as a user's shell would hold them."""
    from prefect.settings import PREFECT_API_URL

    env = {k: v for k, v in os.environ.items() if k.startswith("FLEET_")}
    return invoke(args, {**env, "PREFECT_API_URL": str(PREFECT_API_URL.value()), **extra})
