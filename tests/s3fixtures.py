"""Placeholder: moto server fixtures are being written (helper C)."""
