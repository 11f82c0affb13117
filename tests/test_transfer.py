"""Transfer engine: put/get correctness on every path and size class, the
automatic choice, stream variants, and the feed into online adaptation."""

from __future__ import annotations

import numpy as np
import pytest

import gdrpy
from gdrpy import errors
from gdrpy.threshold import ThresholdPicker

SIZES = [1, 7, 8, 63, 64, 65, 4095, 4096, 65536, 65537, 1 << 20]


def _picker(h2d, d2h, **kw):
    return ThresholdPicker(h2d=h2d, d2h=d2h, identity=None, env={}, **kw)


@pytest.fixture
def mapped(ctx, alloc):
    buf = alloc(4 << 20)
    pin = ctx.pin(buf)
    m = pin.map()
    yield buf, pin, m
    m.close()
    pin.close()


@pytest.mark.parametrize("paths", ["always-mapping", "always-ce", "auto"])
def test_put_get_every_size_and_offset_on_each_path(ctx, alloc, mapped, paths):
    buf, pin, m = mapped
    p = _picker(64 << 10, 2 << 10) if paths == "auto" else _picker(paths, paths)
    t = gdrpy.Transfer(m, p)
    rng = np.random.default_rng(1)
    for n in SIZES:
        for off in (0, 1, 13, 4096 + 5):
            data = rng.integers(0, 256, n, dtype=np.uint8)
            assert t.put(off, data) == n
            assert alloc.device_read(buf.ptr + off, n) == data.tobytes(), (paths, n, off)
            back = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            alloc.device_write(buf.ptr + off, back)
            assert t.get(off, n) == back
            out = bytearray(n)
            assert t.get(off, out) is out and bytes(out) == back


def test_auto_choice_follows_the_thresholds(mapped):
    _, _, m = mapped
    t = gdrpy.Transfer(m, _picker(4096, 512, adapt=False))
    assert t.thresholds() == {"h2d": 4096, "d2h": 512}
    assert t.path_for("h2d", 4096) == "mapping" and t.path_for("h2d", 4097) == "ce"
    assert t.path_for("d2h", 512) == "mapping" and t.path_for("d2h", 513) == "ce"
    with pytest.raises(errors.InvalidArgumentError):
        t.path_for("up", 1)


def test_stream_variants_are_correct(ctx, alloc, mapped):
    buf, pin, m = mapped
    stream = None
    if not ctx.is_sim:
        from gdrpy.memory import cuda_driver
        cu = cuda_driver()
        err, stream = cu.cuStreamCreate(0)
        assert int(err) == 0
    try:
        for paths in ("always-mapping", "always-ce"):
            t = gdrpy.Transfer(m, _picker(paths, paths))
            for n in (8, 100000):
                data = np.full(n, 7 if paths == "always-ce" else 9, np.uint8)
                t.put(0, data, stream=stream if stream is not None else 0)
                if stream is not None:
                    assert int(cu.cuStreamSynchronize(stream)[0]) == 0
                assert alloc.device_read(buf.ptr, n) == data.tobytes()
                assert t.get(0, n, stream=stream if stream is not None else 0) == data.tobytes()
    finally:
        if stream is not None:
            cu.cuStreamDestroy(stream)


def test_module_level_put_get_reuse_the_mapping_transfer(mapped):
    _, _, m = mapped
    gdrpy.put(m, 10, b"abc")
    assert gdrpy.get(m, 10, 3) == b"abc"
    assert m.transfer() is m.transfer()
    with pytest.raises(TypeError):
        gdrpy.put(b"not a mapping", 0, b"x")


def test_out_of_range_put_get_touch_nothing(alloc, mapped):
    buf, _, m = mapped
    t = gdrpy.Transfer(m, _picker(64, 64))
    alloc.device_write(buf.ptr + (4 << 20) - 16, b"\x42" * 16)
    for n in (8, 1 << 16):
        with pytest.raises(errors.OutOfRangeError):
            t.put((4 << 20) - 4, b"\x01" * n)
        with pytest.raises(errors.OutOfRangeError):
            t.get((4 << 20) - 4, n)
    assert alloc.device_read(buf.ptr + (4 << 20) - 16, 16) == b"\x42" * 16


def test_transfers_near_the_threshold_feed_adaptation(mapped):
    _, _, m = mapped
    p = _picker(None, None, probe_every=4, min_samples=2)
    t = gdrpy.Transfer(m, p)
    T = p.threshold("h2d")
    data = b"\x05" * T
    for _ in range(200):
        t.put(0, data)
        t.get(0, p.threshold("d2h"))
    st = p.state()["directions"]
    for d in ("h2d", "d2h"):
        rec = st[d]["samples"]["recorded"]
        # one timed transfer per 2 * probe_every = 8 calls, alternating paths
        assert rec >= 200 // 8 - 1, st[d]
        pend = st[d]["samples"]["buckets"]
        assert any(b["pending_ce"] or b["rounds"] for b in pend) and \
            any(b["pending_mapping"] or b["rounds"] for b in pend), pend


def test_transfer_of_a_closed_mapping_raises(ctx, alloc):
    buf = alloc(4096)
    pin = ctx.pin(buf)
    m = pin.map()
    t = m.transfer()
    m.close()
    with pytest.raises(errors.ClosedError):
        t.put(0, b"x")
    pin.close()


def test_the_binding_transfer_takes_its_pickers_and_plan(mapped):
    # the binding resolves no defaults: gdrpy.Transfer (the Python layer) does
    from gdrpy import _core
    from gdrpy.staging import StagingPlan
    _, _, m = mapped
    p = _picker(64, 64)
    with pytest.raises(errors.ArgumentTypeError, match="takes all four"):
        _core.Transfer(m, p, None, StagingPlan())
    t = _core.Transfer(m, p, p, StagingPlan())
    assert t.put(0, b"abc") == 3 and t.get(0, 3) == b"abc"
    d = gdrpy.Transfer(m, p)
    assert isinstance(d, _core.Transfer) and d.picker is d.picker_locked is p
    assert not hasattr(d, "__dict__")
    assert gdrpy.Transfer(m).picker is m.transfer().picker   # the shared default


def test_defaults_of_a_closed_mapping_are_not_looked_up(ctx, alloc, monkeypatch):
    import gdrpy.transfer as gt
    buf = alloc(4096)
    pin = ctx.pin(buf)
    m = pin.map()
    m.close()
    monkeypatch.setattr(gt, "default_picker", lambda *a: pytest.fail("looked up"))
    with pytest.raises(errors.ClosedError, match="mapping is unmapped"):
        gdrpy.Transfer(m)
    with pytest.raises(TypeError):
        gdrpy.Transfer(b"not a mapping")
    pin.close()


def test_mapping_transfer_uses_the_installed_factory(mapped, monkeypatch):
    from gdrpy import _core
    _, _, m = mapped
    made = []

    def factory(mapping, picker):
        made.append((mapping, picker))
        return gdrpy.Transfer(mapping, picker)

    p = _picker(64, 64)
    try:
        _core.set_transfer_factory(factory)
        assert m.transfer(p).picker is p and made == [(m, p)]
        _core.set_transfer_factory(lambda mapping, picker: "no transfer")
        with pytest.raises(errors.ArgumentTypeError, match="returned str"):
            m.transfer(p)
        with pytest.raises(errors.ArgumentTypeError, match="callable"):
            _core.set_transfer_factory(42)
    finally:
        _core.set_transfer_factory(gdrpy.Transfer)
    assert type(m.transfer(p)) is gdrpy.Transfer
