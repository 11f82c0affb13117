"""Pins by GPU page (what UCX and GDRCopy clients ask for), on the sim backend:
a sim allocation stands for one chunk rounded to 64 KiB GPU pages, so the
rule "any range whose GPU pages lie in the chunk behind the allocation" is the
same one the nvrm backend applies to cuMemAlloc chunks (tests/test_gpu_kinds.py
runs the GPU side).  With GDRPY_SIM_BACKING=4k an allocation's memory ends at
the next 4 KiB, as CUDA's object behind a large cuMemAlloc does: the rest of
its last GPU page pins but stays unreachable (tests/test_gpu_pin_tail.py runs
cuMemAlloc(4 GiB + 2) on the GPU).  And pin flag FORCE_PCIE: refused on a
PCIe GPU (the sim's default), accepted on a coherent one (GDRPY_SIM_COHERENT=1)."""

from __future__ import annotations

import ctypes
import errno
import os
import signal

import pytest
from conftest import child_status

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


# ---- the last GPU page past the memory (issue 44) ---------------------------

N_TAIL = (1 << 20) + 2
OBJ = (N_TAIL + 4095) & ~4095      # where the memory behind it ends


@pytest.fixture
def tail_buf(monkeypatch):
    """1 MiB + 2 B whose memory ends at +1 MiB + 4 KiB, inside its last GPU page."""
    monkeypatch.setenv("GDRPY_SIM_BACKING", "4k")
    buf = gdrpy.memory.alloc(N_TAIL, kind="sim")
    monkeypatch.delenv("GDRPY_SIM_BACKING")
    yield buf
    buf.close()


@pytest.mark.parametrize("how", ["exact", "ucx", "libfabric"])
def test_last_gpu_page_pins_whole_and_its_tail_stays_unreachable(sim, tail_buf, how):
    ptr, end = tail_buf.ptr, tail_buf.ptr + N_TAIL
    lo, hi = {"exact": (ptr, end), "ucx": page_range(ptr, N_TAIL),
              "libfabric": (ptr & ~(PAGE - 1), (end & ~(PAGE - 1)) + PAGE)}[how]
    sim.memcpy_htod(end - 16, b"\x5a" * 16)
    with sim.pin(lo, size=hi - lo) as pin, pin.map() as m:
        whole = page_range(lo, hi - lo)[1] - lo
        assert (pin.va, pin.mapped_size, pin.backed_size) == (lo, whole, OBJ)
        assert pin.info()["backed_size"] == OBJ
        assert len(m) == min(hi - lo, OBJ)          # the Mapping stops at the memory's end
        assert m.read(N_TAIL - 16, 16) == b"\x5a" * 16
        m.write(N_TAIL - 8, b"\x01" * 8)
        assert bytes(sim.memcpy_dtoh(end - 8, 8)) == b"\x01" * 8
        with pytest.raises(errors.OutOfRangeError):
            m.write(OBJ - 4, b"\x00" * 8)
        if hi - lo > OBJ:                            # inside the pin: the core refuses it
            for call in (lambda: pin.ce_read(OBJ, 8), lambda: pin.ce_write(OBJ - 8, b"\0" * 16)):
                with pytest.raises(errors.OutOfRangeError) as ei:
                    call()
                assert ei.value.code == errno.ERANGE
                assert "memory behind the allocation" in ei.value.message
        # raw loads in a forked child: the memory's last byte reads (the child's
        # own zeros: nothing is inherited), past it they fault
        base = m.map_ptr
        assert child_status(lambda: ctypes.string_at(base + OBJ - 1, 1)) == 0
        st = child_status(lambda: ctypes.string_at(base + OBJ, 1))
        assert os.WIFSIGNALED(st) and os.WTERMSIG(st) in (signal.SIGSEGV, signal.SIGBUS), st


def test_ranges_past_the_last_page_or_starting_in_its_tail_are_refused(sim, tail_buf):
    lo, hi = page_range(tail_buf.ptr, N_TAIL)
    for addr, size in ((lo, hi - lo + PAGE), (tail_buf.ptr + OBJ + 64, 16)):
        with pytest.raises(errors.InvalidArgumentError):
            sim.pin(addr, size=size)


# ---- pin flag FORCE_PCIE (issue 44) -------------------------------------------

FORCE_PCIE = 1


def test_force_pcie_is_refused_on_a_pcie_gpu_with_gdrcopys_error(sim):
    buf = gdrpy.memory.alloc(PAGE, kind="sim")
    try:
        with pytest.raises(errors.NotSupportedError) as ei:
            sim.pin(buf.ptr, size=PAGE, flags=FORCE_PCIE)
        assert (ei.value.code, ei.value.code_name) == (524, "ENOTSUPP")
        assert "coherent" in ei.value.message
        with sim.pin(buf.ptr, size=PAGE) as pin:     # nothing left behind
            assert pin.size == PAGE
    finally:
        buf.close()


def test_force_pcie_is_accepted_on_a_coherent_gpu(monkeypatch):
    monkeypatch.setenv("GDRPY_SIM_COHERENT", "1")
    with gdrpy.open(0, "sim") as ctx:
        buf = gdrpy.memory.alloc(PAGE, kind="sim")
        try:
            with ctx.pin(buf.ptr, size=PAGE, flags=FORCE_PCIE) as pin, pin.map() as m:
                m.write(0, b"coherent")
            assert bytes(ctx.memcpy_dtoh(buf.ptr, 8)) == b"coherent"
        finally:
            buf.close()
