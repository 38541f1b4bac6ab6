"""A folder's own manifest (issue #24): every import verifies against it before any
warehouse work; a declared row count that differs holds the batch. Real PostgreSQL, moto
(and the fakes for how a refusal is explained)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_import.config import Settings
from fleet_import.importing.context import Committed, Failed, ImportContext
from fleet_import.importing.driver import import_folder
from fleet_import.s3.delivery_manifest import (
    MANIFEST_NAME,
    DeliveryManifest,
    DeliveryManifestMismatch,
    manifest_for,
)
from fleet_import.sample_data import fleet_delivery, today_folder
from fleet_import.scope import Tenant
from fleet_import.store.details import FailureKind
from tests.fakes.world import LANDING, memory_world
from tests.helpers import upload

ACME = Tenant.named("acme")
ROWS = {
    "trips-1.csv": 100,
    "trips-2.csv.gz": 100,
    "vehicles.csv": 20,
    "fuel_transactions.parquet": 80,
}


def test_a_whole_delivery_loads_and_records_what_its_manifest_declares(
    import_ctx: ImportContext, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=200)
    upload(s3, folder, {**files, MANIFEST_NAME: manifest_for(files, folder, ROWS)})
    loaded = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(loaded, Committed), loaded
    declared = import_ctx.repo.get(loaded.batch_id).details["delivery_manifest"]
    assert declared["declared_rows"][f"{folder}trips-1.csv"] == 100


def test_missing_short_or_unlisted_files_fail_before_any_warehouse_work(
    import_ctx: ImportContext, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=200)
    listed = {**files, "trips-3.csv": files["trips-1.csv"]}  # one file never arrived
    upload(s3, folder, {**files, MANIFEST_NAME: manifest_for(listed, folder, {})})
    copies = import_ctx.warehouse.copies
    missing = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(missing, Failed) and missing.kind == FailureKind.FAILED_PRE_COMMIT
    assert f"missing: {folder}trips-3.csv" in missing.error and MANIFEST_NAME in missing.error

    longer = {**files, "trips-2.csv.gz": files["trips-2.csv.gz"] + b"cut off in transit"}
    unlisted = {k: v for k, v in longer.items() if k != "vehicles.csv"}
    upload(s3, folder, {MANIFEST_NAME: manifest_for(unlisted, folder, {})})
    short = import_folder(import_ctx, ACME, folder, "d2")
    assert isinstance(short, Failed), short
    assert f"size differs: {folder}trips-2.csv.gz" in short.error
    assert f"unlisted: {folder}vehicles.csv" in short.error
    assert import_ctx.warehouse.copies == copies  # nothing reached the warehouse
    assert import_ctx.warehouse.slice_owner("acme", f"fleet_s3:{folder}") is None
    assert import_ctx.repo.list(status="running") == []


def test_a_file_whose_rows_differ_from_its_declared_count_is_held(
    import_ctx: ImportContext, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=200)
    upload(
        s3,
        folder,
        {**files, MANIFEST_NAME: manifest_for(files, folder, {**ROWS, "trips-1.csv": 120})},
    )
    held = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(held, Failed) and held.kind == FailureKind.HELD, held
    assert f"{folder}trips-1.csv: the delivery manifest declares 120 rows, 100 were" in held.error
    assert import_ctx.warehouse.slice_owner("acme", f"fleet_s3:{folder}") is None


def test_a_dataset_whose_only_file_never_arrived_names_the_file_and_the_manifest(
    import_ctx: ImportContext, s3, landing_bucket: str
) -> None:
    """Discovery refuses the folder first (no file for a required dataset names no file):
    the folder's own manifest says which file that was, and that it never arrived."""
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=200)
    arrived = {k: v for k, v in files.items() if k != "vehicles.csv"}
    upload(s3, folder, {**arrived, MANIFEST_NAME: manifest_for(files, folder, {})})
    copies = import_ctx.warehouse.copies
    missing = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(missing, Failed) and missing.kind == FailureKind.FAILED_PRE_COMMIT
    assert missing.error.startswith(
        f"{folder} does not match its manifest {MANIFEST_NAME}: missing: {folder}vehicles.csv"
    ), missing.error
    assert "no file for required dataset(s) vehicles" in missing.error  # the consequence

    upload(s3, folder, {"vehicles.csv": b""})  # arrived empty: the manifest's size says so
    empty = import_folder(import_ctx, ACME, folder, "d2")
    assert isinstance(empty, Failed), empty
    assert f"size differs: {folder}vehicles.csv (0 bytes, manifest says " in empty.error
    assert import_ctx.warehouse.copies == copies  # nothing reached the warehouse
    assert import_ctx.repo.list(status="running") == []


