"""Settings checked before Prefect, S3 or a database is touched: every problem at once, one
line each, naming the variable and what it should hold. Values are never echoed (a URL may
carry a password); the variable's name says which one to look at."""

from __future__ import annotations

import enum
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from pydantic import ValidationError

from fleet_import.config import Settings
from fleet_import.errors import ConfigurationError, FleetImportError

_POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2")
_HTTP_SCHEMES = ("http", "https")
_ENV_PREFIX = "FLEET_"


class Uses(enum.Enum):
    """What a command touches, and so which settings it needs."""

    DATABASE = "database"
    WAREHOUSE = "warehouse"
    STAGING = "staging"
    S3 = "s3"
    CONTRACTS = "contracts"
    PREFECT = "prefect"
    DASK = "dask"
    FRESHNESS = "freshness"


OPERATIONAL = frozenset({Uses.DATABASE})
"""`db upgrade`, `batches`: the operational database only."""
IMPORTS = frozenset(Uses) - {Uses.FRESHNESS}
"""`run`, `resume` and the import flows: everything but the freshness SLOs."""
FRESHNESS = frozenset({Uses.DATABASE, Uses.S3, Uses.FRESHNESS})
"""`freshness`, the `check-freshness` flow: the store, S3 and the SLO files."""
RELAY = frozenset({Uses.PREFECT})
"""`relay`: the Prefect API it emits to (its queue URL is an option, checked by the CLI)."""


@dataclass(frozen=True)
class SettingProblem:
    variable: str
    expected: str

    def __str__(self) -> str:
        return f"{self.variable}: {self.expected}"


