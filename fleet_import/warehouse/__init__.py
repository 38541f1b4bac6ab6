"""The warehouse: curated tables replaced one (tenant, scope) slice at a time."""

from fleet_import.warehouse.base import (
    SOURCE_LINE_COLUMN,
    STAMP_COLUMNS,
    DatasetLoad,
    LoadFile,
    Progress,
    SliceCommit,
    SliceWriter,
    Warehouse,
    WarehouseError,
    WarehouseSession,
)
from fleet_import.warehouse.postgres import PostgresWarehouse

__all__ = [
    "SOURCE_LINE_COLUMN",
    "STAMP_COLUMNS",
    "DatasetLoad",
    "LoadFile",
    "PostgresWarehouse",
    "Progress",
    "SliceCommit",
    "SliceWriter",
    "Warehouse",
    "WarehouseError",
    "WarehouseSession",
]
