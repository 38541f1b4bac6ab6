"""import_folder with money as decimals and a renamed export: moto's S3 server, a real
PostgreSQL. Values arrive exact; the alias that matched is in the batch's details."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

from fleet_import.contracts.fleet import FLEET_DATASETS, FUEL_TRANSACTIONS
from fleet_import.contracts.model import ContractSet
from fleet_import.importing.context import Committed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant
from tests.helpers import curated, upload

ACME = Tenant.named("acme")
RENAMED_FUEL = FUEL_TRANSACTIONS.model_copy(
    update={
        "columns": tuple(
            column.model_copy(update={"aliases": ("totalAmount",)})
            if column.name == "total_amount"
            else column
            for column in FUEL_TRANSACTIONS.columns
        ),
        "max_reject_ratio": 0.5,  # one of the three rows is rejected on purpose
    }
)
HEADER = (
    "transaction_id,vehicle_id,driver_id,transacted_at,fuel_type,litres,price_per_litre,"
    "TotalAmount,currency,station_id,odometer_km\n"
)


def test_money_loads_exactly_and_a_renamed_header_through_its_alias(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    contracts = ContractSet(
        [*(c for c in FLEET_DATASETS.values() if c.name != "fuel_transactions"), RENAMED_FUEL]
    )
    ctx = dataclasses.replace(import_ctx, contracts=contracts)
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=20, fuel=0, vehicles=5)
    del files["fuel_transactions.parquet"]
    files["fuel_transactions.csv"] = (
        HEADER
        + "F1,V1,,2026-07-22T08:00:00Z,diesel,40.5,1.7891,9999999999.99,EUR,S1,1000\n"
        + "F2,V1,,2026-07-22T09:00:00Z,diesel,40.5,0.0001,-0.01,EUR,S1,1000\n"
        + "F3,V1,,2026-07-22T09:00:00Z,diesel,40.5,1.12345,1.00,EUR,S1,1000\n"
    ).encode()
    upload(s3, folder, files)
    outcome = import_folder(ctx, ACME, folder, "delivery-1")
    assert isinstance(outcome, Committed), outcome
    assert outcome.row_counts["fuel_transactions"] == 2
    rows = curated(
        database_url,
        "SELECT transaction_id, price_per_litre, total_amount"
        " FROM curated.fleet_fuel_transactions ORDER BY transaction_id",
    )
    assert rows == [
        ("F1", Decimal("1.7891"), Decimal("9999999999.99")),
        ("F2", Decimal("0.0001"), Decimal("-0.01")),
    ]
    details = ctx.repo.get(outcome.batch_id).details
    [fuel] = [f for f in details["summary"]["files"] if f["dataset"] == "fuel_transactions"]
    assert fuel["aliases"] == {"total_amount": "TotalAmount"}
    [reject] = details["rejects"]["sample"]
    assert (reject["line"], reject["column"], reject["reason"]) == (
        4,
        "price_per_litre",
        "more than 4 decimal places (the column is decimal(10,4))",
    )
