"""Helpers for the benchmarks: a fresh database, a moto S3 server, measured child processes.

Each measured part runs in a child process of its own, so that its peak RSS (VmHWM) is its
own and nothing the parent holds (generated data, moto's objects) is counted.
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parent.parent
RESULT_PREFIX = "RESULT "
_PREFETCH_POLL_SECONDS = 0.2

T = TypeVar("T")


def _tests_module(name: str) -> ModuleType:
    """A module of tests/, importable from a script run as `python benchmarks/x.py`."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module(f"tests.{name}")


def pgtools() -> ModuleType:
    """tests.pgtools: find or start a PostgreSQL, create, migrate, drop."""
    return _tests_module("pgtools")


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def peak_rss_mb() -> float:
    """VmHWM: this process's own peak RSS. (getrusage's ru_maxrss survives exec on Linux,
    so a child would report its parent's peak.)"""
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


@contextmanager
def fresh_database(admin_url: str | None, prefix: str = "fleet_bench") -> Iterator[str]:
    """A new database migrated to head on the given server (default: the one the tests
    use, the embedded pgserver where none answers), dropped afterwards."""
    tools = pgtools()
    server = admin_url or tools.server_url()
    name = tools.unique_name(prefix)
    url = tools.create_database(server, name)
    try:
        tools.migrate(url)
        yield url
    finally:
        tools.drop_database(server, name)


def moto_s3() -> AbstractContextManager[str]:
    """tests.s3fixtures' moto server: http://127.0.0.1:<port>, in this process, with fake
    credentials in os.environ (so child processes reach it) while it runs."""
    return _tests_module("s3fixtures").moto_server()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def moto_s3_process(timeout: float = 30.0) -> Iterator[str]:
    """http://127.0.0.1:<port> of a moto server in a process of its own, for benchmarks of
    concurrency: its request handling does not share the GIL of what is measured. Fake
    credentials are in os.environ while it runs (child processes inherit them)."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with _tests_module("s3fixtures").fake_credentials():
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                    break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("moto server did not start") from None
                    time.sleep(0.1)
            yield endpoint
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def checkpoint(url: str) -> None:
    """Flush dirty buffers now, so that one load's checkpoint does not land in the next."""
    import psycopg

    from fleet_import.config import libpq_url

    try:
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        pass


def _host_cpu_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def _process_ticks(stat: str, *, children: bool) -> int:
    """utime + stime (+ cutime + cstime: reaped children) from a /proc/<pid>/stat line."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return sum(int(value) for value in fields[11 : 15 if children else 13])


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process on this host (a local PostgreSQL backend, say)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return _process_ticks(stat, children=False) / os.sysconf("SC_CLK_TCK")


def _database_ticks() -> int:
    """CPU ticks of every local PostgreSQL process, with what the postmaster reaped: a
    backend that ends within the window is counted through its parent."""
    total = 0
    for path in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = path.read_text()
        except OSError:
            continue
        if stat[stat.index("(") + 1 : stat.rindex(")")] == "postgres":
            total += _process_ticks(stat, children=True)
    return total


def _parent_ticks() -> int:
    """The parent runs moto's S3 server and otherwise waits for us."""
    try:
        stat = Path(f"/proc/{os.getppid()}/stat").read_text()
    except OSError:
        return 0
    return _process_ticks(stat, children=False)


