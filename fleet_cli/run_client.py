"""A flow-run process of `fleet-import worker`: the command the worker starts for each run.

It imports nothing heavy. It hands its environment, working directory and standard streams
to the worker's run server (`fleet_cli.run_server`, which has Prefect and the flows imported
already), which forks the run; this process then stands for it to the worker: it forwards
SIGTERM and SIGINT, and exits with the run's code (killed with SIGKILL itself when the run
was killed). If no run server answers, or its code is older than the checkout's, it becomes
the engine itself (`python -m prefect.engine`), as Prefect would start it.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import sys
from contextlib import suppress

SERVER_VARIABLE = "FLEET_RUN_SERVER"
MESSAGE_BYTES = 1 << 20
STREAMS = (0, 1, 2)


def engine_argv() -> list[str]:
    return [sys.executable, "-m", "prefect.engine", *sys.argv[1:]]


def _become_the_engine(why: str) -> None:
    if why:
        print(f"fleet-import worker: {why}; starting Prefect's engine directly", file=sys.stderr)
    sys.stderr.flush()
    os.execv(sys.executable, engine_argv())


def _handed_over(path: str) -> socket.socket | None:
    """The run handed to the server at `path`, or None when none takes it."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
        request = {"env": dict(os.environ), "cwd": os.getcwd(), "argv": sys.argv[1:]}
        fds = array.array("i", STREAMS).tobytes()
        conn.sendmsg([json.dumps(request).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    except OSError:
        conn.close()
        return None
    return conn


def _forward(pid: int) -> None:
    def forward(signum: int, _frame: object) -> None:
        with suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)


def main() -> None:
    path = os.environ.get(SERVER_VARIABLE, "")
    conn = _handed_over(path) if path else None
    if conn is None:
        _become_the_engine(f"no run server at {path}" if path else "")
    first = json.loads(conn.recv(MESSAGE_BYTES) or b"{}")
    if "pid" not in first:  # the server's code is older than the checkout's: not forked
        conn.close()
        _become_the_engine(first.get("refused", "the run server did not start the run"))
    _forward(first["pid"])
    message = conn.recv(MESSAGE_BYTES)  # retried after a forwarded signal (PEP 475)
    if not message:  # the run ended without saying its code: it was killed
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(json.loads(message)["exit"])


if __name__ == "__main__":
    main()
