"""`fleet-import run` with a folder or tenant id that can never name a delivery: a usage
error (exit 2, README's table), one line each from the core's own rules (fleet_import.scope),
said before the settings are read, Prefect is imported or a database is reached. It used to
exit 1 after a temporary Prefect API had started, 15-27 s later, and name the run after the
bad value (`import/../globex/2026-07-22`). And `run --help` lists every exit code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cli.run_cli import CPU_BOUND_SECONDS, FOLDER, closed_port_url, error_lines, fleet
from tests.cli.test_config_error_cost import HEAVY

USAGE_ERROR = 2
TENANT_RULE = (
    "expected 1-63 characters of lower-case letters, digits, '_' or '-', starting with a "
    "letter or digit"
)

MALFORMED = {
    "no scheme": (
        "acme", "acme/fleet/2026-07-22/",
        "invalid S3 folder 'acme/fleet/2026-07-22/': only s3:// folders are supported "
        "(got no scheme)",
    ),
    "a bad bucket": (
        "acme", "s3://Bad_Bucket!/",
        "invalid S3 folder 's3://Bad_Bucket!/': 'bad_bucket!' is not a valid bucket name",
    ),
    "no bucket": (
        "acme", "s3:///acme/", "invalid S3 folder 's3:///acme/': the bucket name is empty"
    ),
    "'..' in the folder": (
        "acme", "s3://fleet-landing/acme/../x/",
        "invalid S3 folder 's3://fleet-landing/acme/../x/': '..' path segments are not allowed",
    ),
    "a tenant with spaces": (
        "Acme Corp!", FOLDER, f"invalid tenant id 'Acme Corp!': {TENANT_RULE}"
    ),
    "a tenant path": ("../globex", FOLDER, f"invalid tenant id '../globex': {TENANT_RULE}"),
    "an empty tenant": ("", FOLDER, f"invalid tenant id '': {TENANT_RULE}"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_folder_or_tenant_is_a_usage_error(case: str, tmp_path: Path) -> None:
    tenant, folder, expected = MALFORMED[case]
    # Nothing else is set either: a command that read its settings first would exit 78
    # (no FLEET_STAGING_URI), one that reached the database 1 (nothing listens there).
    result, cpu_seconds = fleet(
        "run", "--tenant", tenant, folder,
        FLEET_DATABASE_URL=closed_port_url(),
        PREFECT_HOME=str(tmp_path / "prefect"),
    )
    assert result.returncode == USAGE_ERROR, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    (line,) = error_lines(result)
    assert line.startswith(f"error: {expected}"), line
    assert result.stdout == ""
    assert not (tmp_path / "prefect").exists()
    assert cpu_seconds < CPU_BOUND_SECONDS


def test_both_malformed_are_said_at_once() -> None:
    result, _ = fleet("run", "--tenant", "../globex", "s3:///acme/")
    assert result.returncode == USAGE_ERROR
    tenant, folder = error_lines(result)
    assert tenant.startswith("error: invalid tenant id '../globex': ")
    assert folder.startswith("error: invalid S3 folder 's3:///acme/': ")


def test_a_well_formed_run_still_reaches_its_settings() -> None:
    """The check refuses what cannot be a delivery, nothing more: a valid folder and tenant
    go on to the settings (78 here: no FLEET_STAGING_URI)."""
    result, _ = fleet("run", "--tenant", "acme_2", "s3://fleet-landing/Acme%20Fleet/2026-07-22")
    assert result.returncode == 78, result.stderr


def test_refused_before_prefect_or_a_driver_is_imported(tmp_path: Path) -> None:
    """In a child, the one place imports show: Python lists each as it imports it."""
    result, cpu_seconds = fleet(
        "run", "--tenant", "../globex", FOLDER,
        PREFECT_HOME=str(tmp_path / "prefect"),
        PYTHONPROFILEIMPORTTIME="1",
        in_child=True,
    )
    timings = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in timings}
    assert "fleet_cli" in imported  # the listing works
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
    lines = [line for line in result.stderr.splitlines() if line.strip() and line not in timings]
    assert result.returncode == USAGE_ERROR
    assert lines == [f"error: invalid tenant id '../globex': {TENANT_RULE}"]
    assert not (tmp_path / "prefect").exists()
    print(f"refused in {cpu_seconds:.2f} s of CPU, {len(timings)} modules imported")
    assert cpu_seconds < CPU_BOUND_SECONDS


def test_run_help_lists_every_exit_code_in_order() -> None:
    """Each code `run` can end with, as flows.reporting.ExitCode (README's table) has them:
    9 once came before 6, and 7 was missing."""
    from flows.reporting import ExitCode

    result, _ = fleet("run", "--help")
    assert result.returncode == 0
    text = result.stdout.split("Exit codes:")[1].split("Example:")[0]
    listed = [int(code) for code in re.findall(r"^\s*(\d+) \w", text, flags=re.MULTILINE)]
    assert listed == [int(code) for code in ExitCode]
