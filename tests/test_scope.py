from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_import.scope import (
    InvalidFolder,
    InvalidTenant,
    ScopeTooLong,
    Tenant,
    canonical_folder,
    source_scope,
    split_folder,
    validate_tenant_id,
)


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("s3://fleet-landing/acme/fleet/2026-07-22/", "s3://fleet-landing/acme/fleet/2026-07-22/"),
        ("s3://fleet-landing/acme/fleet/2026-07-22", "s3://fleet-landing/acme/fleet/2026-07-22/"),
        ("S3://Fleet-Landing/acme/fleet/2026-07-22", "s3://fleet-landing/acme/fleet/2026-07-22/"),
        ("s3://fleet-landing//acme///fleet/", "s3://fleet-landing/acme/fleet/"),
        ("s3://fleet-landing/acme/My%20Folder/", "s3://fleet-landing/acme/My Folder/"),
        ("s3://fleet-landing/acme%2Ffleet/", "s3://fleet-landing/acme/fleet/"),
        ("s3://fleet.landing-1/ünïcode/", "s3://fleet.landing-1/ünïcode/"),
    ],
)
def test_canonical_folder(raw: str, canonical: str) -> None:
    assert canonical_folder(raw) == canonical
    assert canonical_folder(canonical) == canonical  # idempotent


def test_keys_keep_their_case_while_the_bucket_is_lowered() -> None:
    assert canonical_folder("s3://BUCKET-x/Acme/Fleet/") == "s3://bucket-x/Acme/Fleet/"


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("", "only s3:// folders"),
        ("fleet-landing/acme/", "only s3:// folders"),
        ("https://fleet-landing/acme/", "got https://"),
        ("s3a://fleet-landing/acme/", "got s3a://"),
        ("s3:///acme/", "bucket name is empty"),
        ("s3://ab/acme/", "not a valid bucket name"),
        ("s3://bad_bucket/acme/", "not a valid bucket name"),
        ("s3://-bucket/acme/", "not a valid bucket name"),
        ("s3://bucket../acme/", "not a valid bucket name"),
        ("s3://a..b/acme/", "not a valid bucket name"),
        ("s3://192.168.1.10/acme/", "IP address"),
        ("s3://fleet-landing/acme/../globex/", "'..' path segments"),
        ("s3://fleet-landing/acme/./x/", "'.' path segments"),
        ("s3://fleet-landing/acme/%2e%2e/globex/", "'..' path segments"),
        ("s3://fleet-landing/acme%2F..%2Fglobex/", "'..' path segments"),
        ("s3://fleet-landing/acme/\nx/", "control character"),
        ("s3://fleet-landing/acme/%0Ax/", "percent-encoded control character"),
        ("s3://fleet-landing/", "not the whole bucket"),
        ("s3://fleet-landing/acme/%A0/", "not valid UTF-8"),
        ("s3://fleet-landing", "not the whole bucket"),
    ],
)
def test_invalid_folders_name_the_problem(raw: str, problem: str) -> None:
    with pytest.raises(InvalidFolder) as error:
        canonical_folder(raw)
    assert problem in str(error.value)
    assert repr(raw) in str(error.value)


def test_non_string_folder_is_rejected() -> None:
    with pytest.raises(InvalidFolder):
        canonical_folder(None)


def test_source_scope_and_its_limit() -> None:
    assert source_scope("s3://fleet-landing/acme/x") == "fleet_s3:s3://fleet-landing/acme/x/"
    folder = "s3://fleet-landing/" + "a" * 200
    with pytest.raises(ScopeTooLong, match="at most 200"):
        source_scope(folder)
    longest = "s3://fleet-landing/" + "a" * (200 - len("fleet_s3:s3://fleet-landing/") - 1)
    assert len(source_scope(longest)) == 200


def test_split_folder() -> None:
    assert split_folder("s3://Fleet-Landing/acme/x") == ("fleet-landing", "acme/x/")


@pytest.mark.parametrize("tenant_id", ["acme", "a", "0", "acme_eu-2", "a" * 63])
def test_valid_tenant_ids(tenant_id: str) -> None:
    assert validate_tenant_id(tenant_id) == tenant_id


@pytest.mark.parametrize(
    "tenant_id",
    [
        "",
        "Acme",
        "_acme",
        "-acme",
        "a" * 64,
        "acme;drop table x",
        "acme/../x",
        "ac me",
        "ácme",
        None,
        7,
    ],
)
def test_invalid_tenant_ids(tenant_id: object) -> None:
    with pytest.raises(InvalidTenant, match="invalid tenant id"):
        validate_tenant_id(tenant_id)


def test_tenant_named_derives_company_and_database() -> None:
    assert Tenant.named("acme-eu") == Tenant("acme-eu", "acme-eu", "tenant_acme_eu")


@pytest.mark.parametrize(
    ("company_id", "database"), [("", "tenant_acme"), ("x y", "tenant_acme"), ("acme", 'x"; drop')]
)
def test_invalid_tenant_parts(company_id: str, database: str) -> None:
    with pytest.raises(InvalidTenant):
        Tenant("acme", company_id, database)


_segment = st.text(
    alphabet=string.ascii_letters + string.digits + "-_ .%+=@ü", min_size=1, max_size=12
)


@given(st.lists(_segment, min_size=1, max_size=6), st.booleans())
def test_canonical_folder_is_idempotent_and_safe(segments: list[str], trailing: bool) -> None:
    raw = "s3://fleet-landing/" + "/".join(segments) + ("/" if trailing else "")
    try:
        canonical = canonical_folder(raw)
    except InvalidFolder:
        return
    # A '%' left after decoding would be decoded again wherever the folder is used, so it
    # must never survive; without one, canonicalising again must change nothing.
    assert "%" not in canonical
    assert canonical_folder(canonical) == canonical
    assert canonical.startswith("s3://fleet-landing/") and canonical.endswith("/")
    parts = canonical.removeprefix("s3://fleet-landing/").rstrip("/").split("/")
    assert all(part not in ("", ".", "..") for part in parts)


@given(st.text(max_size=80))
def test_tenant_validation_never_accepts_unsafe_text(tenant_id: str) -> None:
    try:
        validate_tenant_id(tenant_id)
    except InvalidTenant:
        return
    assert set(tenant_id) <= set(string.ascii_lowercase + string.digits + "_-")
    assert 1 <= len(tenant_id) <= 63


@pytest.mark.parametrize(
    ("given", "leaf"),
    [
        ("s3://fleet-landing/acme/fleet/2026-07-22/", "2026-07-22"),
        ("s3://fleet-landing/acme/fleet/2026-07-22", "2026-07-22"),
        ("fleet_s3:s3://fleet-landing/acme/fleet/2026-07-22/", "2026-07-22"),
        ("s3://fleet-landing/", "fleet-landing"),
        ("", ""),
        ("not a folder", "not a folder"),
    ],
)
def test_a_folder_leaf_is_spelt_one_way_for_folders_and_scopes(given: str, leaf: str) -> None:
    from fleet_import.scope import folder_leaf

    assert folder_leaf(given) == leaf
