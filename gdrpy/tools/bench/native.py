"""The C benchmark (gdrpy_copylat): find it, run it, and turn its rows into ours."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time

import gdrpy

from .common import DIRECTIONS

# ---------------------------------------------------------------------------
# The C benchmark (native/build/gdrpy_copylat)

def _copylat_path(explicit: str | None) -> str | None:
    cands = []
    if explicit:
        cands.append(explicit)
    if os.environ.get("GDRPY_COPYLAT"):
        cands.append(os.environ["GDRPY_COPYLAT"])
    # gdrpy/tools/bench/native.py -> the source tree's root (a checkout built in place)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    cands.append(os.path.join(root, "native", "build", "gdrpy_copylat"))
    cands.append(os.path.join(gdrpy.bindir(), "gdrpy_copylat"))   # installed with the package
    w = shutil.which("gdrpy_copylat")
    if w:
        cands.append(w)
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def run_copylat(ctx, sizes: list, args, no_ce: bool = False) -> dict:
    """Run gdrpy_copylat on the same backend and device; its JSON (plus how
    it ran) or a dict with an 'error'."""
    path = _copylat_path(getattr(args, "copylat", None))
    if path is None:
        return {"error": "native/build/gdrpy_copylat not found: build it with "
                         "`make -C native bench` (or pass --copylat PATH)"}
    if len(sizes) > 64:
        sizes = sizes[:64]
    with tempfile.TemporaryDirectory(prefix="gdrpy-bench-") as td:
        jpath = os.path.join(td, "copylat.json")
        cmd = [path, "--backend", ctx.backend, "--device", str(ctx.device),
               "--sizes", ",".join(str(s) for s in sizes), "--json", jpath]
        if args.quick:
            cmd.append("--quick")
        if args.isa:
            cmd += ["--isa", args.isa]
        if args.cpu is not None:
            cmd += ["--cpu", str(args.cpu)]
        if no_ce:
            cmd.append("--no-ce")
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as e:
            return {"error": f"{path}: {e}", "cmd": cmd}
        dt = time.perf_counter() - t0
        out = {"cmd": cmd, "returncode": proc.returncode, "seconds": dt,
               "stdout": proc.stdout, "stderr": proc.stderr}
        try:
            with open(jpath) as f:
                out["json"] = json.load(f)
        except (OSError, ValueError) as e:
            out["error"] = (f"gdrpy_copylat exited {proc.returncode} without JSON ({e}): "
                            f"{proc.stderr.strip()[-500:]}")
    return out


# C op name -> (direction, key, method, short)
_C_OPS = {
    "to_mapping": ("h2d", "c_kernel", "C copy_to_mapping (+sfence)", "C kernel"),
    "to_mapping+rb": ("h2d", "c_kernel_rb", "C copy_to_mapping + 8 B read-back", "C kern+rb"),
    "from_mapping": ("d2h", "c_kernel", "C copy_from_mapping", "C kernel"),
    "cuMemcpyHtoD (pinned)": ("h2d", "c_cumemcpy", "C cuMemcpyHtoD (pinned)", "C cuMemcpy"),
    "gdrpy_memcpy_htod (sim)": ("h2d", "c_cumemcpy", "C gdrpy_memcpy_htod (sim)", "C cuMemcpy"),
    "cuMemcpyDtoH (pinned)": ("d2h", "c_cumemcpy", "C cuMemcpyDtoH (pinned)", "C cuMemcpy"),
    "gdrpy_memcpy_dtoh (sim)": ("d2h", "c_cumemcpy", "C gdrpy_memcpy_dtoh (sim)", "C cuMemcpy"),
    "raw NT store": ("h2d", "c_raw", "C raw NT store loop (best ISA)", "C raw NT"),
    "raw NT load": ("d2h", "c_raw", "C raw NT load loop (best ISA)", "C raw NT"),
}


def c_rows(c: dict, command: str) -> list:
    """Rows of the C benchmark in our row format (raw loops: the best ISA per
    size; kernels: the dispatched one unless --isa)."""
    js = c.get("json") or {}
    best: dict = {}
    for r in js.get("results", []):
        spec = _C_OPS.get(r.get("op"))
        if spec is None:
            continue
        direction, key, method, short = spec
        k = (direction, key, r["size"])
        if k in best and best[k]["median_ns"] <= r["median_ns"]:
            continue
        best[k] = r
    rows = []
    korder = ["c_kernel", "c_kernel_rb", "c_cumemcpy", "c_raw"]
    for (direction, key, size), r in sorted(
            best.items(), key=lambda kv: (kv[0][2], DIRECTIONS.index(kv[0][0]),
                                          korder.index(kv[0][1]))):
        spec = _C_OPS[r["op"]]
        med = r["median_ns"] / 1e3
        rows.append({
            "command": command, "direction": direction, "method": spec[2], "key": key,
            "library": "C", "size": size, "samples": r.get("iters"), "batch": 1,
            "calls": r.get("iters"), "median_us": med, "p99_us": r["p99_ns"] / 1e3,
            "mean_us": r.get("mean_ns", 0) / 1e3, "min_us": r["min_ns"] / 1e3, "max_us": None,
            "estimate_us": None, "verified": js.get("verify_ok"), "error": None,
            "gbps_median": r.get("gbps_median"), "bytes_per_iter": r.get("bytes"),
            "isa": r.get("isa"), "timer": "rdtscp", "short": spec[3],
            "pct_of_raw": r.get("pct_of_raw")})
    return rows


def _c_summary_line(c: dict) -> str:
    js = c.get("json") or {}
    if "error" in c:
        return f"C benchmark: skipped - {c['error']}"
    return (f"C benchmark: {os.path.basename(c['cmd'][0])} ({c['seconds']:.2f} s, exit "
            f"{c['returncode']}), TSC {js.get('tsc_ghz', 0):.3f} GHz, rdtscp overhead "
            f"{js.get('timer_overhead_ns', 0):.1f} ns (included), copy kernel "
            f"{js.get('auto_isa')}, verify {'OK' if js.get('verify_ok') else 'FAILED'}; each "
            f"call timed alone")
