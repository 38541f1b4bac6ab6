"""The Redshift SQL builders, checked by parsing their output with sqlglot's Redshift dialect
(no cluster needed): each statement parses, is the expected kind, and quotes what it must."""

from __future__ import annotations

import re

import pytest
import sqlglot
from sqlglot import exp

from fleet_import.contracts.fleet import FLEET_DATASETS, TRIPS, VEHICLES
from fleet_import.contracts.model import VARCHAR_MAX_BYTES, Column, DatasetContract
from fleet_import.errors import WarehouseError
from fleet_import.warehouse import sql as shared
from fleet_import.warehouse.redshift import ddl, driver, slice_sql
from fleet_import.warehouse.redshift.ddl import DIALECT

ROLE = "arn:aws:iam::123456789012:role/fleet-copy"
AWKWARD = DatasetContract(
    name="orders",
    file_glob="orders*",
    target_table="select.order",
    natural_key=("from", "user"),
    columns=(Column("from", "string", nullable=False), Column("user", "int64")),
)


def parse(sql: str) -> exp.Expression:
    return sqlglot.parse_one(sql, read="redshift")


def columns_of(create: exp.Expression) -> dict[str, str]:
    return {c.name: c.args["kind"].sql("redshift") for c in create.find_all(exp.ColumnDef)}


@pytest.mark.parametrize("contract", list(FLEET_DATASETS.values()), ids=lambda c: c.name)
def test_create_table_parses_with_redshift_types_and_no_keys(contract: DatasetContract) -> None:
    tree = parse(ddl.create_table_sql(contract))
    assert isinstance(tree, exp.Create) and tree.args.get("exists")
    columns = columns_of(tree)
    assert list(columns) == [
        *contract.column_names,
        "tenant_id",
        "source_scope",
        "ingestion_batch_id",
    ]
    assert not list(tree.find_all(exp.PrimaryKey, exp.UniqueColumnConstraint))


def test_varchar_lengths_are_bytes() -> None:
    columns = columns_of(parse(ddl.create_table_sql(VEHICLES)))
    assert columns["vin"] == "VARCHAR(68)"  # 17 characters, up to 4 bytes each
    assert columns["vehicle_id"] == "VARCHAR(256)"
    assert columns["fuel_type"] == "VARCHAR(8)"  # only `allowed`: its longest value, "electric"
    assert columns["status"] == "VARCHAR(11)"  # "maintenance"
    assert columns["ingestion_batch_id"] == "VARCHAR(36)"
    widths = DatasetContract(
        name="notes",
        file_glob="n*",
        target_table="curated.notes",
        natural_key=("k",),
        columns=(
            Column("k", "string"),
            Column("widest", "string", max_length=16383),
            Column("grade", "string", allowed=("a", "très bien")),  # è is 2 bytes
            Column("both", "string", allowed=("long enough",), max_length=4),
        ),
    )
    columns = columns_of(parse(ddl.create_table_sql(widths)))
    assert columns["k"] == f"VARCHAR({VARCHAR_MAX_BYTES})"
    assert columns["widest"] == "VARCHAR(65532)"
    assert columns["grade"] == "VARCHAR(10)"
    assert columns["both"] == "VARCHAR(11)"  # the tighter of the two bounds


def test_curated_tables_are_sorted_by_slice_and_spread_evenly() -> None:
    tree = parse(ddl.create_table_sql(TRIPS))
    properties = {type(p).__name__: p.sql("redshift") for p in tree.args["properties"]}
    assert properties == {
        "DistStyleProperty": "DISTSTYLE EVEN",
        "SortKeyProperty": 'SORTKEY("tenant_id", "source_scope")',
    }


