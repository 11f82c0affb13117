"""GPU test (issue 13): stream-ordered pool memory pins in a long-lived, busy
process.  A warm-up first leaves the process the way many earlier GPU tests or
a long-running application do (tests/gpu_warmup.py: hundreds of allocations
and frees of every kind, pools destroyed and pools alive with many chunks,
pins through gdrpy); then every pool kind of tests/test_gpu_kinds.py must pin
and round-trip, and so must allocations the warm-up left alive in its busy
pools (default pool with a raised release threshold, created pools with and
without POSIX_FD)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import gdrpy
from gdrpy import errors

pytestmark = pytest.mark.gpu

BACKEND = os.environ.get("GDRPY_GPU_BACKEND", "nvrm")


@pytest.fixture(scope="module")
def busy():
    from gpu_warmup import Warmup

    from gdrpy.memory import cuda_driver, primary_context
    cu = cuda_driver()
    primary_context(0)
    w = Warmup(cu, gdrpy, seed=7)
    w.run(rounds=3)
    print("warm-up:", w.summary())
    assert not w.errors, w.errors
    yield cu, w
    w.close()


@pytest.fixture
def gctx():
    c = gdrpy.open(0, BACKEND)
    yield c
    c.close()


def test_every_pin_during_the_warm_up_succeeded(busy):
    """cuMemAlloc and cuMemCreate (with and without a handle type) memory
    pinned among hundreds of other allocations."""
    _cu, w = busy
    if BACKEND == "nvrm":
        assert not w.pin_failures, w.pin_failures


@pytest.mark.parametrize("kind", ["pool_default", "pool_default_offset", "pool_fd", "pool_none",
                                  "pool_rmm_like"])
def test_pool_kind_pins_after_a_busy_warm_up(busy, gctx, kind):
    from test_gpu_kinds import _kind_check
    cu, _w = busy
    _kind_check(cu, gctx, kind)


@pytest.mark.parametrize("which", ["default", "pool_fd", "pool_none"])
def test_live_allocation_in_a_busy_pool_pins_and_round_trips(busy, gctx, which):
    cu, w = busy
    live = [x for x in w.live[which] if x[1] >= 65536]
    assert live, f"the warm-up left no {which} allocation alive"
    # every live allocation of this pool kind (at chunk starts and inside)
    for ptr, n in live[:6]:
        n = min(n, 1 << 20)
        # data of its own first: where only a scan of the heap finds a chunk's
        # record, the bytes must prove the object, and never-written memory
        # (one value everywhere) is refused (docs/security.md)
        before = np.random.default_rng(~ptr & 0xFFFF).integers(0, 256, n, dtype=np.uint8)
        assert int(cu.cuMemcpyHtoD(ptr, before.ctypes.data, n)[0]) == 0
        # from pageable memory the copy may return before its DMA lands: wait,
        # or the DMA can land after the stores through the mapping below
        assert int(cu.cuCtxSynchronize()[0]) == 0
        try:
            pin = gctx.pin(ptr, size=n)
        except errors.GdrError as e:
            if BACKEND == "nvrm":
                raise AssertionError(f"{which} 0x{ptr:x}+{n}: {e}") from e
            assert "what works" in str(e), str(e)
            continue
        data = np.random.default_rng(ptr & 0xFFFF).integers(0, 256, n, dtype=np.uint8)
        out = np.empty(n, np.uint8)
        with pin, pin.map() as m:
            m.write(0, data.tobytes())
            err = cu.cuMemcpyDtoH(out.ctypes.data, ptr, n)[0]
            assert int(err) == 0, err
            assert out.tobytes() == data.tobytes(), f"{which} 0x{ptr:x}: wrong data"
            assert m.read(n - 64, 64) == data[-64:].tobytes()
