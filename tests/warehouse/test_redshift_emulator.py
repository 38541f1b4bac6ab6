"""The emulator behaves like Redshift where fleet-import depends on it, seen through
redshift_connector: snapshots, table write locks, serializable isolation violations (1023)
in Redshift's shape, LOCK, TRUNCATE's commit, VARCHAR widths in bytes. Each test follows an
AWS page (named in its docstring)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redshift_connector

from fleet_import.error_table import sqlstate_kind
from fleet_import.errors import ErrorKind
from tests.redshift_copy import copy_input
from tests.redshift_emulator import RedshiftEmulator
from tests.redshift_grants import give

ROLE = "arn:aws:iam::123456789012:role/fleet-redshift-copy"
HOLD_SECONDS = 0.6


@pytest.fixture
def tables(db: psycopg.Connection[Any], emulator: RedshiftEmulator) -> None:
    db.execute("CREATE TABLE tab1 (v int)")
    db.execute("CREATE TABLE tab2 (v int)")
    give(db, emulator.user, "tab1", "tab2")
    db.commit()


@pytest.fixture
def session(emulator: RedshiftEmulator) -> Iterator[Any]:
    """A factory of sessions (autocommit off, as fleet-import uses them), all closed after."""
    opened: list[Any] = []

    def connect() -> Any:
        conn = redshift_connector.connect(**emulator.connect_kwargs())
        opened.append(conn)
        return conn

    yield connect
    for conn in opened:
        conn.close()


def run(conn: Any, sql: str) -> list[Any]:
    cursor = conn.cursor()
    cursor.execute(sql)
    return list(cursor.fetchall()) if cursor.description else []


def fields(exc: redshift_connector.ProgrammingError) -> dict[str, str]:
    return exc.args[0]


def assert_violation(caught: pytest.ExceptionInfo[Any], table: str, db: Any) -> None:
    """Redshift's shape: SQLSTATE XX000, message 1023, the detail naming the table's id."""
    error = fields(caught.value)
    oid = db.execute(f"SELECT '{table}'::regclass::oid").fetchone()[0]
    assert error["C"] == "XX000" and error["M"] == "1023", error
    assert error["D"].startswith(f"Serializable isolation violation on table - {oid}, ")
    assert "transactions forming the cycle are" in error["D"]
    assert sqlstate_kind(error["C"], error["M"]) is ErrorKind.TRANSIENT


def test_the_two_session_example_fails_its_last_statement(
    tables: None, session: Any, db: psycopg.Connection[Any], emulator: RedshiftEmulator
) -> None:
    """AWS "Troubleshooting serializable isolation errors": each session reads the table the
    other writes; no serial order gives the same results, so the last statement fails.
    Under SNAPSHOT isolation the same example commits (write skew is allowed: AWS, "SNAPSHOT
    ISOLATION ... concurrent modifications to different rows ... complete successfully")."""
    one, two = session(), session()
    run(one, "select * from tab1")
    run(one, "insert into tab2 values (1)")
    run(two, "insert into tab1 values (1)")
    if emulator.isolation_level == "snapshot":
        assert run(two, "select * from tab2") == []
        two.commit()
        one.commit()
        assert db.execute("SELECT count(*) FROM tab1").fetchone() == (1,)
        assert db.execute("SELECT count(*) FROM tab2").fetchone() == (1,)
        return
    with pytest.raises(redshift_connector.ProgrammingError) as caught:
        run(two, "select * from tab2")
    assert_violation(caught, "tab2", db)
    two.rollback()
    one.commit()
    assert db.execute("SELECT count(*) FROM tab1").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM tab2").fetchone() == (1,)


def test_a_stale_change_of_rows_another_transaction_changed_fails_at_both_levels(
    tables: None, session: Any, db: psycopg.Connection[Any], emulator: RedshiftEmulator
) -> None:
    """Both levels refuse a write to rows changed since the transaction's snapshot: 1023
    (SERIALIZABLE: the cycle; SNAPSHOT: PostgreSQL's REPEATABLE READ conflict, 40001, told
    in Redshift's shape), transient for the retry rule."""
    db.execute("INSERT INTO tab1 VALUES (1)")
    one, two = session(), session()
    assert run(two, "select count(*) from tab2") == [[0]]  # two's snapshot
    run(one, "delete from tab1 where v = 1")
    one.commit()
    with pytest.raises(redshift_connector.ProgrammingError) as caught:
        run(two, "update tab1 set v = 2 where v = 1")
    error = fields(caught.value)
    assert (error["C"], error["M"]) == ("XX000", "1023"), error
    assert error["D"].startswith("Serializable isolation violation on table - ")
    assert sqlstate_kind(error["C"], error["M"]) is ErrorKind.TRANSIENT
    two.rollback()
    assert db.execute("SELECT count(*) FROM tab1").fetchone() == (0,)


def test_the_example_with_its_reads_moved_out_of_the_transactions_succeeds(
    tables: None, session: Any, db: psycopg.Connection[Any]
) -> None:
    """The same page's remedy: the SELECTs run outside the transactions that write."""
    one, two = session(), session()
    run(one, "insert into tab1 values (1)")
    run(two, "select * from tab1")
    two.commit()
    one.commit()
    run(one, "select * from tab2")
    one.commit()
    run(two, "insert into tab2 values (1)")
    two.commit()
    assert db.execute(
        "SELECT (SELECT count(*) FROM tab1), (SELECT count(*) FROM tab2)"
    ).fetchone() == (1, 1)


def _in_thread(work: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def target() -> None:
        started = time.monotonic()
        try:
            outcome["result"] = work()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


def test_a_write_waits_for_the_table_lock_and_readers_do_not(
    tables: None, session: Any, emulator: RedshiftEmulator
) -> None:
    """AWS "Concurrent write examples": a second COPY/INSERT into the same table waits for
    the first transaction's write lock, then proceeds (its snapshot is taken once it holds
    the lock, "Write and read/write operations"); reads do not wait (`LOCK`)."""
    one, two, reader = session(), session(), session()
    run(one, "insert into tab1 values (1)")
    thread, outcome = _in_thread(lambda: run(two, "delete from tab1 where v = 1"))
    time.sleep(HOLD_SECONDS)
    assert thread.is_alive()  # waiting for one's write lock
    assert run(reader, "select count(*) from tab1") == [[0]]  # not blocked; committed data
    reader.commit()
    one.commit()
    thread.join(timeout=10)
    assert "error" not in outcome, outcome
    assert outcome["seconds"] >= HOLD_SECONDS
    two.commit()  # it saw one's row once it held the lock: it deleted it
    assert run(reader, "select count(*) from tab1") == [[0]]
    assert emulator.lock_holds and max(emulator.lock_holds) >= HOLD_SECONDS


def test_a_write_after_a_stale_snapshot_fails_once_the_lock_is_free(
    tables: None, session: Any, db: psycopg.Connection[Any], emulator: RedshiftEmulator
) -> None:
    """A transaction that took its snapshot (a SELECT) before another committed a write to
    the table cannot be serialised after it: its own write fails with 1023 ("Serializable
    isolation": the snapshot is taken at the first statement). Under SNAPSHOT an insert of
    other rows commits once the lock is free."""
    one, two = session(), session()
    run(two, "select count(*) from tab2")  # two's snapshot
    run(one, "insert into tab1 values (1)")
    thread, outcome = _in_thread(lambda: run(two, "insert into tab1 values (2)"))
    time.sleep(HOLD_SECONDS)
    assert thread.is_alive()
    one.commit()
    thread.join(timeout=10)
    if emulator.isolation_level == "snapshot":
        assert "error" not in outcome, outcome
        two.commit()
        assert db.execute("SELECT array_agg(v ORDER BY v) FROM tab1").fetchone() == ([1, 2],)
        return
    assert isinstance(outcome.get("error"), redshift_connector.ProgrammingError), outcome
    assert_violation(pytest.ExceptionInfo.from_exc_info(_exc_info(outcome["error"])), "tab1", db)
    two.rollback()
    assert db.execute("SELECT array_agg(v) FROM tab1").fetchone() == ([1],)


def _exc_info(exc: BaseException) -> tuple[type[BaseException], BaseException, Any]:
    return type(exc), exc, exc.__traceback__


@pytest.mark.timeout(60)
def test_lock_taken_first_serialises_without_errors(
    tables: None, session: Any, db: psycopg.Connection[Any]
) -> None:
    """AWS's remedy: LOCK every table the transaction touches, first, in one order. The
    second waits for the first, its snapshot comes after, and both commit. LOCK makes
    readers wait too (`LOCK`)."""
    one, two, reader = session(), session(), session()
    run(one, "lock tab1, tab2")
    run(one, "select count(*) from tab2")
    thread, outcome = _in_thread(lambda: (run(two, "lock tab1, tab2"), run(two, "select 1")))
    # The reader ends its transaction once it has read: left open, it races `two` for tab1.
    reads, read = _in_thread(lambda: (run(reader, "select count(*) from tab1"), reader.commit()))
    time.sleep(HOLD_SECONDS)
    assert thread.is_alive() and reads.is_alive()
    run(one, "insert into tab1 values (1)")
    run(one, "insert into tab2 values (1)")
    one.commit()
    thread.join(timeout=10)
    assert "error" not in outcome, outcome
    run(two, "delete from tab2")
    run(two, "insert into tab1 values (2)")
    two.commit()
    reads.join(timeout=10)
    assert "error" not in read, read
    assert db.execute("SELECT count(*) FROM tab1").fetchone() == (2,)
    assert db.execute("SELECT count(*) FROM tab2").fetchone() == (0,)


def test_injected_commit_failures_have_redshifts_shape(
    tables: None, session: Any, emulator: RedshiftEmulator, db: psycopg.Connection[Any]
) -> None:
    """`fail_commits` fails the COMMIT of a transaction that wrote, as a 1023 would."""
    conn = session()
    emulator.fail_commits = 1
    run(conn, "select count(*) from tab1")
    conn.commit()  # wrote nothing: not a candidate
    run(conn, "insert into tab1 values (1)")
    with pytest.raises(redshift_connector.ProgrammingError) as caught:
        conn.commit()
    assert_violation(caught, "tab1", db)
    assert emulator.fail_commits == 0
    assert db.execute("SELECT count(*) FROM tab1").fetchone() == (0,)


def test_truncate_commits_the_open_transaction(
    tables: None, session: Any, db: psycopg.Connection[Any]
) -> None:
    """AWS "Serializable isolation": TRUNCATE commits all outstanding changes."""
    conn = session()
    run(conn, "insert into tab1 values (1)")
    run(conn, "truncate tab2")
    conn.rollback()  # too late for the insert
    assert db.execute("SELECT count(*) FROM tab1").fetchone() == (1,)


def test_copy_counts_varchar_widths_in_bytes(
    session: Any,
    emulator: RedshiftEmulator,
    db: psycopg.Connection[Any],
    s3: Any,
    staging_bucket: str,
) -> None:
    """AWS "Character types": VARCHAR(n) holds n bytes. Three characters of two bytes each
    do not fit VARCHAR(5): the whole COPY fails, as COPY from Parquet has no MAXERROR."""
    db.execute("CREATE TABLE names (name varchar(5))")
    give(db, emulator.user, "names")
    db.commit()
    conn = session()

    def copy(values: list[str]) -> None:
        sink = pa.BufferOutputStream()
        pq.write_table(pa.table({"name": values}), sink)
        s3.put_object(Bucket=staging_bucket, Key="names.parquet", Body=sink.getvalue().to_pybytes())
        run(
            conn,
            f"COPY names FROM 's3://{staging_bucket}/names.parquet' IAM_ROLE '{ROLE}' "
            "FORMAT AS PARQUET",
        )

    copy(["abcde", "ééa"])  # 5 bytes each
    conn.commit()
    with pytest.raises(redshift_connector.ProgrammingError) as caught:
        copy(["abc", "ééé"])  # 3 characters, 6 bytes
    assert fields(caught.value)["C"] == "XX000"
    assert "Table: 5, Data: 6" in fields(caught.value)["M"]
    conn.rollback()
    assert db.execute("SELECT count(*) FROM names").fetchone() == (2,)


def test_copy_feeds_postgresql_binary_where_types_allow_the_same_rows_as_csv(
    db: psycopg.Connection[Any],
) -> None:
    """The emulator's COPY sends PostgreSQL binary when every column's Arrow type is the one
    its column reads, CSV otherwise; both load the same values (the emulator's sessions read
    timestamps in UTC, as this one does)."""
    utc = pa.timestamp("us", tz="UTC")
    rows = pa.table(
        {
            "s": pa.array(["a,b", None, 'q"uote\nline'], pa.string()),
            "v": pa.array(["é", "x", None], pa.string()),
            "i": pa.array([2**62, None, -1], pa.int64()),
            "f": pa.array([1.5, None, 1e300], pa.float64()),
            "b": pa.array([True, None, False], pa.bool_()),
            "ts": pa.array([0, None, 1_700_000_000_123_456], utc),
            "tz": pa.array([-86_400_000_000, 1, None], utc),
            "d": pa.array([0, 19_000, None], pa.date32()),
        }
    )
    oids = [25, 1043, 20, 701, 16, 1114, 1184, 1082]  # text varchar int8 float8 bool ts tstz date
    db.execute("SET timezone TO 'UTC'")
    db.execute(
        "CREATE TABLE via_binary (s text, v varchar(20), i bigint, f double precision,"
        " b boolean, ts timestamp, tz timestamptz, d date)"
    )
    db.execute("CREATE TABLE via_csv (LIKE via_binary)")
    binary = copy_input(rows, oids)
    assert binary[0] == "binary"
    assert copy_input(rows, [*oids[:-1], 23])[0] == "csv"  # an INTEGER column: int64 is not it
    assert copy_input(rows.set_column(2, "i", pa.array([1, 2, 3], pa.int32())), oids)[0] == "csv"
    csv = copy_input(rows, [*oids[:-1], None])
    assert csv[0] == "csv"
    for table, (copy_format, data) in (("via_binary", binary), ("via_csv", csv)):
        with db.cursor().copy(f"COPY {table} FROM STDIN (FORMAT {copy_format})") as copy:
            for chunk in data:
                copy.write(chunk)
    loaded = [
        db.execute(f"SELECT * FROM {table} ORDER BY i NULLS FIRST").fetchall()
        for table in ("via_binary", "via_csv")
    ]
    assert loaded[0] == loaded[1]
    assert len(loaded[0]) == 3 and loaded[0][0][0] is None and loaded[0][2][1] == "é"


def test_serverless_refuses_stv_tables_and_both_offer_sys_views(
    emulator: RedshiftEmulator, session: Any
) -> None:
    """AWS "System view mapping for migrating to SYS views": STL/STV/SVL tables are
    provisioned-only; a Serverless workgroup answers 42501 "permission denied for relation"
    (the shape drivers report) and aborts the transaction. SYS_SESSION_HISTORY, on both,
    shows this session by its pid."""
    conn = session()
    (pid,) = run(conn, "SELECT pg_backend_pid()")[0]
    rows = run(conn, f"SELECT session_id, status FROM sys_session_history WHERE session_id = {pid}")
    assert [tuple(r) for r in rows] == [(pid, "active")]
    conn.rollback()
    if not emulator.serverless:
        assert [
            tuple(r)
            for r in run(conn, "SELECT process FROM stv_sessions WHERE process = pg_backend_pid()")
        ] == [(pid,)]
        return
    with pytest.raises(redshift_connector.ProgrammingError) as refused:
        run(conn, "SELECT process, starttime FROM stv_sessions")
    fields = refused.value.args[0]
    assert (fields["C"], fields["M"]) == ("42501", "permission denied for relation stv_sessions")
    # a permission: for an operator (FLEET_REDSHIFT_SERVERLESS), never retried
    assert sqlstate_kind(fields["C"], fields["M"]) is ErrorKind.CONFIGURATION
    with pytest.raises(redshift_connector.ProgrammingError):
        run(conn, "SELECT 1")  # the transaction is aborted, as Redshift aborts it
    conn.rollback()
    assert run(conn, "SELECT 1") == [[1]]
    emulator.refusals.clear()  # refused on purpose
