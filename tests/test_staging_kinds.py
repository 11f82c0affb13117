"""Staging ring kinds (issue 14): every way the CPU side may touch the ring
('plain', 'nt', 'wc', 'evict'; gdrpy_host.h) copies exactly, at sizes across
chunk boundaries and odd offsets, both directions, with and without a stream,
and writes nothing outside the caller's range.  Runs on sim and, where a GPU
is, on nvrm (the `ctx` fixture)."""

from __future__ import annotations

import numpy as np
import pytest
from bytepattern import pattern as _pattern

import gdrpy
from gdrpy import _core
from gdrpy.errors import InvalidArgumentError

KIB = 1 << 10
MIB = 1 << 20
KINDS = ("plain", "nt", "wc", "evict", "ntevict")
SIZES = [1, 63, 4095, 64 * KIB + 1, 300 * KIB + 3, MIB + 4097, 5 * MIB + 11]


def _stream(ctx):
    if ctx.is_sim:
        return None, (lambda: None)
    from gdrpy.memory import cuda_driver, primary_context
    cu = cuda_driver()
    primary_context(ctx.device)
    err, s = cu.cuStreamCreate(0)
    assert int(err) == 0
    return s, (lambda: cu.cuStreamDestroy(s))


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_copies_exactly_both_ways(ctx, kind, monkeypatch):
    monkeypatch.setenv("GDRPY_SIM_CE_DELAY_US", "50")
    for var in ("NT", "WC", "WKIND", "RKIND", "DRY"):
        monkeypatch.delenv("GDRPY_STAGING_" + var, raising=False)
    buf = gdrpy.memory.alloc(8 * MIB, ctx=ctx)
    pin = ctx.pin(buf)
    m = pin.map()
    stream, destroy = _stream(ctx)
    try:
        cfg = _core.staging_config(ctx, 512 * KIB, 3, 4, write_kind=kind, read_kind=kind)
        assert cfg["write_kind"] == kind and cfg["read_kind"] == kind
        salt = 0
        for s in (None, stream):
            for n in SIZES:
                for off in (0, 4096 + 7):
                    salt += 1
                    src = np.zeros(n + 2, np.uint8)[1:n + 1]   # an odd host address
                    src[:] = _pattern(n, salt)
                    assert pin.ce_write(off, src, stream=s, method="staged") == n
                    if s is not None:
                        pin.ce_read(0, 1, stream=s)           # waits for the stream
                    assert bytes(m.read(off, n)) == src.tobytes(), (kind, s, n, off)
                    salt += 1
                    other = _pattern(n, salt)
                    m.write(off, other)
                    out = np.full(n + 3, 0xA5, np.uint8)
                    pin.ce_read(off, n, out[1:n + 1], stream=s, method="staged")
                    assert out[1:n + 1].tobytes() == other.tobytes(), (kind, s, n, off)
                    assert out[0] == 0xA5 and out[n + 1] == 0xA5 and out[n + 2] == 0xA5
        used = _core.staging_config(ctx)
        assert used["write_used"] in KINDS and used["read_used"] in KINDS
    finally:
        destroy()
        m.close()
        pin.close()
        buf.close()


def test_mixed_kinds_share_the_slots(ctx, monkeypatch):
    """A write through the write-combined ring and a read through the cached
    one use the same slot numbers: the read waits for the write's DMAs."""
    monkeypatch.setenv("GDRPY_SIM_CE_DELAY_US", "50")
    buf = gdrpy.memory.alloc(4 * MIB, ctx=ctx)
    pin = ctx.pin(buf)
    stream, destroy = _stream(ctx)
    try:
        _core.staging_config(ctx, 256 * KIB, 2, 3, write_kind="wc", read_kind="evict")
        for i in range(3):
            n = 3 * MIB + i
            a = _pattern(n, 10 + i)
            pin.ce_write(0, a, stream=stream, method="staged")
            out = pin.ce_read(0, n, stream=stream, method="staged")
            assert out == a.tobytes(), i
    finally:
        destroy()
        pin.close()
        buf.close()


def test_bad_kinds_are_refused(ctx):
    with pytest.raises(InvalidArgumentError):
        _core.staging_config(ctx, write_kind="fast")
    with pytest.raises(InvalidArgumentError):
        _core.staging_config(ctx, read_kind="")
    cfg = _core.staging_config(ctx)
    assert cfg["write_kind"] in KINDS and cfg["read_kind"] in KINDS
