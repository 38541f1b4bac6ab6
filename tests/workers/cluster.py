"""fleet-import as it runs in production, on one machine: a private Prefect server, the
deployments applied from prefect.yaml, process workers started as separate processes, and
the S3 event relay. Used by tests/workers/test_scale.py and benchmarks/workers_scale.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any

from tests.prefect_server import PREFECT, REPO, PrefectServer, output, run, stop_group
from tests.s3fixtures import notify_queue_of

WORK_POOL = "fleet-process-pool"
# The S3 trigger in prefect.yaml matches markers of this bucket only.
LANDING_BUCKET = "fleet-landing"
_WORKER_STOP_SECONDS = 10.0


class ClusterFailed(RuntimeError):
    """A command that sets the cluster up failed."""


def _check(result: subprocess.CompletedProcess[str], what: str) -> None:
    if result.returncode != 0:
        raise ClusterFailed(f"{what} failed:\n{output(result)}")


def deploy(
    server: PrefectServer, env: Mapping[str, str], register_options: Sequence[str] = ()
) -> None:
    """The documented sequence: the pool, blocks.register (limits, backfill queue, the
    zombie-run automation; `register_options` added), then `prefect deploy --all` from the
    repository."""
    environment = server.env(**env)
    _check(
        run([PREFECT, "work-pool", "create", WORK_POOL, "--type", "process"], environment),
        "work-pool create",
    )
    _check(
        run([sys.executable, "-m", "blocks.register", *register_options], environment),
        "blocks.register",
    )
    _check(run([PREFECT, "--no-prompt", "deploy", "--all"], environment), "prefect deploy")


def flow_env(database_url: str, moto_endpoint: str, staging_bucket: str, **extra: str) -> dict:
    """What every worker (and so every flow run) of the cluster reads: this test's database,
    S3 and a short lease, so that a killed worker's batch is free again within seconds."""
    return {
        "FLEET_DATABASE_URL": database_url,
        "FLEET_S3_ENDPOINT_URL": moto_endpoint,
        "FLEET_STAGING_URI": f"s3://{staging_bucket}/stage/",
        "FLEET_LEASE_TTL_SECONDS": "5",
        "FLEET_PROJECT_DIR": str(REPO),
        # A worker asks for scheduled runs every second (default 10).
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_WORKER_PREFETCH_SECONDS": "5",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        **extra,
    }


@contextmanager
def _spawned(
    argv: list[str], env: Mapping[str, str], log: Path, stop_timeout: float = _WORKER_STOP_SECONDS
) -> Iterator[subprocess.Popen[bytes]]:
    """A process in a group of its own, logging to `log`, run from `log`'s folder; the group
    stopped afterwards, and any child that outlived it killed."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=log.parent,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        stop_group(process, timeout=stop_timeout)
        for child in _children(process.pid):
            _kill(child)


def worker(
    server: PrefectServer,
    name: str,
    env: Mapping[str, str],
    log_dir: Path,
    limit: int = 2,
    stock: bool = False,
) -> AbstractContextManager[subprocess.Popen[bytes]]:
    """`fleet-import worker` (or, `stock`, Prefect's `prefect worker start`) as a process of
    its own (its own process group), at most `limit` flow runs at once."""
    if stock:
        argv = [PREFECT, "worker", "start", "--type", "process"]
    else:
        argv = [str(Path(PREFECT).with_name("fleet-import")), "worker"]
    argv += ["--pool", WORK_POOL, "--name", name, "--limit", str(limit)]
    return _spawned(argv, server.env(**env), log_dir / f"{name}.log")


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _kill(pid: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def kill_worker(process: subprocess.Popen[bytes]) -> list[int]:
    """SIGKILL a worker and every flow run it started, as if its machine died; returns the
    flow-run processes killed with it."""
    children = _children(process.pid)
    _kill(process.pid)
    for child in children:
        _kill(child)
    process.wait(timeout=_WORKER_STOP_SECONDS)
    return children


def relay(
    server: PrefectServer, queue_url: str, moto_endpoint: str, log_dir: Path
) -> AbstractContextManager[subprocess.Popen[bytes]]:
    """`fleet-import relay`: the landing bucket's S3 notifications (SQS) to Prefect events."""
    argv = [str(Path(PREFECT).with_name("fleet-import")), "relay", "--queue-url", queue_url]
    argv += ["--endpoint-url", moto_endpoint, "--wait-seconds", "1"]
    argv += ["--dead-letter-file", str(log_dir / "dead-letters.jsonl")]
    return _spawned(argv, server.env(), log_dir / "relay.log")


def notify_queue(s3: Any, sqs: Any, bucket: str, name: str) -> str:
    """An SQS queue receiving every ObjectCreated notification of `bucket`; its URL."""
    url = sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "5"})["QueueUrl"]
    notify_queue_of(s3, sqs, bucket, url)
    return url


def wait_for(predicate: Any, timeout: float, what: str, poll: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)
