"""Register the fleet block types with the Prefect API, and optionally their documents.

    python -m blocks.register              # block types, schemas and the load limits
    python -m blocks.register --from-env   # ... and the three documents from FLEET_* variables

Either also creates (or re-sizes) the global concurrency limit on warehouse loads, sized by
FLEET_WAREHOUSE_LOAD_SLOTS, and the work pool's backfill queue (blocks.limits), and creates
(or updates) the automation that marks a flow run whose heartbeats stopped Crashed
(blocks.zombies; --zombie-after SECONDS, default 90). With --notify TYPE/NAME, also the
automations that send a held batch, a failed publication and a late tenant to that saved
notification block (blocks.notifications).

Re-runnable: type registration is idempotent and documents are saved with overwrite=True.
The Prefect API is the one PREFECT_API_URL (or the active profile) points at.

Variables read by --from-env (secrets are stored in the blocks, never printed):

| variable | block field |
| --- | --- |
| FLEET_DATABASE_URL (required) | fleet-operational-db.url |
| FLEET_WAREHOUSE_URL (default: FLEET_DATABASE_URL) | fleet-warehouse.url |
| FLEET_WAREHOUSE (default postgres) | fleet-warehouse.backend |
| FLEET_WAREHOUSE_IAM_ROLE, FLEET_WAREHOUSE_STAGING_URI | fleet-warehouse.iam_role, .staging_uri |
| FLEET_REFRESH_SQL (a JSON list of statements) | fleet-warehouse.refresh_sql |
| FLEET_DATABASE_REPLY_TIMEOUT_SECONDS | fleet-operational-db.reply_timeout_seconds |
| FLEET_WAREHOUSE_REPLY_TIMEOUT_SECONDS | fleet-warehouse.reply_timeout_seconds |
| FLEET_STAGING_URI (required) | fleet-landing.staging_uri |
| FLEET_S3_ENDPOINT_URL | fleet-landing.endpoint_url |

FLEET_LANDING_BUCKET, FLEET_LANDING_PREFIX and FLEET_AWS_* are not stored (the landing block
no longer has those fields): setting them only prints a note.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

from pydantic import TypeAdapter, ValidationError

from blocks.fleet_blocks import (
    BLOCK_DOCUMENTS,
    LANDING_BLOCK,
    OPERATIONAL_DB_BLOCK,
    WAREHOUSE_BLOCK,
    FleetBlock,
    FleetLandingBucket,
    FleetOperationalDatabase,
    FleetWarehouse,
    describe_error,
)
from blocks.limits import ensure_limits
from blocks.notifications import ensure_notifications
from blocks.zombies import (
    DEFAULT_ZOMBIE_AFTER_SECONDS,
    MIN_ZOMBIE_AFTER_SECONDS,
    ensure_zombie_automation,
)
from fleet_import.config import Settings

EXIT_CONFIG_ERROR = 2
# Stored by earlier versions; the sweep takes bucket and prefix as parameters, the relay as
# options, and S3 credentials come from boto3's chain.
NOT_STORED = (
    "FLEET_LANDING_BUCKET",
    "FLEET_LANDING_PREFIX",
    "FLEET_AWS_ACCESS_KEY_ID",
    "FLEET_AWS_SECRET_ACCESS_KEY",
)
_STATEMENTS = TypeAdapter(list[str])


class MissingVariables(Exception):
    """Required environment variables are not set."""


class InvalidVariable(Exception):
    """An environment variable's value cannot be stored in its block field."""


def register_types() -> list[str]:
    """Create or update every block type and schema; returns their slugs."""
    slugs = []
    for block_cls, _ in BLOCK_DOCUMENTS:
        block_cls.register_type_and_schema(_sync=True)
        slugs.append(block_cls.get_block_type_slug())
    return slugs


