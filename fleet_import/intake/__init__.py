"""Intake: the landing layout, the sweep, the S3-notification relay."""
