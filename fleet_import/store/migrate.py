"""Run the Alembic migrations programmatically (what `fleet-import db upgrade` does).

Alembic is imported only by what migrates: `head_revision` (every command's "is the
database migrated?" check) reads the revision files' two assignments instead, so a tiny
import does not pay Alembic's import (about 0.5 s here)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alembic.config import Config

# migrations/ lives beside the package in the checkout (the project installs editable).
_REPO = Path(__file__).resolve().parents[2]
_VERSIONS = _REPO / "migrations" / "versions"


def head_revision() -> str | None:
    """The single head of migrations/versions (the revision no other one revises), as
    Alembic's ScriptDirectory computes it for a linear history; None with no revisions."""
    revisions: dict[str, str | None] = {}
    for path in sorted(_VERSIONS.glob("*.py")):
        values: dict[str, object] = {}
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name) and target.id in ("revision", "down_revision"):
                    values[target.id] = ast.literal_eval(node.value)
        if isinstance(values.get("revision"), str):
            down = values.get("down_revision")
            revisions[str(values["revision"])] = down if isinstance(down, str) else None
    heads = set(revisions) - set(revisions.values())
    if len(heads) > 1:
        raise RuntimeError(f"migrations/versions has several heads: {sorted(heads)}")
    return heads.pop() if heads else None


def alembic_config(database_url: str) -> Config:
    from alembic.config import Config

    ini = _REPO / "alembic.ini"
    if not ini.is_file():
        raise FileNotFoundError(
            f"alembic.ini not found at {ini}; run from a checkout of fleet-import"
        )
    config = Config(str(ini))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(database_url), revision)


def current(database_url: str) -> str | None:
    from sqlalchemy import create_engine, pool
    from sqlalchemy.exc import SQLAlchemyError

    from fleet_import.bounded_connection import CONNECT_ARGS
    from fleet_import.config import sqlalchemy_url

    engine = create_engine(
        sqlalchemy_url(database_url),
        poolclass=pool.NullPool,
        connect_args=CONNECT_ARGS,
    )
    try:
        with engine.connect() as conn:
            from alembic.runtime.migration import MigrationContext

            return MigrationContext.configure(conn).get_current_revision()
    except SQLAlchemyError:
        return None
    finally:
        engine.dispose()
