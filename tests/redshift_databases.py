"""Several databases behind one Redshift emulator (tests/redshift_emulator.py), as one
cluster or workgroup holds a database per tenant.

The client's startup `database` is forwarded, so a session reaches the upstream PostgreSQL
database of that name. Here: such databases are made ready (created empty, with the system
views the emulator shows), and each keeps its own serializability bookkeeping. Tables are
compared by name, and on Redshift `curated.fleet_trips` of one database is not that of
another: transactions in two databases never form a 1023 cycle (their locks, taken
upstream, are PostgreSQL's per-database locks already).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from tests import pgtools
from tests.redshift_catalog import create_system_views
from tests.redshift_grants import create_loader
from tests.redshift_isolation import Isolation

if TYPE_CHECKING:
    from tests.redshift_emulator import RedshiftEmulator

# Used from the emulator's event loop only, so no lock.
_OTHER_DATABASES: WeakKeyDictionary[RedshiftEmulator, dict[str, Isolation]] = WeakKeyDictionary()


def startup_database(startup: bytes) -> str:
    """The `database` of a StartupMessage (length, protocol, then name/value C strings);
    the user's name when it names none, as PostgreSQL defaults it."""
    fields = startup[8:].split(b"\0")
    pairs = dict(zip(fields[0::2], fields[1::2], strict=False))
    return (pairs.get(b"database") or pairs.get(b"user") or b"").decode()


def isolation_of(emulator: RedshiftEmulator, database: str) -> Isolation:
    """The bookkeeping of `database`'s transactions: `emulator.isolation` for the database
    it fronts, one of their own for any other."""
    if not database or database == emulator.database:
        return emulator.isolation
    return _OTHER_DATABASES.setdefault(emulator, {}).setdefault(database, Isolation())


@contextlib.contextmanager
def tenant_databases(
    emulator: RedshiftEmulator, admin_url: str, tenants: Iterable[str]
) -> Iterator[dict[str, str]]:
    """tenant -> a fresh database of its own behind `emulator`, dropped afterwards."""
    names = {tenant: pgtools.unique_name(f"rs_{tenant}") for tenant in tenants}
    try:
        for name in names.values():
            url = pgtools.create_database(admin_url, name)
            create_system_views(url, serverless=emulator.serverless)
            create_loader(url)  # the suite's least-privilege user, granted here too
        yield names
    finally:
        for name in names.values():
            pgtools.drop_database(admin_url, name)
