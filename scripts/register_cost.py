"""Diagnostic: what a one-shot cuMemHostRegister costs next to staging.

For each size: a fresh pageable numpy buffer (pages touched, as a caller's
would be), then cuMemHostRegister + cuMemcpyHtoD/DtoH + cuMemHostUnregister,
each part timed; next to the pinned (cuMemHostAlloc) copy rate.  Prints
medians in microseconds and the effective GB/s of register+copy+unregister.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

try:
    from cuda.bindings import driver as cu
except ImportError:  # older cuda-python
    from cuda import cuda as cu  # type: ignore[no-redef]


def chk(r: tuple) -> object:
    err = r[0]
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err}")
    return r[1] if len(r) == 2 else r[1:]


def parse_size(s: str) -> int:
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * m[s[-1]] if s[-1] in m else int(s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="1M,4M,16M,64M")
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    chk(cu.cuInit(0))
    dev = chk(cu.cuDeviceGet(0))
    ctx = chk(cu.cuDevicePrimaryCtxRetain(dev))
    chk(cu.cuCtxSetCurrent(ctx))
    for s in a.sizes.split(","):
        n = parse_size(s)
        d = chk(cu.cuMemAlloc(n))
        hp = chk(cu.cuMemHostAlloc(n, 0))
        pin = {"h2d": [], "d2h": []}
        reg = {"reg": [], "h2d": [], "d2h": [], "unreg": [], "tot_h2d": [], "fault": []}
        for _ in range(a.reps):
            t0 = time.perf_counter()
            chk(cu.cuMemcpyHtoD(d, hp, n))
            t1 = time.perf_counter()
            chk(cu.cuMemcpyDtoH(hp, d, n))
            t2 = time.perf_counter()
            pin["h2d"].append(t1 - t0)
            pin["d2h"].append(t2 - t1)
        for r in range(a.reps):
            buf = np.empty(n + 4096, dtype=np.uint8)
            off = (-buf.ctypes.data) % 4096 if r % 2 == 0 else 64
            view = buf[off : off + n]
            tf = time.perf_counter()
            view[::4096] = 1  # first touch, as a caller's data would be
            view[:] = 7
            t0 = time.perf_counter()
            p = view.ctypes.data
            chk(cu.cuMemHostRegister(p, n, 0))
            t1 = time.perf_counter()
            chk(cu.cuMemcpyHtoD(d, p, n))
            t2 = time.perf_counter()
            chk(cu.cuMemcpyDtoH(p, d, n))
            t3 = time.perf_counter()
            chk(cu.cuMemHostUnregister(p))
            t4 = time.perf_counter()
            reg["fault"].append(t0 - tf)
            reg["reg"].append(t1 - t0)
            reg["h2d"].append(t2 - t1)
            reg["d2h"].append(t3 - t2)
            reg["unreg"].append(t4 - t3)
            reg["tot_h2d"].append((t1 - t0) + (t2 - t1) + (t4 - t3))
        med = {k: statistics.median(v) for k, v in reg.items()}
        ph = statistics.median(pin["h2d"])
        pd = statistics.median(pin["d2h"])
        us = {k: v * 1e6 for k, v in med.items()}
        print(
            f"{s:>4}: pinned h2d {n / ph / 1e9:5.1f} d2h {n / pd / 1e9:5.1f} GB/s | "
            f"register {us['reg']:8.0f} us  copy h2d {us['h2d']:7.0f} d2h {us['d2h']:7.0f} "
            f"unregister {us['unreg']:7.0f} us | "
            f"reg+h2d+unreg {n / med['tot_h2d'] / 1e9:5.1f} GB/s "
            f"({100 * ph / med['tot_h2d']:3.0f}% of pinned)  reg+d2h+unreg "
            f"{n / (med['reg'] + med['d2h'] + med['unreg']) / 1e9:5.1f} GB/s  "
            f"(touch+fill {us['fault']:.0f} us)",
            flush=True,
        )
        chk(cu.cuMemFreeHost(hp))
        chk(cu.cuMemFree(d))


if __name__ == "__main__":
    main()
