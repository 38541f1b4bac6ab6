"""Guard mutants: prove that a change to the test suite lost none of its power (issue 39).

Each mutant breaks one guard of the product -- a rule that protects data or the truth of a
status -- by replacing one exact snippet of the core code. The runner applies one mutant at
a time to a checkout, runs pytest there, records whether the suite noticed (killed: pytest
failed) or not (survived: it passed), and puts the original bytes back. Run on the old
checkout and on the new one, the same list must be killed as often: a faster suite that
kills fewer mutants has stopped guarding something.

Run it from the checkout, with that checkout's own venv python (its tests' subprocesses
import the package the venv points at)::

    cd DIR && .venv/bin/python -m tests.mutants [--root DIR] [--only NAME,...] \\
        [--json OUT] [--timeout-minutes 45] -- PYTEST_ARGS...
    .venv/bin/python tests/mutants.py --list           # the mutants and their guards
    .venv/bin/python tests/mutants.py --root DIR --check  # each original occurs once
    .venv/bin/python -m tests.mutants --witnesses       # each witness: passes, then kills

`--root` defaults to the repository holding this file. The module imports only the standard
library, so another checkout's copy can drive (or `--check`) any checkout. A mutant whose
original text does not occur exactly once stops the run before anything is changed: a
mutant that no longer applies is never counted. Each mutant's `witness` is one test that
kills it (documentation; `--witnesses` re-checks that it passes unmutated and fails with
the mutant). pytest's output per mutant is kept in `--log-dir`.

Not a test module: pytest collects test_*.py files only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

DEFAULT_TIMEOUT_MINUTES = 45.0
# A stopped pytest gets this long to tear its fixtures down (servers, databases) after
# SIGINT, then SIGTERM, then SIGKILL.
_GRACE_SECONDS = 30.0
_SUMMARY_LINE = re.compile(r"^(FAILED|ERROR) (\S+)")
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


@dataclass(frozen=True)
class Mutant:
    """One broken guard: `original` (exactly once in `path`) becomes `replacement`."""

    name: str
    guard: str
    """What would go wrong for a user if the guard were gone."""
    path: str
    """Relative to the checkout's root."""
    original: str
    replacement: str
    witness: str
    """A test node id that fails with the mutant applied and passes without it."""


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="commit_record_unfenced",
        guard="a worker that lost its lease can still record a commit on the batch",
        path="fleet_import/store/queries.sql",
        original=(
            "'warehouse_committed', true),\n"
            "    updated_at = now()\n"
            "WHERE id = %(batch_id)s AND status = 'running' AND execution_lease_id = %(owner)s\n"
        ),
        replacement=(
            "'warehouse_committed', true),\n"
            "    updated_at = now()\n"
            "WHERE id = %(batch_id)s AND status = 'running'\n"
        ),
        witness=(
            "tests/store/test_batches_repository.py"
            "::test_expired_lease_is_taken_over_and_the_old_owner_is_fenced"
        ),
    ),
    Mutant(
        name="live_lease_stolen",
        guard="a lease still alive is taken by another worker: two executors on one batch",
        path="fleet_import/store/queries.sql",
        original="       OR execution_lease_expires_at <= now())\n",
        replacement="       OR true)\n",
        witness="tests/store/test_batches_repository.py::test_lease_is_exclusive_and_reentrant",
    ),
    Mutant(
        name="old_claims_survive_takeover",
        guard="a new lease holder cannot publish: the old holder's step claims stay alive",
        path="fleet_import/store/queries.sql",
        original="  AND claimed_by IS DISTINCT FROM %(owner)s AND claimed_until > now()\n",
        replacement=(
            "  AND claimed_by IS DISTINCT FROM %(owner)s AND claimed_until > now() AND false\n"
        ),
        witness=(
            "tests/contract/test_outbox_contract.py"
            "::test_a_new_lease_ends_the_old_holders_claims[postgres]"
        ),
    ),
    Mutant(
        name="heartbeat_never_fences",
        guard="a worker whose lease went unconfirmed keeps writing to the warehouse",
        path="fleet_import/store/heartbeat.py",
        original="        if unconfirmed >= self._fence_after:\n",
        replacement="        if unconfirmed >= self._fence_after and False:\n",
        witness=(
            "tests/store/test_heartbeat.py"
            "::test_an_unconfirmed_lease_is_fenced_before_it_can_expire"
        ),
    ),
    Mutant(
        name="unknown_commit_taken_as_not_committed",
        guard="a lost COMMIT answer, stamp unreadable, is taken as not committed: a false status",
        path="fleet_import/importing/settle.py",
        original="            batch.check_lease()\n    return Stamp.UNKNOWN\n",
        replacement="            batch.check_lease()\n    return Stamp.NOT_STAMPED\n",
        witness=(
            "tests/importing/test_commit_unknown.py"
            "::test_a_rerun_of_the_delivery_settles_an_unknown_commit"
        ),
    ),
    Mutant(
        name="s3_retried_twice",
        guard="S3 errors botocore gave up on are retried again above it (retry storms)",
        path="fleet_import/errors.py",
        original='    return is_transient(exc) and not getattr(exc, "retried", False)\n',
        replacement="    return is_transient(exc)\n",
        witness=(
            "tests/importing/test_driver_branches.py"
            "::test_an_s3_error_botocore_gave_up_on_is_not_retried_again"
        ),
    ),
    Mutant(
        name="reject_ratio_ignored",
        guard="a delivery with more rejected rows than its contract allows is loaded anyway",
        path="fleet_import/normalize/file.py",
        original="    if ratio > limit:\n",
        replacement="    if ratio > limit + 1:\n",
        witness="tests/normalize/test_normalize.py::test_reject_ratio_above_the_limit_fails",
    ),
    Mutant(
        name="duplicate_keys_kept",
        guard="rows repeating a natural key across a delivery are loaded, not rejected",
        path="fleet_import/normalize/duplicates.py",
        original='counts.filter(pc.greater(counts.column("_position_count"), 1))',
        replacement='counts.filter(pc.greater(counts.column("_position_count"), 1 << 62))',
        witness=(
            "tests/normalize/test_normalize.py"
            "::test_duplicate_keys_across_files_reject_every_occurrence"
        ),
    ),
    Mutant(
        name="stray_quotes_spanning_lines_taken_as_one_value",
        guard="a stray quote closed lines below into the header's column count makes one value "
        "of the lines between: rows lost without a reject (issue 46.2)",
        path="fleet_import/normalize/csv.py",
        original="                if opened is not None:\n",
        replacement="                if opened is not None and False:\n",
        witness=(
            "tests/normalize/test_normalize_quotes.py"
            "::test_a_stray_quote_closed_by_a_stray_one_rejects_each_line_between"
        ),
    ),
    Mutant(
        name="loaded_rows_count_one_line",
        guard="a row read from a value spanning lines names only its first line: the others "
        "are in no count",
        path="fleet_import/normalize/csv.py",
        original="        if self.breaks is None or not pc.sum(self.breaks).as_py():\n",
        replacement="        if True:\n",
        witness=(
            "tests/normalize/test_normalize_quotes.py"
            "::test_a_value_spanning_lines_as_meant_is_loaded_with_every_line_it_covers"
        ),
    ),
    Mutant(
        name="shrinking_slice_not_held",
        guard="a redelivery that shrinks a slice past min_rows_ratio replaces it, no review",
        path="fleet_import/importing/guards.py",
        original="    if new_rows < ratio * current_rows and not (",
        replacement="    if new_rows < 0 * current_rows and not (",
        witness=(
            "tests/importing/test_guards.py"
            "::test_a_shrinking_redelivery_is_held_and_the_old_slice_stays[truncated-postgres]"
        ),
    ),
    Mutant(
        name="other_tenants_folder_admitted",
        guard="a folder in another tenant's landing area is imported as this tenant's",
        path="fleet_import/tenants/binding.py",
        original="    if owner != tenant_id:\n",
        replacement="    if owner != tenant_id and False:\n",
        witness="tests/tenants/test_binding.py::test_without_a_registry_the_layout_decides",
    ),
    Mutant(
        name="contract_change_already_loaded",
        guard="the same files under a changed contract are called already loaded, not reloaded",
        path="fleet_import/s3/delivery.py",
        original="    fingerprint: str\n    contract_versions: tuple[tuple[str, str], ...]\n",
        replacement=(
            "    fingerprint: str\n"
            "    contract_versions: tuple[tuple[str, str], ...]"
            ' = __import__("dataclasses").field(compare=False)\n'
        ),
        witness=(
            "tests/intake/test_sweep.py"
            "::test_a_contract_changed_since_the_last_success_makes_its_folder_due_again"
        ),
    ),
    Mutant(
        name="expired_publication_continues",
        guard="publication goes on for a batch whose slice another batch now owns",
        path="fleet_import/publication/events.py",
        original="    if stamp == batch_id:\n        return None\n",
        replacement="    if stamp == batch_id or stamp is not None:\n        return None\n",
        witness=(
            "tests/publication/test_publication.py"
            "::test_a_newer_stamp_before_a_step_expires_the_publication"
        ),
    ),
    # Recovery paths the fault matrices' merged cells meet (issue 39: one cell per path).
    Mutant(
        name="slice_load_not_retried",
        guard="a slice load cut by a transient warehouse fault fails the batch, not retried",
        path="fleet_import/importing/load.py",
        original="                if not exc.transient or retry >= backoff.retries:\n",
        replacement="                if True:\n",
        witness=(
            "tests/faults/test_warehouse_matrix.py"
            "::test_a_warehouse_fault_is_reported_truly_and_recovered[copy-outage]"
        ),
    ),
    Mutant(
        name="unstamped_commit_not_loaded_again",
        guard="a COMMIT without an answer, proven not stamped, fails the batch: no reload",
        path="fleet_import/importing/load.py",
        original="                if not exc.transient or retry == LOAD_BACKOFF.retries:\n",
        replacement="                if True:\n",
        witness=(
            "tests/faults/test_warehouse_matrix.py"
            "::test_a_warehouse_fault_is_reported_truly_and_recovered[commit-outage]"
        ),
    ),
    # What the command prints and exits with (issue 39: its tests moved in-process).
    Mutant(
        name="held_exits_as_failed",
        guard="a held batch exits 1 like a failure: a script cannot tell review from error",
        path="flows/reporting.py",
        original='        "Held": ExitCode.HELD,',
        replacement='        "Held": ExitCode.FAILED,',
        witness="tests/test_reporting.py::test_exit_code_of_each_final_state",
    ),
    Mutant(
        name="final_state_message_dropped",
        guard="run and resume print the final state without its message: no reason, no next step",
        path="fleet_cli/common.py",
        original='Text.assemble((state.name, colour), ": ", state.message or "")',
        replacement='Text.assemble((state.name, colour), ": ")',
        witness=(
            "tests/test_cli_flows.py::test_a_business_failure_prints_its_reason_not_a_traceback"
        ),
    ),
    Mutant(
        name="configuration_error_exits_1",
        guard="a configuration error exits 1 like a failed import, not 78 (EX_CONFIG)",
        path="fleet_cli/guard.py",
        original="        raise typer.Exit(CONFIGURATION_ERROR) from None\n",
        replacement="        raise typer.Exit(1) from None\n",
        witness=(
            "tests/cli/test_first_contact.py"
            "::test_run_names_every_problem_at_once_before_starting_anything"
        ),
    ),
    # The read-back's other half (a success that did commit, its answer lost, is returned as
    # succeeded) has no killing test: the succeed-lost_reply cell loses the UPDATE's reply,
    # so its transaction rolls back and the batch never succeeded. Hence this mutant.
    Mutant(
        name="lost_success_not_read_back",
        guard="a lost answer to the batch's success is not read back: the run reports an error",
        path="fleet_import/publication/success.py",
        original="        if not is_transient(exc):\n            raise\n",
        replacement="        if True:\n            raise\n",
        witness=(
            "tests/faults/test_operational_matrix.py"
            "::test_an_operational_database_fault_is_reported_truly_and_recovered"
            "[succeed-lost_reply]"
        ),
    ),
    # Issue 47: three guards no test stated, each found by a mutant that survived.
    Mutant(
        name="approved_content_not_rechecked",
        guard="an approval commits content that changed after its check, which nobody reviewed",
        path="fleet_import/importing/guards.py",
        original="    if approved is not None and dict(approved) != content:\n",
        replacement="    if False and approved is not None and dict(approved) != content:\n",
        witness=(
            "tests/importing/test_review.py"
            "::test_an_approval_waives_nothing_for_content_that_changed_after_its_check"
        ),
    ),
    Mutant(
        name="missing_dataset_counted_unchanged",
        guard="a redelivery without an optional dataset empties its slice rows unheld",
        path="fleet_import/importing/guards.py",
        original="current_rows, new_rows.get(dataset, 0), ratio)",
        replacement="current_rows, new_rows.get(dataset, current_rows), ratio)",
        witness=(
            "tests/importing/test_guards.py"
            "::test_a_dataset_missing_from_a_redelivery_counts_as_emptied"
        ),
    ),
    Mutant(
        name="least_specific_prefix_wins",
        guard="a tenant's prefix inside another tenant's bucket binds its folders to the other",
        path="fleet_import/tenants/registry.py",
        original="key=lambda pair: len(pair[0]), reverse=True)",
        replacement="key=lambda pair: len(pair[0]), reverse=False)",
        witness=(
            "tests/tenants/test_binding.py"
            "::test_the_most_specific_registered_prefix_owns_the_folder[outer_first]"
        ),
    ),
)


