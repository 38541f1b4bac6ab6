"""What `fleet-import batches list / show` print: tables that fit the terminal, and JSON.

A column is left out rather than cut: in 80 columns a list still shows each batch's whole
status, tenant, folder and time (a cut `succee…` or `2026-1…` reads as nothing), and a
wider terminal gains the full id, rows, phase, scope and lease, in that order. Every value
from data is a `Text`, never markup.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console, JustifyMethod, RenderableType
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

from fleet_import.scope import folder_leaf
from fleet_import.store.batch_state import (
    HeldSince,
    ReviewState,
    committed_answer,
    review_line,
    review_state,
    shown_status,
)
from fleet_import.store.details import BatchDetails, Failure, Review
from fleet_import.store.lineage_outbox import LineageRow
from fleet_import.store.models import Batch
from fleet_import.store.outbox import OutboxStep

SHORT_ID_LENGTH = 8  # `batches show` takes it back as a prefix
_STATUS_STYLE = {"succeeded": "green", "failed": "red", "running": "yellow"}
_SHOW_STEP_ERROR = 80
_SHOW_REJECT_VALUE = 40
_UNBOUNDED = 100_000  # measure a table's natural width, not the width it would be given


@dataclass(frozen=True)
class _Column:
    header: str
    cell: Callable[[Batch], Text]
    justify: JustifyMethod = "left"


def _short_id(batch: Batch) -> Text:
    return Text(str(batch.id)[:SHORT_ID_LENGTH])


def _full_id(batch: Batch) -> Text:
    return Text(str(batch.id))


def _status_column(since: Mapping[uuid.UUID, HeldSince]) -> _Column:
    """The status an operator sees (fleet_import.store.batch_state): a held batch by its
    review state, never a bare `failed (held)`."""

    def cell(batch: Batch) -> Text:
        text = shown_status(batch, since.get(batch.id))
        return Text(text, style=_STATUS_STYLE.get(batch.status.value, ""))

    return _Column("status", cell)


def _tenant(batch: Batch) -> Text:
    return Text(batch.tenant_id)


def _scope_or_date(batch: Batch) -> str:
    if batch.source_scope:
        return batch.source_scope
    return str(batch.business_date) if batch.business_date else ""


def _leaf(batch: Batch) -> Text:
    return Text(folder_leaf(batch.source_scope) if batch.source_scope else _scope_or_date(batch))


def _scope(batch: Batch) -> Text:
    return Text(_scope_or_date(batch))


def _phase(batch: Batch) -> Text:
    return Text(batch.record.phase)


def _rows(batch: Batch) -> Text:
    return Text(f"{batch.record.rows:,}")


def _lease(batch: Batch) -> Text:
    return Text(batch.execution_lease_id or "")


def _created(batch: Batch) -> Text:
    return Text(batch.created_at.astimezone(dt.UTC).strftime("%m-%d %H:%M"))


# Columns in display order; None is a column shown only when the terminal is wide enough.
_NARROW: dict[str, _Column | None] = {
    "batch": _Column("batch", _short_id),
    "tenant": _Column("tenant", _tenant),
    "folder": _Column("folder", _leaf),
    "status": None,  # _status_column: it reads what later batches say of a held one
    "phase": None,
    "rows": None,
    "lease": None,
    "created": _Column("created UTC", _created),
}
# What a wider terminal gains, most useful first; each is kept only if the table still fits.
_WIDENINGS: Sequence[tuple[str, _Column]] = (
    ("batch", _Column("batch", _full_id)),
    ("rows", _Column("rows", _rows, "right")),
    ("phase", _Column("phase", _phase)),
    ("folder", _Column("scope", _scope)),
    ("lease", _Column("lease", _lease)),
)


def _table(columns: Iterable[_Column | None], batches: Sequence[Batch]) -> Table:
    # No box: two spaces between columns leave the most room for the values themselves.
    table = Table(box=None, pad_edge=False, header_style="bold")
    shown = [column for column in columns if column is not None]
    for column in shown:
        # Too narrow even for the essential columns: values wrap whole, never end in "…".
        table.add_column(column.header, justify=column.justify, overflow="fold")
    for batch in batches:
        table.add_row(*(column.cell(batch) for column in shown))
    return table


def batches_table(
    batches: Sequence[Batch],
    console: Console,
    since: Mapping[uuid.UUID, HeldSince] | None = None,
) -> Table:
    """The widest layout that fits `console` without wrapping a value."""
    unbounded = console.options.update_width(_UNBOUNDED)
    layout = {**_NARROW, "status": _status_column(since or {})}
    table = _table(layout.values(), batches)
    for name, column in _WIDENINGS:
        wider = _table({**layout, name: column}.values(), batches)
        if Measurement.get(console, unbounded, wider).maximum <= console.width:
            layout[name], table = column, wider
    return table


# -- JSON ---------------------------------------------------------------------------------


def _iso(value: dt.datetime | dt.date | None) -> str | None:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat()
    return None if value is None else value.isoformat()


def batch_record(batch: Batch, since: HeldSince | None = None) -> dict[str, Any]:
    """One batch for `--json`: the same keys for every batch (null when unknown)."""
    record = batch.record
    review = record.review or Review()
    state = review_state(batch, since)
    return {
        "id": str(batch.id),
        "tenant_id": batch.tenant_id,
        "company_id": batch.company_id,
        "source_type": batch.source_type,
        "source_scope": batch.source_scope,
        "business_date": _iso(batch.business_date),
        "delivery_key": batch.delivery_key,
        "status": batch.status.value,
        "failure_kind": record.failure.kind if record.failure is not None else None,
        "shown_status": shown_status(batch, since),
        "review_state": state.value if state is not None else None,
        "review": review_line(batch, since),
        "reviewed_by_batch": review.batch_id,
        "review_note": review.note,
        "committed": committed_answer(batch),
        "phase": record.phase,
        "rows": record.rows,
        "execution_lease_id": batch.execution_lease_id,
        "execution_lease_expires_at": _iso(batch.execution_lease_expires_at),
        "created_at": _iso(batch.created_at),
        "updated_at": _iso(batch.updated_at),
    }


def _step_record(step: OutboxStep) -> dict[str, Any]:
    return {
        "seq": step.seq,
        "step": step.step,
        "status": str(step.status),
        "attempts": step.attempts,
        "claimed_by": step.claimed_by,
        "claimed_until": _iso(step.claimed_until),
        "last_error": step.last_error,
        "available_at": _iso(step.available_at),
        "created_at": _iso(step.created_at),
        "updated_at": _iso(step.updated_at),
    }


def _lineage_record(row: LineageRow) -> dict[str, Any]:
    return {
        "job": row.job_name,
        "run_id": str(row.run_id),
        "event_type": row.event_type,
        "event_time": _iso(row.event_time),
        "status": row.status,
        "attempts": row.attempts,
        "last_error": row.last_error,
        "available_at": _iso(row.available_at),
        "delivered_at": _iso(row.delivered_at),
    }


def batch_detail_record(
    batch: Batch,
    steps: Sequence[OutboxStep],
    lineage: Sequence[LineageRow] = (),
    since: HeldSince | None = None,
) -> dict[str, Any]:
    """`batches show --json`: the list's record plus the details as stored, the steps and
    the OpenLineage events (pending until delivered)."""
    return {
        **batch_record(batch, since),
        "details": batch.details,
        "publication": [_step_record(step) for step in steps],
        "lineage": [_lineage_record(row) for row in lineage],
    }


# -- show ---------------------------------------------------------------------------------


def _failure_text(failure: Failure, *, reviewed: bool = False) -> str:
    from fleet_import.importing.guards import held_error

    # A hold's breaches are in its error already (`--json` has them all, with the content).
    facts = {
        k: v for k, v in failure.to_json().items() if k not in ("kind", "error", "at", "held")
    }
    text = f"{failure.kind}: {held_error(failure, reviewed)}"
    if failure.at:
        text += f" (at {failure.at})"
    return text + "".join(f"; {k}: {_fact_text(v)}" for k, v in facts.items())


def _fact_text(value: object) -> str:
    """A failure's fact as people read it: yes/no, not True/False; JSON, not a Python repr."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping | list):
        return json.dumps(value, default=str)
    return str(value)


