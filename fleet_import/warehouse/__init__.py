"""The warehouse: curated tables replaced one (tenant, scope) slice at a time.

base.py is what the pipeline sees; committer.py and sql.py are what the backends share (the
slice registry, slice deletes and counts); postgres/ and redshift/ each hold ddl.py,
slice_sql.py, driver.py, writer.py and warehouse.py. The Redshift backend needs the
`redshift` extra, so it is imported from fleet_import.warehouse.redshift only when used.
"""
