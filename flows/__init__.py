"""Prefect flows: thin orchestration over fleet_import. No SQL and no business rules here."""
