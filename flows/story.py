"""A batch's story in the Prefect UI, told by whichever flow changes the batch.

`batch-<id>` (markdown) says what the batch is now: running, committed, succeeded, failed,
resumed, superseded or expired, with the run that made it and the run that changed it
last. Artifacts of one key form one history across runs, so its latest version is the
batch's truth; each version is also attached to the run that made the batch, so that
run's page shows, say, the resume that finished it. `tenant-<tenant>-batches` (a table)
lists the tenant's recent batches. A `fleet.batch.updated` event, related to the run that
made the batch, marks each change. None of it may fail a flow: the batch row is the truth,
these are views of it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactCreate
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.events import emit_event
from prefect.runtime import flow_run

from fleet_import.importing.gate_results import GateResult
from fleet_import.importing.guards import Breach, approve_command, held_error
from fleet_import.importing.runtime import Runtime
from fleet_import.scope import folder_leaf
from fleet_import.store.batch_state import (
    HeldSince,
    ReviewState,
    hold_of,
    is_held,
    review_line,
    review_state,
    shown_status,
)
from fleet_import.store.models import Batch, BatchStatus
from fleet_import.store.review_repository import ReviewRepository
from flows.api_reports import report
from flows.reporting import escape_markdown

log = logging.getLogger(__name__)

TENANT_BATCHES_SHOWN = 20
_SHORT_ID = 8


def story_key(batch_id: uuid.UUID) -> str:
    return f"batch-{batch_id}"


def tenant_key(tenant_id: str) -> str:
    """Artifact keys take lower-case letters, digits and dashes; tenant slugs may hold '_'."""
    return f"tenant-{tenant_id.replace('_', '-')}-batches"


def made_by(batch: Batch) -> uuid.UUID | None:
    """The flow run that made the batch (recorded when the import flow claims it)."""
    raw = batch.record.flow_run_id
    try:
        return uuid.UUID(str(raw)) if raw else None
    except ValueError:
        return None


def tell(rt: Runtime, batch_ids: Iterable[uuid.UUID], *, tenant_tables: bool = True) -> None:
    """Publish each batch's story, and the stories of the failed batches each one
    superseded, then each tenant's table (unless the caller tells the tenants once for
    many batches: a bulk import, `tell_tenants`). Never raises."""
    ids = list(dict.fromkeys(batch_ids))
    try:  # an API gone: dropped, once noted (api_reports.report)
        report(f"the story of batches {ids}", lambda: _tell(rt, ids, tenant_tables))
    except Exception as exc:  # noqa: BLE001 - a view of the batch never fails the flow
        log.warning("could not publish the story of batches %s: %s", ids, exc)


def tell_tenants(rt: Runtime, tenant_ids: Iterable[str]) -> None:
    """Publish each tenant's table of recent batches once. Never raises."""
    tenants = list(dict.fromkeys(tenant_ids))

    def publish() -> None:
        for tenant_id in tenants:
            _publish_tenant_table(rt, tenant_id)

    try:
        report(f"the batch tables of tenants {tenants}", publish)
    except Exception as exc:  # noqa: BLE001 - a view of the batches never fails the flow
        log.warning("could not publish the batch tables of %s: %s", tenants, exc)


def _tell(rt: Runtime, batch_ids: list[uuid.UUID], tenant_tables: bool = True) -> None:
    batches = [b for b in (rt.ctx.repo.get(batch_id) for batch_id in batch_ids) if b]
    told = {b.id for b in batches}
    for batch in [b for b in batches if b.status is BatchStatus.SUCCEEDED]:
        for older in rt.ctx.repo.list(tenant=batch.tenant_id, status=BatchStatus.FAILED):
            if older.record.superseded_by == str(batch.id) and older.id not in told:
                batches.append(older)
                told.add(older.id)
    runs = _run_names({run for b in batches if (run := made_by(b))} | _this_run())
    held = [b.id for b in batches if is_held(b)]
    since = ReviewRepository.from_settings(rt.settings).held_since(held) if held else {}
    for batch in batches:
        _publish_story(batch, runs, since.get(batch.id))
    if not tenant_tables:
        return
    for tenant_id in dict.fromkeys(b.tenant_id for b in batches):
        _publish_tenant_table(rt, tenant_id)


def _this_run() -> set[uuid.UUID]:
    run_id = flow_run.get_id()
    return {uuid.UUID(run_id)} if run_id else set()


