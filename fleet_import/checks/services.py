"""The connections an import needs, each tested the way the import will use it: what
`fleet-import doctor` runs before the first job (the checks that need no Prefect)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from fleet_import.bounded_connection import connect_bounded, server_address
from fleet_import.config import Settings, libpq_url, masked_url
from fleet_import.errors import FleetImportError
from fleet_import.explain import DB_UPGRADE_HINT, advise, advise_s3

_CONNECT_TIMEOUT_SECONDS = 5
_PROBE_REPLY_TIMEOUT_SECONDS = 15.0  # a probe's catalog reads answer in milliseconds
_PROBE_NAME = "_fleet-import-doctor-probe"
# What a load does to a curated table and the registry: delete the old slice, insert the new.
_TABLE_PRIVILEGES = "SELECT, INSERT, DELETE"
_DATABASE_URL = "FLEET_DATABASE_URL"


@dataclass(frozen=True)
class Check:
    """One line of the doctor's table. `ok` None: not applicable here (skipped). `error`:
    what a failed check caught, our own error (its message is the reason), for --debug."""

    name: str
    ok: bool | None
    reason: str
    fix: str = ""
    error: BaseException | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, object]:
        status = "skipped" if self.ok is None else ("ok" if self.ok else "failed")
        return {"check": self.name, "status": status, "reason": self.reason, "fix": self.fix}


def passed(name: str, reason: str) -> Check:
    return Check(name, True, reason)


def failed(name: str, reason: str, fix: str) -> Check:
    return Check(name, False, reason, fix)


def _version(conn: psycopg.Connection[Any]) -> str:
    version = conn.info.parameter_status("server_version") or "?"
    return f"PostgreSQL {version.split(' ', 1)[0]}"


def _connect(url: str) -> psycopg.Connection[Any]:
    """Bounded like the import's connections: a black-holed server fails its check."""
    return connect_bounded(
        libpq_url(url), _PROBE_REPLY_TIMEOUT_SECONDS, connect_timeout=_CONNECT_TIMEOUT_SECONDS
    )


def _connection_failure(
    name: str, error: FleetImportError, exc: psycopg.Error, variable: str
) -> Check:
    """`error`: `exc` translated at its store's or warehouse's boundary, which never keeps
    the driver's own text for a failed connection (libpq may quote the URL), and names
    `variable`, where that URL is set. It keeps `exc`'s traceback."""
    advice = advise(error)
    reason = advice.problem if advice else type(exc).__name__
    fix = advice.next_step if advice else ""
    return Check(
        name, False, reason, fix or f"check {variable}", error.with_traceback(exc.__traceback__)
    )


def check_operational_database(url: str) -> Iterator[Check]:
    """Reachable, then migrated to the head revision of migrations/."""
    from fleet_import.store.migrate import head_revision

    head = head_revision()
    try:
        with _connect(url) as conn:
            yield passed("operational database reachable", f"{_version(conn)} at {masked_url(url)}")
            try:
                row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
            except psycopg.errors.UndefinedTable:
                row = None
    except psycopg.Error as exc:
        from fleet_import.store.connection import translate_driver_error

        error = translate_driver_error(exc, address=server_address(libpq_url(url)))
        yield _connection_failure("operational database reachable", error, exc, _DATABASE_URL)
        return
    current = row[0] if row else None
    if current == head:
        yield passed("operational database migrated", f"at head ({head})")
    else:
        at = f"at {current}" if current else "never migrated"
        yield failed("operational database migrated", f"{at}, head is {head}", DB_UPGRADE_HINT)


def warehouse_databases(settings: Settings) -> list[str | None]:
    """The warehouse databases loads write (None: the shared one): the shared database unless
    the warehouse is a `{database}` template, and each registered tenant's own. With a
    template and no registry, no tenant is known yet: none."""
    from fleet_import.tenants.databases import own_database, templated
    from fleet_import.tenants.registry import registry_in_force

    databases: list[str | None] = [] if templated(settings) else [None]
    registry = registry_in_force(settings.tenants)
    for tenant_id in sorted(registry.tenants) if registry is not None else ():
        database = own_database(settings, tenant_id, registry)
        if database is not None and database not in databases:
            databases.append(database)
    return databases


