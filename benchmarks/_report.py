"""load_throughput.py's report: every measured run, the phases of ours, and the last line
`ratio curated=X plain=Y dlt_append=Z dlt_slice=W gate=G replace=R rss_5m_over_1m=M`.

Each ratio is the median of its per-round ratios (round i of one part against round i of
the other: both ran back to back, under the same load), not a ratio of medians."""

from __future__ import annotations

import statistics
from typing import Any

from _harness import Measurement

# (figure, numerator part, denominator part, target, meaning): seconds over seconds, so
# "ours over an anchor" in rows/s is the anchor's seconds over ours.
RATIOS = (
    ("curated", "baseline curated", "ours parquet", ">= 1.0", "ours / raw COPY, curated shape"),
    ("plain", "baseline parquet", "ours parquet", "context", "ours / raw COPY, plain table"),
    ("dlt_append", "dlt", "ours parquet", "context", "ours / dlt's fastest append"),
    ("dlt_slice", "dlt slice", "replace slice", ">= 2.0", "our slice replace / dlt's merge"),
    (
        "gate",
        "ours parquet",
        "ours parquet no gate",
        "<= 1.10",
        "cold first load with the content gate / without it, in seconds (issue 49)",
    ),
    (
        "replace",
        "replace unchanged (cache hits)",
        "ours parquet",
        "<= 1.0",
        "forced replace (cache hits) / cold first load, in seconds",
    ),
)
_PHASE_PARTS = (
    "ours parquet",
    "ours parquet no gate",
    "replace unchanged (cache hits)",
    "replace slice",
    "ours csv",
)


def median(runs: list[Measurement]) -> Measurement:
    """The run of median wall time (the lower middle one of an even count)."""
    return sorted(runs, key=lambda run: run.seconds)[(len(runs) - 1) // 2]


def round_ratio(results: dict[str, list[Measurement]], top: str, bottom: str) -> float | None:
    """Median over rounds of top's seconds / bottom's seconds, or None if one is missing."""
    if top not in results or bottom not in results:
        return None
    pairs = zip(results[top], results[bottom], strict=False)
    return statistics.median(a.seconds / b.seconds for a, b in pairs)


def _table(results: dict[str, list[Measurement]]) -> None:
    print(
        f"\n  {'part':38s} {'rows':>10s} {'seconds':>8s} {'rows/s':>10s} {'peak RSS MB':>12s}"
        f"   CPU s: {'client':>6s} {'db':>5s} {'s3':>5s}   host busy  WAL MB  ckpts"
    )
    for part, runs in results.items():
        for number, measured in enumerate(runs, 1):
            cpu, server = measured.details["cpu_seconds"], measured.details.get("server", {})
            label = part if len(runs) == 1 else f"{part} #{number}"
            rate = measured.rows_per_second if measured.rows else 0.0
            print(
                f"  {label:38s} {measured.rows:>10,} {measured.seconds:>8.2f} {rate:>10,.0f}"
                f" {measured.peak_rss_mb:>12.0f}          {cpu['client']:>6.2f}"
                f" {cpu['database']:>5.2f} {cpu['s3']:>5.2f}"
                f"   {measured.details['host_cpu_busy']:>9.0%}"
                f"  {server.get('wal_mb', 0):>6.0f}  {server.get('checkpoints', 0):>5.0f}"
            )


def report(bench: Any) -> None:
    results: dict[str, list[Measurement]] = bench.results
    _table(results)
    of = " (medians of per-round ratios)" if bench.args.repeat > 1 else ""
    figures: dict[str, str] = {}
    print(f"\nratios{of}:")
    for name, top, bottom, target, meaning in RATIOS:
        value = round_ratio(results, top, bottom)
        figures[name] = "n/a" if value is None else f"{value:.2f}"
        print(f"  {name:12s} {figures[name]:>5s}  {meaning} (target {target})")
    if bench.extra.get("dlt_missing"):
        print(f"  dlt: not measured, {bench.extra['dlt_missing']}")
    if (csv := round_ratio(results, "baseline csv", "ours csv")) is not None:
        print(f"  csv          {csv:5.2f}  ours / COPY CSV of the same objects")
    if "ours parquet" in results:
        # The gate's own seconds inside each gated load, over the rest of that load: the
        # same run's figure, free of the noise between two loads on a shared host.
        gated = [run.details.get("gate_seconds", 0.0) for run in results["ours parquet"]]
        runs = zip(results["ours parquet"], gated, strict=True)
        shares = [gate / (run.seconds - gate) for run, gate in runs]
        print(
            f"  gate_share   {statistics.median(shares):5.2f}  the gate's seconds inside ours "
            f"parquet / the rest of it (target <= 0.10); gate seconds {gated}"
        )
    if (rerun := round_ratio(results, "rerun unchanged", "ours parquet")) is not None:
        print(f"  rerun        {rerun:5.2f}  unchanged rerun (AlreadyLoaded) / first load")
    figures["rss_5m_over_1m"] = "n/a"
    if "ours parquet large" in results:
        large, small = median(results["ours parquet large"]), median(results["ours parquet"])
        rss = large.peak_rss_mb / small.peak_rss_mb
        at_large = round_ratio(results, "baseline parquet large", "ours parquet large") or 0.0
        print(
            f"at {large.rows:,} rows: {large.rows_per_second:,.0f} rows/s = "
            f"{large.rows_per_second / small.rows_per_second:.2f}x the {small.rows:,}-row "
            f"rows/s (target >= 0.9); ours / plain {at_large:.2f}; peak RSS "
            f"{large.peak_rss_mb:.0f} MB = {rss:.2f}x the {small.rows:,}-row peak "
            "(target <= 1.05)"
        )
        figures["rss_5m_over_1m"] = f"{rss:.2f}"
        if "baseline curated large" in results and "baseline curated" in results:
            limit = median(results["baseline curated large"]).rows_per_second
            print(
                f"  the raw COPY into the curated shape at {large.rows:,} rows: {limit:,.0f} "
                f"rows/s = {limit / median(results['baseline curated']).rows_per_second:.2f}x "
                f"its {small.rows:,}-row rows/s; ours / it "
                f"{large.rows_per_second / limit:.2f}"
            )
    if "prefect" in bench.extra:
        cli, core = bench.extra["prefect"]["cli_seconds"], bench.extra["prefect"]["core_seconds"]
        print(
            f"fleet-import run against a Prefect server: {cli:.2f} s, import_folder "
            f"{core:.2f} s: +{cli - core:.2f} s (target <= +1.5 s)"
        )
    for part in ("ours parquet", "ours parquet large"):
        if part in results and "rss_peak_after" in (found := median(results[part]).details):
            print(
                f"{part}: sampled peak RSS {found['rss_peak_sampled_mb']} MB at "
                f"{found['rss_peak_at_s']} s, after {found['rss_peak_after']!r}; Arrow pool "
                f"{found.get('arrow_pool')}, {found.get('arrow_mimalloc_peak_mb')} MB from mimalloc"
            )
    for part in (*_PHASE_PARTS, "ours parquet large"):
        if part not in results:
            continue
        print(f"{part} by phase (median run, wall seconds):")
        for name, value in median(results[part]).details["phases"].items():
            print(f"    {name:55s} {value:7.2f}")
    print("ratio " + " ".join(f"{k}={v}" for k, v in figures.items()))
