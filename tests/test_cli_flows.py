"""`fleet-import run / resume / batches show / demo` as users run them: subprocesses."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.store.models import BatchStatus
from fleet_import.store.repository import BatchRepository
from tests.helpers import upload

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
IMPORT = "import-s3-folder"


def cli(*args: str, env: dict[str, str] | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fleet_cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        cwd=cwd,
    )


@pytest.fixture
def api_env(flow_env: str) -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    return {"PREFECT_API_URL": PREFECT_API_URL.value()}


def test_run_show_and_exit_codes(flow_env: str, api_env, s3, landing_bucket: str) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=400, bad_rows=True))
    done = cli("run", "--tenant", "acme", folder, env=api_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Completed" in done.stdout and "succeeded" in done.stdout
    (batch,) = BatchRepository(flow_env).list()

    shown = cli("batches", "show", str(batch.id), env=api_env)
    assert shown.returncode == 0, shown.stderr
    for expected in ("succeeded", "retire_superseded", "trips-1.csv", "started_at", "done"):
        assert expected in shown.stdout

    # The same delivery key again: its batch finished, so nothing to do (exit 3, skipped),
    # which a script can tell from a command line it got wrong (exit 2, click's usage error).
    again = cli(
        "run", "--tenant", "acme", folder, "--delivery-key", batch.delivery_key, env=api_env
    )
    assert again.returncode == 3, again.stdout + again.stderr
    assert again.stdout.startswith("Skipped: ") and "nothing to do" in again.stdout
    assert cli("run", folder, env=api_env).returncode == 2  # no --tenant

    # A new delivery of the content the slice holds: already loaded (exit 5), unless forced.
    loaded = cli("run", "--tenant", "acme", folder, env=api_env)
    assert loaded.returncode == 5, loaded.stdout + loaded.stderr
    assert loaded.stdout.startswith("AlreadyLoaded: ") and str(batch.id) in loaded.stdout
    forced = cli("run", "--tenant", "acme", folder, "--force", env=api_env)
    assert forced.returncode == 0, forced.stdout + forced.stderr

    # A folder that can never be one is a usage error too, said before the flow starts.
    broken = cli("run", "--tenant", "acme", "s3://fleet-landing/acme/../x/", env=api_env)
    assert broken.returncode == 2 and "'..' path segments" in broken.stderr


def test_a_business_failure_prints_its_reason_not_a_traceback(
    flow_env: str, api_env, s3, landing_bucket: str
) -> None:
    """A bad delivery is a foreseen failure: the run ends with one clean line. A bug (a
    failpoint raising inside the commit step) still shows its traceback."""
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=20)
    broken = files["trips-1.csv"].replace(b'"status"', b'"state"', 1)
    upload(s3, folder, dict(files, **{"trips-1.csv": broken}))
    failed = cli("run", "--tenant", "acme", folder, env=api_env)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert failed.stdout.startswith("Failed: failed_pre_commit: ") and "trips-1" in failed.stdout
    output = failed.stdout + failed.stderr
    assert "Traceback" not in output and "unexpected exception" not in output, output

    other = today_folder(landing_bucket, "globex")
    upload(s3, other, files)
    crash = {**api_env, "FLEET_FAILPOINTS": "after_normalized_file=raise"}
    crashed = cli("run", "--tenant", "globex", other, env=crash)
    assert crashed.returncode == 1, crashed.stdout + crashed.stderr
    assert "RuntimeError: failpoint after_normalized_file" in crashed.stdout
    assert "Traceback" in crashed.stderr + crashed.stdout


def test_resume_from_the_cli(flow_env: str, api_env, s3, landing_bucket: str) -> None:
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=40))
    failed = cli(
        "run", "--tenant", "acme", folder, env={**api_env, "FLEET_REFRESH_SQL": '["SELECT 1/0"]'}
    )
    assert failed.returncode == 1 and "fleet-import resume" in failed.stdout
    (batch,) = BatchRepository(flow_env).list()
    resumed = cli("resume", str(batch.id), env=api_env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert BatchRepository(flow_env).get(batch.id).status == BatchStatus.SUCCEEDED
    assert cli("resume", "not-a-uuid", env=api_env).returncode == 2


def _run_logs(prefect_db: Path) -> list[tuple[str, str, list[str]]]:
    """Each flow run's flow, final state and logs as the API keeps them (the demo's local
    API stores them in SQLite), a task run's lines prefixed with the task run's name."""
    with contextlib.closing(sqlite3.connect(prefect_db)) as db:
        runs = db.execute(
            "SELECT r.id, f.name, r.state_name FROM flow_run r JOIN flow f ON f.id = r.flow_id"
        ).fetchall()
        return [
            (flow, state, [f"{task}: {m}" if task else m for task, m in db.execute(
                "SELECT t.name, l.message FROM log l "
                "LEFT JOIN task_run t ON t.id = l.task_run_id "
                "WHERE l.flow_run_id = ? ORDER BY l.timestamp",
                (run_id,),
            )])
            for run_id, flow, state in runs
        ]


@pytest.mark.server  # the demo starts its own embedded PostgreSQL and moto server
def test_demo_runs_end_to_end() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "PREFECT_"))}
    # A working directory others may traverse, as a checkout is: pgserver runs PostgreSQL
    # as its own user, whose pg_ctl stop (at exit) cannot reach into pytest's 0700 tmp_path
    # and says so on stderr.
    home = Path(tempfile.mkdtemp(prefix="fleet-demo-test-"))
    home.chmod(0o755)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "fleet_cli", "demo"],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=home,
            env={**env, "COLUMNS": "200"},
        )
        run_logs = _run_logs(home / ".fleet-demo" / "prefect" / "prefect.db")
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert out.count("succeeded") >= 4 and "cache hit" in out
    assert "AlreadyLoaded" in out  # the unchanged rerun
    assert "failed_publication (resumable" in out and "resume batch" in out
    assert "curated slices" in out and "prefect server start" in out
    # Quiet: the demo narrates; no warning or error of a logger gets in between, nor a run log.
    assert not re.search(r"WARNING|ERROR|Warning", result.stderr + out), result.stderr[-3000:]
    assert "| INFO" not in result.stderr + out, result.stderr[-3000:]
    # Issue 53: yet every run keeps its logs in the API, the UI's Logs tab: each import that
    # loaded says its batch held the scope, committed the slice and published it; the held
    # one says it was held for review.
    assert len(run_logs) == 9 and all(lines for _, _, lines in run_logs), run_logs
    said = {}
    for flow, state, lines in run_logs:
        said.setdefault((flow, state), []).append("\n".join(lines))
    assert len(said[(IMPORT, "Completed")]) == 3, run_logs
    for logs in said[(IMPORT, "Completed")]:
        assert re.search(r"^batch \S+ holds fleet_s3:\S+ \(lease ", logs, re.M), logs
        for task in ("commit-slice", "publish"):
            assert re.search(rf"^{task}-\w+: Finished in state Completed\(\)$", logs, re.M), logs
    (held,) = said[(IMPORT, "Held")]
    assert "Finished in state Held('held for review: trips would go from" in held, held
    review = out[out.index("redelivered globex") : out.index("ingestion_batches")]
    assert max(len(line) for line in review.splitlines()) <= 160, review
    # Issue #24: a truncated redelivery held with both counts and the approve command,
    # approved from its staged files, then the slice rolled back to the one before.
    assert "import globex, truncated: Held" in out
    assert "held trips would go from 10,000 rows to 100 (min_rows_ratio 0.5)" in out
    held = re.search(r"to load it anyway: fleet-import batches approve ([0-9a-f-]{36})", out)
    assert held, out
    approved = re.search(rf"approve {held[1][:8]} .*: Completed batch (\S+) succeeded: (.*)", out)
    assert approved and "100 trips" in approved[2], out
    rolled = re.search(
        r"rollback globex\b.*?: Completed rolled back to batch \S+.*?; batch (\S+) succeeded: (.*)",
        out,
    )
    assert rolled and "10,000 trips" in rolled[2], out
    # The final slices: globex's is the rollback's, holding the first delivery's counts.
    slices = dict(re.findall(r"│ (acme|globex) +│ fleet_s3:\S+ +│ (\S+ +│ .*?) +│\n", out))
    cells = {tenant: [c.strip() for c in row.split("│")] for tenant, row in slices.items()}
    assert cells["globex"] == [rolled[1][:8], "40", "10,000", "800"], out
    assert cells["acme"][1:] == ["40", "5,000", "800"], out