class SettingsInvalid(ConfigurationError):
    """The settings are incomplete or wrong; nothing was started."""

    def __init__(self, problems: Collection[SettingProblem]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


def check_settings(
    uses: Collection[Uses] = IMPORTS,
    settings: Settings | None = None,
    env: Mapping[str, str] | None = None,
    **overrides: object,
) -> Settings:
    """The settings, or SettingsInvalid naming every problem. `settings` given (a flow's,
    with block overrides) is checked as it is; else they are read from the environment,
    with `overrides` (a command's options) over it."""
    env = os.environ if env is None else env
    problems: list[SettingProblem] = []
    if settings is None:
        settings, problems = read_settings()
    if overrides:
        settings = settings.model_copy(update=overrides)
    problems += settings_problems(settings, uses, env)
    if problems:
        raise SettingsInvalid(problems)
    return settings


def read_settings() -> tuple[Settings, list[SettingProblem]]:
    """Settings from the environment; a value pydantic refuses is a problem, and its field
    falls back to the default so that the other fields are still checked."""
    try:
        return Settings(), []
    except ValidationError as exc:
        problems, broken = [], set()
        for error in exc.errors(include_input=False, include_url=False):
            field = str(error["loc"][0]) if error["loc"] else "?"
            broken.add(field)
            problems.append(SettingProblem(_variable(field), _pydantic_expected(error)))
        defaults = {
            name: info.get_default(call_default_factory=True)
            for name, info in Settings.model_fields.items()
            if name in broken
        }
        return Settings(**defaults), problems


def _variable(field: str) -> str:
    return f"{_ENV_PREFIX}{field.upper()}"


def _pydantic_expected(error: Mapping[str, object]) -> str:
    message = str(error.get("msg", "invalid"))
    return message[:1].lower() + message[1:]


def settings_problems(
    settings: Settings, uses: Collection[Uses], env: Mapping[str, str] | None = None
) -> list[SettingProblem]:
    """Every problem of `settings` for a command that touches `uses`, in a stable order."""
    env = os.environ if env is None else env
    problems: list[SettingProblem] = []
    if Uses.DATABASE in uses:
        problems += _postgres_url("FLEET_DATABASE_URL", settings.database_url)
    if Uses.WAREHOUSE in uses:
        problems += _warehouse(settings)
    if Uses.STAGING in uses:
        problems += _staging(settings.staging_uri)
    if Uses.S3 in uses and settings.s3_endpoint_url:
        problems += _http_url("FLEET_S3_ENDPOINT_URL", settings.s3_endpoint_url)
    if Uses.CONTRACTS in uses and settings.contracts:
        problems += _contracts(settings.contracts)
    if Uses.DASK in uses and settings.dask_address:
        problems += _dask(settings.dask_address)
    if Uses.FRESHNESS in uses and (settings.freshness or settings.tenants):
        problems += _freshness(settings)
    if Uses.WAREHOUSE in uses and settings.openlineage:
        problems += _openlineage(settings.openlineage)
    if Uses.PREFECT in uses and env.get("PREFECT_API_URL"):
        problems += _http_url("PREFECT_API_URL", env["PREFECT_API_URL"], "http://host:4200/api")
    return problems


def _host_port_problem(variable: str, url: str, example: str) -> list[SettingProblem]:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return [SettingProblem(variable, f"the port is not a number 0-65535 (like {example})")]
    return []


def _postgres_url(variable: str, url: str | None) -> list[SettingProblem]:
    example = "postgresql://user@host:5432/dbname"
    if not url:
        return [SettingProblem(variable, f"not set: a PostgreSQL URL like {example}")]
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in _POSTGRES_SCHEMES:
        got = f"a {scheme}:// URL" if scheme else "no scheme"
        return [SettingProblem(variable, f"expected a PostgreSQL URL like {example}, got {got}")]
    return _host_port_problem(variable, url, example)


def _http_url(variable: str, url: str, example: str = "http://host:9000") -> list[SettingProblem]:
    parts = urlsplit(url)
    if parts.scheme not in _HTTP_SCHEMES or not parts.netloc:
        return [SettingProblem(variable, f"expected an http(s) URL like {example}")]
    return _host_port_problem(variable, url, example)


def _warehouse(settings: Settings) -> list[SettingProblem]:
    url = settings.warehouse_url
    scheme = url.split("://", 1)[0] if url and "://" in url else ""
    if settings.warehouse == "postgres":
        if url and scheme == "redshift":
            return [
                SettingProblem(
                    "FLEET_WAREHOUSE",
                    "is postgres but FLEET_WAREHOUSE_URL is a redshift:// URL: "
                    "set FLEET_WAREHOUSE=redshift",
                )
            ]
        return _postgres_url("FLEET_WAREHOUSE_URL", url) if url else []
    problems = []
    if url and scheme != "redshift":
        problems.append(
            SettingProblem(
                "FLEET_WAREHOUSE_URL",
                "expected redshift://user:password@host:5439/db with FLEET_WAREHOUSE=redshift",
            )
        )
    if not settings.redshift_connect_kwargs().get("host"):
        problems.append(
            SettingProblem(
                "FLEET_REDSHIFT_HOST", "not set (nor a redshift:// FLEET_WAREHOUSE_URL host)"
            )
        )
    if not settings.redshift_iam_role:
        problems.append(
            SettingProblem("FLEET_REDSHIFT_IAM_ROLE", "not set: the role ARN COPY assumes")
        )
    staging = settings.redshift_staging_uri or settings.staging_uri or ""
    if not staging.startswith("s3://"):
        problems.append(
            SettingProblem(
                "FLEET_REDSHIFT_STAGING_URI",
                "expected an s3://bucket/prefix/ that COPY reads (or an s3:// FLEET_STAGING_URI)",
            )
        )
    return problems


def _staging(uri: str | None) -> list[SettingProblem]:
    variable = "FLEET_STAGING_URI"
    if not uri:
        return [
            SettingProblem(
                variable,
                "not set: an s3://bucket/prefix/ (or a local directory) for normalized files "
                "and rejects",
            )
        ]
    if uri[:5].lower() == "s3://":
        from fleet_import.scope import split_folder

        try:
            split_folder(uri)
        except FleetImportError as exc:
            return [SettingProblem(variable, f"expected s3://bucket/prefix/: {_reason(exc)}")]
        return []
    if "://" in uri and not uri.startswith("file://"):
        return [SettingProblem(variable, "expected s3://bucket/prefix/ or a local directory")]
    return []


def _reason(exc: BaseException) -> str:
    """The part of an error after the value it quotes (which may be long or secret)."""
    text = " ".join(str(exc).split())
    return text.rsplit(": ", 1)[-1]


def _contracts(specs: str) -> list[SettingProblem]:
    from fleet_import.contracts.files import read_contract_file

    problems = []
    for spec in filter(None, (s.strip() for s in specs.split(","))):
        try:
            read_contract_file(spec)
        except FleetImportError as exc:
            problems.append(SettingProblem("FLEET_CONTRACTS", " ".join(str(exc).split())))
        except OSError as exc:
            problems.append(
                SettingProblem("FLEET_CONTRACTS", f"cannot read {spec}: {exc.strerror}")
            )
    if problems:
        return problems
    from fleet_import.contracts.files import contracts_in_force

    try:
        contracts_in_force(specs)  # each file alone was fine: do they clash with each other?
    except FleetImportError as exc:
        return [SettingProblem("FLEET_CONTRACTS", " ".join(str(exc).split()))]
    return []


def _dask(address: str) -> list[SettingProblem]:
    parts = urlsplit(address)
    if parts.scheme not in ("tcp", "tls") or not parts.hostname:
        return [SettingProblem("FLEET_DASK_ADDRESS", "expected tcp://host:8786")]
    return _host_port_problem("FLEET_DASK_ADDRESS", address, "tcp://host:8786")


def _freshness(settings: Settings) -> list[SettingProblem]:
    """The freshness file and the registry's `overrides.freshness`, each problem named by
    its field (the registry's own mistakes are FLEET_TENANTS's)."""
    from fleet_import.freshness.policies import load_policy
    from fleet_import.tenants.registry import registry_in_force

    try:
        registry = registry_in_force(settings.tenants)
    except FleetImportError as exc:
        return [SettingProblem("FLEET_TENANTS", " ".join(str(exc).split()))]
    try:
        load_policy(settings.freshness, registry)
    except FleetImportError as exc:
        variable = "FLEET_FRESHNESS" if settings.freshness else "FLEET_TENANTS"
        return [SettingProblem(variable, " ".join(str(exc).split()))]
    return []


def _openlineage(target: str) -> list[SettingProblem]:
    from fleet_import.publication.lineage_delivery import transport_problem

    problem = transport_problem(target)
    return [SettingProblem("FLEET_OPENLINEAGE", problem)] if problem else []
