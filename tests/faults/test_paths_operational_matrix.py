"""The operational database's fault cells through the import flow (its own cells,
FLOW_CELLS) and through `fleet-import run` (one cell per fault kind): tests/faults/paths.py
says what is checked."""

from __future__ import annotations

from typing import Any

import pytest

from tests.faults.paths import cells, run_cell
from tests.faults.proxy import FaultProxy
from tests.reliability.conftest import Source

pytestmark = [pytest.mark.faults, pytest.mark.slow]


@pytest.mark.parametrize(("path", "phase", "fault"), cells("operational"))
def test_an_operational_database_fault_is_reported_truly_through_the_flow_and_the_cli(
    path: str,
    phase: str,
    fault: str,
    cli_env: dict[str, str],
    warehouse_proxy: FaultProxy,
    warehouse: Any,
    source: Source,
    database_url: str,
    moto_endpoint: str,
    staging_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    run_cell(
        path,
        "operational",
        phase,
        fault,
        proxy=warehouse_proxy,  # one upstream server: only the operational database goes through it
        cli_env=cli_env,
        source=source,
        database_url=database_url,
        moto_endpoint=moto_endpoint,
        staging_bucket=staging_bucket,
        monkeypatch=monkeypatch,
        tmp_path=tmp_path,
    )
