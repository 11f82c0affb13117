"""Sanity suite (after what GDRCopy's users rely on), run against every backend.

Each test names what it asserts.  Data written through a mapping is checked on
the device side (cuMemcpyDtoH on a GPU; the sim allocation's pages on sim)
and the reverse.
"""

from __future__ import annotations

import gc
import os
import random
import threading

import numpy as np
import pytest

import gdrpy
from gdrpy import errors

PAGE = 65536


def test_pin_unpin_reports_range(ctx, alloc):
    buf = alloc(3 * PAGE)
    pin = ctx.pin(buf)
    assert pin.addr == buf.ptr and pin.size == 3 * PAGE
    assert pin.va <= pin.addr and pin.va + pin.mapped_size >= pin.addr + pin.size
    info = pin.info()
    assert info["mapped"] is False and info["mapping_type"] == "none"
    pin.close()
    assert pin.closed
    pin.close()  # idempotent
    with pytest.raises(errors.ClosedError):
        pin.map()


def test_map_unmap_gives_mapping_of_pinned_size(ctx, alloc):
    buf = alloc(PAGE)
    with ctx.pin(buf) as pin:
        m = pin.map()
        assert len(m) == PAGE and m.size == PAGE
        assert pin.info()["mapped"] is True
        assert m.mapping_type in ("wc", "caching")
        if ctx.backend != "sim":
            assert m.mapping_type == "wc"
        m.close()
        assert pin.info()["mapped"] is False
        m2 = pin.map()  # map again after unmap works
        m2.close()


@pytest.mark.parametrize("size", [1, 2, 3, 7, 8, 63, 64, 65, 4096, 65536, 65536 + 1, 1 << 20])
def test_walking_bits_every_offset_host_to_device(ctx, alloc, size):
    buf = alloc(size + 64)
    with ctx.pin(buf) as pin, pin.map() as m:
        offsets = range(64) if size <= 65536 else (0, 1, 13, 63)
        for off in offsets:
            data = _walking_bits(size, off)
            assert m.write(off, data) == size
            assert alloc.device_read(buf.ptr + off, size) == data, f"offset {off}"


@pytest.mark.parametrize("size", [1, 2, 3, 7, 8, 63, 64, 65, 4096, 65536, 1 << 20])
def test_walking_bits_every_offset_device_to_host(ctx, alloc, size):
    buf = alloc(size + 64)
    with ctx.pin(buf) as pin, pin.map() as m:
        offsets = range(64) if size <= 4096 else (0, 1, 13, 63)
        for off in offsets:
            data = _walking_bits(size, off + 7)
            alloc.device_write(buf.ptr + off, data)
            assert m.read(off, size) == data, f"offset {off}"
            out = bytearray(size + 3)
            assert m.read(off, size, out=out) is out
            assert bytes(out[:size]) == data and out[size:] == b"\0\0\0"


def _walking_bits(n, seed):
    a = np.arange(n, dtype=np.uint64)
    return ((np.uint64(1) << ((a + np.uint64(seed)) % np.uint64(8))).astype(np.uint8)
            ^ (a * np.uint64(31 + seed)).astype(np.uint8)).tobytes()


def test_write_accepts_every_buffer_kind(ctx, alloc):
    buf = alloc(4096)
    with ctx.pin(buf) as pin, pin.map() as m:
        for data in (b"abcdefgh", bytearray(b"ABCDEFGH"), memoryview(b"12345678"),
                     np.arange(8, dtype=np.uint8), np.arange(2, dtype=np.float32)):
            m.write(100, data)
            assert alloc.device_read(buf.ptr + 100, len(bytes(data))) == bytes(data)
        m.write(0, np.arange(1024, dtype=np.uint32)[::1])
        assert np.frombuffer(m.read(0, 4096), np.uint32).tolist() == list(range(1024))


def test_numpy_view_aliases_device_memory(ctx, alloc):
    buf = alloc(PAGE)
    with ctx.pin(buf) as pin, pin.map() as m:
        view = np.asarray(m)
        assert view.shape == (PAGE,) and view.dtype == np.uint8
        view[10:14] = [1, 2, 3, 4]
        assert alloc.device_read(buf.ptr + 10, 4) == b"\x01\x02\x03\x04"
        alloc.device_write(buf.ptr + 20, b"\x09\x08")
        assert view[20] == 9 and view[21] == 8
        with pytest.raises(errors.BusyError):
            m.close()  # a live view would dangle
        del view
        gc.collect()
        m.close()


