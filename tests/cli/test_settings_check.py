"""The settings check itself, in process: what it accepts (every shape the project uses) and
what it names when it refuses."""

from __future__ import annotations

import pytest

from fleet_import.checks.settings import IMPORTS, OPERATIONAL, SettingsInvalid, check_settings
from fleet_import.config import Settings

ACCEPTED = [
    {"database_url": "postgresql://postgres:@/postgres?host=/tmp/pgdata"},  # pgserver's socket
    {"database_url": "postgresql+psycopg://u:p@db:5432/fleet"},
    {"staging_uri": "file:///srv/fleet/staging"},
    {"staging_uri": "relative/staging"},
    {"warehouse_url": "postgresql://wh:5432/curated"},
    {
        "warehouse": "redshift",
        "warehouse_url": "redshift://loader:pw@wh.example:5439/fleet",
        "redshift_iam_role": "arn:aws:iam::123456789012:role/fleet-copy",
    },
    {"dask_address": "tcp://scheduler:8786"},
]


@pytest.mark.parametrize("fields", ACCEPTED)
def test_every_shape_the_project_uses_is_accepted(fields: dict[str, str]) -> None:
    settings = Settings(staging_uri="s3://fleet-staging/stage/").model_copy(update=fields)
    assert check_settings(IMPORTS, settings=settings, env={}) is settings


def test_a_redshift_url_with_the_postgres_backend_is_named() -> None:
    settings = Settings(
        staging_uri="s3://fleet-staging/stage/", warehouse_url="redshift://u:pw@wh:5439/db"
    )
    with pytest.raises(SettingsInvalid) as refused:
        check_settings(IMPORTS, settings=settings, env={})
    assert [p.variable for p in refused.value.problems] == ["FLEET_WAREHOUSE"]
    assert "pw" not in str(refused.value)


def test_a_command_that_only_reads_batches_needs_no_staging() -> None:
    assert check_settings(OPERATIONAL, settings=Settings(staging_uri=None), env={})


def test_a_bad_port_and_a_bad_dask_address() -> None:
    settings = Settings(
        database_url="postgresql://db:54x2/fleet",
        staging_uri="s3://fleet-staging/stage/",
        dask_address="scheduler:8786",
    )
    with pytest.raises(SettingsInvalid) as refused:
        check_settings(IMPORTS, settings=settings, env={})
    assert [str(p) for p in refused.value.problems] == [
        "FLEET_DATABASE_URL: the port is not a number 0-65535 (like "
        "postgresql://user@host:5432/dbname)",
        "FLEET_DASK_ADDRESS: expected tcp://host:8786",
    ]


def test_the_reply_bounds_are_checked_like_every_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet_import.checks.settings import read_settings

    monkeypatch.setenv("FLEET_DATABASE_REPLY_TIMEOUT_SECONDS", "0")
    monkeypatch.setenv("FLEET_WAREHOUSE_REPLY_TIMEOUT_SECONDS", "soon")
    settings, problems = read_settings()
    assert sorted(str(p) for p in problems) == [
        "FLEET_DATABASE_REPLY_TIMEOUT_SECONDS: input should be greater than 0",
        "FLEET_WAREHOUSE_REPLY_TIMEOUT_SECONDS: input should be a valid number, unable to parse "
        "string as a number",
    ]
    assert settings.database_reply_timeout_seconds == 30  # the default, so the rest is checked
    monkeypatch.setenv("FLEET_DATABASE_REPLY_TIMEOUT_SECONDS", "2.5")
    monkeypatch.delenv("FLEET_WAREHOUSE_REPLY_TIMEOUT_SECONDS")
    assert read_settings() == (Settings(database_reply_timeout_seconds=2.5), [])