def check_warehouse(settings: Settings, *, reachable_only: bool = False) -> Iterator[Check]:
    """For each warehouse database loads write (`warehouse_databases`): reachable; each
    curated table present and shaped as its contract says, or creatable; the privileges a
    load uses (delete the old slice, insert the new, read the stamp). `reachable_only`: the
    first check of each only."""
    databases = warehouse_databases(settings)
    if not databases:
        yield Check(
            "warehouse reachable",
            None,
            "one database per tenant ({database}) and no tenant registry: each tenant's "
            "database is reached when the tenant first loads",
        )
    for database in databases:
        if settings.warehouse == "redshift":
            yield from _check_redshift(settings, database)
        else:
            yield from _check_postgres(settings, database, reachable_only=reachable_only)


def _check_postgres(
    settings: Settings, database: str | None, *, reachable_only: bool
) -> Iterator[Check]:
    from fleet_import.contracts.files import contracts_in_force
    from fleet_import.tenants.databases import postgres_url_for

    url = postgres_url_for(settings, database)
    variable = settings.warehouse_url_setting
    suffix = f" ({database})" if database else ""
    try:
        contracts = list(contracts_in_force(settings.contracts).values())
    except FleetImportError as exc:
        yield failed("curated tables", str(exc), "fix FLEET_CONTRACTS")
        return
    try:
        with _connect(url) as conn:
            yield passed("warehouse reachable" + suffix, f"{_version(conn)} at {masked_url(url)}")
            if not reachable_only:
                yield from _curated_tables(conn, contracts)
    except psycopg.Error as exc:
        from fleet_import.warehouse.postgres.driver import translate

        error = translate(exc, address=server_address(libpq_url(url)), setting=variable)
        yield _connection_failure("warehouse reachable" + suffix, error, exc, variable)


def _curated_tables(conn: psycopg.Connection[Any], contracts: Iterable[Any]) -> Iterator[Check]:
    from fleet_import.warehouse.postgres import ddl
    from fleet_import.warehouse.postgres.slice_sql import QUERIES
    from fleet_import.warehouse.sql import REGISTRY_TABLE, split_table

    mismatched, missing, present = [], [], []
    for contract in contracts:
        schema, relation = split_table(contract.target_table)
        found = conn.execute(
            QUERIES["table_columns"], {"schema": schema, "relation": relation}
        ).fetchall()
        if not found:
            missing.append(contract.target_table)
        elif not ddl.table_matches(contract, [tuple(row) for row in found]):
            mismatched.append(contract.target_table)
        else:
            present.append(contract.target_table)
    if mismatched:
        yield failed(
            "curated tables match the contracts",
            f"{', '.join(mismatched)} differ from their contracts",
            "see the plan with `fleet-import tables migrate`, then run it with --apply "
            "(or fix FLEET_CONTRACTS)",
        )
    else:
        shown = f"{len(present)} present" + (f", {len(missing)} to create" if missing else "")
        yield passed("curated tables match the contracts", shown)
    yield _privileges(conn, [*present, *mismatched, REGISTRY_TABLE], missing)


def _privileges(conn: psycopg.Connection[Any], tables: list[str], to_create: list[str]) -> Check:
    from fleet_import.warehouse.sql import split_table

    lacking = []
    for table in tables:
        schema, relation = split_table(table)
        exists = conn.execute(
            "SELECT to_regclass(format('%%I.%%I', %s::text, %s::text)) IS NOT NULL",
            (schema, relation),
        ).fetchone()
        if exists and exists[0]:
            allowed = conn.execute(
                "SELECT has_table_privilege(format('%%I.%%I', %s::text, %s::text), %s)",
                (schema, relation, _TABLE_PRIVILEGES),
            ).fetchone()
            if not (allowed and allowed[0]):
                lacking.append(f"{_TABLE_PRIVILEGES} on {table}")
        else:
            to_create.append(table)
    for schema in sorted({split_table(t)[0] for t in to_create}):
        row = conn.execute(
            "SELECT CASE WHEN to_regnamespace(%s) IS NULL"
            " THEN has_database_privilege(current_database(), 'CREATE')"
            " ELSE has_schema_privilege(%s, 'CREATE') END",
            (schema, schema),
        ).fetchone()
        if not (row and row[0]):
            lacking.append(f"CREATE in schema {schema}")
    if lacking:
        return failed(
            "warehouse privileges", "missing " + "; ".join(lacking), "GRANT them to the loader"
        )
    return passed("warehouse privileges", "delete, insert, select and create as loads need")


