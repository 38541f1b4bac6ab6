"""The one listing of a prefix's direct children, against moto's server."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from fleet_import.s3.client import list_children, s3_client
from tests.s3fixtures import put_objects, small_pages

# S3 returns at most 1000 keys and common prefixes per page together; here pages of 100.
_KEYS_PER_PAGE = 100
_MORE_THAN_A_PAGE = 243


@pytest.fixture
def client(moto_endpoint: str) -> Any:
    return s3_client(moto_endpoint)


def test_lists_more_than_one_page_of_objects_and_folders(
    client: Any, s3: Any, landing_bucket: str
) -> None:
    files = {f"acme/fleet/2026-07-22/part-{n:05}.csv": b"x" for n in range(_MORE_THAN_A_PAGE)}
    folders = {f"acme/fleet/2026-{n:05}/_SUCCESS": b"" for n in range(_MORE_THAN_A_PAGE)}
    put_objects(s3, landing_bucket, files | folders)
    pages = small_pages(client, _KEYS_PER_PAGE)

    objects, sub_folders = list_children(client, landing_bucket, "acme/fleet/2026-07-22/")
    assert sorted(o["Key"] for o in objects) == sorted(files)
    assert {"Key", "Size", "ETag", "LastModified"} <= set(objects[0])
    assert sub_folders == []
    assert len(pages) == 3  # 243 keys, 100 a page

    children = list_children(client, landing_bucket, "acme/fleet/")
    assert children.objects == []
    expected = {f"acme/fleet/2026-{n:05}/" for n in range(_MORE_THAN_A_PAGE)}
    assert set(children.folders) == expected | {"acme/fleet/2026-07-22/"}
    assert len(children.folders) == len(expected) + 1  # no page listed twice
    assert len(pages) == 6


def test_direct_children_only_without_the_placeholder_object(
    client: Any, s3: Any, landing_bucket: str
) -> None:
    put_objects(
        s3,
        landing_bucket,
        {
            "acme/": b"",  # the "folder" object a console creates
            "acme/a.csv": b"a",
            "acme/fleet/2026-07-22/b.csv": b"b",
            "acme-other/c.csv": b"c",  # a sibling sharing the prefix's text
            "top.csv": b"t",
        },
    )
    acme = list_children(client, landing_bucket, "acme/")
    assert [o["Key"] for o in acme.objects] == ["acme/a.csv"]
    assert acme.folders == ["acme/fleet/"]
    root = list_children(client, landing_bucket, "")
    assert [o["Key"] for o in root.objects] == ["top.csv"]
    assert root.folders == ["acme-other/", "acme/"]


def test_errors_reach_the_caller_untranslated(client: Any) -> None:
    """Each caller translates with its own words (s3.errors.s3_errors); the lister does not."""
    with Stubber(client) as stub:
        stub.add_client_error("list_objects_v2", service_error_code="AccessDenied")
        with pytest.raises(ClientError):
            list_children(client, "fleet-landing", "acme/")
