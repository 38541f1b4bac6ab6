"""`fleet-import demo`: the real flows end to end on embedded services, nothing configured.

Starts an embedded PostgreSQL (pgserver) and an in-process S3 (moto's server), writes Fleet
deliveries for two tenants with a few bad rows, imports both, reruns one (cache hits),
forces a publication failure and resumes it; then a truncated redelivery of one tenant's
folder is held by the slice guard, approved (loaded from its staged files) and rolled back
to the slice before it (issue #24); then prints batches and slice counts. The Prefect runs
are kept in .fleet-demo/prefect so the UI can show them afterwards.

Everything the demo keeps is under .fleet-demo (its database, Prefect runs, work files), so
a second run finds the first one's batches there: it says so, and `--fresh` deletes that
directory first (issue 40).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

DEMO_HOME = Path(".fleet-demo")
LANDING_BUCKET = "fleet-landing-demo"
STAGING_BUCKET = "fleet-staging-demo"
TENANTS = ("acme", "globex")
# The demo's tenant registry (FLEET_TENANTS): its two tenants, both in the demo's one
# warehouse database, each importing only its own landing folders.
DEMO_TENANTS_YAML = """\
tenants:
  acme:
    company_id: ACME-001
  globex:
    company_id: GLOBEX-042
"""
_FAILING_REFRESH = '["SELECT 1/0 AS refresh_that_fails"]'
# What the demo writes under its home; `--fresh` deletes a home holding nothing else.
_DEMO_ENTRIES = frozenset({"pgdata", "prefect", "work", "tenants.yaml"})
_TRUNCATED_TRIPS = 100
_FULL_ID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


def _start_services(home: Path, say: Callable[[str], None]) -> tuple[str, str, object]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
    from moto.server import ThreadedMotoServer

    say("starting an embedded PostgreSQL (pgserver)...")
    pgdata = (home / "pgdata").resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    database_url = server.get_uri()
    say("starting an in-process S3 (moto server)...")
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "demo"),
        ("AWS_SECRET_ACCESS_KEY", "demo"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        os.environ.setdefault(name, value)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    return database_url, f"http://{host}:{port}", (server, moto)


class NotADemoHome(Exception):
    """`--fresh` was asked to delete a directory that holds more than a demo leaves."""


def fleet_import_command() -> str:
    """The command as this process was started (`.venv/bin/fleet-import` under make demo),
    so a printed command can be pasted as it is."""
    started = Path(sys.argv[0])
    if started.name != "fleet-import":
        return "fleet-import"
    try:
        return str(started.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(started)


def start_clean_hint(home: Path) -> str:
    """How to start the demo clean: said at its end, and when it finds earlier runs."""
    return (
        f"to start clean: {fleet_import_command()} demo --fresh (deletes {home}: the demo's "
        "database, Prefect runs and work files)"
    )


def earlier_runs_note(home: Path) -> str:
    """Said when the demo's database holds batches of earlier runs."""
    return (
        f"{home} holds the batches of earlier demo runs: this run adds its own beside them; "
        + start_clean_hint(home)
    )


def clear_demo_home(home: Path) -> bool:
    """Delete the demo's home (`--fresh`); False when there was none. A directory holding
    anything the demo does not write is refused: `--fresh` deletes the demo's state only."""
    if not home.exists():
        return False
    foreign = sorted(entry.name for entry in home.iterdir() if entry.name not in _DEMO_ENTRIES)
    if not home.is_dir() or foreign:
        raise NotADemoHome(
            f"{home} holds more than the demo writes ({', '.join(foreign) or 'not a directory'})"
            ": not deleted; remove it yourself, or run the demo elsewhere"
        )
    shutil.rmtree(home)
    return True


