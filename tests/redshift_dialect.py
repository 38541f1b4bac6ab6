"""Redshift's SQL as the emulator (tests/redshift_emulator.py) treats it: what Redshift says
in other words than PostgreSQL (rewritten on the way upstream)."""

from __future__ import annotations

import re

from tests.redshift_wire import identifier

_GETDATE = re.compile(r"\bGETDATE\s*\(\s*\)", re.IGNORECASE)
_LAYOUT = re.compile(
    r"\s+(DISTSTYLE\s+\w+|DISTKEY\s*\([^)]*\)|((COMPOUND|INTERLEAVED)\s+)?SORTKEY\s*\([^)]*\))",
    re.IGNORECASE,
)
_ENCODE = re.compile(r"\s+ENCODE\s+\w+", re.IGNORECASE)
_ALTER_ENCODE = re.compile(r"(\bALTER\s+(?:COLUMN\s+)?\S+\s+)ENCODE\s+\w+", re.IGNORECASE)
_QUERY_GROUP = re.compile(r"^(\s*(?:SET|RESET|SHOW)\s+)query_group\b", re.IGNORECASE)
"""Redshift's query_group: PostgreSQL knows no such setting, but keeps any dotted one."""
_SORTKEY = re.compile(r"\bSORTKEY\s*\((?P<columns>[^)]*)\)", re.IGNORECASE)
_CREATE_TABLE = re.compile(
    r"^\s*CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?"
    r"(?P<table>(?:\"(?:[^\"]|\"\")+\"|[\w$]+)(?:\.(?:\"(?:[^\"]|\"\")+\"|[\w$]+))?)",
    re.IGNORECASE,
)


def to_postgres(sql: str) -> str:
    """Redshift-only syntax in `sql` in PostgreSQL's words (see the module docstring):
    GETDATE(), query_group (a custom setting, `redshift.query_group`), the layout attributes,
    ENCODE clauses (an ALTER COLUMN ... ENCODE becomes a
    harmless ALTER COLUMN, recorded by the session as the column's encoding). A
    table's SORTKEY lets Redshift skip the blocks outside a slice (zone maps); PostgreSQL
    needs an index on those columns to do the same, created with the table."""
    sql = _QUERY_GROUP.sub(r"\1redshift.query_group", sql)
    if re.match(r"^\s*ALTER\s+TABLE\b", sql, re.IGNORECASE):
        # A column's compression is Redshift's alone: PostgreSQL only takes the table lock.
        sql = _ALTER_ENCODE.sub(r"\1SET STATISTICS -1", sql)
    text = _GETDATE.sub("LOCALTIMESTAMP", _ENCODE.sub("", _LAYOUT.sub("", sql)))
    sortkey, create = _SORTKEY.search(sql), _CREATE_TABLE.match(sql)
    if not (sortkey and create) or "$emulator$" in text:
        return text
    table = create["table"]
    name = table.rsplit(".", 1)[-1].strip('"') + "_sortkey"
    return (
        f"DO $emulator$BEGIN {text}; CREATE INDEX IF NOT EXISTS {identifier(name)} "
        f"ON {table} ({sortkey['columns']}); END$emulator$"
    )
