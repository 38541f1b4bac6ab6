"""The PostgreSQL warehouse: ddl.py (types and tables), slice_sql.py and queries.sql (what
only PostgreSQL runs), binary_copy.py (Arrow -> COPY BINARY), driver.py (connections and
their errors), writer.py (one slice replacement), warehouse.py (the Warehouse)."""
