"""The Prefect UI as an operator sees it, in headless Chromium: a real `prefect server`
with its UI, the deployments from prefect.yaml and a process worker run an import with
rejects and an import whose publication failed and was then resumed; the run pages and
their artifacts must show what happened. Screenshots land in the test's tmp dir.

Debian's `chromium`, driven by Playwright's Python package (`executable_path`; Playwright's
own browser download is never used). Without Chromium or Playwright the test is skipped,
unless FLEET_REQUIRE_BROWSER is set (as .ci/run does), when it fails (tests/ui/browser.py).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.store.repository import BatchRepository
from tests.helpers import upload
from tests.prefect_server import (
    PREFECT,
    REPO,
    PrefectServer,
    output,
    prefect_server,
    run,
    stop_group,
)
from tests.ui.browser import chromium_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

_RUN_TIMEOUT = 120.0
IMPORT = "import-s3-folder/import-s3-folder"
RESUME = "resume-publication/resume-publication"
FAILING = '["SELECT 1/0"]'  # FLEET_REFRESH_SQL that fails the publication
_PAGE_TIMEOUT_MS = 20_000


@pytest.fixture
def browser_page(tmp_path: Path) -> Iterator[Any]:
    with chromium_page(_PAGE_TIMEOUT_MS) as page:
        yield page


@pytest.fixture
def ui_server(tmp_path: Path) -> Iterator[PrefectServer]:
    # The UI asks its API at PREFECT_UI_API_URL (else 127.0.0.1:4200): relative, it is this
    # server's, whatever port it got.
    ui = {"PREFECT_UI_ENABLED": "true", "PREFECT_UI_API_URL": "/api"}
    with prefect_server(tmp_path / "prefect", **ui) as server:
        yield server


WORK_POOL = "fleet-process-pool"  # prefect.yaml's


def _flow_env(database_url: str, moto_endpoint: str, staging_bucket: str) -> dict[str, str]:
    """What the worker's flow runs read: this test's database and S3."""
    return {
        "FLEET_DATABASE_URL": database_url,
        "FLEET_S3_ENDPOINT_URL": moto_endpoint,
        "FLEET_STAGING_URI": f"s3://{staging_bucket}/stage/",
        "FLEET_PROJECT_DIR": str(REPO),
        "PREFECT_WORKER_QUERY_SECONDS": "1",  # default 10: runs start within a second
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }


@contextmanager
def _worker(server: PrefectServer, env: dict[str, str], log: Path) -> Iterator[None]:
    """`prefect worker start` on the pool, in its own process group."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", WORK_POOL, "--type", "process"],
            env=server.env(**env),
            cwd=log.parent,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield
    finally:
        stop_group(process)


def _deploy(server: PrefectServer, env: dict[str, str]) -> None:
    environment = server.env(**env)
    for args in (
        [PREFECT, "work-pool", "create", WORK_POOL, "--type", "process"],
        [PREFECT, "--no-prompt", "deploy", "--all"],
    ):
        result = run(args, environment)
        assert result.returncode == 0, output(result)


def _on_demand_only() -> None:
    """Pause the scheduled deployments (drain, sweep) and drop the runs they scheduled: the
    worker runs this test's imports and nothing else."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    with get_client(sync_client=True) as client:
        for deployment in client.read_deployments():
            if deployment.schedules:
                client.pause_deployment(deployment.id)
        scheduled = FlowRunFilter(
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))
        )
        for flow_run in client.read_flow_runs(flow_run_filter=scheduled):
            client.delete_flow_run(flow_run.id)


def _run_deployment(name: str, parameters: dict[str, Any], env: dict[str, str]) -> Any:
    """Run a deployment on the worker and return its finished flow run."""
    from prefect.deployments import run_deployment

    # _sync: Playwright's sync API runs an event loop, in which Prefect would hand back a
    # coroutine.
    return run_deployment(
        name,
        parameters=parameters,
        job_variables={"env": env},
        timeout=_RUN_TIMEOUT,
        _sync=True,  # type: ignore[call-arg]
    )


def _show(page: Any, url: str, texts: list[str], shot: Path, tab: str | None = None) -> str:
    """Open `url` (and its `tab`), wait until every text is rendered, screenshot, return
    the page's text."""
    page.goto(url)
    if tab:
        page.get_by_text(tab, exact=True).first.click()
    deadline = time.monotonic() + _PAGE_TIMEOUT_MS / 1000
    body = ""
    while time.monotonic() < deadline:
        body = page.inner_text("body")
        if all(text in body for text in texts):
            break
        time.sleep(0.25)
    page.screenshot(path=str(shot), full_page=True)
    missing = [text for text in texts if text not in body]
    assert not missing, f"{url} does not show {missing} (screenshot {shot}):\n{body[:3000]}"
    return body


