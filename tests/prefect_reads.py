"""What a flow told Prefect, read back from the API: artifacts and events (the tests of
the flows under Prefect's test harness share these)."""

from __future__ import annotations

import json
import time
import uuid

from prefect.client.orchestration import get_client


def latest_artifact(key: str) -> object:
    """The data of the latest version of an artifact key (its history's current truth)."""
    from prefect.client.schemas.filters import (
        ArtifactCollectionFilter,
        ArtifactCollectionFilterKey,
    )

    with get_client(sync_client=True) as client:
        (latest,) = client.read_latest_artifacts(
            artifact_filter=ArtifactCollectionFilter(key=ArtifactCollectionFilterKey(any_=[key]))
        )
    if latest.type == "table" and isinstance(latest.data, str):
        return json.loads(latest.data)  # a table's rows arrive as JSON text
    return latest.data


def batch_events(batch_id: uuid.UUID, expected: int, name: str = "fleet.batch.updated") -> list:
    """The `name` events of a batch, once `expected` have arrived or 30 s passed."""
    return resource_events(f"fleet.batch.{batch_id}", name, expected)


def resource_events(resource_id: str, name: str, expected: int = 1) -> list:
    """The `name` events about `resource_id` (`fleet.batch.{id}`, `fleet.delivery.{folder}`),
    once `expected` have arrived or 30 s passed (events reach the API's store
    asynchronously)."""
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    event_filter = EventFilter(
        event=EventNameFilter(name=[name]),
        resource=EventResourceFilter(id=[resource_id]),
    )
    deadline = time.monotonic() + 30
    while True:
        with get_client(sync_client=True) as client:
            events = client.read_events(filter=event_filter, limit=50).events
        if len(events) >= expected or time.monotonic() > deadline:
            return events
        time.sleep(0.5)
