"""The warehouse (PostgreSQL and Redshift), operational database and S3 fault cells again,
through the two ways a user starts an import (issue #26: "through the CLI and through the
flow"): the import flow (`import_s3_folder` on Prefect's test API, FLEET_* pointing at the
proxy, as `flow_env` does) and `fleet-import run` as a child process. The core runtime's
matrices (test_warehouse_matrix.py, test_operational_matrix.py, test_s3_matrix.py) hold a
cell per recovery path of the core; these add what the flow and the command add on top.

Helpers of test_paths_warehouse_matrix.py, test_paths_redshift_matrix.py,
test_paths_operational_matrix.py and test_paths_s3_matrix.py (a file each, so `--dist
loadfile` runs them side by side). What each path *reports* must be true at once: the exit
code (the flow's by `exit_code_for` of its final state) is what the batch is, the message
is one line without a traceback and names the failure or the dependency's setting; then
the same recovery and invariants as the runtime's cells.

The command runs the flow in its process, so a CLI cell covers the flow too; a flow cell is
kept only for what the CLI cells do not reach (FLOW_CELLS says which). CLI_CELLS: one cell
per fault kind and dependency, each a child process (its exit code, its one line).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from fleet_import.config import Settings
from fleet_import.explain import S3_NO_ANSWER
from fleet_import.importing.claim import settle_abandoned_batches
from fleet_import.importing.driver import import_folder
from fleet_import.importing.resume import resume_batch
from fleet_import.importing.runtime import build_runtime
from fleet_import.scope import Tenant
from flows.reporting import EXIT_CODES, ExitCode, exit_code_for
from tests.faults import test_operational_matrix as operational
from tests.faults import test_s3_matrix as s3_matrix
from tests.faults import test_warehouse_matrix as warehouse_matrix
from tests.faults.conftest import (
    LEASE_TTL_SECONDS,
    batch_rows,
    recovered_invariants,
    run_cli,
    wait_out_abandoned,
)
from tests.faults.proxy import FaultProxy, proxied_url
from tests.faults.test_warehouse_matrix import truth_now
from tests.reliability.conftest import REFRESH_SQL, Source, refresh_count

FLOW_CELLS = {
    "warehouse": {
        ("claim", "outage"): "Prefect's task retries of the claim step outlast the outage",
        ("publication", "lost_reply"): "failed_publication as the run's state, resumed",
    },
    "operational": {
        ("discover", "outage"): "Prefect's task retries of a store step outlast the outage",
        ("publication", "lost_reply"): "exit 1 after the commit: the drain publishes",
        ("succeed", "outage"): "the success read back is the run's state",
    },
    "s3": {
        ("get", "black_hole"): "the flow's normalize tasks: no queued file starts after one failed",
        ("upload", "black_hole"): "no task retry over botocore's attempts at a staging PUT",
    },
}
"""The flow's own cells, each with what it shows that the CLI cells do not."""
CLI_CELLS = {
    "warehouse": {("commit", "lost_reply"), ("copy", "reset"), ("publication", "stall")},
    "operational": {("record", "lost_reply"), ("claim", "reset"), ("normalise", "stall")},
    "s3": {("discover", "black_hole"), ("get", "throttle"), ("upload", "outage")},
}
"""The CLI's cells: one per fault kind and dependency."""
SAMPLED = {("cli", "operational", "record", "lost_reply")}
"""The cells `make test` runs too; `make test-faults` runs them all."""
SETTING = {
    "warehouse": "FLEET_WAREHOUSE_URL",
    "operational": "FLEET_DATABASE_URL",
    "s3": "FLEET_S3_ENDPOINT_URL",
}
STATE_LINE = re.compile(rf"^({'|'.join(EXIT_CODES)}): ")
ACME = Tenant.named("acme")


def cells(dependency: str) -> list[Any]:
    """(path, phase, fault) parameters of `dependency`'s cells, the sampled ones marked."""
    chosen = [("flow", *cell) for cell in FLOW_CELLS[dependency]]
    chosen += [("cli", *cell) for cell in sorted(CLI_CELLS[dependency])]
    return [
        pytest.param(
            path,
            phase,
            fault,
            id=f"{path}-{phase}-{fault}",
            marks=[pytest.mark.faults_sample]
            if (path, dependency, phase, fault) in SAMPLED
            else [],
        )
        for path, phase, fault in chosen
    ]


@dataclass(frozen=True)
class Report:
    """What a path told its user: the exit code and the one state line's message."""

    code: ExitCode
    message: str
    out: str
    seconds: float = 0.0  # how long the path took to report


