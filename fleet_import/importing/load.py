"""Steps 4-6 of the import: the slice load. Each normalized file goes into one open
warehouse transaction as it arrives; duplicate keys and reject ratios are judged once all
are in; the commit is recorded in the operational store."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from fleet_import import failpoints
from fleet_import.contracts.model import ContractSet, DatasetContract
from fleet_import.errors import WarehouseError
from fleet_import.importing.context import Committed, CommitUnknown
from fleet_import.importing.drift import ignored_columns, tell_drift
from fleet_import.importing.gate import gate_runs, judge_content, tell_warnings
from fleet_import.importing.gate_dataset import ProfilePrefetch
from fleet_import.importing.gate_results import warned_line
from fleet_import.importing.guards import check_slice_guards
from fleet_import.importing.leased_batch import LeasedBatch
from fleet_import.importing.normalized_files import NormalizedEntry
from fleet_import.importing.settle import mark_commit_attempted, settle_lost_commit
from fleet_import.normalize.duplicates import HashBuckets, find_duplicates, key_hashes
from fleet_import.normalize.file import (
    RejectRatioExceeded,
    check_reject_ratio,
    summarize_rejects,
    write_rejects,
)
from fleet_import.normalize.output import NormalizedFile
from fleet_import.normalize.rows import Reject
from fleet_import.retry import NO_RETRY, Backoff
from fleet_import.s3.sources import Manifest
from fleet_import.store.details import BatchDetails
from fleet_import.warehouse.base import (
    CommitOutcomeUnknown,
    LoadFile,
    SliceCommit,
    WarehouseSession,
)

log = logging.getLogger(__name__)

# Rejects kept in batch details: enough to act on; the full list is in the rejects file.
_REJECT_SAMPLE = 20
# Lines of the first rejects a reject-ratio failure names.
_RATIO_LINES_NAMED = 5
LOAD_BACKOFF = Backoff((1.0, 4.0, 15.0))
"""Before each new attempt at a slice whose load failed transiently."""


def load_step(
    batch: LeasedBatch, manifest: Manifest, entries: Iterable[NormalizedEntry]
) -> Committed | CommitUnknown:
    """Steps 4-6: load each normalized file as it arrives into one open warehouse
    transaction, drop duplicate keys and check reject ratios once all are in, commit, then
    record the commit. Raises on any failure (nothing of the slice is then visible).

    A transient warehouse failure (dropped connection, serialization conflict) rolls the
    slice back and starts it again, reloading the files already normalized, with backoff --
    unless the backend's writer replays its own transaction (`replays_slices`): one retry
    layer for the slice, never one inside the other. A writer never replays a COMMIT that
    got no answer, so once the stamp says it did not go through the slice is loaded again
    here on every backend.

    A COMMIT that got no answer is settled here from the slice stamp, read back across the
    outage (settle.settle_lost_commit): committed, not committed (tried again like any
    transient failure), or unknown -- then the batch is left for the next run
    (`CommitUnknown`), and nothing escapes the step as an error."""
    ctx, scope = batch.ctx, batch.scope
    started = time.monotonic()
    backoff = NO_RETRY if ctx.warehouse.replays_slices else LOAD_BACKOFF
    with (
        _KeyHashes(ctx.contracts, ctx.workdir / str(batch.batch_id)) as hashes,
        ProfilePrefetch(ctx.contracts) as profiles,
    ):
        gated = profiles if gate_runs(batch) else None
        arrivals = _Arrivals([], iter(entries), hashes, batch, gated)
        for retry in range(LOAD_BACKOFF.retries + 1):
            try:
                commit, summary = _load_slice_once(batch, manifest, arrivals)
                break
            except CommitOutcomeUnknown as exc:
                settled = settle_lost_commit(batch, exc)
                if settled is not None:
                    return settled
                not_committed = WarehouseError(
                    f"{exc}; the slice is not stamped: the COMMIT did not go through",
                    kind=exc.kind,
                    backend=exc.backend,
                    setting=exc.setting,
                )
                if not exc.transient or retry == LOAD_BACKOFF.retries:
                    raise not_committed from None
                LOAD_BACKOFF.wait(retry, f"slice load of {scope}", not_committed, log)
            except WarehouseError as exc:
                if arrivals.failure is not None:  # a file failed too: that decides the batch
                    raise arrivals.failure from None
                if not exc.transient or retry >= backoff.retries:
                    raise
                # Failed before its COMMIT, or the server answered it (rolled back): this
                # attempt did not commit, and a lost answer is the branch above.
                backoff.wait(retry, f"slice load of {scope}", exc, log)
    failpoints.hit("after_warehouse_commit")
    _report_ignored(batch, arrivals.loaded)
    summary["seconds"] = {
        **summary.get("seconds", {}),
        "load": round(time.monotonic() - started, 3),
        "gate": summary.pop("gate_seconds", 0.0),  # the content gate's part of it
    }
    verdict = summary.pop("gate")
    committed = batch.record_commit(recovered=False, row_counts=commit.row_counts, summary=summary)
    tell_warnings(batch, verdict)
    return committed


class _KeyHashes:
    """The duplicate check's first pass (a hash per key) for each file, computed on a
    thread of its own while the slice loads, so little of the check is left after the last
    COPY, and kept on disk per dataset (`HashBuckets`), so memory does not grow with the
    delivery. Kept across load attempts: a file's hashes do not depend on the warehouse."""

    def __init__(self, contracts: ContractSet, workdir: Path) -> None:
        self._contracts = contracts
        self._workdir = workdir
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="key-hashes")
        self._hashed: dict[Path, Future[None]] = {}
        self._buckets: dict[str, HashBuckets] = {}

    def __enter__(self) -> _KeyHashes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for buckets in self._buckets.values():
            buckets.close()

    def add(self, file: NormalizedFile) -> None:
        contract = self._contracts[file.dataset]
        if not contract.natural_key or file.parquet_path in self._hashed:
            return
        if file.dataset not in self._buckets:
            self._buckets[file.dataset] = HashBuckets(self._workdir)
        buckets = self._buckets[file.dataset]
        self._hashed[file.parquet_path] = self._pool.submit(
            lambda: buckets.add(key_hashes(file, contract))
        )

    def repeated(self, files: Sequence[NormalizedFile]) -> np.ndarray:
        """The hashes that repeat among `files` (all of one dataset, each added before)."""
        for file in files:
            self.add(file)
            self._hashed[file.parquet_path].result()
        return self._buckets[files[0].dataset].repeated()


