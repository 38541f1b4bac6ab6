"""Alembic environment for the operational database (ingestion_batches and friends)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from fleet_import.bounded_connection import CONNECT_ARGS
from fleet_import.config import sqlalchemy_url

config = context.config


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        from fleet_import.config import Settings

        url = Settings().database_url
    return sqlalchemy_url(url)


def run_migrations_offline() -> None:
    context.configure(url=_url(), literal_binds=True, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, transaction_per_migration=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    # The keepalives of every connection of ours, but no reply bound (CONNECT_ARGS).
    engine = create_engine(_url(), poolclass=pool.NullPool, connect_args=CONNECT_ARGS)
    with engine.connect() as connection:
        context.configure(connection=connection, transaction_per_migration=True)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