def run_demo(home: Path = DEMO_HOME, *, fresh: bool = False) -> int:
    console = Console()
    started = time.monotonic()

    def say(message: str | Text) -> None:
        # Text: state messages and folders are printed as they are, never as rich markup.
        # soft_wrap: a long result line is left to the terminal, never cut inside a scope.
        console.print(
            Text.assemble((f"{time.monotonic() - started:5.1f}s", "dim"), " ", message),
            soft_wrap=True,
        )

    home = home.resolve()
    if fresh:
        try:
            cleared = clear_demo_home(home)
        except NotADemoHome as exc:
            Console(stderr=True).print(Text.assemble(("error:", "red"), f" {exc}"), soft_wrap=True)
            return 1
        if cleared:
            say(f"deleted {home} (--fresh): starting clean")
    # The demo narrates; Prefect's run logs and the S3 server's request lines would bury it.
    # Only the terminal is quieted (Prefect's console handler): the run logs still go to the
    # API at their level, so each run's Logs tab in the UI shows its batch's lines.
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # The local API's first start migrates a new database: tens of seconds on a busy 2-core
    # machine, past Prefect's default wait of 20 s.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    # The embedded server's build has no lz4 for a replace's WAL (the writer says so once):
    # a fact about pgserver's wheel, not about the import the demo shows.
    logging.getLogger("fleet_import.warehouse.postgres.writer").setLevel(logging.ERROR)
    database_url, endpoint, services = _start_services(home, say)
    registry = home / "tenants.yaml"
    registry.write_text(DEMO_TENANTS_YAML, encoding="utf-8")
    os.environ.update(
        FLEET_TENANTS=str(registry),
        FLEET_DATABASE_URL=database_url,
        FLEET_S3_ENDPOINT_URL=endpoint,
        FLEET_STAGING_URI=f"s3://{STAGING_BUCKET}/stage/",
        FLEET_WORKDIR=str(home / "work"),
        PREFECT_HOME=str(home / "prefect"),
    )
    os.environ.pop("PREFECT_API_URL", None)  # the runs go to the demo's own local API

    from fleet_import.contracts.fleet import FLEET_DATASETS
    from fleet_import.s3.client import s3_client
    from fleet_import.sample_data import fleet_delivery, today_folder, with_manifest
    from fleet_import.scope import split_folder
    from fleet_import.store import migrate
    from fleet_import.store.repository import BatchRepository
    from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse

    say("migrating the operational database and creating the curated tables...")
    migrate.upgrade(database_url)
    PostgresWarehouse(database_url).ensure_tables(FLEET_DATASETS.values())
    repo = BatchRepository(database_url)
    earlier = repo.list(limit=1)  # batches of earlier demo runs, kept in its database
    if earlier:
        say(Text(earlier_runs_note(home)))
    s3 = s3_client(endpoint)
    for bucket in (LANDING_BUCKET, STAGING_BUCKET):
        s3.create_bucket(Bucket=bucket)
    folders = {}
    for index, tenant in enumerate(TENANTS):
        folder = today_folder(LANDING_BUCKET, tenant)
        bucket, prefix = split_folder(folder)
        files = fleet_delivery(trips=5_000 * (index + 1), fuel=800, vehicles=40, bad_rows=True)
        if index == 0:  # one tenant sends its delivery manifest: every import verifies it
            files = with_manifest(files, folder)
        for name, data in files.items():
            s3.put_object(Bucket=bucket, Key=prefix + name, Body=data)
        folders[tenant] = folder
        say(f"wrote {len(files)} files for {tenant} to {folder} (3 bad trip rows)")

    from flows.import_s3_folder import import_s3_folder
    from flows.resume_publication import resume_publication

    def show(label: str, state) -> None:
        # Batch ids as the 8-digit prefixes `batches show` takes: a line stays readable.
        message = _FULL_ID.sub(lambda m: m[0][:8], state.message or "")
        colour = "green" if state.is_completed() else "red"
        say(Text.assemble(f"{label}: ", (state.name, colour), " ", message))

    say("starting a local Prefect API (first start takes a few seconds)...")
    _create_load_limits(say)
    for tenant, folder in folders.items():
        show(
            f"import {tenant}", import_s3_folder(tenant_id=tenant, folder=folder, return_state=True)
        )
    show(
        "rerun acme, unchanged (the slice holds it already: nothing to do)",
        import_s3_folder(tenant_id="acme", folder=folders["acme"], return_state=True),
    )
    show(
        "rerun acme, forced (unchanged files: every one a cache hit)",
        import_s3_folder(tenant_id="acme", folder=folders["acme"], force=True, return_state=True),
    )

    os.environ["FLEET_REFRESH_SQL"] = _FAILING_REFRESH
    with _quiet("fleet_import.publication.publisher"):
        failed = import_s3_folder(
            tenant_id="globex", folder=folders["globex"], force=True, return_state=True
        )
    show("globex with a failing refresh_dependants step", failed)
    os.environ["FLEET_REFRESH_SQL"] = "[]"
    to_resume = next(b for b in repo.list(tenant="globex", status="failed"))
    show(
        f"resume batch {to_resume.id}",
        resume_publication(batch_id=str(to_resume.id), return_state=True),
    )
    _review_and_rollback(s3, repo, folders["globex"], say, show)
    since = earlier[0].created_at if earlier else None
    _print_tables(console, repo, PostgresWarehouse(database_url), folders, since)
    console.print(
        f"\nDone in {time.monotonic() - started:.0f}s. To see the runs in the Prefect UI:\n"
        f"  PREFECT_HOME={home / 'prefect'} .venv/bin/prefect server start\n"
        "then open http://127.0.0.1:4200/runs\n"
        f"The demo keeps its state in {home}; {start_clean_hint(home)}",
        soft_wrap=True,  # a command cut across two lines cannot be pasted
    )
    moto = services[1]  # type: ignore[index]
    moto.stop()  # type: ignore[attr-defined]
    return 0


