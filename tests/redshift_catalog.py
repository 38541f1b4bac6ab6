"""What the emulator (tests/redshift_emulator.py) shows of Redshift's system catalog, and
what it injects: the session views of a provisioned cluster and of a Serverless workgroup,
Serverless's refusal of the provisioned-only tables, and the errors `fail_next` raises."""

from __future__ import annotations

import re
from dataclasses import dataclass

PROVISIONED_ONLY = re.compile(r"\b(?:pg_catalog\.)?(?P<relation>(?:stl|stv|svl|svcs)_\w+)", re.I)
"""System relations a Serverless workgroup refuses (AWS "System view mapping for migrating
to SYS views": STL, STV, SVL and SVCS are provisioned-only)."""
PUBLIC = "PUBLIC"
"""Who sees the system views: every user, each its own sessions (AWS "STV_SESSIONS": "visible
to all users"; PostgreSQL's pg_stat_activity likewise shows a user its own sessions)."""
_SESSIONS = "FROM pg_stat_activity WHERE backend_type = 'client backend'"


@dataclass(frozen=True)
class Failure:
    """An error the next COPY (`at="copy"`) or COMMIT of a transaction that wrote (`"commit"`)
    fails with, in Redshift's shape: SQLSTATE, message, detail (`RedshiftEmulator.fail_next`)."""

    at: str
    message: str
    sqlstate: str = "XX000"
    detail: str = ""


def create_system_views(upstream_url: str, *, serverless: bool) -> None:
    """SYS_QUERY_HISTORY, filled as statements run (below); SYS_SESSION_HISTORY (AWS:
    "SYS_SESSION_HISTORY", on clusters and workgroups): the
    emulated sessions, all active (`session_id` the pid, `start_time` in UTC); and, on a
    provisioned cluster only, STV_SESSIONS (AWS: "STV_SESSIONS"): `process` its pid and
    `starttime`. Every emulated session is one upstream backend, so pg_stat_activity answers
    both, and PG_TERMINATE_BACKEND ends it."""
    import psycopg

    from fleet_import.config import libpq_url

    with psycopg.connect(libpq_url(upstream_url), autocommit=True) as conn:
        # SYS_QUERY_HISTORY (AWS: "SYS_QUERY_HISTORY", clusters and workgroups): one row per
        # statement the emulator ran, its session's query_group as `query_label`,
        # `elapsed_time` in microseconds (RedshiftEmulator.record_query writes it).
        conn.execute(
            "CREATE TABLE IF NOT EXISTS public.sys_query_history ("
            "query_id bigserial, query_label varchar(320) NOT NULL DEFAULT '', "
            "database_name text, query_text text, start_time timestamp, end_time timestamp, "
            "elapsed_time bigint, status text)"
        )
        conn.execute(f"GRANT SELECT ON public.sys_query_history TO {PUBLIC}")
        conn.execute(
            "CREATE OR REPLACE VIEW public.sys_session_history AS "
            "SELECT usesysid::text AS user_id, pid AS session_id, "
            "datname::text AS database_name, 'active'::text AS status, "
            "0 AS session_timeout, (backend_start AT TIME ZONE 'UTC') AS start_time, "
            f"NULL::timestamp AS end_time {_SESSIONS}"
        )
        conn.execute(f"GRANT SELECT ON public.sys_session_history TO {PUBLIC}")
        if serverless:
            conn.execute("DROP VIEW IF EXISTS public.stv_sessions")
            return
        conn.execute(
            "CREATE OR REPLACE VIEW public.stv_sessions AS "
            "SELECT pid AS process, (backend_start AT TIME ZONE 'UTC') AS starttime, "
            f"usename::text AS user_name, datname::text AS db_name {_SESSIONS}"
        )
        conn.execute(f"GRANT SELECT ON public.stv_sessions TO {PUBLIC}")


def refusal(sql: str) -> str | None:
    """Serverless's message for a statement on an STL/STV/SVL/SVCS relation (SQLSTATE
    42501), as drivers report it: "permission denied for relation stl_insert"
    (open-metadata/OpenMetadata#14820, datahub-project/datahub#11922)."""
    match = PROVISIONED_ONLY.search(sql)
    return f"permission denied for relation {match['relation'].lower()}" if match else None
