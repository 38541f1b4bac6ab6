"""The exception tree of fleet-import: one base, each docstring is the default message.

Every error has a `kind` (ErrorKind): what may be done about it. A class gives its default;
a boundary that translates a driver's error sets the kind the classification table
(error_table.py) decides, and the driver's code (SQLSTATE, S3 error code) with it. Retry
decisions read the kind, never the class or the message.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import ClassVar, TypeVar


class ErrorKind(enum.Enum):
    """What may be done about an error."""

    TRANSIENT = "transient"
    """It may pass on its own (throttling, a dropped connection, a serialization conflict):
    worth a retry with backoff."""
    TERMINAL = "terminal"
    """The request or the data is wrong: sent again, it fails the same way. Never retried;
    recovery is a new delivery (before the commit) or a fix (after it)."""
    LEASE_LOST = "lease_lost"
    """This worker no longer holds the batch: it must stop writing. Never retried."""
    CONFIGURATION = "configuration"
    """Nothing can succeed until an operator changes something outside the data
    (credentials, permissions, a missing database or bucket). Never retried."""


class FleetImportError(Exception):
    """fleet-import failed."""

    default_kind: ClassVar[ErrorKind] = ErrorKind.TERMINAL
    bucket_named_by: ClassVar[str | None] = None
    """For an S3 error: where the bucket it failed on is named (a variable, or the folder),
    which `fleet_import.explain` gives as what to check."""

    def __init__(
        self, message: str | None = None, *, kind: ErrorKind | None = None, code: str | None = None
    ) -> None:
        super().__init__(message or (self.__doc__ or "").strip())
        self.kind = kind or self.default_kind
        self.code = code
        """The driver's own code for what happened (SQLSTATE, S3 error code), if any."""
        self.retried = False
        """The client below already retried it within its stated bound (S3: botocore is the
        one layer that retries S3): transient still, but no layer above retries it again."""

    @property
    def transient(self) -> bool:
        """Worth a retry: read from `kind`."""
        return self.kind is ErrorKind.TRANSIENT


class InvalidInput(FleetImportError, ValueError):
    """The input was rejected before anything was written."""


class ConfigurationError(InvalidInput):
    """The configuration is incomplete or wrong; an operator must change it."""

    default_kind = ErrorKind.CONFIGURATION


def is_transient(exc: BaseException) -> bool:
    """Worth another try: the kind the boundary gave the error (the step runners' rule)."""
    return isinstance(exc, FleetImportError) and exc.kind is ErrorKind.TRANSIENT


def should_retry(exc: BaseException) -> bool:
    """What a step runner (CoreSteps, the flow's Prefect tasks) retries: a transient error
    that no layer below has retried already, so each dependency has one retry layer."""
    return is_transient(exc) and not getattr(exc, "retried", False)


class OperationalStoreError(FleetImportError):
    """The operational database could not complete the operation."""


class WarehouseError(FleetImportError):
    """The warehouse could not complete the operation; nothing of it was committed."""

    def __init__(
        self,
        message: str | None = None,
        *,
        kind: ErrorKind | None = None,
        code: str | None = None,
        backend: str = "postgres",
        setting: str | None = None,
    ) -> None:
        super().__init__(message, kind=kind, code=code)
        self.backend = backend
        """The backend that raised it ("postgres", "redshift"): which settings name that
        warehouse, for the next step `fleet_import.explain` gives. A wrapper passes it on."""
        self.setting = setting
        """PostgreSQL: the variable its URL came from (FLEET_DATABASE_URL when the warehouse
        is the operational database's, FLEET_WAREHOUSE_URL unset); None: FLEET_WAREHOUSE_URL."""


class LeaseLost(FleetImportError):
    """This worker no longer holds the batch's execution lease; it must stop writing."""

    default_kind = ErrorKind.LEASE_LOST


class LeaseUnconfirmed(LeaseLost, OperationalStoreError):
    """The operational database has not confirmed this worker's lease for so long that it
    may have expired: the worker stops touching the warehouse (the fence, issue #26)."""


class DetailsInvalid(FleetImportError):
    """The batch's details could not be parsed."""


class PreCommitError(FleetImportError):
    """The delivery cannot be loaded as it is; the batch fails before touching the warehouse.

    Terminal for the batch: recovery is a new delivery. Never retried.
    """


class TransientError(FleetImportError):
    """A failure that may pass on its own (throttling, a dropped connection); worth a retry."""

    default_kind = ErrorKind.TRANSIENT


_TRANSIENT_VARIANTS: dict[type[FleetImportError], type[FleetImportError]] = {}

E = TypeVar("E", bound=FleetImportError)


def transient_variant_of(base: type[FleetImportError]) -> Callable[[type[E]], type[E]]:
    """Register the decorated class (a subclass of `base` and of TransientError) as what
    `error_of_kind` raises for a transient `base`. Classes written out, not made on the fly,
    so that an error raised on a Dask worker unpickles in the flow's process."""

    def register(variant: type[E]) -> type[E]:
        if not (issubclass(variant, base) and issubclass(variant, TransientError)):
            raise TypeError(f"{variant.__name__} must subclass {base.__name__} and TransientError")
        _TRANSIENT_VARIANTS[base] = variant
        return variant

    return register


def error_of_kind(
    kind: ErrorKind, message: str, otherwise: type[FleetImportError], *, code: str | None = None
) -> FleetImportError:
    """An `otherwise` carrying `kind`: when `kind` is transient, its registered variant that
    is a TransientError too, so both `except otherwise` and `except TransientError` (the
    sweep skips a folder S3 struggles with) catch it."""
    cls = otherwise
    if kind is ErrorKind.TRANSIENT and not issubclass(otherwise, TransientError):
        cls = _TRANSIENT_VARIANTS.get(otherwise) or _missing_variant(otherwise)
    error = cls(message)
    error.kind, error.code = kind, code
    return error


def _missing_variant(cls: type[FleetImportError]) -> type[FleetImportError]:
    raise TypeError(f"{cls.__name__} has no transient variant (see transient_variant_of)")


@transient_variant_of(PreCommitError)
class TransientPreCommitError(PreCommitError, TransientError):
    """The delivery could not be read this time; it may pass on its own (worth a retry)."""

    default_kind = ErrorKind.TRANSIENT