@dataclass(frozen=True)
class WarehouseBackend:
    """A warehouse other than the test's PostgreSQL (Redshift through the emulator): what the
    flow and the CLI read to reach it through the proxy, what the recovery runtime reads to
    reach it directly (the truth lives there), the setting an exit 1 names, and the
    messages each phase is armed on."""

    env: Mapping[str, str]
    recovery: Mapping[str, Any]
    setting: str
    phases: Mapping[str, Any] = field(default_factory=lambda: warehouse_matrix.PHASES)


def _arm(
    proxy: FaultProxy, dependency: str, phase: str, fault: str, backend: WarehouseBackend | None
) -> Any:
    if dependency == "s3":
        return s3_matrix.arm_s3(proxy, phase, fault)
    if dependency == "warehouse":
        phases = dict(backend.phases) if backend else warehouse_matrix.PHASES
        return warehouse_matrix._arm(proxy, phase, fault, phases)
    return warehouse_matrix.arm_fault(proxy, fault, operational.PHASES[phase])


def _through_flow(env: dict[str, str], monkeypatch: pytest.MonkeyPatch, folder: str) -> Report:
    from flows.import_s3_folder import import_s3_folder

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    state = import_s3_folder(tenant_id="acme", folder=folder, delivery_key="d1", return_state=True)
    return Report(exit_code_for(state), state.message or "", f"{state.name}: {state.message}")


def _through_cli(env: dict[str, str], folder: str) -> Report:
    started = time.monotonic()
    run = run_cli(env, "run", "--tenant", "acme", "--delivery-key", "d1", folder)
    seconds = time.monotonic() - started
    assert not run.traceback, run.out
    [line] = [line for line in run.out.splitlines() if STATE_LINE.match(line)]
    name, message = line.split(": ", 1)
    assert ExitCode(run.returncode) == EXIT_CODES[name] or (  # a failed state's own code
        EXIT_CODES[name] == ExitCode.SUCCEEDED and run.returncode == ExitCode.FAILED
    ), run.out
    return Report(ExitCode(run.returncode), message, run.out, seconds)


def reported_untruths(
    report: Report, dependency: str, database_url: str, setting: str | None = None
) -> list[str]:
    """What the exit code and message say, checked against the batch as recorded; an exit 1
    with no failed batch must name `setting` (by default the dependency's URL), and a
    message naming what to check names `setting` when one is given (another backend's)."""
    problems = []
    if setting and "FLEET_" in report.message and setting not in report.message:
        problems.append(f"the message names settings, but not {setting}")
    setting = setting or SETTING[dependency]
    rows = batch_rows(database_url)
    statuses = [status for _, status, _, _ in rows]
    if "\n" in report.message or "Traceback" in report.message:
        problems.append("the message is not one line")
    if report.code == ExitCode.SUCCEEDED and statuses != ["succeeded"]:
        problems.append(f"exit 0, batches {statuses}")
    elif report.code == ExitCode.COMMIT_UNKNOWN:
        if not any(s == "running" and "commit_unknown" in d for _, s, _, d in rows):
            problems.append(f"exit 7, yet no batch running with commit_unknown: {rows}")
    elif report.code == ExitCode.PUBLICATION_PENDING and "running" not in statuses:
        problems.append(f"exit 4, batches {statuses}")
    elif report.code == ExitCode.FAILED:
        kinds = [(d.get("failure") or {}).get("kind") for _, s, _, d in rows if s == "failed"]
        if kinds and not any(str(kind) in report.message for kind in kinds):
            problems.append(f"exit 1 names none of the failures {kinds}")
        if not kinds and setting not in report.message:
            problems.append(f"exit 1 with no failed batch, and no {setting}")
        if "succeeded" in statuses:  # a lost answer to the success included (publication/success)
            problems.append(f"exit 1, batches {statuses}")
    elif report.code not in (ExitCode.SUCCEEDED, ExitCode.PUBLICATION_PENDING):
        problems.append(f"exit {int(report.code)}, unforeseen here")
    return problems


