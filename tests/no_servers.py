"""The `fast` selection: tests that need no server at all (no PostgreSQL, no moto server, no
Prefect harness), which `make test-fast` runs in seconds.

tests/conftest.py marks a test `fast` when none of SERVER_FIXTURES is among the fixtures it
uses and it carries none of SERVER_MARKERS. `make test-fast` sets FLEET_TEST_NO_SERVERS: then
every way the suite starts or reaches a server (the PostgreSQL look-up with its embedded
fallback, moto's server, Prefect's harness) raises instead, so a test that reaches one
without saying so fails loudly rather than quietly starting pgserver.
"""

from __future__ import annotations

import os

NO_SERVERS_ENV = "FLEET_TEST_NO_SERVERS"
SERVER_FIXTURES = frozenset({"pg_server_url", "moto_endpoint", "prefect_api", "prefect_server"})
"""The roots every server-backed fixture depends on (database_url, s3, flow_env...), and
test_deployments' own `prefect server start`."""
SERVER_MARKERS = ("server", "workers", "browser")


class ServerRefused(RuntimeError):
    """A test of the fast selection reached for a server."""


def refuse_servers(what: str) -> None:
    """Raise if this run promised to use no server (FLEET_TEST_NO_SERVERS is set)."""
    if os.environ.get(NO_SERVERS_ENV):
        raise ServerRefused(
            f"{what} in a run without servers ({NO_SERVERS_ENV} is set): this test needs a "
            "server; it belongs outside the fast selection (use a server fixture, or mark it "
            "`server`)"
        )
