"""The operational store: scope reservations, execution leases, batch transitions."""
