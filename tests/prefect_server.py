"""A private `prefect server start` for tests and benchmarks: its own port, PREFECT_HOME
and SQLite file, stopped with its whole process group. Shared by tests/test_deployments.py,
tests/workers/ and the benchmarks (through benchmarks/_harness.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.no_servers import refuse_servers

REPO = Path(__file__).resolve().parent.parent
PREFECT = str(Path(sys.executable).with_name("prefect"))
# Generous: on PostgreSQL the server runs all its migrations first, on a busy host slowly.
SERVER_START_TIMEOUT = 240.0
_SERVER_STOP_TIMEOUT = 15.0
COMMAND_TIMEOUT = 180.0


class ServerFailed(RuntimeError):
    """The Prefect server did not start."""


@dataclass(frozen=True)
class PrefectServer:
    api_url: str
    client_home: Path

    def env(self, **extra: str) -> dict[str, str]:
        """A subprocess environment talking to this server only: no PREFECT_* or FLEET_*
        variables leak in from the developer's shell or profile."""
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("PREFECT_", "FLEET_"))
        }
        env.update(
            PREFECT_HOME=str(self.client_home),
            PREFECT_API_URL=self.api_url,
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            COLUMNS="200",
        )
        env.update(extra)
        return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(process: subprocess.Popen[bytes], api_url: str, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerFailed(
                f"prefect server exited with {process.returncode}:\n{log.read_text()}"
            )
        try:
            if httpx.get(f"{api_url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise ServerFailed(
        f"prefect server not healthy after {SERVER_START_TIMEOUT}s:\n{log.read_text()}"
    )


def stop_group(process: subprocess.Popen[bytes], timeout: float = _SERVER_STOP_TIMEOUT) -> None:
    """SIGTERM the process group (a server and its services, a worker and its runs), SIGKILL
    if it lingers."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=timeout)
    except ProcessLookupError:
        pass


@contextmanager
def prefect_server(root: Path, **server_env: str) -> Iterator[PrefectServer]:
    """`prefect server start` on a free port with a private PREFECT_HOME and SQLite file."""
    refuse_servers("a Prefect server")
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    server = PrefectServer(api_url=api_url, client_home=root / "client-home")
    defaults = {
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        # Many concurrent runs need PostgreSQL (asyncpg_url): SQLite answers "database is
        # locked" under a few workers' writes.
        "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{root / 'prefect.db'}",
    }
    env = server.env(
        PREFECT_HOME=str(root / "server-home"),
        **{**defaults, **server_env},  # a caller may turn the UI on, or use PostgreSQL
    )
    env.pop("PREFECT_API_URL")
    log = root / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            cwd=root,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, killed as a whole
        )
    try:
        _wait_healthy(process, api_url, log)
        yield server
    finally:
        stop_group(process)


def asyncpg_url(url: str) -> str:
    """A libpq URL as the SQLAlchemy asyncpg URL the Prefect server takes."""
    return "postgresql+asyncpg://" + url.split("://", 1)[1]


def run(
    args: list[str], env: Mapping[str, str], cwd: Path = REPO, timeout: float = COMMAND_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, env=dict(env), cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def output(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
