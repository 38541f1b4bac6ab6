"""Discovery and reads against moto's S3 server: what a delivery looks like to the importer."""

from __future__ import annotations

import io
import json
import socket
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber
from urllib3.exceptions import ProtocolError

from fleet_import.contracts.fleet import FLEET_DATASETS
from fleet_import.contracts.model import Column, ContractSet, DatasetContract
from fleet_import.errors import DetailsInvalid, PreCommitError, TransientError
from fleet_import.s3.client import S3Limits, s3_client
from fleet_import.s3.sources import (
    DiscoveryError,
    Manifest,
    SourceObject,
    TransientDiscoveryError,
    discover,
    download_object,
    open_object,
)
from tests.s3fixtures import put_objects, small_pages

FOLDER_PREFIX = "acme/fleet/2026-07-22/"
FLEET_FILES = {
    "vehicles.csv": b"vehicle_id,vin\nv1,VIN1\n",
    "trips_part1.csv.gz": b"\x1f\x8b fake gzip",
    "trips_part2.parquet": b"PAR1 fake parquet",
    "fuel_transactions.jsonl": b'{"transaction_id": "t1"}\n',
}


def folder_of(bucket: str, prefix: str = FOLDER_PREFIX) -> str:
    return f"s3://{bucket}/{prefix}"


def delivery(
    prefix: str = FOLDER_PREFIX, files: dict[str, bytes] | None = None
) -> dict[str, bytes]:
    return {prefix + name: body for name, body in (files or FLEET_FILES).items()}


def contract(name: str, glob: str, *, required: bool = True) -> DatasetContract:
    return DatasetContract(
        name=name,
        file_glob=glob,
        columns=(Column("id", "string"),),
        natural_key=("id",),
        target_table=f"curated.{name}",
        required=required,
    )


@pytest.fixture
def client(moto_endpoint: str) -> Any:
    """The code under test's own client, against moto."""
    return s3_client(moto_endpoint)


def discovery_error(client: Any, folder: str, contracts: ContractSet = FLEET_DATASETS) -> str:
    """The message of the refusal; whatever the cause, it names the folder, since that is
    what an operator reading a failed run looks for first."""
    with pytest.raises(DiscoveryError) as raised:
        discover(client, folder, contracts)
    message = str(raised.value)
    assert folder in message
    return message


# --- manifests -------------------------------------------------------------------------------


def test_discover_builds_manifest_of_matched_files(
    client: Any, s3: Any, landing_bucket: str
) -> None:
    put_objects(s3, landing_bucket, delivery())
    put_objects(
        s3,
        landing_bucket,
        {
            FOLDER_PREFIX + "_SUCCESS": b"",
            FOLDER_PREFIX + "README.txt": b"notes",
            FOLDER_PREFIX + "archive/trips_old.csv": b"id\n1\n",
        },
    )

    manifest = discover(client, folder_of(landing_bucket), FLEET_DATASETS)

    assert manifest.folder == folder_of(landing_bucket)
    assert [o.name for o in manifest.objects] == sorted(FLEET_FILES)
    by_name = {o.name: o for o in manifest.objects}
    trips = by_name["trips_part1.csv.gz"]
    assert trips.key == FOLDER_PREFIX + "trips_part1.csv.gz"
    assert (trips.dataset, trips.fmt, trips.size) == (
        "trips",
        "csv.gz",
        len(FLEET_FILES[trips.name]),
    )
    assert not trips.etag.startswith('"') and len(trips.etag) == 32
    assert isinstance(trips.last_modified, datetime) and trips.last_modified.tzinfo is not None
    assert {o.name: o.fmt for o in manifest.objects} == {
        "fuel_transactions.jsonl": "jsonl",
        "trips_part1.csv.gz": "csv.gz",
        "trips_part2.parquet": "parquet",
        "vehicles.csv": "csv",
    }
    assert manifest.ignored == (
        FOLDER_PREFIX + "README.txt",
        FOLDER_PREFIX + "_SUCCESS",
        FOLDER_PREFIX + "archive/",
    )
    assert {d: [o.name for o in objs] for d, objs in manifest.by_dataset().items()} == {
        "fuel_transactions": ["fuel_transactions.jsonl"],
        "trips": ["trips_part1.csv.gz", "trips_part2.parquet"],
        "vehicles": ["vehicles.csv"],
    }