class MutantDoesNotApply(Exception):
    """A mutant's original text is not in its file exactly once: the list is out of date."""


class _Stopped(BaseException):
    """SIGTERM or SIGHUP: unwind like Ctrl-C, so the mutated file is restored."""


@dataclass
class Result:
    """What one mutant's pytest run said."""

    name: str
    file: str
    guard: str
    witness: str
    result: str  # killed | survived | timeout | error
    seconds: float
    first_failure: str | None
    returncode: int | None
    log: str
    clean: str | None = None
    """With --witnesses: the witness unmutated (passed, or why it is no evidence)."""


def check_applies(root: Path, mutant: Mutant) -> bytes:
    """The file's bytes, if the original occurs exactly once; else MutantDoesNotApply."""
    path = root / mutant.path
    if not path.is_file():
        raise MutantDoesNotApply(f"mutant {mutant.name}: {path} does not exist")
    text = path.read_bytes()
    count = text.count(mutant.original.encode())
    if count == 1:
        return text
    hint = ""
    if count == 0 and text.count(mutant.replacement.encode()) == 1:
        hint = f" (it looks applied: restore the file, e.g. `git checkout -- {mutant.path}`)"
    raise MutantDoesNotApply(
        f"mutant {mutant.name}: its original text occurs {count} times in {path}, not once{hint}"
    )


