"""The Redshift emulator every Redshift test here runs against: a provisioned cluster, then a
Serverless workgroup (no STL/STV tables). A test file needing one mode only overrides it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.redshift_emulator import MODES, RedshiftEmulator


@pytest.fixture(params=MODES)
def emulator(
    request: pytest.FixtureRequest, database_url: str, s3: Any
) -> Iterator[RedshiftEmulator]:
    with RedshiftEmulator(database_url, s3, serverless=request.param == "serverless") as emu:
        yield emu
    # The backend never sends what Redshift would refuse (tests/redshift_strict.py).
    assert not emu.refusals, emu.refusals
