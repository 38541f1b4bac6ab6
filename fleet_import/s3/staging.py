"""Where normalized Parquet and rejects files live between runs: an S3 prefix (required for
Redshift, whose COPY reads from S3) or a local directory (enough for PostgreSQL)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fleet_import.errors import (
    ErrorKind,
    FleetImportError,
    TransientError,
    transient_variant_of,
)
from fleet_import.s3.client import TRANSFER_CONFIG
from fleet_import.s3.errors import s3_errors


class StagingError(FleetImportError):
    """The staging area could not be read or written."""

    bucket_named_by = "FLEET_STAGING_URI"


@transient_variant_of(StagingError)
class TransientStagingError(StagingError, TransientError):
    """The staging area could not be reached this time; worth a retry."""

    default_kind = ErrorKind.TRANSIENT


class StagingArea:
    """Names are relative paths (`normalized/trips/abc.parquet`); `uri(name)` is absolute."""

    def __init__(self, uri: str, s3: Any | None = None) -> None:
        self._uri = uri.rstrip("/") + "/"
        parts = urlsplit(self._uri)
        self._is_s3 = parts.scheme == "s3"
        if self._is_s3:
            if s3 is None:
                raise StagingError(
                    "an S3 staging area needs an S3 client", kind=ErrorKind.CONFIGURATION
                )
            self._bucket, self._prefix = parts.netloc, parts.path.lstrip("/")
        else:
            self._root = Path(parts.path if parts.scheme == "file" else uri)
        self._s3 = s3

    def uri(self, name: str) -> str:
        return self._uri + name

    def put_file(self, local: Path, name: str) -> str:
        if self._is_s3:
            self._call(
                f"upload of {name}",
                self._s3.upload_file,
                str(local),
                self._bucket,
                self._prefix + name,
                Config=TRANSFER_CONFIG,
            )
        else:
            target = self._root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, target)
        return self.uri(name)

    def get_file(self, name: str, local: Path) -> Path:
        """Copy a staged object to `local`; StagingError if it is gone."""
        local.parent.mkdir(parents=True, exist_ok=True)
        if self._is_s3:
            self._call(
                f"download of {name}",
                self._s3.download_file,
                self._bucket,
                self._prefix + name,
                str(local),
                Config=TRANSFER_CONFIG,
            )
        else:
            source = self._root / name
            if not source.is_file():
                raise StagingError(f"staged file {self.uri(name)} is missing")
            shutil.copyfile(source, local)
        return local

    def delete(self, names: list[str]) -> None:
        if self._is_s3:
            for start in range(0, len(names), 1000):
                chunk = [{"Key": self._prefix + n} for n in names[start : start + 1000]]
                self._call(
                    f"delete of {len(chunk)} objects",
                    self._s3.delete_objects,
                    Bucket=self._bucket,
                    Delete={"Objects": chunk, "Quiet": True},
                )
        else:
            for name in names:
                (self._root / name).unlink(missing_ok=True)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """The boundary: what boto3 and botocore raise leaves as TransientStagingError or
        StagingError (s3.errors); transfers take TRANSFER_CONFIG, so that botocore's attempts
        are the only ones."""
        with s3_errors(f"staging {what} failed in {self._uri}", StagingError, brief=True):
            return fn(*args, **kwargs)