def _drop_bytecode(path: Path) -> None:
    """A stale .pyc must never stand in for the source: remove the module's cached ones."""
    if path.suffix != ".py":
        return
    for cached in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        cached.unlink(missing_ok=True)


@contextmanager
def applied(root: Path, mutant: Mutant) -> Iterator[None]:
    """The mutant in place for the body; the original bytes (and mtime) back afterwards,
    however the body ends."""
    path = root / mutant.path
    original = check_applies(root, mutant)
    stat = path.stat()
    mutated = original.replace(mutant.original.encode(), mutant.replacement.encode(), 1)
    try:
        _drop_bytecode(path)
        path.write_bytes(mutated)
        yield
    finally:
        # No signal may cut the restore short (a second Ctrl-C, a SIGTERM): held till done.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            path.write_bytes(original)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            _drop_bytecode(path)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        if path.read_bytes() != original:
            raise RuntimeError(f"{path} was not restored: check it by hand (mutant {mutant.name})")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End pytest and everything it started (its own session): SIGINT first, so that its
    fixtures tear their servers down, then SIGTERM, then SIGKILL."""
    for sig, wait in ((signal.SIGINT, _GRACE_SECONDS), (signal.SIGTERM, 10.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    proc.wait()


def first_failure(output: str) -> str | None:
    """The first failing test's node id from pytest's short summary (-rfE): FAILED before
    ERROR (an error in a fixture's setup or teardown)."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        match = _SUMMARY_LINE.match(line)
        if match:
            found.setdefault(match.group(1), match.group(2))
    return found.get("FAILED") or found.get("ERROR")


def run_pytest(
    root: Path, pytest_args: Sequence[str], timeout: float, log: Path
) -> tuple[str, int | None, float, str | None]:
    """Run pytest in `root`: (result, returncode, seconds, first failing test)."""
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-rfE"]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, *pytest_args],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            returncode: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            _stop(proc)  # on a timeout, Ctrl-C or SIGTERM; a no-op once it has ended
    seconds = time.monotonic() - started
    output = log.read_text(encoding="utf-8", errors="replace")
    return score(returncode, output), returncode, seconds, first_failure(output)


def score(returncode: int | None, output: str) -> str:
    """What pytest's exit says of the mutant. 0: all passed; 1: some test failed; 2 is also a
    kill when xdist's -x stopped the run at a failed test ("Interrupted: stopping after 1
    failures"). Anything else (2 for collection errors or Ctrl-C, 3 internal error, 4 usage,
    5 nothing collected) says nothing about the mutant."""
    if returncode is None:
        return "timeout"
    stopped_at_a_failure = "Interrupted: stopping after" in output and any(
        line.startswith("FAILED ") for line in output.splitlines()
    )
    if returncode == 2 and stopped_at_a_failure:
        return "killed"
    return {0: "survived", 1: "killed"}.get(returncode, "error")


def check_interpreter(root: Path) -> None:
    """The tests' subprocesses import the package this python's venv points at: it must be
    the checkout under test, or every mutant would be invisible to them."""
    probe = (
        "import importlib.util; spec = importlib.util.find_spec('fleet_import'); "
        "print(spec.origin if spec and spec.origin else '')"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    expected = (root / "fleet_import").resolve()
    if not found or not Path(found).resolve().is_relative_to(expected):
        raise SystemExit(
            f"{sys.executable} imports fleet_import from {found or 'nowhere'}, not from "
            f"{expected}: run the checkout's own venv python ({root}/.venv/bin/python)"
        )


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise _Stopped(signal.Signals(signum).name)


def run(
    root: Path,
    mutants: Sequence[Mutant],
    pytest_args: Sequence[str],
    timeout: float,
    logs: Path,
    *,
    witnesses: bool = False,
) -> list[Result]:
    """Each mutant in turn: applied, pytest run, restored; its result printed as it comes.
    With `witnesses`, pytest runs the mutant's witness (before PYTEST_ARGS), first without
    the mutant: a witness is only evidence if it passes there and fails with the mutant."""
    results = []
    for index, mutant in enumerate(mutants, 1):
        print(f"[{index}/{len(mutants)}] {mutant.name} ({mutant.path}) ...", flush=True)
        args = [mutant.witness, *pytest_args] if witnesses else list(pytest_args)
        clean = None
        if witnesses:
            unmutated = run_pytest(root, args, timeout, logs / f"{mutant.name}.clean.log")[0]
            clean = {"survived": "passed", "killed": "failed"}.get(unmutated, unmutated)
            print(f"    unmutated: {clean}", flush=True)
        log = logs / f"{mutant.name}.log"
        with applied(root, mutant):
            result, returncode, seconds, failure = run_pytest(root, args, timeout, log)
        results.append(
            Result(
                mutant.name,
                mutant.path,
                mutant.guard,
                mutant.witness,
                result,
                round(seconds, 1),
                failure,
                returncode,
                str(log),
                clean,
            )
        )
        print(f"    {result} in {seconds:.0f} s: {failure or '-'}", flush=True)
    return results


def print_table(results: Sequence[Result]) -> None:
    """The run at a glance, and its totals."""
    witnessed = any(r.clean is not None for r in results)
    headers = ("mutant", "result", "seconds", *(("unmutated",) if witnessed else ()))
    rows = [
        (
            r.name,
            r.result,
            f"{r.seconds:.1f}",
            *((r.clean or "-",) if witnessed else ()),
            r.first_failure or "-",
        )
        for r in results
    ]
    headers = (*headers, "first failing test")
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(len(headers) - 1)]
    for row in (headers, *rows):
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]))
    print(totals_line(results))


