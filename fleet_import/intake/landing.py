"""The landing layout: where tenants' delivery folders are in a landing bucket.

One description for everything that needs it: the relay places an object key in its
delivery folder (`locate`), the sweep walks the bucket level by level to find the folders
(`folders`), and the `relay` command and the sweep flow take their defaults from here.

A layout is `{prefix}{pattern}`. The prefix is literal key text (no leading '/', one
trailing '/'). The pattern is path segments, each ending in '/', with these placeholders:

    {tenant}        a tenant id, exactly once
    {yyyy-mm-dd}    a real date, at most once; `{date}` is the same placeholder
    *               any text within one segment
    {prefix}        where the prefix goes when it does not go first

Write `{yyyy-mm-dd}`; `{date}` stays accepted because deployments and commands already
carry it (`{prefix}{tenant}/fleet/{date}/`, the sweep's former spelling, is the default
layout). Any other `{...}` is refused, so that a typo fails when the layout is made instead
of matching nothing.

The date in a folder's name is what makes a bounded sweep possible: given the dates of a
lookback window, `folders` enters `acme/fleet/2026-07-22/` by name instead of listing
`acme/fleet/` (which holds every day of the tenant's history), so old folders are never
listed. A layout without a date cannot tell old folders from new ones by name.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from fleet_import.errors import InvalidInput
from fleet_import.scope import canonical_folder, validate_tenant_id

__all__ = [
    "DEFAULT_LAYOUT",
    "DELIVERY_SKIPPED_EVENT",
    "DEFAULT_PATTERN",
    "LandingFolder",
    "LandingLayout",
    "Segment",
    "Unimportable",
    "lookback_dates",
    "skipped_payload",
]

DEFAULT_PATTERN = "{tenant}/fleet/{yyyy-mm-dd}/"
# What the relay and the sweep emit when they leave a delivery (or an S3 object) alone.
DELIVERY_SKIPPED_EVENT = "fleet.delivery.skipped"

_PREFIX = "{prefix}"
_TENANT = "{tenant}"
_DATES = frozenset({"{yyyy-mm-dd}", "{date}"})
_ANY = "*"
_SYNTAX = re.compile(r"(\{[^{}/]*\}|\*)")
_ISO_DATE = r"\d{4}-\d{2}-\d{2}"
_ONE_SEGMENT = r"[^/]+"


@dataclass(frozen=True)
class Segment:
    """One level of folders: a literal name (entered without listing), or a name with
    placeholders (matched against the names a level holds)."""

    literal: str | None
    exact: re.Pattern[str] | None = None  # dates as yyyy-mm-dd
    near: re.Pattern[str] | None = None  # dates as any text, so a near miss can be named
    pieces: tuple[tuple[str, bool], ...] = ()  # (text, is a placeholder), for dated names

    @property
    def dated(self) -> bool:
        return any(placeholder and text in _DATES for text, placeholder in self.pieces)

    def dated_head(self, day: dt.date) -> tuple[str, bool]:
        """The segment's name up to its first placeholder other than the date, the date
        written in; and whether that is the whole name (then it is entered unlisted)."""
        head = []
        for text, placeholder in self.pieces:
            if placeholder and text not in _DATES:
                return "".join(head), False
            head.append(day.isoformat() if placeholder else text)
        return "".join(head), True

    def match(self, name: str) -> dict[str, str] | None:
        """The placeholders' values in `name`, or None when `name` is not this segment. A
        date that is no yyyy-mm-dd date still matches: `_problem` names it."""
        if self.literal is not None:
            return {} if name == self.literal else None
        assert self.exact is not None and self.near is not None
        found = self.exact.fullmatch(name) or self.near.fullmatch(name)
        return found.groupdict() if found else None


class LandingFolder(NamedTuple):
    """A delivery folder the layout names."""

    tenant_id: str
    folder: str  # s3://bucket/key-prefix/, canonical
    key_prefix: str


class Unimportable(NamedTuple):
    """A folder of the layout's shape that cannot be imported, and why (with the tenant
    segment's text when the layout got that far, valid or not, for the operator)."""

    folder: str
    reason: str
    tenant_id: str | None = None


def lookback_dates(days: int, today: dt.date) -> list[dt.date] | None:
    """The folder dates a sweep with a lookback of `days` enters: from `days` before today
    through tomorrow (a producer ahead of UTC names tomorrow's folder already). 0 means no
    window: every folder, however old."""
    if days < 0:
        raise InvalidInput(f"the sweep's lookback cannot be negative, got {days} days")
    if days == 0:
        return None
    return [today + dt.timedelta(days=n) for n in range(-days, 2)]


