"""Freshness: when tenants' deliveries are expected (SLOs), and whether they came."""
