"""Hostile input: tenant ids, folders, dataset and column names crafted for SQL injection or
path traversal are refused before anything reaches SQL or S3, identifiers that are merely
unusual (SQL reserved words) are quoted by the driver and load fine, and text that looks like
terminal markup is printed by the CLI as it is."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from fleet_import.contracts.files import contract_from_dict, load_contracts
from fleet_import.contracts.fleet import FLEET_DATASETS
from fleet_import.contracts.model import ContractError
from fleet_import.errors import WarehouseError
from fleet_import.importing.context import Committed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import InvalidFolder, InvalidTenant, ScopeTooLong, Tenant
from fleet_import.store.details import FailureKind
from fleet_import.store.models import Reserved
from fleet_import.store.repository import BatchRepository
from tests.cli.run_cli import Ran, invoke_with_test_settings
from tests.helpers import upload

ACME = Tenant.named("acme")

HOSTILE_TENANT_IDS = [
    "x'; drop table y;--",
    'acme"; DROP TABLE ingestion_batches;--',
    "acme' OR '1'='1",
    "../globex",
    "acme/../globex",
    "acme\x00",
    "acme\n",
    "ACME",
    "",
    " acme",
    "a" * 64,
    "acme;",
    "acme%27",
]


@pytest.mark.parametrize("tenant_id", HOSTILE_TENANT_IDS)
def test_hostile_tenant_ids_are_refused(tenant_id: str) -> None:
    with pytest.raises(InvalidTenant, match="invalid tenant id"):
        Tenant.named(tenant_id)
    with pytest.raises(InvalidTenant, match="invalid tenant id"):
        Tenant(tenant_id, "company", "tenant_db")


@pytest.mark.parametrize(
    ("company_id", "database", "problem"),
    [
        ("x'; drop table y;--", "tenant_acme", "invalid company id"),
        ("../globex", "tenant_acme", "invalid company id"),
        ("acme", 'tenant_acme"; drop database x;--', "invalid warehouse database"),
        ("acme", "../tenant_globex", "invalid warehouse database"),
        ("acme", "Tenant_Acme", "invalid warehouse database"),
    ],
)
def test_hostile_company_and_database_are_refused(
    company_id: str, database: str, problem: str
) -> None:
    with pytest.raises(InvalidTenant, match=problem):
        Tenant("acme", company_id, database)


# -- folders: refused before any SQL or S3 request ---------------------------------------------


class _Recorder:
    """Forwards to a real object and records every attribute used on it."""

    def __init__(self, target: Any, calls: list[str], name: str) -> None:
        self._target, self._calls, self._name = target, calls, name

    def __getattr__(self, attribute: str) -> Any:
        self._calls.append(f"{self._name}.{attribute}")
        return getattr(self._target, attribute)


HOSTILE_FOLDERS = [
    ("s3://{bucket}/acme/../globex/", InvalidFolder, "'..' path segments"),
    ("s3://{bucket}/../", InvalidFolder, "'..' path segments"),
    ("s3://{bucket}/acme/%2e%2e/globex/", InvalidFolder, "'..' path segments"),
    ("s3://{bucket}/acme/%2E%2E/globex/", InvalidFolder, "'..' path segments"),
    ("s3://{bucket}/acme/..%2fglobex/", InvalidFolder, "'..' path segments"),
    ("s3://{bucket}/acme/.%2e/", InvalidFolder, "'..' path segments"),
    ("s3://{bucket}/acme%2F..%2Fglobex/", InvalidFolder, "'..' path segments"),
    ("s3://{bucket}/acme/./x/", InvalidFolder, "'.' path segments"),
    ("s3://{bucket}/acme/\x00/", InvalidFolder, "control character"),
    ("s3://{bucket}/acme/%00/", InvalidFolder, "percent-encoded control character"),
    ("s3://{bucket}/acme/x\n/", InvalidFolder, "control character"),
    ("s3://{bucket}/acme/%0d%0aX-Injected: 1/", InvalidFolder, "control character"),
    ("s3://{bucket}/acme/%ff%fe/", InvalidFolder, "not valid UTF-8"),
    # Double encoding: decoded once here, and again wherever the canonical folder is used.
    ("s3://{bucket}/acme/%252e%252e/globex/", InvalidFolder, "still holds '%'"),
    ("s3://{bucket}/acme%252Fglobex/", InvalidFolder, "still holds '%'"),
    ("s3://{bucket}/acme/%2541/", InvalidFolder, "still holds '%'"),
    ("s3://{bucket}/", InvalidFolder, "not the whole bucket"),
    ("s3://{bucket}", InvalidFolder, "not the whole bucket"),
    ("s3://{bucket}/acme/" + "a" * 300 + "/", ScopeTooLong, "at most 200 fit"),
    ("file:///etc/passwd", InvalidFolder, "only s3:// folders"),
    ("../../etc/passwd", InvalidFolder, "only s3:// folders"),
    ("s3://user:pass@{bucket}/acme/", InvalidFolder, "not a valid bucket name"),
    ("s3://{bucket}'; drop table x;--/acme/", InvalidFolder, "not a valid bucket name"),
    ("s3://169.254.169.254/latest/meta-data/", InvalidFolder, "IP address"),
    ("s3://..{bucket}/acme/", InvalidFolder, "not a valid bucket name"),
]


@pytest.mark.parametrize(
    ("folder", "error", "problem"),
    HOSTILE_FOLDERS,
    ids=[f"{i}-{f[:40]!r}" for i, (f, _, _) in enumerate(HOSTILE_FOLDERS)],
)
def test_hostile_folders_are_refused_before_sql_or_s3(
    folder: str,
    error: type[Exception],
    problem: str,
    import_ctx: ImportContext,
    s3: Any,
    landing_bucket: str,
    database_url: str,
) -> None:
    folder = folder.replace("{bucket}", landing_bucket)
    calls: list[str] = []
    requests: list[str] = []
    s3.meta.events.register("before-send.s3", lambda request, **_: requests.append(request.url))
    ctx = ImportContext(
        repo=_Recorder(import_ctx.repo, calls, "repo"),  # type: ignore[arg-type]
        warehouse=_Recorder(import_ctx.warehouse, calls, "warehouse"),  # type: ignore[arg-type]
        s3=_Recorder(s3, calls, "s3"),
        staging=_Recorder(import_ctx.staging, calls, "staging"),  # type: ignore[arg-type]
        events=import_ctx.events,
        workdir=import_ctx.workdir,
    )
    with pytest.raises(error, match=problem):
        import_folder(ctx, ACME, folder, "hostile")
    assert calls == [] and requests == []
    assert import_ctx.recorded_events == []  # type: ignore[attr-defined]
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM ingestion_batches").fetchone() == (0,)


def test_hostile_file_names_are_data_not_sql_or_paths(
    import_ctx: ImportContext, s3: Any, landing_bucket: str, database_url: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=200, vehicles=40)
    header = files["trips-1.csv"].split(b"\n", 1)[0]
    bad_row = b"Y1,V1,D1,2026-07-02T09:00:00Z,,-1,1,2,completed\n"
    hostile_name = "trips-'; DROP TABLE curated.fleet_trips;--.csv"
    files[hostile_name] = header + b"\n" + bad_row
    # A key below the folder through "..": a sub-folder to S3, never read.
    files["../trips-escape.csv"] = b"not, even, csv"
    files["sub/../../trips-9.csv"] = b"not, even, csv"
    upload(s3, folder, files)
    outcome = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed), outcome
    assert outcome.row_counts["trips"] == 200
    (reject,) = import_ctx.repo.get(outcome.batch_id).details["rejects"]["sample"]
    assert reject["file"].endswith("/" + hostile_name) and reject["column"] == "distance_km"
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM curated.fleet_trips").fetchone() == (200,)
    assert all("escape" not in f["key"] for f in outcome.summary["files"])


# -- contracts -----------------------------------------------------------------------------------


def _contract(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "tyres",
        "file_glob": "tyres*",
        "target_table": "curated.fleet_tyres",
        "natural_key": ["change_id"],
        "columns": [
            {"name": "change_id", "type": "string", "nullable": False},
            {"name": "tread_mm", "type": "float64", "min_value": 0},
        ],
    }
    raw.update(changes)
    return raw


def _columns(*names: Any) -> list[dict[str, Any]]:
    return [{"name": name, "type": "string"} for name in names]


HOSTILE_CONTRACTS = [
    ({"columns": _columns("change_id", 'a"; drop table x;--')}, "invalid column name"),
    ({"columns": _columns("change_id", "../x")}, "invalid column name"),
    ({"columns": _columns("change_id", "Order")}, "invalid column name"),
    ({"columns": _columns("change_id", "a b")}, "invalid column name"),
    ({"columns": _columns("change_id", "a\x00")}, "invalid column name"),
    ({"columns": _columns("change_id", "x" * 64)}, "invalid column name"),
    ({"columns": _columns("change_id", 7)}, "invalid column name"),
    ({"columns": [{"name": "change_id", "type": "text); drop table x;--"}]}, "unknown type"),
    ({"name": "../tyres"}, "invalid dataset name"),
    ({"name": "tyres; drop table x"}, "invalid dataset name"),
    ({"target_table": "curated.x; drop table y"}, "invalid target table"),
    ({"target_table": 'curated."x"'}, "invalid target table"),
    ({"target_table": "../etc.passwd"}, "invalid target schema"),
    ({"target_table": "curated"}, "invalid target table"),
    ({"target_table": "curated.x.y"}, "invalid target table"),
    ({"target_table": "Curated.x"}, "invalid target schema"),
    ({"natural_key": ['change_id"; drop']}, "natural key"),
    ({"formats": ["csv", "sh"]}, "unknown format"),
    ({"columns": "DROP TABLE x"}, "invalid"),
]


@pytest.mark.parametrize(("changes", "problem"), HOSTILE_CONTRACTS)
def test_hostile_contract_definitions_are_refused(
    changes: dict[str, Any], problem: str, tmp_path: Path
) -> None:
    with pytest.raises(ContractError, match=problem):
        contract_from_dict(_contract(**changes))
    import yaml

    spec = tmp_path / "contracts.yaml"
    spec.write_text(yaml.safe_dump({"datasets": [_contract(**changes)]}), encoding="utf-8")
    with pytest.raises(ContractError, match=problem):
        load_contracts(str(spec))


@pytest.mark.parametrize("column", ["tenant_id", "source_scope", "ingestion_batch_id"])
def test_contract_columns_cannot_shadow_the_stamp(column: str, warehouse, database_url) -> None:
    contract = contract_from_dict(_contract(columns=_columns("change_id", column)))
    with pytest.raises(WarehouseError, match="reserved column names"):
        warehouse.ensure_tables([contract])
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT to_regclass('curated.fleet_tyres')").fetchone() == (None,)


def test_a_contract_cannot_target_the_slice_registry(warehouse) -> None:
    contract = contract_from_dict(_contract(target_table="curated.ingestion_slices"))
    with pytest.raises(WarehouseError, match="does not match dataset"):
        warehouse.ensure_tables([contract])


RESERVED = {
    "name": "select",
    "file_glob": "select*",
    "target_table": "curated.order",
    "natural_key": ["order"],
    "required": False,
    "columns": [
        {"name": "order", "type": "string", "nullable": False},
        {"name": "select", "type": "int64", "min_value": 0},
        {"name": "from", "type": "timestamptz"},
        {"name": "user", "type": "string"},
        {"name": "group", "type": "float64"},
        {"name": "table", "type": "bool"},
    ],
}


def test_reserved_words_as_identifiers_are_quoted_and_load(
    import_ctx: ImportContext, s3: Any, landing_bucket: str, database_url: str
) -> None:
    contract = contract_from_dict(RESERVED)
    import_ctx.contracts = FLEET_DATASETS.with_extra([contract])
    import_ctx.warehouse.ensure_tables([contract])
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=20)
    rows = [f"O{i},{i},2026-07-02T09:00:00Z,u{i},{i}.5,true" for i in range(40)]
    rows.append("O-bad,-3,2026-07-02T09:00:00Z,u,1,false")
    files["select.csv"] = ("order,select,from,user,group,table\n" + "\n".join(rows)).encode()
    upload(s3, folder, files)
    outcome = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(outcome, Committed), outcome
    assert outcome.row_counts["select"] == 40
    (reject,) = import_ctx.repo.get(outcome.batch_id).details["rejects"]["sample"]
    assert (reject["line"], reject["column"]) == (42, "select")
    query = sql.SQL("SELECT {}, {}, {}, {}, {}, {} FROM {}.{} WHERE {} = %s").format(
        *(sql.Identifier(c["name"]) for c in RESERVED["columns"]),
        sql.Identifier("curated"),
        sql.Identifier("order"),
        sql.Identifier("order"),
    )
    with psycopg.connect(database_url) as conn:
        (row,) = conn.execute(query, ("O7",)).fetchall()
    assert row[:2] == ("O7", 7) and row[3:] == ("u7", 7.5, True)


# -- text that PostgreSQL cannot store ----------------------------------------------------------


def test_a_failure_message_holding_nul_is_stored(repo) -> None:
    scope = "fleet_s3:s3://fleet-landing/acme/fleet/2026-07-22/"
    reserved = repo.reserve(ACME, scope, "d1")
    assert isinstance(reserved, Reserved)
    owner = f"test:{uuid.uuid4().hex}"
    repo.acquire_lease(reserved.batch.id, owner, 30)
    repo.mark_failed(reserved.batch.id, owner, FailureKind.FAILED_PRE_COMMIT, "bad \x00 byte")
    assert repo.get(reserved.batch.id).details["failure"]["error"] == "bad \\x00 byte"


# -- rich markup in data: the CLI prints it as it is ----------------------------------------------

MARKUP_FILE = "trips [bold]x.csv"


def _cli(*args: str) -> Ran:
    return invoke_with_test_settings(*args)


def _with_markup_column(csv: bytes) -> bytes:
    """The CSV with an extra column named `[/bold]` (a value on every row)."""
    header, rows = csv.split(b"\n", 1)
    extended = [row + b",x" for row in rows.split(b"\n") if row]
    return b"\n".join([header + b',"[/bold]"', *extended]) + b"\n"


@pytest.mark.slow
def test_a_markup_column_name_fails_the_run_with_its_state_line_printed(
    flow_env: str, s3: Any, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=40)
    files[MARKUP_FILE] = _with_markup_column(files.pop("trips-1.csv"))
    upload(s3, folder, files)
    run = _cli("run", "--tenant", "acme", folder)
    assert run.returncode == 1, run.stdout + run.stderr
    last = run.stdout.splitlines()[-1]
    assert last.startswith("Failed: failed_pre_commit: "), run.stdout + run.stderr
    assert f"{folder}{MARKUP_FILE}: columns do not match" in last
    assert last.endswith("unexpected columns: [/bold]"), last
    (batch,) = BatchRepository(flow_env).list()
    shown = _cli("batches", "show", str(batch.id))
    assert shown.returncode == 0 and "unexpected columns: [/bold]" in shown.stdout, shown.stderr


@pytest.mark.slow
def test_a_markup_file_name_and_reject_value_are_listed_as_they_are(
    flow_env: str, s3: Any, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=40)
    bad_row = b"TBAD,V1,D1,[/red],2026-07-02T10:00:00Z,12.5,1000,1012.5,completed\n"
    files[MARKUP_FILE] = files.pop("trips-1.csv") + bad_row
    upload(s3, folder, files)
    run = _cli("run", "--tenant", "acme", folder)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1].startswith("Completed: batch "), run.stdout
    (batch,) = BatchRepository(flow_env).list()
    shown = _cli("batches", "show", str(batch.id))
    assert shown.returncode == 0, shown.stderr
    files_table = shown.stdout.split(" files ", 1)[1]
    assert f"{folder}{MARKUP_FILE}" in files_table, shown.stdout
    (reject_row,) = [line for line in shown.stdout.splitlines() if "[/red]" in line]
    assert MARKUP_FILE in reject_row, shown.stdout
