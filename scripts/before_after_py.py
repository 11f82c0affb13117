"""One round of the Python side of scripts/before_after.sh.

Imports ``gdrpy`` from whatever tree is first on PYTHONPATH (the old or the new
build: only API that both have is used), opens one context, maps one buffer
and times Mapping.write / Mapping.read / Transfer.put / Transfer.get at the
given sizes with the same timing loop for both trees, then --pinmap times
ctx.pin(buf) + pin.map() of a --pinmap-bytes buffer (and close of both).
Prints ONE JSON line:

  {"tree": ..., "gdrpy": <path of the imported package>, "backend": ...,
   "rows": {"py Transfer.put 8": [median_ns, p99_ns], ...}, "batch": {...}}

Method: a warm-up (every op for --warmup s), then --blocks interleaved blocks
(in each block every op, in a rotated order, gets --per-block samples); a
sample is the mean of B back-to-back calls (B chosen for ~--sample-us us per
sample, 1..256), timed with perf_counter_ns.  A row is the median and p99 of
all samples of the op in this process; the shell driver runs many such
processes (rounds), old and new alternating, and reports the median of the
round medians (and of the round p99s).

The thresholds are fixed by the driver's environment (GDRPY_THRESHOLD_H2D/D2H
and GDRPY_AUTOCALIBRATE=0), so put/get take the mapping path for the sizes
measured here in both trees, with no calibration and no adaptation probes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _timed(fn, args: tuple, batch: int, count: int, out: list) -> None:
    pc = time.perf_counter_ns
    r = range(batch)
    if len(args) == 2:
        a, b = args
        for _ in range(count):
            t0 = pc()
            for _ in r:
                fn(a, b)
            out.append((pc() - t0) / batch)
    else:
        a, b, c = args
        for _ in range(count):
            t0 = pc()
            for _ in r:
                fn(a, b, c)
            out.append((pc() - t0) / batch)


def _pin_map(ctx, nbytes: int, count: int) -> dict:
    """ctx.pin(buf) + pin.map() of one buffer, then m.close() + pin.close(),
    ``count`` times (3 untimed first): median and p99 ns of each pair."""
    import numpy as np

    import gdrpy
    buf = gdrpy.memory.alloc(nbytes, ctx=ctx)
    pc = time.perf_counter_ns
    up, down = [], []
    for i in range(count + 3):
        t0 = pc()
        p = ctx.pin(buf)
        m = p.map()
        t1 = pc()
        m.close()
        p.close()
        t2 = pc()
        if i >= 3:
            up.append(t1 - t0)
            down.append(t2 - t1)
    buf.close()
    return {f"py {what} {nbytes}": [float(np.median(s)),
                                    float(np.percentile(s, 99, method="inverted_cdf"))]
            for what, s in (("pin+map", up), ("unmap+unpin", down))}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", required=True, help="label: old or new")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--sizes", default="8,64")
    ap.add_argument("--warmup", type=float, default=0.3, help="seconds")
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--per-block", type=int, default=20)
    ap.add_argument("--sample-us", type=float, default=10.0)
    ap.add_argument("--pinmap", type=int, default=200, help="pin+map samples (0: none)")
    ap.add_argument("--pinmap-bytes", type=int, default=1 << 16)
    a = ap.parse_args()

    import numpy as np

    import gdrpy

    sizes = [int(s) for s in a.sizes.split(",") if s]
    ctx = gdrpy.open(backend=a.backend)
    backend = ctx.backend
    buf = gdrpy.memory.alloc(max(max(sizes), 4096), ctx=ctx)
    pin = ctx.pin(buf)
    m = pin.map()
    t = m.transfer()
    host = np.arange(max(sizes), dtype=np.uint64).view(np.uint8)[:max(sizes)].copy()
    ops = []
    for n in sizes:
        hv = host[:n]
        ops += [(f"py Mapping.write {n}", m.write, (0, hv)),
                (f"py Transfer.put {n}", t.put, (0, hv)),
                (f"py Mapping.read {n}", m.read, (0, n, hv)),
                (f"py Transfer.get {n}", t.get, (0, hv))]
    # both paths must take the mapping (no copy engine, no probe) at these sizes
    for _name, fn, args in ops:
        fn(*args)
    paths = {}
    for n in sizes:
        if hasattr(t, "path_for"):
            paths[n] = (t.path_for("h2d", n), t.path_for("d2h", n))

    # warm-up, then the batch size per op from a short estimate
    batch = {}
    end = time.perf_counter() + a.warmup
    while time.perf_counter() < end:
        for name, fn, args in ops:
            est: list = []
            _timed(fn, args, 16, 4, est)
            batch[name] = max(1, min(256, int(a.sample_us * 1000 / max(min(est), 1.0))))
    samples: dict = {name: [] for name, _, _ in ops}
    k = len(ops)
    for blk in range(a.blocks):
        for j in range(k):
            name, fn, args = ops[(j + blk) % k]
            _timed(fn, args, batch[name], 3, [])          # re-warm after the switch
            _timed(fn, args, batch[name], a.per_block, samples[name])
    rows = {name: [float(np.median(s)), float(np.percentile(s, 99, method="inverted_cdf"))]
            for name, s in samples.items()}
    m.close()
    pin.close()
    buf.close()
    if a.pinmap > 0:
        rows.update(_pin_map(ctx, a.pinmap_bytes, a.pinmap))
    ctx.close()
    print(json.dumps({"tree": a.tree, "gdrpy": gdrpy.__file__, "backend": backend,
                      "rows": rows, "batch": batch,
                      "paths": {str(n): p for n, p in paths.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
