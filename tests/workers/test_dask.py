"""A 12-file delivery normalized on a dask.distributed LocalCluster of two worker processes
(issue 16, items 3 and 5): the tasks run in the Dask workers, their Parquet reaches the
flow only through the S3 staging area, and the slice is row for row the slice the default
thread pool loads from the same files."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest

from fleet_import.contracts.fleet import FUEL_TRANSACTIONS
from fleet_import.sample_data import (
    csv_bytes,
    fuel_table,
    parquet_bytes,
    today_folder,
    trips_csv_files,
    vehicles_table,
)
from flows.import_s3_folder import import_s3_folder
from tests.helpers import upload

pytestmark = [pytest.mark.workers, pytest.mark.slow]

distributed = pytest.importorskip("distributed", reason="the workers extra")
pytest.importorskip("prefect_dask", reason="the workers extra")

_TABLES = ("fleet_vehicles", "fleet_trips", "fleet_fuel_transactions")
_TRIP_FILES = 10  # + vehicles.csv + fuel_transactions.parquet = 12 files


def _delivery() -> dict[str, bytes]:
    files = dict(trips_csv_files(2_000, _TRIP_FILES))
    files["vehicles.csv"] = csv_bytes(vehicles_table(20))
    files["fuel_transactions.parquet"] = parquet_bytes(fuel_table(300), FUEL_TRANSACTIONS)
    assert len(files) == 12
    return files


@pytest.fixture
def dask_cluster(prefect_api) -> Iterator[distributed.LocalCluster]:
    """Two worker processes, one thread each; they reach the test's Prefect API and moto
    through the environment they are spawned with."""
    from prefect.settings import PREFECT_API_URL

    env = {"PREFECT_API_URL": PREFECT_API_URL.value()}
    env.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")})
    with distributed.LocalCluster(
        n_workers=2,
        processes=True,
        threads_per_worker=1,
        dashboard_address=None,
        env=env,
    ) as cluster:
        yield cluster


def _rows(database_url: str, table: str, tenant: str) -> list[tuple]:
    """The slice's rows without what names the tenant, scope and batch."""
    with psycopg.connect(database_url) as conn:
        columns = [
            name
            for (name,) in conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = 'curated' AND table_name = %s ORDER BY ordinal_position",
                (table,),
            )
            if name not in {"tenant_id", "source_scope", "ingestion_batch_id"}
        ]
        listed = ", ".join(f'"{name}"' for name in columns)
        return conn.execute(
            f"SELECT {listed} FROM curated.{table} WHERE tenant_id = %s ORDER BY 1",
            (tenant,),
        ).fetchall()


def test_a_delivery_normalized_on_dask_loads_the_same_slice(
    flow_env: str, s3, landing_bucket: str, dask_cluster, monkeypatch
) -> None:
    files = _delivery()
    on_dask = today_folder(landing_bucket, "dask")
    on_threads = today_folder(landing_bucket, "threads")
    upload(s3, on_dask, files)
    upload(s3, on_threads, files)

    state = import_s3_folder(tenant_id="threads", folder=on_threads, return_state=True)
    assert state.is_completed(), state.message
    monkeypatch.setenv("FLEET_DASK_ADDRESS", dask_cluster.scheduler_address)
    state = import_s3_folder(tenant_id="dask", folder=on_dask, force=True, return_state=True)
    assert state.is_completed(), state.message

    for table in _TABLES:
        expected = _rows(flow_env, table, "threads")
        assert expected, table
        assert _rows(flow_env, table, "dask") == expected, table
    with distributed.Client(dask_cluster) as client:
        made = client.run(_remote_contexts_here)
    # Each worker process that normalized a file built one context for the run's settings
    # and kept none of its Parquet files: the flow read them from the staging area.
    assert sum(count for count, _ in made.values()) >= 1, made
    assert all(left == 0 for _, left in made.values()), made


def _remote_contexts_here() -> tuple[int, int]:
    """(contexts built in this Dask worker, Parquet files left in their scratch dirs)."""
    from fleet_import.importing import runtime

    contexts = list(runtime._REMOTE_CONTEXTS.values())
    left = sum(len(list(ctx.workdir.rglob("*.parquet"))) for ctx in contexts)
    return len(contexts), left
