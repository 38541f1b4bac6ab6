"""The dashboard's main panels drawn from real data: a real import, a held batch, a failed
publication, an expired lease and a late tenant in a real store, scraped by a real
Prometheus, graphed on its own graph page (Debian ships the classic one: no Grafana package
here) in Debian's Chromium. The screenshot goes to the test's directory, and to
FLEET_DASHBOARD_SCREENSHOT when set (how docs/images/fleet-metrics.png was made)."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import time
import urllib.parse
from pathlib import Path

import psycopg
import pytest

from fleet_import.importing.context import Committed
from fleet_import.importing.driver import import_folder
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant
from fleet_import.store.freshness_repository import FreshnessRepository, StoredVerdict
from tests.helpers import upload
from tests.monitoring.prometheus_tools import DASHBOARD, prometheus_stack, wait_for
from tests.monitoring.test_collector import _failed_publication, _held, _leased
from tests.ui.browser import CHROMIUM, chromium_executable, chromium_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOWN = (
    "Batches by status",
    "Oldest held batch, per tenant",
    "Rows published per dataset (per second, 5m)",
    "Freshness lag per tenant and dataset",
)
_HISTORY_SECONDS = 20.0  # a few scrapes a second apart, so the graphs have lines
_PAGE_TIMEOUT_MS = 30_000


def graph_url(prometheus_url: str) -> str:
    """The classic graph page with one graph per dashboard panel named in SHOWN."""
    panels = {p["title"]: p for p in json.loads(DASHBOARD.read_text())["panels"]}
    params: dict[str, str] = {}
    for n, title in enumerate(SHOWN):
        params[f"g{n}.expr"] = panels[title]["targets"][0]["expr"]
        params[f"g{n}.tab"] = "0"
        params[f"g{n}.range_input"] = "1m"
    return f"{prometheus_url}/classic/graph?{urllib.parse.urlencode(params)}"


def test_the_dashboard_panels_graphed_from_a_real_prometheus(
    repo, database_url: str, import_ctx, s3, landing_bucket: str, tmp_path: Path
) -> None:
    chromium_executable(CHROMIUM)  # skip (or fail, when required) before the setup
    acme, globex = Tenant.named("acme"), Tenant.named("globex")
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(bad_rows=True))
    assert isinstance(import_folder(import_ctx, acme, folder, "dashboard"), Committed)
    _held(repo, acme, "2026-07-20")
    held_long = _held(repo, globex, "2026-07-18")
    with psycopg.connect(database_url) as conn:  # held three hours ago
        conn.execute(
            "UPDATE ingestion_batches SET updated_at = now() - interval '3 hours' WHERE id = %s",
            (held_long,),
        )
    _failed_publication(repo, globex, "2026-07-21")
    _leased(repo, globex, "2026-07-19", "frozen", ttl=0.1)
    FreshnessRepository(database_url).remember(
        StoredVerdict(
            "globex", "trips", state="missing", late=True,
            expected_at=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=45),
            checked_at=dt.datetime.now(dt.UTC),
        ),
        lambda previous: True,
    )  # fmt: skip
    with prometheus_stack(database_url, tmp_path, ["acme", "globex"]) as stack:
        wait_for("rows", lambda: stack.query("fleet_import_rows_published_total"), stack.logs)
        time.sleep(_HISTORY_SECONDS / 2)
        # A second delivery while Prometheus watches: the counters and statuses move.
        later = today_folder(landing_bucket, "globex")
        upload(s3, later, fleet_delivery(trips=400))
        assert isinstance(import_folder(import_ctx, globex, later, "dashboard-2"), Committed)
        time.sleep(_HISTORY_SECONDS / 2)
        with chromium_page(_PAGE_TIMEOUT_MS) as page:
            page.goto(graph_url(stack.prometheus_url))
            page.wait_for_selector(".graph_area svg path.path", state="attached")
            page.wait_for_timeout(1000)  # the last graphs' lines
            # The navigation bar is fixed: it would cover a graph in a full-page shot.
            page.add_style_tag(content=".navbar { position: static !important; }")
            body = page.inner_text("body")
            shot = tmp_path / "fleet-metrics.png"
            page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    assert 'tenant="globex"' in body and 'dataset="trips"' in body, body[:3000]
    assert "Error" not in body, body[:3000]
    wanted = os.environ.get("FLEET_DASHBOARD_SCREENSHOT")
    if wanted:
        shutil.copy(shot, wanted)
