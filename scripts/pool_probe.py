"""GPU probe for issue 13: do stream-ordered pool allocations pin (nvrm route V)
in a fresh process and after a warm-up of many CUDA allocations of every kind?

    python3 scripts/pool_probe.py fresh   # pin each pool kind first, then warm up, pin again
    python3 scripts/pool_probe.py warm    # warm up first (route V learns in a busy process)

Prints one ``PROBE`` line per pin: PINNED (with a round trip checked through
CUDA) or REFUSED (errno and message).  Run with GDRPY_LOG_LEVEL=1 (and
GDRPY_NVRM_POOL_DIAG=1) to see what route V learned and looked up.
Exit status: 0 when every pool kind pinned and round-tripped, else 1."""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))

from gpu_warmup import Warmup, ok

import gdrpy
from gdrpy import errors
from gdrpy.memory import cuda_driver, primary_context

POOL_KINDS = ["pool_default", "pool_default_offset", "pool_fd", "pool_none", "pool_rmm_like"]


def pin_check(cu: Any, ctx: Any, tag: str, ptr: int, n: int) -> bool:
    """Pins [ptr, +n), writes through the mapping, checks through CUDA."""
    t0 = time.perf_counter()
    try:
        pin = ctx.pin(ptr, size=n)
    except errors.GdrError as e:
        print(f"PROBE {tag}: REFUSED errno {e.code} after "
              f"{(time.perf_counter() - t0) * 1e3:.1f} ms: {str(e)[:600]}", flush=True)
        return False
    ms = (time.perf_counter() - t0) * 1e3
    data = np.random.default_rng(ptr & 0xFFFF).integers(0, 256, n, dtype=np.uint8).tobytes()
    out = np.empty(n, np.uint8)
    with pin, pin.map() as m:
        m.write(0, data)
        ok(cu.cuMemcpyDtoH(out.ctypes.data, ptr, n))
        good = out.tobytes() == data and m.read(n - 64, 64) == data[-64:]
    print(f"PROBE {tag}: PINNED in {ms:.1f} ms, round trip {'ok' if good else 'WRONG DATA'} "
          f"(0x{ptr:x}+{n})", flush=True)
    return good


def kind_pins(cu: Any, ctx: Any, phase: str) -> dict[str, bool]:
    from test_gpu_kinds import _Alloc
    res = {}
    n = 1 << 20
    for k in POOL_KINDS:
        a = _Alloc(cu, k, n)
        try:
            res[k] = pin_check(cu, ctx, f"{phase} {k}", a.ptr, n)
        finally:
            a.close()
    return res


def live_pool_pins(cu: Any, ctx: Any, w: Warmup, phase: str) -> dict[str, bool]:
    """Pins allocations the warm-up left alive in busy pools (many chunks)."""
    res = {}
    picks: list[tuple[str, Callable[[], tuple[int, int] | None]]] = [
        ("live default-pool alloc", lambda: w.pick("default")),
        ("live fd-pool alloc", lambda: w.pick("pool_fd")),
        ("live no-handle pool alloc", lambda: w.pick("pool_none")),
        ("cupy MemoryAsyncPool", lambda: w.pick("cupy")),
        ("torch cudaMallocAsync", lambda: w.pick("torch")),
    ]
    for name, f in picks:
        got = f()
        if got is None:
            print(f"PROBE {phase} {name}: none (not available)")
            continue
        ptr, n = got
        res[name] = pin_check(cu, ctx, f"{phase} {name}", ptr, min(n, 1 << 20))
    return res


def main() -> int:
    phase = sys.argv[1] if len(sys.argv) > 1 else "fresh"
    cu = cuda_driver()
    primary_context(0)
    random.seed(1234)
    results: dict[str, bool] = {}
    w = Warmup(cu, gdrpy, seed=99)
    if phase == "fresh":
        ctx = gdrpy.open(0, "nvrm")
        results.update({f"fresh {k}": v for k, v in kind_pins(cu, ctx, "fresh").items()})
        ctx.close()
    t0 = time.perf_counter()
    w.run(rounds=3)
    print(f"PROBE {phase}: warm-up {w.summary()} in {time.perf_counter() - t0:.1f} s", flush=True)
    ctx = gdrpy.open(0, "nvrm")
    tag = f"{phase}+warm"
    results.update({f"{tag} {k}": v for k, v in kind_pins(cu, ctx, tag).items()})
    results.update({f"{tag} {k}": v for k, v in live_pool_pins(cu, ctx, w, tag).items()})
    ctx.close()
    w.close()
    bad = [k for k, v in results.items() if not v]
    print(f"PROBE {phase}: {len(results) - len(bad)} of {len(results)} pinned and round-tripped; "
          f"failed: {', '.join(bad) if bad else 'none'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
