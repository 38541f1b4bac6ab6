"""The bad-input corpus (tests/data/bad/): every broken delivery ends in a clear failure or
in rejects naming file, line and column, and never in a partial slice or a stuck batch.

Each case first loads a good delivery into its folder, then lays the case's files over it
and imports again. Whatever the outcome, the slice is whole (the previous one after a
failure, exactly the new one after a commit), no batch is left running and the scope is
free for the next delivery.
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from fleet_import.contracts.fleet import FLEET_DATASETS
from fleet_import.importing.context import Committed, Failed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.sample_data import (
    csv_bytes,
    fleet_delivery,
    fuel_table,
    parquet_bytes,
    trips_table,
)
from fleet_import.scope import Tenant, source_scope, split_folder
from fleet_import.store.details import FailureKind
from fleet_import.store.models import (
    BatchStatus,
    Reserved,
)
from tests.s3fixtures import put_objects

CORPUS = Path(__file__).parent.parent / "data" / "bad"
ACME = Tenant.named("acme")
DEFAULT_FOLDER = "acme/fleet/2026-07-22/"
# Big enough that one bad row stays under the 5% reject limit of every dataset.
COMPANION_SIZES = {"trips": 200, "fuel": 80, "vehicles": 40}
BASELINE_ROWS = {"trips": 200, "fuel_transactions": 80, "vehicles": 40}
_COMMITTED_CORPUS_LIMIT = 1024 * 1024
_FIELD_BYTES = 10 * 1024 * 1024
_TRIPS_HEADER = ",".join(FLEET_DATASETS["trips"].column_names)


# -- files too big or too binary to commit ----------------------------------------------------


def _field_10mb() -> bytes:
    """One 10 MB driver id: longer than any record the CSV reader accepts."""
    good = "X1,V1,D1,2026-07-02T09:00:00Z,2026-07-02T10:00:00Z,1,1,2,completed"
    huge = "X2,V1," + "D" * _FIELD_BYTES + ",2026-07-02T09:00:00Z,,1,1,2,completed"
    return f"{_TRIPS_HEADER}\n{good}\n{huge}\n".encode()


def _parquet_truncated() -> bytes:
    whole = parquet_bytes(fuel_table(80), FLEET_DATASETS["fuel_transactions"])
    return whole[: len(whole) // 2]


def _parquet_naive_timestamp() -> bytes:
    table = fuel_table(80).cast(FLEET_DATASETS["fuel_transactions"].arrow_schema)
    index = table.schema.get_field_index("transacted_at")
    naive = table.column(index).cast(pa.timestamp("us"))
    return _parquet(table.set_column(index, "transacted_at", naive))


def _parquet_wrong_types() -> bytes:
    table = fuel_table(80).cast(FLEET_DATASETS["fuel_transactions"].arrow_schema)
    index = table.schema.get_field_index("litres")
    flags = pa.array([i % 2 == 0 for i in range(table.num_rows)])
    return _parquet(table.set_column(index, "litres", flags))


def _trips_csv(rows: int, *, start: int, quote_line: int | None = None) -> bytes:
    """Good unquoted trips (ids from T{start}, clear of the companions'); with quote_line, a
    quote opens the driver_id of that line (the header is line 1) and never closes."""
    text = csv_bytes(trips_table(rows, start=start, vehicles=40)).replace(b'"', b"")
    if quote_line is None:
        return text
    lines = text.split(b"\n")
    fields = lines[quote_line - 1].split(b",")
    fields[2] = b'"' + fields[2]
    lines[quote_line - 1] = b",".join(fields)
    return b"\n".join(lines)


def _quote_open_near_the_end() -> bytes:
    """Issue 11.5 as reported: 30,000 rows, a quote opened on line 29,992."""
    return _trips_csv(30_000, start=100_000, quote_line=29_992)


def _trips_6000() -> bytes:
    return _trips_csv(6_000, start=200_000)


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


GENERATORS: dict[str, Callable[[], bytes]] = {
    "field_10mb": _field_10mb,
    "parquet_truncated": _parquet_truncated,
    "parquet_naive_timestamp": _parquet_naive_timestamp,
    "parquet_wrong_types": _parquet_wrong_types,
    "quote_open_near_the_end": _quote_open_near_the_end,
    "trips_6000": _trips_6000,
}


# -- the cases ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpectedReject:
    file: str
    line: int | None
    column: str | None
    reason: str


@dataclass(frozen=True)
class Case:
    id: str
    expect: str
    companions: tuple[str, ...] | None = None  # None: all of them
    folder: str = DEFAULT_FOLDER
    generated: dict[str, str] = field(default_factory=dict)
    message: tuple[str, ...] = ()
    rejects: tuple[ExpectedReject, ...] = ()
    rows: dict[str, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Case:
        companions = raw.get("companions")
        return cls(
            id=raw["id"],
            expect=raw["expect"],
            companions=None if companions is None else tuple(companions),
            folder=raw.get("folder", DEFAULT_FOLDER),
            generated=dict(raw.get("generated", {})),
            message=tuple(raw.get("message", ())),
            rejects=tuple(reject for item in raw.get("rejects", ()) for reject in _expand(item)),
            rows=dict(raw.get("rows", {})),
        )

    def files(self) -> dict[str, bytes]:
        """The case's files by path relative to the delivery folder."""
        folder = CORPUS / self.id
        files = (
            {
                path.relative_to(folder).as_posix(): path.read_bytes()
                for path in sorted(folder.rglob("*"))
                if path.is_file()
            }
            if folder.is_dir()
            else {}
        )
        for name, generator in self.generated.items():
            files[name] = GENERATORS[generator]()
        return files


def _expand(item: list[Any]) -> list[ExpectedReject]:
    """A reject as declared; a line "first..last" declares one reject per line."""
    file, line, column, reason = item
    if not isinstance(line, str):
        return [ExpectedReject(file, line, column, reason)]
    first, _, last = line.partition("..")
    return [ExpectedReject(file, n, column, reason) for n in range(int(first), int(last) + 1)]


def load_cases() -> list[Case]:
    raw = yaml.safe_load((CORPUS / "cases.yaml").read_text(encoding="utf-8"))
    return [Case.parse(item) for item in raw["cases"]]


CASES = load_cases()


def test_the_corpus_is_complete_and_small() -> None:
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids)) >= 30
    on_disk = {path.name for path in CORPUS.iterdir() if path.is_dir()}
    assert on_disk <= set(ids), f"case folders without an entry in cases.yaml: {on_disk - set(ids)}"
    for case in CASES:
        assert case.expect in ("fails", "rejects", "loads"), case.id
        assert (CORPUS / case.id).is_dir() or case.generated or case.companions == (), case.id
        assert set(case.generated.values()) <= set(GENERATORS), case.id
        assert (case.expect == "fails") == bool(case.message), case.id
        assert (case.expect == "rejects") == bool(case.rejects), case.id
    size = sum(path.stat().st_size for path in CORPUS.rglob("*") if path.is_file())
    assert size < _COMMITTED_CORPUS_LIMIT


