"""What the content gate found, as every view says it: a result per check or drift rule, the
hold it makes, and the table an operator reads (`fleet-import gate show`, `batches show`,
the batch's Prefect artifact)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fleet_import.errors import FleetImportError
from fleet_import.importing.guards import SliceHeld
from fleet_import.store.models import Batch

OUTCOMES = ("pass", "warn", "error", "skipped")
"""Batch details key of the gate's one-line verdict (its results are in `batch_gates`)."""


@dataclass(frozen=True)
class GateResult:
    """One check or drift rule on one dataset: `outcome` pass / warn / error / skipped,
    the `figure` measured and the `threshold` it was held to."""

    dataset: str
    check: str
    outcome: str
    figure: str
    threshold: str
    detail: str = ""
    failing_rows: int = 0
    failing_uri: str | None = None
    """Up to 100 of the failing rows, as CSV beside the batch's rejects."""

    def describe(self) -> str:
        figure = f": {self.figure}" if self.figure else ""
        limit = f" ({self.threshold})" if self.threshold else ""
        detail = f"; {self.detail}" if self.detail else ""
        rows = f"; failing rows: {self.failing_uri}" if self.failing_uri else ""
        return f"{self.dataset} {self.check}{figure}{limit}{detail}{rows}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> GateResult:
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


class GateHeld(SliceHeld):
    """The content gate found an `error`: the batch waits for review as a slice guard's."""

    def __init__(self, errors: Sequence[GateResult], content: Mapping[str, Any]) -> None:
        text = "; ".join(result.describe() for result in errors)
        FleetImportError.__init__(self, f"content gate: {text}")
        self.breaches = []
        self.content = dict(content)
        self.errors = list(errors)

    def facts(self) -> dict[str, Any]:
        return {"gate": [result.to_json() for result in self.errors]}  # HeldFacts.gate


def warned_line(warnings: Sequence[GateResult]) -> str:
    """What the final line adds for a slice published with warnings."""
    first = "; ".join(result.describe() for result in warnings[:3])
    more = f" (and {len(warnings) - 3} more)" if len(warnings) > 3 else ""
    return f"content gate warned: {first}{more}"


def _pair(before: Any, now: Any) -> str:
    if before is None:
        return "" if now is None else str(now)
    return f"{before} -> {now}"


def profile_rows(
    profile: Mapping[str, Any], baseline: Mapping[str, Any] | None
) -> list[dict[str, str]]:
    """The profile beside the replaced slice's, one row per column: before -> now."""
    old = (baseline or {}).get("columns", {})
    rows = []
    for name, now in profile.get("columns", {}).items():
        before = old.get(name, {})
        numbers = "sum" in now
        spread = ""
        if "top" in now:
            spread = ", ".join(f"{v} {n}" for v, n in list(now["top"].items())[:5])
        elif "min" in now:
            spread = f"{now['min']} .. {now['max']}"
        rows.append(
            {
                "column": name,
                "null %": _pair(before.get("null_pct"), now["null_pct"]),
                "distinct": _pair(_at_least(before), _at_least(now)),
                "sum": _pair(before.get("sum"), now.get("sum")) if numbers else "",
                "mean": _pair(_short(before.get("mean")), _short(now.get("mean")))
                if numbers
                else "",
                "values": spread,
            }
        )
    return rows


def _at_least(column: Mapping[str, Any]) -> Any:
    """A distinct count, `>=N` where it is a lower bound (importing.profile)."""
    found = column.get("distinct")
    return f">={found}" if found is not None and column.get("distinct_lower_bound") else found


def _short(value: Any) -> Any:
    try:
        return None if value is None else f"{float(value):.6g}"
    except (TypeError, ValueError):
        return value


def gate_lines(gates: Sequence[Any], baselines: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The gate of a batch as text: per dataset its checks, then its profile beside the
    replaced slice's (`baselines`: dataset -> that profile)."""
    lines = []
    for gate in gates:
        base = baselines.get(gate.dataset)
        rows = gate.profile.get("rows")
        before = f"{base['rows']:,} rows -> " if base else ""
        against = (
            f"compared with batch {gate.baseline_batch_id}"
            if base is not None
            else "no previous profile"
        )
        lines.append(f"{gate.dataset}: {gate.outcome}, {before}{rows:,} rows ({against})")
        for raw in gate.results:
            result = GateResult.from_json(raw)
            lines.append(
                f"  {result.outcome:<7} {result.check:<34} {result.figure:<34} "
                f"{result.threshold}{'  ' + result.detail if result.detail else ''}"
            )
            if result.failing_uri:
                failing = f"failing rows ({result.failing_rows:,}): {result.failing_uri}"
                lines.append(f"          {failing}")
        table = profile_rows(gate.profile, base)
        widths = {k: max(len(k), *(len(r[k]) for r in table)) for k in table[0]} if table else {}
        lines.append("  " + "  ".join(k.ljust(w) for k, w in widths.items()))
        lines += ["  " + "  ".join(r[k].ljust(w) for k, w in widths.items()) for r in table]
    return lines


@dataclass(frozen=True)
class GateView:
    """A batch's gate as the views show it: each dataset beside the replaced slice's
    profile (`baselines`), or why it did not run (`skipped`)."""

    gates: Sequence[Any]
    baselines: Mapping[str, Mapping[str, Any]]
    skipped: str = ""

    def lines(self) -> list[str]:
        if self.skipped:
            return [f"content gate skipped: {self.skipped}"]
        if not self.gates:
            return ["content gate: not run for this batch"]
        return gate_lines(self.gates, self.baselines)

    def to_json(self) -> dict[str, Any]:
        return {
            "skipped": self.skipped or None,
            "datasets": [
                {
                    "dataset": gate.dataset,
                    "outcome": gate.outcome,
                    "baseline_batch_id": str(gate.baseline_batch_id)
                    if gate.baseline_batch_id
                    else None,
                    "results": list(gate.results),
                    "profile": gate.profile,
                    "baseline_profile": self.baselines.get(gate.dataset),
                }
                for gate in self.gates
            ],
        }


def gate_view(repo: Any, batch: Batch) -> GateView:
    """The batch's gate read from `repo` (store.gates.GateRepository), with the profiles of
    the slices it was compared with."""
    summary = batch.record.gate
    skipped = (summary.skipped if summary is not None else None) or ""
    gates = repo.gate_of(batch.id)
    baselines: dict[str, Mapping[str, Any]] = {}
    for baseline_id in {gate.baseline_batch_id for gate in gates} - {None}:
        for gate in repo.gate_of(baseline_id):
            baselines[gate.dataset] = gate.profile
    return GateView(gates, baselines, skipped)
