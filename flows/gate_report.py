"""The content gate's Prefect artifact per batch (issue 49): each check and drift rule with
its outcome, figure and threshold, then the profile beside the replaced slice's, as tables a
person reads in ten seconds. What `fleet-import gate show` prints, for the UI."""

from __future__ import annotations

import uuid

from prefect.artifacts import create_markdown_artifact

from fleet_import.importing.gate_results import GateResult, GateView, gate_view, profile_rows
from fleet_import.importing.runtime import Runtime
from fleet_import.store.models import Batch
from flows.reporting import escape_markdown


def gate_key(batch_id: uuid.UUID) -> str:
    return f"batch-gate-{batch_id}"


def gate_markdown(batch_id: uuid.UUID, view: GateView) -> str:
    if view.skipped:
        return f"# content gate of batch {batch_id}: skipped ({escape_markdown(view.skipped)})"
    outcomes = {gate.outcome for gate in view.gates}
    worst = next((o for o in ("error", "waived", "warn") if o in outcomes), "pass")
    lines = [f"# content gate of batch {batch_id}: {worst}"]
    for gate in view.gates:
        base = view.baselines.get(gate.dataset)
        against = f"compared with batch {gate.baseline_batch_id}" if base else "first load"
        before = f"{base['rows']:,} -> " if base else ""
        lines += [
            "",
            f"## {escape_markdown(gate.dataset)}: {gate.outcome}, "
            f"{before}{gate.profile['rows']:,} rows ({against})",
            "",
            "| outcome | check | figure | threshold | failing rows |",
            "| --- | --- | --- | --- | --- |",
        ]
        for raw in gate.results:
            r = GateResult.from_json(raw)
            cells = (r.outcome, r.check, r.figure or r.detail, r.threshold, r.failing_uri or "")
            lines.append("| " + " | ".join(escape_markdown(c) for c in cells) + " |")
        table = profile_rows(gate.profile, base)
        if table:
            lines += ["", "| " + " | ".join(table[0]) + " |", "|" + " --- |" * len(table[0])]
            for row in table:
                lines.append("| " + " | ".join(escape_markdown(v) for v in row.values()) + " |")
    return "\n".join(lines)


def publish_gate_artifact(rt: Runtime, batch: Batch) -> None:
    """The batch's gate, from the store the run's context keeps it in (none: nothing)."""
    if rt.ctx.gates is None:
        return
    batch_id = batch.id
    view = gate_view(rt.ctx.gates, batch)
    if view.gates or view.skipped:
        create_markdown_artifact(
            gate_markdown(batch_id, view),
            key=gate_key(batch_id),
            description=f"content gate of batch {batch_id}",
        )
