"""Shared set-up and timing for the asv benchmarks.

Self-contained on purpose: it uses only gdrpy's public API (open, memory,
pin/map, Transfer, ThresholdPicker), so the suite also runs against an
installed gdrpy that predates ``gdrpy.tools.bench``.

* Backend: ``$GDRPY_BENCH_BACKEND`` (``auto`` when unset; ``auto`` never picks
  ``sim``), device ``$GDRPY_BENCH_DEVICE`` (default 0).  Where the backend
  does not open, ``setup`` raises NotImplementedError, which asv reports as
  skipped ("n/a").  ``GDRPY_BENCH_BACKEND=sim`` runs everything on host
  memory (not GPU numbers).
* Timing: ``time.perf_counter_ns``, GC off, one untimed call, a short timed
  warm-up; calls under 2 us are timed in batches (sample = batch mean, a
  batch ~10 us), slower ones one by one; the median of ``$GDRPY_BENCH_SAMPLES``
  samples (default 200), fewer when that would take more than ~1 s.  The
  benchmarks return medians (``track_*``), so asv stores our statistic
  rather than timing the Python loop itself.
"""

from __future__ import annotations

import gc
import math
import os
import time

BACKEND = os.environ.get("GDRPY_BENCH_BACKEND") or "auto"
DEVICE = int(os.environ.get("GDRPY_BENCH_DEVICE") or 0)
SAMPLES = int(os.environ.get("GDRPY_BENCH_SAMPLES") or 200)
MAX_TIME_NS = float(os.environ.get("GDRPY_BENCH_MAX_TIME") or 1.0) * 1e9

#: Sizes of the latency benchmarks (bytes).
LATENCY_SIZES = [8, 64, 4096, 65536, 1 << 20]
#: Sizes of the bandwidth benchmarks (bytes).
BANDWIDTH_SIZES = [1 << 20, 64 << 20]


def open_context():
    """gdrpy.open on the chosen backend, or NotImplementedError (asv: skip)."""
    try:
        import gdrpy
    except ImportError as e:
        raise NotImplementedError(f"gdrpy is not importable: {e}") from None
    try:
        return gdrpy.open(DEVICE, BACKEND)
    except gdrpy.GdrError as e:
        raise NotImplementedError(
            f"backend {BACKEND!r} does not open on device {DEVICE} ({e}); set "
            f"GDRPY_BENCH_BACKEND=sim to run on host memory") from None


class Fixture:
    """A context, ``nbytes`` of device memory pinned and mapped, a host buffer."""

    def __init__(self, nbytes: int):
        import numpy as np

        import gdrpy
        self.ctx = open_context()
        try:
            self.buf = gdrpy.memory.alloc(max(nbytes, 4096), ctx=self.ctx)
            self.pin = self.ctx.pin(self.buf)
            self.m = self.pin.map()
        except BaseException:
            self.ctx.close()
            raise
        base = ((np.arange(4099, dtype=np.uint32) * 7 + 3) & 0xFF).astype(np.uint8)
        self.host = np.resize(base, max(nbytes, 4096))
        self.src = self.host[:nbytes]

    def transfer(self, picker: str):
        """A Transfer: 'auto' = the context's default picker (what gdrpy.put
        uses), or fixed to 'always-mapping' / 'always-ce'."""
        import gdrpy
        from gdrpy.threshold import ThresholdPicker
        if picker == "auto":
            return self.m.transfer()
        return gdrpy.Transfer(self.m, ThresholdPicker(h2d=picker, d2h=picker, identity=None))

    def close(self):
        for obj in ("m", "pin", "buf"):
            o = getattr(self, obj, None)
            if o is not None:
                o.close()
        self.ctx.close()


def close_fixture(bench) -> None:
    """Teardown: asv calls it even when setup raised (NotImplementedError)."""
    f = getattr(bench, "f", None)
    if f is not None:
        bench.f = None
        f.close()


def _time(fn, args, count, batch, out):
    pc = time.perf_counter_ns
    r = range(batch)
    for _ in range(count):
        t0 = pc()
        for _ in r:
            fn(*args)
        t1 = pc()
        out.append((t1 - t0) / batch)


def median_ns(fn, args=(), samples: int | None = None) -> float:
    """Median nanoseconds per call of ``fn(*args)`` (see the module docstring)."""
    samples = samples or SAMPLES
    was = gc.isenabled()
    gc.disable()
    try:
        fn(*args)
        warm: list = []
        start = time.perf_counter_ns()
        while len(warm) < 10 and (len(warm) < 2 or time.perf_counter_ns() - start < 50e6):
            _time(fn, args, 1, 1, warm)
        est = sorted(warm)[len(warm) // 2]
        batch = 1 if est >= 2000 else int(min(1000, max(2, math.ceil(10_000 / max(est, 1)))))
        n = max(5, min(samples, int(MAX_TIME_NS / max(est * batch, 1))))
        out: list = []
        _time(fn, args, n, batch, out)
    finally:
        if was:
            gc.enable()
    out.sort()
    k = len(out)
    return out[k // 2] if k & 1 else 0.5 * (out[k // 2 - 1] + out[k // 2])


def median_us(fn, args=(), samples: int | None = None) -> float:
    return median_ns(fn, args, samples) / 1e3


def gbps(nbytes: int, fn, args=()) -> float:
    """GB/s (1e9 bytes per second) from the median time of one call."""
    return nbytes / median_ns(fn, args)
