"""Run the Alembic migrations programmatically (what `fleet-import db upgrade` does)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

# migrations/ lives beside the package in the checkout (the project installs editable).
_REPO = Path(__file__).resolve().parents[2]


def alembic_config(database_url: str) -> Config:
    ini = _REPO / "alembic.ini"
    if not ini.is_file():
        raise FileNotFoundError(
            f"alembic.ini not found at {ini}; run from a checkout of fleet-import"
        )
    config = Config(str(ini))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def current(database_url: str) -> str | None:
    from sqlalchemy import create_engine, pool
    from sqlalchemy.exc import SQLAlchemyError

    from fleet_import.config import sqlalchemy_url

    engine = create_engine(sqlalchemy_url(database_url), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            from alembic.runtime.migration import MigrationContext

            return MigrationContext.configure(conn).get_current_revision()
    except SQLAlchemyError:
        return None
    finally:
        engine.dispose()
