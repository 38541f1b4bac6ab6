"""Prefect Block classes holding fleet-import configuration, and their registration.

`blocks.fleet_blocks` defines the blocks and `settings_overrides()`, which flows apply over
the environment settings; `python -m blocks.register` registers the types (and, with
`--from-env`, the documents) with the Prefect API, with the load limits (`blocks.limits`)
and the automation that marks a dead flow run Crashed (`blocks.zombies`).
"""
