"""First contact: settings checked before anything starts, foreseen errors explained in one
line, and the connections `fleet-import doctor` tests (all without Prefect)."""
