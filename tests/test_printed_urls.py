"""What is printed of a database URL: the host:port a failed connection tried (in place of
the SQLSTATE it has not got), and the URL `doctor` checked with its password masked."""

from __future__ import annotations

import pytest

from fleet_import.bounded_connection import server_address
from fleet_import.config import masked_url


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("postgresql://postgres:pw@127.0.0.1:5999/fleet", "127.0.0.1:5999"),
        ("postgresql://u:pw@db.internal/fleet", "db.internal:5432"),
        ("postgresql://u:pw@h1:5433,h2:5434/fleet", "h1:5433, h2:5434"),
        ("postgresql://u@/fleet?host=/run/postgresql&port=5999", "/run/postgresql:5999"),
        ("postgresql://u:pw@db/fleet?password=also-secret", "db:5432"),
        # A password with an unencoded '@' or '/': libpq takes a piece of it for the host or
        # the port; nothing is named rather than that piece.
        ("postgresql://fleet:p@s3cret@127.0.0.1:5432/fleet", None),
        ("postgresql://fleet:1234/s3cret@db:5432/fleet", None),
        ("postgresql://fleet:pa/s3cret@db:5432/fleet", None),
        ("postgresql://fleet:pa?s3cret@db:5999/fleet", "db:5999"),
    ],
)
def test_the_address_tried_names_no_user_or_password(url: str, address: str | None) -> None:
    assert server_address(url) == address


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://postgres@127.0.0.1:5432/postgres", "postgresql://postgres@127.0.0.1:5432/postgres"),
        ("postgresql://u:s3cret@db:5432/fleet", "postgresql://u:***@db:5432/fleet"),
        ("postgresql://u:p%40ss@h1:1,h2:2/fleet", "postgresql://u:***@h1:1,h2:2/fleet"),
        (
            "postgresql://u@db/fleet?sslmode=require&password=s3cret",
            "postgresql://u@db/fleet?sslmode=require&password=***",
        ),
        ("postgresql:///fleet?host=/tmp", "postgresql:///fleet?host=/tmp"),
        ("postgresql+psycopg://u:s3cret@db/fleet", "postgresql+psycopg://u:***@db/fleet"),
        # Unencoded in the password: masked whole all the same.
        ("postgresql://u:p@s3cret@db/fleet", "postgresql://u:***@db/fleet"),
        ("postgresql://u:1234/s3cret@db/fleet", "postgresql://u:***@db/fleet"),
        ("postgresql://u:p?s3cret#x@db/fleet", "postgresql://u:***@db/fleet"),
        ("postgresql://db/fleet?password=p@s3cret&sslmode=require",
         "postgresql://db/fleet?password=***&sslmode=require"),
    ],
)
def test_a_printed_url_keeps_everything_but_its_password(url: str, shown: str) -> None:
    assert masked_url(url) == shown