def _check_redshift(settings: Settings, database: str | None) -> Iterator[Check]:
    from fleet_import.tenants.databases import redshift_kwargs_for

    name = "warehouse reachable" + (f" ({database})" if database else "")
    try:
        import redshift_connector
    except ImportError:
        yield failed(
            name,
            "redshift_connector is not installed",
            "pip install '.[redshift]'",
        )
        return
    try:
        with redshift_connector.connect(**redshift_kwargs_for(settings, database)) as conn:
            conn.cursor().execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any failure is the answer; never its text
        yield failed(
            name,
            f"Redshift did not answer ({type(exc).__name__})",
            "check FLEET_WAREHOUSE_URL (host:port) or FLEET_REDSHIFT_*",
        )
        return
    yield passed(name, "Redshift answered")


def _s3_failure(name: str, exc: Exception, bucket_variable: str) -> Check:
    advice = advise_s3(exc, bucket_variable)
    if advice is None:
        return failed(name, f"S3 failed ({type(exc).__name__})", "check the S3 settings")
    return failed(name, advice.problem, advice.next_step)


def check_landing_bucket(s3: Any, bucket: str) -> Check:
    name = f"landing bucket {bucket} listable"
    try:
        s3.list_objects_v2(Bucket=bucket, MaxKeys=1)
    except Exception as exc:  # noqa: BLE001 - botocore's errors, explained
        return _s3_failure(name, exc, "the landing bucket (--landing-bucket)")
    return passed(name, "listed")


def check_staging(staging_uri: str | None, s3_factory: Callable[[], Any]) -> Check:
    """A small object written and deleted where normalized files will go."""
    name = "staging writable"
    if not staging_uri:
        return failed(name, "FLEET_STAGING_URI is not set", "set FLEET_STAGING_URI")
    probe = f"{_PROBE_NAME}-{uuid.uuid4().hex}"
    if not staging_uri.startswith("s3://"):
        directory = Path(staging_uri.removeprefix("file://"))
        try:
            directory.mkdir(parents=True, exist_ok=True)
            (directory / probe).write_bytes(b"probe")
            (directory / probe).unlink()
        except OSError as exc:
            return failed(name, f"{directory}: {exc.strerror}", "make it writable")
        return passed(name, f"wrote and deleted a file in {directory}")
    from fleet_import.scope import split_folder

    bucket, prefix = split_folder(staging_uri)
    s3 = s3_factory()
    try:
        s3.put_object(Bucket=bucket, Key=prefix + probe, Body=b"probe")
        s3.delete_object(Bucket=bucket, Key=prefix + probe)
    except Exception as exc:  # noqa: BLE001 - botocore's errors, explained
        return _s3_failure(name, exc, "FLEET_STAGING_URI")
    return passed(name, f"wrote and deleted an object in s3://{bucket}/{prefix}")


def check_queue(sqs: Any, queue_url: str) -> Check:
    name = "relay queue readable"
    try:
        sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])
    except Exception as exc:  # noqa: BLE001 - botocore's errors, explained
        advice = advise_s3(exc, "FLEET_RELAY_QUEUE_URL")
        reason = advice.problem if advice else f"SQS failed ({type(exc).__name__})"
        return failed(name, reason, "check FLEET_RELAY_QUEUE_URL and the AWS credentials")
    return passed(name, "attributes read")
