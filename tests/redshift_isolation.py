"""Redshift's serializable isolation, as the emulator (tests/redshift_emulator.py) applies it
to every transaction it relays: which tables a statement reads and writes, and when a
statement breaks serializability (error 1023).

What it follows (AWS, Amazon Redshift Database Developer Guide):
- "Serializable isolation" (c_serial_isolation): a transaction's snapshot is taken at its
  first SELECT, DML or DDL statement; two transactions are concurrent when the second
  starts before the first commits; concurrent transactions must produce the result of some
  serial order, and the statement that makes that impossible is aborted with 1023.
- "Troubleshooting serializable isolation errors": the two-session example (each session
  reads the table the other writes) fails on its last statement.
- "Managing concurrent write operations" / `LOCK`: writes take table-level write locks held
  to COMMIT; readers are not blocked (the emulator takes those locks upstream).

The rule, at table granularity: transaction A must precede B when A read a table B wrote
and B's write is invisible to A (B had not committed when A took its snapshot). A write
also reads its table (a write cannot be ordered before a committed write it did not see). A
statement that closes a cycle of such orders fails. Snapshots are PostgreSQL's own
(`pg_current_snapshot()` upstream at the first statement), so visibility is exact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

NAME = r'(?:"(?:[^"]|"")+"|[A-Za-z_][\w$]*)'
QUALIFIED = rf"{NAME}(?:\s*\.\s*{NAME})?"
_WRITE = re.compile(
    rf"^\s*(?:INSERT\s+INTO|DELETE\s+FROM|UPDATE|COPY)\s+(?P<name>{QUALIFIED})",
    re.IGNORECASE,
)
_READS = re.compile(
    rf"\b(?:FROM|JOIN|USING)\s+(?P<names>{QUALIFIED}(?:\s*,\s*{QUALIFIED})*)(?![\w$\"]|\s*[.(])",
    re.IGNORECASE,
)
_LOCK = re.compile(
    rf"^\s*LOCK\s+(?:TABLE\s+)?(?P<names>{QUALIFIED}(?:\s*,\s*{QUALIFIED})*)",
    re.IGNORECASE,
)
_TEMP_CREATE = re.compile(
    rf"^\s*CREATE\s+(?:LOCAL\s+)?TEMP(?:ORARY)?\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(?P<name>{NAME})",
    re.IGNORECASE,
)
_KINDS = {
    "begin": re.compile(r"^\s*(BEGIN|START\s+TRANSACTION)\b", re.IGNORECASE),
    "commit": re.compile(r"^\s*(COMMIT|END)\b\s*;?\s*$", re.IGNORECASE),
    "rollback": re.compile(r"^\s*(ROLLBACK|ABORT)\b", re.IGNORECASE),
    "truncate": re.compile(r"^\s*TRUNCATE\b", re.IGNORECASE),
    "lock": _LOCK,
    # Statements that take no snapshot (session settings, cursors, prepared statements).
    "session": re.compile(r"^\s*(SET|SHOW|RESET|DISCARD|DEALLOCATE|CLOSE)\b", re.IGNORECASE),
}
_SYSTEM_SCHEMAS = frozenset({"pg_catalog", "information_schema"})
_SYSTEM_PREFIXES = ("pg_", "stv_", "stl_", "svv_", "svl_", "sys_")


def kind(sql: str) -> str:
    """begin, commit, rollback, truncate, lock, session, or statement."""
    for name, pattern in _KINDS.items():
        if pattern.match(sql):
            return name
    return "statement"


def unquote(part: str) -> str:
    part = part.strip()
    return part[1:-1].replace('""', '"') if part.startswith('"') else part.lower()


def _split_names(names: str) -> list[str]:
    return re.findall(QUALIFIED, names)


def table_key(name: str, temp: set[str]) -> str | None:
    """`schema.table` of a user table, or None for a session temp table or a system one."""
    parts = [unquote(p) for p in re.findall(NAME, name)]
    schema, table = parts if len(parts) == 2 else (None, parts[0])
    if schema is None:
        if table in temp or table.startswith(_SYSTEM_PREFIXES):
            return None
        schema = "public"
    if schema in _SYSTEM_SCHEMAS or schema.startswith("pg_temp"):
        return None
    return f"{schema}.{table}"


def temp_table_created(sql: str) -> str | None:
    match = _TEMP_CREATE.match(sql)
    return unquote(match["name"]) if match else None


def locked_tables(sql: str, temp: set[str]) -> list[str]:
    match = _LOCK.match(sql)
    names = _split_names(match["names"]) if match else []
    return [key for key in (table_key(n, temp) for n in names) if key]


def tables(sql: str, temp: set[str]) -> tuple[set[str], set[str]]:
    """(tables read, tables written) by a statement; session temp tables are left out."""
    writes: set[str] = set()
    match = _WRITE.match(sql)
    if match:
        key = table_key(match["name"], temp)
        if key:
            writes.add(key)
    reads = {
        key
        for found in _READS.finditer(sql)
        for key in (table_key(n, temp) for n in _split_names(found["names"]))
        if key
    }
    return reads | writes, writes


@dataclass(frozen=True)
class Snapshot:
    """A PostgreSQL snapshot (`xmin:xmax:xip,...`): which transactions it sees."""

    xmin: int
    xmax: int
    running: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> Snapshot:
        xmin, xmax, running = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in running.split(",") if x))

    def sees(self, xid: int) -> bool:
        return xid < self.xmin or (xid < self.xmax and xid not in self.running)


@dataclass(eq=False)
class Transaction:
    snapshot: Snapshot | None = None
    xid: int | None = None
    reads: set[str] = field(default_factory=set)
    writes: set[str] = field(default_factory=set)
    committed: bool = False
    before: set[Transaction] = field(default_factory=set)
    """Transactions this one must precede in any serial order."""

    def sees(self, other: Transaction) -> bool:
        """Whether `other`'s writes are in this transaction's snapshot."""
        assert self.snapshot is not None
        return other.xid is not None and self.snapshot.sees(other.xid)


class Violation(Exception):
    """A statement that cannot be serialised (Redshift's 1023)."""

    def __init__(self, table: str, other: Transaction) -> None:
        super().__init__(table)
        self.table = table
        self.other = other


class Isolation:
    """Every transaction that may still take part in a cycle: the running ones and the
    committed ones some running snapshot does not see."""

    def __init__(self) -> None:
        self.transactions: list[Transaction] = []

    def begin(self) -> Transaction:
        tx = Transaction()
        self.transactions.append(tx)
        return tx

    def access(self, tx: Transaction, reads: set[str], writes: set[str]) -> None:
        """Record a statement's reads and writes; raises Violation (and forgets `tx`) if
        they close a cycle. `tx` must hold its snapshot, and the write locks of `writes`."""
        added: list[tuple[Transaction, Transaction, str]] = []
        for other in self.transactions:
            if other is tx:
                continue
            for table in reads & other.writes:
                if not tx.sees(other):
                    added.append((tx, other, table))
            for table in writes & other.reads:
                added.append((other, tx, table))  # a running write is invisible to all
        for first, then, _ in added:
            first.before.add(then)
        tx.reads |= reads
        tx.writes |= writes
        for first, then, table in added:
            if self._reaches(then, first):
                self.end(tx, committed=False)
                raise Violation(table, then if first is tx else first)

    def _reaches(self, start: Transaction, goal: Transaction) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            if node is goal:
                return True
            if node not in seen:
                seen.add(node)
                todo.extend(node.before)
        return False

    def end(self, tx: Transaction, *, committed: bool) -> None:
        """A transaction committed or rolled back; forget what can no longer matter."""
        tx.committed = committed
        if tx in self.transactions and (not committed or not tx.writes):
            self._forget(tx)
        running = [t for t in self.transactions if not t.committed and t.snapshot is not None]
        for old in [t for t in self.transactions if t.committed]:
            needed = any(old in t.before for t in self.transactions)
            if not needed and all(r.sees(old) for r in running):
                self._forget(old)

    def _forget(self, tx: Transaction) -> None:
        self.transactions.remove(tx)
        for other in self.transactions:
            other.before.discard(tx)
