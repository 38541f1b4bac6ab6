"""Who the tenants are (the registry), which folders are theirs (binding) and where their
slices live (databases). Nothing is re-exported: import from the defining module."""