def totals_line(results: Sequence[Result]) -> str:
    killed = sum(r.result == "killed" for r in results)
    others = {
        kind: count
        for kind in ("survived", "timeout", "error")
        if (count := sum(r.result == kind for r in results))
    }
    extra = "".join(f", {count} {kind}" for kind, count in others.items())
    if unsound := sum(r.clean not in (None, "passed") for r in results):
        extra += f"; {unsound} witnesses did not pass unmutated"
    return f"killed {killed} of {len(results)}{extra}"


def list_mutants(mutants: Sequence[Mutant]) -> None:
    for mutant in mutants:
        print(f"{mutant.name}  ({mutant.path})")
        print(f"    guard:   {mutant.guard}")
        print(f"    witness: {mutant.witness}")


def select(only: str | None) -> list[Mutant]:
    """The mutants `--only` names (comma-separated), in the list's order; all without it."""
    if not only:
        return list(MUTANTS)
    names = [name.strip() for name in only.split(",") if name.strip()]
    known = {mutant.name for mutant in MUTANTS}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"unknown mutants: {', '.join(unknown)} (see --list)")
    return [mutant for mutant in MUTANTS if mutant.name in names]


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our options before `--`, pytest's after it."""
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(
        prog="python -m tests.mutants",
        description="Apply each guard mutant in turn, run pytest, restore (issue 39).",
        epilog="Everything after `--` is passed to pytest (run with -x -q -rfE).",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="the checkout to mutate and test (default: the one holding this file)",
    )
    parser.add_argument("--only", help="comma-separated mutant names (default: all)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--timeout-minutes",
        type=float,
        default=DEFAULT_TIMEOUT_MINUTES,
        help=f"per mutant's pytest run (default {DEFAULT_TIMEOUT_MINUTES:g})",
    )
    parser.add_argument("--log-dir", type=Path, help="pytest's output per mutant (default: tmp)")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument(
        "--witnesses",
        action="store_true",
        help="run each mutant's witness (then PYTEST_ARGS), unmutated and mutated",
    )
    parser.add_argument(
        "--check", action="store_true", help="only check that every original occurs once"
    )
    return parser.parse_args(argv[:split]), argv[split + 1 :]


