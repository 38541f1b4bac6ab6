"""The fleet block classes and settings_overrides() without a Prefect server (loading is
replaced per test); tests/test_deployments.py runs them against a real one."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prefect.exceptions import ObjectNotFound
from pydantic import SecretStr, ValidationError

from blocks import fleet_blocks
from blocks.fleet_blocks import (
    LANDING_BLOCK,
    OPERATIONAL_DB_BLOCK,
    WAREHOUSE_BLOCK,
    FleetLandingBucket,
    FleetOperationalDatabase,
    FleetWarehouse,
    settings_overrides,
)
from blocks.register import InvalidVariable, MissingVariables, blocks_from_env
from fleet_import.config import Settings

PASSWORD = "s3cr3t-pw-4242"
AWS_SECRET = "aws-s3cr3t-9999"
DB_URL = f"postgresql://fleet:{PASSWORD}@db.internal:5432/fleet"


def _blocks() -> dict[str, Any]:
    return {
        OPERATIONAL_DB_BLOCK: FleetOperationalDatabase(url=DB_URL),
        WAREHOUSE_BLOCK: FleetWarehouse(url=f"postgresql://wh:{PASSWORD}@wh.internal/curated"),
        LANDING_BLOCK: FleetLandingBucket(
            endpoint_url="http://127.0.0.1:5000", staging_uri="s3://fleet-staging/stage/"
        ),
    }


def _serve(monkeypatch: pytest.MonkeyPatch, documents: dict[str, Any]) -> None:
    """Block.load answers from `documents`: a block, an exception to raise, or absent."""

    def fake_load(cls: type, name: str, _sync: bool | None = None, **_: Any) -> Any:
        assert _sync is True  # never the coroutine-returning async dispatch
        found = documents.get(name)
        if found is None:
            # What Block.load raises for a missing document or block type.
            raise ValueError(f"Unable to find block document named {name}") from ObjectNotFound(
                http_exc=Exception("404")
            )
        if isinstance(found, BaseException):
            raise found
        assert isinstance(found, cls)
        return found

    for block_cls, _ in fleet_blocks.BLOCK_DOCUMENTS:
        monkeypatch.setattr(block_cls, "load", classmethod(fake_load))


def test_secrets_are_secretstr_and_never_printed() -> None:
    blocks = _blocks()
    assert isinstance(blocks[OPERATIONAL_DB_BLOCK].url, SecretStr)
    assert isinstance(blocks[WAREHOUSE_BLOCK].url, SecretStr)
    for block in blocks.values():
        for text in (repr(block), str(block), block.model_dump_json(), f"{block!s}"):
            assert PASSWORD not in text and AWS_SECRET not in text
    assert blocks[OPERATIONAL_DB_BLOCK].url.get_secret_value() == DB_URL


def test_block_types_are_named_and_secret_fields_declared() -> None:
    assert FleetOperationalDatabase.get_block_type_slug() == "fleet-operational-database"
    assert FleetWarehouse.get_block_type_slug() == "fleet-warehouse"
    assert FleetLandingBucket.get_block_type_slug() == "fleet-landing-bucket"
    for block_cls, name in fleet_blocks.BLOCK_DOCUMENTS:
        assert block_cls.get_description()
        assert name in {"fleet-operational-db", "fleet-warehouse", "fleet-landing"}
        schema = block_cls.model_json_schema()
        assert all(prop.get("description") for prop in schema["properties"].values())
    # Prefect masks these in the UI and in API reads without include_secrets.
    assert FleetOperationalDatabase.model_json_schema()["secret_fields"] == ["url"]
    assert FleetWarehouse.model_json_schema()["secret_fields"] == ["url"]
    assert FleetLandingBucket.model_json_schema()["secret_fields"] == []


def test_field_validation() -> None:
    with pytest.raises(ValidationError):
        FleetWarehouse(backend="snowflake", url="x")
    with pytest.raises(ValidationError):
        FleetLandingBucket()
    with pytest.raises(ValidationError):
        FleetLandingBucket(staging_uri="/tmp/staging")
    with pytest.raises(ValidationError):
        FleetOperationalDatabase()


def test_a_landing_document_saved_with_the_removed_fields_still_loads() -> None:
    """bucket, prefix and the access keys were fields once; nothing read them. A document
    saved then still loads, and only its endpoint and staging URI apply."""
    old = FleetLandingBucket.model_validate(
        {
            "bucket": "fleet-landing",
            "prefix": "tenants",
            "endpoint_url": "http://127.0.0.1:5000",
            "staging_uri": "s3://fleet-staging/stage/",
            "aws_access_key_id": "AKIAFLEET",
            "aws_secret_access_key": AWS_SECRET,
        }
    )
    assert old.as_settings() == {
        "s3_endpoint_url": "http://127.0.0.1:5000",
        "staging_uri": "s3://fleet-staging/stage/",
    }


def test_refresh_sql_comes_from_the_warehouse_block(monkeypatch) -> None:
    statements = ["REFRESH MATERIALIZED VIEW fleet_daily", "ANALYZE fleet_trips"]
    blocks = _blocks()
    blocks[WAREHOUSE_BLOCK] = FleetWarehouse(url="postgresql://wh/curated", refresh_sql=statements)
    _serve(monkeypatch, blocks)
    monkeypatch.setenv("FLEET_REFRESH_SQL", '["SELECT 1"]')

    overrides = settings_overrides()

    assert overrides["refresh_sql"] == statements
    assert Settings().model_copy(update=overrides).refresh_sql == statements
    schema = FleetWarehouse.model_json_schema()["properties"]["refresh_sql"]
    assert schema["type"] == "array" and schema["items"]["type"] == "string"
    # An empty list sets nothing: the environment (none by default) decides.
    _serve(monkeypatch, {WAREHOUSE_BLOCK: FleetWarehouse(url="postgresql://wh/curated")})
    assert "refresh_sql" not in settings_overrides()


def test_reply_timeouts_come_from_the_connection_blocks(monkeypatch) -> None:
    """Every worker reads the blocks; a bound set on a connection's block reaches the
    store's and the warehouse's connections (Settings), and unset leaves the environment's."""
    blocks = _blocks()
    _serve(monkeypatch, blocks)
    monkeypatch.setenv("FLEET_DATABASE_REPLY_TIMEOUT_SECONDS", "12")
    assert not {"database_reply_timeout_seconds", "warehouse_reply_timeout_seconds"} & set(
        settings_overrides()
    )
    blocks[OPERATIONAL_DB_BLOCK] = FleetOperationalDatabase(url=DB_URL, reply_timeout_seconds=5)
    blocks[WAREHOUSE_BLOCK] = FleetWarehouse(
        url="postgresql://wh/curated", reply_timeout_seconds=60
    )
    settings = Settings().model_copy(update=settings_overrides())
    assert (settings.database_reply_timeout_seconds, settings.warehouse_reply_timeout_seconds) == (
        5,
        60,
    )
    with pytest.raises(ValidationError):
        FleetWarehouse(url="postgresql://wh/curated", reply_timeout_seconds=0)


