"""The Redshift warehouse: ddl.py (types and tables), slice_sql.py (what only Redshift runs:
temp tables, COPY from S3, stamped inserts), driver.py (connections, sessions and their
errors), writer.py (one slice replacement), warehouse.py (the Warehouse). Needs the
`redshift` extra (redshift_connector)."""