def run_cell(
    path: str,
    dependency: str,
    phase: str,
    fault: str,
    *,
    proxy: FaultProxy,
    cli_env: dict[str, str],
    source: Source,
    database_url: str,
    moto_endpoint: str,
    staging_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    env_overrides: Mapping[str, str] | None = None,
    backend: WarehouseBackend | None = None,
) -> Report:
    """One cell: the fault armed, the import through `path`, its report checked, recovery
    as the runtime's cells do it, then the invariants. `env_overrides` go over the cell's
    FLEET_* settings for the first import (a bound set short); `backend`: the warehouse
    cells on a warehouse other than the test's PostgreSQL."""
    through = proxied_url(database_url, proxy)
    env = {
        "FLEET_DATABASE_URL": through if dependency == "operational" else database_url,
        "FLEET_WAREHOUSE_URL": through if dependency == "warehouse" else database_url,
        "FLEET_LEASE_TTL_SECONDS": str(LEASE_TTL_SECONDS),
        "FLEET_COMMIT_READBACK_SECONDS": "30",
        "FLEET_REFRESH_SQL": json.dumps([REFRESH_SQL]),
        "FLEET_WORKDIR": str(tmp_path / "work"),
        **(s3_through(proxy) if dependency == "s3" else {}),
        **(env_overrides or {}),
    }
    if backend:  # its own settings name it: a PostgreSQL URL beside them is refused
        del env["FLEET_WAREHOUSE_URL"]
        env.update(backend.env)
        monkeypatch.delenv("FLEET_WAREHOUSE_URL", raising=False)
        cli_env = {k: v for k, v in cli_env.items() if k != "FLEET_WAREHOUSE_URL"}
    fired = _arm(proxy, dependency, phase, fault, backend)
    if path == "flow":
        report = _through_flow(env, monkeypatch, source.folder)
    else:
        report = _through_cli({**cli_env, **env}, source.folder)
    assert fired.is_set(), f"the {fault} at {phase} never happened: {report.out}"
    assert truth_now(database_url, source, holders=dependency == "warehouse") == [], report.out
    setting = backend.setting if backend else None
    assert reported_untruths(report, dependency, database_url, setting) == [], report.out
    if fault == "stall":  # a 2 s stall is waited out: the run just succeeds
        assert report.code == ExitCode.SUCCEEDED, report.out
    if dependency == "warehouse" and phase != "publication" and fault != "outage":
        assert report.code == ExitCode.SUCCEEDED, report.out  # 2 s: within the slice's retries
    if dependency == "s3":
        assert s3_untruths(report, fault, proxy, database_url, source) == [], report.out

    proxy.pass_through()  # recovery, as the runtime's cells do it
    rt = build_runtime(
        Settings(
            database_url=database_url,
            **(dict(backend.recovery) if backend else {"warehouse_url": database_url}),
            s3_endpoint_url=moto_endpoint,
            staging_uri=f"s3://{staging_bucket}/stage/",
            lease_ttl_seconds=LEASE_TTL_SECONDS,
            refresh_sql=[REFRESH_SQL],
            workdir=str(tmp_path / "recovery"),
            warehouse_load_slots=0,
            tenant_load_slots=0,
        )
    )
    for batch_id, status, _lease, details in batch_rows(database_url):
        if status == "failed" and (details.get("failure") or {}).get("kind") == (
            "failed_publication"
        ):
            resume_batch(rt.ctx, rt.outbox, batch_id)
    wait_out_abandoned(database_url)  # a batch left without its executor is abandoned
    import_folder(rt.ctx, ACME, source.folder, "d2")  # the next delivery of the folder
    settle_abandoned_batches(rt.ctx, "drain", limit=10)
    rt.publisher.drain("drain", lease_ttl=rt.ctx.lease_ttl, limit=10)

    assert recovered_invariants(database_url, source) == [], report.out
    refreshes = refresh_count(database_url)
    if dependency != "operational":  # a lost answer to a publication step runs it once more
        assert refreshes == 1 or (phase, fault) == ("publication", "lost_reply"), refreshes
    assert 1 <= refreshes <= 2, refreshes
    print(f"{path} {dependency} {phase} {fault}: exit {int(report.code)}: {report.message}")
    return report


def s3_through(proxy: FaultProxy) -> dict[str, str]:
    """The settings that send a path's S3 through `proxy`, with the S3 cells' short limits."""
    return {**s3_matrix.S3_LIMITS_ENV, "FLEET_S3_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"}


def s3_untruths(
    report: Report, fault: str, proxy: FaultProxy, database_url: str, source: Source
) -> list[str]:
    """What the S3 cells add to `reported_untruths`, as the runtime's S3 cells check it: no
    batch left running unheld; within the bound botocore rides the fault out (exit 0); a
    black hole fails the run with one line naming S3 and its setting, and exactly botocore's
    attempts reached S3 for each call it caught (nothing above botocore retried S3, and a
    failed file started no further files)."""
    problems = truth_now(database_url, source)
    if fault != "black_hole":
        if report.code != ExitCode.SUCCEEDED:
            problems.append(f"exit {int(report.code)} for a fault within the bound")
        return problems
    if report.code != ExitCode.FAILED:
        problems.append(f"exit {int(report.code)} for a black hole")
    for words in (S3_NO_ANSWER, f"check {SETTING['s3']}"):
        if words not in report.message:
            problems.append(f"the message does not say {words!r}")
    for batch_id, status, _lease, details in batch_rows(database_url):  # it records the same
        if S3_NO_ANSWER not in str((details.get("failure") or {}).get("error")):
            problems.append(f"batch {batch_id} is {status}, its error not S3's: {details}")
    return problems + s3_matrix.retried_above_botocore(proxy)
