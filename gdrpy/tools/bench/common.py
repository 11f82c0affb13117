"""Shared pieces of the benchmarks: defaults, size lists, number formatting, sample
statistics, text tables and the JSON writer."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from ..._sizes import format_size, parse_sizes
from ..stats import summarize

SIM_NOTE = "SIM: host memory stands in for the GPU; no GPU numbers"

DEFAULT_SIZES = {
    "latency": "1,8,64,512,4K,64K,1M",
    "bandwidth": "4K,16K,64K,256K,1M,2M,4M,8M,16M,64M,256M",
    "transfer": ",".join([str(1 << i) for i in range(27)] + ["3K", "96K", "192K", "384K"]),
}

#: Methods faster than this (estimate per call, ns) are timed in batches.
BATCH_BELOW_NS = 2000.0
#: A batch is sized to take about this long (ns).
BATCH_TARGET_NS = 10_000.0
BATCH_MAX = 1000

# Per-command defaults: (iters, warmup, max_time_s, rounds, min_samples); quick variants.
_DEFAULTS = {
    "latency": dict(iters=1000, warmup=50, max_time=1.0, rounds=5, min_samples=5),
    "bandwidth": dict(iters=50, warmup=3, max_time=2.0, rounds=3, min_samples=5),
    "transfer": dict(iters=300, warmup=10, max_time=3.0, rounds=0, min_samples=5),
}
_QUICK = {
    "latency": dict(iters=20, warmup=3, max_time=0.02, rounds=1, min_samples=3),
    "bandwidth": dict(iters=3, warmup=1, max_time=0.05, rounds=1, min_samples=2),
    "transfer": dict(iters=10, warmup=2, max_time=0.05, rounds=0, min_samples=3),
}
_WARMUP_TIME_NS = {False: 200e6, True: 20e6}

DIRECTIONS = ("h2d", "d2h")
_DIR_TEXT = {"h2d": "host -> GPU", "d2h": "GPU -> host"}


def _sizes_arg(text: str) -> list[int]:
    try:
        return parse_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _fmt(x: float | None) -> str:
    """About three significant digits, no exponent."""
    if x is None or not math.isfinite(x):
        return "-"
    a = abs(x)
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def stats(samples_ns: list) -> dict:
    """median / p99 (nearest rank, see gdrpy.tools.stats) / mean / min / max in
    microseconds, and n."""
    st = summarize(samples_ns, scale=1e3)
    if not st["n"]:
        return {"n": 0, "median_us": None, "p99_us": None, "mean_us": None, "min_us": None,
                "max_us": None}
    return {"n": st["n"], "median_us": st["median"], "p99_us": st["p99"],
            "mean_us": st["mean"], "min_us": st["min"], "max_us": st["max"]}


# ---------------------------------------------------------------------------
# Tables

def _table(headers: list, rows: list, aligns: str | None = None) -> str:
    """Aligned text table; aligns: one of 'l'/'r' per column (default: first
    column left, others right)."""
    cols = len(headers)
    aligns = aligns or ("l" + "r" * (cols - 1))
    widths = [len(str(h)) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(str(c)))

    def line(cells):
        out = []
        for i, c in enumerate(cells):
            s = str(c)
            out.append(s.ljust(widths[i]) if aligns[i] == "l" else s.rjust(widths[i]))
        return "  ".join(out).rstrip()
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def _ok_text(row: dict) -> str:
    if row.get("error"):
        return "ERROR"
    v = row.get("verified")
    return "yes" if v else ("-" if v is None else "NO")


_DETAIL_COLS = (("size", 8, "l"), ("dir", 4, "l"), ("method", 36, "l"),
                ("median us", 10, "r"), ("p99 us", 10, "r"), ("mean us", 10, "r"),
                ("min us", 10, "r"), ("B", 5, "r"), ("n", 6, "r"), ("GB/s", 8, "r"),
                ("ok", 5, "l"))


def _fixed_line(cells, cols) -> str:
    out = []
    for c, (_, w, a) in zip(cells, cols, strict=False):
        s = str(c)
        out.append(s.ljust(w) if a == "l" else s.rjust(w))
    return "  ".join(out).rstrip()


def _fixed_header(cols) -> str:
    return (_fixed_line([c[0] for c in cols], cols) + "\n"
            + "  ".join("-" * w for _, w, _ in cols))


def _detail_line(r: dict) -> str:
    return _fixed_line([format_size(r["size"]), r["direction"], r["method"],
                        _fmt(r["median_us"]), _fmt(r["p99_us"]), _fmt(r["mean_us"]),
                        _fmt(r["min_us"]), r["batch"],
                        r["samples"] if r["samples"] is not None else "-",
                        _fmt(r.get("gbps_median")), _ok_text(r)], _DETAIL_COLS)


def _errors_text(rows: list) -> list:
    return [f"  {r['direction']} {format_size(r['size'])} {r['method']}: {r['error']}"
            for r in rows if r.get("error")]


# ---------------------------------------------------------------------------
# JSON and plots

def _write_json(path: str, doc: dict) -> None:
    def clean(o):
        if isinstance(o, float):
            return o if math.isfinite(o) else None
        if isinstance(o, dict):
            return {str(k): clean(v) for k, v in o.items() if not callable(v)}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        if isinstance(o, (np.integer,)):
            return int(o)
        if isinstance(o, (np.floating,)):
            return clean(float(o))
        if isinstance(o, (str, int, bool)) or o is None:
            return o
        return str(o)
    with open(path, "w") as f:
        json.dump(clean(doc), f, indent=1, allow_nan=False)
        f.write("\n")
    print(f"JSON written to {path}")