def test_folder_without_trailing_slash_is_the_same_folder(
    client: Any, s3: Any, landing_bucket: str
) -> None:
    put_objects(s3, landing_bucket, delivery())
    manifest = discover(client, f"S3://{landing_bucket}/acme//fleet/2026-07-22", FLEET_DATASETS)
    assert manifest.folder == folder_of(landing_bucket)
    assert len(manifest.objects) == len(FLEET_FILES)


def test_discover_paginates_beyond_one_page(client: Any, s3: Any, landing_bucket: str) -> None:
    files = {f"trips_{i:04d}.csv": b"id\n1\n" for i in range(297)}
    files |= {"vehicles.csv": b"v", "fuel_transactions.csv": b"f", "_SUCCESS": b""}
    put_objects(s3, landing_bucket, delivery(files=files))

    pages = small_pages(client, 100)
    manifest = discover(client, folder_of(landing_bucket), FLEET_DATASETS)

    assert len(pages) == 3  # 300 keys, 100 a page

    assert len(manifest.objects) == 299
    assert len(manifest.by_dataset()["trips"]) == 297
    assert [o.key for o in manifest.objects] == sorted(o.key for o in manifest.objects)
    assert manifest.ignored == (FOLDER_PREFIX + "_SUCCESS",)


def test_fingerprint_ignores_upload_order_and_time_but_not_content(
    client: Any, s3: Any, landing_bucket: str
) -> None:
    names = sorted(FLEET_FILES)
    for name in names:
        s3.put_object(Bucket=landing_bucket, Key="first/" + name, Body=FLEET_FILES[name])
    for name in reversed(names):
        s3.put_object(Bucket=landing_bucket, Key="second/" + name, Body=FLEET_FILES[name])

    first = discover(client, folder_of(landing_bucket, "first/"), FLEET_DATASETS)
    second = discover(client, folder_of(landing_bucket, "second/"), FLEET_DATASETS)
    assert first.fingerprint == second.fingerprint
    assert len(first.fingerprint) == 64
    assert first.fingerprint == discover(client, first.folder, FLEET_DATASETS).fingerprint
    # Listing order and timestamps are not content: a later re-upload of the same bytes
    # (S3 timestamps move, etags do not) is the same delivery.
    later = Manifest(
        folder=first.folder,
        objects=tuple(
            replace(o, last_modified=o.last_modified + timedelta(days=1))
            for o in reversed(first.objects)
        ),
        ignored=(),
    )
    assert later.fingerprint == first.fingerprint

    s3.put_object(Bucket=landing_bucket, Key="second/vehicles.csv", Body=b"vehicle_id\nv2\n")
    changed = discover(client, second.folder, FLEET_DATASETS)
    assert changed.fingerprint != first.fingerprint


def test_load_order_groups_datasets_and_keeps_key_order_within_each(
    client: Any, s3: Any, landing_bucket: str
) -> None:
    """Dated file names interleave datasets in key order; loading takes each dataset's files
    together (one COPY each), in key order, so duplicate reports still name the first file."""
    dated = ContractSet(
        [
            FLEET_DATASETS["trips"].model_copy(update={"file_glob": "*_trips.csv"}),
            FLEET_DATASETS["vehicles"].model_copy(update={"file_glob": "*_vehicles.csv"}),
        ]
    )
    names = ["07-02_trips.csv", "07-01_vehicles.csv", "07-01_trips.csv", "07-02_vehicles.csv"]
    put_objects(s3, landing_bucket, {FOLDER_PREFIX + name: b"x\n" for name in names})
    manifest = discover(client, folder_of(landing_bucket), dated)
    assert [o.name for o in manifest.objects] == sorted(names)
    assert [o.name for o in manifest.load_order()] == [
        "07-01_trips.csv",
        "07-02_trips.csv",
        "07-01_vehicles.csv",
        "07-02_vehicles.csv",
    ]


