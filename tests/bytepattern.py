"""The staging tests' byte pattern, built cheaply.

Byte k of ``pattern(n, salt)`` is ``((k * 2654435761 + salt * 977) >> 7) & 0xff``
plus the number of its 32 KiB block, modulo 256.  The first term is bits 7..14
of the sum, which depend only on the sum modulo 2^15: it repeats every 32 KiB,
so one period is computed and repeated.  The block number is added so that a
chunk copied to an offset a multiple of 32 KiB away from its own (a staging
slot's size is one) reads as wrong bytes, not the same ones."""

from __future__ import annotations

import numpy as np

_A = 2654435761
PERIOD = 1 << 15


def pattern(n: int, salt: int = 0) -> np.ndarray:
    k = np.arange(min(n, PERIOD), dtype=np.uint32)
    one = (((k * np.uint32(_A % PERIOD) + np.uint32(salt * 977 % PERIOD)) % PERIOD) >> 7)
    one = one.astype(np.uint8)
    if n <= PERIOD:
        return one
    blocks = -(-n // PERIOD)
    out = np.resize(one, blocks * PERIOD).reshape(blocks, PERIOD)
    out += np.arange(blocks, dtype=np.uint64).astype(np.uint8)[:, None]   # wraps at 256
    return out.reshape(-1)[:n]
