"""The sweep's `manifest` completion rule (issue #24), against moto's S3 server."""

from __future__ import annotations

from fleet_import.intake.completion import completion_rule
from fleet_import.intake.manifest_rule import ManifestComplete
from fleet_import.intake.sweep import find_ready_folders
from fleet_import.s3.delivery_manifest import MANIFEST_NAME, manifest_for
from fleet_import.sample_data import fleet_delivery, today_folder, with_manifest
from tests.helpers import upload


def test_a_folder_is_complete_once_every_mandatory_entry_arrived_at_its_size(
    s3, landing_bucket: str
) -> None:
    assert completion_rule("manifest") == ManifestComplete()
    folder = today_folder(landing_bucket, "acme")
    files = fleet_delivery(trips=40)
    partial = {k: v for k, v in files.items() if k != "trips-2.csv.gz"}
    upload(s3, folder, {**partial, MANIFEST_NAME: manifest_for(files, folder, {})})
    scan = find_ready_folders(s3, landing_bucket, completion=ManifestComplete())
    assert scan.ready == []
    (skip,) = scan.skipped
    assert "waiting for 1 file(s)" in skip.reason and "trips-2.csv.gz" in skip.reason

    upload(s3, folder, {"trips-2.csv.gz": files["trips-2.csv.gz"][:10]})  # still arriving
    assert find_ready_folders(s3, landing_bucket, completion=ManifestComplete()).ready == []
    upload(s3, folder, with_manifest(files, folder))
    (ready,) = find_ready_folders(s3, landing_bucket, completion=ManifestComplete()).ready
    assert ready.folder == folder

    other = today_folder(landing_bucket, "globex")
    upload(s3, other, files)  # no manifest at all: not complete by this rule
    scan = find_ready_folders(s3, landing_bucket, completion=ManifestComplete())
    assert [f.folder for f in scan.ready] == [folder]
    assert any("waiting for its _manifest.json" in s.reason for s in scan.skipped)
