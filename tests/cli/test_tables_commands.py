"""`fleet-import tables migrate` and `contracts show` as a user reads them (issue 25, parts
4 and 5): the plan per table and its exit code, the contracts with versions, columns, keys
and policies, and what each curated table holds against them."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from typer.testing import CliRunner

from fleet_cli.cli import app
from fleet_import.contracts.fleet import FLEET_DATASETS, FUEL_TRANSACTIONS
from fleet_import.warehouse.postgres.warehouse import PostgresWarehouse
from tests.warehouse_helpers import FLOAT_FUEL


def _invoke(database_url: str, *args: str) -> Any:
    env = {"FLEET_DATABASE_URL": database_url, "FLEET_WAREHOUSE_URL": "", "COLUMNS": "200"}
    return CliRunner().invoke(app, list(args), env=env)


def test_migrate_plans_per_table_and_exits_3_until_applied(
    database_url: str, db: psycopg.Connection[Any]
) -> None:
    PostgresWarehouse(database_url).ensure_tables([FLOAT_FUEL])
    planned = _invoke(database_url, "tables", "migrate")
    assert planned.exit_code == 3, planned.output
    assert "curated.fleet_trips: missing (the first load creates it)" in planned.output
    assert (
        "curated.fleet_fuel_transactions: in place: price_per_litre: double precision -> "
        "numeric(10,4), in place; total_amount: double precision NOT NULL -> "
        "numeric(12,2) NOT NULL, in place"
    ) in planned.output
    assert "run `fleet-import tables migrate --apply` to make these changes" in planned.output

    applied = _invoke(database_url, "tables", "migrate", "--apply")
    assert applied.exit_code == 0, applied.output
    assert "migrated (in place): 0 rows kept" in applied.output
    again = _invoke(database_url, "tables", "migrate")
    assert again.exit_code == 0, again.output
    assert "curated.fleet_fuel_transactions: matches dataset 'fuel_transactions'" in again.output


def test_migrate_takes_a_tenant_or_a_database_not_both(database_url: str) -> None:
    both = _invoke(database_url, "tables", "migrate", "--tenant", "acme", "--database", "x")
    assert both.exit_code == 2
    assert "give --tenant or --database, not both" in both.output


def test_contracts_show_lists_every_contract_and_what_its_table_holds(
    database_url: str,
) -> None:
    PostgresWarehouse(database_url).ensure_tables([FLOAT_FUEL])
    shown = _invoke(database_url, "contracts", "show", "--json", "--tenant", "acme")
    assert shown.exit_code == 0, shown.output
    document = json.loads(shown.stdout)
    contracts = {c["dataset"]: c for c in document["contracts"]}
    assert list(contracts) == list(FLEET_DATASETS)
    fuel = contracts["fuel_transactions"]
    assert fuel["version"] == "2"
    assert fuel["contract_version"] == FUEL_TRANSACTIONS.contract_version
    assert fuel["natural_key"] == ["transaction_id"]
    types = {c["name"]: (c["type"], c["nullable"]) for c in fuel["columns"]}
    assert types["total_amount"] == ("decimal(12,2)", False)
    assert fuel["policies"]["max_reject_ratio"] == 0.05
    assert fuel["policies"]["min_rows_ratio"] == 0.5
    tables = {t["dataset"]: t for t in document["tables"]}
    assert tables["trips"]["state"] == "missing" and tables["trips"]["migrate"] is None
    differs = tables["fuel_transactions"]
    assert differs["state"] == "differs"
    assert [c["column"] for c in differs["changes"]] == ["price_per_litre", "total_amount"]
    assert differs["migrate"] == "fleet-import tables migrate --tenant acme --apply"

    text = _invoke(database_url, "contracts", "show")
    assert text.exit_code == 0, text.output
    assert "fuel_transactions  version 2 (2-" in text.output
    assert "-> curated.fleet_fuel_transactions, key (transaction_id)" in text.output
    assert "total_amount" in text.output and "decimal(12,2)" in text.output
    assert "run `fleet-import tables migrate --apply`" in text.output


def _row_of(output: str, column: str) -> str:
    return next(line for line in output.splitlines() if line.split()[:1] == [column])


def test_contracts_show_prints_a_zero_bound(database_url: str) -> None:
    """`min_value=0` is a rule (no negative distance), not a missing one: 0 == False in
    Python, and the rules' filter dropped it with the false flags (issue #46 item 9)."""
    text = _invoke(database_url, "contracts", "show")
    assert text.exit_code == 0, text.output
    assert "min_value=0" in _row_of(text.output, "distance_km")
    assert "min_value=1950" in _row_of(text.output, "model_year")
    assert "max_value" not in _row_of(text.output, "distance_km")  # unset stays unshown
