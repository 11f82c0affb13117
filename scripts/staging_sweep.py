#!/usr/bin/env python3
"""Sweep the staging ring's parameters on a GPU and print staged put/get rates
from pageable memory next to the pinned copy-engine rate (issue 14).

    PYTHONPATH=. python3 scripts/staging_sweep.py [--backend nvrm] [--sizes 4M,16M,64M]
        [--threads 1,2,4,8,12] [--chunks 1M,2M,4M] [--depths 3,4,6] [--reps 7]

One line per (threads, chunk, depth): GB/s from the median of --reps calls per
size and direction, and that rate as a % of the pinned rate (a gdrpy host
buffer copied directly: method 'locked') measured first in the same run.  A
single-thread numpy copy from pageable into page-locked memory is printed as
the CPU-copy reference.  Takes a few seconds on an H100 host.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import numpy as np
from staging_bench import pinned_rates, staging_bench

from gdrpy import _core
from gdrpy._sizes import parse_size
from gdrpy.staging import _timer as _median_s  # median seconds after one warm-up


def _list(text: str, conv: Callable[[str], int]) -> list[int]:
    return [conv(x) for x in text.split(",") if x.strip()]


def _bar1(pin, host, sizes: list[int], threads: list[int], ref: dict, reps: int) -> None:
    """Aggregate put rate by CPU stores through the BAR1 mapping, the message
    split into equal parts over T Python threads (Mapping.write drops the GIL)."""
    from concurrent.futures import ThreadPoolExecutor
    m = pin.map()
    try:
        for t in threads:
            with ThreadPoolExecutor(t) as ex:
                for n in sizes:
                    part = -(-n // t)

                    def op(n=n, part=part, t=t):
                        futs = [ex.submit(m.write, i * part, host[i * part:min(n, (i + 1) * part)])
                                for i in range(t) if i * part < n]
                        for f in futs:
                            f.result()
                    gb = n / _median_s(op, reps) / 1e9
                    print(f"BAR1 write {t:2d} threads {n >> 20:3d} MiB: {gb:5.1f} GB/s "
                          f"({100 * gb / ref[n]['put']:3.0f}% of pinned put)", flush=True)
    finally:
        m.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="nvrm")
    ap.add_argument("--sizes", default="4M,16M,64M")
    ap.add_argument("--threads", default="1,2,4,8,12")
    ap.add_argument("--chunks", default="1M,2M,4M")
    ap.add_argument("--depths", default="3,4,6")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--modes", default="base",
                    help="comma list of base or KEY=VALUE (sets GDRPY_STAGING_KEY): "
                         "nt=in|out|both, dry=nodma|nocopy (the CPU side or the engine side "
                         "of the pipeline alone), ppt=N (pieces per thread), spin_us=N")
    ap.add_argument("--bar1", default="",
                    help="thread counts: also time puts by CPU stores through the BAR1 "
                         "mapping split over that many Python threads")
    a = ap.parse_args(argv)
    sizes = _list(a.sizes, parse_size)
    top = max(sizes)
    with staging_bench(a.backend, top) as b:
        ctx, pin, host = b.ctx, b.pin, b.host
        ref = pinned_rates(b, sizes, a.reps)
        for n in sizes:
            tc = _median_s(lambda n=n: np.copyto(b.locked[:n], host[:n]), a.reps)
            print(f"numpy copy pageable->pinned {n >> 20:3d} MiB: {n / tc / 1e9:5.1f} GB/s "
                  f"(1 thread)")
        best: dict = {}
        if a.bar1:
            _bar1(pin, host, sizes, _list(a.bar1, int), ref, a.reps)
        head = "mode        threads  chunk  depth  " + "  ".join(
            f"put {n >> 20:>3d}M       get {n >> 20:>3d}M      " for n in sizes)
        print(head)
        shapes = [(nt, t, c, d) for nt in a.modes.split(",") for t in _list(a.threads, int)
                  for c in _list(a.chunks, parse_size) for d in _list(a.depths, int)]
        mode = None
        for nt, t, c, d in shapes:
            if mode != nt:
                mode = nt
                for var in ("NT", "DRY", "PPT", "SPIN_US", "WC", "WKIND", "RKIND"):
                    os.environ.pop("GDRPY_STAGING_" + var, None)
                key, _, val = nt.partition("=")
                if key != "base":
                    os.environ["GDRPY_STAGING_" + key.upper()] = val
                _core.staging_config(ctx, 64 << 10, 2, 1)   # read when the ring is built:
                pin.ce_write(0, host[:1], method="staged")  # force a rebuild
            _core.staging_config(ctx, c, d, t)
            cells = []
            for n in sizes:
                src = host[:n]
                tw = _median_s(lambda src=src: pin.ce_write(0, src, method="staged"),
                               a.reps)
                tr = _median_s(lambda src=src, n=n: pin.ce_read(0, n, src,
                                                                 method="staged"),
                               a.reps)
                for key, gb, r in (("put", n / tw / 1e9, ref[n]["put"]),
                                   ("get", n / tr / 1e9, ref[n]["get"])):
                    cells.append(f"{gb:5.1f} ({100 * gb / r:3.0f}%)")
                    if gb > best.get((key, n), (0.0,))[0]:
                        best[(key, n)] = (gb, nt, t, c, d)
            print(f"{nt:10s}  {t:7d}  {c >> 10:4d}K  {d:5d}  " + "  ".join(cells),
                  flush=True)
        for (key, n), (gb, nt, t, c, d) in sorted(best.items()):
            print(f"best {key} {n >> 20} MiB: {gb:.1f} GB/s "
                  f"({100 * gb / ref[n][key]:.0f}% of pinned) "
                  f"nt {nt} threads {t} chunk {c >> 10}K depth {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