def test_unaligned_pin_maps_exactly_the_user_range(ctx, alloc):
    buf = alloc(4 * PAGE)
    alloc.device_write(buf.ptr, b"\x11" * (4 * PAGE))
    addr = buf.ptr + PAGE + 1000
    with ctx.pin(addr, size=5000) as pin, pin.map() as m:
        assert pin.addr == addr and len(m) == 5000
        assert pin.va <= addr < addr + 5000 <= pin.va + pin.mapped_size
        m.write(0, b"\xaa" * 5000)
        assert alloc.device_read(addr, 5000) == b"\xaa" * 5000
        # the bytes around the pinned range are untouched
        assert alloc.device_read(addr - 1000, 1000) == b"\x11" * 1000
        assert alloc.device_read(addr + 5000, 1000) == b"\x11" * 1000
        with pytest.raises(errors.OutOfRangeError):
            m.write(4999, b"ab")


def test_two_small_buffers_in_one_page_are_independent(ctx, alloc):
    buf = alloc(PAGE)
    alloc.device_write(buf.ptr, bytes(64))
    a, b = buf.ptr + 8, buf.ptr + 40
    with ctx.pin(a, size=8) as pa, ctx.pin(b, size=8) as pb, pa.map() as ma, pb.map() as mb:
        ma.write(0, b"AAAAAAAA")
        mb.write(0, b"BBBBBBBB")
        assert alloc.device_read(buf.ptr, 64) == (
            bytes(8) + b"A" * 8 + bytes(24) + b"B" * 8 + bytes(16))
        assert ma.read(0, 8) == b"A" * 8 and mb.read(0, 8) == b"B" * 8


@pytest.mark.parametrize("off,n", [(0, 4097), (4096, 1), (4095, 2), (2**62, 1), (1, 2**62)])
def test_out_of_range_is_refused_before_touching_memory(ctx, alloc, off, n):
    buf = alloc(2 * 4096)
    alloc.device_write(buf.ptr, b"\x5a" * 8192)
    with ctx.pin(buf.ptr, size=4096) as pin, pin.map() as m:
        with pytest.raises(errors.OutOfRangeError):
            m.write(off, b"\x01" * min(n, 8192))
        with pytest.raises(errors.OutOfRangeError):
            m.read(off, n)
        with pytest.raises(errors.OutOfRangeError):
            pin.ce_write(off, b"\x01" * min(n, 8192))
    assert alloc.device_read(buf.ptr, 8192) == b"\x5a" * 8192


def test_negative_offsets_and_sizes_are_refused(ctx, alloc):
    buf = alloc(4096)
    with ctx.pin(buf) as pin, pin.map() as m:
        with pytest.raises(ValueError):
            m.write(-1, b"x")
        with pytest.raises(ValueError):
            m.read(0, -5)
        with pytest.raises(ValueError):
            m.read(-(2**70), 1)


def test_double_unmap_is_harmless(ctx, alloc):
    buf = alloc(PAGE)
    with ctx.pin(buf) as pin:
        m = pin.map()
        m.close()
        m.close()
        assert pin.info()["mapped"] is False


def test_double_map_is_refused(ctx, alloc):
    buf = alloc(PAGE)
    with ctx.pin(buf) as pin:
        m = pin.map()
        with pytest.raises(errors.AlreadyMappedError):
            pin.map()
        m.close()


def test_unpin_while_mapped_unmaps_first(ctx, alloc):
    buf = alloc(PAGE)
    pin = ctx.pin(buf)
    m = pin.map()
    pin.close()
    assert m.closed and pin.closed
    with pytest.raises(errors.ClosedError):
        m.write(0, b"x")


def test_use_after_context_close_raises(backend, alloc):
    ctx = alloc.ctx
    buf = alloc(PAGE)
    c2 = gdrpy.open(0, backend)
    pin = c2.pin(buf)
    m = pin.map()
    c2.close()
    assert c2.closed and pin.closed and m.closed
    for call in (lambda: m.write(0, b"x"), lambda: m.read(0, 1), lambda: pin.map(),
                 lambda: c2.pin(buf), lambda: memoryview(m), lambda: pin.ce_read(0, 1)):
        with pytest.raises(errors.ClosedError):
            call()
    c2.close()  # idempotent
    assert ctx.closed is False


