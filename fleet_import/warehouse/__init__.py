"""The warehouse: curated tables replaced one (tenant, scope) slice at a time.

base.py is what the pipeline sees; committer.py and sql.py are what the backends share (the
slice registry, slice deletes and counts); postgres/ and redshift/ each hold ddl.py,
slice_sql.py, driver.py, writer.py and warehouse.py. The Redshift backend needs the
`redshift` extra, so it is imported from fleet_import.warehouse.redshift only when used.
"""

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
