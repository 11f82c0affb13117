"""Hypothesis drives libgdrapi.so.2 (GDRCopy's C ABI) through ctypes with random
sequences of gdr_open / pin / map / copy_to / copy_from / unmap / unpin / close
over shared handles from three threads at once (ctypes releases the GIL, so the
calls really overlap: copies race with unmaps and closes).  Every call must
return 0 or an errno from the documented set; no crash, no hang.  Handles go
stale on purpose (used after unpin/close, from another gdr_t).  The host side of
every copy is a buffer larger than any mapping, so an accepted copy can never
write outside it; the library must refuse every copy outside the mapping."""

from __future__ import annotations

import ctypes
import errno
import os
import threading

import pytest
from conftest import run_threads
from hypothesis import given
from hypothesis import strategies as st

import gdrpy

MB = 1 << 20
OK_CODES = {0, errno.EINVAL, errno.EAGAIN, errno.EBUSY, errno.ENOMEM}


class MH(ctypes.Structure):
    _fields_ = [("h", ctypes.c_ulong)]


def _lib() -> ctypes.CDLL:
    path = os.environ.get("GDRPY_FUZZ_GDRAPI") or os.path.join(gdrpy.libdir(), "libgdrapi.so.2")
    if not os.path.exists(path):
        path = os.path.join(os.path.dirname(__file__), "..", "..", "native", "build",
                            "libgdrapi.so.2")
    lib = ctypes.CDLL(path)
    V, U, S = ctypes.c_void_p, ctypes.c_ulong, ctypes.c_size_t
    lib.gdr_open.restype = V
    lib.gdr_open.argtypes = []
    sigs = {"gdr_close": [V], "gdr_pin_buffer": [V, U, S, ctypes.c_uint64, ctypes.c_uint32, V],
            "gdr_unpin_buffer": [V, MH], "gdr_map": [V, MH, V, S], "gdr_unmap": [V, MH, V, S],
            "gdr_copy_to_mapping": [MH, V, V, S], "gdr_copy_from_mapping": [MH, V, V, S],
            "gdr_get_info_v2": [V, MH, V], "gdrpy_sim_alloc": [S, V]}
    for name, args in sigs.items():
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = ctypes.c_int
    return lib


@pytest.fixture(scope="module")
def env():  # type: ignore[no-untyped-def]
    if os.environ.get("GDRPY_FUZZ_BACKEND", "sim") != "sim":
        pytest.skip("the C-ABI fuzz allocates sim memory; on a GPU the sweep covers the ABI")
    old = os.environ.get("GDRPY_BACKEND")
    os.environ["GDRPY_BACKEND"] = "sim"
    lib = _lib()
    bufs = []
    for _ in range(4):
        p = ctypes.c_uint64()
        assert lib.gdrpy_sim_alloc(MB, ctypes.byref(p)) == 0
        bufs.append(p.value)
    yield lib, bufs
    if old is None:
        del os.environ["GDRPY_BACKEND"]
    else:
        os.environ["GDRPY_BACKEND"] = old


OPS = ["open", "pin", "map", "to", "from", "unmap", "unpin", "close"]
op_st = st.tuples(st.integers(0, 2), st.sampled_from(OPS), st.integers(0, 7),
                  st.integers(-4096, MB + 4096), st.integers(0, MB + 4096))


