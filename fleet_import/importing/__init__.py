"""The import of one folder: claim, normalize, load, settle, resume."""
