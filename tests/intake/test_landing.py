"""The landing layout: one parser for the relay's keys and the sweep's folders."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

import pytest

from fleet_import.errors import InvalidInput
from fleet_import.intake.landing import (
    DEFAULT_LAYOUT,
    DEFAULT_PATTERN,
    LandingFolder,
    LandingLayout,
    Unimportable,
)

BUCKET = "fleet-landing"


class Tree:
    """A bucket's folders for `LandingLayout.folders`, recording which levels were listed."""

    def __init__(self, *keys: str) -> None:
        self.folders: set[str] = set()
        for key in keys:
            parts = key.split("/")[:-1]
            self.folders.update("/".join(parts[: n + 1]) + "/" for n in range(len(parts)))
        self.listed: list[str] = []

    def __call__(self, key_prefix: str) -> Iterable[str]:
        self.listed.append(key_prefix)
        return sorted(
            f
            for f in self.folders
            if f.startswith(key_prefix) and "/" not in f[len(key_prefix) : -1]
        )


def walk(
    layout: LandingLayout, tree: Tree, dates: list[dt.date] | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """({folder: tenant}, {unimportable folder: reason})."""
    found: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for item in layout.folders(BUCKET, tree, dates):
        if isinstance(item, Unimportable):
            skipped[item.folder] = item.reason
        else:
            assert isinstance(item, LandingFolder)
            assert item.folder == f"s3://{BUCKET}/{item.key_prefix}"
            found[item.folder] = item.tenant_id
    return found, skipped


@pytest.mark.parametrize(
    "pattern",
    [
        "{tenant}/fleet/{yyyy-mm-dd}/",
        "{tenant}/fleet/{date}/",
        "{prefix}{tenant}/fleet/{yyyy-mm-dd}/",
        "{prefix}{tenant}/fleet/{date}/",
    ],
)
def test_both_date_spellings_and_an_explicit_prefix_are_the_default_layout(pattern: str) -> None:
    layout = LandingLayout(pattern=pattern)
    keys = [
        "acme/fleet/2026-07-22/_SUCCESS",
        "acme/fleet/2026-07-22/trips.csv",
        "acme/fleet/2026-02-30/_SUCCESS",
        "acme/fleet/latest/_SUCCESS",
        "Acme/fleet/2026-07-22/_SUCCESS",
        "acme/other/2026-07-22/_SUCCESS",
        "acme/fleet/2026-07-22/sub/x.csv",
        "acme/fleet/2026-07-22/",
        "README.txt",
    ]
    assert [layout.locate(BUCKET, k) for k in keys] == [
        DEFAULT_LAYOUT.locate(BUCKET, k) for k in keys
    ]
    assert walk(layout, Tree(*keys)) == walk(DEFAULT_LAYOUT, Tree(*keys))
    assert DEFAULT_LAYOUT.pattern == DEFAULT_PATTERN


def test_locate_places_a_key_in_its_delivery_folder() -> None:
    folder = f"s3://{BUCKET}/acme/fleet/2026-07-22/"
    assert DEFAULT_LAYOUT.locate(BUCKET, "acme/fleet/2026-07-22/trips part 1+2.csv") == (
        "acme",
        folder,
    )


@pytest.mark.parametrize(
    "key",
    [
        "README.txt",  # the bucket root
        "acme/fleet/2026-07-22/",  # a console "folder" object
        "acme/fleet/2026-07-22/sub/file.csv",  # deeper than a delivery folder
        "acme/fleet/file.csv",  # shallower
        "acme/other/2026-07-22/file.csv",  # another literal
        "Acme/fleet/2026-07-22/file.csv",  # not a tenant id
        "acme/fleet/2026-13-40/file.csv",  # not a date
        "acme/fleet/2026-7-2/file.csv",  # not yyyy-mm-dd
        "acme/fleet/not-a-date/file.csv",
        "acme//fleet/2026-07-22/file.csv",  # an empty segment
    ],
)
def test_keys_outside_the_layout_are_not_located(key: str) -> None:
    assert DEFAULT_LAYOUT.locate(BUCKET, key) is None


@pytest.mark.parametrize("prefix", ["landing/v1/", "landing/v1", "/landing/v1", "/landing/v1/"])
def test_the_prefix_is_normalized_and_goes_first(prefix: str) -> None:
    layout = LandingLayout(prefix=prefix, pattern="{tenant}/*/")
    assert layout.prefix == "landing/v1/"
    assert layout.locate(BUCKET, "landing/v1/globex/batch-7/_SUCCESS") == (
        "globex",
        f"s3://{BUCKET}/landing/v1/globex/batch-7/",
    )
    assert layout.locate(BUCKET, "globex/batch-7/_SUCCESS") is None
    assert layout.locate(BUCKET, "landing/globex/batch-7/_SUCCESS") is None


def test_the_prefix_can_be_placed_and_is_literal() -> None:
    placed = LandingLayout(prefix="in", pattern="{tenant}/{prefix}{yyyy-mm-dd}/")
    assert placed.locate(BUCKET, "acme/in/2026-07-22/a.csv") == (
        "acme",
        f"s3://{BUCKET}/acme/in/2026-07-22/",
    )
    # Placeholder syntax inside the prefix is text, not a placeholder.
    literal = LandingLayout(prefix="x*/{date}", pattern="{tenant}/")
    assert literal.locate(BUCKET, "x*/{date}/acme/a.csv") == (
        "acme",
        f"s3://{BUCKET}/x*/{{date}}/acme/",
    )
    assert literal.locate(BUCKET, "xy/2026-07-22/acme/a.csv") is None


def test_placeholders_share_a_segment_with_text() -> None:
    layout = LandingLayout(pattern="{tenant}/*-{yyyy-mm-dd}/")
    # `*` may hold '-': the date is matched as a date, not as the last piece after a '-'.
    assert layout.locate(BUCKET, "acme/export-v2-2026-07-22/a.csv") == (
        "acme",
        f"s3://{BUCKET}/acme/export-v2-2026-07-22/",
    )
    found, skipped = walk(layout, Tree("acme/export-v2-2026-07-22/a", "acme/export-latest/a"))
    assert found == {f"s3://{BUCKET}/acme/export-v2-2026-07-22/": "acme"}
    assert skipped == {f"s3://{BUCKET}/acme/export-latest/": "'latest' is not a yyyy-mm-dd date"}


def test_folders_lists_only_levels_with_placeholders_and_names_what_cannot_be_imported() -> None:
    tree = Tree(
        "landing/acme/fleet/2026-07-22/_SUCCESS",
        "landing/acme/fleet/2026-02-30/_SUCCESS",
        "landing/acme/other/2026-07-22/_SUCCESS",
        "landing/Bad_Tenant/fleet/2026-07-22/_SUCCESS",
        "landing/globex/fleet/2026-07-23/_SUCCESS",
        "elsewhere/acme/fleet/2026-07-22/_SUCCESS",
    )
    layout = LandingLayout(prefix="landing", pattern="{tenant}/fleet/{date}/")
    found, skipped = walk(layout, tree)
    assert found == {
        f"s3://{BUCKET}/landing/acme/fleet/2026-07-22/": "acme",
        f"s3://{BUCKET}/landing/globex/fleet/2026-07-23/": "globex",
    }
    assert set(skipped) == {
        f"s3://{BUCKET}/landing/Bad_Tenant/",
        f"s3://{BUCKET}/landing/acme/fleet/2026-02-30/",
    }
    assert "invalid tenant id 'Bad_Tenant'" in skipped[f"s3://{BUCKET}/landing/Bad_Tenant/"]
    # The prefix and `fleet` are entered, never listed; nothing below a bad tenant is listed.
    assert tree.listed == ["landing/", "landing/acme/fleet/", "landing/globex/fleet/"]


def test_a_folder_that_does_not_canonicalise_is_unimportable() -> None:
    layout = LandingLayout(pattern="{tenant}/*/")
    found, skipped = walk(layout, Tree("acme/ok/a", "acme/../a", "acme/%41/a"))
    assert found == {f"s3://{BUCKET}/acme/ok/": "acme"}
    assert "'..' path segments are not allowed" in skipped[f"s3://{BUCKET}/acme/../"]
    assert "is not canonical" in skipped[f"s3://{BUCKET}/acme/%41/"]
    assert layout.locate(BUCKET, "acme/%41/a.csv") is None
    assert layout.locate(BUCKET, "acme/../a.csv") is None


@pytest.mark.parametrize(
    ("pattern", "prefix", "message"),
    [
        ("fleet/{date}/", "", "must contain {tenant} exactly once"),
        ("{tenant}/{tenant}/", "", "must contain {tenant} exactly once"),
        ("{tenant}/{date}/{yyyy-mm-dd}/", "", "names the date twice"),
        ("{tenant}/{date}/{date}/", "", "names the date twice"),
        ("{tenant}/{day}/", "", r"unknown placeholders \['{day}'\]"),
        ("{Tenant}/{tenant}/", "", "unknown placeholders"),
        ("{tenant}/fleet", "", "must end with '/'"),
        ("{tenant}//fleet/", "", "empty segment"),
        ("{tenant}/", "landing//", "empty segment"),
    ],
)
def test_invalid_layouts_are_refused_when_made(pattern: str, prefix: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        LandingLayout(prefix=prefix, pattern=pattern)


def test_place_says_why_a_key_is_in_no_delivery_folder() -> None:
    def place(key: str) -> Unimportable:
        placed = DEFAULT_LAYOUT.place(BUCKET, key)
        assert isinstance(placed, Unimportable)
        return placed

    assert place("acme/fleet/2026-02-30/x.csv") == Unimportable(
        f"s3://{BUCKET}/acme/fleet/2026-02-30/", "'2026-02-30' is not a yyyy-mm-dd date", "acme"
    )
    outside = place("acme/other/2026-07-22/x.csv")
    assert outside.reason == "not in a delivery folder of the layout {tenant}/fleet/{yyyy-mm-dd}/"
    assert outside.tenant_id == "acme"
    assert "invalid tenant id 'Bad_Tenant'" in place("Bad_Tenant/fleet/2026-07-22/x").reason
    assert place("README.txt").tenant_id is None
    assert DEFAULT_LAYOUT.place(BUCKET, "acme/fleet/2026-07-22/x.csv") == LandingFolder(
        "acme", f"s3://{BUCKET}/acme/fleet/2026-07-22/", "acme/fleet/2026-07-22/"
    )


DAYS = [dt.date(2026, 7, 21), dt.date(2026, 7, 22)]


def test_with_dates_a_dated_folder_is_entered_by_name_and_other_dates_never_listed() -> None:
    tree = Tree(
        "acme/fleet/2026-07-22/a",
        "acme/fleet/2026-06-01/a",
        "acme/fleet/latest/a",
        "globex/fleet/2026-07-21/a",
        "Bad_Tenant/fleet/2026-07-22/a",
    )
    found, skipped = walk(DEFAULT_LAYOUT, tree, DAYS)
    # Entered whether or not they exist: the sweep's one LIST of each finds out.
    assert found == {
        f"s3://{BUCKET}/{tenant}/fleet/{day}/": tenant
        for tenant in ("acme", "globex")
        for day in DAYS
    }
    assert set(skipped) == {f"s3://{BUCKET}/Bad_Tenant/"}
    assert tree.listed == [""]  # the tenants only: never acme/fleet/
    assert DEFAULT_LAYOUT.dated and not LandingLayout(pattern="{tenant}/*/").dated


@pytest.mark.parametrize(
    ("pattern", "listed"),
    [
        ("{tenant}/dt={yyyy-mm-dd}/", [""]),  # the date with text: still entered by name
        ("{tenant}/{yyyy-mm-dd}-*/", ["", "acme/2026-07-21-", "acme/2026-07-22-"]),
        ("{tenant}/*-{yyyy-mm-dd}/", ["", "acme/"]),  # listed once, filtered by date
        ("{yyyy-mm-dd}/{tenant}/", ["2026-07-21/", "2026-07-22/"]),
    ],
)
def test_with_dates_a_name_with_more_placeholders_is_listed_from_its_dated_head(
    pattern: str, listed: list[str]
) -> None:
    layout = LandingLayout(pattern=pattern)
    names = {
        "{tenant}/dt={yyyy-mm-dd}/": ["acme/dt=2026-07-22/", "acme/dt=2026-07-01/"],
        "{tenant}/{yyyy-mm-dd}-*/": ["acme/2026-07-22-v2/", "acme/2026-07-01-v1/"],
        "{tenant}/*-{yyyy-mm-dd}/": ["acme/export-2026-07-22/", "acme/export-2026-07-01/"],
        "{yyyy-mm-dd}/{tenant}/": ["2026-07-22/acme/", "2026-07-01/acme/"],
    }[pattern]
    tree = Tree(*(name + "a" for name in names))
    found, skipped = walk(layout, tree, DAYS)
    if "dt=" in pattern:  # entered by name, both days
        assert found == {f"s3://{BUCKET}/acme/dt={day}/": "acme" for day in DAYS}
    else:
        assert found == {f"s3://{BUCKET}/{names[0]}": "acme"}
    assert skipped == {}
    assert tree.listed == listed