@dataclass
class _Arrivals:
    """The slice's files. Each iteration (one per load attempt) replays those earlier
    attempts took, then takes each new one as it is normalized, recording it in `loaded`
    and handing it to the key hasher first.

    Files are taken on the COPY's reader thread. If taking one fails while the COPY is
    failing too, the reader's error is dropped for the COPY's: `failure` keeps it, and no
    later attempt may go on as if the delivery had ended there."""

    loaded: list[NormalizedEntry]
    arriving: Iterator[NormalizedEntry]
    hashes: _KeyHashes
    batch: LeasedBatch
    profiles: ProfilePrefetch | None = None  # the content gate's, as files arrive
    failure: BaseException | None = None

    def __iter__(self) -> Iterator[NormalizedEntry]:
        for entry in list(self.loaded):
            self.batch.check_lease()
            yield entry
        while True:
            if self.failure is not None:
                raise self.failure
            try:
                entry = next(self.arriving)
            except StopIteration:
                return
            except BaseException as exc:
                self.failure = exc
                raise
            self.loaded.append(entry)
            self.hashes.add(entry.file)
            if self.profiles is not None:
                self.profiles.add(entry)
            self.batch.check_lease()
            yield entry


def _load_slice_once(
    batch: LeasedBatch, manifest: Manifest, arrivals: _Arrivals
) -> tuple[SliceCommit, dict[str, Any]]:
    """One slice transaction. Each dataset's files go into one COPY that pulls them as they
    arrive (normalization runs in load order), so the warehouse never waits for a COPY to
    start between files."""
    ctx, scope = batch.ctx, batch.scope
    contracts = [ctx.contracts[name] for name in sorted(manifest.by_dataset())]
    ctx.progress(f"loading the slice of {scope}", None)
    with ctx.warehouse.open_slice(
        tenant_id=batch.tenant_id,
        source_scope=scope,
        batch_id=batch.batch_id,
        contracts=contracts,
        progress=lambda dataset, rows: ctx.progress(f"loaded {rows:,} {dataset} rows", None),
        on_session=lambda session: _record_session(batch, session),
        # The lease's fence (store.heartbeat): before each warehouse step and the COMMIT.
        fence=batch.check_lease,
    ) as writer:
        # Our own timings, which `fleet-import costs` and the metrics read (Redshift's own are
        # in SYS_QUERY_HISTORY under the batch's query_group). A dataset's COPY pulls its
        # files as they are normalized, so its time includes waiting for them.
        copy_seconds: Counter[str] = Counter()
        for dataset, group in groupby(arrivals, key=_dataset_of):
            copy_started = time.monotonic()
            writer.load_files(
                ctx.contracts[dataset], (LoadFile(entry.file.parquet_path) for entry in group)
            )
            copy_seconds[dataset] += time.monotonic() - copy_started
        failpoints.hit("after_staging_rows")
        # Arrow's allocator keeps freed pages for reuse; what follows allocates
        # differently, so hand them back and keep the peak bounded by batch size.
        pa.default_memory_pool().release_unused()
        duplicates, summary = judge_rejects(batch, arrivals.loaded, arrivals.hashes.repeated)
        for dataset, keys in duplicates.items():
            writer.discard_keys(ctx.contracts[dataset], keys)
        # Slice guards (issue #24): a breach raises SliceHeld, and nothing is committed.
        check_slice_guards(batch, manifest, summary)
        # The content gate (issue 49): an error raises GateHeld (a SliceHeld) the same way.
        gate_started = time.monotonic()
        verdict = judge_content(batch, manifest, arrivals.loaded, duplicates, arrivals.profiles)
        summary["gate_seconds"] = round(time.monotonic() - gate_started, 3)
        if verdict.told:
            summary["gate_warned"] = warned_line(verdict.told)
        summary["gate"] = verdict
        pa.default_memory_pool().release_unused()
        batch.renew_lease_now()
        mark_commit_attempted(batch)  # from here on, a lost answer leaves the outcome unknown
        failpoints.hit("before_warehouse_commit")
        commit_started = time.monotonic()
        commit = writer.commit()
        summary["seconds"] = {
            "copy": {dataset: round(seconds, 3) for dataset, seconds in copy_seconds.items()},
            "commit": round(time.monotonic() - commit_started, 3),
        }
        return commit, summary


