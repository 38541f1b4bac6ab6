"""Test databases reused instead of cloned per test, where it is provably the same.

Cloning the migrated template (CREATE DATABASE ... TEMPLATE) and dropping the clone cost
PostgreSQL about 0.15 s of CPU per test, mostly the file copy and the checkpoints both force:
a quarter of all the CPU `make test` used on 2 cores. A test's database is instead handed
back to its xdist worker's pool: every other session on it ended, renamed (so nothing that
still holds the old URL can reach the next test), emptied (the schemas and objects the test
made dropped, the template's tables truncated, its sequences restarted) and then compared
with the template by a fingerprint of its catalog and of what the template holds. Only a
database whose fingerprint is the template's is reused; anything else (a role's grant, a
setting, an object the cleanup does not know) is dropped, and the next test gets a fresh
clone, as before.
"""

from __future__ import annotations

import time

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from tests import pgtools

_KEPT_SCHEMAS = ("public", "pg_catalog", "information_schema", "pg_toast")
_RENAME_ATTEMPTS = 50
_RENAME_PAUSE_SECONDS = 0.1

# Everything a test could leave behind that the cleanup below does not undo, as text lines;
# the template's and a cleaned database's must be equal line for line.
_FINGERPRINT = """
WITH user_ns AS (
    SELECT oid, nspname FROM pg_namespace
    WHERE nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
      AND nspname NOT LIKE 'pg_temp_%' AND nspname NOT LIKE 'pg_toast_temp_%'
)
SELECT line FROM (
    SELECT format('schema %s %s %s', nspname, nspowner::regrole, nspacl) AS line
    FROM pg_namespace WHERE nspname NOT LIKE 'pg_temp_%' AND nspname NOT LIKE 'pg_toast_temp_%'
    UNION ALL
    SELECT format('relation %s.%s %s %s %s %s %s %s', n.nspname, c.relname, c.relkind,
                  c.relowner::regrole, c.relacl, c.reloptions, c.relpersistence,
                  c.relrowsecurity)
    FROM pg_class c JOIN user_ns n ON n.oid = c.relnamespace
    UNION ALL
    SELECT format('column %s %s %s %s %s %s', a.attrelid::regclass, a.attnum, a.attname,
                  format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attisdropped)
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
    JOIN user_ns n ON n.oid = c.relnamespace WHERE a.attnum > 0
    UNION ALL
    SELECT format('default %s %s %s', d.adrelid::regclass, d.adnum,
                  pg_get_expr(d.adbin, d.adrelid))
    FROM pg_attrdef d JOIN pg_class c ON c.oid = d.adrelid JOIN user_ns n ON n.oid = c.relnamespace
    UNION ALL
    SELECT format('constraint %s %s %s', co.conrelid::regclass, co.conname,
                  pg_get_constraintdef(co.oid))
    FROM pg_constraint co JOIN user_ns n ON n.oid = co.connamespace
    UNION ALL
    SELECT format('index %s', pg_get_indexdef(i.indexrelid))
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN user_ns n ON n.oid = c.relnamespace
    UNION ALL
    SELECT format('trigger %s %s %s', t.tgrelid::regclass, t.tgname, t.tgenabled)
    FROM pg_trigger t WHERE NOT t.tgisinternal
    UNION ALL
    SELECT format('function %s %s %s %s', p.oid::regprocedure, md5(p.prosrc),
                  p.proowner::regrole, p.proacl)
    FROM pg_proc p JOIN user_ns n ON n.oid = p.pronamespace
    UNION ALL
    SELECT format('type %s %s', t.oid::regtype, t.typtype)
    FROM pg_type t JOIN user_ns n ON n.oid = t.typnamespace
    UNION ALL
    SELECT format('sequence %s.%s %s %s %s', schemaname, sequencename, start_value,
                  increment_by, last_value)
    FROM pg_sequences
    UNION ALL
    SELECT format('database %s %s %s', coalesce(datacl, acldefault('d', datdba)), datconnlimit,
                  datallowconn)
    FROM pg_database WHERE datname = current_database()
    UNION ALL
    SELECT format('setting %s %s', s.setrole, s.setconfig)
    FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase
    WHERE d.datname = current_database()
    UNION ALL
    SELECT format('default acl %s %s %s %s', defaclrole::regrole, defaclnamespace,
                  defaclobjtype, defaclacl)
    FROM pg_default_acl
    UNION ALL SELECT format('extension %s %s', extname, extversion) FROM pg_extension
    UNION ALL SELECT format('policy %s %s', polrelid::regclass, polname) FROM pg_policy
    UNION ALL
    SELECT format('rule %s.%s %s', schemaname, tablename, rulename) FROM pg_rules
    WHERE schemaname NOT IN ('pg_catalog', 'information_schema')
    UNION ALL SELECT format('event trigger %s', evtname) FROM pg_event_trigger
    UNION ALL SELECT format('publication %s', pubname) FROM pg_publication
    UNION ALL SELECT format('large objects %s', count(*)) FROM pg_largeobject_metadata
    UNION ALL SELECT format('prepared %s', gid) FROM pg_prepared_xacts
    WHERE database = current_database()
) lines
ORDER BY line
"""

