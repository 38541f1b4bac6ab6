"""The automation that marks a dead flow run Crashed: Prefect's own zombie detection.

A flow run whose process dies with its worker (SIGKILL, OOM, a lost machine) reports
nothing, and nothing on a Prefect server changes its state: it stays Running in the UI for
ever. Its batch is not stuck (its execution lease expires and the next delivery takes it
over), but the run is. Prefect's documented remedy (docs.prefect.io, "Detect zombie flows"):

- each flow run emits `prefect.flow-run.heartbeat` every PREFECT_FLOWS_HEARTBEAT_FREQUENCY
  seconds (prefect.yaml sets it in every deployment's job variables);
- this automation, `fleet-crash-zombie-flow-runs`, sets a run Crashed once no event of it
  arrived for `within` seconds after a heartbeat, which must span more than one heartbeat.

It watches only runs tagged `fleet` (every deployment of prefect.yaml): another project's
runs on the same server may heartbeat less often, and would be crashed while alive.
`ensure_zombie_automation` (run by `python -m blocks.register`) creates it, or updates the
one of that name in place.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification

ZOMBIE_AUTOMATION = "fleet-crash-zombie-flow-runs"
HEARTBEAT_EVENT = "prefect.flow-run.heartbeat"
# What the runs' job variables set (prefect.yaml); the old name is Prefect's alias.
HEARTBEAT_VARIABLES = ("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "PREFECT_RUNNER_HEARTBEAT_FREQUENCY")
# Three missed heartbeats at prefect.yaml's 30 s before a run is called dead.
DEFAULT_ZOMBIE_AFTER_SECONDS = 90
# Prefect heartbeats at most every 30 s; a window of two heartbeats is the least that
# survives one late heartbeat of a live run.
MIN_ZOMBIE_AFTER_SECONDS = 60
FLEET_TAG = "fleet"
CRASHED_MESSAGE = "Flow run marked as crashed due to missing heartbeats."


def zombie_automation(within_seconds: int = DEFAULT_ZOMBIE_AFTER_SECONDS) -> AutomationCore:
    """Crash a `fleet` run when `within_seconds` pass after a heartbeat without any event of
    that run (another heartbeat, or any state change: Completed, Skipped, Held...)."""
    return AutomationCore(
        name=ZOMBIE_AUTOMATION,
        description=(
            "Mark a fleet flow run Crashed when its heartbeats stop (its process died "
            "without reporting). Created by python -m blocks.register."
        ),
        enabled=True,
        trigger=EventTrigger(
            after={HEARTBEAT_EVENT},
            # Any event of the run shows it alive or finished: a wildcard covers the named
            # final states (Skipped, AlreadyLoaded, Held...) that Prefect's example omits.
            expect={"prefect.flow-run.*"},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            match_related=ResourceSpecification(
                {"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{FLEET_TAG}"}
            ),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within_seconds),
        ),
        actions=[ChangeFlowRunState(state=StateType.CRASHED, message=CRASHED_MESSAGE)],
    )


def read_zombie_automation(client: Any) -> Any | None:
    """The automation of that name on the server, or None."""
    found = client.read_automations_by_name(ZOMBIE_AUTOMATION)
    return found[0] if found else None


def zombie_after_seconds(automation: Any) -> int:
    return int(automation.trigger.within.total_seconds())


def ensure_zombie_automation(within_seconds: int = DEFAULT_ZOMBIE_AFTER_SECONDS) -> str:
    """Create the automation, or update the existing one in place (never a second one);
    returns what it did, one line."""
    automation = zombie_automation(within_seconds)
    with get_client(sync_client=True) as client:
        existing = read_zombie_automation(client)
        if existing is None:
            client.create_automation(automation)
            done = "created"
        else:
            client.update_automation(existing.id, automation)
            done = "updated"
    return (
        f"automation {ZOMBIE_AUTOMATION} {done}: a fleet flow run is marked Crashed "
        f"{within_seconds} s after a heartbeat with no event of it"
    )
