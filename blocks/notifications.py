"""Notifications through Prefect automations: a held batch, a failed publication, a late
tenant, each sent to one notification block (a Slack webhook, a custom webhook, any of
Prefect's notification blocks) by `python -m blocks.register --notify TYPE/NAME`.

They react to the events the core already tells (`fleet.batch.held`, `fleet.batch.failed`,
`fleet.tenant.late`), once per event; what is still wrong an hour later is the alert
rules' business (deployments/prometheus/), which read the store, not events. A failed
publication is told apart from other failures by the `fleet.failure` label the event sink
puts on the batch's resource (flows.common.prefect_event_sink), since a trigger matches
resources, not payloads.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta

from prefect.client.orchestration import get_client
from prefect.events.actions import SendNotification
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification

from fleet_import.freshness.check import LATE_EVENT
from fleet_import.importing.guards import HELD_EVENT
from fleet_import.publication.events import BATCH_FAILED_EVENT
from fleet_import.store.details import FailureKind

FAILURE_LABEL = "fleet.failure"
"""The resource label of a `fleet.batch.failed` event that names its failure kind."""


@dataclass(frozen=True)
class Notice:
    """One automation: its name, the event it reacts to, and what it says."""

    name: str
    event: str
    subject: str
    body: str
    failure: str | None = None  # only events whose resource carries this failure kind

    def automation(self, block_document_id: uuid.UUID) -> AutomationCore:
        labels = {"prefect.resource.id": "fleet.*"}
        if self.failure is not None:
            labels[FAILURE_LABEL] = self.failure
        return AutomationCore(
            name=self.name,
            description=f"{self.subject} Created by python -m blocks.register --notify.",
            enabled=True,
            trigger=EventTrigger(
                expect={self.event},
                match=ResourceSpecification(labels),
                posture=Posture.Reactive,
                threshold=1,
                within=timedelta(0),
            ),
            actions=[
                SendNotification(
                    block_document_id=block_document_id, subject=self.subject, body=self.body
                )
            ],
        )


_BATCH = "tenant {{ event.payload.tenant_id }}, batch {{ event.payload.batch_id }}"
NOTICES = (
    Notice(
        "fleet-notify-held-batch",
        HELD_EVENT,
        "fleet-import: a batch is held for review.",
        f"{_BATCH}: {{{{ event.payload.error }}}}",
    ),
    Notice(
        "fleet-notify-failed-publication",
        BATCH_FAILED_EVENT,
        "fleet-import: a publication failed.",
        f"{_BATCH}: {{{{ event.payload.error }}}} (fleet-import resume"
        " {{ event.payload.batch_id }} finishes it)",
        failure=str(FailureKind.FAILED_PUBLICATION),
    ),
    Notice(
        "fleet-notify-late-tenant",
        LATE_EVENT,
        "fleet-import: a tenant is late.",
        "tenant {{ event.payload.tenant_id }}, dataset {{ event.payload.dataset }}: expected"
        " by {{ event.payload.expected_at }}; found: {{ event.payload.found }}",
    ),
)


def ensure_notifications(block: str) -> list[str]:
    """Create each automation (or update the one of its name in place) to notify through
    `block`, `TYPE-SLUG/NAME` (e.g. `slack-webhook/ops`); one line per automation. Raises
    ValueError naming the block when it is not saved on the server."""
    slug, _, name = block.partition("/")
    if not slug or not name:
        raise ValueError(f"--notify {block!r}: expected TYPE-SLUG/NAME, e.g. slack-webhook/ops")
    done = []
    with get_client(sync_client=True) as client:
        try:
            document = client.read_block_document_by_name(name, slug)
        except Exception as exc:  # noqa: BLE001 - the API's 404 is an ObjectNotFound
            raise ValueError(
                f"--notify {block!r}: no such block on the Prefect server ({type(exc).__name__});"
                " create it first (UI: Blocks, or Block.save)"
            ) from None
        for notice in NOTICES:
            automation = notice.automation(document.id)
            found = client.read_automations_by_name(notice.name)
            if found:
                client.update_automation(found[0].id, automation)
                done.append(f"automation {notice.name} updated: {notice.event} -> {block}")
            else:
                client.create_automation(automation)
                done.append(f"automation {notice.name} created: {notice.event} -> {block}")
    return done
