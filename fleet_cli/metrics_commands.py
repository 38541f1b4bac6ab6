"""`fleet-import metrics serve` (the Prometheus endpoint over the operational store) and
`fleet-import costs` (what each tenant's committed slices cost, by our own timings)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fleet_cli.freshness import parse_moment
from fleet_cli.guard import error_line, foreseen_errors, require_settings
from fleet_import.checks.settings import OPERATIONAL, Uses

if TYPE_CHECKING:
    from fleet_import.config import Settings
    from fleet_import.store.metrics_repository import TenantCost

COSTS_WITH_WAREHOUSE = OPERATIONAL | {Uses.WAREHOUSE}

_console = Console()
_JOIN_SECONDS = 1.0
"""How long stopping waits for the endpoint's thread."""

MetricsPortOption = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        envvar="FLEET_METRICS_PORT",
        show_envvar=True,
        help="also serve the fleet's metrics on this port (what `fleet-import metrics serve`"
        " serves)",
    ),
]


@contextmanager
def serving_metrics(
    port: int | None, addr: str = "0.0.0.0", option: str = "--metrics-port"
) -> Iterator[int | None]:
    """The metrics endpoint while the block runs (`metrics serve`, or beside the relay or a
    worker), when `port` is given: the port it listens on, or None. A port that cannot be
    bound is one line naming `option`, exit 1."""
    if port is None:
        yield None
        return
    from fleet_import.monitoring.endpoint import start_endpoint, store_collector

    settings = require_settings(OPERATIONAL)
    with foreseen_errors():
        collector = store_collector(settings)
    try:
        server, thread = start_endpoint(collector, port, addr)
    except OSError as exc:
        error_line(f"cannot listen on {addr}:{port}: {exc.strerror}: choose another {option}")
        raise typer.Exit(1) from None
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(_JOIN_SECONDS)


metrics_app = typer.Typer(
    no_args_is_help=True,
    help="The fleet's metrics for Prometheus: `fleet-import metrics serve --port 9464`.",
)


@metrics_app.command("serve")
def serve(
    port: Annotated[int, typer.Option("--port", help="TCP port to listen on")] = 9464,
    addr: Annotated[str, typer.Option("--addr", help="address to listen on")] = "0.0.0.0",
) -> None:
    """Serve /metrics: batches by status and phase, held batches, failed publications,
    expired leases, delivery-to-publish latency, rows, timings, freshness, read from the
    operational store at each scrape (docs/operating.md, "Metrics, alerts and costs").

    Runs until stopped (Ctrl-C, SIGTERM). Exit codes: 1 the port cannot be bound;
    78 a bad setting.

    Example: fleet-import metrics serve --port 9464
    """
    with serving_metrics(port, addr, option="--port") as bound:
        typer.echo(f"serving the fleet's metrics on http://{addr}:{bound}/metrics")
        with suppress(KeyboardInterrupt):
            threading.Event().wait()


def costs(
    tenant: Annotated[str | None, typer.Option("--tenant", help="one tenant only")] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="batches created from this time on (ISO 8601)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON and nothing else")] = False,
    warehouse_seconds: Annotated[
        bool,
        typer.Option(
            "--warehouse-seconds",
            help="also Redshift's own seconds per tenant, from SYS_QUERY_HISTORY (Redshift only)",
        ),
    ] = False,
) -> None:
    """What each tenant's committed slices cost: batches, rows loaded and rejected, bytes
    of normalized Parquet staged, and seconds in COPY, in COMMIT and in the whole load, by
    our own timings. On Redshift every statement of a batch also runs under query_group =
    its batch id, so SYS_QUERY_HISTORY attributes the cluster's own seconds (query_label):
    --warehouse-seconds adds them (the history Redshift keeps: days, not months).

    Exit codes: 0 the table; 1 the store or the warehouse failed; 2 a bad --since, or
    --warehouse-seconds on PostgreSQL; 78 a bad setting.

    Example: fleet-import costs --since 2026-07-01 --json
    """
    from fleet_import.store.metrics_repository import MetricsRepository

    moment = parse_moment(since, "--since") if since is not None else None
    settings = require_settings(COSTS_WITH_WAREHOUSE if warehouse_seconds else OPERATIONAL)
    if warehouse_seconds and settings.warehouse != "redshift":
        error_line(
            "--warehouse-seconds reads Redshift's SYS_QUERY_HISTORY: FLEET_WAREHOUSE is "
            f"{settings.warehouse}, where the COPY and COMMIT seconds are the cost; drop it"
        )
        raise typer.Exit(2)
    with foreseen_errors():
        found = MetricsRepository.from_settings(settings).costs(tenant, moment)
        on_cluster = _cluster_seconds(settings, found) if warehouse_seconds else None
    if as_json:
        typer.echo(json.dumps([_record(cost, on_cluster) for cost in found], indent=2))
        return
    if not found:
        _console.print("no committed slice" + (f" of tenant {tenant}" if tenant else "")
                       + (f" since {since}" if since else ""))
        return
    table = Table(
        "tenant", "batches", "rows", "rejected", "staged", "COPY s", "COMMIT s", "load s",
        *(["Redshift s"] if on_cluster is not None else []),
        title="cost per tenant (committed slices" + (f" since {since}" if since else "") + ")",
    )
    for cost in found:
        cluster = [f"{on_cluster[cost.tenant_id]:,.1f}"] if on_cluster is not None else []
        table.add_row(
            Text(cost.tenant_id),
            f"{cost.batches:,}",
            f"{cost.rows:,}",
            f"{cost.rejected:,}",
            _size(cost.staged_bytes),
            f"{cost.copy_seconds:,.1f}",
            f"{cost.commit_seconds:,.1f}",
            f"{cost.load_seconds:,.1f}",
            *cluster,
        )
    _console.print(table)


def _cluster_seconds(settings: Settings, found: list[TenantCost]) -> dict[str, float]:
    """Redshift's own seconds per tenant: its batches' query groups in SYS_QUERY_HISTORY,
    read in the shared database (the loading user's queries in every database)."""
    from fleet_import.importing.runtime import warehouse_of
    from fleet_import.s3.client import settings_s3_client

    # The client is the staging area's, which reading the history never uses.
    warehouse = warehouse_of(settings, settings_s3_client(settings), None)
    by_batch = warehouse.query_seconds([b for cost in found for b in cost.batch_ids])
    return {
        cost.tenant_id: sum(by_batch.get(batch_id, 0.0) for batch_id in cost.batch_ids)
        for cost in found
    }


def _record(cost: TenantCost, on_cluster: dict[str, float] | None) -> dict[str, object]:
    return {
        "tenant_id": cost.tenant_id,
        "batches": cost.batches,
        "rows": cost.rows,
        "rejected": cost.rejected,
        "staged_bytes": cost.staged_bytes,
        "copy_seconds": round(cost.copy_seconds, 3),
        "commit_seconds": round(cost.commit_seconds, 3),
        "load_seconds": round(cost.load_seconds, 3),
        **({"redshift_seconds": round(on_cluster[cost.tenant_id], 3)} if on_cluster else {}),
    }


def _size(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1024
    return str(count)
