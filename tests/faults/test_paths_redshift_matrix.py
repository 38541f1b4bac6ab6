"""The warehouse fault matrix on Redshift (the emulator as a provisioned cluster at
SERIALIZABLE, logged in as the least-privilege loader, as the runtime's Redshift cells run)
through the import flow (its own cells, FLOW_CELLS) and through `fleet-import run` (one
cell per fault kind): the flow and the CLI read FLEET_WAREHOUSE=redshift and
FLEET_REDSHIFT_* pointing at the fault proxy in front of the emulator, the recovery runtime
reaches the emulator directly. tests/faults/paths.py says what is checked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fleet_import.contracts.fleet import FLEET_DATASETS
from fleet_import.warehouse.redshift.warehouse import RedshiftWarehouse
from tests.faults.paths import WarehouseBackend, cells, run_cell
from tests.faults.proxy import FaultProxy
from tests.faults.test_warehouse_matrix import REDSHIFT_PHASES, ROLE
from tests.redshift_emulator import SETUPS, RedshiftEmulator
from tests.redshift_grants import give
from tests.reliability.conftest import REFRESH_TABLE, Source, connect

pytestmark = [pytest.mark.faults, pytest.mark.slow]

PASSWORD = "unused-trust-auth"
SETTING = "FLEET_REDSHIFT_HOST"
"""What a message naming settings must name (and an exit 1 with no failed batch): where this
Redshift is set, FLEET_WAREHOUSE_URL being unset."""


@pytest.fixture
def warehouse(emulator: RedshiftEmulator, staging_bucket: str, s3: Any) -> Iterator[Any]:
    """The curated tables made by the loader on the emulator (so it owns them, as the grants
    in docs/redshift.md say), instead of the PostgreSQL tables flow_env's default `warehouse`
    creates in the same database."""
    warehouse = RedshiftWarehouse(
        emulator.connect_kwargs(password=PASSWORD),
        s3=s3,
        staging_uri=f"s3://{staging_bucket}/redshift/",
        iam_role=ROLE,
    )
    warehouse.ensure_tables(FLEET_DATASETS.values())
    yield warehouse


def _backend(emulator: RedshiftEmulator, proxy: FaultProxy, staging_bucket: str) -> Any:
    staging_uri = f"s3://{staging_bucket}/redshift/"
    env = {
        "FLEET_WAREHOUSE": "redshift",
        "FLEET_REDSHIFT_HOST": "127.0.0.1",
        "FLEET_REDSHIFT_PORT": str(proxy.port),
        "FLEET_REDSHIFT_DATABASE": emulator.database,
        "FLEET_REDSHIFT_USER": emulator.user,
        "FLEET_REDSHIFT_PASSWORD": PASSWORD,
        "FLEET_REDSHIFT_SSL": "false",
        "FLEET_REDSHIFT_IAM_ROLE": ROLE,
        "FLEET_REDSHIFT_STAGING_URI": staging_uri,
    }
    recovery = {
        "warehouse": "redshift",
        "warehouse_url": None,
        "redshift_host": "127.0.0.1",
        "redshift_port": emulator.port,  # past the proxy: recovery is not under test
        "redshift_database": emulator.database,
        "redshift_user": emulator.user,
        "redshift_password": PASSWORD,
        "redshift_ssl": False,
        "redshift_iam_role": ROLE,
        "redshift_staging_uri": staging_uri,
    }
    return WarehouseBackend(env, recovery, SETTING, REDSHIFT_PHASES)


@pytest.mark.parametrize("emulator", [SETUPS[0]], ids=["-".join(SETUPS[0])], indirect=True)
@pytest.mark.parametrize(("path", "phase", "fault"), cells("warehouse"))
def test_a_redshift_fault_is_reported_truly_through_the_flow_and_the_cli(
    path: str,
    phase: str,
    fault: str,
    emulator: RedshiftEmulator,
    redshift_proxy: FaultProxy,
    cli_env: dict[str, str],
    source: Source,
    database_url: str,
    moto_endpoint: str,
    staging_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    with connect(database_url) as conn:  # the refresh statement runs as the loading user
        give(conn, emulator.user, REFRESH_TABLE)
    run_cell(
        path,
        "warehouse",
        phase,
        fault,
        proxy=redshift_proxy,
        cli_env=cli_env,
        source=source,
        database_url=database_url,
        moto_endpoint=moto_endpoint,
        staging_bucket=staging_bucket,
        monkeypatch=monkeypatch,
        tmp_path=tmp_path,
        backend=_backend(emulator, redshift_proxy, staging_bucket),
    )
