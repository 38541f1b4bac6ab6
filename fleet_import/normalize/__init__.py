"""Normalization: one source file to typed Parquet plus its rejects."""