def test_context_close_refuses_while_views_are_alive(backend, alloc):
    buf = alloc(PAGE)
    c2 = gdrpy.open(0, backend)
    m = c2.pin(buf).map()
    v = memoryview(m)
    with pytest.raises(errors.BusyError):
        c2.close()
    assert not m.closed  # nothing was torn down
    v.release()
    c2.close()
    assert m.closed


def test_dropping_objects_releases_everything(ctx, alloc):
    buf = alloc(PAGE)
    for _ in range(200):
        m = ctx.pin(buf).map()
        m.write(0, b"z")
        del m
    gc.collect()
    # Nothing is left pinned: a fresh map of the whole buffer works.
    with ctx.pin(buf) as p, p.map() as m:
        assert m.read(0, 1) == b"z"


def test_pin_in_one_thread_map_and_copy_in_others(ctx, alloc):
    buf = alloc(16 * 4096)
    pins = [ctx.pin(buf.ptr + i * 4096, size=4096) for i in range(16)]
    errs = []

    def worker(i):
        try:
            with pins[i].map() as m:
                payload = bytes([i]) * 4096
                for _ in range(20):
                    m.write(0, payload)
                    assert m.read(0, 4096) == payload
        except Exception as e:  # pragma: no cover - reported below
            errs.append(e)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errs, errs
    data = alloc.device_read(buf.ptr, 16 * 4096)
    for i in range(16):
        assert data[i * 4096:(i + 1) * 4096] == bytes([i]) * 4096
    for p in pins:
        p.close()