def test_settings_overrides_empty_when_no_documents(monkeypatch, caplog) -> None:
    _serve(monkeypatch, {})
    with caplog.at_level(logging.DEBUG, logger="blocks"):
        assert settings_overrides() == {}
    assert not caplog.records  # a missing block is not worth a warning


def test_settings_overrides_maps_every_block(monkeypatch) -> None:
    _serve(monkeypatch, _blocks())
    overrides = settings_overrides()
    assert overrides == {
        "database_url": DB_URL,
        "warehouse": "postgres",
        "warehouse_url": f"postgresql://wh:{PASSWORD}@wh.internal/curated",
        "s3_endpoint_url": "http://127.0.0.1:5000",
        "staging_uri": "s3://fleet-staging/stage/",
    }
    assert set(overrides) <= set(Settings.model_fields)
    settings = Settings().model_copy(update=overrides)
    assert settings.database_url == DB_URL


def test_redshift_staging_uri_wins_over_landing(monkeypatch) -> None:
    blocks = _blocks()
    blocks[WAREHOUSE_BLOCK] = FleetWarehouse(
        backend="redshift",
        url="redshift://u:p@wh:5439/db",
        iam_role="arn:aws:iam::1:role/copy",
        staging_uri="s3://redshift-staging/copy/",
    )
    _serve(monkeypatch, blocks)
    overrides = settings_overrides()
    assert overrides["warehouse"] == "redshift"
    assert overrides["staging_uri"] == "s3://redshift-staging/copy/"


