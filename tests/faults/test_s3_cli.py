"""S3 through `fleet-import run` (the import flow, on Prefect's test API): a black-holed S3
endpoint ends the run within the stated bound, because exactly one layer retries S3
(botocore: its attempts are the only connections the endpoint sees, not attempts x the
Prefect task's retries); the end is one line naming S3 and what to check, exit 1, and the
batch is recorded failed before commit with the same line. A throttle that botocore rides
out (two 503 SlowDown) ends succeeded."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fleet_import.store.models import BatchStatus
from flows.reporting import ExitCode
from tests.faults.conftest import batch_rows, recovered_invariants, run_cli
from tests.faults.proxy import FaultProxy
from tests.faults.test_s3_matrix import LIMITS, PHASES, S3_LIMITS_ENV, s3_proxy  # noqa: F401
from tests.reliability.conftest import Source, refresh_count

pytestmark = [pytest.mark.faults, pytest.mark.slow]


def _env(cli_env: dict[str, str], proxy: FaultProxy) -> dict[str, str]:
    return {**cli_env, **S3_LIMITS_ENV, "FLEET_S3_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"}


def test_a_black_holed_s3_ends_the_run_within_the_bound_with_one_line(
    cli_env: dict[str, str],
    s3_proxy: FaultProxy,  # noqa: F811
    source: Source,
    database_url: str,
    capsys: Any,
) -> None:
    s3_proxy.black_hole()
    started = time.monotonic()
    run = run_cli(_env(cli_env, s3_proxy), "run", "--tenant", "acme", source.folder)
    seconds = time.monotonic() - started
    assert run.returncode == ExitCode.FAILED, run.out
    assert not run.traceback, run.out
    # the CLI's own line (Prefect's run log above it says the same, as the run's message)
    [line] = [line for line in run.out.splitlines() if line.startswith("Failed: ")]
    assert "S3 does not answer" in line and "check FLEET_S3_ENDPOINT_URL" in line, run.out
    # botocore's attempts of the one listing, and nothing retried them again
    assert s3_proxy.accepted == LIMITS.max_attempts, run.out
    [(_id, status, lease, details)] = batch_rows(database_url)
    assert status == BatchStatus.FAILED and lease is None
    assert details["failure"]["kind"] == "failed_pre_commit"
    assert "S3 does not answer" in details["failure"]["error"], details

    s3_proxy.pass_through()  # S3 is back: the folder's next run loads it
    started = time.monotonic()
    again = run_cli(_env(cli_env, s3_proxy), "run", "--tenant", "acme", source.folder)
    baseline = time.monotonic() - started
    with capsys.disabled():  # a figure, not an assertion (no timed assertions in tests)
        print(
            f"\nblack-holed S3: `run` ended in {seconds:.1f} s (S3's bound "
            f"{LIMITS.call_bound:.0f} s); the same run with S3 answering took {baseline:.1f} s"
        )
    assert again.returncode == ExitCode.SUCCEEDED, again.out
    assert recovered_invariants(database_url, source) == []


def test_a_throttled_s3_is_retried_by_botocore_and_the_run_succeeds(
    cli_env: dict[str, str],
    s3_proxy: FaultProxy,  # noqa: F811
    source: Source,
    database_url: str,
) -> None:
    fired = s3_proxy.throttle_on(PHASES["discover"], LIMITS.max_attempts - 1)
    run = run_cli(_env(cli_env, s3_proxy), "run", "--tenant", "acme", source.folder)
    assert fired.is_set(), run.out
    assert run.returncode == ExitCode.SUCCEEDED, run.out
    assert not run.traceback, run.out
    assert [status for _, status, _, _ in batch_rows(database_url)] == [BatchStatus.SUCCEEDED]
    assert refresh_count(database_url) == 1
    assert recovered_invariants(database_url, source) == []
