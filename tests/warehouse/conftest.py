"""The Redshift emulator every Redshift test here runs against: a provisioned cluster at
SERIALIZABLE, then a Serverless workgroup (no STL/STV tables) at SNAPSHOT (SETUPS), each time
logged in as the least-privilege loading user of tests/redshift_grants.py. A test file
needing one setup only overrides it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.redshift_emulator import SETUPS, RedshiftEmulator
from tests.redshift_grants import create_loader


@pytest.fixture(params=SETUPS, ids=["-".join(setup) for setup in SETUPS])
def emulator(
    request: pytest.FixtureRequest, database_url: str, s3: Any
) -> Iterator[RedshiftEmulator]:
    loader = create_loader(database_url)
    mode, level = request.param
    with RedshiftEmulator(
        database_url, s3, serverless=mode == "serverless", user=loader, isolation_level=level
    ) as emu:
        yield emu
    # The backend never sends what Redshift would refuse (tests/redshift_strict.py).
    assert not emu.refusals, emu.refusals
