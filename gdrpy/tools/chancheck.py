"""The channel's check pattern and checksum in Python (numpy).

The same definitions as ``gdrpy_chan_pattern`` / ``gdrpy_chan_checksum`` in
native/src/channel/channel.c, which the sim consumer and the GPU kernels
(tools/channel_kernels.cu) check and answer with:

* pattern of message ``i``, ``n`` bytes: bytes 0..7 are ``i`` (little endian,
  the low 8 bytes), byte ``k >= 8`` is ``(i * 131 + k) & 0xff``;
* checksum of a payload: ``sum(byte[k] * ((k & 255) + 1)) mod 2**32``.

Benchmarks and tests build their messages and expected answers with these.
"""

from __future__ import annotations

import numpy as np

__all__ = ["checksum", "checksums", "pattern", "patterns"]


def patterns(first: int, n: int, size: int) -> np.ndarray:
    """Messages ``first .. first + n - 1``'s check patterns, ``size`` bytes
    each, as the rows of an (n, size) uint8 array."""
    first, n, size = int(first), int(n), int(size)
    if first < 0 or n < 0 or size < 0 or first + n > 1 << 64:
        raise ValueError(f"patterns({first}, {n}, {size}): want messages 0 .. 2**64 - 1 "
                         "and sizes >= 0")
    i = np.arange(n, dtype=np.uint64) + np.uint64(first)
    k = np.arange(size, dtype=np.uint64)
    rows = ((i[:, None] * np.uint64(131) + k[None, :]) & np.uint64(0xFF)).astype(np.uint8)
    head = min(8, size)
    rows[:, :head] = i.astype("<u8").view(np.uint8).reshape(n, 8)[:, :head]
    return rows


def pattern(i: int, n: int) -> bytes:
    """``n`` bytes of message ``i``'s check pattern (gdrpy_chan_pattern)."""
    return patterns(i, 1, n)[0].tobytes()


def checksums(rows: np.ndarray, lens=None) -> np.ndarray:
    """The checksum of every row of a 2-D uint8 array (a uint32 array);
    ``lens``: of row r only its first lens[r] bytes."""
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.dtype != np.uint8:
        raise ValueError(f"checksums: want a 2-D uint8 array, got {rows.ndim}-D {rows.dtype}")
    k = np.arange(rows.shape[1], dtype=np.uint64)
    w = (k & np.uint64(255)) + np.uint64(1)
    terms = rows.astype(np.uint64) * w
    if lens is not None:
        terms *= k[None, :] < np.asarray(lens, dtype=np.uint64)[:, None]
    s = terms.sum(axis=1, dtype=np.uint64)
    return (s & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def checksum(data) -> int:
    """The checksum of one payload (any buffer of bytes; gdrpy_chan_checksum)."""
    b = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    return int(checksums(b[None, :])[0])
