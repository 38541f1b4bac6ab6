"""Reservation under contention: 64 contenders on one scope and on 64 scopes.

Each contender is a thread with its own PostgreSQL connection. In every round all of them
pass a barrier and try to reserve at once; a winner holds its reservation briefly, counts
how many holders its scope has at that instant (more than one is a double reservation),
and releases it. Three ways to reserve:

- ours: the repository's `reserve` statement (INSERT ... ON CONFLICT DO NOTHING, arbitrated
  by the unique partial index ux_ingestion_batches_running_scope), on a held connection;
- ours+connect: `BatchRepository.reserve` as workers call it (a connection per call);
- naive: SELECT for a running row, then INSERT if there was none, autocommit, against a
  plain table without the unique index. Its own output shows how often it double-reserves
  (tests/reliability/test_reservation_race.py asserts only on ours).

    .venv/bin/python benchmarks/contention.py [--contenders 64] [--rounds 30]
        [--database-url postgresql://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg.types.json import Jsonb

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleet_import.config import libpq_url
from fleet_import.scope import Tenant
from fleet_import.store.details import FailureKind
from fleet_import.store.models import (
    FLEET_MODE,
    FLEET_PIPELINE_STAGE,
    Reserved,
    SourceType,
)
from fleet_import.store.repository import QUERIES, BatchRepository

TENANT = Tenant.named("bench")
DEFAULT_CONTENDERS = 64
DEFAULT_ROUNDS = 30
# Long enough that every loser of a round has tried while the winner still holds the scope.
HOLD_SECONDS = 0.005
_BARRIER_TIMEOUT_SECONDS = 60.0

NAIVE_TABLE = """
CREATE TABLE IF NOT EXISTS naive_reservations (
    id uuid PRIMARY KEY,
    tenant_id text NOT NULL,
    source_scope text NOT NULL,
    status text NOT NULL
)
"""
NAIVE_SELECT = (
    "SELECT id FROM naive_reservations "
    "WHERE tenant_id = %s AND source_scope = %s AND status = 'running' LIMIT 1"
)
NAIVE_INSERT = (
    "INSERT INTO naive_reservations (id, tenant_id, source_scope, status) "
    "VALUES (%s, %s, %s, 'running')"
)
NAIVE_RELEASE = "UPDATE naive_reservations SET status = 'done' WHERE id = %s"


@dataclass
class RaceResult:
    method: str
    contenders: int
    scopes: int
    rounds: int
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)  # every attempt, seconds
    reservations: int = 0
    double_reservations: int = 0  # times a winner found another holder of its scope

    @property
    def per_second(self) -> float:
        return self.reservations / self.seconds if self.seconds else 0.0

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0

    def line(self) -> str:
        return (
            f"{self.method:<13} {self.scopes:>3} scope(s) {self.contenders:>3} contenders: "
            f"{self.per_second:8.1f} reservations/s, attempt p50 "
            f"{1000 * statistics.median(self.latencies):6.2f} ms, p99 "
            f"{1000 * self.percentile(0.99):7.2f} ms, {self.reservations} reserved, "
            f"{self.double_reservations} double"
        )


# A contender's attempt: returns a release callable when it reserved, else None.
Attempt = Callable[[str, str], Callable[[], None] | None]


def ours(conn: psycopg.Connection, database_url: str) -> Attempt:
    def attempt(scope: str, key: str) -> Callable[[], None] | None:
        params = {
            "id": uuid.uuid4(),
            "tenant_id": TENANT.tenant_id,
            "company_id": TENANT.company_id,
            "tenant_database": TENANT.database,
            "mode": FLEET_MODE,
            "source_type": str(SourceType.FLEET_S3),
            "pipeline_stage": FLEET_PIPELINE_STAGE,
            "source_scope": scope,
            "delivery_key": key,
            "details": Jsonb({"version": 1}),
        }
        row = conn.execute(QUERIES["reserve"], params).fetchone()
        if row is None:
            return None
        release = {
            "batch_id": row[0],
            "owner": None,
            "kind": "enqueue_failed",
            "error": "released",
            "facts": Jsonb({}),
        }
        return lambda: conn.execute(QUERIES["mark_failed"], release)

    return attempt


def ours_connect(conn: psycopg.Connection | None, database_url: str) -> Attempt:
    repo = BatchRepository(database_url)

    def attempt(scope: str, key: str) -> Callable[[], None] | None:
        outcome = repo.reserve(TENANT, scope, key)
        if not isinstance(outcome, Reserved):
            return None
        batch_id = outcome.batch.id
        return lambda: repo.mark_failed(batch_id, None, FailureKind.ENQUEUE_FAILED, "released")

    return attempt


def naive(conn: psycopg.Connection, database_url: str) -> Attempt:
    def attempt(scope: str, key: str) -> Callable[[], None] | None:
        if conn.execute(NAIVE_SELECT, (TENANT.tenant_id, scope)).fetchone() is not None:
            return None
        batch_id = uuid.uuid4()
        conn.execute(NAIVE_INSERT, (batch_id, TENANT.tenant_id, scope))
        return lambda: conn.execute(NAIVE_RELEASE, (batch_id,))

    return attempt


METHODS: dict[str, Callable[[psycopg.Connection | None, str], Attempt]] = {
    "ours": ours,
    "ours+connect": ours_connect,
    "naive": naive,
}


def race(
    database_url: str,
    method: str,
    *,
    contenders: int = DEFAULT_CONTENDERS,
    scopes: int = 1,
    rounds: int = DEFAULT_ROUNDS,
    hold: float = HOLD_SECONDS,
) -> RaceResult:
    """`contenders` threads, each on its own connection, try to reserve at the same instant
    in each of `rounds` rounds; contender i uses scope i % scopes."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        conn.execute(NAIVE_TABLE)
    result = RaceResult(method, contenders, scopes, rounds)
    run_id = uuid.uuid4().hex[:8]
    barrier = threading.Barrier(contenders)
    lock = threading.Lock()
    holders: dict[str, int] = {}
    errors: list[BaseException] = []

    def contender(index: int) -> None:
        scope = f"fleet_s3:s3://bench-{run_id}/scope-{index % scopes}/"
        try:
            # ours+connect connects per call: a held connection too would double the
            # connections and exceed max_connections at 64 contenders.
            held = method != "ours+connect"
            with (
                psycopg.connect(libpq_url(database_url), autocommit=True)
                if held
                else (contextlib.nullcontext()) as conn
            ):
                attempt = METHODS[method](conn, database_url)
                for round_no in range(rounds):
                    barrier.wait(_BARRIER_TIMEOUT_SECONDS)
                    started = time.perf_counter()
                    release = attempt(scope, f"c{index}-r{round_no}")
                    elapsed = time.perf_counter() - started
                    with lock:
                        result.latencies.append(elapsed)
                    if release is None:
                        continue
                    with lock:
                        holders[scope] = holders.get(scope, 0) + 1
                        result.reservations += 1
                        if holders[scope] > 1:
                            result.double_reservations += 1
                    time.sleep(hold)
                    with lock:
                        holders[scope] -= 1
                    release()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(contenders)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.seconds = time.perf_counter() - started
    if errors:
        raise errors[0]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contenders", type=int, default=DEFAULT_CONTENDERS)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--database-url", default=None, help="admin URL of a PostgreSQL")
    args = parser.parse_args(argv)
    from benchmarks._harness import fresh_database, progress

    with fresh_database(args.database_url, "fleet_contention") as url:
        results = []
        for scopes in (1, args.contenders):
            for method in METHODS:
                progress(f"{method}: {args.contenders} contenders on {scopes} scope(s)")
                results.append(
                    race(url, method, contenders=args.contenders, scopes=scopes, rounds=args.rounds)
                )
        print()
        for result in results:
            print(result.line())
        by = {(r.method, r.scopes): r for r in results}
        for scopes in (1, args.contenders):
            base = by[("naive", scopes)]
            mine = by[("ours", scopes)]
            ratio = mine.per_second / base.per_second if base.per_second else float("nan")
            print(
                f"{scopes:>3} scope(s): ours/naive reservations/s = {ratio:.2f}; "
                f"double reservations: ours {mine.double_reservations}, "
                f"ours+connect {by[('ours+connect', scopes)].double_reservations}, "
                f"naive {base.double_reservations}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