# -- the test -----------------------------------------------------------------------------------


def _slice(database_url: str, tenant: str, scope: str) -> dict[str, dict[Any, int]]:
    """Rows of the scope per dataset, by the batch stamped on them."""
    found: dict[str, dict[Any, int]] = {}
    with psycopg.connect(database_url) as conn:
        for contract in FLEET_DATASETS.values():
            rows = conn.execute(
                f"SELECT ingestion_batch_id, count(*) FROM {contract.target_table} "
                "WHERE tenant_id = %s AND source_scope = %s GROUP BY 1",
                (tenant, scope),
            ).fetchall()
            found[contract.name] = dict(rows)
    return found


def _all_rejects(s3: Any, uri: str) -> list[dict[str, str]]:
    """The batch's rejects file: every reject, where the batch details keep a sample."""
    parts = urlsplit(uri)
    body = s3.get_object(Bucket=parts.netloc, Key=parts.path.lstrip("/"))["Body"].read()
    return list(csv.DictReader(io.StringIO(body.decode("utf-8"))))


def _line(text: str) -> int | None:
    return int(text) if text else None


def _replace_folder(s3: Any, folder: str, files: dict[str, bytes]) -> None:
    bucket, prefix = split_folder(folder)
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)
    for item in listed.get("Contents", ()):
        s3.delete_object(Bucket=bucket, Key=item["Key"])
    put_objects(s3, bucket, {prefix + name: data for name, data in files.items()})


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_case(
    case: Case,
    import_ctx: ImportContext,
    s3: Any,
    landing_bucket: str,
    database_url: str,
) -> None:
    folder = f"s3://{landing_bucket}/{case.folder}"
    scope = source_scope(folder)
    companions = fleet_delivery(**COMPANION_SIZES)
    _replace_folder(s3, folder, companions)
    baseline = import_folder(import_ctx, ACME, folder, "baseline")
    assert isinstance(baseline, Committed) and baseline.row_counts == BASELINE_ROWS, baseline
    before = _slice(database_url, "acme", scope)

    kept = companions if case.companions is None else {n: companions[n] for n in case.companions}
    _replace_folder(s3, folder, {**kept, **case.files()})
    # Forced: a case may leave the folder's content as the baseline's (nested_folder_ignored);
    # what is tested here is how the case's data loads, not "already loaded".
    outcome = import_folder(import_ctx, ACME, folder, f"case-{case.id}", force=True)
    batch = import_ctx.repo.get(outcome.batch_id)
    assert batch is not None
    after = _slice(database_url, "acme", scope)

    if case.expect == "fails":
        assert isinstance(outcome, Failed), outcome
        assert outcome.kind == FailureKind.FAILED_PRE_COMMIT
        for expected in case.message:
            assert expected in outcome.error, (expected, outcome.error)
        assert batch.status == BatchStatus.FAILED
        assert batch.details["failure"]["error"] == outcome.error
        failed_events = [p for n, p in import_ctx.recorded_events if n == "fleet.batch.failed"]
        assert [p["error"] for p in failed_events] == [outcome.error]
        # The previous slice is untouched, row for row.
        assert after == before
        assert import_ctx.warehouse.slice_owner("acme", scope) == baseline.batch_id
    else:
        assert isinstance(outcome, Committed), outcome
        assert batch.status == BatchStatus.SUCCEEDED
        rejects = batch.details["rejects"]
        every = _all_rejects(s3, rejects["uri"]) if rejects["count"] else []
        found = [
            (r["file"].rsplit("/", 1)[-1], _line(r["line"]), r["column"] or None, r["reason"])
            for r in every
        ]
        expected = sorted(case.rejects, key=lambda r: (r.file, r.line or 0))
        assert rejects["count"] == len(expected) == len(found), found[:30]
        for want, got in zip(expected, sorted(found, key=lambda r: (r[0], r[1] or 0)), strict=True):
            assert (want.file, want.line, want.column) == got[:3], (want, got)
            assert want.reason in got[3], (want, got)
        listed = {(r["file"], _line(r["line"]), r["reason"]) for r in every}
        assert all((r["file"], r["line"], r["reason"]) in listed for r in rejects["sample"])
        if rejects["count"]:
            bucket, prefix = split_folder(folder)
            assert all(r["file"].startswith(f"s3://{bucket}/{prefix}") for r in every)
        for dataset, count in case.rows.items():
            assert outcome.row_counts[dataset] == count
        # Exactly the new slice: every row carries the new stamp, in the counts committed.
        assert after == {
            dataset: {outcome.batch_id: count} if count else {}
            for dataset, count in outcome.row_counts.items()
        }
        assert import_ctx.warehouse.slice_owner("acme", scope) == outcome.batch_id

    # Nothing stuck: no running batch, no lease held, and the next delivery gets the scope.
    assert import_ctx.repo.list(status="running") == []
    assert batch.execution_lease_id is None
    assert isinstance(import_ctx.repo.reserve(ACME, scope, "next-delivery"), Reserved)


def test_generated_gzip_case_is_really_truncated() -> None:
    """The committed truncated gzip must stay truncated (a re-generated corpus could fix it)."""
    data = (CORPUS / "truncated_gzip" / "trips-3.csv.gz").read_bytes()
    with pytest.raises((EOFError, OSError)):
        gzip.decompress(data)