def skipped_payload(
    source: str, tenant_id: str | None, folder: str | None, reason: str, kind: str, **more: str
) -> dict[str, str | None]:
    """The payload of a DELIVERY_SKIPPED_EVENT, the same shape from the relay and the sweep:
    `kind` is a short word to filter on, `reason` the sentence an operator reads."""
    return {
        "source": source,
        "tenant_id": tenant_id,
        "folder": folder,
        "kind": kind,
        "reason": reason,
        **more,
    }


@dataclass(frozen=True)
class LandingLayout:
    """Where tenants' delivery folders are: `{prefix}{pattern}` (see the module docstring)."""

    prefix: str = ""
    pattern: str = DEFAULT_PATTERN
    segments: tuple[Segment, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        prefix = self.prefix.lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        object.__setattr__(self, "prefix", prefix)
        object.__setattr__(self, "segments", _segments(prefix, self.pattern))

    @property
    def dated(self) -> bool:
        """Whether folder names carry a date (so a lookback window can be applied)."""
        return any(segment.dated for segment in self.segments)

    def locate(self, bucket: str, key: str) -> tuple[str, str] | None:
        """(tenant id, canonical folder) of the delivery folder holding `key` directly, or
        None when no importable delivery folder holds it."""
        placed = self.place(bucket, key)
        return (placed.tenant_id, placed.folder) if isinstance(placed, LandingFolder) else None

    def place(self, bucket: str, key: str) -> LandingFolder | Unimportable:
        """The delivery folder holding `key` directly, or why none does (what an operator
        reads when an S3 event was ignored)."""
        folder_prefix, slash, leaf = key.rpartition("/")
        where = f"s3://{bucket}/{folder_prefix}{slash}"
        outside = f"not in a delivery folder of the layout {self.prefix}{self.pattern}"
        if not slash or not leaf:  # bucket root, or a "folder" placeholder object
            return Unimportable(where, outside)
        names = folder_prefix.split("/")
        if len(names) != len(self.segments):
            return Unimportable(where, outside)
        values: dict[str, str] = {}
        for segment, name in zip(self.segments, names, strict=True):
            found = segment.match(name)
            if found is None:
                return Unimportable(where, outside, values.get("tenant"))
            values.update(found)
        problem = _problem(values) or _folder_problem(where)
        if problem is not None:
            return Unimportable(where, problem, values.get("tenant"))
        return LandingFolder(values["tenant"], where, folder_prefix + "/")

    def folder_date(self, key_prefix: str) -> dt.date | None:
        """The date a folder's name carries by this layout (`acme/fleet/2026-07-22/` ->
        2026-07-22), or None when the folder is not of the layout or names no date."""
        names = key_prefix.removesuffix("/").split("/")
        if len(names) != len(self.segments):
            return None
        values: dict[str, str] = {}
        for segment, name in zip(self.segments, names, strict=True):
            found = segment.match(name)
            if found is None:
                return None
            values.update(found)
        if "date" not in values or _problem(values) is not None:
            return None
        return dt.date.fromisoformat(values["date"])

    def folders(
        self,
        bucket: str,
        sub_folders: Callable[[str], Iterable[str]],
        dates: Collection[dt.date] | None = None,
    ) -> Iterator[LandingFolder | Unimportable]:
        """Every folder of `bucket` the layout names, found level by level: `sub_folders`
        gives the key prefixes of the folders directly under a key prefix (as S3 lists
        them), and is only asked where a segment has placeholders. A folder of the layout's
        shape that cannot be imported (an invalid tenant id or date, a name that does not
        canonicalise) is Unimportable, and nothing below it is looked at.

        With `dates`, only folders of those dates: a dated segment is entered by name (or
        listed from its dated head), so folders of other dates are never listed. A folder
        entered by name may not exist; the caller's listing of it finds it empty."""
        level: list[tuple[str, dict[str, str]]] = [("", {})]
        for segment in self.segments:
            following: list[tuple[str, dict[str, str]]] = []
            for key_prefix, values in level:
                for name in _names(segment, key_prefix, sub_folders, dates):
                    found = segment.match(name)
                    if found is None:
                        continue  # not part of the layout (another dataset, a README folder)
                    tenant = {**values, **found}.get("tenant")
                    problem = _problem(found)
                    if problem is not None:
                        where = f"s3://{bucket}/{key_prefix}{name}/"
                        yield Unimportable(where, problem, tenant)
                        continue
                    if _outside(found, dates):
                        continue
                    following.append((f"{key_prefix}{name}/", {**values, **found}))
            level = following
        for key_prefix, values in level:
            folder = f"s3://{bucket}/{key_prefix}"
            problem = _folder_problem(folder)
            if problem is not None:
                yield Unimportable(folder, problem, values["tenant"])
            else:
                yield LandingFolder(values["tenant"], folder, key_prefix)


def _names(
    segment: Segment,
    key_prefix: str,
    sub_folders: Callable[[str], Iterable[str]],
    dates: Collection[dt.date] | None,
) -> list[str]:
    """The names to try below key_prefix: a literal segment's own; with dates, a dated
    segment's names for those dates (listed from their dated heads where the name holds
    more placeholders); else what S3 lists."""
    if segment.literal is not None:
        return [segment.literal]
    if dates is None or not segment.dated:
        return _listed(key_prefix, "", sub_folders)
    names: list[str] = []
    heads: list[str] = []
    for day in sorted(dates):
        head, whole = segment.dated_head(day)
        if whole:
            names.append(head)
        elif head not in heads:
            heads.append(head)
    for head in heads:
        names.extend(_listed(key_prefix, head, sub_folders))
    return names


def _listed(key_prefix: str, head: str, sub_folders: Callable[[str], Iterable[str]]) -> list[str]:
    """The names of the folders below key_prefix that start with head, as S3 lists them."""
    return [p[len(key_prefix) :].removesuffix("/") for p in sub_folders(key_prefix + head)]


def _segments(prefix: str, pattern: str) -> tuple[Segment, ...]:
    if not pattern.endswith("/"):
        raise InvalidInput(f"landing pattern {pattern!r} must end with '/' (it names folders)")
    # (text, is it a placeholder): the prefix is literal whatever it holds.
    pieces: list[tuple[str, bool]] = []
    text = pattern if _PREFIX in pattern else _PREFIX + pattern
    for index, chunk in enumerate(text.split(_PREFIX)):
        if index:
            pieces.append((prefix, False))
        pieces.extend((part, bool(_SYNTAX.fullmatch(part))) for part in _SYNTAX.split(chunk))
    named = [text for text, placeholder in pieces if placeholder and text != _ANY]
    unknown = sorted(set(named) - _DATES - {_TENANT})
    if unknown:
        raise InvalidInput(f"landing pattern {pattern!r} has unknown placeholders {unknown}")
    if named.count(_TENANT) != 1:
        raise InvalidInput(f"landing pattern {pattern!r} must contain {{tenant}} exactly once")
    if sum(text in _DATES for text in named) > 1:
        raise InvalidInput(f"landing pattern {pattern!r} names the date twice")
    segments: list[Segment] = []
    current: list[tuple[str, bool]] = []
    for text, placeholder in pieces:
        parts = [text] if placeholder else text.split("/")
        for index, part in enumerate(parts):
            if index:  # a '/': the segment so far is complete
                if not current:
                    raise InvalidInput(
                        f"landing pattern {pattern!r} with prefix {prefix!r} has an empty segment"
                    )
                segments.append(_segment(current))
                current = []
            if part:
                current.append((part, placeholder))
    return tuple(segments)


def _segment(pieces: list[tuple[str, bool]]) -> Segment:
    if not any(placeholder for _, placeholder in pieces):
        return Segment("".join(text for text, _ in pieces))
    return Segment(
        None,
        re.compile("".join(_regex(text, placeholder, _ISO_DATE) for text, placeholder in pieces)),
        re.compile(
            "".join(_regex(text, placeholder, _ONE_SEGMENT) for text, placeholder in pieces)
        ),
        tuple(pieces),
    )


def _regex(text: str, placeholder: bool, date: str) -> str:
    if not placeholder:
        return re.escape(text)
    if text == _TENANT:
        return rf"(?P<tenant>{_ONE_SEGMENT})"
    if text in _DATES:
        return rf"(?P<date>{date})"
    return _ONE_SEGMENT  # `*`


def _problem(values: Mapping[str, str]) -> str | None:
    """Why the values a folder gives the placeholders cannot be imported, if they cannot."""
    if "tenant" in values:
        try:
            validate_tenant_id(values["tenant"])
        except InvalidInput as exc:
            return str(exc)
    date = values.get("date")
    if date is not None:
        try:
            if not re.fullmatch(_ISO_DATE, date):
                raise ValueError(date)
            dt.date.fromisoformat(date)
        except ValueError:
            return f"{date!r} is not a yyyy-mm-dd date"
    return None


def _outside(values: Mapping[str, str], dates: Collection[dt.date] | None) -> bool:
    """Whether a listed folder's date is outside the window (`*` may match other dates)."""
    return (
        dates is not None
        and "date" in values
        and dt.date.fromisoformat(values["date"]) not in dates
    )


def _folder_problem(folder: str) -> str | None:
    """A folder whose name canonicalises to another (`//`, `%xx`, `..`) would make the import
    list a different prefix than the one the layout found."""
    try:
        canonical = canonical_folder(folder)
    except InvalidInput as exc:
        return str(exc)
    return None if canonical == folder else f"{folder!r} is not canonical ({canonical!r})"


DEFAULT_LAYOUT = LandingLayout()