def test_only_present_blocks_override(monkeypatch) -> None:
    _serve(monkeypatch, {OPERATIONAL_DB_BLOCK: _blocks()[OPERATIONAL_DB_BLOCK]})
    assert settings_overrides() == {"database_url": DB_URL}


def test_load_errors_warn_without_secrets(monkeypatch, caplog) -> None:
    # pydantic keeps the offending input (a whole document for a missing field) in the error.
    with pytest.raises(ValidationError) as invalid_url:
        FleetOperationalDatabase.model_validate({"url": [DB_URL]})
    with pytest.raises(ValidationError) as missing_staging:
        FleetLandingBucket.model_validate(
            {"endpoint_url": "http://s3.internal", "aws_secret_access_key": AWS_SECRET}
        )
    assert PASSWORD in repr(invalid_url.value.errors())
    assert AWS_SECRET in str(missing_staging.value)
    invalid, missing_fields = invalid_url.value, missing_staging.value
    _serve(
        monkeypatch,
        {
            OPERATIONAL_DB_BLOCK: invalid,
            LANDING_BLOCK: missing_fields,
            WAREHOUSE_BLOCK: ConnectionError(f"cannot reach https://admin:{PASSWORD}@prefect/api"),
        },
    )
    with caplog.at_level(logging.WARNING, logger="blocks"):
        assert settings_overrides() == {}
    assert len(caplog.records) == 3
    logged = caplog.text
    assert "fleet-operational-database/fleet-operational-db" in logged
    assert "invalid block document (url:" in logged
    assert (
        "fleet-landing-bucket/fleet-landing" in logged and "staging_uri: Field required" in logged
    )
    assert "ConnectionError: cannot reach https://***@prefect/api" in logged
    assert PASSWORD not in logged and AWS_SECRET not in logged


def test_register_from_env_validates_before_writing() -> None:
    with pytest.raises(MissingVariables, match="FLEET_DATABASE_URL, FLEET_STAGING_URI"):
        blocks_from_env({"FLEET_DATABASE_URL": "", "FLEET_LANDING_BUCKET": "fleet-landing"})
    with pytest.raises(ValidationError):
        blocks_from_env({"FLEET_DATABASE_URL": DB_URL, "FLEET_STAGING_URI": "not-an-s3-uri"})
    for not_a_list in ("REFRESH MATERIALIZED VIEW v", '"one statement"', "[1]"):
        with pytest.raises(InvalidVariable, match="FLEET_REFRESH_SQL"):
            blocks_from_env(
                {
                    "FLEET_DATABASE_URL": DB_URL,
                    "FLEET_STAGING_URI": "s3://fleet-staging/",
                    "FLEET_REFRESH_SQL": not_a_list,
                }
            )
    built = blocks_from_env(
        {
            "FLEET_DATABASE_URL": DB_URL,
            "FLEET_LANDING_BUCKET": "fleet-landing",  # not stored any more
            "FLEET_STAGING_URI": "s3://fleet-staging/",
            "FLEET_REFRESH_SQL": '["REFRESH MATERIALIZED VIEW fleet_daily"]',
            "FLEET_WAREHOUSE_REPLY_TIMEOUT_SECONDS": "120",
        }
    )
    assert set(built) == {OPERATIONAL_DB_BLOCK, WAREHOUSE_BLOCK, LANDING_BLOCK}
    assert built[WAREHOUSE_BLOCK].url.get_secret_value() == DB_URL
    assert built[WAREHOUSE_BLOCK].refresh_sql == ["REFRESH MATERIALIZED VIEW fleet_daily"]
    assert built[WAREHOUSE_BLOCK].reply_timeout_seconds == 120
    assert built[OPERATIONAL_DB_BLOCK].reply_timeout_seconds is None  # the worker's decides
    assert built[LANDING_BLOCK].as_settings() == {"staging_uri": "s3://fleet-staging/"}


def test_warnings_go_to_the_flow_run_log_inside_a_run(monkeypatch, caplog) -> None:
    run_logger = logging.getLogger("test.flow-run")
    monkeypatch.setattr(fleet_blocks, "get_run_logger", lambda: run_logger)
    _serve(monkeypatch, {WAREHOUSE_BLOCK: RuntimeError("API answered 500")})
    with caplog.at_level(logging.WARNING):
        assert settings_overrides() == {}
    [record] = caplog.records
    assert record.name == "test.flow-run"
    assert "fleet-warehouse/fleet-warehouse: RuntimeError: API answered 500" in record.getMessage()
