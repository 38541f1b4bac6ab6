"""A burst of deliveries through the relay and the S3 trigger (issue 50, item 4): N
`_SUCCESS` markers put within a minute, each notification relayed to Prefect as an event,
each event's trigger creating an `import-s3-folder` run. Measured: whether every marker
became exactly one flow run, how long that took, and whether the server ever answered 429.

A private `prefect server` on PostgreSQL (its access log counts the statuses), the
deployments from prefect.yaml with their trigger (schedules paused), moto's S3 and SQS in
this process with the landing bucket's notifications on a queue, `fleet-import relay` as a
process of its own. No worker runs the imports: this measures intake, not loading
(`fleet_scale.py` measures that).

    .venv/bin/python benchmarks/burst_arrivals.py [--folders 500]

The last line is exactly
`burst folders=N put_seconds=P seconds_to_runs=S runs=R events=E http_429=K`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _harness

RUNS_TIMEOUT_SECONDS = 900.0
_STATUS_429 = re.compile(rb'" 429')


def _runs(deployment_id: object) -> int:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        return client.count_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
        )


def _events(prefect_url: str) -> int:
    import psycopg

    with psycopg.connect(prefect_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM events WHERE event = 'aws.s3.object.created'"
        ).fetchone()
    return int(row[0]) if row else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folders", type=int, default=500)
    parser.add_argument("--database-url", default=None, help="PostgreSQL server (admin URL)")
    args = parser.parse_args(argv)

    import boto3
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from benchmarks.fleet_scale import _pause_schedules

    pgtools = _harness.pgtools()
    cluster = _harness._tests_module("workers.cluster")
    admin_url = args.database_url or pgtools.server_url()
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="burst-")))
        database_url = stack.enter_context(_harness.fresh_database(admin_url))
        endpoint = stack.enter_context(_harness.moto_s3())
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket=cluster.LANDING_BUCKET)
        s3.create_bucket(Bucket="burst-staging")
        queue_url = cluster.notify_queue(s3, sqs, cluster.LANDING_BUCKET, "burst-arrivals")
        server, prefect_url = _harness.prefect_server_on_postgres(
            stack, root, admin_url, PREFECT_SERVER_LOGGING_LEVEL="INFO"
        )
        env = cluster.flow_env(database_url, endpoint, "burst-staging")
        cluster.deploy(server, env)
        stack.enter_context(temporary_settings(updates={PREFECT_API_URL: server.api_url}))
        _pause_schedules()
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("import-s3-folder/import-s3-folder")
        logs = root / "logs"
        logs.mkdir()
        stack.enter_context(cluster.relay(server, queue_url, endpoint, logs))
        time.sleep(5)  # the relay's first receive
        access_log = root / "prefect" / "server.log"
        first_429 = len(_STATUS_429.findall(access_log.read_bytes()))
        events_before = _events(prefect_url)
        _harness.progress(f"putting {args.folders} markers")
        started = time.monotonic()
        for index in range(args.folders):
            tenant = f"b{index % 100:03d}"
            date = dt.date(2026, 7, 1) + dt.timedelta(days=index // 100)
            key = f"{tenant}/fleet/{date.isoformat()}/_SUCCESS"
            s3.put_object(Bucket=cluster.LANDING_BUCKET, Key=key, Body=b"")
        put_seconds = time.monotonic() - started
        _harness.progress(f"put in {put_seconds:.1f} s; waiting for the runs")
        deadline = started + RUNS_TIMEOUT_SECONDS
        runs = 0
        while runs < args.folders and time.monotonic() < deadline:
            time.sleep(1)
            runs = _runs(deployment.id)
        seconds = time.monotonic() - started
        time.sleep(10)  # a duplicate run would show up late
        runs = _runs(deployment.id)
        events = _events(prefect_url) - events_before
        throttled = len(_STATUS_429.findall(access_log.read_bytes())) - first_429
    print(
        f"burst folders={args.folders} put_seconds={put_seconds:.1f} "
        f"seconds_to_runs={seconds:.1f} runs={runs} events={events} http_429={throttled}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