def failure_history(
    record: BatchDetails, awaiting: bool | None = None
) -> list[tuple[str, str]]:
    """A batch's failures, resumes and expiry, oldest first. A resume moves `failure` to
    `last_failure`, so the failure that started it all stays visible beside what came of
    the resume (another failure, or the publication expiring)."""
    history: list[tuple[str, str]] = []
    if record.last_failure is not None:
        history.append(("failure before resume", _failure_text(record.last_failure)))
    if record.resumes:
        history.append(("resumes", str(record.resumes)))
    if record.failure is not None:
        # The approve hint only while the batch awaits review (not reviewed, overtaken, stale).
        reviewed = record.review is not None if awaiting is None else not awaiting
        history.append(("failure", _failure_text(record.failure, reviewed=reviewed)))
    if record.publication_expired:
        history.append(("publication expired", "yes: a newer batch owns the slice"))
    return history


def _rows_shown(batch: Batch) -> str:
    """Rows per dataset as committed (`trips 5,003, vehicles 40`), or why there are none."""
    counts = batch.record.row_counts
    if counts:
        return ", ".join(f"{dataset} {int(rows):,}" for dataset, rows in counts.items())
    return "none yet" if batch.status.value == "running" else "none"


def _when(value: dt.datetime | None) -> str:
    """A time as people read it, in UTC to the second (`--json` has the full ISO time)."""
    return "" if value is None else value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _cells(*values: object) -> list[Text]:
    return [Text(str(value)) for value in values]


