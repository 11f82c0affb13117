"""The staging ring's chunk schedule and calibration choices (issue 14): staged
copies are exact at odd sizes around the ramp-up/ramp-down boundaries of the
schedule, in both directions, with one and with several memcpy threads and a
slow copy engine; the staged_min choice is robust to a single noisy point.
Copies run on sim and, where a GPU is, on nvrm (the `ctx` fixture)."""

from __future__ import annotations

import numpy as np
import pytest
from bytepattern import pattern as _pattern

import gdrpy
from gdrpy import _core
from gdrpy.staging import NEVER, pick_staged_min, ring_sizes

KIB = 1 << 10
MIB = 1 << 20


def _ramp_sizes() -> list[int]:
    """Sizes at and around F(3 * 2^R - 1) (where the schedule takes ramp step R)
    and 2F(2^R - 1) for F = 32 KiB .. 256 KiB, plus sizes that are not multiples
    of anything."""
    out = set()
    for f in (32 * KIB, 64 * KIB, 128 * KIB, 256 * KIB):
        for r in range(1, 5):
            for x in (f * (3 * (1 << r) - 1), 2 * f * ((1 << r) - 1)):
                if x <= 9 * MIB:
                    out.update((x - 1, x, x + 1))
    out.update((1, 4097, 65 * KIB + 3, 257 * KIB - 5, MIB + 4095, 4 * MIB + 1,
                7 * MIB - 3, 9 * MIB - 1))
    return sorted(out)


@pytest.fixture
def dev(ctx):
    buf = gdrpy.memory.alloc(10 * MIB, ctx=ctx)
    pin = ctx.pin(buf)
    m = pin.map()
    yield pin, m
    m.close()
    pin.close()
    buf.close()


@pytest.mark.parametrize("cfg", [(256 * KIB, 2, 1), (MIB, 3, 3), (64 * KIB, 8, 8)],
                         ids=["256K-x2-t1", "1M-x3-t3", "64K-x8-t8"])
def test_staged_copies_are_exact_around_schedule_boundaries(ctx, dev, cfg, monkeypatch):
    monkeypatch.setenv("GDRPY_SIM_CE_DELAY_US", "50")
    pin, m = dev
    _core.staging_config(ctx, *cfg)
    for i, n in enumerate(_ramp_sizes()):
        off = (i % 3) * 4099
        src = _pattern(n, i)
        assert pin.ce_write(off, src, method="staged") == n
        got = bytes(m.read(off, n))
        if got != src.tobytes():
            bad = next(k for k in range(n) if got[k] != src[k])
            pytest.fail(f"put: size {n} offset {off} cfg {cfg}: first wrong byte at {bad}")
        other = _pattern(n, i + 1000)
        m.write(off, other)
        out = np.full(n + 2, 0xA5, np.uint8)
        pin.ce_read(off, n, out[1:n + 1], method="staged")
        if out[1:n + 1].tobytes() != other.tobytes():
            bad = int(np.nonzero(out[1:n + 1] != other)[0][0])
            pytest.fail(f"get: size {n} offset {off} cfg {cfg}: first wrong byte at {bad}")
        assert out[0] == 0xA5 and out[n + 1] == 0xA5, (n, off)   # nothing written outside


def test_back_to_back_staged_copies_in_both_directions_do_not_mix(ctx, dev):
    """Puts and gets alternate with different sizes, so each copy starts at another
    ring slot and finds the slots in another state."""
    pin, m = dev
    _core.staging_config(ctx, 128 * KIB, 3, 4)
    rng = np.random.default_rng(7)
    for it in range(30):
        n = int(rng.integers(1, 6 * MIB))
        off = int(rng.integers(0, 4 * MIB))
        src = _pattern(n, it)
        pin.ce_write(off, src, method="staged")
        out = np.empty(n, np.uint8)
        pin.ce_read(off, n, out, method="staged")
        assert out.tobytes() == src.tobytes(), (it, n, off)


def test_staged_min_choice_ignores_one_noisy_point():
    sizes = [64 * KIB << i for i in range(11)]          # 64 KiB .. 64 MiB
    # staging wins from 1 MiB up, except a noisy loss at 8 MiB
    pts = [(n, 1.0, 0.5 if n >= MIB else 1.5) for n in sizes]
    pts[sizes.index(8 * MIB)] = (8 * MIB, 1.0, 1.1)
    assert pick_staged_min(pts) == MIB
    # never a win: never staged
    assert pick_staged_min([(n, 1.0, 2.0) for n in sizes]) == NEVER
    # always a win: staged from the smallest size measured
    assert pick_staged_min([(n, 2.0, 1.0) for n in sizes]) == 64 * KIB
    # one noisy win among losses does not switch staging on
    pts = [(n, 1.0, 1.5) for n in sizes]
    pts[3] = (sizes[3], 1.0, 0.9)
    assert pick_staged_min(pts) == NEVER
    assert pick_staged_min([]) == NEVER


def test_ring_is_scored_at_the_sizes_that_matter():
    assert ring_sizes(64 * MIB) == (4 * MIB, 16 * MIB, 64 * MIB)
    assert ring_sizes(16 * MIB) == (4 * MIB, 16 * MIB)
    small = ring_sizes(MIB)
    assert all(0 < n <= MIB for n in small) and len(small) == 3