def test_a_grown_contract_widens_its_varchars_and_nothing_else() -> None:
    def found(contract: DatasetContract) -> list[ddl.TableColumn]:
        return ddl.expected_columns(contract)

    assert ddl.widen_sql(VEHICLES, found(VEHICLES)) == []
    grown = VEHICLES.model_copy(
        update={
            "columns": tuple(
                c.model_copy(update={"max_length": 40}) if c.name == "vin" else c
                for c in VEHICLES.columns
            )
        }
    )
    [widen] = ddl.widen_sql(grown, found(VEHICLES))
    assert widen == ('ALTER TABLE "curated"."fleet_vehicles" ALTER COLUMN "vin" TYPE VARCHAR(160)')
    assert isinstance(parse(widen), exp.Alter)
    assert ddl.widen_sql(VEHICLES, found(grown)) == []  # a wider column holds every value
    retyped = [
        (n, "bigint" if n == "vin" else t, None if n == "vin" else w) for n, t, w in found(VEHICLES)
    ]
    with pytest.raises(
        WarehouseError, match=r"vin bigint, .* expected .*vin character varying\(68\)"
    ):
        ddl.widen_sql(VEHICLES, retyped)


def test_types_of_every_kind() -> None:
    columns = columns_of(parse(ddl.create_table_sql(TRIPS)))
    assert columns["started_at"] in ("TIMESTAMPTZ", "TIMESTAMP WITH TIME ZONE")
    assert columns["distance_km"] == "DOUBLE PRECISION"
    every = DatasetContract(
        name="every",
        file_glob="e*",
        target_table="curated.every",
        natural_key=("i",),
        columns=tuple(
            Column(n, t)
            for n, t in (("i", "int64"), ("b", "bool"), ("d", "date"))  # type: ignore[arg-type]
        ),
    )
    columns = columns_of(parse(ddl.create_table_sql(every)))
    assert (columns["i"], columns["b"], columns["d"]) == ("BIGINT", "BOOLEAN", "DATE")


def test_staging_table_holds_only_the_contract_columns() -> None:
    tree = parse(slice_sql.create_staging_sql(TRIPS))
    assert isinstance(tree, exp.Create)
    assert "TEMPORARY" in tree.sql("redshift")
    assert list(columns_of(tree)) == TRIPS.column_names
    keys = parse(slice_sql.create_keys_sql(AWKWARD))
    assert list(columns_of(keys)) == ["from", "user"]


def test_copy_uses_iam_role_and_parquet_manifest_only() -> None:
    sql = slice_sql.copy_sql("fleet_stage_trips", "s3://bucket/stage/acme/b/trips.manifest", ROLE)
    tree = parse(sql)
    assert isinstance(tree, exp.Copy)
    assert re.fullmatch(
        r"COPY \"fleet_stage_trips\" FROM 's3://bucket/stage/acme/b/trips\.manifest' "
        r"IAM_ROLE 'arn:aws:iam::123456789012:role/fleet-copy' FORMAT AS PARQUET MANIFEST",
        sql,
    )
    assert not re.search(r"CREDENTIALS|ACCESS_KEY|SECRET|TOKEN", sql)


def test_copy_quotes_literals() -> None:
    sql = slice_sql.copy_sql("t", "s3://b/it's.manifest", ROLE)
    assert "'s3://b/it''s.manifest'" in sql
    assert isinstance(parse(sql), exp.Copy)


def test_insert_stamps_rows_with_parameters() -> None:
    sql, params = slice_sql.insert_stamped_sql(TRIPS, "acme", "scope", "batch")
    tree = parse(sql)
    assert isinstance(tree, exp.Insert)
    assert params == ["acme", "scope", "batch"]
    assert sql.count("%s") == 3
    select = tree.expression
    assert isinstance(select, exp.Select)
    assert select.find(exp.From).this.name == "fleet_stage_trips"
    assert len(select.expressions) == len(TRIPS.column_names) + 3