def _data_table(title: str | Text, *headers: str) -> Table:
    """Values wrap whole in a narrow terminal: an S3 key cut to `s3://fleet-landing/a…`
    names no file."""
    return Table(*(Column(header, overflow="fold") for header in headers), title=title)


def batch_views(
    batch: Batch,
    steps: Sequence[OutboxStep],
    lineage: Sequence[LineageRow] = (),
    since: HeldSince | None = None,
) -> list[RenderableType]:
    """`batches show`: the facts, then publication steps, lineage events, files and first
    rejects."""
    record = batch.record
    facts = Table.grid(padding=(0, 2))
    facts.add_column(no_wrap=True)
    facts.add_column(overflow="fold")  # a long scope or error wraps whole
    for name, value in (
        ("batch", batch.id),
        ("tenant", batch.tenant_id),
        ("scope", batch.source_scope),
        ("delivery", batch.delivery_key),
        ("status", shown_status(batch, since)),
        ("review", review_line(batch, since)),
        ("phase", record.phase),
        ("committed", committed_answer(batch)),
        ("rows", _rows_shown(batch)),
        (
            "lease",
            f"{batch.execution_lease_id} until {_when(batch.execution_lease_expires_at)}"
            if batch.execution_lease_id
            else "free",
        ),
        *failure_history(
            record, review_state(batch, since) in (None, ReviewState.AWAITING)
        ),
        ("superseded by", record.superseded_by),
        ("created", _when(batch.created_at)),
        ("updated", _when(batch.updated_at)),
    ):
        if value is not None:
            facts.add_row(Text(name, style="bold"), Text(str(value)))
    views: list[RenderableType] = [facts]
    if steps:
        outbox = _data_table("publication", "seq", "step", "status", "attempts", "last error")
        for s in steps:
            error = (s.last_error or "")[:_SHOW_STEP_ERROR]
            outbox.add_row(*_cells(s.seq, s.step, s.status, s.attempts, error))
        views.append(outbox)
    if lineage:
        events = _data_table("lineage", "job", "event", "status", "attempts", "last error")
        for e in lineage:
            error = (e.last_error or "")[:_SHOW_STEP_ERROR]
            events.add_row(*_cells(e.job_name, e.event_type, e.status, e.attempts, error))
        views.append(events)
    if record.summary is not None and record.summary.files:
        files = _data_table("files", "file", "dataset", "rows", "rejects", "cache hit")
        for f in record.summary.files:
            hit = "yes" if f.cache_hit else ""
            files.add_row(*_cells(f.key, f.dataset, f"{f.rows:,}", f.rejects, hit))
        views.append(files)
    rejects = record.rejects
    if rejects is not None and rejects.count:
        title = f"first rejects of {rejects.count:,} (all: {rejects.uri})"
        table = _data_table(
            Text(title, style="table.title"), "file", "line", "column", "reason", "value"
        )
        for r in rejects.sample:
            value = str(r.get("value") or "")[:_SHOW_REJECT_VALUE]
            # A record spanning lines names them all: 51-54.
            line = f"{r['line']}-{r['last_line']}" if r.get("last_line") else r["line"]
            table.add_row(*_cells(r["file"], line, r["column"], r["reason"], value))
        views.append(table)
    return views
