"""Casts that survive bad values: the few values Arrow cannot cast become nulls flagged in a
mask, found by bisection instead of one Python call per value. Shared by every column type's
parser (rows, decimals)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc


def mask_at(length: int, positions: Sequence[int]) -> pa.BooleanArray:
    """A boolean mask with True at `positions` (the slow path's few bad rows)."""
    flags = bytearray(length)
    for position in positions:
        flags[position] = 1
    as_bytes = pa.Array.from_buffers(pa.uint8(), length, [None, pa.py_buffer(bytes(flags))])
    return pc.not_equal(as_bytes, 0)


def cast_each(values: pa.Array, target: pa.DataType) -> tuple[pa.Array, pa.BooleanArray | None]:
    """Cast, turning the values that cannot be cast into nulls flagged in the returned mask.

    One cast when everything is fine; otherwise bisection finds the bad values in
    O(bad * log n) casts instead of one Python call per value.
    """
    try:
        return pc.cast(values, target), None
    except pa.ArrowInvalid:
        pass
    bad: list[int] = []
    find_uncastable(values, target, 0, bad)
    failed = mask_at(len(values), bad)
    cleared = pc.if_else(failed, pa.scalar(None, values.type), values)
    return pc.cast(cleared, target), failed


def find_uncastable(values: pa.Array, target: pa.DataType, offset: int, bad: list[int]) -> None:
    try:
        pc.cast(values, target)
        return
    except pa.ArrowInvalid:
        pass
    if len(values) == 1:
        bad.append(offset)
        return
    half = len(values) // 2
    find_uncastable(values.slice(0, half), target, offset, bad)
    find_uncastable(values.slice(half), target, offset + half, bad)


def fill_false(mask: pa.Array) -> pa.BooleanArray:
    return pc.fill_null(mask, False) if mask.null_count else mask
