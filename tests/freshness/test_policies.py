"""The freshness configuration: the FLEET_FRESHNESS file (default, datasets, landing) and the
tenant registry's per-tenant `overrides.freshness`, read strictly, each mistake named by file
and field, and checked by the settings-first check."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_import.checks.settings import FRESHNESS, IMPORTS, SettingsInvalid, check_settings
from fleet_import.config import Settings
from fleet_import.freshness.policies import ANY_DATASET, FreshnessFileError, load_policy
from fleet_import.intake.completion import Quiet
from fleet_import.tenants.registry import load_registry


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_file_default_and_datasets_with_registry_overrides(tmp_path: Path) -> None:
    policy_file = write(
        tmp_path,
        "freshness.yaml",
        "landing: {bucket: fleet-landing, completion: quiet, quiet_seconds: 60}\n"
        "default: daily by 06:00 Europe/Berlin\n"
        "datasets: {trips: hourly within 20 min}\n",
    )
    registry = load_registry(
        write(
            tmp_path,
            "tenants.yaml",
            "tenants:\n"
            "  acme: {overrides: {freshness: daily by 07:30 UTC on business days}}\n"
            "  globex:\n"
            "    overrides:\n"
            "      freshness: {default: 'off', datasets: {vehicles: daily by 09:00}}\n"
            "  initech: {}\n",
        )
    )
    policy = load_policy(policy_file, registry)
    assert policy.bucket == "fleet-landing" and policy.completion == Quiet(60)
    texts = {t: {d: s.text for d, s in policy.slos(t).items()} for t in registry.tenants}
    assert texts == {
        "acme": {
            ANY_DATASET: "daily by 07:30 UTC on business days",
            "trips": "hourly within 20 min",
        },
        "globex": {
            ANY_DATASET: "off",
            "trips": "hourly within 20 min",
            "vehicles": "daily by 09:00",
        },
        "initech": {ANY_DATASET: "daily by 06:00 Europe/Berlin", "trips": "hourly within 20 min"},
    }


def test_no_file_and_no_override_checks_nothing() -> None:
    assert load_policy(None).slos("acme") == {}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("default: daily at 6\n", "freshness.yaml: default: 'daily at 6': expected 'daily by"),
        (
            "datasets: {trips: hourly within 90 min}\n",
            "freshness.yaml: datasets.trips: 'hourly within 90 min': within 90 min",
        ),
        (
            "defaults: daily by 06:00\n",
            "freshness.yaml: defaults: unknown field (did you mean 'default'?)",
        ),
        ("landing: {completion: sometimes}\n", "freshness.yaml: landing.completion: invalid value"),
        ("- daily by 06:00\n", "freshness.yaml: expected a mapping"),
        ("default: [\n", "freshness.yaml: not valid YAML"),
    ],
)
def test_a_mistake_in_the_file_names_its_field(tmp_path: Path, text: str, problem: str) -> None:
    path = write(tmp_path, "freshness.yaml", text)
    with pytest.raises(FreshnessFileError) as caught:
        load_policy(path)
    assert problem in str(caught.value).replace(str(tmp_path) + "/", "")


def test_a_mistake_in_an_override_names_the_registry_field(tmp_path: Path) -> None:
    registry = load_registry(
        write(
            tmp_path,
            "tenants.yaml",
            "tenants:\n  acme: {overrides: {freshness: {datasets: {trips: weekly}}}}\n",
        )
    )
    with pytest.raises(FreshnessFileError) as caught:
        load_policy(None, registry)
    message = str(caught.value).replace(str(tmp_path) + "/", "")
    assert "tenants.yaml: tenants.acme.overrides.freshness: datasets.trips: 'weekly'" in message


def test_settings_check_reads_the_file_only_for_the_commands_that_use_it(tmp_path: Path) -> None:
    path = write(tmp_path, "freshness.yaml", "default: daily by 06:00 Mars/Olympus\n")
    settings = Settings(freshness=path, staging_uri="s3://staging/x/")
    with pytest.raises(SettingsInvalid) as caught:
        check_settings(FRESHNESS, settings=settings, env={})
    [problem] = caught.value.problems
    assert problem.variable == "FLEET_FRESHNESS"
    assert "unknown time zone 'Mars/Olympus'" in problem.expected
    check_settings(IMPORTS, settings=settings, env={})  # an import does not need the SLOs
    missing = Settings(freshness=str(tmp_path / "nope.yaml"))
    with pytest.raises(SettingsInvalid, match="FLEET_FRESHNESS: freshness file .* does not exist"):
        check_settings(FRESHNESS, settings=missing, env={})