def _run_names(ids: set[uuid.UUID]) -> dict[uuid.UUID, str]:
    """Each run's name; this run's from its own context (no API call: a tiny delivery tells
    its story three times, each would ask the server for the name it already has)."""
    names: dict[uuid.UUID, str] = {}
    this, name = _this_run(), flow_run.get_name()
    if this and name:
        names[next(iter(this))] = name
    others = ids - set(names)
    if not others:
        return names
    with get_client(sync_client=True) as client:
        found = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=others))
        )
    return {**{run.id: run.name for run in found}, **names}


def run_link(run_id: uuid.UUID, names: dict[uuid.UUID, str]) -> str:
    """A markdown link to the run's page (relative: the UI serves the artifact)."""
    name = escape_markdown(names.get(run_id, str(run_id)))
    return f"[{name}](/runs/flow-run/{run_id})"


def story_markdown(
    batch: Batch, runs: dict[uuid.UUID, str], since: HeldSince | None = None
) -> str:
    record = batch.record
    status = shown_status(batch, since)
    lines = [f"# batch {batch.id}: {escape_markdown(status)}", ""]
    facts: list[tuple[str, str]] = [
        ("tenant", escape_markdown(batch.tenant_id)),
        ("delivery", escape_markdown(batch.source_scope or batch.business_date or "")),
    ]
    counts = record.row_counts
    if counts:
        facts.append(("rows", ", ".join(f"{n:,} {escape_markdown(d)}" for d, n in counts.items())))
    facts.append(("rejects", f"{record.reject_count:,}"))
    origin = made_by(batch)
    if origin:
        facts.append(("made by", run_link(origin, runs)))
    this_run = next(iter(_this_run()), None)
    if this_run and this_run != origin:
        facts.append((f"{status} by", run_link(this_run, runs)))
    failure = record.failure or record.last_failure
    if failure is not None:
        label = "failure" if record.failure else "failure before the resume"
        awaiting = review_state(batch, since) in (None, ReviewState.AWAITING)
        cause = f"{failure.kind}: {held_error(failure, not awaiting)}"
        facts.append((label, escape_markdown(cause)))
    facts += held_facts(batch, since)
    facts += drift_facts(batch)
    if record.resumes:
        facts.append(("resumes", str(record.resumes)))
    if record.superseded_by:
        facts.append(("superseded by", f"batch {escape_markdown(record.superseded_by)}"))
    facts.append(("updated", batch.updated_at.isoformat(timespec="seconds")))
    lines += [f"- **{label}**: {value}" for label, value in facts]
    return "\n".join(lines)


def held_facts(batch: Batch, since: HeldSince | None = None) -> list[tuple[str, str]]:
    """A held batch's breaches, its review state (awaiting with the command that approves
    it, approved, rejected, overtaken, stale: fleet_import.store.batch_state), what an
    approval or rollback loaded. Markdown-escaped."""
    record = batch.record
    facts: list[tuple[str, str]] = []
    hold = hold_of(batch)
    for breach in hold.breaches if hold is not None else []:
        facts.append(
            (f"held: {escape_markdown(breach['dataset'])}", escape_markdown(
                Breach(**breach).describe()))
        )
    for result in hold.gate if hold is not None else []:  # the content gate's errors
        described = GateResult.from_json(result).describe()
        facts.append((f"held: {escape_markdown(result['dataset'])}", escape_markdown(described)))
    state = review_state(batch, since)
    if state is ReviewState.AWAITING:
        facts.append(("approve", f"`{approve_command(batch.id)}`"))
    elif state is not None:
        facts.append(("review", escape_markdown(review_line(batch, since) or "")))
    if record.approves:
        facts.append(("approves", f"held batch {escape_markdown(record.approves)}"))
    if record.rolled_back_to:
        facts.append(("rolled back to", f"batch {escape_markdown(record.rolled_back_to)}"))
    return facts


_DRIFT_WORDS = {
    "ignore": "not loaded (ignore)",
    "evolve": "added to the table (evolve)",
    "review": "added to the table on approval (review)",
}