_TABLES = """
SELECT c.relname FROM pg_class c
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
ORDER BY c.relname
"""

_LEFTOVER_SCHEMAS = """
SELECT nspname FROM pg_namespace
WHERE nspname <> ALL(%s) AND nspname NOT LIKE 'pg_temp_%%' AND nspname NOT LIKE 'pg_toast_temp_%%'
"""

_LEFTOVER_RELATIONS = """
SELECT c.relname, c.relkind FROM pg_class c
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
  AND c.relname <> ALL(%s)
"""

_LEFTOVER_FUNCTIONS = """
SELECT p.oid::regprocedure::text FROM pg_proc p
WHERE p.pronamespace = 'public'::regnamespace AND p.oid::regprocedure::text <> ALL(%s)
"""

_DATABASE_GRANTEES = """
SELECT DISTINCT a.grantee::regrole::text FROM pg_database d, aclexplode(d.datacl) a
WHERE d.datname = current_database() AND a.grantee NOT IN (0, d.datdba)
"""

_DROP_RELATION = {
    "r": "TABLE", "p": "TABLE", "v": "VIEW", "m": "MATERIALIZED VIEW", "S": "SEQUENCE",
    "f": "FOREIGN TABLE",
}  # fmt: skip


def _connect(url: str) -> psycopg.Connection:
    return psycopg.connect(pgtools.libpq_url(url), autocommit=True)


def fingerprint(url: str) -> list[str]:
    """The catalog and the rows a test could change in the database at `url`, as lines."""
    with _connect(url) as conn:
        lines = [row[0] for row in conn.execute(_FINGERPRINT)]
        for (table,) in conn.execute(_TABLES).fetchall():
            rows = conn.execute(
                sql.SQL("SELECT md5(string_agg(t::text, ',' ORDER BY t::text)) FROM {} t").format(
                    sql.Identifier(table)
                )
            ).fetchone()
            lines.append(f"rows {table} {rows[0] if rows else None}")
    return lines


