"""Post-commit publication: the outbox steps and the events they tell."""
