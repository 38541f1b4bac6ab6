"""A flow run killed with its worker is marked Crashed by Prefect's zombie detection (issue
46), against a real `prefect server`, the deployments applied from prefect.yaml and a real
`fleet-import worker`.

A run whose process dies while its worker lives is reported Crashed by the worker
(tests/workers/test_run_server.py). When the worker dies too (SIGKILL, a lost machine),
nothing reports it and, before, the run stayed Running for ever. Now its heartbeats (every
30 s: prefect.yaml's job variables) stop, and the automation blocks.register creates
(`--zombie-after 60`, the least it takes) marks it Crashed. The next delivery of the folder
takes its batch over once its lease (5 s) expires, and completes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from blocks.zombies import CRASHED_MESSAGE, HEARTBEAT_EVENT, MIN_ZOMBIE_AFTER_SECONDS
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import source_scope
from tests.prefect_server import asyncpg_url, prefect_server
from tests.workers.cluster import deploy, flow_env, kill_worker, wait_for, worker

pytestmark = [pytest.mark.workers, pytest.mark.slow, pytest.mark.timeout(900)]
pytest.importorskip("psutil", reason="the workers extra (distributed) brings it")

DELIVERY = {"trips": 6, "fuel": 4, "vehicles": 3}
LANDING = "fleet-landing-zombies"
_RUN_SECONDS = 120.0
# The automation's window after the last heartbeat, and its periodic evaluation, with room
# for a busy host: a bound, not the expected time.
_CRASHED_SECONDS = MIN_ZOMBIE_AFTER_SECONDS + 120.0


@pytest.fixture
def cluster(
    tmp_path: Path, pg_server_url: str, database_url: str, warehouse: Any, moto_endpoint: str,
    s3: Any, staging_bucket: str,
) -> Iterator[dict[str, Any]]:  # fmt: skip
    from tests import pgtools

    s3.create_bucket(Bucket=LANDING)
    prefect_db = pgtools.unique_name("prefect")
    prefect_url = pgtools.create_database(pg_server_url, prefect_db)
    env = flow_env(database_url, moto_endpoint, staging_bucket)
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        with prefect_server(
            tmp_path / "prefect", PREFECT_SERVER_DATABASE_CONNECTION_URL=asyncpg_url(prefect_url)
        ) as server:
            deploy(server, env, ["--zombie-after", str(MIN_ZOMBIE_AFTER_SECONDS)])
            from prefect.settings import PREFECT_API_URL, temporary_settings

            with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
                yield {"server": server, "env": env, "logs": logs, "s3": s3,
                       "database_url": database_url}  # fmt: skip
    finally:
        pgtools.drop_database(pg_server_url, prefect_db)


def _start(cluster: dict[str, Any], tenant: str) -> tuple[Any, str]:
    """A tiny delivery of `tenant` put in S3 and its import started through the deployment:
    (flow run id, scope)."""
    from prefect.deployments import run_deployment

    folder = today_folder(LANDING, tenant)
    prefix = folder.removeprefix(f"s3://{LANDING}/")
    for name, body in fleet_delivery(**DELIVERY).items():
        cluster["s3"].put_object(Bucket=LANDING, Key=prefix + name, Body=body)
    run = run_deployment(
        "import-s3-folder/import-s3-folder",
        parameters={"tenant_id": tenant, "folder": folder},
        timeout=0,
    )
    return run.id, source_scope(folder)


def _state(run_id: Any) -> Any:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).state


def _heartbeats(run_id: Any) -> list[Any]:
    """The heartbeat events the server holds for the run."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    event_filter = EventFilter(
        event=EventNameFilter(name=[HEARTBEAT_EVENT]),
        resource=EventResourceFilter(id=[f"prefect.flow-run.{run_id}"]),
    )
    with get_client(sync_client=True) as client:
        return client.read_events(filter=event_filter, limit=10).events


def _statuses(database_url: str, scope: str) -> list[str]:
    with psycopg.connect(database_url) as conn:
        return [
            status
            for (status,) in conn.execute(
                "SELECT status FROM ingestion_batches WHERE source_scope = %s ORDER BY created_at",
                (scope,),
            )
        ]


def _phase(database_url: str, scope: str) -> str | None:
    """The phase of the scope's running batch: `normalised` once it waits at the failpoint
    before the warehouse commit."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT details->>'phase' FROM ingestion_batches "
            "WHERE source_scope = %s AND status = 'running'",
            (scope,),
        ).fetchone()
    return row[0] if row else None


def _log_tails(logs: Path, lines: int = 30) -> str:
    return "\n".join(
        f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        for log in sorted(logs.glob("*.log"))
    )


def test_a_run_killed_with_its_worker_is_marked_crashed(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    held = tmp_path / "never-released"  # the failpoint waits at most a minute for it
    env = {**cluster["env"], "FLEET_FAILPOINTS": f"before_warehouse_commit=wait:{held}"}
    with worker(cluster["server"], "doomed", env, cluster["logs"], limit=1) as doomed:
        run_id, scope = _start(cluster, "zombie")
        wait_for(lambda: _phase(cluster["database_url"], scope) == "normalised", 120, "the stall")
        # The run heartbeats (the deployment's job variables ask it to) before it dies.
        wait_for(lambda: _heartbeats(run_id), 60, "a heartbeat of the run")
        killed = kill_worker(doomed)
        died = time.monotonic()
        assert killed, "the worker had no flow-run process to kill"
        assert not os.path.exists(held)
    assert _state(run_id).name == "Running"  # nobody is left to report it

    try:
        wait_for(lambda: _state(run_id).name == "Crashed", _CRASHED_SECONDS, "Crashed", poll=2)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: still {_state(run_id).name}") from None
    print(f"the killed run was marked Crashed {time.monotonic() - died:.0f}s after its death")
    assert _state(run_id).message == CRASHED_MESSAGE  # the automation, not a worker

    # Its batch is still running until the next delivery takes it over (lease: 5 s).
    assert _statuses(cluster["database_url"], scope) == ["running"]
    with worker(cluster["server"], "after", cluster["env"], cluster["logs"], limit=1):
        again, _ = _start(cluster, "zombie")
        try:
            wait_for(lambda: _state(again).is_final(), _RUN_SECONDS, "the next delivery")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{_log_tails(cluster['logs'])}") from None
    assert _state(again).name == "Completed", _state(again)
    statuses = _statuses(cluster["database_url"], scope)
    assert statuses.count("succeeded") == 1 and "running" not in statuses, statuses
