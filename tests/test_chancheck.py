"""gdrpy.tools.chancheck against the C definitions it mirrors
(gdrpy_chan_pattern / gdrpy_chan_checksum in native/src/channel/channel.c):
called through ctypes on the shared library, and as the sim consumer checks
and answers messages."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

import gdrpy
from gdrpy.tools.chancheck import checksum, checksums, pattern, patterns

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = [0, 1, 7, 8, 9, 63, 64, 255, 256, 257, 1000, 4099]
MESSAGES = [0, 1, 2, 255, 256, 12345, 2**32 - 1, 2**32 + 7, 2**63 + 5, 2**64 - 1]


@pytest.fixture(scope="module")
def libgdrpy():
    for d in (os.path.join(ROOT, "native", "build"), gdrpy.libdir()):
        path = os.path.join(d, "libgdrpy.so.0")
        if os.path.exists(path):
            lib = ctypes.CDLL(path)
            lib.gdrpy_chan_pattern.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
            lib.gdrpy_chan_pattern.restype = None
            lib.gdrpy_chan_checksum.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
            lib.gdrpy_chan_checksum.restype = ctypes.c_uint32
            return lib
    pytest.skip("libgdrpy.so.0 not built (make -C native lib)")


def _c_pattern(lib, i: int, n: int) -> bytes:
    buf = ctypes.create_string_buffer(max(n, 1))
    lib.gdrpy_chan_pattern(i, buf, n)
    return buf.raw[:n]


@pytest.mark.parametrize("i", MESSAGES)
def test_pattern_is_the_c_pattern(libgdrpy, i):
    for n in SIZES:
        assert pattern(i, n) == _c_pattern(libgdrpy, i, n), (i, n)


def test_checksum_is_the_c_checksum(libgdrpy):
    rng = np.random.default_rng(7)
    for n in SIZES + [65536 + 17]:
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        want = libgdrpy.gdrpy_chan_checksum(data, n)
        assert checksum(data) == want, n
        assert checksum(bytearray(data)) == want and checksum(np.frombuffer(data, np.uint8)) == want
    # the largest sum a byte can add: 255 * 256 per byte, wrapping at 2**32
    big = b"\xff" * (1 << 20)
    assert checksum(big) == libgdrpy.gdrpy_chan_checksum(big, len(big))


def test_rows_helpers_agree_with_the_single_ones():
    rows = patterns(2**64 - 3, 3, 40)
    for r, i in zip(rows, range(2**64 - 3, 2**64), strict=True):
        assert r.tobytes() == pattern(i, 40)
        assert int(checksums(r[None, :])[0]) == checksum(r)
    lens = np.array([0, 9, 40])
    assert checksums(rows, lens).tolist() == [checksum(r[:n]) for r, n in zip(rows, lens,
                                                                               strict=True)]


@pytest.mark.parametrize("bad", [lambda: pattern(-1, 4), lambda: pattern(0, -1),
                                 lambda: patterns(2**64 - 1, 2, 8),
                                 lambda: checksums(np.zeros(4, np.uint8)),
                                 lambda: checksums(np.zeros((1, 4), np.uint16))])
def test_bad_arguments_raise_value_error(bad):
    with pytest.raises(ValueError):
        bad()


def test_the_sim_consumer_accepts_the_pattern_and_answers_the_checksum():
    """The sim consumer checks every payload against gdrpy_chan_pattern and
    answers with gdrpy_chan_checksum: the Python pattern passes, one wrong
    byte is counted, and every answer is the Python checksum."""
    comp = np.dtype([("seq", "<u8"), ("csum", "<u4"), ("len", "<u4")])
    with gdrpy.open(0, "sim") as ctx, \
            gdrpy.Channel(ctx, nslots=16, slot_size=512, comp_size=16) as ch:
        h = ch._sim_consumer(check=True, complete=True)
        for i, n in enumerate([1, 8, 9, 64, 65, 300, 512]):
            payload = bytearray(pattern(i, n))
            if i == 5:
                payload[200] ^= 1
            ch.send(bytes(payload), tag=i)
            r = np.frombuffer(ch.recv(timeout=5), dtype=comp)[0]
            assert (int(r["seq"]), int(r["csum"]), int(r["len"])) == (i + 1, checksum(payload), n)
        ch.shutdown()
        assert ch._sim_join(h) == (7, 1, 5)
