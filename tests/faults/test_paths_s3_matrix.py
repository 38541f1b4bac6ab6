"""The S3 fault cells (tests/faults/test_s3_matrix.py: discover, get, upload x reset,
stall, outage, black hole, throttle) through the import flow (its own cells, FLOW_CELLS)
and through `fleet-import run` (one cell per fault kind), FLEET_S3_ENDPOINT_URL pointing at the HTTP
fault proxy with the S3 cells' short limits: tests/faults/paths.py says what is checked.
A black hole also proves that the flow's task retries do not call S3 again on top of
botocore (`retried_above_botocore`)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.faults.paths import cells, run_cell
from tests.faults.proxy import FaultProxy
from tests.faults.test_s3_matrix import s3_proxy  # noqa: F401 (the fixture)
from tests.reliability.conftest import Source

pytestmark = [pytest.mark.faults, pytest.mark.slow]


@pytest.mark.parametrize(("path", "phase", "fault"), cells("s3"))
def test_an_s3_fault_is_reported_truly_through_the_flow_and_the_cli(
    path: str,
    phase: str,
    fault: str,
    cli_env: dict[str, str],
    s3_proxy: FaultProxy,  # noqa: F811
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
        "s3",
        phase,
        fault,
        proxy=s3_proxy,  # S3 alone goes through it; both databases are direct
        cli_env=cli_env,
        source=source,
        database_url=database_url,
        moto_endpoint=moto_endpoint,
        staging_bucket=staging_bucket,
        monkeypatch=monkeypatch,
        tmp_path=tmp_path,
    )
