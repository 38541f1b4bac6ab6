-- Static statements only the PostgreSQL warehouse runs. Sections are named `-- name --`.
-- SQL that names a curated table is composed in ddl.py and slice_sql.py instead, and what
-- both dialects share (the slice registry, slice deletes and counts) in warehouse/sql.py.

-- lock_ddl --
-- Concurrent CREATE ... IF NOT EXISTS of one relation can still collide in the catalog
-- (a unique violation on pg_type), so schema changes take turns.
SELECT pg_advisory_xact_lock(%(lock_class)s, 0)

-- lock_scope --
-- One writer per (tenant, scope) at a time; others wait for its commit and then replace
-- what it wrote. Held until the transaction ends; a hash collision only serialises more.
SELECT pg_advisory_xact_lock(%(lock_class)s, hashtext(%(tenant_id)s || chr(31) || %(source_scope)s))

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

-- full_page_compression --
-- What this session could compress the full-page images of its WAL with: the server's setting
-- now, the methods its build offers, and whether this role may set it (a superuser, or a role
-- granted SET ON PARAMETER wal_compression, PostgreSQL 15+).
SELECT s.setting, s.enumvals, has_parameter_privilege('wal_compression', 'SET') AS may_set
FROM pg_settings AS s
WHERE s.name = 'wal_compression'

-- compress_full_pages --
-- SET LOCAL, with the method a bound value.
SELECT set_config('wal_compression', %(method)s, true)
