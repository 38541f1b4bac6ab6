"""The rule every import entry applies: a folder belongs to the tenant its place names."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_import.config import Settings
from fleet_import.errors import InvalidInput
from fleet_import.intake.admission import admit
from fleet_import.intake.landing import DEFAULT_LAYOUT, LandingLayout
from fleet_import.scope import Tenant
from fleet_import.tenants.binding import Refused, bind, folder_owner
from fleet_import.tenants.registry import load_registry

ACME = "s3://fleet-landing/acme/fleet/2026-07-22/"
GLOBEX = "s3://fleet-landing/globex/fleet/2026-07-22/"

REGISTRY = """
tenants:
  acme:
    company_id: ACME-001
  globex:
    company_id: GLX
    database: globex_dw
  initech:
    enabled: false
  umbrella:
    landing_prefixes: [s3://umbrella-drop/fleet/, s3://umbrella-eu]
"""


@pytest.fixture
def registry(tmp_path: Path):
    path = tmp_path / "tenants.yaml"
    path.write_text(REGISTRY)
    return load_registry(path)


def test_without_a_registry_the_layout_decides() -> None:
    assert bind("acme", ACME, layout=DEFAULT_LAYOUT, registry=None) == Tenant.named("acme")
    refused = bind("acme", GLOBEX, layout=DEFAULT_LAYOUT, registry=None)
    assert isinstance(refused, Refused) and refused.kind == "other_tenant"
    assert refused.owner_tenant_id == "globex"
    assert refused.reason == (
        f"{GLOBEX} belongs to tenant 'globex', not 'acme' "
        "(landing layout {tenant}/fleet/{yyyy-mm-dd}/)"
    )


@pytest.mark.parametrize(
    "folder",
    [
        "s3://fleet-landing/acme/x/",  # not the layout's shape
        "s3://fleet-landing/acme/fleet/2026-07-22/deeper/",
        "s3://fleet-landing/landing/acme/fleet/2026-07-22/",  # another prefix
        "s3://fleet-landing/acme/fleet/2026-13-45/",  # no date
    ],
)
def test_a_folder_outside_every_landing_area_is_refused(folder: str) -> None:
    refused = bind("acme", folder, layout=DEFAULT_LAYOUT, registry=None)
    assert isinstance(refused, Refused) and refused.kind == "outside", refused
    assert "no tenant's landing area" in refused.reason and "'acme'" in refused.reason


def test_the_layout_prefix_is_part_of_the_landing_area() -> None:
    layout = LandingLayout(prefix="landing/v1/")
    folder = "s3://fleet-landing/landing/v1/globex/fleet/2026-07-22/"
    assert bind("globex", folder, layout=layout, registry=None) == Tenant.named("globex")
    refused = bind("acme", folder, layout=layout, registry=None)
    assert isinstance(refused, Refused)
    assert "landing layout landing/v1/{tenant}/fleet/{yyyy-mm-dd}/" in refused.reason


def test_dot_segments_cannot_walk_into_another_tenant() -> None:
    with pytest.raises(InvalidInput, match="path segments"):
        bind("acme", "s3://fleet-landing/acme/../globex/fleet/2026-07-22/",
             layout=DEFAULT_LAYOUT, registry=None)


def test_invalid_input_still_raises() -> None:
    with pytest.raises(InvalidInput):
        bind("Acme!", ACME, layout=DEFAULT_LAYOUT, registry=None)
    with pytest.raises(InvalidInput):
        bind("acme", "http://x/y/", layout=DEFAULT_LAYOUT, registry=None)


def test_with_a_registry_unknown_and_disabled_tenants_are_refused(registry) -> None:
    bound = bind("acme", ACME, layout=DEFAULT_LAYOUT, registry=registry)
    assert bound == Tenant("acme", "ACME-001", "tenant_acme")
    folder = "s3://fleet-landing/hooli/fleet/2026-07-22/"
    unknown = bind("hooli", folder, layout=DEFAULT_LAYOUT, registry=registry)
    assert isinstance(unknown, Refused) and unknown.kind == "unknown_tenant"
    assert "not in the tenant registry" in unknown.reason and registry.path in unknown.reason
    folder = "s3://fleet-landing/initech/fleet/2026-07-22/"
    disabled = bind("initech", folder, layout=DEFAULT_LAYOUT, registry=registry)
    assert isinstance(disabled, Refused) and disabled.kind == "disabled_tenant"
    assert "disabled" in disabled.reason


def test_registered_prefixes_are_their_tenant_s_alone(registry) -> None:
    own = "s3://umbrella-drop/fleet/2026-07-22/"
    assert bind("umbrella", own, layout=DEFAULT_LAYOUT, registry=registry).tenant_id == "umbrella"
    whole_bucket = "s3://umbrella-eu/anything/"
    bound = bind("umbrella", whole_bucket, layout=DEFAULT_LAYOUT, registry=registry)
    assert bound == Tenant("umbrella", "umbrella", "tenant_umbrella"), bound
    assert folder_owner(whole_bucket, DEFAULT_LAYOUT, registry) == "umbrella"
    # the layout's shape inside a tenant's own bucket does not make it another tenant's
    taken = "s3://umbrella-drop/fleet/acme/fleet/2026-07-22/"
    refused = bind("acme", taken, layout=DEFAULT_LAYOUT, registry=registry)
    assert isinstance(refused, Refused) and refused.owner_tenant_id == "umbrella"
    assert "landing layout" in refused.reason
    # a tenant with its own prefixes is refused elsewhere, and told where its area is
    elsewhere = bind("umbrella", ACME, layout=DEFAULT_LAYOUT, registry=registry)
    assert isinstance(elsewhere, Refused) and "registered prefixes" in elsewhere.reason


ACME_OWNS_THE_BUCKET = "  acme:\n    landing_prefixes: [s3://shared/]\n"
GLOBEX_OWNS_A_PREFIX_IN_IT = "  globex:\n    landing_prefixes: [s3://shared/globex/]\n"


@pytest.mark.parametrize(
    "entries",
    [
        ACME_OWNS_THE_BUCKET + GLOBEX_OWNS_A_PREFIX_IN_IT,
        GLOBEX_OWNS_A_PREFIX_IN_IT + ACME_OWNS_THE_BUCKET,
    ],
    ids=["outer_first", "inner_first"],
)
def test_the_most_specific_registered_prefix_owns_the_folder(
    tmp_path: Path, entries: str
) -> None:
    """acme owns a whole bucket, globex a prefix inside it: globex's folders are globex's
    alone (docs/security.md), whichever order the registry lists them in."""
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n" + entries)
    registry = load_registry(path)
    folder = "s3://shared/globex/2026-07-22/"
    assert folder_owner(folder, DEFAULT_LAYOUT, registry) == "globex"
    assert bind("globex", folder, layout=DEFAULT_LAYOUT, registry=registry) == Tenant.named(
        "globex"
    )
    refused = bind("acme", folder, layout=DEFAULT_LAYOUT, registry=registry)
    assert isinstance(refused, Refused) and refused.kind == "other_tenant", refused
    assert refused.owner_tenant_id == "globex"
    # The rest of the bucket stays acme's.
    elsewhere = "s3://shared/initech/2026-07-22/"
    assert bind("acme", elsewhere, layout=DEFAULT_LAYOUT, registry=registry) == Tenant.named(
        "acme"
    )


def test_admit_records_the_database_that_holds_the_slices(tmp_path: Path, registry) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(REGISTRY)
    shared = Settings(warehouse_url="postgresql://u@h:5432/warehouse", tenants=str(path))
    assert admit(shared, "acme", ACME).database == "warehouse"  # type: ignore[union-attr]
    assert admit(shared, "globex", GLOBEX).database == "globex_dw"  # type: ignore[union-attr]
    per_tenant = Settings(warehouse_url="postgresql://u@h:5432/{database}", tenants=str(path))
    assert admit(per_tenant, "acme", ACME).database == "tenant_acme"  # type: ignore[union-attr]
    zero_config = Settings(warehouse_url="postgresql://u@h:5432/dw")
    assert admit(zero_config, "acme", ACME) == Tenant("acme", "acme", "dw")
