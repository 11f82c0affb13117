"""Page-locked host memory and the large-message copy-engine paths (issue 14):
host_alloc, scoped registration (no use after free), host-memory kinds, the
staging pipeline (every size across chunk boundaries, offsets, slow copy
engine), and the picker per kind.  Each test runs on sim and, where a GPU is,
on nvrm (the `ctx` fixture)."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
from bytepattern import pattern as _pattern

import gdrpy
from gdrpy import _core
from gdrpy.errors import BusyError, ClosedError, GdrError, InvalidArgumentError
from gdrpy.hostmem import kind_of, live
from gdrpy.staging import StagingPlan, parse_plan_env
from gdrpy.threshold import ThresholdPicker

KIB = 1 << 10
MIB = 1 << 20


@pytest.fixture
def dev(ctx):
    """(pin, mapping) over 24 MiB of device memory of ctx."""
    buf = gdrpy.memory.alloc(24 * MIB, ctx=ctx)
    pin = ctx.pin(buf)
    m = pin.map()
    yield pin, m
    m.close()
    pin.close()
    buf.close()


# ---- host_alloc --------------------------------------------------------------------

def test_host_alloc_is_a_numpy_viewable_pinned_buffer(ctx):
    base = live()
    with gdrpy.memory.host_alloc(3 * MIB + 5, ctx=ctx) as hb:
        assert live() == base + 1
        assert len(hb) == hb.nbytes == 3 * MIB + 5
        a = hb.numpy()
        a[:] = _pattern(len(a))
        assert bytes(memoryview(hb)[:100]) == _pattern(100).tobytes()
        assert kind_of(hb, ctx) == "pinned"
        assert kind_of(memoryview(hb)[10:1000], ctx) == "pinned"
        iface = hb.__array_interface__
        assert iface["data"][0] == hb.ptr and iface["shape"] == (len(hb),)
        del a
    assert hb.closed
    del hb            # the interface was handed out: freed with the last reference
    gc.collect()
    assert live() == base


def test_host_buffer_close_refuses_while_views_live(ctx):
    hb = gdrpy.memory.host_alloc(4096, ctx=ctx)
    v = memoryview(hb)
    with pytest.raises(BusyError):
        hb.close()
    assert not hb.closed
    v[0] = 7
    v.release()
    hb.close()
    hb.close()   # idempotent
    with pytest.raises(ClosedError):
        hb.ptr  # noqa: B018
    with pytest.raises(ClosedError):
        memoryview(hb)


def test_array_interface_export_defers_the_free_to_the_last_reference(ctx):
    base = live()
    hb = gdrpy.memory.host_alloc(8192, ctx=ctx)
    arr = np.asarray(_IfaceHolder(hb))
    arr[:] = 3
    hb.close()                       # marks closed; the memory stays for `arr`
    assert hb.closed
    assert live() == base + 1
    assert int(arr.sum()) == 3 * 8192
    del hb
    gc.collect()
    assert live() == base + 1        # arr's holder still references the buffer
    del arr
    gc.collect()
    assert live() == base


class _IfaceHolder:
    """An __array_interface__ consumer that keeps the producer referenced
    (as numpy does with the object it got the interface from)."""

    def __init__(self, hb):
        self.hb = hb
        self.__array_interface__ = hb.__array_interface__


def test_host_buffer_outlives_its_context(backend):
    c = gdrpy.open(0, backend)
    hb = gdrpy.memory.host_alloc(MIB, ctx=c)
    c.close()
    a = hb.numpy()
    a[:] = 1
    assert int(a.sum()) == MIB
    del a
    hb.close()


def test_host_alloc_rejects_bad_sizes(ctx):
    for bad in (0, -1):
        with pytest.raises((InvalidArgumentError, GdrError)):
            gdrpy.memory.host_alloc(bad, ctx=ctx)
    with pytest.raises(TypeError):
        gdrpy.memory.host_alloc(1.5, ctx=ctx)
    with pytest.raises(TypeError):
        gdrpy.memory.HostBuffer()


# ---- registration ------------------------------------------------------------------

def test_registration_is_scoped_and_holds_the_object(ctx):
    base = live()
    ba = bytearray(2 * MIB)
    with ctx.register(ba) as reg:
        assert live() == base + 1
        assert kind_of(ba, ctx) == "registered"
        assert kind_of(memoryview(ba)[4096:8192], ctx) == "registered"
        # the export it holds: the memory cannot be resized (freed) meanwhile
        with pytest.raises(BufferError):
            ba.extend(b"x")
        with pytest.raises(BusyError):
            ctx.register(memoryview(ba)[MIB:])     # overlapping registration
        assert reg.nbytes == len(ba)
    assert reg.closed
    assert live() == base
    ba.extend(b"x")                                # released: resizing works again
    expected = "pageable"
    assert kind_of(ba, ctx) == expected


def test_registration_survives_dropping_the_callers_reference(ctx):
    base = live()
    a = np.zeros(MIB, np.uint8)
    reg = ctx.register(a)
    ptr = reg.ptr
    del a
    gc.collect()
    assert reg.obj is not None and reg.obj.ctypes.data == ptr   # still alive: held
    del reg
    gc.collect()                                   # collected: unregistered, then released
    assert live() == base


def test_registration_refuses_bad_objects(ctx):
    with pytest.raises(InvalidArgumentError):
        ctx.register(bytearray())
    with pytest.raises(InvalidArgumentError):
        ctx.register(np.zeros((64, 64), np.uint8)[:, ::2])     # not contiguous
    with pytest.raises(TypeError):
        gdrpy.memory.Registration()


def test_closing_a_registration_twice_is_harmless(ctx):
    reg = ctx.register(np.zeros(4096, np.uint8))
    reg.close()
    reg.close()
    with pytest.raises(ClosedError):
        reg.ptr  # noqa: B018


# ---- the staging pipeline ----------------------------------------------------------

SIZES = [1, 63, 4095, 64 * KIB - 1, 64 * KIB, 64 * KIB + 1, 200 * KIB + 3, MIB - 1,
         MIB + 4097, 3 * MIB + 11, 9 * MIB + 5]


@pytest.mark.parametrize("cfg", [(64 * KIB, 2, 1), (128 * KIB, 3, 2), (MIB, 4, 3)],
                         ids=["64K-x2-t1", "128K-x3-t2", "1M-x4-t3"])
def test_staged_copies_are_exact_at_every_size_and_offset(ctx, dev, cfg, monkeypatch):
    # a slow copy-engine stand-in on sim widens every slot-reuse race
    monkeypatch.setenv("GDRPY_SIM_CE_DELAY_US", "200")
    pin, m = dev
    _core.staging_config(ctx, *cfg)
    got = _core.staging_config(ctx)
    assert {k: got[k] for k in ("chunk", "depth", "threads")} == \
        dict(zip(("chunk", "depth", "threads"), cfg, strict=True))
    salt = 0
    for n in SIZES:
        for off in (0, 1, 4096 + 7):
            salt += 1
            src = _pattern(n, salt)
            assert pin.ce_write(off, src, method="staged") == n
            assert bytes(m.read(off, n)) == src.tobytes(), (n, off)
            out = np.zeros(n + 3, np.uint8)
            salt += 1
            other = _pattern(n, salt)
            m.write(off, other)
            pin.ce_read(off, n, out[1:n + 1], method="staged")
            assert out[1:n + 1].tobytes() == other.tobytes(), (n, off)
            assert out[0] == 0 and out[n + 1] == 0 and out[n + 2] == 0   # nothing outside


def test_staged_copies_with_a_stream_are_ordered(ctx, dev):
    pin, _ = dev
    _core.staging_config(ctx, 128 * KIB, 2, 1)
    stream, destroy = _stream(ctx)
    try:
        for n in (100 * KIB + 1, 5 * MIB + 3):
            a, b = _pattern(n, 1), _pattern(n, 2)
            pin.ce_write(0, a, stream=stream, method="staged")
            pin.ce_write(0, b, stream=stream, method="staged")   # reuses the slots
            out = pin.ce_read(0, n, stream=stream, method="staged")
            assert out == b.tobytes()
    finally:
        destroy()


def _stream(ctx):
    if ctx.is_sim:
        return 0, (lambda: None)
    from gdrpy.memory import cuda_driver, primary_context
    cu = cuda_driver()
    primary_context(ctx.device)
    err, s = cu.cuStreamCreate(0)
    assert int(err) == 0
    return s, (lambda: cu.cuStreamDestroy(s))


def test_staging_config_rejects_bad_values(ctx):
    for bad in ((1000, 0, 0), (65 * MIB, 0, 0), (0, 1, 0), (0, 65, 0), (0, 0, 17),
                (64 * MIB, 8, 0)):   # the last: a ring over 256 MiB
        with pytest.raises(InvalidArgumentError):
            _core.staging_config(ctx, *bad)
    _core.staging_config(ctx, 4 * MIB, 64, 0)           # 256 MiB: the largest ring
    _core.staging_config(ctx, 2 * MIB, 4, 0)


def test_unknown_ce_method_is_refused(ctx, dev):
    pin, _ = dev
    with pytest.raises(InvalidArgumentError):
        pin.ce_write(0, b"x", method="fast")


def test_closing_the_context_tears_the_ring_down(backend):
    c = gdrpy.open(0, backend)
    buf = gdrpy.memory.alloc(4 * MIB, ctx=c)
    pin = c.pin(buf)
    pin.ce_write(0, _pattern(3 * MIB), method="staged")
    c.close()
    buf.close()


# ---- path choice per size and host-memory kind -------------------------------------

def _transfer(m, h2d_pg, d2h_pg, h2d_pl, d2h_pl, staged_min=MIB, gain=256 * KIB):
    plan = StagingPlan(staged_min={"h2d": staged_min, "d2h": staged_min},
                       locked_gain_min=gain, threads=1)
    return gdrpy.Transfer(m, ThresholdPicker(h2d=h2d_pg, d2h=d2h_pg, identity=None),
                          ThresholdPicker(h2d=h2d_pl, d2h=d2h_pl, identity=None), plan)


def test_method_per_size_and_kind(ctx, dev):
    _, m = dev
    t = _transfer(m, 512 * KIB, 8 * KIB, 128 * KIB, 8 * KIB)
    k = t.thresholds_by_kind()
    assert k["classify_min"] == {"h2d": 128 * KIB + 1, "d2h": 256 * KIB}
    assert t.method_for("h2d", 64 * KIB, "pinned") == "mapping"
    assert t.method_for("h2d", 200 * KIB, "pinned") == "ce-locked"
    assert t.method_for("h2d", 200 * KIB, "pageable") == "mapping"
    assert t.method_for("h2d", 2 * MIB, "pageable") == "ce-staged"
    assert t.method_for("d2h", 64 * KIB, "pageable") == "ce-direct"
    assert t.method_for("d2h", 64 * KIB, "registered") == "ce-direct"   # below classify_min
    assert t.method_for("d2h", 512 * KIB, "registered") == "ce-locked"
    with pytest.raises(InvalidArgumentError):
        t.method_for("up", 1)


@pytest.mark.parametrize("kind", ["pinned", "registered", "pageable"])
def test_put_get_round_trip_for_each_host_kind(ctx, dev, kind):
    _, m = dev
    t = _transfer(m, 64 * KIB, 2 * KIB, 32 * KIB, 2 * KIB, staged_min=256 * KIB)
    _core.staging_config(ctx, 64 * KIB, 3, 2)
    n_max = 6 * MIB + 3
    hb = reg = None
    if kind == "pinned":
        hb = gdrpy.memory.host_alloc(2 * n_max, ctx=ctx)
        host = hb.numpy()
    else:
        host = np.zeros(2 * n_max, np.uint8)
        if kind == "registered":
            reg = ctx.register(host)
    try:
        src, dst = host[:n_max], host[n_max:]
        for n in (8, 3000, 40 * KIB + 1, 300 * KIB + 7, n_max):
            src[:n] = _pattern(n, n)
            t.put(5, src[:n])
            assert bytes(m.read(5, n)) == src[:n].tobytes(), n
            m.write(9, _pattern(n, n + 1))
            dst[:n] = 0
            t.get(9, dst[:n])
            assert dst[:n].tobytes() == _pattern(n, n + 1).tobytes(), n
    finally:
        del src, dst
        if reg is not None:
            reg.close()
        del host
        if hb is not None:
            hb.close()


def test_small_messages_take_the_pageable_path_without_classification(ctx, dev):
    """Below classify_min every kind takes the pageable choice (no kind query is
    made there, so the 8 B fast path costs what it did)."""
    _, m = dev
    t = _transfer(m, 64 * KIB, 2 * KIB, 64 * KIB, 2 * KIB)
    assert t.thresholds_by_kind()["classify_min"] == {"h2d": 256 * KIB, "d2h": 256 * KIB}
    a = np.zeros(300 * KIB, np.uint8)
    with ctx.register(a):
        assert t.path_for("h2d", 8, "registered") == "mapping"
        assert t.method_for("h2d", 100 * KIB, "registered") == "ce-direct"
        assert t.method_for("h2d", 300 * KIB, "registered") == "ce-locked"
        assert t.put(0, a[:8]) == 8
        assert t.put(0, a) == len(a)


def test_timed_samples_feed_the_picker_of_the_memory_kind(ctx, dev):
    _, m = dev
    pg = ThresholdPicker(identity=None, seed=1)
    pl = ThresholdPicker(identity=None, seed=1)
    plan = StagingPlan(locked_gain_min=0, threads=1)
    t = gdrpy.Transfer(m, pg, pl, plan)
    hb = gdrpy.memory.host_alloc(64 * KIB, ctx=ctx)
    v = memoryview(hb)
    before_pg, before_pl = _recorded(pg), _recorded(pl)
    size = pl.threshold("h2d")         # inside the adaptation window
    for _ in range(400):
        t.put(0, v[:size])
    assert _recorded(pl) > before_pl
    assert _recorded(pg) == before_pg
    v.release()
    hb.close()


def _recorded(p) -> int:
    return int(p.state()["directions"]["h2d"]["samples"]["recorded"])


def test_staging_env_overrides_are_parsed():
    p = parse_plan_env("chunk=2M, depth=3,threads=2,staged_min_d2h=512K", StagingPlan())
    assert (p.chunk, p.depth, p.threads) == (2 * MIB, 3, 2)
    assert p.staged_min["d2h"] == 512 * KIB and p.staged_min["h2d"] == MIB
    with pytest.raises(ValueError):
        parse_plan_env("speed=11", StagingPlan())
    with pytest.raises(ValueError):
        parse_plan_env("depth=x", StagingPlan())


# ---- GPU: memory page-locked by other libraries ------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("lib", ["cuda", "torch", "cupy"])
def test_foreign_page_locked_memory_is_detected_and_copied(lib):
    ctx = gdrpy.open(0, "nvrm")
    keep = []
    try:
        n = 3 * MIB + 5
        if lib == "cuda":
            from gdrpy.memory import cuda_driver, primary_context
            cu = cuda_driver()
            primary_context(0)
            err, p = cu.cuMemHostAlloc(n, 0)
            assert int(err) == 0
            keep.append(lambda: cu.cuMemFreeHost(p))
            import ctypes
            host = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(int(p)))
        elif lib == "torch":
            torch = pytest.importorskip("torch")
            host = torch.zeros(n, dtype=torch.uint8).pin_memory().numpy()
        else:
            cupy = pytest.importorskip("cupy")
            mem = cupy.cuda.alloc_pinned_memory(n)
            host = np.frombuffer(mem, np.uint8, n)
        assert kind_of(host, ctx) == "page-locked", lib
        assert kind_of(np.zeros(n, np.uint8), ctx) == "pageable"
        buf = gdrpy.memory.alloc(n, ctx=ctx)
        pin = ctx.pin(buf)
        m = pin.map()
        t = m.transfer()
        host[:] = _pattern(n, 3)
        t.put(0, host)
        assert bytes(m.read(0, n)) == host.tobytes()
        m.write(0, _pattern(n, 4))
        host[:] = 0
        t.get(0, host)
        assert host.tobytes() == _pattern(n, 4).tobytes()
        del host
        m.close()
        pin.close()
        buf.close()
    finally:
        for f in keep:
            f()
        ctx.close()


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["direct", "locked", "staged"])
def test_gpu_ce_methods_with_and_without_stream(method):
    ctx = gdrpy.open(0, "nvrm")
    try:
        n = 9 * MIB + 7
        buf = gdrpy.memory.alloc(n + 8192, ctx=ctx)
        pin = ctx.pin(buf)
        m = pin.map()
        _core.staging_config(ctx, MIB, 3, min(4, os.cpu_count() or 1))
        hb = gdrpy.memory.host_alloc(n, ctx=ctx)
        host = hb.numpy() if method == "locked" else np.zeros(n, np.uint8)
        stream, destroy = _stream(ctx)
        try:
            for s in (None, stream):
                for size in (1, 4097, MIB - 1, MIB + 1, 3 * MIB, n):
                    host[:size] = _pattern(size, size)
                    pin.ce_write(4099, host[:size], stream=s, method=method)
                    if s is not None:
                        ctx_sync = pin.ce_read(4099, 1, stream=s)   # waits for the stream
                        assert len(ctx_sync) == 1
                    assert bytes(m.read(4099, size)) == host[:size].tobytes(), (s, size)
                    m.write(4099, _pattern(size, size + 1))
                    host[:size] = 0
                    pin.ce_read(4099, size, host[:size], stream=s, method=method)
                    assert host[:size].tobytes() == _pattern(size, size + 1).tobytes()
        finally:
            destroy()
        del host
        hb.close()
        m.close()
        pin.close()
        buf.close()
    finally:
        ctx.close()


def test_plan_calibration_runs_and_its_cache_round_trips(tmp_path, monkeypatch):
    from gdrpy.identity import host_identity
    from gdrpy.staging import calibrate_plan, load_plan, save_plan
    monkeypatch.setenv("GDRPY_CACHE_DIR", str(tmp_path))
    with gdrpy.open(0, "sim") as c:
        plan = calibrate_plan(c, budget_s=0.5, max_bytes=4 * MIB)
        assert plan.source == "calibration"
        from gdrpy.staging import MAX_DEPTH, MAX_RING
        assert 64 * KIB <= plan.chunk <= 64 * MIB and 2 <= plan.depth <= MAX_DEPTH
        assert plan.chunk * plan.depth <= MAX_RING
        assert set(plan.staged_min) == {"h2d", "d2h"}
        assert any("gbps" in s for s in plan.sweep)
        ident = host_identity(c)
        assert save_plan(ident, plan)
        back = load_plan(ident)
        assert back is not None and back.source == "cache"
        assert back.as_dict() | {"source": "x"} == plan.as_dict() | {"source": "x"}
        assert load_plan({**ident, "cpu_model": "another"}) is None   # other identity
        path = next(tmp_path.glob("staging-*.json"))
        path.write_text("{not json")
        assert load_plan(ident) is None                               # corrupt: ignored