@given(st.lists(op_st, min_size=1, max_size=40))
def test_random_gdrapi_sequences_from_three_threads(env, ops: list) -> None:  # type: ignore[no-untyped-def]
    lib, bufs = env
    lock = threading.Lock()
    gs: list[int] = [lib.gdr_open()]
    assert gs[0]
    handles: list[list] = []       # [g, MH, va or 0]
    host = ctypes.create_string_buffer(4 * MB)
    for b in bufs[:2]:          # start with two mapped handles, so copies happen
        mh = MH()
        assert lib.gdr_pin_buffer(gs[0], b, MB, 0, 0, ctypes.byref(mh)) == 0
        vp = ctypes.c_void_p()
        assert lib.gdr_map(gs[0], mh, ctypes.byref(vp), MB) == 0
        handles.append([gs[0], mh, vp.value])
    bad: list[str] = []
    barrier = threading.Barrier(3)

    def pick(seq: list, i: int):  # type: ignore[no-untyped-def]
        with lock:
            return seq[i % len(seq)] if seq else None

    def check(rc: int, what: str) -> None:
        if rc not in OK_CODES:
            bad.append(f"{what} returned {rc}")

    def worker(tid: int) -> None:
        barrier.wait()
        for t, op, i, off, n in ops:
            if t != tid:
                continue
            if op == "open":
                g = lib.gdr_open()
                if g:
                    with lock:
                        gs.append(g)
            elif op == "pin":
                g = pick(gs, i)
                mh = MH()
                rc = lib.gdr_pin_buffer(g, bufs[i % len(bufs)], MB, 0, 0, ctypes.byref(mh))
                check(rc, "pin")
                if rc == 0:
                    with lock:
                        handles.append([g, mh, 0])
            elif op == "close":
                g = pick(gs, i)
                check(lib.gdr_close(g), "close")
            else:
                h = pick(handles, i)
                if h is None:
                    continue
                g, mh, va = h
                if op == "map":
                    vp = ctypes.c_void_p()
                    rc = lib.gdr_map(g, mh, ctypes.byref(vp), MB)
                    check(rc, "map")
                    if rc == 0:
                        h[2] = vp.value
                elif op == "unmap":
                    check(lib.gdr_unmap(g, mh, va or None, MB), "unmap")
                elif op == "unpin":
                    check(lib.gdr_unpin_buffer(g, mh), "unpin")
                elif va:
                    # a burst, so that copies overlap the other threads' teardown
                    ptr = va + off
                    fn = lib.gdr_copy_to_mapping if op == "to" else lib.gdr_copy_from_mapping
                    for _ in range(16):
                        rc = fn(mh, ptr, host, n) if op == "to" else fn(mh, host, ptr, n)
                        check(rc, "copy_" + op)
                        if rc:
                            break

    run_threads(worker, 3)
    assert not bad, bad[:5]
    for g in gs:
        lib.gdr_close(g)


@given(st.integers(0, MB - 1), st.integers(1, MB), st.integers(0, 2 * MB), st.booleans())
def test_info_and_map_sizes_are_the_pinned_range(  # type: ignore[no-untyped-def]
        env, off: int, n: int, msize: int, aligned: bool) -> None:
    """Issue 45: gdr_get_info reports the range the backend pinned (covering
    the request), gdr_map accepts exactly the sizes up to it, and a copy ends
    at its last byte and never past it."""
    lib, bufs = env
    if aligned:
        off &= ~0xFFFF
    n = min(n, MB - off)
    addr = bufs[2] + off
    g = lib.gdr_open()
    assert g
    try:
        mh = MH()
        assert lib.gdr_pin_buffer(g, addr, n, 0, 0, ctypes.byref(mh)) == 0
        info = ctypes.create_string_buffer(48)
        assert lib.gdr_get_info_v2(g, mh, info) == 0
        va = int.from_bytes(info.raw[0:8], "little")
        ms = int.from_bytes(info.raw[8:16], "little")
        assert va <= addr and va + ms >= addr + n, (hex(va), ms, hex(addr), n)
        vp = ctypes.c_void_p()
        rc = lib.gdr_map(g, mh, ctypes.byref(vp), msize)
        want = 0 if (addr & 0xFFFF) == 0 and 1 <= msize <= ms else errno.EINVAL
        assert rc == want, (rc, hex(addr), msize, ms)
        if rc == 0:
            host = ctypes.create_string_buffer(16)
            assert lib.gdr_copy_to_mapping(mh, vp.value + ms - 8, host, 8) == 0
            assert lib.gdr_copy_to_mapping(mh, vp.value + ms - 4, host, 8) == errno.EINVAL
            assert lib.gdr_copy_from_mapping(mh, host, vp.value + ms, 1) == errno.EINVAL
            assert lib.gdr_unmap(g, mh, vp, msize) == 0
        assert lib.gdr_unpin_buffer(g, mh) == 0
    finally:
        lib.gdr_close(g)
