#!/usr/bin/env python3
"""chan_floor.py - the C channel's 4-byte round trip next to GDRCopy's
flag-only ping-pong (pplat), process by process, on one GPU machine.

Issue 15's C target (<= 1.6 us) is one process's median. A process's median
moves with where its memory lands, and so does pplat's flag-only loop (one
flag word each way, no payload, one fixed answer line): the least a
host -> GPU -> host round trip through the BAR1 mapping can cost on the
machine. This script runs ROUNDS pairs of processes, interleaved, both on
one CPU near the GPU:

  gdrpy_chanpp --sizes 32,4 --alloc vmm --near --answer tag  (the suite's C tool)
  gdrcopy_pplat -a cuMemAlloc -t 10000                       (flag only)

and prints each pair, the spread of both, how many C medians are <= 1.6,
and the median of the paired differences (C - pplat).

  scripts/chan_floor.py --pplat PATH [--cubin FILE] [--rounds 12] [--cpu N]
                        [--json FILE]

--pplat: a gdrcopy_pplat built against our libgdrapi.so.2
(scripts/gdrcopy_tests.sh --only pplat builds one in WORK/build). --cubin:
the ping-pong kernels (gdrpy/tools/channel_kernels.cu) compiled for this
GPU; without it they are compiled as `bench pingpong` compiles them (NVRTC
for this GPU, GDRPY_PP_POLL_PIPE honoured). GPU machines only: there is
nothing to compare on the sim backend.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from gdrpy.tools.pingpong import chanpp_command
from gdrpy.tools.pingpong_report import TARGETS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_US = TARGETS["c_us"]


def near_cpu() -> int:
    """The CPU `bench pingpong` pins to (gdrpy.numa.near_cpu of GPU 0)."""
    import gdrpy
    from gdrpy import numa
    with gdrpy.open(0) as ctx:
        if ctx.is_sim:
            sys.exit("chan_floor.py: the sim backend was chosen; this needs a GPU")
        cpu = numa.near_cpu(ctx)
    if cpu is None:
        sys.exit("chan_floor.py: no CPU near the GPU is known; pass --cpu")
    return cpu


def write_kernel_image(out: str) -> None:
    """The ping-pong kernels as `bench pingpong` builds them for GPU 0."""
    from gdrpy.tools.cuda_rt import GpuRuntime
    from gdrpy.tools.pingpong import kernel_source, pipe_options
    module = GpuRuntime(0).compile(kernel_source(), "channel_kernels.cu", pipe_options())
    try:
        with open(out, "wb") as f:
            f.write(module.image)
    finally:
        module.close()


def chanpp_c4(tool: str, cubin: str, cpu: int) -> dict | None:
    """One gdrpy_chanpp process: its `c` row for 4 bytes (median, mean, p99)."""
    cmd = chanpp_command(tool, [32, 4], 10000, 32, cpu=cpu, cubin=cubin)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        print("chan_floor.py: gdrpy_chanpp did not finish in 120 s", file=sys.stderr)
        return None
    for line in p.stdout.splitlines():
        try:
            row = json.loads(line) if line.startswith("{") else {}
        except ValueError:
            continue
        if row.get("path") == "c" and row.get("size") == 4:
            return {k: row[k] for k in ("median_us", "mean_us", "p99_us")}
    print(f"chan_floor.py: gdrpy_chanpp exited {p.returncode}: {p.stderr.strip()[-300:]}",
          file=sys.stderr)
    return None


def pplat_flag(pplat: str, cpu: int) -> float | None:
    """One pplat process, flag only: the median of its bucket means (us)."""
    try:
        p = subprocess.run(["taskset", "-c", str(cpu), pplat, "-a", "cuMemAlloc", "-t", "10000"],
                           capture_output=True, text=True, timeout=120,
                           cwd=os.path.dirname(os.path.abspath(pplat)))
    except subprocess.TimeoutExpired:
        print("chan_floor.py: pplat did not finish in 120 s", file=sys.stderr)
        return None
    m = re.search(r"\(median\) ([0-9.]+)", p.stdout)
    if not m:
        print(f"chan_floor.py: pplat exited {p.returncode}: {(p.stdout + p.stderr)[-300:]}",
              file=sys.stderr)
        return None
    return float(m.group(1))


def spread(xs: list[float]) -> str:
    return f"{min(xs):.3f} / {statistics.median(xs):.3f} / {max(xs):.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pplat", required=True, help="gdrcopy_pplat built on our libgdrapi")
    ap.add_argument("--chanpp", default=os.path.join(ROOT, "native", "build", "gdrpy_chanpp"))
    ap.add_argument("--cubin", help="channel_kernels.cu compiled (default: nvcc compiles it)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--cpu", type=int, help="default: the last allowed CPU near the GPU")
    ap.add_argument("--json", help="write the pairs and the summary here")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    for what, path in (("--pplat", a.pplat), ("--chanpp", a.chanpp)):
        if not os.access(path, os.X_OK):
            ap.error(f"{what} {path} is not an executable file")
    cpu = a.cpu if a.cpu is not None else near_cpu()
    with tempfile.TemporaryDirectory(prefix="chan-floor-") as tmp:
        cubin = a.cubin or os.path.join(tmp, "channel_kernels.cubin")
        if not a.cubin:
            write_kernel_image(cubin)
        pairs = []
        for r in range(a.rounds):
            c = chanpp_c4(a.chanpp, cubin, cpu)
            f = pplat_flag(a.pplat, cpu)
            pairs.append({"c4": c, "pplat_flag_us": f})
            cs = (f"{c['median_us']:.3f} (mean {c['mean_us']:.3f}, p99 {c['p99_us']:.3f})"
                  if c else "-")
            fs = f"{f:.3f}" if f is not None else "-"
            print(f"  pair {r + 1:2d}: C 4 B median {cs}   pplat flag only {fs}", flush=True)
    cs = [p["c4"]["median_us"] for p in pairs if p["c4"]]
    fs = [p["pplat_flag_us"] for p in pairs if p["pplat_flag_us"] is not None]
    both = [p["c4"]["median_us"] - p["pplat_flag_us"] for p in pairs
            if p["c4"] and p["pplat_flag_us"] is not None]
    summary = {"cpu": cpu, "pairs": len(pairs), "target_us": TARGET_US,
               "c4_medians_us": cs, "pplat_flag_us": fs,
               "c4_at_or_under_target": sum(x <= TARGET_US for x in cs),
               "pplat_flag_at_or_under_target": sum(x <= TARGET_US for x in fs),
               "paired_difference_median_us": statistics.median(both) if both else None}
    if cs and fs:
        print(f"CHANFLOOR {len(pairs)} pairs on CPU {cpu}: C 4 B per-process median "
              f"min / median / max {spread(cs)} us, "
              f"{summary['c4_at_or_under_target']}/{len(cs)} <= {TARGET_US}; "
              f"pplat flag only {spread(fs)} us, "
              f"{summary['pplat_flag_at_or_under_target']}/{len(fs)} <= {TARGET_US}; "
              f"C - pplat, paired: median {summary['paired_difference_median_us']:+.3f} us")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"pairs": pairs, "summary": summary}, fh, indent=1)
    return 0 if len(cs) == len(pairs) and len(fs) == len(pairs) else 1


if __name__ == "__main__":
    sys.exit(main())
