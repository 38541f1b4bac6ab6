"""`fleet-import relay`: the landing bucket's S3 notifications, from SQS, as Prefect events."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from fleet_cli.common import console, err_console, fail
from fleet_cli.guard import CONFIGURATION_ERROR, error_line, prefect_ready, require_settings
from fleet_cli.metrics_commands import MetricsPortOption, serving_metrics
from fleet_import.checks.settings import RELAY
from fleet_import.config import Settings
from fleet_import.errors import FleetImportError
from fleet_import.intake.landing import DEFAULT_PATTERN


def relay(
    queue_url: Annotated[
        str,
        typer.Option(
            "--queue-url",
            envvar="FLEET_RELAY_QUEUE_URL",
            show_envvar=True,
            help="SQS queue receiving the landing bucket's S3 notifications",
        ),
    ],
    dead_letter_queue_url: Annotated[
        str | None,
        typer.Option(
            "--dead-letter-queue-url",
            envvar="FLEET_RELAY_DEAD_LETTER_QUEUE_URL",
            show_envvar=True,
            help="SQS queue for messages the relay cannot read",
        ),
    ] = None,
    dead_letter_file: Annotated[
        str,
        typer.Option(
            "--dead-letter-file",
            envvar="FLEET_RELAY_DEAD_LETTER_FILE",
            show_envvar=True,
            help="JSON Lines file for unreadable messages (when no dead-letter queue is given)",
        ),
    ] = "fleet-relay-dead-letters.jsonl",
    endpoint_url: Annotated[
        str | None,
        typer.Option(
            "--endpoint-url",
            envvar="FLEET_SQS_ENDPOINT_URL",
            show_envvar=True,
            help="SQS endpoint (moto, LocalStack); AWS if unset",
        ),
    ] = None,
    region: Annotated[
        str | None, typer.Option(help="AWS region; else from the queue URL or AWS_DEFAULT_REGION")
    ] = None,
    landing_prefix: Annotated[
        str,
        typer.Option(
            envvar="FLEET_LANDING_PREFIX",
            show_envvar=True,
            help="key prefix of tenant folders, ending in '/'",
        ),
    ] = "",
    folder_pattern: Annotated[
        str, typer.Option(help="tenant folder layout after the prefix")
    ] = DEFAULT_PATTERN,
    wait_seconds: Annotated[int, typer.Option(min=0, max=20, help="SQS long-poll wait")] = 20,
    once: Annotated[bool, typer.Option("--once", help="one receive, then exit")] = False,
    metrics_port: MetricsPortOption = None,
) -> None:
    """Relay S3 notifications from SQS as aws.s3.object.created Prefect events (Ctrl-C stops).

    A message is deleted only after its events were accepted by the Prefect API; messages
    that are not S3 notifications go to the dead-letter queue or file and are deleted.

    Example: fleet-import relay --queue-url https://sqs.eu-west-1.amazonaws.com/123456789012/fleet-landing
    """
    require_settings(RELAY)
    if not queue_url.startswith(("https://", "http://")):
        error_line(
            "FLEET_RELAY_QUEUE_URL (--queue-url): expected an SQS queue URL like "
            "https://sqs.eu-west-1.amazonaws.com/123456789012/fleet-landing"
        )
        raise typer.Exit(CONFIGURATION_ERROR)
    prefect_ready()
    import contextlib
    import gc
    import logging
    import signal
    import threading

    import boto3

    from fleet_import.intake.dead_letters import FileDeadLetter, SqsDeadLetter
    from fleet_import.intake.landing import LandingLayout
    from fleet_import.intake.relay import Relay, queue_region
    from fleet_import.tenants.registry import registry_in_force
    from flows.events import PrefectEventEmitter

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # After basicConfig: importing flows.common sets up Prefect's logging, which would
    # otherwise take the root logger first and hide the relay's INFO lines.
    from flows.common import prefect_event_sink

    try:
        layout = LandingLayout(prefix=landing_prefix, pattern=folder_pattern)
        registry = registry_in_force(Settings().tenants)
    except FleetImportError as exc:
        raise fail(str(exc), 2) from None
    sqs = boto3.client(
        "sqs", endpoint_url=endpoint_url, region_name=region or queue_region(queue_url)
    )
    dead_letter = (
        SqsDeadLetter(sqs, dead_letter_queue_url)
        if dead_letter_queue_url
        else FileDeadLetter(dead_letter_file)
    )
    # Ctrl-C and systemd's SIGTERM set `stop`; run_forever returns within about half a
    # second, abandoning a long poll or an emit in progress. That is safe, because a message
    # is deleted only after its events were accepted (the worst case is a repeat). --once
    # keeps KeyboardInterrupt: its single receive has no loop to stop.
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        # Only this: run_forever's thread never waits on `stop`, so setting it here cannot
        # deadlock on the Event's lock; logging here could, on the logging lock.
        stop.set()

    handler = signal.default_int_handler if once else request_stop
    with contextlib.ExitStack() as cleanup:
        for signum in (signal.SIGINT, signal.SIGTERM):
            cleanup.callback(signal.signal, signum, signal.signal(signum, handler))
        cleanup.enter_context(serving_metrics(metrics_port))
        emit = cleanup.enter_context(PrefectEventEmitter())
        relay_ = Relay(
            sqs,
            queue_url,
            emit,
            dead_letter=dead_letter,
            layout=layout,
            wait_seconds=wait_seconds,
            events=prefect_event_sink,
            registry=registry,
        )
        err_console.print(Text(f"relaying {queue_url}; dead letters to {dead_letter!r}"))
        try:
            stats = relay_.poll_once() if once else relay_.run_forever(stop)
        except KeyboardInterrupt:
            stats = relay_.totals
        except Exception as exc:  # --once: a receive error is the answer
            raise fail(f"relay failed: {type(exc).__name__}: {exc}") from None
    console.print(Text(f"relay: {stats}"))
    # The interpreter's last collections walk every object Prefect and botocore made (about
    # 0.4 s here, far more on a busy host); frozen objects are skipped, so a stop stays quick.
    gc.freeze()