def main(argv: Sequence[str] | None = None) -> int:
    args, pytest_args = parse(sys.argv[1:] if argv is None else argv)
    mutants = select(args.only)
    if args.list:
        list_mutants(mutants)
        return 0
    root = args.root.resolve()
    try:
        for mutant in mutants:
            check_applies(root, mutant)
    except MutantDoesNotApply as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"all {len(mutants)} mutants apply to {root}")
        return 0
    check_interpreter(root)
    logs = args.log_dir or Path(tempfile.mkdtemp(prefix="fleet-mutants-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"{len(mutants)} mutants on {root}; pytest {' '.join(pytest_args)}; logs in {logs}")
    for sig in _STOP_SIGNALS - {signal.SIGINT}:  # SIGINT raises KeyboardInterrupt already
        signal.signal(sig, _raise_stopped)
    try:
        timeout = args.timeout_minutes * 60
        results = run(root, mutants, pytest_args, timeout, logs, witnesses=args.witnesses)
    except (KeyboardInterrupt, _Stopped) as exc:
        print(f"stopped ({type(exc).__name__} {exc}); the mutated file was restored")
        return 130
    print()
    print_table(results)
    if args.json:
        report = {
            "root": str(root),
            "python": sys.executable,
            "pytest_args": pytest_args,
            "witnesses": args.witnesses,
            "totals": totals_line(results),
            "killed": sum(r.result == "killed" for r in results),
            "total": len(results),
            "results": [asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