def drift_facts(batch: Batch) -> list[tuple[str, str]]:
    """The columns the delivery held beyond its contracts (issue #25), per dataset: not
    loaded, added, or waiting for review. Markdown-escaped."""
    facts = []
    for dataset, found in batch.record.drift.items():
        columns = ", ".join(f"{name} {kind}" for name, kind in found.get("columns", {}).items())
        policy = str(found.get("policy"))
        facts.append(
            (
                f"new columns: {escape_markdown(dataset)}",
                f"{escape_markdown(columns)}, {_DRIFT_WORDS.get(policy, escape_markdown(policy))}",
            )
        )
    hold = hold_of(batch)
    for dataset, columns in (hold.drift if hold is not None else {}).items():
        spelled = ", ".join(f"{name} {kind}" for name, kind in columns.items())
        facts.append(
            (
                f"held: {escape_markdown(dataset)}",
                f"new columns {escape_markdown(spelled)} (review)",
            )
        )
    return facts


def _publish_story(
    batch: Batch, runs: dict[uuid.UUID, str], since: HeldSince | None = None
) -> None:
    markdown = story_markdown(batch, runs, since)
    description = f"batch {batch.id} of {batch.tenant_id}: {shown_status(batch, since)}"
    origin = made_by(batch)
    if origin and origin not in _this_run() and origin in runs:
        # The made-it run's page shows the news too, not only this run's.
        with get_client(sync_client=True) as client:
            client.create_artifact(
                ArtifactCreate(
                    key=story_key(batch.id),
                    type="markdown",
                    data=markdown,
                    description=description,
                    flow_run_id=origin,
                )
            )
    create_markdown_artifact(markdown, key=story_key(batch.id), description=description)
    related = []
    if origin:
        related.append(
            {
                "prefect.resource.id": f"prefect.flow-run.{origin}",
                "prefect.resource.role": "flow-run",
                "prefect.resource.name": runs.get(origin, str(origin)),
            }
        )
    emit_event(
        event="fleet.batch.updated",
        resource={
            "prefect.resource.id": f"fleet.batch.{batch.id}",
            "prefect.resource.name": f"batch {batch.id}",
            "fleet.tenant": batch.tenant_id,
        },
        related=related,
        payload={"status": shown_status(batch, since), "made_by_flow_run": str(origin or "")},
    )


def _publish_tenant_table(rt: Runtime, tenant_id: str) -> None:
    batches = rt.ctx.repo.list(tenant=tenant_id, limit=TENANT_BATCHES_SHOWN)
    runs = _run_names({run for b in batches if (run := made_by(b))})
    held = [b.id for b in batches if is_held(b)]
    since = ReviewRepository.from_settings(rt.settings).held_since(held) if held else {}
    owners: dict[str, uuid.UUID | None] = {}
    rows = []
    for batch in batches:
        scope = batch.source_scope or ""
        if scope and scope not in owners:
            owners[scope] = rt.ctx.warehouse.slice_owner(tenant_id, scope)
        owner = owners.get(scope)
        run = made_by(batch)
        rows.append(
            {
                "batch": str(batch.id),
                "status": shown_status(batch, since.get(batch.id)),
                "delivery": folder_leaf(scope),
                "rows": batch.record.rows,
                "held": _held_counts(batch),
                "to approve": _approve_command(batch, since.get(batch.id)),
                "rejects": batch.record.reject_count,
                "owns slice": _owns(batch, owner),
                "run": f"{runs.get(run, '')} ({run})" if run else "",
                "updated": batch.updated_at.isoformat(timespec="seconds"),
            }
        )
    create_table_artifact(
        rows, key=tenant_key(tenant_id), description=f"recent batches of {tenant_id}"
    )


def _held_counts(batch: Batch) -> str:
    """Each breach a guard held the batch for, as `Breach.describe` says it (a manifest's
    declared count is not called the current slice's); empty for other batches."""
    hold = hold_of(batch)
    if hold is None:
        return ""
    told = [Breach(**b).describe() for b in hold.breaches]
    told += [GateResult.from_json(r).describe() for r in hold.gate]
    return "; ".join(told)


def _approve_command(batch: Batch, since: HeldSince | None) -> str:
    """The command that approves a batch still waiting for review (empty otherwise)."""
    if review_state(batch, since) is not ReviewState.AWAITING:
        return ""
    return approve_command(batch.id)


def _owns(batch: Batch, owner: uuid.UUID | None) -> str:
    if owner == batch.id:
        return "yes"
    return f"no: batch {str(owner)[:_SHORT_ID]}" if owner else "no"
