"""The exception tree of fleet-import: one base, each docstring is the default message."""

from __future__ import annotations


class FleetImportError(Exception):
    """fleet-import failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class InvalidInput(FleetImportError, ValueError):
    """The input was rejected before anything was written."""


class OperationalStoreError(FleetImportError):
    """The operational database could not complete the operation."""

    def __init__(self, message: str | None = None, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class LeaseLost(FleetImportError):
    """This worker no longer holds the batch's execution lease; it must stop writing."""


class DetailsInvalid(FleetImportError):
    """The batch's details could not be parsed."""


class PreCommitError(FleetImportError):
    """The delivery cannot be loaded as it is; the batch fails before touching the warehouse.

    Terminal for the batch: recovery is a new delivery. Never retried.
    """


class TransientError(FleetImportError):
    """A failure that may pass on its own (throttling, a dropped connection); worth a retry."""
