"""`batches show`'s per-file table after a real import: a file's duplicate-key rejects are
among its rejects, so its files add up to what the batch loaded and rejected (issue #46:
2,997 rows / 3 rejects were shown for a file of a batch that loaded 2,995 and rejected 5)."""

from __future__ import annotations

import re

from fleet_import.importing.context import Committed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant
from tests.cli.run_cli import invoke
from tests.helpers import upload


def _file_row(shown: str, file_name: str) -> tuple[int, int]:
    """(rows, rejects) of the files table's row naming `file_name`."""
    for line in shown.splitlines():
        if file_name in line:
            cells = [cell.strip() for cell in re.split(r"[│|]", line) if cell.strip()]
            return int(cells[2].replace(",", "")), int(cells[3])
    raise AssertionError(f"no row for {file_name} in:\n{shown}")


def test_a_files_duplicate_keys_count_among_its_rejects(
    import_ctx: ImportContext, s3, landing_bucket: str, database_url: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=400, bad_rows=True)  # trips-1.csv: 200 rows, 3 broken
    first_row = files["trips-1.csv"].split(b"\n")[1]
    files["trips-1.csv"] += first_row + b"\n"  # T0 twice: both copies are rejected
    upload(s3, folder, files)
    outcome = import_folder(import_ctx, Tenant.named("acme"), folder, "d1")
    assert isinstance(outcome, Committed), outcome
    assert outcome.row_counts["trips"] == 399  # 400 good rows but both T0s
    assert import_ctx.repo.get(outcome.batch_id).details["rejects"]["count"] == 5

    shown = invoke(("batches", "show", str(outcome.batch_id)), {"FLEET_DATABASE_URL": database_url})
    assert shown.returncode == 0, shown.stderr
    assert _file_row(shown.stdout, "trips-1.csv") == (199, 5)
    assert _file_row(shown.stdout, "trips-2.csv.gz") == (200, 0)
