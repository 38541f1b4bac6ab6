"""The import of one folder: claim, normalise, load, settle, resume."""
