"""The emulator says no where Redshift says no (tests/redshift_strict.py, the type and option
checks of tests/redshift_copy.py), seen through redshift_connector: each refusal in Redshift's
shape (SQLSTATE, message), the transaction aborted as Redshift aborts it, and what Redshift
does accept still accepted. That the real backend never meets one is shown by the whole
Redshift suite passing against this emulator (tests/warehouse/test_redshift_*.py)."""

from __future__ import annotations

import contextlib
import gc
import time
import warnings
from collections.abc import Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redshift_connector

from fleet_import.errors import ErrorKind
from fleet_import.warehouse.redshift import driver
from tests.redshift_emulator import RedshiftEmulator

ROLE = "arn:aws:iam::123456789012:role/fleet-redshift-copy"


@pytest.fixture
def emulator(database_url: str, s3: Any) -> Iterator[RedshiftEmulator]:
    """One mode: the refusals do not depend on it."""
    with RedshiftEmulator(database_url, s3) as emu:
        yield emu


@pytest.fixture
def tables(db: psycopg.Connection[Any]) -> None:
    db.execute("CREATE TABLE tab1 (v bigint)")
    db.execute("CREATE TABLE tab3 (s varchar(4), t varchar(10))")


@pytest.fixture
def session(emulator: RedshiftEmulator) -> Iterator[Any]:
    opened: list[Any] = []

    def connect(**extra: Any) -> Any:
        conn = redshift_connector.connect(**emulator.connect_kwargs(**extra))
        opened.append(conn)
        return conn

    yield connect
    for conn in opened:
        with contextlib.suppress(redshift_connector.Error):
            conn.close()


def run(conn: Any, sql: str, params: Any = None) -> list[Any]:
    cursor = conn.cursor()
    cursor.execute(sql, params)
    return list(cursor.fetchall()) if cursor.description else []


def refused(conn: Any, sql: str, params: Any = None) -> dict[str, str]:
    with pytest.raises(redshift_connector.ProgrammingError) as caught:
        run(conn, sql, params)
    fields = caught.value.args[0]
    # Never retried: a refusal is the statement's, not the moment's.
    assert driver.translate(caught.value).kind is not ErrorKind.TRANSIENT
    return fields


LEADER_ONLY = "Specified types or functions (one per INFO message) not supported on Redshift"


@pytest.mark.parametrize(
    ("sql", "sqlstate", "message"),
    [
        ("INSERT INTO tab1 VALUES (1) ON CONFLICT DO NOTHING", "42601", 'at or near "ON"'),
        ("INSERT INTO tab1 VALUES (1) RETURNING v", "42601", 'at or near "RETURNING"'),
        ("CREATE INDEX tab1_v ON tab1 (v)", "0A000", "CREATE INDEX is not supported"),
        ("SELECT v FROM tab1 FOR UPDATE", "0A000", "FOR UPDATE/SHARE is not supported"),
        ("SELECT pg_advisory_xact_lock(1)", "42883", "pg_advisory_xact_lock(bigint) does not"),
        ("SELECT pg_try_advisory_lock(7)", "42883", "pg_try_advisory_lock(bigint) does not"),
        ("LOCK tab1 IN ACCESS EXCLUSIVE MODE", "42601", 'at or near "IN"'),
        ("LOCK TABLE tab1 IN SHARE ROW EXCLUSIVE MODE", "42601", 'at or near "IN"'),
        ("SELECT v, NOW() FROM tab1", "0A000", LEADER_ONLY),
        ("INSERT INTO tab1 SELECT v FROM tab1 WHERE NOW() > '2020-01-01'", "0A000", LEADER_ONLY),
        ("SELECT current_schema() FROM tab1", "0A000", LEADER_ONLY),
        ("ALTER TABLE tab3 ALTER COLUMN s TYPE VARCHAR(8)", "25001", "inside a transaction"),
    ],
)
def test_postgresql_only_sql_is_refused_and_aborts_the_transaction(
    tables: None, session: Any, sql: str, sqlstate: str, message: str
) -> None:
    conn = session()
    fields = refused(conn, sql)
    assert fields["C"] == sqlstate and message in fields["M"], fields
    with pytest.raises(redshift_connector.ProgrammingError) as aborted:
        run(conn, "SELECT 1")  # the transaction is aborted, as Redshift aborts it
    assert aborted.value.args[0]["C"] == "25P02"
    conn.rollback()
    assert run(conn, "SELECT 1") == [[1]]


