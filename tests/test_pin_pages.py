"""Pins by GPU page (what UCX and GDRCopy clients ask for), on the sim backend:
a sim allocation stands for one chunk rounded to 64 KiB GPU pages, so the
rule "any range whose GPU pages lie in the chunk behind the allocation" is the
same one the nvrm backend applies to cuMemAlloc chunks (tests/test_gpu_kinds.py
runs the GPU side)."""

from __future__ import annotations

import errno

import pytest

import gdrpy
from gdrpy import errors

PAGE = 65536


@pytest.fixture
def sim():
    c = gdrpy.open(0, "sim")
    yield c
    c.close()


def page_range(ptr: int, n: int) -> tuple[int, int]:
    return ptr & ~(PAGE - 1), (ptr + n + PAGE - 1) & ~(PAGE - 1)


@pytest.mark.parametrize("size", [1, 8, 16, 4096, PAGE])
def test_ucx_page_range_of_a_small_allocation_pins_and_writes_only_the_buffer(sim, size):
    buf = gdrpy.memory.alloc(size, kind="sim")
    try:
        sim.memcpy_htod(buf.ptr, b"\x11" * size)
        lo, hi = page_range(buf.ptr, size)
        with sim.pin(lo, size=hi - lo) as pin, pin.map() as m:
            assert pin.va == lo and pin.mapped_size == hi - lo
            m.write(buf.ptr - lo, b"\x22" * size)
            with pytest.raises(errors.OutOfRangeError):
                m.write(hi - lo, b"\x00")
        assert bytes(sim.memcpy_dtoh(buf.ptr, size)) == b"\x22" * size
    finally:
        buf.close()


def test_interior_pointer_pin(sim):
    buf = gdrpy.memory.alloc(3 * PAGE, kind="sim")
    try:
        sim.memcpy_htod(buf.ptr, b"\x01" * (3 * PAGE))
        with sim.pin(buf.ptr + PAGE + 100, size=10) as pin, pin.map() as m:
            assert len(m) == 10
            m.write(0, b"0123456789")
            with pytest.raises(errors.OutOfRangeError):
                m.write(1, b"0123456789")
        whole = bytes(sim.memcpy_dtoh(buf.ptr, 3 * PAGE))
        assert whole[PAGE + 100:PAGE + 110] == b"0123456789"
        assert whole.count(b"\x01") == 3 * PAGE - 10
    finally:
        buf.close()


def test_range_past_the_chunk_is_refused(sim):
    buf = gdrpy.memory.alloc(16, kind="sim")
    try:
        with pytest.raises(errors.GdrError) as ei:
            sim.pin(buf.ptr, size=PAGE + 1)
        assert ei.value.code == errno.EINVAL
    finally:
        buf.close()
