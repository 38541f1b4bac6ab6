"""The operational store: scope reservations, execution leases, batch transitions."""

from fleet_import.batches.models import (
    Batch,
    BatchDetails,
    BatchNotRunning,
    BatchStatus,
    CachedFile,
    ContinueExisting,
    FailureKind,
    FileInUse,
    LeaseAcquired,
    LeaseHeld,
    NotResumable,
    Reserved,
    Resumed,
    ScopeBusy,
    SourceType,
)
from fleet_import.batches.repository import BatchRepository, InvalidTransition

__all__ = [
    "Batch",
    "BatchDetails",
    "BatchNotRunning",
    "BatchRepository",
    "BatchStatus",
    "CachedFile",
    "ContinueExisting",
    "FailureKind",
    "FileInUse",
    "InvalidTransition",
    "LeaseAcquired",
    "LeaseHeld",
    "NotResumable",
    "Reserved",
    "Resumed",
    "ScopeBusy",
    "SourceType",
]