@pytest.mark.parametrize(
    ("sql", "sqlstate", "message"),
    [
        ("ALTER TABLE tab1 ALTER COLUMN v TYPE integer", "0A000", "to integer is not supported"),
        (
            "ALTER TABLE tab3 ALTER COLUMN s TYPE VARCHAR(8) USING s::varchar(8)",
            "0A000",
            "does not support USING expression",
        ),
    ],
)
def test_alter_column_type_is_varchar_widening_only(
    tables: None, session: Any, sql: str, sqlstate: str, message: str
) -> None:
    conn = session()
    conn.autocommit = True
    fields = refused(conn, sql)
    assert fields["C"] == sqlstate and message in fields["M"], fields


def test_what_redshift_accepts_is_still_accepted(
    tables: None, session: Any, db: psycopg.Connection[Any]
) -> None:
    """Leader-only functions without a user table, GETDATE() with one, LOCK without a mode,
    and VARCHAR widening outside a transaction block."""
    conn = session()
    assert len(run(conn, "SELECT NOW(), current_schema()")) == 1
    run(conn, "LOCK tab1, tab3")
    run(conn, "INSERT INTO tab1 SELECT 1 WHERE GETDATE() > '2020-01-01'")
    assert run(conn, "SELECT v FROM tab1 WHERE GETDATE() > '2020-01-01'") == [[1]]
    conn.commit()
    conn.autocommit = True
    run(conn, "ALTER TABLE tab3 ALTER COLUMN s TYPE VARCHAR(8)")
    width = db.execute(
        "SELECT character_maximum_length FROM information_schema.columns "
        "WHERE table_name = 'tab3' AND column_name = 's'"
    ).fetchone()
    assert width == (8,)


def test_widening_a_bytedict_column_is_refused_until_it_is_reencoded(
    tables: None, session: Any, emulator: RedshiftEmulator
) -> None:
    """AWS ALTER TABLE: no ALTER COLUMN ... TYPE for BYTEDICT, RUNLENGTH, TEXT255 or TEXT32K
    columns (what ENCODE AUTO may choose for a low-cardinality column); ALTER COLUMN ...
    ENCODE to another encoding lifts it."""
    emulator.encodings[("public.tab3", "s")] = "bytedict"
    conn = session()
    conn.autocommit = True
    fields = refused(conn, "ALTER TABLE tab3 ALTER COLUMN s TYPE VARCHAR(8)")
    assert fields["C"] == "0A000" and "BYTEDICT encoding" in fields["M"], fields
    run(conn, "ALTER TABLE tab3 ALTER COLUMN s ENCODE zstd")
    assert emulator.encodings[("public.tab3", "s")] == "zstd"
    run(conn, "ALTER TABLE tab3 ALTER COLUMN s TYPE VARCHAR(8)")


def test_encodings_of_a_created_table_are_remembered(
    session: Any, emulator: RedshiftEmulator
) -> None:
    conn = session()
    run(conn, "CREATE TABLE coded (a VARCHAR(4) ENCODE text255, b BIGINT ENCODE az64) ENCODE AUTO")
    conn.commit()
    assert emulator.encodings[("public.coded", "a")] == "text255"
    conn.autocommit = True
    fields = refused(conn, "ALTER TABLE coded ALTER COLUMN a TYPE VARCHAR(8)")
    assert "TEXT255 encoding" in fields["M"]


def test_insert_parameters_are_measured_in_bytes(
    tables: None, session: Any, db: psycopg.Connection[Any]
) -> None:
    """AWS "Character types": VARCHAR(4) holds 4 bytes; "ééé" is 3 characters, 6 bytes,
    which PostgreSQL would take."""
    conn = session()
    run(conn, "INSERT INTO tab3 (t, s) VALUES (%s, %s)", ["ok", "abcd"])
    conn.commit()
    fields = refused(conn, "INSERT INTO tab3 (t, s) VALUES (%s, %s)", ["ok", "ééé"])
    assert (fields["C"], fields["M"]) == ("22001", "value too long for type character varying(4)")
    conn.rollback()
    fields = refused(conn, "INSERT INTO tab3 (s, t) SELECT s, %s FROM tab3", ["ü" * 6])
    assert fields["M"] == "value too long for type character varying(10)"
    conn.rollback()
    assert db.execute("SELECT s, t FROM tab3").fetchall() == [("abcd", "ok")]


def test_connections_are_capped(session: Any, emulator: RedshiftEmulator) -> None:
    """AWS: 500 connections per cluster, 2,000 per workgroup; one more is refused with
    FATAL 53300 (AWS knowledge center's wording), and closing one frees a slot."""
    assert emulator.max_connections == 500
    emulator.max_connections = 2
    first, _ = session(), session()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # the driver leaves its socket
        with pytest.raises(redshift_connector.Error) as caught:
            session()
        message = str(caught.value)
        del caught
        gc.collect()
    assert "53300" in message
    assert 'connection limit "2" exceeded for non-bootstrap users' in message
    first.close()
    for _ in range(100):
        if emulator.sessions_open < 2:
            break
        time.sleep(0.02)
    assert run(session(), "SELECT 1") == [[1]]


