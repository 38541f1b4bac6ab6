"""What makes two deliveries the same content: one identity, read by the import (already
loaded?), the takeover (continue an abandoned batch?) and the sweep (is a folder due?)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleet_import.contracts.model import ContractSet
from fleet_import.s3.sources import Manifest


@dataclass(frozen=True)
class DeliveryIdentity:
    """The manifest's fingerprint (the names, etags and sizes of the files the contracts
    read) and the versions of the contracts those files are read with. Files or a contract
    that changed make different content: the same files read by a changed contract load
    other rows."""

    fingerprint: str
    contract_versions: tuple[tuple[str, str], ...]
    """(dataset, version) of each dataset the files feed, sorted: hashable, comparable."""

    @classmethod
    def of(cls, manifest: Manifest, contracts: ContractSet) -> DeliveryIdentity:
        """The identity of what a folder holds now, read with the contracts in force."""
        versions = tuple(
            (name, contracts[name].contract_version) for name in sorted(manifest.by_dataset())
        )
        return cls(manifest.fingerprint, versions)

    @classmethod
    def recorded(
        cls, manifest: Mapping[str, Any] | None, versions: Mapping[str, str] | None
    ) -> DeliveryIdentity | None:
        """The identity a batch recorded when it discovered its folder (its details'
        `manifest` and `contract_versions`); None before that."""
        fingerprint = manifest.get("fingerprint") if manifest is not None else None
        if not fingerprint:
            return None
        return cls(fingerprint, tuple(sorted((versions or {}).items())))

    @property
    def versions(self) -> dict[str, str]:
        """As batch details keep them (`contract_versions`)."""
        return dict(self.contract_versions)
