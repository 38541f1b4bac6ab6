"""Why a value does not fit a `decimal(p,s)` column, told per row.

Decimals are typed exactly, never through a float: text is cast by Arrow's decimal parser
(the fast path, which refuses what does not fit), typed sources by Arrow's decimal casts.
A value that does not fit is rejected, not rounded: rounding money silently changes what
the source said, and a reject names the row so that the producer can fix it. Trailing zeros
are no loss (`1.50` fits `decimal(5,1)` as 1.5). Only the rejected rows come here, so
Python's `decimal` may look at each of them.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

import pyarrow as pa
import pyarrow.compute as pc

from fleet_import.normalize.casting import mask_at

WELL_FORMED = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"
"""What Arrow's decimal parser reads: digits, one optional point, an optional exponent."""
REASON_NOT_DECIMAL = "not a valid decimal number"


def unfit_problems(
    values: pa.Array, failed: pa.BooleanArray, precision: int, scale: int
) -> list[tuple[pa.BooleanArray, str]]:
    """(rows, reason) for the values flagged in `failed`: too many decimal places, or too
    many digits before the point (or not a number at all, for a typed source's oddities)."""
    rows = pc.indices_nonzero(failed).to_pylist()
    texts = pc.cast(values.take(rows), pa.string()).to_pylist()
    too_precise, too_large, too_long, not_numbers = [], [], [], []
    for row, text in zip(rows, texts, strict=True):
        try:
            value = Decimal((text or "").strip())
        except InvalidOperation:
            not_numbers.append(row)
            continue
        if not value.is_finite():
            not_numbers.append(row)
        elif _decimal_places(value) > scale:
            too_precise.append(row)
        elif value and value.adjusted() + 1 > precision - scale:
            too_large.append(row)
        else:  # fits, but written with more digits (zeros) than a decimal128 parses
            too_long.append(row)
    spelled = f"decimal({precision},{scale})"
    return [
        (mask, reason)
        for positions, reason in (
            (not_numbers, REASON_NOT_DECIMAL),
            (too_precise, f"more than {scale} decimal places (the column is {spelled})"),
            (
                too_large,
                f"more than {precision - scale} digits before the decimal point "
                f"(the column is {spelled})",
            ),
            (too_long, "more than 38 digits written (zeros included): not read exactly"),
        )
        if positions
        for mask in [mask_at(len(values), positions)]
    ]


def _decimal_places(value: Decimal) -> int:
    """Digits after the point that are not trailing zeros (normalize() would round to the
    context's 28 digits, so the zeros are counted from the digit tuple)."""
    _, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # finite, checked by the caller
    if not any(digits):
        return 0
    trailing = len(digits) - len("".join(map(str, digits)).rstrip("0"))
    return max(0, -(exponent + trailing))
