"""What a configuration error costs (issue #28: under 2 s on this machine): the command
imports nothing it does not need before its settings are checked (no Prefect, boto3,
pyarrow, psycopg), measured by wall and CPU time and printed; only the CPU time is asserted,
against a generous bound (the figure a shared machine does not inflate: the wall clock of
two cores shared with other runs says nothing about the command)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.run_cli import CONFIGURATION_ERROR, FOLDER

HEAVY = ("prefect", "boto3", "botocore", "pyarrow", "numpy", "psycopg", "httpx", "sqlalchemy")
# Generous: about 0.5 s of CPU here; this catches an import of Prefect (seconds), not a slow
# machine.
CPU_BOUND_SECONDS = 5.0

_RUN_AND_LIST_MODULES = """
import json, sys
from fleet_cli.cli import app
try:
    app(sys.argv[1:], prog_name="fleet-import")
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "modules": sorted(
    m for m in sys.modules if m.split(".")[0] in HEAVY)}))
""".replace("HEAVY", repr(HEAVY))

MISCONFIGURED = {
    "no staging": (("run", "--tenant", "acme", FOLDER), {}),
    "a bad database URL": (
        ("run", "--tenant", "acme", FOLDER),
        {"FLEET_DATABASE_URL": "postgresql://db:54x2/fleet", "FLEET_STAGING_URI": "/tmp/s"},
    ),
    "a bad contract file": (
        ("resume", "00000000-0000-0000-0000-000000000001"),
        {"FLEET_CONTRACTS": "{contracts}", "FLEET_STAGING_URI": "/tmp/s"},
    ),
    "redshift half set": (
        ("run", "--tenant", "acme", FOLDER),
        {"FLEET_WAREHOUSE": "redshift", "FLEET_STAGING_URI": "/tmp/s"},
    ),
    "approve, no staging": (("batches", "approve", "00000000-0000-0000-0000-000000000001"), {}),
}


@pytest.mark.parametrize("case", MISCONFIGURED)
def test_a_configuration_error_imports_nothing_heavy(case: str, tmp_path: Path) -> None:
    args, extra = MISCONFIGURED[case]
    contracts = tmp_path / "contracts.yaml"
    contracts.write_text("datasets:\n  - name: tyres\n    file_glob: 't*'\n    natual_key: [id]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "PREFECT_"))}
    env.update({k: v.format(contracts=contracts) for k, v in extra.items()})
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", _RUN_AND_LIST_MODULES, *args],
        capture_output=True, text=True, env=env, timeout=120,
    )
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    load = os.getloadavg()[0]
    print(f"{case}: wall {wall:.2f} s, user+sys {cpu:.2f} s, load average {load:.1f}")
    assert "Traceback" not in result.stderr, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report == {"code": CONFIGURATION_ERROR, "modules": []}, (report, result.stderr)
    assert all(line.startswith("error: ") for line in result.stderr.splitlines() if line)
    assert cpu < CPU_BOUND_SECONDS
