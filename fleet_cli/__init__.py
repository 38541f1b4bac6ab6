"""The `fleet-import` command. Outside the core on purpose: it starts Prefect flows, and
`fleet_import` never imports Prefect (import-linter contracts in pyproject.toml)."""
