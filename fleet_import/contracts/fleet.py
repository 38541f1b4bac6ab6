"""The Fleet datasets the product ships: vehicles, trips, fuel transactions."""

from __future__ import annotations

from fleet_import.contracts.model import Column, ContractSet, DatasetContract

_FUEL_TYPES = ("diesel", "petrol", "electric", "hybrid", "lpg", "cng")

VEHICLES = DatasetContract(
    name="vehicles",
    file_glob="vehicles*",
    target_table="curated.fleet_vehicles",
    natural_key=("vehicle_id",),
    description="The tenant's vehicle register.",
    columns=(
        Column("vehicle_id", "string", nullable=False, max_length=64),
        Column("vin", "string", nullable=False, max_length=17),
        Column("registration", "string", max_length=16),
        Column("make", "string", max_length=64),
        Column("model", "string", max_length=64),
        Column("model_year", "int64", min_value=1950),
        Column("fuel_type", "string", nullable=False, allowed=_FUEL_TYPES),
        Column("status", "string", nullable=False, allowed=("active", "maintenance", "retired")),
        Column("odometer_km", "float64", min_value=0),
        Column("updated_at", "timestamptz", nullable=False),
    ),
)

TRIPS = DatasetContract(
    name="trips",
    file_glob="trips*",
    target_table="curated.fleet_trips",
    natural_key=("trip_id",),
    description="Completed, cancelled and ongoing trips.",
    columns=(
        Column("trip_id", "string", nullable=False, max_length=64),
        Column("vehicle_id", "string", nullable=False, max_length=64),
        Column("driver_id", "string", max_length=64),
        Column("started_at", "timestamptz", nullable=False),
        Column("ended_at", "timestamptz"),
        Column("distance_km", "float64", min_value=0),
        Column("start_odometer_km", "float64", min_value=0),
        Column("end_odometer_km", "float64", min_value=0),
        Column(
            "status", "string", nullable=False, allowed=("completed", "cancelled", "in_progress")
        ),
    ),
)

FUEL_TRANSACTIONS = DatasetContract(
    name="fuel_transactions",
    file_glob="fuel_transactions*",
    target_table="curated.fleet_fuel_transactions",
    natural_key=("transaction_id",),
    description="Fuel card transactions.",
    # 2: money as decimals (price_per_litre, total_amount), no longer float64.
    version="2",
    columns=(
        Column("transaction_id", "string", nullable=False, max_length=64),
        Column("vehicle_id", "string", nullable=False, max_length=64),
        Column("driver_id", "string", max_length=64),
        Column("transacted_at", "timestamptz", nullable=False),
        Column("fuel_type", "string", nullable=False, allowed=_FUEL_TYPES),
        Column("litres", "float64", nullable=False, min_value=0),
        Column("price_per_litre", "decimal(10,4)", min_value=0),
        Column("total_amount", "decimal(12,2)", nullable=False),
        Column("currency", "string", nullable=False, max_length=3),
        Column("station_id", "string", max_length=64),
        Column("odometer_km", "float64", min_value=0),
    ),
)

FLEET_DATASETS = ContractSet([VEHICLES, TRIPS, FUEL_TRANSACTIONS])
