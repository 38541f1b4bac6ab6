"""How outcomes look in the Prefect UI: final states and artifacts."""

from __future__ import annotations

import uuid

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.states import Completed, Failed, State

from fleet_import import pipeline
from fleet_import.runtime import Runtime

_REJECTS_SHOWN = 20


def state_for(outcome: pipeline.ImportOutcome) -> State:
    if isinstance(outcome, pipeline.Committed):
        rows = ", ".join(f"{n:,} {dataset}" for dataset, n in outcome.row_counts.items())
        if outcome.published:
            return Completed(message=f"batch {outcome.batch_id} succeeded: {rows}")
        return Completed(
            name="Committed",
            message=f"batch {outcome.batch_id} committed ({rows}); a drain finishes publication",
        )
    if isinstance(outcome, pipeline.Failed):
        hint = (
            f" (resumable: fleet-import resume {outcome.batch_id})"
            if outcome.kind == "failed_publication" and "expired" not in outcome.error
            else ""
        )
        return Failed(message=f"{outcome.kind}{hint}: {outcome.error}")
    if isinstance(outcome, pipeline.NotClaimed):
        message = f"batch {outcome.batch_id} is executed by {outcome.holder}"
        return Completed(name="NotClaimed", message=message)
    if isinstance(outcome, pipeline.Skipped):
        message = f"{outcome.scope} is held by batch {outcome.holder_batch_id}; skipped"
        return Completed(name="Skipped", message=message)
    if isinstance(outcome, pipeline.NothingToDo):
        message = f"batch {outcome.batch_id} is already {outcome.status}: nothing to do"
        return Completed(name="Skipped", message=message)
    raise TypeError(f"unexpected outcome {outcome!r}")


def publish_artifacts(rt: Runtime, batch_id: uuid.UUID) -> None:
    """The batch summary as a table and the first rejects as markdown, on the flow run."""
    batch = rt.ctx.repo.get(batch_id)
    if batch is None:
        return
    details = batch.details
    summary = details.get("summary", {})
    rows = [
        {
            "file": f["key"],
            "dataset": f["dataset"],
            "rows": f["rows"],
            "rejects": f["rejects"],
            "cache hit": f["cache_hit"],
            "seconds": f["seconds"],
        }
        for f in summary.get("files", [])
    ]
    rows.append(
        {
            "file": f"batch {batch_id} ({batch.status})",
            "dataset": "all",
            "rows": sum(details.get("row_counts", {}).values()),
            "rejects": (details.get("rejects") or {}).get("count", 0),
            "cache hit": summary.get("cache_hits", 0),
            "seconds": (summary.get("seconds") or {}).get("commit", ""),
        }
    )
    create_table_artifact(rows, key="batch-summary", description=f"batch {batch_id}")
    rejects = details.get("rejects") or {}
    if rejects.get("count"):
        lines = [
            f"# {rejects['count']:,} rejected rows in batch {batch_id}",
            "",
            f"All rejects: `{rejects.get('uri')}`",
            "",
            "| file | line | column | reason | value |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r in rejects.get("sample", [])[:_REJECTS_SHOWN]:
            lines.append(
                f"| {r['file']} | {r['line']} | {r['column']} | {r['reason']} | "
                f"{str(r.get('value') or '')[:60]} |"
            )
        create_markdown_artifact(
            "\n".join(lines), key="batch-rejects", description=f"first rejects of batch {batch_id}"
        )
    failure = details.get("failure")
    if failure:
        create_markdown_artifact(
            f"# batch {batch_id} failed ({failure['kind']})\n\n{failure['error']}",
            key="batch-failure",
        )