def test_manifest_round_trips_through_json(client: Any, s3: Any, landing_bucket: str) -> None:
    put_objects(s3, landing_bucket, delivery())
    put_objects(s3, landing_bucket, {FOLDER_PREFIX + "_SUCCESS": b""})
    manifest = discover(client, folder_of(landing_bucket), FLEET_DATASETS)

    stored = json.loads(json.dumps(manifest.to_json()))
    assert stored["fingerprint"] == manifest.fingerprint
    assert Manifest.from_json(stored) == manifest

    stored["objects"][0]["etag"] = "0" * 32
    with pytest.raises(DetailsInvalid, match="fingerprint"):
        Manifest.from_json(stored)
    with pytest.raises(DetailsInvalid):
        Manifest.from_json({"version": 1, "folder": manifest.folder})


def test_keys_with_spaces_unicode_and_plus_are_listed_and_read(
    client: Any, s3: Any, landing_bucket: str
) -> None:
    prefix = "acme/fleet 2026/juillet é+1/"
    files = {
        "vehicles 1+1 é.csv": b"a",
        "trips ü+%20 ✓.csv": b"bb",
        "fuel_transactions (copy).jsonl": b"ccc",
    }
    put_objects(s3, landing_bucket, delivery(prefix, files))

    for folder in (
        folder_of(landing_bucket, prefix),
        folder_of(landing_bucket, prefix.replace(" ", "%20")),
    ):
        manifest = discover(client, folder, FLEET_DATASETS)
        assert {o.key for o in manifest.objects} == {prefix + name for name in files}

    for obj in manifest.objects:
        with open_object(client, obj, landing_bucket) as stream:
            assert stream.read() == files[obj.name]


def test_sibling_prefixes_are_never_read(client: Any, s3: Any, landing_bucket: str) -> None:
    put_objects(s3, landing_bucket, delivery())
    put_objects(s3, landing_bucket, delivery("acme/fleet/2026-07-22x/"))
    put_objects(
        s3, landing_bucket, {"acme/fleet/2026-07-22.csv": b"x", "acme/fleet/trips.csv": b"y"}
    )

    manifest = discover(client, folder_of(landing_bucket), FLEET_DATASETS)

    assert all(o.key.startswith(FOLDER_PREFIX) for o in manifest.objects)
    assert len(manifest.objects) == len(FLEET_FILES)
    assert manifest.ignored == ()


def test_optional_dataset_may_be_absent(client: Any, s3: Any, landing_bucket: str) -> None:
    contracts = ContractSet(
        [contract("alpha", "alpha*"), contract("beta", "beta*", required=False)]
    )
    put_objects(s3, landing_bucket, delivery(files={"alpha.csv": b"id\n1\n"}))

    manifest = discover(client, folder_of(landing_bucket), contracts)

    assert list(manifest.by_dataset()) == ["alpha"]


def test_folder_placeholder_object_is_not_a_file(client: Any, s3: Any, landing_bucket: str) -> None:
    put_objects(s3, landing_bucket, {FOLDER_PREFIX: b""})
    message = discovery_error(client, folder_of(landing_bucket))
    assert "is empty" in message

    put_objects(s3, landing_bucket, delivery())
    manifest = discover(client, folder_of(landing_bucket), FLEET_DATASETS)
    assert FOLDER_PREFIX not in manifest.ignored
    assert len(manifest.objects) == len(FLEET_FILES)


# --- deliveries that cannot load -------------------------------------------------------------


def test_empty_folder_is_refused(client: Any, s3: Any, landing_bucket: str) -> None:
    put_objects(s3, landing_bucket, delivery("acme/fleet/2026-07-21/"))
    message = discovery_error(client, folder_of(landing_bucket))
    assert message == f"folder {folder_of(landing_bucket)} is empty"


def test_missing_required_dataset_names_it_and_what_was_found(
    client: Any, s3: Any, landing_bucket: str
) -> None:
    files = {"vehicles.csv": b"v", "notes.txt": b"n", "_SUCCESS": b""}
    put_objects(s3, landing_bucket, delivery(files=files))

    message = discovery_error(client, folder_of(landing_bucket))

    assert "required dataset(s) trips (trips*), fuel_transactions (fuel_transactions*)" in message
    assert "found '_SUCCESS', 'notes.txt', 'vehicles.csv'" in message