def test_concurrent_large_copies_release_the_gil_and_stay_correct(ctx, alloc):
    n = 1 << 20
    buf = alloc(4 * n)
    with ctx.pin(buf) as pin, pin.map() as m:
        def w(i):
            m.write(i * n, bytes([i + 1]) * n)
        ts = [threading.Thread(target=w, args=(i,)) for i in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        for i in range(4):
            assert m.read(i * n, n) == bytes([i + 1]) * n


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_gets_error_not_parent_memory(ctx, alloc):
    buf = alloc(PAGE)
    secret = b"parent-secret-42"
    pin = ctx.pin(buf)
    m = pin.map()
    m.write(0, secret)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: every access must fail cleanly
        code = 0
        try:
            for call in (lambda: m.read(0, 16), lambda: m.write(0, b"x"),
                         lambda: bytes(memoryview(m)[:16]), lambda: pin.map(),
                         lambda: ctx.pin(buf)):
                try:
                    got = call()
                    if got is not None and secret in bytes(got):
                        code |= 1
                    code |= 2
                except errors.WrongProcessError:
                    pass
                except Exception:
                    code |= 4
        finally:
            os.write(w, bytes([code]))
            os._exit(0)
    os.close(w)
    code = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert code == b"\0", f"child flags {code!r}: 1 leak, 2 no error, 4 wrong error"
    assert m.read(0, len(secret)) == secret  # parent still fine
    m.close()
    pin.close()


def test_context_is_usable_as_context_manager_and_reports_backend(backend):
    with gdrpy.open(0, backend) as c:
        assert c.backend == backend
        assert backend in repr(c)
        assert c.is_sim == (backend == "sim")
        info = c.info
        assert info["backend"] == backend
    assert c.closed


def test_freed_memory_stays_reachable_through_a_live_pin(ctx):
    buf = gdrpy.memory.alloc(PAGE, ctx=ctx)
    pin = ctx.pin(buf)
    m = pin.map()
    m.write(0, b"keep")
    buf.close()  # freed by the allocator while pinned
    assert m.read(0, 4) == b"keep"
    other = gdrpy.memory.alloc(PAGE, ctx=ctx)
    try:
        ctx.memcpy_htod(other.ptr, b"new!")
        assert m.read(0, 4) == b"keep"  # never aliases a new allocation
    finally:
        m.close()
        pin.close()
        other.close()


def test_copy_engine_path_matches_mapping_path(ctx, alloc):
    buf = alloc(1 << 20)
    rnd = random.Random(7)
    with ctx.pin(buf) as pin, pin.map() as m:
        for n in (1, 8, 4096, 100000):
            off = rnd.randrange(0, (1 << 20) - n)
            data = rnd.randbytes(n)
            pin.ce_write(off, data)
            assert m.read(off, n) == data
            data2 = rnd.randbytes(n)
            m.write(off, data2)
            assert pin.ce_read(off, n) == data2


def test_write_u64_is_one_aligned_store_visible_on_the_device(ctx, alloc):
    buf = alloc(4096)
    with ctx.pin(buf) as pin, pin.map() as m:
        m.write_u64(8, 0x1122334455667788)
        assert alloc.device_read(buf.ptr + 8, 8) == (0x1122334455667788).to_bytes(8, "little")
        alloc.device_write(buf.ptr + 16, (2**64 - 2).to_bytes(8, "little"))
        assert m.read_u64(16) == 2**64 - 2
        with pytest.raises(errors.InvalidArgumentError):
            m.write_u64(3, 1)          # unaligned
        with pytest.raises(errors.OutOfRangeError):
            m.write_u64(4096, 1)       # past the end
        with pytest.raises(errors.InvalidArgumentError):
            m.write_u64(0, 2**64)
        with pytest.raises(TypeError):
            m.write_u64(0, 1.0)


def test_dlpack_export_aliases_memory_and_releases_its_owner(sim_ctx):
    import sys
    buf = gdrpy.memory.alloc(4096, ctx=sim_ctx)
    sim_ctx.memcpy_htod(buf.ptr, b"dlpack!")
    refs = sys.getrefcount(buf)
    arr = np.from_dlpack(buf)             # consumed: numpy owns the deleter
    assert arr.dtype == np.uint8 and arr.shape == (4096,)
    assert arr[:7].tobytes() == b"dlpack!"
    assert sys.getrefcount(buf) == refs + 1  # the export keeps its owner alive
    del arr
    gc.collect()
    assert sys.getrefcount(buf) == refs
    cap = buf.__dlpack__()                # never consumed: the capsule releases it
    assert sys.getrefcount(buf) == refs + 1
    del cap
    gc.collect()
    assert sys.getrefcount(buf) == refs
    buf.close()


def _layout():
    """Copy-kernel layout: (dst_offset_in_pin, src_misalignment, size) for every size 1..4096 and
    every destination misalignment 0..63 over a sweep of sizes, with a
    128-byte guard gap after each copy."""
    cases, cur = [], 0
    sweep = [(s, d) for s in range(1, 4097) for d in ((s * 13) % 64,)]
    sweep += [(s, d) for d in range(64) for s in (1, 7, 63, 64, 65, 127, 4096 + 17, 65536 + 3)]
    for i, (s, d) in enumerate(sweep):
        cur = (cur + 63) & ~63
        cases.append((cur + d, (i * 7 + s) % 64, s))
        cur += d + s + 128
    return cases, cur


@pytest.mark.parametrize("isa", gdrpy.copy_isa_available())
def test_every_kernel_every_size_and_misalignment_through_the_mapping(ctx, alloc, isa):
    if isa == "ls64" and ctx.backend == "sim":
        pytest.skip("LD64B/ST64B fault on ordinary host memory (the sim backend): "
                    "device mappings only")
    cases, total = _layout()
    b = alloc(total + 4096)
    rng = np.random.default_rng(5)
    host = rng.integers(0, 256, 65536 + 4096 + 128, dtype=np.uint8)
    gdrpy.set_copy_isa(isa)
    try:
        with ctx.pin(b) as p, p.map() as m:
            # writes: background 0xEE must survive around every copy
            alloc.device_write(b.ptr, b"\xee" * (total + 4096))
            expect = bytearray(b"\xee" * (total + 4096))
            for off, soff, s in cases:
                src = memoryview(host)[soff:soff + s]
                m.write(off, src)
                expect[off:off + s] = src
            got = alloc.device_read(b.ptr, total + 4096)
            if got != bytes(expect):
                bad = next(i for i in range(len(got)) if got[i] != expect[i])
                raise AssertionError(f"{isa}: write mismatch at device offset {bad}")
            # reads: destination guards in host memory stay untouched
            dev = rng.integers(0, 256, total + 4096, dtype=np.uint8).tobytes()
            alloc.device_write(b.ptr, dev)
            out = np.full(65536 + 4096 + 256, 0x5A, np.uint8)
            for off, soff, s in cases:
                out[:] = 0x5A
                m.read(off, s, out=memoryview(out)[64 + soff:64 + soff + s])
                assert out[64 + soff:64 + soff + s].tobytes() == dev[off:off + s], (isa, off, s)
                assert not (out[:64 + soff] != 0x5A).any() and \
                    not (out[64 + soff + s:] != 0x5A).any(), (isa, "guard", off, s)
    finally:
        gdrpy.set_copy_isa("auto")
