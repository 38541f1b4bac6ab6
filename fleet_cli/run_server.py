"""The run server of `fleet-import worker`: Prefect and the flows imported once, each flow run
forked from here instead of a fresh interpreter importing them again (issue 30: the imports
were most of a tiny delivery's run on a worker).

    python -m fleet_cli.run_server SOCKET_PATH

It is single-threaded and never runs a flow itself, so every fork starts from the same clean,
just-imported state. A run (`fleet_cli.run_client` sends its environment, working directory
and standard streams) gets its own process: the client's environment, directory and streams,
Prefect's settings read again from that environment, then exactly what `python -m
prefect.engine` does. The run kills itself if its client dies (a worker killing the run kills
the client). When any file of the project changed since the imports (a checkout updated in
place), the run is refused, its client starts the engine directly, and the server starts
itself again with the new code.
"""

from __future__ import annotations

import array
import atexit
import gc
import importlib
import json
import os
import runpy
import signal
import socket
import sys
import threading
import traceback
import warnings
from contextlib import suppress
from pathlib import Path

from fleet_cli.run_client import MESSAGE_BYTES, STREAMS

PRELOADED = (
    "flows.import_s3_folder",
    "flows.bulk_import",
    "flows.resume_publication",
    "flows.approve_held_batch",
    "flows.rollback_slice",
    "flows.drain_publications",
    "flows.sweep_landing_zone",
    "flows.check_freshness",
    "flows.trim_operational_state",
    "prefect.flow_engine",
)
PROJECT_PACKAGES = ("fleet_import", "fleet_cli", "flows", "blocks")
_FD_BYTES = socket.CMSG_SPACE(len(STREAMS) * array.array("i").itemsize)


def project_files() -> dict[str, int]:
    """Every file of the project's packages with its modification time: what the imports
    read, and the SQL and contract files read later."""
    files: dict[str, int] = {}
    for package in PROJECT_PACKAGES:
        root = Path(importlib.import_module(package).__file__ or "").parent
        for path in root.rglob("*"):
            if path.suffix in (".py", ".sql", ".yaml", ".json") and path.is_file():
                files[str(path)] = path.stat().st_mtime_ns
    return files


def changed_since(files: dict[str, int]) -> str | None:
    """The first project file changed, added or removed since `files` was taken."""
    now = project_files()
    for path in now.keys() | files.keys():
        if now.get(path) != files.get(path):
            return path
    return None


def _received(conn: socket.socket) -> tuple[dict, list[int]]:
    data, ancillary, _flags, _address = conn.recvmsg(MESSAGE_BYTES, _FD_BYTES)
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return json.loads(data), list(fds)


def _die_with(conn: socket.socket) -> None:
    """The client holds the other end: once it is gone (killed), so is this run."""
    try:
        conn.recv(1)
    finally:
        os.kill(os.getpid(), signal.SIGKILL)


def _run(conn: socket.socket, request: dict, fds: list[int]) -> int:
    """In the forked child: become the client's process, then run Prefect's engine."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in zip(STREAMS, fds, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = ["prefect.engine", *request["argv"]]
    import prefect.context
    import prefect.logging.configuration

    from fleet_import import failpoints

    # What was read from the server's environment at import, read again from the run's.
    prefect.context.refresh_global_settings_context()
    prefect.logging.configuration.setup_logging()
    failpoints.read_environment()
    conn.send(json.dumps({"pid": os.getpid()}).encode())
    threading.Thread(target=_die_with, args=(conn,), daemon=True).start()
    # The flows imported prefect.engine as a module; running it as __main__ is intended.
    warnings.filterwarnings("ignore", "'prefect.engine' found in sys.modules", RuntimeWarning)
    try:
        runpy.run_module("prefect.engine", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _child(listener: socket.socket, conn: socket.socket, request: dict, fds: list[int]) -> None:
    """The forked run's whole life; it never returns into the server's loop."""
    listener.close()
    code = 1
    try:
        code = _run(conn, request, fds)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with suppress(Exception):  # a closed stream must not keep the run alive
                stream.flush()
        threading._shutdown()  # what the interpreter does at exit: its threads, then atexit
        atexit._run_exitfuncs()
        try:
            conn.send(json.dumps({"exit": code}).encode())
        finally:
            os._exit(code)


def serve(path: str) -> None:
    for module in PRELOADED:
        __import__(module)
    files = project_files()
    gc.freeze()  # what the imports made is shared with every fork, never collected
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # runs are reaped by the kernel
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    Path(path).unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    while True:
        conn, _ = listener.accept()
        try:
            request, fds = _received(conn)
        except (OSError, ValueError):
            conn.close()
            continue
        changed = changed_since(files)
        if changed is not None:
            conn.send(
                json.dumps({"refused": f"{changed} changed since the run server started"}).encode()
            )
            for fd in fds:
                os.close(fd)
            conn.close()
            listener.close()
            os.execv(sys.executable, [sys.executable, "-m", "fleet_cli.run_server", path])
        sys.stdout.flush()  # nothing buffered here is written again by every run
        sys.stderr.flush()
        if os.fork() == 0:
            _child(listener, conn, request, fds)
        for fd in fds:
            os.close(fd)
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
