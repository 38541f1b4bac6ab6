"""OpenLineage RunEvents of a committed batch: one run per slice (issue #29).

For each dataset a batch loaded: the job `fleet-import.<tenant>.<dataset>`, a run whose id
is derived from the batch id (`lineage_run_id`, so a commit recorded again builds the same
run), a START at the batch's creation and a COMPLETE at its commit. Inputs are the S3 objects
discovery pinned (ETag and size, and the contract version they were read under); the output
is the curated table with the contract's schema, the committed rows and rejects, and a
`fleetImportSlice` facet naming tenant, scope and batch. The events are built here and
enqueued by `BatchRepository.mark_committed`; `lineage_delivery` sends them.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any

import attr
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    DatasetFacet,
    dataset_version_dataset,
    error_message_run,
    job_type_job,
    output_statistics_output_dataset,
    schema_dataset,
    storage_dataset,
)
from openlineage.client.serde import Serde

from fleet_import.contracts.model import ContractSet
from fleet_import.publication.lineage_delivery import LineageNaming
from fleet_import.store.lineage_outbox import LineageEvent
from fleet_import.store.models import Batch

PRODUCER = "https://github.com/fleet-import/fleet-import"
_FACETS_URL = "https://github.com/fleet-import/fleet-import/blob/main/docs/lineage.md"
_RUN_ID_NAMESPACE = uuid.UUID("0b6a2a7e-64c1-4c55-9d0e-4f1f7e3b5a19")


def lineage_run_id(batch_id: uuid.UUID, dataset: str) -> uuid.UUID:
    """The run of one dataset's slice in a batch: the same on every attempt."""
    return uuid.uuid5(_RUN_ID_NAMESPACE, f"{batch_id}/{dataset}")


def job_name(tenant_id: str, dataset: str) -> str:
    return f"fleet-import.{tenant_id}.{dataset}"


@attr.define
class FleetImportSliceFacet(DatasetFacet):
    """Which slice of the curated table this run replaced, and by which batch."""

    tenant: str
    scope: str
    batch: str
    rejectCount: int = 0  # noqa: N815 - OpenLineage spells facet fields in camelCase

    @staticmethod
    def _get_schema() -> str:
        return f"{_FACETS_URL}#fleetimportslice"


@attr.define
class FleetImportObjectFacet(DatasetFacet):
    """What pins an S3 object's content: its ETag and size, and the contract version."""

    etag: str
    size: int
    contractVersion: str | None = None  # noqa: N815
    versionId: str | None = None  # noqa: N815 - S3 version; listings do not report it

    @staticmethod
    def _get_schema() -> str:
        return f"{_FACETS_URL}#fleetimportobject"


def committed_events(
    batch: Batch,
    row_counts: Mapping[str, int],
    summary: Mapping[str, Any],
    contracts: ContractSet,
    naming: LineageNaming,
    now: dt.datetime | None = None,
) -> list[LineageEvent]:
    """START and COMPLETE of every dataset the batch committed, to enqueue with its commit."""
    return _run_events(
        batch, sorted(row_counts), row_counts, summary, contracts, naming, RunState.COMPLETE, now
    )


def failed_events(
    batch: Batch,
    error: str,
    contracts: ContractSet,
    naming: LineageNaming,
    now: dt.datetime | None = None,
) -> list[LineageEvent]:
    """START and FAIL of every dataset of a batch that reached the warehouse but committed
    nothing (the slice transaction rolled back), with the failure as `errorMessage`."""
    datasets = sorted(_objects_by_dataset(batch.record.manifest or {}))
    summary = batch.record.summary_json
    return _run_events(
        batch, datasets, None, summary, contracts, naming, RunState.FAIL, now, error=error
    )


