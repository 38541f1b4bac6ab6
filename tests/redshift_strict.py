"""What Redshift refuses that PostgreSQL would accept, refused by the emulator
(tests/redshift_emulator.py) in Redshift's shape, so that a test of the backend fails where a
real cluster would. Each refusal names its source; docs/redshift.md says which wordings were
read in AWS docs or public reports and which are the emulator's own.

- PostgreSQL-only syntax: `ON CONFLICT`, `RETURNING` and `LOCK ... IN ... MODE` are syntax
  errors to Redshift's parser (42601, PostgreSQL 8.0's grammar); `CREATE INDEX` and
  `SELECT ... FOR UPDATE/SHARE` are not supported (0A000, AWS "Unsupported PostgreSQL
  features"); advisory locks do not exist (42883, "Unsupported PostgreSQL functions").
- Leader-node-only functions (AWS "Leader node-only functions": NOW(), AGE, CURRENT_TIME,
  CURRENT_TIMESTAMP, LOCALTIME, ISFINITE, CURRENT_SCHEMA(S), HAS_*_PRIVILEGE, GET/SET_BIT,
  GET/SET_BYTE, TO_ASCII) in a statement that references a user table (temp tables too):
  0A000 "Specified types or functions (one per INFO message) not supported on Redshift
  tables." (AWS "SQL functions supported on the leader node").
- `ALTER TABLE ... ALTER COLUMN ... TYPE`: VARCHAR only, never USING, never inside a
  transaction block (AWS ALTER TABLE; messages as drivers report them, dbeaver/dbeaver#9449),
  and not for columns encoded BYTEDICT, RUNLENGTH, TEXT255 or TEXT32K (AWS ALTER TABLE).
- VARCHAR(n) holds n bytes: a bound INSERT parameter longer in UTF-8 bytes fails 22001
  "value too long for type character varying(n)" (AWS "Character types"); PostgreSQL counts
  characters.
- Connections are capped (AWS "Quotas and limits": 500 per provisioned cluster, 2,000 per
  Serverless workgroup): FATAL 53300 "connection limit "500" exceeded for non-bootstrap
  users" (AWS knowledge center "manage connection limits").
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from tests import redshift_isolation as isolation


@dataclass(frozen=True)
class Refusal:
    """An error Redshift raises for a statement: SQLSTATE and message."""

    sqlstate: str
    message: str


CONNECTION_LIMITS = {"provisioned": 500, "serverless": 2000}
NOT_WIDENED = frozenset({"bytedict", "runlength", "text255", "text32k"})
"""Encodings whose VARCHAR columns ALTER COLUMN ... TYPE refuses to widen."""

_NAME = isolation.NAME
_QUALIFIED = isolation.QUALIFIED
_LITERAL = re.compile(r"'(?:[^']|'')*'")
_COMMENT = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)
_QUOTED = re.compile(r'"(?:[^"]|"")+"')
_SYNTAX = (
    (re.compile(r"\bON\s+CONFLICT\b", re.I), "ON"),
    (re.compile(r"\bRETURNING\b", re.I), "RETURNING"),
    (re.compile(r"^\s*LOCK\b[^;]*?\b(IN)\s+[\w\s]+?\bMODE\b", re.I), "IN"),
)
_UNSUPPORTED = (
    (re.compile(r"^\s*CREATE\s+(?:UNIQUE\s+)?INDEX\b", re.I), "CREATE INDEX is not supported"),
    (
        re.compile(r"\bFOR\s+(?:NO\s+KEY\s+)?(?:UPDATE|SHARE|KEY\s+SHARE)\b", re.I),
        "SELECT ... FOR UPDATE/SHARE is not supported",
    ),
)
_ADVISORY = re.compile(r"\b(pg_(?:try_)?advisory_\w+)\s*\(", re.I)
_LEADER_ONLY = re.compile(
    r"\b(now|age|isfinite|current_schemas?|has_(?:database|schema|table)_privilege|getbit"
    r"|get_byte|set_bit|set_byte|to_ascii)\s*\(|\b(current_time|current_timestamp|localtime)\b",
    re.I,
)
_LEADER_ONLY_MESSAGE = (
    "Specified types or functions (one per INFO message) not supported on Redshift tables."
)
_ALTER_TYPE = re.compile(
    rf"^\s*ALTER\s+TABLE\s+(?P<table>{_QUALIFIED})\s+ALTER\s+(?:COLUMN\s+)?(?P<column>{_NAME})"
    r"\s+(?:SET\s+DATA\s+)?TYPE\s+(?P<type>.+?)\s*;?\s*$",
    re.I | re.DOTALL,
)
_VARCHAR = re.compile(r"^(?:VARCHAR|CHARACTER\s+VARYING|NVARCHAR)\s*\(\s*(\d+|MAX)\s*\)$", re.I)
_INSERT = re.compile(
    rf"^\s*INSERT\s+INTO\s+(?P<table>{_QUALIFIED})\s*\((?P<columns>[^)]*)\)\s*"
    r"(?:VALUES\s*\((?P<values>.*)\)\s*;?\s*$|SELECT\s+(?P<select>.*?)\s+FROM\b)",
    re.I | re.DOTALL,
)
_PARAMETER = re.compile(r"^\s*(?:CAST\s*\(\s*)?\$(\d+)\b", re.I)


def code(sql: str) -> str:
    """`sql` without literals, comments and quoted identifiers: only its keywords count."""
    return _QUOTED.sub('"x"', _LITERAL.sub("''", _COMMENT.sub(" ", sql)))


def refusal(sql: str, *, in_block: bool) -> Refusal | None:
    """Redshift's error for a statement it never runs, or None. `in_block`: the session is
    inside a transaction block (the driver's default, autocommit off)."""
    text = code(sql)
    for pattern, near in _SYNTAX:
        if pattern.search(text):
            return Refusal("42601", f'syntax error at or near "{near}"')
    for pattern, message in _UNSUPPORTED:
        if pattern.search(text):
            return Refusal("0A000", message)
    advisory = _ADVISORY.search(text)
    if advisory:
        return Refusal("42883", f"function {advisory[1].lower()}(bigint) does not exist")
    if _LEADER_ONLY.search(text) and isolation.tables(sql, set())[0]:
        return Refusal("0A000", _LEADER_ONLY_MESSAGE)
    altered = alter_column_type(sql)
    if altered is not None:
        _, _, new_type = altered
        if re.search(r"\bUSING\b", code(new_type), re.I):
            return Refusal("0A000", "ALTER TABLE ALTER COLUMN does not support USING expression")
        if not _VARCHAR.match(new_type.strip()):
            return Refusal("0A000", f"ALTER COLUMN TYPE to {new_type.strip()} is not supported")
        if in_block:
            return Refusal(
                "25001", "ALTER TABLE ALTER COLUMN cannot run inside a transaction block"
            )
    return None


def alter_column_type(sql: str) -> tuple[str, str, str] | None:
    """(table key, column, new type) of an `ALTER TABLE ... ALTER COLUMN ... TYPE`."""
    match = _ALTER_TYPE.match(sql)
    if match is None:
        return None
    table = isolation.table_key(match["table"], set()) or match["table"]
    return table, isolation.unquote(match["column"]), match["type"]


_ALTER_ENCODE = re.compile(
    rf"^\s*ALTER\s+TABLE\s+(?P<table>{_QUALIFIED})\s+ALTER\s+(?:COLUMN\s+)?(?P<column>{_NAME})"
    r"\s+ENCODE\s+(?P<encoding>\w+)",
    re.I,
)
_CREATE = re.compile(
    rf"^\s*CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(?P<table>{_QUALIFIED})\s*\((?P<body>.*)\)",
    re.I | re.DOTALL,
)
_COLUMN_ENCODE = re.compile(rf"^\s*(?P<column>{_NAME})\s.*?\bENCODE\s+(?P<encoding>\w+)", re.I)


def encodings_set(sql: str) -> dict[tuple[str, str], str]:
    """{(table key, column): encoding} that a CREATE TABLE's or an ALTER COLUMN's ENCODE
    clauses set (what ENCODE AUTO chooses, tests set on the emulator: `encodings`)."""
    altered = _ALTER_ENCODE.match(sql)
    if altered is not None:
        table = isolation.table_key(altered["table"], set()) or altered["table"]
        return {(table, isolation.unquote(altered["column"])): altered["encoding"].lower()}
    created = _CREATE.match(sql)
    if created is None or not re.search(r"\bENCODE\b", code(sql), re.I):
        return {}
    table = isolation.table_key(created["table"], set()) or created["table"]
    found = {}
    for item in split_items(created["body"]):
        column = _COLUMN_ENCODE.match(item)
        if column is not None:
            found[(table, isolation.unquote(column["column"]))] = column["encoding"].lower()
    return found


def widening_refusal(table: str, column: str, encoding: str) -> Refusal:
    """ALTER COLUMN ... TYPE of a column encoded BYTEDICT, RUNLENGTH, TEXT255 or TEXT32K.
    The wording is the emulator's (AWS documents the rule, not the message)."""
    return Refusal(
        "0A000",
        f'ALTER COLUMN TYPE is not supported for column "{column}" of table "{table}" '
        f"with {encoding.upper()} encoding",
    )


def parameter_columns(sql: str) -> tuple[str, dict[int, str]] | None:
    """(table, {parameter number: column}) of an INSERT whose VALUES or SELECT items are
    bound parameters (`$n`, or `CAST($n AS ...)`), by position."""
    match = _INSERT.match(sql)
    if match is None:
        return None
    columns = [isolation.unquote(c) for c in split_items(match["columns"])]
    items = split_items(match["values"] if match["values"] is not None else match["select"])
    found = {}
    for column, item in zip(columns, items, strict=False):
        parameter = _PARAMETER.match(item)
        if parameter:
            found[int(parameter[1])] = column
    return match["table"], found


def split_items(text: str) -> list[str]:
    """Comma-separated items at the top level (not inside parentheses or quotes)."""
    items, depth, start, quote = [], 0, 0, ""
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    items.append(text[start:].strip())
    return [item for item in items if item]


def bind_parameters(body: bytes) -> tuple[bytes, list[str | None]]:
    """(statement name, parameters as text; None for NULL or a binary one) of a Bind."""
    portal_end = body.index(b"\0")
    name_end = body.index(b"\0", portal_end + 1)
    statement, offset = body[portal_end + 1 : name_end], name_end + 1
    (formats,) = struct.unpack("!h", body[offset : offset + 2])
    codes = struct.unpack(f"!{formats}h", body[offset + 2 : offset + 2 + 2 * formats])
    offset += 2 + 2 * formats
    (count,) = struct.unpack("!h", body[offset : offset + 2])
    offset += 2
    values: list[str | None] = []
    for i in range(count):
        (size,) = struct.unpack("!i", body[offset : offset + 4])
        offset += 4
        code_ = codes[i] if len(codes) > 1 else (codes[0] if codes else 0)
        if size < 0 or code_ != 0:
            values.append(None)
        else:
            values.append(body[offset : offset + size].decode("utf-8", "replace"))
        offset += max(size, 0)
    return statement, values


def too_long(width: int) -> Refusal:
    return Refusal("22001", f"value too long for type character varying({width})")


def connection_limit(limit: int) -> Refusal:
    return Refusal("53300", f'connection limit "{limit}" exceeded for non-bootstrap users')