# -- COPY from Parquet ---------------------------------------------------------------------


def _put(s3: Any, bucket: str, key: str, table: pa.Table, **options: Any) -> str:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **options)
    s3.put_object(Bucket=bucket, Key=key, Body=sink.getvalue().to_pybytes())
    return f"s3://{bucket}/{key}"


def test_copy_options_outside_the_parquet_whitelist_are_refused(
    tables: None, session: Any, s3: Any, staging_bucket: str
) -> None:
    """AWS "COPY from columnar data formats": only ACCEPTINVCHARS, FILLRECORD, IAM_ROLE,
    CREDENTIALS, STATUPDATE, MANIFEST, EXPLICIT_IDS (and SERIALIZETOJSON); ACCEPTANYDATE,
    MAXERROR and REGION fail ("REGION argument is not supported for PARQUET based COPY")."""
    uri = _put(s3, staging_bucket, "v.parquet", pa.table({"v": pa.array([1], pa.int64())}))
    conn = session()
    base = f"COPY tab1 FROM '{uri}' IAM_ROLE '{ROLE}' FORMAT AS PARQUET"
    for option in ("MAXERROR 10", "REGION 'us-east-1'", "ACCEPTANYDATE", "TRUNCATECOLUMNS"):
        fields = refused(conn, f"{base} {option}")
        word = option.split()[0]
        assert fields["M"] == f"{word} argument is not supported for PARQUET based COPY", fields
        conn.rollback()
    run(conn, f"{base} STATUPDATE OFF ACCEPTINVCHARS '?'")
    conn.commit()
    assert run(conn, "SELECT v FROM tab1") == [[1]]


def test_parquet_columns_are_type_checked_against_the_table(
    tables: None, session: Any, s3: Any, staging_bucket: str
) -> None:
    """Spectrum reads each file with the table's types: an int64 column into VARCHAR, or a
    string into BIGINT, fails the COPY (XX000) where PostgreSQL's CSV input would coerce."""
    conn = session()
    ints = _put(s3, staging_bucket, "i.parquet", pa.table({"s": [1], "t": ["x"]}))
    fields = refused(conn, f"COPY tab3 FROM '{ints}' IAM_ROLE '{ROLE}' FORMAT AS PARQUET")
    assert fields["C"] == "XX000"
    assert f"File '{ints}' has an incompatible Parquet schema for column 's'" in fields["M"]
    assert "Column type: VARCHAR, Parquet schema: int64" in fields["M"]
    conn.rollback()
    text = _put(s3, staging_bucket, "s.parquet", pa.table({"v": ["1"]}))
    fields = refused(conn, f"COPY tab1 FROM '{text}' IAM_ROLE '{ROLE}' FORMAT AS PARQUET")
    assert "Column type: BIGINT, Parquet schema: string" in fields["M"]
    conn.rollback()
    narrower = _put(s3, staging_bucket, "n.parquet", pa.table({"v": pa.array([7], pa.int32())}))
    run(conn, f"COPY tab1 FROM '{narrower}' IAM_ROLE '{ROLE}' FORMAT AS PARQUET")
    conn.commit()
    assert run(conn, "SELECT v FROM tab1") == [[7]]


def test_nanosecond_timestamps_are_refused(
    session: Any, db: psycopg.Connection[Any], s3: Any, staging_bucket: str
) -> None:
    """Spectrum misreads nanosecond Parquet timestamps (apache/arrow#38000): the emulator
    refuses them, so a regression from microseconds fails here; microseconds load."""
    db.execute("CREATE TABLE times (at timestamp)")
    conn = session()
    for unit, ok in (("ns", False), ("us", True)):
        values = pa.array([1_700_000_000_000_000], pa.timestamp("us")).cast(pa.timestamp(unit))
        uri = _put(s3, staging_bucket, f"{unit}.parquet", pa.table({"at": values}), version="2.6")
        sql = f"COPY times FROM '{uri}' IAM_ROLE '{ROLE}' FORMAT AS PARQUET"
        if ok:
            run(conn, sql)
            conn.commit()
        else:
            fields = refused(conn, sql)
            assert "Parquet schema: timestamp[ns]" in fields["M"]
            assert "nanosecond timestamps are misread by Spectrum" in fields["M"]
            conn.rollback()
    assert db.execute("SELECT count(*) FROM times").fetchone() == (1,)