def test_deletes_are_scoped_by_tenant_scope_and_batch() -> None:
    sql, params = shared.delete_slice_sql("curated.fleet_trips", "acme", "scope", ["b1", "b2"])
    tree = parse(sql)
    assert isinstance(tree, exp.Delete)
    assert params == ["b1", "b2", "acme", "scope"] and sql.count("%s") == 4
    assert {c.name for c in tree.find_all(exp.Column)} == {
        "ingestion_batch_id",
        "tenant_id",
        "source_scope",
    }
    sql, params = shared.delete_keys_sql(AWKWARD, "acme", "scope", "b1")
    tree = parse(sql)
    assert isinstance(tree, exp.Delete) and tree.args.get("using")
    assert '"select"."order"."from" = "fleet_discard_orders"."from"' in sql
    assert params == ["b1", "acme", "scope"] and sql.count("%s") == 3


def test_registry_statements_parse() -> None:
    assert isinstance(parse(shared.create_registry_sql(DIALECT)), exp.Create)
    assert "PRIMARY KEY" not in shared.create_registry_sql(DIALECT)  # Redshift would not enforce it
    sql, params = shared.register_slice_sql(
        DIALECT, "acme", "scope", "trips", "b", 3, "curated.fleet_trips"
    )
    assert isinstance(parse(sql), exp.Insert) and sql.count("%s") == len(params) == 6
    for sql, params in (
        shared.forget_slices_sql("acme", "scope"),
        shared.registered_slices_sql("acme", "scope"),
        shared.count_slice_sql("curated.fleet_trips", "acme", "scope", "b"),
        ddl.table_columns_sql("curated", "fleet_trips"),
        ddl.registry_exists_sql(),
    ):
        parse(sql)
        assert sql.count("%s") == len(params)
    assert isinstance(parse(shared.drop_table_sql("fleet_stage_trips")), exp.Drop)
    assert isinstance(parse(shared.create_schema_sql("select")), exp.Create)


def test_identifiers_are_quoted() -> None:
    sql = ddl.create_table_sql(AWKWARD)
    assert sql.startswith(
        'CREATE TABLE IF NOT EXISTS "select"."order" ("from" VARCHAR(65535) NOT NULL'
    )
    parse(sql)
    assert shared.quote_identifier('a"b') == '"a""b"'


@pytest.mark.parametrize(
    ("kwargs", "configured", "serverless"),
    [
        ({"host": "fleet.123456789012.eu-west-1.redshift-serverless.amazonaws.com"}, None, True),
        ({"host": "WG.123456789012.cn-north-1.redshift-serverless.amazonaws.com.cn"}, None, True),
        ({"host": "fleet.abc123xyz.eu-west-1.redshift.amazonaws.com"}, None, False),
        ({"host": "redshift.internal.example.com", "is_serverless": True}, None, True),
        ({"host": "fleet.123456789012.eu-west-1.redshift-serverless.amazonaws.com"}, False, False),
        ({"host": "127.0.0.1"}, True, True),
        ({}, None, False),
    ],
)
def test_serverless_is_configured_or_read_from_the_workgroup_host(
    kwargs: dict[str, object], configured: bool | None, serverless: bool
) -> None:
    assert driver.is_serverless(kwargs, configured) is serverless


def test_fleet_redshift_serverless_reaches_the_driver() -> None:
    from fleet_import.config import Settings

    on = Settings(redshift_host="h", redshift_serverless=True).redshift_connect_kwargs()
    off = Settings(redshift_host="h").redshift_connect_kwargs()
    assert on["is_serverless"] is True and "is_serverless" not in off


@pytest.mark.parametrize("serverless", [False, True])
def test_session_sql_uses_only_what_the_deployment_offers(serverless: bool) -> None:
    """Serverless refuses STL/STV tables: its statements read SYS views only."""
    statements = [driver._STV_IDENTITY, driver._STV_END]
    if serverless:
        statements = [driver._SYS_IDENTITY, driver._SYS_ACTIVE]
    for text in statements:
        parse(text.replace("%s", "1"))
        assert ("stv_" in text) is not serverless