def _command_ticks(*words: str) -> int:
    """CPU ticks, with reaped children, of the processes whose command line holds every
    one of `words` (a server this benchmark started, found by its arguments)."""
    total = 0
    for path in Path("/proc").glob("[0-9]*"):
        try:
            command = (path / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if all(word in command for word in words):
                total += _process_ticks((path / "stat").read_text(), children=True)
        except (OSError, ValueError):
            continue
    return total


class HostSplit:
    """Where the host's CPU went while orchestrated runs were served: the Prefect server
    (found by `server_words` in its command line), every local PostgreSQL process, this
    process (moto's S3 server runs in it) and the rest, which is the workers and their flow
    runs (and, on a shared host, anybody else's work)."""

    cpu: dict[str, float]

    def __init__(self, *server_words: str) -> None:
        self._server_words = server_words

    def _ticks(self) -> tuple[int, int, int, float]:
        times = os.times()
        busy, _ = _host_cpu_ticks()
        server = _command_ticks(*self._server_words)
        return busy, server, _database_ticks(), times.user + times.system

    def __enter__(self) -> HostSplit:
        self._before = self._ticks()
        return self

    def __exit__(self, *exc: object) -> None:
        after, tick = self._ticks(), os.sysconf("SC_CLK_TCK")
        host, server, database = (
            (a - b) / tick for a, b in zip(after[:3], self._before[:3], strict=True)
        )
        this = after[3] - self._before[3]
        self.cpu = {
            "host": host,
            "prefect_server": server,
            "postgres": database,
            "moto_and_bench": this,
            "workers_and_runs": host - server - database - this,
        }


class Window:
    """Wall seconds of a measured part and the CPU it cost: this process (all threads), the
    local PostgreSQL processes, moto (the parent), and how busy the host's CPUs were (on a
    shared host that includes other people's work)."""

    seconds: float
    cpu: dict[str, float]
    host_busy: float

    def __enter__(self) -> Window:
        self._ticks = (_database_ticks(), _parent_ticks(), _host_cpu_ticks())
        self._times = os.times()
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._started
        times = os.times()
        database, parent, (busy, total) = _database_ticks(), _parent_ticks(), _host_cpu_ticks()
        tick = os.sysconf("SC_CLK_TCK")
        self.cpu = {
            "client": times.user + times.system - self._times.user - self._times.system,
            "database": (database - self._ticks[0]) / tick,
            "s3": (parent - self._ticks[1]) / tick,
        }
        self.host_busy = (busy - self._ticks[2][0]) / max(1, total - self._ticks[2][1])

    def measurement(self, label: str, rows: int, **details: Any) -> Measurement:
        details = {
            "cpu_seconds": {name: round(value, 2) for name, value in self.cpu.items()},
            "host_cpu_busy": round(self.host_busy, 3),
            **details,
        }
        return Measurement(label, rows, self.seconds, peak_rss_mb(), details)


@dataclass
class Measurement:
    """One measured part: rows loaded, wall seconds, the process's peak RSS."""

    label: str
    rows: int
    seconds: float
    peak_rss_mb: float
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds

    def emit(self) -> None:
        """Hand the measurement to the parent on stdout (the child's only stdout line)."""
        print(RESULT_PREFIX + json.dumps(asdict(self)), flush=True)


def run_child(argv: list[str], timeout: float) -> Measurement:
    """Run `python <argv>` from the repository root; its stderr goes to ours (progress)."""
    child = subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        timeout=timeout,
        check=False,
    )
    results = [line for line in child.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if child.returncode != 0 or not results:
        raise RuntimeError(f"child {argv} failed ({child.returncode}): {child.stdout[-2000:]}")
    return Measurement(**json.loads(results[-1][len(RESULT_PREFIX) :]))


def prefetch(produce: Callable[[], Iterable[T]], depth: int) -> Iterator[T]:
    """The items of `produce()`, computed on a helper thread up to `depth` ahead, so that
    producing (download, encode: mostly GIL-free) overlaps consuming (COPY writes)."""
    items: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=_PREFETCH_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in produce():
                if not put(item):
                    return
            put(done)
        except BaseException as exc:  # handed to the consumer, which raises it
            put(_Raised(exc))

    thread = threading.Thread(target=run, name=f"prefetch-{uuid.uuid4().hex[:6]}", daemon=True)
    thread.start()
    try:
        while (item := items.get()) is not done:
            if isinstance(item, _Raised):
                raise item.exc
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        thread.join()


@dataclass(frozen=True)
class _Raised:
    exc: BaseException


def prefect_server(root: Path) -> AbstractContextManager[Any]:
    """tests.prefect_server's private `prefect server start` (own port, home and SQLite file,
    its process group stopped afterwards); yields its PrefectServer (api_url, env())."""
    progress("starting a prefect server")
    return _tests_module("prefect_server").prefect_server(root)


def prefect_server_on_postgres(
    stack: ExitStack, root: Path, admin_url: str, **server_env: str
) -> tuple[Any, str]:
    """A private `prefect server` on a fresh PostgreSQL database of `admin_url`'s server
    (SQLite locks under many runs), both gone when `stack` closes: (its PrefectServer, the
    database's URL)."""
    tools, servers = pgtools(), _tests_module("prefect_server")
    name = tools.unique_name("bench_prefect")
    url = tools.create_database(admin_url, name)
    stack.callback(tools.drop_database, admin_url, name)
    progress("starting the Prefect server (PostgreSQL: its migrations first)")
    server = stack.enter_context(
        servers.prefect_server(
            root / "prefect",
            PREFECT_SERVER_DATABASE_CONNECTION_URL=servers.asyncpg_url(url),
            **server_env,
        )
    )
    return server, url


def core_context(spec: dict[str, Any]) -> Any:
    """The core's ImportContext for a benchmark child: no Prefect, no publication steps,
    the spec's database (also the warehouse), S3 endpoint, staging URI and workdir."""
    from fleet_import.contracts.files import contracts_in_force
    from fleet_import.importing.context import ImportContext
    from fleet_import.s3.client import s3_client
    from fleet_import.s3.staging import StagingArea
    from fleet_import.store.repository import BatchRepository
    from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse

    s3 = s3_client(spec["endpoint"])
    return ImportContext(
        repo=BatchRepository(spec["database_url"]),
        warehouse=PostgresWarehouse(spec["database_url"]),
        s3=s3,
        staging=StagingArea(spec["staging_uri"], s3),
        contracts=contracts_in_force(),
        lease_ttl=120.0,
        workdir=Path(spec["workdir"]),
    )