def test_without_a_manifest_discovery_says_what_it_found(
    import_ctx: ImportContext, s3, landing_bucket: str
) -> None:
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=200)
    upload(s3, folder, {k: v for k, v in files.items() if k != "vehicles.csv"})
    refused = import_folder(import_ctx, ACME, folder, "d1")
    assert isinstance(refused, Failed), refused
    assert refused.error.startswith(f"cannot import {folder}: no file for required dataset")
    assert MANIFEST_NAME not in refused.error


@given(names=st.lists(st.sampled_from(["a.csv", "b.csv", "c.csv.gz", "d.parquet"]), max_size=6))
def test_a_manifest_listing_a_file_twice_is_refused_naming_it(names: list[str]) -> None:
    """Which of two entries for one file (their sizes, their row counts) holds is anyone's
    guess: a manifest that lists a file twice is malformed, and the refusal names the file;
    one that lists each file once is read."""
    folder = "s3://landing/acme/fleet/2026-07-22/"
    raw = {"entries": [{"url": folder + name, "mandatory": True} for name in names]}
    seen: dict[str, int] = {}
    for index, name in enumerate(names):
        if name in seen:
            with pytest.raises(DeliveryManifestMismatch) as refused:
                DeliveryManifest.parse(MANIFEST_NAME, raw)
            assert str(refused.value) == (
                f"{MANIFEST_NAME}: {folder}{name} is listed twice "
                f"(entries[{seen[name]}] and entries[{index}])"
            )
            return
        seen[name] = index
    parsed = DeliveryManifest.parse(MANIFEST_NAME, raw)
    assert [entry.url for entry in parsed.entries] == [folder + name for name in names]


def test_every_way_the_folder_differs_from_its_manifest_is_named_beside_what_it_caused(
    tmp_path,
) -> None:
    """A dataset's only file missing and another file short: the failure names both, then
    what discovery concluded from them. On the fakes, no server."""
    world = memory_world(tmp_path)
    folder = today_folder(LANDING, "acme")
    files = fleet_delivery(trips=20)
    arrived = {k: v for k, v in files.items() if k != "vehicles.csv"}
    arrived["trips-1.csv"] = arrived["trips-1.csv"][:50]
    world.deliver(files={**arrived, MANIFEST_NAME: manifest_for(files, folder, {})})

    failed = import_folder(world.ctx, ACME, folder, "d1")

    assert isinstance(failed, Failed) and failed.kind == FailureKind.FAILED_PRE_COMMIT
    declared = len(files["trips-1.csv"])
    assert failed.error == (
        f"{folder} does not match its manifest {MANIFEST_NAME}: missing: {folder}vehicles.csv; "
        f"size differs: {folder}trips-1.csv (50 bytes, manifest says {declared:,}) "
        "(so: no file for required dataset(s) vehicles (vehicles*); found '_manifest.json', "
        "'fuel_transactions.parquet', 'trips-1.csv', 'trips-2.csv.gz')"
    )
    assert world.warehouse.copies == 0


def test_a_refusal_is_explained_by_the_manifest_of_the_configured_name(tmp_path) -> None:
    world = memory_world(tmp_path)
    ctx = dataclasses.replace(world.ctx, settings=Settings(delivery_manifest_name="SENT.json"))
    folder = today_folder(LANDING, "acme")
    files = fleet_delivery(trips=20)
    arrived = {k: v for k, v in files.items() if k != "vehicles.csv"}
    world.deliver(files={**arrived, "SENT.json": manifest_for(files, folder, {})})

    failed = import_folder(ctx, ACME, folder, "d1")

    assert isinstance(failed, Failed), failed
    assert failed.error.startswith(
        f"{folder} does not match its manifest SENT.json: missing: {folder}vehicles.csv"
    ), failed.error