def _run_events(
    batch: Batch,
    datasets: list[str],
    row_counts: Mapping[str, int] | None,
    summary: Mapping[str, Any],
    contracts: ContractSet,
    naming: LineageNaming,
    end: RunState,
    now: dt.datetime | None,
    error: str | None = None,
) -> list[LineageEvent]:
    now = now or dt.datetime.now(dt.UTC)
    objects = _objects_by_dataset(batch.record.manifest or {})
    rejects = _rejects_by_dataset(summary)
    versions = dict(batch.record.contract_versions or {})
    run_facets: dict[str, Any] = {}
    if error is not None:
        run_facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message=error, programmingLanguage="python", producer=PRODUCER
        )
    events: list[LineageEvent] = []
    for dataset in datasets:
        run_id = lineage_run_id(batch.id, dataset)
        name = job_name(batch.tenant_id, dataset)
        job = Job(
            namespace=naming.namespace,
            name=name,
            facets={
                "jobType": job_type_job.JobTypeJobFacet(
                    processingType="BATCH",
                    integration="FLEET_IMPORT",
                    jobType="SLICE_LOAD",
                    producer=PRODUCER,
                )
            },
        )
        inputs = [_input(obj, versions.get(dataset)) for obj in objects.get(dataset, [])]
        rows = None if row_counts is None else row_counts[dataset]
        output = _output(batch, dataset, contracts, naming, rows, rejects)
        for state, at, outs, facets in (
            (RunState.START, _iso(batch.created_at), [], {}),
            (end, _iso(now), [output], run_facets),
        ):
            event = RunEvent(
                eventType=state,
                eventTime=at,
                run=Run(runId=str(run_id), facets=facets),
                job=job,
                inputs=inputs,
                outputs=outs,
                producer=PRODUCER,
            )
            events.append(
                LineageEvent(
                    run_id, name, state.value, dt.datetime.fromisoformat(at), Serde.to_dict(event)
                )
            )
    return events


def _input(obj: Mapping[str, Any], contract_version: str | None) -> InputDataset:
    bucket = str(obj.get("bucket") or "")
    return InputDataset(
        namespace=f"s3://{bucket}",
        name=str(obj["key"]),
        facets={
            "version": dataset_version_dataset.DatasetVersionDatasetFacet(
                datasetVersion=str(obj["etag"]), producer=PRODUCER
            ),
            "fleetImportObject": FleetImportObjectFacet(
                etag=str(obj["etag"]),
                size=int(obj.get("size") or 0),
                contractVersion=contract_version,
                versionId=obj.get("version_id"),
                producer=PRODUCER,
            ),
            "storage": storage_dataset.StorageDatasetFacet(
                storageLayer="s3", fileFormat=str(obj.get("fmt") or "") or None, producer=PRODUCER
            ),
        },
    )


def _output(
    batch: Batch,
    dataset: str,
    contracts: ContractSet,
    naming: LineageNaming,
    rows: int | None,
    rejects: Mapping[str, int],
) -> OutputDataset:
    contract = contracts[dataset]
    database = naming.database_of(batch.tenant_id) or naming.warehouse_database
    fields = [
        schema_dataset.SchemaDatasetFacetFields(name=c.name, type=c.type, ordinal_position=i)
        for i, c in enumerate(contract.columns, start=1)
    ]
    return OutputDataset(
        namespace=naming.warehouse_namespace,
        name=f"{database}.{contract.target_table}",
        facets={
            "schema": schema_dataset.SchemaDatasetFacet(fields=fields, producer=PRODUCER),
            "fleetImportSlice": FleetImportSliceFacet(
                tenant=batch.tenant_id,
                scope=str(batch.source_scope),
                batch=str(batch.id),
                rejectCount=int(rejects.get(dataset, 0)),
                producer=PRODUCER,
            ),
        },
        outputFacets={}
        if rows is None  # nothing was committed
        else {
            "outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                rowCount=int(rows), producer=PRODUCER
            )
        },
    )


def _objects_by_dataset(manifest: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The manifest's objects per dataset, each with the bucket its folder names."""
    folder = str(manifest.get("folder") or "")
    bucket = folder.removeprefix("s3://").split("/", 1)[0]
    grouped: dict[str, list[dict[str, Any]]] = {}
    for obj in manifest.get("objects", []):
        grouped.setdefault(str(obj["dataset"]), []).append({**obj, "bucket": bucket})
    return grouped


def _rejects_by_dataset(summary: Mapping[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for file in summary.get("files", []):
        dataset = str(file.get("dataset"))
        counts[dataset] = counts.get(dataset, 0) + int(file.get("rejects") or 0)
    return counts


def _iso(at: dt.datetime) -> str:
    if at.tzinfo is None:
        at = at.replace(tzinfo=dt.UTC)
    return at.astimezone(dt.UTC).isoformat()
