"""Regression tests for lifetime and concurrency edge cases found in review:
reference cycles, closing while another thread copies, views that outlive
their buffer, bare construction, integer-like arguments."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import gdrpy
from gdrpy import errors


def test_mapping_with_a_transfer_is_released_when_dropped(ctx, alloc):
    buf = alloc(65536)
    base = ctx.live_objects()
    for _ in range(3):
        pin = ctx.pin(buf)
        m = pin.map()
        m.transfer().put(0, b"cycle")   # Mapping <-> Transfer reference cycle
        del m, pin
        gc.collect()
        assert ctx.live_objects() == base


def test_close_during_a_copy_in_another_thread_keeps_state_consistent(sim_ctx):
    n = 64 << 20
    buf = gdrpy.memory.alloc(n, ctx=sim_ctx)
    pin = sim_ctx.pin(buf)
    m = pin.map()
    data = np.ones(n, np.uint8)
    stop = threading.Event()
    refused, failed = [], []

    def copier():
        while not stop.is_set():
            try:
                pin.ce_write(0, data)
            except errors.BusyError:
                # the pin is being unmapped right now: a clear, retryable refusal
                refused.append(1)
            except Exception as e:  # anything else fails the test below
                failed.append(e)
                return

    t = threading.Thread(target=copier)
    t.start()
    busy = 0
    try:
        for _ in range(50):
            try:
                m.close()
                break
            except errors.BusyError:
                busy += 1
                assert not m.closed       # refused: still mapped and usable
                assert m.read(0, 1) in (b"\x00", b"\x01")
    finally:
        stop.set()
        t.join()
    assert not failed, failed
    m.close()
    assert m.closed
    pin.close()
    assert pin.closed and sim_ctx.live_objects() == 0
    buf.close()


def test_sim_numpy_view_keeps_the_buffer_alive_and_blocks_close(sim_ctx):
    a = gdrpy.memory.alloc(65536, ctx=sim_ctx).numpy()
    gc.collect()
    a[0] = 7                             # the buffer lives as long as the view
    assert a[0] == 7 and a.flags.writeable
    buf = gdrpy.memory.alloc(4096, ctx=sim_ctx)
    v = buf.numpy()
    with pytest.raises(errors.BusyError):
        buf.close()
    del v
    gc.collect()
    buf.close()


def test_sim_free_during_a_copy_engine_copy_does_not_crash(sim_ctx):
    n = 64 << 20
    buf = gdrpy.memory.alloc(n, ctx=sim_ctx)
    pin = sim_ctx.pin(buf)
    data = np.ones(n, np.uint8)
    errs = []

    def copier():
        for _ in range(5):
            try:
                pin.ce_write(0, data)
            except errors.GdrError as e:      # after the free: not live memory
                errs.append(e)

    t = threading.Thread(target=copier)
    t.start()
    buf.close()
    t.join()
    assert all(isinstance(e, errors.InvalidArgumentError) for e in errs)
    pin.close()


def _pin_and_map(ctx, bufs, got, bar):
    bar.wait()
    for b in bufs:
        try:
            got.append(ctx.pin(b).map())
        except errors.GdrError:    # closed or being closed: refused
            pass


def test_context_close_never_leaves_another_threads_new_mapping_open():
    """Context.close() closes its pins, then gdrpy_close() tears down every
    pin left in C.  A pin + map made by another thread while close() waits
    (its pins' unmaps release the GIL) used to escape the list: the Mapping
    read as open over unmapped memory, and a read segfaulted (CI fuzz,
    round 12).  Now each mapping handed out is either closed with the
    context or refused with a GdrError."""
    size = 1 << 17
    for _ in range(1500):
        c = gdrpy.open(0, "sim")
        bufs = [gdrpy.memory.alloc(size, ctx=c) for _ in range(5)]
        pre = [c.pin(b).map() for b in bufs[:3]]   # close() must unmap these
        got: list = []
        bar = threading.Barrier(2)
        t = threading.Thread(target=_pin_and_map, args=(c, bufs[3:], got, bar))
        t.start()
        bar.wait()
        try:
            c.close()
        except errors.GdrError:            # raced a map in flight: still open
            pass
        t.join()
        for m in got:
            assert m.closed or not c.closed, "a mapping outlived its context's close"
            if not m.closed:
                assert m.read(0, 8) == bytes(8)
        del pre, got
        c.close()
        assert c.closed
        for b in bufs:
            b.close()


def test_pins_and_mappings_cannot_be_built_directly():
    with pytest.raises(TypeError):
        gdrpy.Pin()
    with pytest.raises(TypeError):
        gdrpy.Mapping()


def test_integer_like_arguments(sim_ctx):
    with gdrpy.memory.alloc(4096, ctx=sim_ctx) as buf, sim_ctx.pin(buf) as pin, pin.map() as m:
        m.write_u64(8, np.uint64(5))
        assert m.read_u64(8) == 5
        t = m.transfer()
        assert t.get(8, np.int64(2)) == b"\x05\x00"
        assert m.read(np.int32(8), np.int16(1)) == b"\x05"
        with pytest.raises(TypeError):
            m.write(True, b"x")
    with pytest.raises(errors.NotSupportedError):
        sim_ctx.pin(np.zeros(16, np.uint8))
