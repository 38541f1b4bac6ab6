"""Offboarding a tenant: its data removed, and the removal recorded. Nothing re-exported."""