class DatabasePool:
    """One xdist worker's test databases: a clone of `template` per test, reused once the
    test is over when the cleanup makes it the template's equal again."""

    def __init__(self, admin_url: str, template: str) -> None:
        self._admin_url = admin_url
        self._template = template
        template_url = pgtools.with_dbname(admin_url, template)
        self._clean = fingerprint(template_url)
        with _connect(template_url) as conn:
            relations = conn.execute(
                "SELECT relname, relkind FROM pg_class"
                " WHERE relnamespace = 'public'::regnamespace ORDER BY relname"
            ).fetchall()
            self._relations = [name for name, _ in relations]
            self._tables = [name for name, kind in relations if kind in ("r", "p")]  # _TABLES
            self._sequences = [name for name, kind in relations if kind == "S"]
            self._functions = [
                row[0]
                for row in conn.execute(
                    "SELECT oid::regprocedure::text FROM pg_proc"
                    " WHERE pronamespace = 'public'::regnamespace"
                )
            ]
            self._seeded = [
                table
                for table in self._tables
                if conn.execute(
                    sql.SQL("SELECT EXISTS (SELECT FROM {})").format(sql.Identifier(table))
                ).fetchone()[0]
            ]
        self._free: list[str] = []

    def take(self) -> str:
        """A database equal to the template, private to the caller; its name is new."""
        if self._free:
            return self._free.pop()
        name = pgtools.unique_name("test")
        pgtools.create_database(self._admin_url, name, template=self._template)
        return name

    def give_back(self, name: str) -> None:
        """The test is over: reuse the database if it can be made the template's equal,
        else drop it."""
        fresh = pgtools.unique_name("test")
        if not self._renamed(name, fresh):
            pgtools.drop_database(self._admin_url, name)
            return
        url = pgtools.with_dbname(self._admin_url, fresh)
        try:
            self._empty(url)
            reusable = fingerprint(url) == self._clean
        except psycopg.Error:
            reusable = False
        if reusable:
            self._free.append(fresh)
        else:
            pgtools.drop_database(self._admin_url, fresh)

    def close(self) -> None:
        while self._free:
            pgtools.drop_database(self._admin_url, self._free.pop())

    def _renamed(self, name: str, fresh: str) -> bool:
        """Every session on `name` ended, and `name` renamed to `fresh`: a process of the
        test still holding the old URL (a child, a thread) can no longer reach it."""
        with _connect(self._admin_url) as conn:
            for _ in range(_RENAME_ATTEMPTS):
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()",
                    (name,),
                )
                try:
                    conn.execute(
                        sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                            sql.Identifier(name), sql.Identifier(fresh)
                        )
                    )
                    return True
                except pg_errors.ObjectInUse:  # a session ending, or one that just came
                    time.sleep(_RENAME_PAUSE_SECONDS)
        return False

    def _empty(self, url: str) -> None:
        """Revoke what the test granted on the database, drop what it made, truncate the
        template's tables, restart its sequences."""
        with _connect(url) as conn, conn.transaction():
            # The Redshift tests' loading role gets CONNECT and TEMP on the database.
            for (role,) in conn.execute(_DATABASE_GRANTEES).fetchall():
                conn.execute(
                    sql.SQL("REVOKE ALL ON DATABASE {} FROM {}").format(
                        sql.Identifier(conn.info.dbname), sql.SQL(role)
                    )
                )
            for (schema,) in conn.execute(_LEFTOVER_SCHEMAS, (list(_KEPT_SCHEMAS),)).fetchall():
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
            for relation, kind in conn.execute(_LEFTOVER_RELATIONS, (self._relations,)).fetchall():
                conn.execute(
                    sql.SQL("DROP {} IF EXISTS {} CASCADE").format(
                        sql.SQL(_DROP_RELATION[kind]), sql.Identifier("public", relation)
                    )
                )
            for (function,) in conn.execute(_LEFTOVER_FUNCTIONS, (self._functions,)).fetchall():
                conn.execute(
                    sql.SQL("DROP FUNCTION IF EXISTS {} CASCADE").format(sql.SQL(function))
                )
            emptied = [table for table in self._tables if table not in self._seeded]
            if emptied:
                conn.execute(
                    sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
                        sql.SQL(", ").join(sql.Identifier("public", table) for table in emptied)
                    )
                )
            for sequence in self._sequences:
                conn.execute(
                    sql.SQL("ALTER SEQUENCE {} RESTART").format(sql.Identifier("public", sequence))
                )
