"""Plots (matplotlib, Agg) and the end of a run: JSON and plot files."""

from __future__ import annotations

import json
import math
import sys

import numpy as np

from .common import _DIR_TEXT, DIRECTIONS, format_size

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


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        print(f"note: --plot skipped: matplotlib is not installed ({e}); "
              f"pip install matplotlib", file=sys.stderr)
        return None
    return Figure, FigureCanvasAgg


def _title(meta: dict, what: str) -> str:
    t = f"gdrpy {what} - {meta['backend']}, {meta['gpu']}, {meta['copy_kernel']}"
    if meta["sim"]:
        t += "\nSIM: host memory stands in for the GPU - no GPU numbers"
    return t


def _plot_lines(ax, rows: list, direction: str, ykey: str, keys_order: list) -> None:
    by: dict = {}
    for r in rows:
        if r["direction"] != direction or r.get(ykey) is None or r.get("error"):
            continue
        by.setdefault(r["method"], []).append((r["size"], r[ykey]))
    for method in keys_order:
        pts = sorted(by.get(method, []))
        if not pts:
            continue
        xs, ys = zip(*pts, strict=True)
        style = "--" if method.startswith("C ") else "-"
        ax.plot(xs, ys, style, marker="o", markersize=3, label=method)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _size_ticks(ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _size_ticks(ax) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator
    ax.xaxis.set_major_locator(LogLocator(base=4))
    ax.xaxis.set_major_formatter(FuncFormatter(
        lambda x, _pos: format_size(int(round(x))) if x >= 1 else ""))


def _methods_in_order(rows: list) -> list:
    seen = []
    for r in rows:
        if r["method"] not in seen:
            seen.append(r["method"])
    return seen


def _save_plot(path: str, command: str, meta: dict, rows: list, extra: dict | None = None):
    mp = _matplotlib()
    if mp is None:
        return False
    Figure, Canvas = mp
    order = _methods_in_order(rows)
    if command == "transfer":
        fig = Figure(figsize=(15, 5))
        Canvas(fig)
        axes = fig.subplots(1, 3)
    else:
        fig = Figure(figsize=(12, 5))
        Canvas(fig)
        axes = fig.subplots(1, 2)
    ykey = "gbps_median" if command == "bandwidth" else "median_us"
    ylabel = "GB/s (from median)" if command == "bandwidth" else "median latency (us)"
    for ax, d in zip(axes, DIRECTIONS, strict=True):
        _plot_lines(ax, rows, d, ykey, order)
        ax.set_title(f"{d} ({_DIR_TEXT[d]})")
        ax.set_xlabel("bytes")
        ax.set_ylabel(ylabel)
    if command == "transfer" and extra:
        ax = axes[2]
        for d in DIRECTIONS:
            pts = sorted((g["size"], g["regret"] * 100) for g in extra["regret"]
                         if g["direction"] == d and g["regret"] is not None)
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o", markersize=3, label=d)
        ax.axhline(5, color="red", linestyle=":", linewidth=1, label="5 %")
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_xscale("log", base=2)
        _size_ticks(ax)
        ax.set_title("regret: auto / min(fixed) - 1")
        ax.set_xlabel("bytes")
        ax.set_ylabel("%")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(_title(meta, command), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")
    return True


def _finish(args, command: str, meta: dict, rows: list, doc_extra: dict) -> None:
    if args.json:
        doc = {"tool": "gdrpy bench", "schema": 1, "command": command, "meta": meta,
               "rows": rows, **doc_extra}
        _write_json(args.json, doc)
    if args.plot:
        try:
            _save_plot(args.plot, command, meta, rows, doc_extra)
        except Exception as e:  # a plot never costs the measurements
            print(f"note: --plot failed: {type(e).__name__}: {e}", file=sys.stderr)