def blocks_from_env(env: Mapping[str, str]) -> dict[str, FleetBlock]:
    """The three documents described by FLEET_* variables, keyed by document name.

    Raises MissingVariables (naming every missing variable) before anything is built,
    InvalidVariable for FLEET_REFRESH_SQL that is not a JSON list of strings, and pydantic's
    ValidationError for malformed values.
    """
    values = {key: value for key, value in env.items() if value != ""}
    missing = [key for key in ("FLEET_DATABASE_URL", "FLEET_STAGING_URI") if key not in values]
    if missing:
        raise MissingVariables(", ".join(missing))
    database_url = values["FLEET_DATABASE_URL"]
    return {
        OPERATIONAL_DB_BLOCK: FleetOperationalDatabase(
            url=database_url,
            reply_timeout_seconds=values.get("FLEET_DATABASE_REPLY_TIMEOUT_SECONDS"),
        ),
        WAREHOUSE_BLOCK: FleetWarehouse(
            backend=values.get("FLEET_WAREHOUSE", "postgres"),
            url=values.get("FLEET_WAREHOUSE_URL", database_url),
            iam_role=values.get("FLEET_WAREHOUSE_IAM_ROLE"),
            staging_uri=values.get("FLEET_WAREHOUSE_STAGING_URI"),
            refresh_sql=_statements(values.get("FLEET_REFRESH_SQL", "[]")),
            reply_timeout_seconds=values.get("FLEET_WAREHOUSE_REPLY_TIMEOUT_SECONDS"),
        ),
        LANDING_BLOCK: FleetLandingBucket(
            endpoint_url=values.get("FLEET_S3_ENDPOINT_URL"),
            staging_uri=values["FLEET_STAGING_URI"],
        ),
    }


def _statements(value: str) -> list[str]:
    try:
        return _STATEMENTS.validate_json(value)
    except ValidationError:
        # Not the value itself: a statement may hold a password.
        raise InvalidVariable("FLEET_REFRESH_SQL is not a JSON list of strings") from None


def save_documents(blocks: Mapping[str, FleetBlock]) -> list[str]:
    """Create or overwrite each document; returns `slug/name` of each."""
    saved = []
    for name, block in blocks.items():
        block.save(name, overwrite=True, _sync=True)
        saved.append(f"{block.get_block_type_slug()}/{name}")
    return saved


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m blocks.register",
        description="Register fleet-import's Prefect block types (and documents).",
    )
    parser.add_argument(
        "--from-env",
        action="store_true",
        help="also create or overwrite the fleet-operational-db, fleet-warehouse and "
        "fleet-landing documents from FLEET_* environment variables",
    )
    parser.add_argument(
        "--zombie-after",
        type=int,
        default=DEFAULT_ZOMBIE_AFTER_SECONDS,
        metavar="SECONDS",
        help="mark a fleet flow run Crashed when no event of it arrives for SECONDS after a "
        "heartbeat (at least two heartbeats: prefect.yaml sets one every 30 s; default "
        f"{DEFAULT_ZOMBIE_AFTER_SECONDS})",
    )
    parser.add_argument(
        "--notify",
        metavar="TYPE/NAME",
        help="create (or update) the automations that notify through this saved notification "
        "block (e.g. slack-webhook/ops) of a held batch, a failed publication and a late "
        "tenant (blocks.notifications)",
    )
    args = parser.parse_args(argv)
    if args.zombie_after < MIN_ZOMBIE_AFTER_SECONDS:
        parser.error(f"--zombie-after must be at least {MIN_ZOMBIE_AFTER_SECONDS} seconds")

    blocks: dict[str, FleetBlock] = {}
    if args.from_env:
        # Everything is validated before the API is touched: a typo writes nothing.
        try:
            blocks = blocks_from_env(os.environ)
        except MissingVariables as exc:
            print(f"error: --from-env needs {exc}", file=sys.stderr)
            return EXIT_CONFIG_ERROR
        except InvalidVariable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_CONFIG_ERROR
        except ValidationError as exc:
            print(f"error: {describe_error(exc)}", file=sys.stderr)
            return EXIT_CONFIG_ERROR
        ignored = [key for key in NOT_STORED if os.environ.get(key)]
        if ignored:
            print(f"note: not stored in blocks: {', '.join(ignored)}", file=sys.stderr)

    try:
        settings = Settings()
    except ValidationError as exc:
        print(f"error: {describe_error(exc)}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    for slug in register_types():
        print(f"registered block type {slug}")
    for line in ensure_limits(settings):
        print(line)
    print(ensure_zombie_automation(args.zombie_after))
    if args.notify:
        try:
            for line in ensure_notifications(args.notify):
                print(line)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_CONFIG_ERROR
    for document in save_documents(blocks):
        print(f"saved block document {document}")
    if not args.from_env:
        print("no documents written (pass --from-env to write them from FLEET_* variables)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
