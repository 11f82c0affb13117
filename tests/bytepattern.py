"""The staging tests' byte pattern, built cheaply.

Byte k of ``pattern(n, salt)`` is ``((k * 2654435761 + salt * 977) >> 7) & 0xff``
(the tests used to compute exactly that in uint64 over the whole buffer: most
of their run time at their 9 MiB sizes).  The byte is bits 7..14 of the sum,
which depend only on the sum modulo 2^15, so the pattern repeats every 32 KiB:
one period is computed and repeated, giving the same bytes."""

from __future__ import annotations

import numpy as np

_A = 2654435761
PERIOD = 1 << 15


def pattern(n: int, salt: int = 0) -> np.ndarray:
    k = np.arange(min(n, PERIOD), dtype=np.uint32)
    one = (((k * np.uint32(_A % PERIOD) + np.uint32(salt * 977 % PERIOD)) % PERIOD) >> 7)
    one = one.astype(np.uint8)
    return one if n <= PERIOD else np.resize(one, n)