def test_only_sub_folders_are_reported_as_not_read(
    client: Any, s3: Any, landing_bucket: str
) -> None:
    put_objects(s3, landing_bucket, delivery(FOLDER_PREFIX + "part-1/"))
    message = discovery_error(client, folder_of(landing_bucket))
    assert "found no files; sub-folders, which are not read: " in message
    assert f"'{FOLDER_PREFIX}part-1/'" in message


def test_zero_byte_matched_file_is_named(client: Any, s3: Any, landing_bucket: str) -> None:
    put_objects(s3, landing_bucket, delivery(files={**FLEET_FILES, "trips_part3.csv": b""}))
    message = discovery_error(client, folder_of(landing_bucket))
    assert "file 'trips_part3.csv' (trips) is empty (0 bytes)" in message
    assert "required" not in message


def test_file_matching_several_datasets_is_refused(
    client: Any, s3: Any, landing_bucket: str
) -> None:
    contracts = ContractSet([contract("alpha", "alpha*"), contract("alphabet", "alphab*")])
    put_objects(s3, landing_bucket, delivery(files={"alpha.csv": b"1", "alphabet.csv": b"2"}))
    message = discovery_error(client, folder_of(landing_bucket), contracts)
    assert "'alphabet.csv' matches several datasets: alpha, alphabet" in message


def test_unknown_extension_of_a_dataset_file_is_named(
    client: Any, s3: Any, landing_bucket: str
) -> None:
    put_objects(s3, landing_bucket, delivery(files={**FLEET_FILES, "trips_extra.xlsx": b"PK"}))
    message = discovery_error(client, folder_of(landing_bucket))
    assert (
        "file 'trips_extra.xlsx' looks like dataset trips but its extension is not supported"
        in message
    )


def test_format_a_dataset_does_not_accept_is_named(
    client: Any, s3: Any, landing_bucket: str
) -> None:
    alpha = DatasetContract(
        name="alpha",
        file_glob="alpha*",
        columns=(Column("id", "string"),),
        natural_key=("id",),
        target_table="curated.alpha",
        formats=("parquet",),
    )
    put_objects(s3, landing_bucket, delivery(files={"alpha.csv": b"1"}))
    message = discovery_error(client, folder_of(landing_bucket), ContractSet([alpha]))
    assert "'alpha.csv' looks like dataset alpha but format csv is not accepted" in message


def test_refusal_for_content_carries_the_folder_and_every_problem(
    client: Any, s3: Any, landing_bucket: str
) -> None:
    files = {**FLEET_FILES, "trips_extra.xlsx": b"PK", "trips_part3.csv": b""}
    put_objects(s3, landing_bucket, delivery(files=files))
    folder = folder_of(landing_bucket)

    with pytest.raises(DiscoveryError) as raised:
        discover(client, folder, FLEET_DATASETS)

    assert raised.value.folder == folder
    assert raised.value.problems == (
        "file 'trips_extra.xlsx' looks like dataset trips but its extension is not supported "
        "(expected one of .csv.gz, .csv, .parquet, .jsonl)",
        "file 'trips_part3.csv' (trips) is empty (0 bytes)",
    )
    assert str(raised.value) == f"cannot import {folder}: " + "; ".join(raised.value.problems)


def test_missing_bucket_is_a_discovery_error(client: Any) -> None:
    folder = "s3://fleet-no-such-bucket-7f3a/acme/fleet/2026-07-22/"
    message = discovery_error(client, folder)
    assert message == f"cannot list {folder}: the bucket does not exist (NoSuchBucket)"


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("AccessDenied", 403, DiscoveryError),
        ("SlowDown", 503, TransientDiscoveryError),
        ("InternalError", 500, TransientDiscoveryError),
        ("SomethingNew", 400, DiscoveryError),
    ],
)
def test_listing_errors_are_sorted_by_code(
    client: Any, code: str, status: int, expected: type[Exception]
) -> None:
    folder = "s3://fleet-landing/acme/fleet/2026-07-22/"
    with Stubber(client) as stub:
        stub.add_client_error("list_objects_v2", service_error_code=code, http_status_code=status)
        with pytest.raises(expected) as raised:
            discover(client, folder, FLEET_DATASETS)
    assert str(raised.value).startswith(f"cannot list {folder}: ")
    assert type(raised.value) is expected
    # error_of_kind answers the class asked for: a transient one is a DiscoveryError too
    assert isinstance(raised.value, DiscoveryError)
    assert isinstance(raised.value, TransientError) == (expected is TransientDiscoveryError)


