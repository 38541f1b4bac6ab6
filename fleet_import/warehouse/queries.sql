-- Static statements of the PostgreSQL warehouse. Sections are named `-- name --`. SQL that
-- names a curated table is composed in postgres.py with psycopg.sql.Identifier instead.

-- lock_ddl --
-- Concurrent CREATE ... IF NOT EXISTS of one relation can still collide in the catalog
-- (a unique violation on pg_type), so schema changes take turns.
SELECT pg_advisory_xact_lock(%(lock_class)s, 0)

-- lock_scope --
-- One writer per (tenant, scope) at a time; others wait for its commit and then replace
-- what it wrote. Held until the transaction ends; a hash collision only serialises more.
SELECT pg_advisory_xact_lock(%(lock_class)s, hashtext(%(tenant_id)s || chr(31) || %(source_scope)s))

-- create_registry --
CREATE TABLE IF NOT EXISTS curated.ingestion_slices (
    tenant_id text NOT NULL,
    source_scope text NOT NULL,
    dataset text NOT NULL,
    batch_id uuid NOT NULL,
    row_count bigint NOT NULL,
    committed_at timestamptz NOT NULL,
    -- Where the dataset's rows live, so that a later batch without this dataset can
    -- still delete them.
    target_table text NOT NULL,
    PRIMARY KEY (tenant_id, source_scope, dataset)
)

-- table_columns --
SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS not_null
FROM pg_attribute AS a
JOIN pg_class AS c ON c.oid = a.attrelid
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname = %(relation)s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum

-- relation_exists --
SELECT EXISTS (
    SELECT FROM pg_class AS c
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema)s AND c.relname = %(relation)s
)

-- registered_slices --
SELECT dataset, target_table, batch_id
FROM curated.ingestion_slices
WHERE tenant_id = %(tenant_id)s AND source_scope = %(source_scope)s
ORDER BY dataset
FOR UPDATE

-- upsert_slice --
INSERT INTO curated.ingestion_slices AS s (
    tenant_id, source_scope, dataset, batch_id, row_count, committed_at, target_table
)
VALUES (
    %(tenant_id)s, %(source_scope)s, %(dataset)s, %(batch_id)s, %(row_count)s, now(),
    %(target_table)s
)
ON CONFLICT (tenant_id, source_scope, dataset) DO UPDATE
SET batch_id = EXCLUDED.batch_id,
    row_count = EXCLUDED.row_count,
    committed_at = EXCLUDED.committed_at,
    target_table = EXCLUDED.target_table

-- forget_slice --
DELETE FROM curated.ingestion_slices
WHERE tenant_id = %(tenant_id)s AND source_scope = %(source_scope)s AND dataset = %(dataset)s

-- slice_owner --
SELECT DISTINCT batch_id
FROM curated.ingestion_slices
WHERE tenant_id = %(tenant_id)s AND source_scope = %(source_scope)s

-- slice_tables --
SELECT dataset, target_table, batch_id
FROM curated.ingestion_slices
WHERE tenant_id = %(tenant_id)s AND source_scope = %(source_scope)s
ORDER BY dataset

-- session_identity --
-- pid and start time name a session uniquely: a pid alone may be reused by a later session.
SELECT pid, backend_start AS started FROM pg_stat_activity WHERE pid = pg_backend_pid()

-- end_session --
-- Ends an abandoned holder's slice session: its transaction rolls back and its locks go.
-- Waits (up to the timeout, in ms) until the backend has exited, so the caller's next
-- statement no longer meets its locks.
SELECT pg_terminate_backend(pid, %(timeout_ms)s) AS ended
FROM pg_stat_activity
WHERE pid = %(pid)s AND backend_start = %(started)s::timestamptz
