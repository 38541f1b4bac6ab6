"""S3: the client, discovering a folder's source files, the staging area."""
