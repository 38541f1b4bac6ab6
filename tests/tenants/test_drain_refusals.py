"""The drain applies the tenant registry: a committed batch of a tenant that is now disabled,
unknown, or whose folder no longer binds publishes nothing; it ends failed_publication with
the refusal (counted, told), its slice as committed, and is recovered by re-enabling the
tenant and resuming the batch, or by purging the tenant."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fleet_import.config import Settings
from fleet_import.intake.admission import admission
from fleet_import.publication.refusal import refusal_of
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import source_scope
from fleet_import.store.details import FailureKind
from fleet_import.store.models import BatchStatus
from fleet_import.store.purges import TenantPurges
from fleet_import.store.repository import BatchRepository
from fleet_import.tenants.binding import DELIVERY_REFUSED_EVENT
from tests.helpers import slice_rows, upload
from tests.prefect_reads import batch_events

FOLDER = "s3://fleet-landing/globex/fleet/2026-07-22/"
_RUN_IN_CHILD = """
import sys
from flows.import_s3_folder import import_s3_folder
state = import_s3_folder(tenant_id=sys.argv[1], folder=sys.argv[2], return_state=True)
print(f"STATE {state.name}: {state.message}", flush=True)
"""


def _batch(tenant_id: str = "globex", folder: str = FOLDER) -> Any:
    return SimpleNamespace(tenant_id=tenant_id, source_scope=source_scope(folder))


@pytest.mark.parametrize(
    ("registry", "kind"),
    [
        ("tenants:\n  acme: {}\n  globex:\n    enabled: false\n", "disabled_tenant"),
        ("tenants:\n  acme: {}\n", "unknown_tenant"),
        # acme's own prefix now covers the folder: it no longer binds to globex
        (
            "tenants:\n  acme:\n    landing_prefixes: s3://fleet-landing/globex/\n  globex: {}\n",
            "other_tenant",
        ),
    ],
)
def test_a_batch_s_tenant_is_judged_by_the_registry_in_force(
    tmp_path: Path, registry: str, kind: str
) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  acme: {}\n  globex: {}\n")
    admit = admission(Settings(tenants=str(path)))
    assert refusal_of(_batch(), admit) is None
    path.write_text(registry)  # read again on every call: no restart needed
    refusal = refusal_of(_batch(), admit)
    assert refusal is not None and refusal.kind == kind, refusal
    assert "'globex'" in refusal.reason
    assert refusal_of(_batch(), None) is None  # no admission given: no rule applied


def _events_of(batch_id: Any, name: str) -> list[Any]:
    return batch_events(batch_id, 1, name)


@pytest.mark.slow
@pytest.mark.crash  # the import dies at its failpoint: make test-crash
@pytest.mark.parametrize(
    "failpoint",
    [
        "after_operational_commit",  # committed and recorded: the drain's outbox part
        "after_warehouse_commit",  # committed, not recorded: the drain's takeover part
    ],
)
def test_the_drain_refuses_a_disabled_tenant_s_committed_batch(
    flow_env: str, s3, landing_bucket: str, tmp_path: Path, monkeypatch, failpoint: str
) -> None:
    from prefect.settings import PREFECT_API_URL

    from flows.drain_publications import drain_publications
    from flows.resume_publication import resume_publication

    registry = tmp_path / "tenants.yaml"
    registry.write_text("tenants:\n  acme: {}\n  globex: {}\n")
    monkeypatch.setenv("FLEET_TENANTS", str(registry))
    folder = today_folder(landing_bucket, "globex")
    upload(s3, folder, fleet_delivery(trips=20))
    died = subprocess.run(  # the import dies right after its commit was recorded
        [sys.executable, "-c", _RUN_IN_CHILD, "globex", folder],
        env={
            **os.environ,
            "PREFECT_API_URL": PREFECT_API_URL.value(),
            "FLEET_FAILPOINTS": failpoint,
            "FLEET_LEASE_TTL_SECONDS": "1",
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert died.returncode == 86, died.stdout + died.stderr[-2000:]
    repo = BatchRepository(flow_env)
    (batch,) = repo.list()
    assert batch.status == BatchStatus.RUNNING
    assert batch.details["warehouse_committed"] is (failpoint == "after_operational_commit")
    committed = slice_rows(flow_env, "fleet_trips", "globex", folder)
    assert committed == [(batch.id, 20)]
    registry.write_text("tenants:\n  acme: {}\n  globex:\n    enabled: false\n")
    time.sleep(1.5)  # the dead import's lease expires

    state = drain_publications(limit=10, return_state=True)
    assert state.is_completed() and state.result() == {"PublicationRefused": 1}, state.result()
    refused = repo.get(batch.id)
    assert refused.status == BatchStatus.FAILED
    failure = refused.details["failure"]
    assert failure["kind"] == FailureKind.FAILED_PUBLICATION
    assert refused.details["warehouse_committed"] is True  # recorded, as it is true
    assert failure["refused"] == "disabled_tenant" and "disabled" in failure["error"]
    assert f"resume batch {batch.id}" in failure["error"]
    assert slice_rows(flow_env, "fleet_trips", "globex", folder) == committed  # as committed
    (event,) = _events_of(batch.id, DELIVERY_REFUSED_EVENT)
    assert event.payload["source"] == "drain-publications"
    assert event.payload["kind"] == "disabled_tenant"
    assert event.resource["fleet.tenant"] == "globex"
    # Not refused again by every drain, and it no longer blocks the tenant's purge.
    assert drain_publications(limit=10, return_state=True).result() == {}
    assert TenantPurges(flow_env).running_batches("globex") == []
    # While disabled, a resume is refused too; once enabled again, it publishes the batch.
    still = resume_publication(batch_id=str(batch.id), return_state=True)
    assert still.name == "Refused", still.message
    registry.write_text("tenants:\n  acme: {}\n  globex: {}\n")
    resumed = resume_publication(batch_id=str(batch.id), return_state=True)
    assert resumed.name == "Completed", resumed.message
    assert repo.get(batch.id).status == BatchStatus.SUCCEEDED
    assert slice_rows(flow_env, "fleet_trips", "globex", folder) == committed
