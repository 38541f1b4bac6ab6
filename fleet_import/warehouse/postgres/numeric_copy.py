"""Arrow decimal128 columns -> PostgreSQL's binary `numeric` fields, a whole column at a time.

The wire format (PostgreSQL's numeric_send/numeric_recv): int16 ndigits, int16 weight, uint16
sign (0x0000 positive, 0x4000 negative), uint16 dscale, then ndigits int16 digits in base
10000, most significant first, the value being sum(digit[i] * 10000^(weight - i)).

Why every row gets the same digit count: the digit groups a `decimal(p,s)` can need are known
from p and s, and PostgreSQL strips leading and trailing zero groups as it reads
(make_result), so one fixed-size record per row lets the encoder scatter the whole column in
one assignment, as it does for the other fixed-width types. The base-10000 groups are cut
from the 128-bit values by long division over their four 32-bit limbs, in numpy: no Python
loop over rows.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_NBASE_DIGITS = 4
_NBASE = 10**_NBASE_DIGITS
_SIGN_NEGATIVE = 0x4000
_LIMBS = 4  # a decimal128 value: four little-endian 32-bit limbs, two's complement
_LIMB_BITS = 32
_LIMB_MASK = (1 << _LIMB_BITS) - 1


class NumericOverflow(ValueError):
    """A decimal128 value holds more digits than its type's precision."""


def numeric_groups(precision: int, scale: int) -> tuple[int, int]:
    """(base-10000 groups before the decimal point, groups after it) of `decimal(p,s)`."""
    return -(-(precision - scale) // _NBASE_DIGITS), -(-scale // _NBASE_DIGITS)


def numeric_records(column: pa.Array) -> np.ndarray:
    """One record per row: the field's length word, then the numeric's header and digits.
    Null rows hold a record too (their slots' bytes are arbitrary): the caller writes the
    NULL marker for them instead."""
    precision, scale = column.type.precision, column.type.scale
    whole_groups, fraction_groups = numeric_groups(precision, scale)
    ndigits = whole_groups + fraction_groups
    negative, limbs = _magnitude(column)
    digits = np.empty((len(column), ndigits), dtype=np.int64)
    position = ndigits - 1  # filled from the least significant group up
    partial = scale % _NBASE_DIGITS
    if partial:
        # The last fractional group holds `partial` digits, padded on the right to four.
        digits[:, position] = _divide(limbs, 10**partial) * 10 ** (_NBASE_DIGITS - partial)
        position -= 1
    while position >= 0:
        digits[:, position] = _divide(limbs, _NBASE)
        position -= 1
    left_over = np.any(limbs != 0, axis=0)
    if column.null_count:
        left_over &= column.is_valid().to_numpy(zero_copy_only=False)
    if left_over.any():
        raise NumericOverflow(f"a value has more than {precision} digits ({column.type})")
    records = np.empty(
        len(column),
        dtype=np.dtype(
            [
                ("length", ">i4"),
                ("ndigits", ">i2"),
                ("weight", ">i2"),
                ("sign", ">u2"),
                ("dscale", ">u2"),
                ("digits", ">i2", (ndigits,)),
            ]
        ),
    )
    records["length"] = 8 + 2 * ndigits
    records["ndigits"] = ndigits
    records["weight"] = whole_groups - 1
    records["sign"] = np.where(negative, _SIGN_NEGATIVE, 0)
    records["dscale"] = scale
    records["digits"] = digits
    return records


def _magnitude(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(negative per row, |value| as limbs most significant first, shape (4, rows), uint64)."""
    words = np.frombuffer(
        column.buffers()[1], dtype="<u4", count=len(column) * _LIMBS, offset=column.offset * 16
    ).reshape(len(column), _LIMBS)
    limbs = words[:, ::-1].T.astype(np.uint64)
    negative = (limbs[0] >> np.uint64(_LIMB_BITS - 1)).astype(bool)
    # Two's complement: invert and add one, the carry running from the least significant limb.
    carry = negative.astype(np.uint64)
    flipped = np.where(negative, limbs ^ np.uint64(_LIMB_MASK), limbs)
    for index in range(_LIMBS - 1, -1, -1):
        total = flipped[index] + carry
        flipped[index] = total & np.uint64(_LIMB_MASK)
        carry = total >> np.uint64(_LIMB_BITS)
    return negative, flipped


def _divide(limbs: np.ndarray, divisor: int) -> np.ndarray:
    """Divide every row's number by `divisor` (at most 10000) in place; the remainders.
    A remainder shifted by 32 bits plus a limb stays below 2^46: uint64 never overflows."""
    remainder = np.zeros(limbs.shape[1], dtype=np.uint64)
    shift, base = np.uint64(_LIMB_BITS), np.uint64(divisor)
    for index in range(_LIMBS):
        current = (remainder << shift) | limbs[index]
        limbs[index] = current // base
        remainder = current % base
    return remainder.astype(np.int64)
