"""One resolution of settings: `run`, `doctor`, `batches list` and `slices list` name the
same databases whatever the Prefect blocks and the environment say, and a variable that
overrules a block is said once, on one line."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_import.config import (
    SOURCE_DEFAULT,
    SOURCE_ENVIRONMENT,
    Settings,
    env_variable,
    resolve_settings,
)
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.store.repository import BatchRepository
from tests import pgtools
from tests.cli.run_cli import invoke_with_test_settings
from tests.helpers import curated, upload

_FIELDS = ("database_url", "warehouse_url", "staging_uri", "s3_endpoint_url")


@given(
    in_env=st.dictionaries(st.sampled_from(_FIELDS), st.sampled_from(["a://x", "b://y"])),
    in_blocks=st.dictionaries(st.sampled_from(_FIELDS), st.sampled_from(["a://x", "b://y"])),
)
def test_the_environment_wins_then_a_block_then_the_default(
    in_env: dict[str, str], in_blocks: dict[str, str]
) -> None:
    env = {env_variable(field): value for field, value in in_env.items()}
    from_env = Settings.model_construct(**in_env)
    stored = {field: (value, "some-block") for field, value in in_blocks.items()}
    resolved = resolve_settings(from_env, stored, env)
    for field in _FIELDS:
        value = getattr(resolved.settings, field)
        if field in in_env:
            assert (value, resolved.source_of(field)) == (in_env[field], SOURCE_ENVIRONMENT)
        elif field in in_blocks:
            assert (value, resolved.source_of(field)) == (in_blocks[field], "block some-block")
        else:
            assert resolved.source_of(field) == SOURCE_DEFAULT
    overruled = {
        f"{env_variable(f)} (block some-block)"
        for f in in_env
        if f in in_blocks and in_blocks[f] != in_env[f]
    }
    assert set(resolved.overruled) == overruled
    assert (resolved.overruled_line() is None) == (not overruled)


@pytest.fixture
def other_database(pg_server_url: str, migrated_template: str) -> Iterator[str]:
    name = pgtools.unique_name("blockdb")
    url = pgtools.create_database(pg_server_url, name, template=migrated_template)
    yield url
    pgtools.drop_database(pg_server_url, name)


@pytest.fixture
def registered_blocks(other_database: str, staging_bucket: str) -> Iterator[str]:
    """The three block documents saved on the harness's API, all naming `other_database`
    and another staging prefix, deleted after the test (the API is shared by the worker)."""
    from prefect.client.orchestration import get_client

    from blocks.fleet_blocks import (
        LANDING_BLOCK,
        OPERATIONAL_DB_BLOCK,
        WAREHOUSE_BLOCK,
        FleetLandingBucket,
        FleetOperationalDatabase,
        FleetWarehouse,
    )

    documents = [
        (FleetOperationalDatabase(url=other_database), OPERATIONAL_DB_BLOCK),
        (FleetWarehouse(url=other_database), WAREHOUSE_BLOCK),
        (FleetLandingBucket(staging_uri=f"s3://{staging_bucket}/block-stage/"), LANDING_BLOCK),
    ]
    ids = [block.save(name, overwrite=True, _sync=True) for block, name in documents]
    yield other_database
    with get_client(sync_client=True) as client:
        for document_id in ids:
            client.delete_block_document(document_id)


def _database_named(url: str) -> str:
    return url.rsplit("/", 1)[1]


@pytest.mark.slow
def test_run_doctor_and_the_lists_name_the_environment_s_databases_over_a_block(
    flow_env: str, registered_blocks: str, s3, landing_bucket: str, monkeypatch
) -> None:
    """The environment names database A for the store and the warehouse, the blocks name B:
    every command uses A, says once that the environment overruled the blocks, and B stays
    empty (it took the batch and the rows while doctor and the lists looked at A)."""
    monkeypatch.setenv("FLEET_WAREHOUSE_URL", flow_env)
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=12))

    doctor = invoke_with_test_settings("doctor", "--json")
    report = json.loads(doctor.stdout)
    shown = {row["variable"]: row for row in report["settings"]}
    for variable in ("FLEET_DATABASE_URL", "FLEET_WAREHOUSE_URL", "FLEET_STAGING_URI"):
        assert shown[variable]["source"] == SOURCE_ENVIRONMENT, shown[variable]
    assert _database_named(flow_env) in shown["FLEET_DATABASE_URL"]["value"]
    reached = next(c for c in report["checks"] if c["check"].startswith("operational database"))
    assert _database_named(flow_env) in reached["reason"], reached
    assert shown["FLEET_WAREHOUSE"]["source"] == "block fleet-warehouse"

    monkeypatch.setattr("blocks.settings_in_force._said", set())  # each command a process
    ran = invoke_with_test_settings("run", "--tenant", "acme", folder)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    said = [line for line in ran.stderr.splitlines() if "the environment wins" in line]
    assert len(said) == 1, ran.stderr
    for variable in ("FLEET_DATABASE_URL", "FLEET_WAREHOUSE_URL", "FLEET_STAGING_URI"):
        assert variable in said[0]

    (batch,) = BatchRepository(flow_env).list()
    assert batch.status == "succeeded"
    assert curated(flow_env, "SELECT count(*) FROM curated.fleet_trips") == [(12,)]
    assert BatchRepository(registered_blocks).list() == []
    # Nothing reached B's warehouse: the run never even made its curated tables.
    assert curated(registered_blocks, "SELECT to_regclass('curated.fleet_trips')") == [(None,)]

    listed = invoke_with_test_settings("batches", "list", "--json")
    assert [row["id"] for row in json.loads(listed.stdout)] == [str(batch.id)], listed.stdout
    slices = invoke_with_test_settings("slices", "list", "--json")
    assert slices.returncode == 0, slices.stderr
    assert str(batch.id) in slices.stdout


@pytest.mark.slow
def test_a_block_decides_for_every_command_when_the_environment_is_silent(
    flow_env: str, registered_blocks: str, s3, landing_bucket: str, monkeypatch
) -> None:
    """No FLEET_DATABASE_URL in the environment: the block's database is the one `run`
    writes to and the one doctor and `batches list` read, and doctor names the block."""
    monkeypatch.delenv("FLEET_DATABASE_URL")
    monkeypatch.delenv("FLEET_STAGING_URI")
    folder = today_folder(landing_bucket, "acme")
    upload(s3, folder, fleet_delivery(trips=7))

    doctor = invoke_with_test_settings("doctor", "--json")
    shown = {row["variable"]: row for row in json.loads(doctor.stdout)["settings"]}
    assert shown["FLEET_DATABASE_URL"]["source"] == "block fleet-operational-db"
    assert _database_named(registered_blocks) in shown["FLEET_DATABASE_URL"]["value"]

    ran = invoke_with_test_settings("run", "--tenant", "acme", folder)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "the environment wins" not in ran.stderr
    (batch,) = BatchRepository(registered_blocks).list()
    assert BatchRepository(flow_env).list() == []
    listed = invoke_with_test_settings("batches", "list", "--json")
    assert [row["id"] for row in json.loads(listed.stdout)] == [str(batch.id)], listed.stdout
