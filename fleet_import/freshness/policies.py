"""Which SLO holds for each tenant and dataset: the freshness file (FLEET_FRESHNESS) gives
the default and where to look in S3; the tenant registry (FLEET_TENANTS) may override it per
tenant under `overrides.freshness`.

    # freshness.yaml (FLEET_FRESHNESS)
    landing:
      bucket: fleet-landing          # where late deliveries are looked for
      completion: marker             # marker | quiet | manifest, as the sweep judges folders
      marker: _SUCCESS
      quiet_seconds: 300
    default: daily by 06:00 Europe/Berlin       # every tenant's deliveries ("*")
    datasets:                                   # and, on top, single datasets
      trips: hourly within 20 min

    # tenants.yaml (FLEET_TENANTS)
    tenants:
      acme:
        overrides:
          freshness: daily by 07:30 Europe/Berlin on business days   # its "*" SLO
      globex:
        overrides:
          freshness:
            default: "off"                      # exempt from the file's default ...
            datasets: {trips: hourly within 10 min}                   # ... but trips

The dataset `*` stands for "any dataset": a delivery of the tenant was loaded. A mistake
names the file and the field (`freshness.yaml: datasets.trips: ...`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from fleet_import.contracts.describe import describe
from fleet_import.errors import ConfigurationError, InvalidInput
from fleet_import.freshness.slo import Slo, parse_slo
from fleet_import.intake.completion import (
    DEFAULT_MARKER,
    DEFAULT_QUIET_SECONDS,
    CompletionRule,
    completion_rule,
)
from fleet_import.tenants.registry import TenantRegistry

ANY_DATASET = "*"
OVERRIDE_KEY = "freshness"


class FreshnessFileError(ConfigurationError):
    """The freshness configuration is not valid."""


def _checked(text: str) -> str:
    try:
        parse_slo(text)
    except InvalidInput as exc:
        raise ValueError(str(exc)) from None
    return text


SloText = Annotated[str, AfterValidator(_checked)]


class _Expectations(BaseModel):
    """A default SLO and per-dataset ones (the file's top level, a tenant's override)."""

    model_config = ConfigDict(extra="forbid")

    default: SloText | None = None
    datasets: dict[str, SloText] = {}


class _Landing(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bucket: str | None = None
    completion: Literal["marker", "quiet", "manifest"] = "marker"
    marker: str = DEFAULT_MARKER
    quiet_seconds: float = DEFAULT_QUIET_SECONDS


class _File(_Expectations):
    landing: _Landing = _Landing()


@dataclass(frozen=True)
class FreshnessPolicy:
    """The freshness file, read, and the registry's per-tenant overrides."""

    path: str | None = None
    bucket: str | None = None
    completion: CompletionRule = field(default_factory=lambda: completion_rule("marker"))
    default: Slo | None = None
    datasets: Mapping[str, Slo] = field(default_factory=dict)
    tenants: Mapping[str, _Expectations] = field(default_factory=dict)

    def slos(self, tenant_id: str) -> dict[str, Slo]:
        """The SLO of each dataset checked for this tenant (`*`: any dataset), off ones
        included (shown, never late). A tenant's own `default` replaces the file's `*` one;
        its `datasets` come on top of the file's."""
        own = self.tenants.get(tenant_id, _Expectations())
        found: dict[str, Slo] = {}
        default = parse_slo(own.default) if own.default is not None else self.default
        if default is not None:
            found[ANY_DATASET] = default
        found.update(self.datasets)
        found.update({name: parse_slo(text) for name, text in own.datasets.items()})
        return found


def load_policy(path: str | Path | None, registry: TenantRegistry | None = None) -> FreshnessPolicy:
    """The freshness file (None: no file, no default) and the registry's overrides; every
    problem of both at once."""
    problems: list[str] = []
    read = _File()
    where = str(path) if path else None
    if path:
        try:
            read = _read_file(Path(path), str(path))
        except InvalidInput as exc:
            problems.append(str(exc))
    tenants: dict[str, _Expectations] = {}
    for tenant_id, registered in registry.tenants.items() if registry else ():
        if OVERRIDE_KEY not in registered.overrides:
            continue
        raw = registered.overrides[OVERRIDE_KEY]
        at = f"{registry.path}: tenants.{tenant_id}.overrides.{OVERRIDE_KEY}"
        try:
            tenants[tenant_id] = _Expectations.model_validate(
                {"default": raw} if isinstance(raw, str) else raw
            )
        except ValidationError as exc:
            problems.append(describe(exc, _Expectations, at))
    if problems:
        raise FreshnessFileError("; ".join(problems))
    landing = read.landing
    return FreshnessPolicy(
        path=where,
        bucket=landing.bucket,
        completion=completion_rule(
            landing.completion, marker=landing.marker, quiet_seconds=landing.quiet_seconds
        ),
        default=parse_slo(read.default) if read.default is not None else None,
        datasets={name: parse_slo(text) for name, text in read.datasets.items()},
        tenants=tenants,
    )


def _read_file(file: Path, where: str) -> _File:
    import yaml

    if not file.is_file():
        raise InvalidInput(f"freshness file {where!r} does not exist")
    try:
        raw = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{where}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise InvalidInput(f"{where}: expected a mapping (fields: default, datasets, landing)")
    try:
        read = _File.model_validate(raw)
    except ValidationError as exc:
        raise InvalidInput(describe(exc, _File, where)) from None
    try:
        completion_rule(
            read.landing.completion,
            marker=read.landing.marker,
            quiet_seconds=read.landing.quiet_seconds,
        )
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: landing: {exc}") from None
    return read