def judge_rejects(
    batch: LeasedBatch,
    entries: Sequence[NormalizedEntry],
    repeated_of: Callable[[Sequence[NormalizedFile]], np.ndarray],
) -> tuple[dict[str, pa.Table], dict[str, Any]]:
    """Duplicate keys across the delivery, the batch's rejects (file and details), then the
    reject ratios (raises above a contract's limit, naming the file, first lines and the
    rejects file, which are already on the batch). Returns the repeated keys to drop, per
    dataset. `repeated_of(files)` is the first pass of the duplicate check: the key hashes
    that repeat among a dataset's files (`HashBuckets.repeated`). Part of the load step,
    inside its open slice transaction."""
    ctx, batch_id = batch.ctx, batch.batch_id
    by_dataset: dict[str, list[NormalizedEntry]] = {}
    for entry in entries:
        by_dataset.setdefault(entry.file.dataset, []).append(entry)
    duplicate_keys: dict[str, pa.Table] = {}
    all_rejects: list[Reject] = []
    rows: dict[str, int] = {}
    ratios: list[tuple[DatasetContract, int, list[Reject]]] = []
    duplicates_in: Counter[str] = Counter()  # source key -> its rows rejected as duplicates
    for dataset, dataset_entries in by_dataset.items():
        contract = ctx.contracts[dataset]
        files = [entry.file for entry in dataset_entries]
        repeated = repeated_of(files) if contract.natural_key else None
        duplicates, keys = find_duplicates(files, contract, repeated)
        duplicates_in.update(reject.file for reject in duplicates)
        dataset_rejects = [r for f in files for r in f.rejects] + list(duplicates)
        rejected = sum(f.reject_count for f in files) + len(duplicates)
        rows[dataset] = sum(f.row_count for f in files) - len(duplicates)
        ratios.append((contract, rejected, dataset_rejects))
        all_rejects.extend(dataset_rejects)
        if keys.num_rows:
            duplicate_keys[dataset] = keys
    rejects_uri = None
    if all_rejects:
        local = ctx.workdir / str(batch_id) / "rejects.csv"
        write_rejects(all_rejects, local)
        rejects_uri = ctx.staging.put_file(
            local, f"{batch.tenant_id}/rejects/{batch_id}/rejects.csv"
        )
    summary = {
        # A file's rows are those it loads: its duplicate keys are among its rejects, so
        # the files add up to the batch (rows + rejects still count every source row).
        "files": [
            {
                "key": entry.obj.key,
                "dataset": entry.file.dataset,
                "rows": entry.file.row_count - duplicates_in[entry.file.source_key],
                "rejects": entry.file.reject_count + duplicates_in[entry.file.source_key],
                "cache_hit": entry.cache_hit,
                "seconds": round(entry.seconds, 3),
                "bytes": _staged_bytes(entry.file),
                # Columns found by an alias (a renamed export): column -> header found.
                **({"aliases": entry.file.aliases} if entry.file.aliases else {}),
                # Columns the contract does not name (issue #25): name -> type.
                **({"extra_columns": entry.file.extra_columns} if entry.file.extra_columns else {}),
            }
            for entry in entries
        ],
        "cache_hits": sum(entry.cache_hit for entry in entries),
        "rows_to_load": rows,
    }
    rejects = {**summarize_rejects(all_rejects, sample=_REJECT_SAMPLE), "uri": rejects_uri}
    # "normalised": the phase as stored since the first rows (store.details.Phase).
    batch.update_details(BatchDetails.patch(phase="normalised", rejects=rejects, summary=summary))
    for contract, rejected, dataset_rejects in ratios:
        try:
            check_reject_ratio(contract, rows[contract.name], rejected)
        except RejectRatioExceeded as exc:
            raise RejectRatioExceeded(
                f"{exc}; {_where_rejected(dataset_rejects)}; all rejects: {rejects_uri}",
                dataset=exc.dataset,
                ratio=exc.ratio,
                limit=exc.limit,
            ) from None
    return duplicate_keys, {**summary, "rejects": rejects}


