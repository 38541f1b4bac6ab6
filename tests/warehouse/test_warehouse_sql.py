"""The SQL both warehouse dialects share (fleet_import.warehouse.sql), parsed with sqlglot in
each dialect: one registry DDL whose dialects differ only in type names and the key, and the
registry statements each dialect's commit runs."""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from fleet_import.warehouse import sql as shared
from fleet_import.warehouse.postgres.ddl import DIALECT as POSTGRES
from fleet_import.warehouse.redshift.ddl import DIALECT as REDSHIFT


def test_the_registry_ddl_is_one_text_in_each_dialects_types() -> None:
    postgres, redshift = (shared.create_registry_sql(d) for d in (POSTGRES, REDSHIFT))
    tree = sqlglot.parse_one(postgres, read="postgres")
    assert isinstance(tree, exp.Create) and tree.find(exp.PrimaryKey)
    assert isinstance(sqlglot.parse_one(redshift, read="redshift"), exp.Create)
    for column, pg_type in POSTGRES.registry_types.items():
        redshift_type = REDSHIFT.registry_types[column]
        redshift = redshift.replace(f'"{column}" {redshift_type} ', f'"{column}" {pg_type} ')
    key = ', PRIMARY KEY ("tenant_id", "source_scope", "dataset"))'
    assert postgres == redshift[:-1] + key


def test_registering_upserts_where_keys_are_enforced_and_reinserts_elsewhere() -> None:
    datasets = {"trips": (3, "curated.fleet_trips"), "fuel": (0, "curated.fleet_fuel")}
    registered = ["fuel", "vehicles"]
    postgres = shared.register_slices_sql(POSTGRES, "acme", "scope", "b", datasets, registered)
    kinds = [sqlglot.parse_one(text, read="postgres") for text, _ in postgres]
    assert [type(k) for k in kinds] == [exp.Insert, exp.Insert, exp.Delete]
    assert all(text.count("ON CONFLICT") == 1 for text, _ in postgres[:2])
    assert postgres[2][1] == ["acme", "scope", "vehicles"]  # only the dataset that left

    redshift = shared.register_slices_sql(REDSHIFT, "acme", "scope", "b", datasets, registered)
    kinds = [sqlglot.parse_one(text, read="redshift") for text, _ in redshift]
    assert [type(k) for k in kinds] == [exp.Delete, exp.Insert, exp.Insert]
    assert redshift[0][1] == ["acme", "scope"]  # the whole scope, re-inserted after
    assert all("ON CONFLICT" not in text and "GETDATE()" in text for text, _ in redshift[1:])
    for text, params in (*postgres, *redshift):
        assert text.count("%s") == len(params)


def test_the_stamp_filter_leads_with_the_batch_id() -> None:
    one, params = shared.stamp_filter("acme", "scope", ["b1"], qualifier='"t".')
    assert (
        one == '"t"."ingestion_batch_id" = %s AND "t"."tenant_id" = %s AND "t"."source_scope" = %s'
    )
    assert params == ["b1", "acme", "scope"]
    many, params = shared.stamp_filter("acme", "scope", ["b1", "b2"])
    assert many.startswith('"ingestion_batch_id" IN (%s, %s) AND')
    assert params == ["b1", "b2", "acme", "scope"]
