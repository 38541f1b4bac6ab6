"""Prefect Block classes holding fleet-import configuration, and their registration.

`blocks.fleet_blocks` defines the blocks and `settings_overrides()`, which flows apply over
the environment settings; `python -m blocks.register` registers the types (and, with
`--from-env`, the documents) with the Prefect API.
"""
