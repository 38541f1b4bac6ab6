"""`fleet-import worker`'s run server (issue 30): flow runs forked from a process that has
Prefect and the flows imported, against a real `prefect server` and the deployments applied
from prefect.yaml.

- A run is forked (no engine started from scratch) and succeeds; killing the process the
  worker started for it (SIGKILL, as a cancellation or a dying worker would) kills the
  forked run at once, the worker reports it Crashed, and the next delivery of the folder
  takes the batch over after its lease: loaded once, nothing left running.
- The run server killed: the worker starts it again.
- A project file changed in the checkout after the server imported it: that run is not
  forked from old code (its client starts the engine from the files) and the server starts
  itself again, so the next run is forked from the new code.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import source_scope
from tests.prefect_server import REPO, asyncpg_url, prefect_server
from tests.workers.cluster import deploy, flow_env, wait_for, worker

pytestmark = [pytest.mark.workers, pytest.mark.slow, pytest.mark.timeout(600)]
psutil = pytest.importorskip("psutil", reason="the workers extra (distributed) brings it")

DELIVERY = {"trips": 6, "fuel": 4, "vehicles": 3}
FALLBACK = "starting Prefect's engine directly"
_RUN_SECONDS = 120.0


@pytest.fixture
def cluster(
    tmp_path: Path, pg_server_url: str, database_url: str, warehouse: Any, moto_endpoint: str,
    s3: Any, staging_bucket: str,
) -> Iterator[dict[str, Any]]:  # fmt: skip
    from tests import pgtools

    landing = "fleet-landing-runs"
    s3.create_bucket(Bucket=landing)
    prefect_db = pgtools.unique_name("prefect")
    prefect_url = pgtools.create_database(pg_server_url, prefect_db)
    env = flow_env(database_url, moto_endpoint, staging_bucket)
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        with prefect_server(
            tmp_path / "prefect", PREFECT_SERVER_DATABASE_CONNECTION_URL=asyncpg_url(prefect_url)
        ) as server:
            deploy(server, env)
            from prefect.settings import PREFECT_API_URL, temporary_settings

            with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
                yield {"server": server, "env": env, "logs": logs, "s3": s3,
                       "landing": landing, "database_url": database_url}  # fmt: skip
    finally:
        pgtools.drop_database(pg_server_url, prefect_db)


def _start(cluster: dict[str, Any], tenant: str) -> tuple[Any, str]:
    """A tiny delivery of `tenant` put in S3 and its import started: (flow run id, scope)."""
    from prefect.deployments import run_deployment

    folder = today_folder(cluster["landing"], tenant)
    prefix = folder.removeprefix(f"s3://{cluster['landing']}/")
    for name, body in fleet_delivery(**DELIVERY).items():
        cluster["s3"].put_object(Bucket=cluster["landing"], Key=prefix + name, Body=body)
    run = run_deployment(
        "import-s3-folder/import-s3-folder",
        parameters={"tenant_id": tenant, "folder": folder},
        timeout=0,
    )
    return run.id, source_scope(folder)


def _statuses(database_url: str, scope: str) -> list[str]:
    with psycopg.connect(database_url) as conn:
        return [
            status
            for (status,) in conn.execute(
                "SELECT status FROM ingestion_batches WHERE source_scope = %s ORDER BY created_at",
                (scope,),
            )
        ]


def _state(run_id: Any) -> str | None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).state_name


def _children(process: Any, module: str) -> list[Any]:
    """The live children of `process` running `python -m module` (a killed one, not yet
    reaped, is left out)."""
    found = []
    for child in psutil.Process(process.pid).children():
        try:
            if module in " ".join(child.cmdline()):
                found.append(child)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue
    return found


def _run_server(worker_process: Any) -> Any:
    """The worker's run server process, or None while there is none."""
    servers = _children(worker_process, "fleet_cli.run_server")
    assert len(servers) <= 1, servers
    return servers[0] if servers else None


def _log(cluster: dict[str, Any], name: str) -> str:
    return (cluster["logs"] / f"{name}.log").read_text(errors="replace")


def test_runs_are_forked_and_die_with_their_client(cluster: dict[str, Any], tmp_path) -> None:
    held = tmp_path / "never-released"  # the failpoint waits at most a minute for it
    env = {**cluster["env"], "FLEET_FAILPOINTS": f"before_warehouse_commit=wait:{held}"}
    with worker(cluster["server"], "forks", env, cluster["logs"], limit=1) as process:
        run_id, scope = _start(cluster, "forked")
        server = wait_for(lambda: _run_server(process), 60, "the run server")
        [forked] = wait_for(lambda: server.children(), _RUN_SECONDS, "a forked run")
        [client] = _children(process, "fleet_cli.run_client")
        wait_for(lambda: _statuses(cluster["database_url"], scope) == ["running"], 60, "a batch")
        os.kill(client.pid, signal.SIGKILL)
        gone, _ = psutil.wait_procs([forked], timeout=10)
        assert gone, "the forked run outlived the process the worker started for it"
        wait_for(lambda: _state(run_id) == "Crashed", 60, "the run reported Crashed")
        assert FALLBACK not in _log(cluster, "forks")
        assert "Warning" not in _log(cluster, "forks") and "Traceback" not in _log(cluster, "forks")
        # A run server that dies is started again by the worker.
        os.kill(server.pid, signal.SIGKILL)
        wait_for(lambda: (_run_server(process) or server).pid != server.pid, 30, "a new server")
        assert "the run server exited (-9); starting it again" in _log(cluster, "forks")

    # The batch the killed run held is taken over once its lease (5 s) expires.
    with worker(cluster["server"], "after", cluster["env"], cluster["logs"], limit=1):
        again, _ = _start(cluster, "forked")
        wait_for(lambda: _state(again) == "Completed", _RUN_SECONDS, "the rerun")
    statuses = _statuses(cluster["database_url"], scope)
    assert statuses.count("succeeded") == 1 and "running" not in statuses, statuses


def test_a_changed_checkout_is_never_run_from_old_code(cluster: dict[str, Any]) -> None:
    changed = REPO / "flows" / "common.py"
    before = changed.stat()
    with worker(cluster["server"], "stale", cluster["env"], cluster["logs"], limit=1) as process:
        first, _ = _start(cluster, "fresh")
        wait_for(lambda: _state(first) == "Completed", _RUN_SECONDS, "the first run")
        assert FALLBACK not in _log(cluster, "stale")
        served = _run_server(process).pid
        try:
            os.utime(changed, ns=(before.st_atime_ns, time.time_ns()))
            second, _ = _start(cluster, "changed")
            wait_for(lambda: _state(second) == "Completed", _RUN_SECONDS, "the run after")
            assert f"{changed} changed since the run server started" in _log(cluster, "stale")
            # The server started itself again (the same process, new code) and forks again.
            third, _ = _start(cluster, "after")
            wait_for(lambda: _state(third) == "Completed", _RUN_SECONDS, "the next run")
            assert _log(cluster, "stale").count(FALLBACK) == 1
            assert _run_server(process).pid == served
        finally:
            os.utime(changed, ns=(before.st_atime_ns, before.st_mtime_ns))