def _where_rejected(rejects: Sequence[Reject]) -> str:
    """The file with the most rejects and its first rejected lines, for a failure message."""
    by_file: dict[str, list[Reject]] = {}
    for reject in rejects:
        by_file.setdefault(reject.file, []).append(reject)
    file, worst = max(by_file.items(), key=lambda item: len(item[1]))
    lines = [str(r.line) for r in worst[:_RATIO_LINES_NAMED] if r.line is not None]
    first = worst[0]
    return (
        f"{len(worst):,} in {file}"
        + (f" (first lines {', '.join(lines)})" if lines else "")
        + f", e.g. {first.column or 'row'}: {first.reason}"
    )


def _report_ignored(batch: LeasedBatch, entries: Sequence[NormalizedEntry]) -> None:
    """The columns the delivery held beyond its contracts and did not load (`ignore`): in
    the batch's details beside any drift it evolved, and one `fleet.schema.drift` event."""
    ignored = ignored_columns(batch.ctx.contracts, entries)
    if not ignored:
        return
    known = batch.read().record.drift
    batch.update_details(BatchDetails.patch(drift={**known, **ignored}))
    tell_drift(batch, ignored)


def _record_session(batch: LeasedBatch, session: WarehouseSession) -> None:
    """Before the slice locks anything: a successor that takes the batch over ends it."""
    batch.update_details(BatchDetails.patch(warehouse_session=session.to_json()))


def _staged_bytes(file: NormalizedFile) -> int:
    """The normalized Parquet's size: what the batch staged for the warehouse to read."""
    try:
        return file.parquet_path.stat().st_size
    except OSError:
        return 0


def _dataset_of(entry: NormalizedEntry) -> str:
    return entry.file.dataset
