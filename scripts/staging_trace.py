"""Diagnostic: where a staged copy's time goes (GDRPY_STAGING_TRACE timelines).

    python scripts/staging_trace.py [--sizes 4M,16M,64M] [--threads 12] [--chunk 1M]
        [--depth 4] [--modes base,nt=in,wc=1] [--reps 5] [--chunks-of 16M]

For each mode (base or KEY=VALUE setting GDRPY_STAGING_KEY, e.g. wkind=plain,
rkind=evict, nt=in, dry=nocopy), size and direction
the last of --reps staged copies is traced and summarised in one line:
  total   wall time of the call, and GB/s
  eng     the copy engine's busy time (sum of DMA durations, timing events),
          its rate while busy, and its idle time between the first DMA start
          and the last DMA end (gaps: the engine waited for the CPU or the
          caller)
  lead    engine time before the first DMA started / after the last ended
  api     mean cuMemcpyAsync call cost (host)
  cpu     per-thread copy rate while copying (bytes / piece time, summed
          over pieces), the number of distinct CPUs used, and whether the
          caller's CPU copied pieces too
--chunks-of SIZE also prints the per-chunk timeline of that size's copies in
the --chunks-modes (host us: opened, copied, enqueue call; engine us: start, end).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

import gdrpy
from gdrpy import _core
from gdrpy._sizes import parse_size


def _records(path: str) -> list[dict]:
    recs: list[dict] = []
    cur: dict | None = None
    with open(path) as f:
        for line in f:
            p = line.split()
            if not p:
                continue
            if p[0] == "C":
                cur = {k: float(v) for k, v in (x.split("=") for x in p[1:])}
                cur["K"], cur["P"] = [], []
            elif p[0] == "K" and cur is not None:
                cur["K"].append([float(x) for x in p[1:]])
            elif p[0] == "P" and cur is not None:
                cur["P"].append([float(x) for x in p[1:]])
            elif p[0] == "E" and cur is not None:
                recs.append(cur)
                cur = None
    return recs


def _summary(r: dict) -> str:
    n, tot = r["n"], r["total_us"]
    ks = r["K"]
    gpu = [(k[6], k[7], k[1]) for k in ks if k[6] >= 0 and k[7] >= 0]
    s = f"{n / tot / 1e3:6.1f} GB/s {tot:8.1f} us"
    if gpu:
        busy = sum(e - b for b, e, _ in gpu)
        idle = sum(max(0.0, gpu[i][0] - gpu[i - 1][1]) for i in range(1, len(gpu)))
        rate = sum(ln for _, _, ln in gpu) / max(busy, 1e-9) / 1e3
        s += (f" | eng busy {busy:7.1f} us at {rate:5.1f} GB/s idle {idle:6.1f} us"
              f" lead {gpu[0][0]:5.1f} tail {tot - gpu[-1][1]:6.1f}")
    api = [k[5] - k[4] for k in ks if k[5] > 0]
    if api:
        s += f" | api {sum(api) / len(api):4.1f} us"
    ps = [p for p in r["P"] if p[4] > 0]
    if ps:
        t = sum(p[3] - p[2] for p in ps)
        cpus = {int(p[1]) for p in ps}
        s += (f" | cpu {sum(p[4] for p in ps) / max(t, 1e-9) / 1e3:5.1f} GB/s/thread"
              f" on {len(cpus)} cpus{' +caller' if int(r['caller_cpu']) in cpus else ''}"
              f" span {max(p[3] for p in ps) - min(p[2] for p in ps):7.1f} us")
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="nvrm")
    ap.add_argument("--sizes", default="4M,16M,64M")
    ap.add_argument("--threads", type=int, default=12)
    ap.add_argument("--chunk", default="1M")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--modes", default="base")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--chunks-of", default="")
    ap.add_argument("--chunks-modes", default="",
                    help="modes whose --chunks-of timelines are printed (default: the first)")
    a = ap.parse_args(argv)
    sizes = [parse_size(x) for x in a.sizes.split(",")]
    show = parse_size(a.chunks_of) if a.chunks_of else -1
    show_modes = (a.chunks_modes or a.modes.split(",")[0]).split(",")
    top = max(sizes)
    fd, path = tempfile.mkstemp(prefix="gdrpy-trace-", suffix=".txt")
    os.close(fd)
    os.environ["GDRPY_STAGING_TRACE"] = path
    with gdrpy.open(0, a.backend) as ctx:
        buf = gdrpy.memory.alloc(top, ctx=ctx)
        pin = ctx.pin(buf)
        host = np.ones(top, np.uint8)
        try:
            for mode in a.modes.split(","):
                for var in ("NT", "DRY", "PPT", "SPIN_US", "WC", "WKIND", "RKIND"):
                    os.environ.pop("GDRPY_STAGING_" + var, None)
                key, _, val = mode.partition("=")
                if key != "base":
                    os.environ["GDRPY_STAGING_" + key.upper()] = val
                _core.staging_config(ctx, 64 << 10, 2, 1)   # the ring reads the
                pin.ce_write(0, host[:1], method="staged")  # environment when built
                _core.staging_config(ctx, parse_size(a.chunk), a.depth, a.threads)
                pin.ce_write(0, host[:1], method="staged")
                cfg = _core.staging_config(ctx)
                print(f"{mode}: kinds in use: write {cfg['write_used']} read {cfg['read_used']}")
                for n in sizes:
                    for d in ("put", "get"):
                        for _ in range(a.reps):
                            open(path, "w").close()
                            if d == "put":
                                pin.ce_write(0, host[:n], method="staged")
                            else:
                                pin.ce_read(0, n, host[:n], method="staged")
                        recs = _records(path)
                        if not recs:
                            print(f"{mode:9s} {d} {n >> 20:3d} MiB: no trace record")
                            continue
                        r = recs[-1]
                        print(f"{mode:9s} {d} {n >> 20:3d} MiB T{a.threads}: {_summary(r)}",
                              flush=True)
                        if n == show and mode in show_modes:
                            print("   chunk     len   open copied   enq0   enq1  e.start  "
                                  "e.end")
                            for k in r["K"]:
                                print(f"   {int(k[0]):5d} {int(k[1]) >> 10:6d}K " +
                                      " ".join(f"{x:6.1f}" for x in k[2:6]) +
                                      f" {k[6]:8.1f} {k[7]:6.1f}")
        finally:
            pin.close()
            buf.close()
            os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