def _review_and_rollback(
    s3, repo, folder: str, say: Callable[[str | Text], None], show: Callable[..., None]
) -> None:
    """Issue #24 told: a truncated redelivery is held with both counts and the command that
    approves it, the approval loads the held content from its staged files, and a rollback
    restores the slice the approval replaced."""
    from fleet_import.importing.guards import Breach, approve_command
    from fleet_import.sample_data import csv_bytes, trips_table
    from fleet_import.scope import split_folder
    from fleet_import.store.batch_state import hold_of
    from flows.approve_held_batch import approve_held_batch
    from flows.import_s3_folder import import_s3_folder
    from flows.rollback_slice import rollback_slice

    bucket, prefix = split_folder(folder)
    for name in ("trips-1.csv", "trips-2.csv.gz"):
        s3.delete_object(Bucket=bucket, Key=prefix + name)
    truncated = csv_bytes(trips_table(_TRUNCATED_TRIPS, vehicles=40))
    s3.put_object(Bucket=bucket, Key=prefix + "trips-1.csv", Body=truncated)
    say(f"redelivered globex's trips truncated to {_TRUNCATED_TRIPS} rows")
    # The next lines narrate the hold, not the guard's warning (a hold is no error: the
    # commit task returns it, so the engine logs none).
    with _quiet("fleet_import.importing.guards", level=logging.CRITICAL):
        held = import_s3_folder(tenant_id="globex", folder=folder, return_state=True)
    say(Text.assemble("import globex, truncated: ", (held.name, "yellow"), " (exit code 6)"))
    (batch,) = [b for b in repo.list(tenant="globex", status="failed") if _waits(b)]
    facts = hold_of(batch)
    for breach in facts.breaches if facts is not None else []:
        say(f"  held {Breach(**breach).describe()}")
    say(f"  to load it anyway: {approve_command(batch.id)}")
    show(
        f"approve {str(batch.id)[:8]} (staged files)",
        approve_held_batch(batch_id=str(batch.id), return_state=True),
    )
    show(
        "rollback globex",
        rollback_slice(tenant_id="globex", folder=folder, return_state=True),
    )


def _waits(batch) -> bool:
    """Held for review and not decided yet (fleet_import.store.batch_state decides)."""
    from fleet_import.store.batch_state import ReviewState, review_state

    return review_state(batch) is ReviewState.AWAITING


@contextlib.contextmanager
def _quiet(*logger_names: str, level: int = logging.ERROR) -> Iterator[None]:
    """The failure is the point here, and the demo's next lines narrate it: what these
    loggers say below `level` about it is not."""
    loggers = [logging.getLogger(name) for name in logger_names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, previous in zip(loggers, levels, strict=True):
            logger.setLevel(previous)


def _create_load_limits(say: Callable[[str], None]) -> None:
    """The load limits a first load would create, made here and said in one progress line,
    so that no flow has to create (and log) them."""
    from blocks.limits import WAREHOUSE_LOADS_LIMIT, ensure_limit, tenant_limit
    from fleet_import.config import Settings

    settings = Settings()
    sizes = {WAREHOUSE_LOADS_LIMIT: settings.warehouse_load_slots}
    sizes.update({tenant_limit(t): settings.tenant_load_slots for t in TENANTS})
    created = [f"{n} ({size})" for n, size in sizes.items() if size and ensure_limit(n, size)]
    if created:
        say(f"created the load concurrency limits (slots): {', '.join(created)}")


def _print_tables(
    console: Console, repo, warehouse, folders: dict[str, str], since=None
) -> None:
    """This run's batches (those after `since`, the newest of earlier runs), and the slices."""
    batches = Table(
        "batch",
        "tenant",
        "status",
        "phase",
        "rows",
        "rejects",
        "cache hits",
        title="ingestion_batches" + (" (this run's; earlier runs' left out)" if since else ""),
    )
    from fleet_import.store.batch_state import shown_status

    this_run = [b for b in repo.list(limit=20) if since is None or b.created_at > since]
    for batch in reversed(this_run):
        record = batch.record
        batches.add_row(
            str(batch.id)[:8],
            batch.tenant_id,
            shown_status(batch),
            record.phase,
            f"{record.rows:,}",
            str(record.reject_count),
            str(record.summary.cache_hits) if record.summary is not None else "",
        )
    console.print(batches)
    slices = Table(
        "tenant",
        "scope",
        "owner batch",
        "vehicles",
        "trips",
        "fuel_transactions",
        title="curated slices",
    )
    for tenant, folder in folders.items():
        from fleet_import.scope import source_scope

        scope = source_scope(folder)
        counts = warehouse.slice_counts(tenant, scope)
        owner = warehouse.slice_owner(tenant, scope)
        slices.add_row(
            tenant,
            scope,
            str(owner)[:8],
            *(f"{counts.get(d, 0):,}" for d in ("vehicles", "trips", "fuel_transactions")),
        )
    console.print(slices)
