"""The trim-operational-state flow under Prefect's test harness (issue 50)."""

from __future__ import annotations

import pytest

from fleet_import.sample_data import fleet_delivery, today_folder
from flows.import_s3_folder import import_s3_folder
from flows.trim_operational_state import trim_operational_state
from tests.helpers import upload

pytestmark = pytest.mark.slow


def test_trim_runs_with_its_setting_and_says_what_it_did(
    flow_env: str, s3, landing_bucket: str, monkeypatch
) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=10))
    assert import_s3_folder(tenant_id="acme", folder=folder, return_state=True).is_completed()

    monkeypatch.setenv("FLEET_STATE_RETAIN_DAYS", "30")  # the batch ended just now: kept
    kept = trim_operational_state(return_state=True)
    assert kept.is_completed(), kept.message
    assert kept.result() == {"outbox_rows": 0, "lineage_rows": 0, "compacted_batches": 0}

    trimmed = trim_operational_state(older_than_days=0, return_state=True).result()
    assert trimmed["outbox_rows"] > 0  # a tiny delivery's details are too small to compact
