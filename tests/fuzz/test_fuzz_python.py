"""Hypothesis drives the Python API with random sequences of open / alloc / pin /
map / copy / view / unmap / unpin / close, and of channel create / send / recv /
host-block view / close (a CPU thread in libgdrpy answers as the kernel), split
over three threads that run at the same time on shared objects (so objects get
closed under other threads' copies and waits).  Every call must either work or
raise a GdrError (a clear error); no crash, no hang (threads joined with a
deadline), nothing left open at the end.
Backend: sim here; GDRPY_FUZZ_BACKEND=auto runs it on a GPU."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from conftest import run_threads
from hypothesis import given
from hypothesis import strategies as st

import gdrpy

BACKEND = os.environ.get("GDRPY_FUZZ_BACKEND", "sim")
SIZE = 1 << 17
OPS = ["open", "alloc", "pin", "map", "write", "read", "write_big", "ce_write", "ce_read",
       "put", "get", "view", "drop_view", "unmap", "unpin", "close_ctx", "free",
       "chan", "chan_send", "chan_recv", "chan_view", "chan_close"]

op_st = st.tuples(st.integers(0, 2), st.sampled_from(OPS), st.integers(0, 7),
                  st.integers(-16, SIZE + 16), st.integers(0, SIZE + 8))


class World:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ctxs: list[gdrpy.Context] = []
        self.bufs: list[object] = []
        self.pins: list[gdrpy.Pin] = []
        self.maps: list[gdrpy.Mapping] = []
        self.views: list[object] = []
        self.chans: list[tuple[gdrpy.Channel, int]] = []   # (channel, sim consumer)

    def pick(self, seq: list, i: int):  # type: ignore[no-untyped-def]
        with self.lock:
            return seq[i % len(seq)] if seq else None

    def add(self, seq: list, obj: object) -> None:
        with self.lock:
            seq.append(obj)


def run_op(w: World, op: str, i: int, off: int, n: int) -> None:
    data = bytes(range(256)) * (max(n, 1) // 256 + 1)
    if op == "open":
        w.add(w.ctxs, gdrpy.open(0, BACKEND))
    elif op == "alloc":
        c = w.pick(w.ctxs, i)
        if c is not None:
            w.add(w.bufs, gdrpy.memory.alloc(SIZE, ctx=c))
    elif op == "pin":
        c, b = w.pick(w.ctxs, i), w.pick(w.bufs, i // 2)
        if c is not None and b is not None:
            w.add(w.pins, c.pin(b))
    elif op == "map":
        p = w.pick(w.pins, i)
        if p is not None:
            w.add(w.maps, p.map())
    elif op in ("write", "read", "write_big", "put", "get", "view", "unmap"):
        m = w.pick(w.maps, i)
        if m is None:
            return
        if op == "write":
            m.write(off, data[:n % 4096])
        elif op == "write_big":
            m.write(off, data[:n])
        elif op == "read":
            m.read(off, n)
        elif op == "put":
            m.transfer().put(off, data[:n % 256])
        elif op == "get":
            m.transfer().get(off, n % 256)
        elif op == "view":
            w.add(w.views, np.asarray(m))
        else:
            m.close()
    elif op in ("ce_write", "ce_read", "unpin"):
        p = w.pick(w.pins, i)
        if p is None:
            return
        if op == "ce_write":
            p.ce_write(off, data[:n])
        elif op == "ce_read":
            p.ce_read(off, n)
        else:
            p.close()
    elif op == "drop_view":
        with w.lock:
            if w.views:
                w.views.pop(i % len(w.views))
    elif op == "close_ctx":
        c = w.pick(w.ctxs, i)
        if c is not None:
            c.close()
    elif op == "free":
        b = w.pick(w.bufs, i)
        if b is not None:
            b.close()  # type: ignore[attr-defined]
    elif op == "chan":
        c = w.pick(w.ctxs, i)
        if c is not None:
            ch = gdrpy.Channel(c, nslots=8, slot_size=64)
            w.add(w.chans, (ch, ch._sim_consumer(check=False, idle_timeout=2.0)))
    elif op.startswith("chan_"):
        pair = w.pick(w.chans, i)
        if pair is None:
            return
        ch = pair[0]
        if op == "chan_send":
            ch.send(data[:n % 65], tag=i, timeout=0.01 * (n % 3))
        elif op == "chan_recv":
            ch.recv(timeout=0.01 * (n % 3))
        elif op == "chan_view":
            w.add(w.views, np.frombuffer(ch.host_block(), np.uint8))
        else:
            ch.close(timeout=0.5)


@given(st.lists(op_st, min_size=1, max_size=40))
def test_random_api_sequences_from_three_threads(ops: list) -> None:
    w = World()
    w.add(w.ctxs, gdrpy.open(0, BACKEND))
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def worker(tid: int) -> None:
        barrier.wait()
        for t, op, i, off, n in ops:
            if t != tid:
                continue
            try:
                run_op(w, op, i, off, n)
            except gdrpy.GdrError:
                pass                          # a clear error: fine
            except BaseException as e:        # anything else is a finding
                errors.append(e)
                return

    run_threads(worker, 3)
    assert not errors, f"non-GdrError raised: {errors[0]!r}"
    w.views.clear()
    for ch, h in w.chans:
        ch.close(timeout=2.0)   # no view left: must close
        assert ch.closed
        ch._sim_join(h)
    for c in w.ctxs:
        c.close()
        assert c.closed
    for b in w.bufs:
        try:
            b.close()  # type: ignore[attr-defined]
        except gdrpy.GdrError as e:   # only a live export may refuse
            pytest.fail(f"buffer close refused after every view was dropped: {e}")


CH_OPS = ["chan_open", "chan_close", "write", "unmap_try"]


@given(st.lists(st.tuples(st.integers(0, 1), st.sampled_from(CH_OPS), st.integers(0, 7)),
                min_size=1, max_size=30))
def test_channel_holds_balance_beside_copies(ops: list) -> None:
    """Issue 45: channels on a buffer that is also pinned and mapped, opened
    and closed from two threads while the mapping is written and its teardown
    tried: every channel close completes, and once they are all closed the
    mapping and the pin close at once (every hold a channel raised was
    dropped exactly once; none dropped a copy's)."""
    ctx = gdrpy.open(0, BACKEND)
    buf = gdrpy.memory.alloc(SIZE, ctx=ctx)
    pin = ctx.pin(buf)
    m = pin.map()
    chans: list[gdrpy.Channel] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(tid: int) -> None:
        for t, op, i in ops:
            if t != tid:
                continue
            try:
                if op == "chan_open":
                    ch = gdrpy.Channel(ctx, nslots=4, slot_size=64, buffer=buf)
                    with lock:
                        chans.append(ch)
                elif op == "chan_close":
                    with lock:
                        ch = chans.pop(i % len(chans)) if chans else None
                    if ch is not None:
                        ch.close(timeout=1.0)
                        assert ch.closed
                elif op == "write":
                    m.write(i * 64, b"x" * 64)
            except gdrpy.GdrError:
                pass
            except BaseException as e:
                errors.append(e)
                return

    run_threads(worker, 2)
    assert not errors, f"non-GdrError raised: {errors[0]!r}"
    for ch in chans:
        ch.close(timeout=2.0)
        assert ch.closed
    m.close()
    pin.close()
    ctx.close()
    assert ctx.closed
    buf.close()  # type: ignore[attr-defined]
