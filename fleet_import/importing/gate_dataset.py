"""One dataset of a delivery through the content gate, file by file: each normalized file
is read back from this machine (the Parquet the load just copied; S3 is not read again),
its duplicate keys left out, added to the profile and checked, so memory holds one file at a
time. Only a `unique` check reads its own columns of every file at once, and a
`relationships` check the referenced column's distinct values."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from fleet_import.contracts.checks import Check
from fleet_import.contracts.model import DatasetContract
from fleet_import.importing.gate_checks import Evaluated, failing_rows, judged, skipped
from fleet_import.importing.gate_results import GateResult
from fleet_import.importing.leased_batch import LeasedBatch
from fleet_import.importing.normalized_files import NormalizedEntry
from fleet_import.importing.profile import ProfileBuilder
from fleet_import.normalize.rows import SOURCE_LINE_COLUMN

FAILING_ROWS_KEPT = 100
"""Failing rows written per check, beside the rejects: enough to see what is wrong."""
_FILE_INDEX = "_file_index"
_WHOLE = frozenset({"unique", "row_count"})
"""Checks not judged file by file: `unique` needs every row of its columns at once."""


@dataclass(frozen=True)
class DatasetFiles:
    """A dataset's normalized files, and the duplicate keys the load discards from them."""

    contract: DatasetContract
    entries: Sequence[NormalizedEntry]
    duplicate_keys: pa.Table | None = None

    @property
    def sources(self) -> list[str]:
        return [entry.file.source_key for entry in self.entries]

    def read(self, columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
        """Each file's rows as the slice will hold them (`columns`, else the contract's, and
        the source line), `_file_index` naming its file in `sources`."""
        wanted = list(columns or self.contract.column_names) + [SOURCE_LINE_COLUMN]
        key = list(self.contract.natural_key)
        drop = self.duplicate_keys is not None and self.duplicate_keys.num_rows > 0 and key
        for index, entry in enumerate(self.entries):
            schema = pq.read_schema(entry.file.parquet_path)
            named = dict.fromkeys([*wanted, *(key if drop else [])])
            read = [c for c in named if c in schema.names]
            part = pq.read_table(entry.file.parquet_path, columns=read)
            if drop:
                assert self.duplicate_keys is not None
                part = part.join(self.duplicate_keys.select(key), keys=key, join_type="left anti")
                part = part.select([c for c in wanted if c in part.column_names])
            column = pa.array(np.full(part.num_rows, index, dtype=np.int32))
            yield part.append_column(_FILE_INDEX, column)

    def distinct(self, column: str) -> pa.Array:
        """The distinct non-null values of `column` over every file."""
        found = [pc.unique(part[column].combine_chunks()) for part in self.read([column])]
        values = pa.concat_arrays(found) if found else pa.array([], pa.string())
        return pc.unique(values.drop_null())


def judge_dataset(
    batch: LeasedBatch,
    files: DatasetFiles,
    known: Mapping[str, pa.Array | None],
    prefetched: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[GateResult]]:
    """The dataset's profile and its checks' results; `known`: a relationship's values by
    its `to` (None: that dataset is not in the delivery); `prefetched`: its profile made as
    the files arrived (`ProfilePrefetch`), used unless the load discards duplicate keys."""
    contract = files.contract
    builder = ProfileBuilder(contract)
    local = [check for check in contract.checks if check.type not in _WHOLE]
    figures = {id(check): 0 for check in local}
    samples: dict[int, list[pa.Table]] = {id(check): [] for check in local}
    duplicates = files.duplicate_keys is not None and files.duplicate_keys.num_rows > 0
    profiled = prefetched if prefetched is not None and not duplicates else None
    rows = prefetched["rows"] if profiled is not None else 0
    for part in files.read() if profiled is None or local else ():
        if profiled is None:
            builder.add(part)
        for check in local:
            if check.type == "relationships" and known.get(check.to or "") is None:
                continue
            failing = failing_rows(check, part, known.get(check.to or ""))
            found = (pc.sum(failing).as_py() or 0) if part.num_rows else 0
            figures[id(check)] += found
            kept = sum(sample.num_rows for sample in samples[id(check)])
            if found and kept < FAILING_ROWS_KEPT:
                samples[id(check)].append(part.filter(failing).slice(0, FAILING_ROWS_KEPT - kept))
    rows = builder.rows if profiled is None else rows
    results = []
    for check in contract.checks:
        sample = samples.get(id(check), [])
        if check.type == "row_count":
            evaluated = judged(check, rows, rows)
        elif check.type == "relationships" and known.get(check.to or "") is None:
            evaluated = skipped(check, rows)
        elif check.type == "unique":
            evaluated, sample = _unique(check, files, rows)
        else:
            evaluated = judged(check, figures[id(check)], rows)
        results.append(_result(batch, files, evaluated, sample))
    return (builder.profile() if profiled is None else profiled), results


def _unique(check: Check, files: DatasetFiles, rows: int) -> tuple[Evaluated, list[pa.Table]]:
    table = pa.concat_tables(list(files.read(check.columns)))
    failing = failing_rows(check, table)
    found = (pc.sum(failing).as_py() or 0) if table.num_rows else 0
    sample = [table.filter(failing).slice(0, FAILING_ROWS_KEPT)] if found else []
    return judged(check, found, rows), sample


def _result(
    batch: LeasedBatch, files: DatasetFiles, found: Evaluated, sample: list[pa.Table]
) -> GateResult:
    uri = None
    if found.outcome in ("warn", "error") and sample:
        uri = _write_failing(batch, files, found.check, pa.concat_tables(sample))
    counted = found.check.type != "row_count" and found.outcome != "skipped"
    return GateResult(
        files.contract.name,
        found.check.label,
        found.outcome,
        found.figure_text,
        found.threshold_text,
        found.detail,
        found.figure if counted else 0,
        uri,
    )


def _write_failing(batch: LeasedBatch, files: DatasetFiles, check: Check, sample: pa.Table) -> str:
    """Up to FAILING_ROWS_KEPT failing rows, with the file and line they came from."""
    ctx = batch.ctx
    sources = np.array(files.sources, dtype=object)[sample[_FILE_INDEX].to_numpy()]
    sample = sample.drop_columns([_FILE_INDEX]).add_column(0, "_source_file", pa.array(sources))
    name = "".join(c if c.isalnum() or c in "_-" else "_" for c in check.label)[:80]
    local = ctx.workdir / str(batch.batch_id) / "gate" / f"{files.contract.name}.{name}.csv"
    local.parent.mkdir(parents=True, exist_ok=True)
    pacsv.write_csv(sample, local)
    return ctx.staging.put_file(
        local, f"{batch.tenant_id}/rejects/{batch.batch_id}/gate/{local.name}"
    )


class ProfilePrefetch:
    """Each file profiled on a thread of its own as it arrives, while the slice loads, so
    the gate after the last COPY only assembles the profiles (as the duplicate check's key
    hashes are computed, `load._KeyHashes`). A dataset with duplicate keys is profiled again
    by `judge_dataset` without them."""

    def __init__(self, contracts: Mapping[str, DatasetContract]) -> None:
        self._contracts = contracts
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gate-profile")
        self._builders: dict[str, ProfileBuilder] = {}
        self._done: dict[Any, Future[None]] = {}

    def __enter__(self) -> ProfilePrefetch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def add(self, entry: NormalizedEntry) -> None:
        path = entry.file.parquet_path
        if path in self._done:  # a load attempt replaying its files
            return
        contract = self._contracts[entry.file.dataset]
        builder = self._builders.setdefault(contract.name, ProfileBuilder(contract))
        wanted = contract.column_names

        def profile() -> None:
            names = pq.read_schema(path).names
            builder.add(pq.read_table(path, columns=[c for c in wanted if c in names]))

        self._done[path] = self._pool.submit(profile)

    def profile_of(self, files: DatasetFiles) -> dict[str, Any] | None:
        """The dataset's profile once every one of its files is in; None if one is not."""
        futures = [self._done.get(entry.file.parquet_path) for entry in files.entries]
        if any(future is None for future in futures):
            return None
        for future in futures:
            assert future is not None
            future.result()
        return self._builders[files.contract.name].profile()
