"""What the staging diagnostics share (scripts/staging_plans.py,
scripts/staging_sweep.py): a GPU buffer pinned on device 0, a page-locked
and a pageable host buffer of the same size, and the pinned copy-engine
rates the staged ones are compared with."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

import gdrpy
from gdrpy.staging import _timer as median_s  # median seconds after one warm-up


@dataclass
class Bench:
    ctx: Any
    pin: Any
    locked: np.ndarray   # page-locked (gdrpy host_alloc), filled
    host: np.ndarray     # pageable, filled (every page present)


@contextlib.contextmanager
def staging_bench(backend: str, nbytes: int) -> Iterator[Bench]:
    with gdrpy.open(0, backend) as ctx:
        buf = gdrpy.memory.alloc(nbytes, ctx=ctx)
        pin = ctx.pin(buf)
        hb = gdrpy.memory.host_alloc(nbytes, ctx=ctx)
        b = Bench(ctx, pin, hb.numpy(), np.ones(nbytes, np.uint8))
        b.locked[:] = 1
        try:
            yield b
        finally:
            b.locked = np.empty(0, np.uint8)   # lets go of the buffer export
            hb.close()
            pin.close()
            buf.close()


def pinned_rates(b: Bench, sizes: list[int], reps: int) -> dict[int, dict[str, float]]:
    """GB/s of the copy engines from/into the page-locked buffer, per size:
    {"put": ..., "get": ...}; printed as measured."""
    ref = {}
    for n in sizes:
        tw = median_s(lambda n=n: b.pin.ce_write(0, b.locked[:n], method="locked"), reps)
        tr = median_s(lambda n=n: b.pin.ce_read(0, n, b.locked[:n], method="locked"), reps)
        ref[n] = {"put": n / tw / 1e9, "get": n / tr / 1e9}
        print(f"pinned {n >> 20:3d} MiB: put {ref[n]['put']:5.1f} GB/s  "
              f"get {ref[n]['get']:5.1f} GB/s", flush=True)
    return ref