# --- reads -----------------------------------------------------------------------------------


def test_open_and_download_return_the_discovered_bytes(
    client: Any, s3: Any, landing_bucket: str, tmp_path: Path
) -> None:
    put_objects(s3, landing_bucket, delivery())
    manifest = discover(client, folder_of(landing_bucket), FLEET_DATASETS)
    parquet = next(o for o in manifest.objects if o.fmt == "parquet")

    with open_object(client, parquet, landing_bucket) as stream:
        assert stream.read() == FLEET_FILES[parquet.name]

    dest = download_object(client, parquet, landing_bucket, tmp_path / "cache" / "part2.parquet")
    assert dest.read_bytes() == FLEET_FILES[parquet.name]
    assert sorted(p.name for p in dest.parent.iterdir()) == ["part2.parquet"]


def test_replaced_object_is_detected_by_etag(
    client: Any, s3: Any, landing_bucket: str, tmp_path: Path
) -> None:
    put_objects(s3, landing_bucket, delivery())
    manifest = discover(client, folder_of(landing_bucket), FLEET_DATASETS)
    vehicles = manifest.by_dataset()["vehicles"][0]
    s3.put_object(Bucket=landing_bucket, Key=vehicles.key, Body=b"vehicle_id\nreplaced\n")

    location = f"s3://{landing_bucket}/{vehicles.key}"
    with pytest.raises(PreCommitError) as raised:
        open_object(client, vehicles, landing_bucket)
    assert str(raised.value) == (
        f"cannot read {location}: the object was replaced after discovery (its etag changed) "
        "(PreconditionFailed)"
    )

    dest = tmp_path / "vehicles.csv"
    with pytest.raises(PreCommitError, match="PreconditionFailed"):
        download_object(client, vehicles, landing_bucket, dest)
    assert list(tmp_path.iterdir()) == []


def test_deleted_object_is_a_pre_commit_error(client: Any, s3: Any, landing_bucket: str) -> None:
    put_objects(s3, landing_bucket, delivery())
    manifest = discover(client, folder_of(landing_bucket), FLEET_DATASETS)
    trips = manifest.objects[1]
    s3.delete_object(Bucket=landing_bucket, Key=trips.key)

    with pytest.raises(
        PreCommitError, match=r"cannot read s3://.*: the object no longer exists \(NoSuchKey\)"
    ):
        open_object(client, trips, landing_bucket)


def unseen_trips_csv(size: int) -> SourceObject:
    """A trips.csv as discovery would describe it, for reads that never reach its bytes."""
    return SourceObject(
        key="acme/fleet/2026-07-22/trips.csv",
        name="trips.csv",
        size=size,
        etag="0" * 32,
        last_modified=datetime.fromisoformat("2026-07-22T00:00:00+00:00"),
        dataset="trips",
        fmt="csv",
    )


def test_connection_lost_mid_stream_is_transient(client: Any) -> None:
    obj = unseen_trips_csv(size=10)

    class DroppingStream(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            raise ProtocolError("Connection broken: IncompleteRead")

    with Stubber(client) as stub:
        stub.add_response(
            "get_object",
            {"Body": StreamingBody(DroppingStream(), 10), "ContentLength": 10},
            {"Bucket": "fleet-landing", "Key": obj.key, "IfMatch": f'"{obj.etag}"'},
        )
        stream = open_object(client, obj, "fleet-landing")
        with pytest.raises(TransientError, match="cannot read s3://fleet-landing/acme/"):
            stream.read()


def test_unreachable_endpoint_is_transient() -> None:
    with socket.socket() as probe:  # a port nothing listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = s3_client(
        f"http://127.0.0.1:{port}", S3Limits(connect_timeout=0.5, max_attempts=2)
    )
    obj = unseen_trips_csv(size=1)

    with pytest.raises(
        TransientError, match="cannot list s3://fleet-landing/acme/fleet/2026-07-22/"
    ):
        discover(client, "s3://fleet-landing/acme/fleet/2026-07-22/", FLEET_DATASETS)
    with pytest.raises(TransientError, match="cannot read s3://fleet-landing/acme/fleet/"):
        open_object(client, obj, "fleet-landing")
