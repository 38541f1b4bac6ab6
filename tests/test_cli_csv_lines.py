"""`fleet-import run` on the CSV files of issue 46 (items 2 and 8), as a user runs it: a stray
quote that lost three rows without a word, a 5 MB line blamed on a quote, a gzip file named
.csv read as "UTF-16?". Subprocesses against PostgreSQL and moto, like tests/test_cli_flows.py.
"""

from __future__ import annotations

import gzip

import pytest

from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.store.repository import BatchRepository
from tests.helpers import curated, upload
from tests.normalize_helpers import HEADER, csv_line, trip
from tests.test_cli_flows import cli

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture
def api_env(flow_env: str) -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    return {"PREFECT_API_URL": PREFECT_API_URL.value()}


def trips_lines(count: int) -> list[str]:
    """Trips T0.. one a line, `lines[n - 2]` on physical line n (the header is line 1)."""
    return [csv_line(trip(i)) for i in range(count)]


def delivery(trips: list[str]) -> dict[str, bytes]:
    """The Fleet delivery with this trips.csv, and vehicles.csv gzip-compressed (named .csv)."""
    files = {
        name: data
        for name, data in fleet_delivery(trips=0, vehicles=7).items()
        if not name.startswith("trips")
    }
    files["vehicles.csv"] = gzip.compress(files["vehicles.csv"])
    files["trips.csv"] = (HEADER + "\n" + "".join(trips)).encode()
    return files


def test_a_stray_quote_rejects_every_line_it_swallowed_through_run(
    flow_env: str, api_env, s3, landing_bucket: str
) -> None:
    """`"D5` as a driver on line 51 and `D8"x` on line 54 made one value of four lines: the run
    said 2,996 trips and 1 reject, and T49-T51 (lines 52-54, in the issue T000050-T000052)
    were in neither. Now lines 51-54 are four rejects, each naming its own line."""
    folder = today_folder(landing_bucket, "acme")
    trips = trips_lines(3000)
    trips[51 - 2] = trips[51 - 2].replace(",D", ',"D5', 1)
    trips[54 - 2] = trips[54 - 2].replace(",D", ',D8"x', 1)
    upload(s3, folder, delivery(trips))

    done = cli("run", "--tenant", "acme", folder, env=api_env)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "Completed" in done.stdout and "2,996 trips" in done.stdout, done.stdout
    (batch,) = BatchRepository(flow_env).list()
    rejects = batch.details["rejects"]
    assert rejects["count"] == 4, rejects
    assert [(r["line"], r["reason"]) for r in rejects["sample"]] == [
        (51, "unbalanced quote opened on line 51"),
        *(
            (line, "unbalanced quote opened on line 51 swallowed this line")
            for line in (52, 53, 54)
        ),
    ]
    loaded = curated(flow_env, "SELECT trip_id FROM curated.fleet_trips")
    assert len(loaded) == 2996
    assert {"T48", "T53"} <= {row[0] for row in loaded}
    assert not {"T49", "T50", "T51", "T52"} & {row[0] for row in loaded}
    # vehicles.csv held gzip content: read as what it is, not refused as "UTF-16?".
    assert curated(flow_env, "SELECT count(*) FROM curated.fleet_vehicles") == [(7,)]


def test_a_line_over_the_limit_names_its_length_and_the_setting_through_run(
    flow_env: str, api_env, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    trips = trips_lines(200)
    trips[101 - 2] = trips[101 - 2].replace("completed", "completed" + "x" * (5 << 20))
    length = len(trips[101 - 2]) - 1
    upload(s3, folder, delivery(trips))

    failed = cli("run", "--tenant", "acme", folder, env=api_env)

    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert f"trips.csv: unreadable CSV: line 101 is {length:,} bytes long" in failed.stdout
    assert "1,048,576 bytes (FLEET_CSV_MAX_LINE_BYTES raises it)" in failed.stdout
    assert "quote" not in failed.stdout

    raised = cli(
        "run", "--tenant", "acme", folder, env={**api_env, "FLEET_CSV_MAX_LINE_BYTES": "8388608"}
    )

    assert raised.returncode == 0, raised.stdout + raised.stderr
    assert "199 trips" in raised.stdout, raised.stdout  # line 101's status is no status
