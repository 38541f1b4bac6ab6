"""Every physical line of a CSV is accounted for through a real load (issue 46.2): each line of
a generated trips file is in a row of the curated table in PostgreSQL or in the batch's
rejects, never in neither, and never in both. Generated as in
tests/normalize/test_normalize_quotes.py (stray quotes, values spanning lines, CR, LF and
CRLF, byte order marks), without blank lines, so that the identity is exact:
`loaded lines + rejected lines == physical lines` (the header aside)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import re
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings

from fleet_import.contracts.fleet import FLEET_DATASETS, TRIPS
from fleet_import.contracts.model import ContractSet
from fleet_import.importing.context import Committed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.importing.normalized_files import read_rejects
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant
from tests.helpers import curated, upload
from tests.normalize.test_normalize_quotes import csv_files
from tests.normalize_helpers import HEADER, csv_line, trip

pytestmark = pytest.mark.slow

ACME = Tenant.named("acme")
_LINE_END = re.compile(r"\r\n|\r|\n")
_TEXT_COLUMNS = [column.name for column in TRIPS.columns if column.type == "string"]
_days = itertools.count()
# The issue's shape, small: `"D5` on line 3, `D8"x` on line 6, the header's column count.
_ISSUE = [csv_line(trip(i)) for i in range(8)]
_ISSUE[1] = _ISSUE[1].replace(",D", ',"D5', 1)
_ISSUE[4] = _ISSUE[4].replace(",D", ',D8"x', 1)


def accepting_everything(ctx: ImportContext) -> ImportContext:
    """Trips under a contract that commits whatever share is rejected, or nothing loaded."""
    trips = TRIPS.model_copy(update={"max_reject_ratio": 1.0, "allow_empty": True})
    others = [c for c in FLEET_DATASETS.values() if c.name != "trips"]
    return dataclasses.replace(ctx, contracts=ContractSet([*others, trips]))


def physical_lines(text: str) -> int:
    return len(_LINE_END.split(text)) - text.endswith(("\n", "\r"))


def loaded_lines(database_url: str, batch_id: object) -> int:
    """The lines the slice's rows were read from, as PostgreSQL holds them: a row is one
    line plus the line ends inside its text values (only text keeps them)."""
    rows = curated(
        database_url,
        f"SELECT {', '.join(_TEXT_COLUMNS)} FROM curated.fleet_trips WHERE ingestion_batch_id = %s",
        batch_id,
    )
    return sum(1 + sum(len(_LINE_END.findall(v)) for v in row if v) for row in rows)


def rejected_lines(ctx: ImportContext, batch_id: object, workdir: Path) -> Counter[int]:
    name = f"{ACME.tenant_id}/rejects/{batch_id}/rejects.csv"  # under the tenant's prefix
    try:
        local = ctx.staging.get_file(name, workdir / f"{batch_id}.csv")
    except Exception:  # no rejects, no file
        return Counter()
    lines: Counter[int] = Counter()
    for reject in read_rejects(local):
        if reject.file.endswith("/trips.csv"):
            assert reject.line is not None
            lines.update(range(reject.line, (reject.last_line or reject.line) + 1))
    return lines


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=csv_files(blank_lines=False))
@example(text=HEADER + "\n" + "".join(_ISSUE))
def test_every_line_is_in_postgresql_or_in_the_rejects(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str, tmp_path: Path, text
) -> None:
    ctx = accepting_everything(import_ctx)
    folder = today_folder(landing_bucket, "acme", dt.date(2026, 1, 1) + dt.timedelta(next(_days)))
    others = fleet_delivery(trips=0, fuel=2, vehicles=2)
    files = {name: data for name, data in others.items() if not name.startswith("trips")}
    upload(s3, folder, {**files, "trips.csv": text.encode()})

    outcome = import_folder(ctx, ACME, folder, f"delivery-{folder}")

    assert isinstance(outcome, Committed), outcome
    rejected = rejected_lines(ctx, outcome.batch_id, tmp_path)
    assert set(rejected.values()) <= {1}, rejected  # no line in two rejects
    assert set(rejected) <= set(range(2, physical_lines(text) + 1)), rejected
    loaded = loaded_lines(database_url, outcome.batch_id)
    assert loaded + sum(rejected.values()) == physical_lines(text) - 1, (loaded, rejected)


def test_a_rejected_record_spanning_lines_names_them_all_in_the_batch(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str, tmp_path: Path
) -> None:
    """A driver quoted as RFC 4180 quotes a value over lines 3-5, too long for its column: one
    reject naming lines 3 to 5, in the batch's details, its rejects file and `batches show`;
    a quoted value over lines 6-7 that fits is loaded, its line end kept."""
    from typer.testing import CliRunner

    from fleet_cli.cli import app

    folder = today_folder(landing_bucket, "acme")
    trips = [csv_line(trip(i)) for i in range(8)]
    trips[1] = trips[1].replace(",D", ',"D' + "x" * 40 + "\n" + "y" * 40 + "\nz", 1)
    trips[1] = trips[1].replace(",2026", '",2026', 1)
    trips[4] = trips[4].replace(",D", ',"D\r\n', 1).replace(",2026", '",2026', 1)
    others = fleet_delivery(trips=0, fuel=2, vehicles=2)
    files = {name: data for name, data in others.items() if not name.startswith("trips")}
    upload(s3, folder, {**files, "trips.csv": (HEADER + "\n" + "".join(trips)).encode()})

    outcome = import_folder(accepting_everything(import_ctx), ACME, folder, "d1")

    assert isinstance(outcome, Committed), outcome
    (reject,) = import_ctx.repo.get(outcome.batch_id).details["rejects"]["sample"]
    assert (reject["line"], reject["last_line"], reject["column"]) == (3, 5, "driver_id")
    assert rejected_lines(import_ctx, outcome.batch_id, tmp_path) == Counter({3: 1, 4: 1, 5: 1})
    drivers = curated(
        database_url, "SELECT driver_id FROM curated.fleet_trips WHERE trip_id = 'T4'"
    )
    assert drivers == [("D\r\n1",)]
    assert loaded_lines(database_url, outcome.batch_id) == 11 - 3  # lines 2-11, 3-5 rejected
    shown = CliRunner().invoke(
        app,
        ["batches", "show", str(outcome.batch_id), "--database-url", database_url],
        env={"COLUMNS": "300"},
    )
    assert shown.exit_code == 0, shown.output
    assert "│ 3-5  │ driver_id" in shown.output, shown.output