def _artifact_id(flow_run_id: uuid.UUID, key: str) -> uuid.UUID:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
    )
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
                key=ArtifactFilterKey(any_=[key]),
            ),
            sort=ArtifactSort.CREATED_DESC,
        )
    assert artifacts, f"no {key} artifact on flow run {flow_run_id}"
    return artifacts[0].id


def test_run_pages_show_the_batch_story(
    tmp_path: Path,
    browser_page: Any,
    ui_server: PrefectServer,
    database_url: str,
    warehouse: Any,
    moto_endpoint: str,
    s3: Any,
    staging_bucket: str,
    landing_bucket: str,
) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    page, ui = browser_page, ui_server.api_url.removesuffix("/api")
    env = _flow_env(database_url, moto_endpoint, staging_bucket)
    _deploy(ui_server, env)
    rejected = today_folder(landing_bucket, "acme")
    upload(s3, rejected, fleet_delivery(trips=80, bad_rows=True))
    resumed = today_folder(landing_bucket, "globex")
    upload(s3, resumed, fleet_delivery(trips=40))
    repo = BatchRepository(database_url)
    with temporary_settings(updates={PREFECT_API_URL: ui_server.api_url}):
        _on_demand_only()
        with _worker(ui_server, env, tmp_path / "worker.log"):
            first = _run_deployment(IMPORT, {"tenant_id": "acme", "folder": rejected}, {})
            assert first.state.is_completed(), first.state
            second = _run_deployment(
                IMPORT, {"tenant_id": "globex", "folder": resumed}, {"FLEET_REFRESH_SQL": FAILING}
            )
            assert second.state.is_failed(), second.state
            (failed,) = repo.list(tenant="globex")
            resume = _run_deployment(RESUME, {"batch_id": str(failed.id)}, {})
            assert resume.state.is_completed(), resume.state
        # A business failure in the worker's log is its Failed line, not a crash's traceback.
        worker_log = (tmp_path / "worker.log").read_text()
        assert "Traceback" not in worker_log and "unexpected exception" not in worker_log

        (loaded,) = repo.list(tenant="acme")
        files = loaded.details["summary"]["files"]
        counts = {str(f["rows"]) for f in files} | {str(sum(loaded.details["row_counts"].values()))}
        lines = [str(r["line"]) for r in loaded.details["rejects"]["sample"]]
        assert lines
        summary = _artifact_id(first.id, "batch-summary")
        rejects = _artifact_id(first.id, "batch-rejects")
        story = _artifact_id(second.id, f"batch-{failed.id}")

    _show(
        page,
        f"{ui}/runs/flow-run/{first.id}",
        [first.name, "tenant:acme", "batch-summary", "batch-rejects", f"batch-{loaded.id}"],
        tmp_path / "import-with-rejects.png",
        tab="Artifacts",
    )
    _show(
        page,
        f"{ui}/artifacts/artifact/{summary}",
        ["batch-summary", first.name, *{f["key"] for f in files}, *counts],
        tmp_path / "batch-summary.png",
    )
    _show(
        page,
        f"{ui}/artifacts/artifact/{rejects}",
        ["rejected rows", *lines],
        tmp_path / "batch-rejects.png",
    )
    # The failed import's own page says that its batch was resumed since, and by which run.
    _show(
        page,
        f"{ui}/runs/flow-run/{second.id}",
        [second.name, "tenant:globex", "Failed", f"{failed.id} of globex: succeeded (resumed)"],
        tmp_path / "import-failed-then-resumed.png",
        tab="Artifacts",
    )
    _show(
        page,
        f"{ui}/artifacts/artifact/{story}",
        ["succeeded (resumed)", second.name, resume.name, "division by zero"],
        tmp_path / "batch-story.png",
    )
