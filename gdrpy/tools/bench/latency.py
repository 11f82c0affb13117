"""``bench latency``: per-size latency, gdrpy next to the alternatives."""

from __future__ import annotations

import contextlib
import gc

from .alternatives import _alternatives, _gdrpy_ops
from .common import (
    _DETAIL_COLS,
    _DIR_TEXT,
    DEFAULT_SIZES,
    DIRECTIONS,
    SIM_NOTE,
    _detail_line,
    _errors_text,
    _fixed_header,
    _fmt,
    _table,
    format_size,
    parse_sizes,
)
from .native import _c_summary_line, c_rows, run_copylat
from .plot import _finish
from .session import (
    _picker_line,
    _print_methodology,
    _ready_default_picker,
    _session,
)
from .timing import Cfg, _Env, _verify, measure_group, measure_isolated, timer_overhead

# ---------------------------------------------------------------------------
# bench latency

def cmd_latency(args) -> int:
    sizes = args.sizes or parse_sizes(DEFAULT_SIZES["latency"])
    cfg = Cfg.from_args(args, "latency")
    rows: list = []
    skipped: list = []
    c = None
    with _session(args, "latency") as (ctx, meta):
        env = _Env(ctx, max(max(sizes), 4096))
        provs: list = []
        try:
            timer = timer_overhead()
            meta["timer"] = timer
            meta["config"] = cfg.as_dict()
            _print_methodology(cfg, timer, f", {cfg.rounds} interleaved round(s)")
            desc = _ready_default_picker(ctx, calibrate=not args.no_calibrate,
                                         budget=_calibrate_budget(args),
                                         save=not args.quick)
            desc.pop("picker")
            print(_picker_line(desc))
            meta["picker"] = desc
            transfer = env.m.transfer()      # what gdrpy.put/get use
            provs, skipped = _alternatives(ctx, env)
            for p in provs:
                print(f"compared with: {p.library} {p.version}"
                      + (f" ({p.how})" if hasattr(p, "how") else ""))
            for s in skipped:
                print(f"not compared: {s['library']} ({s['reason']})")
            if args.c:
                c = run_copylat(ctx, sizes, args)
                print(_c_summary_line(c))
            print()
            print(_fixed_header(_DETAIL_COLS))
            salt = 0
            for n in sizes:
                for d in DIRECTIONS:
                    ops = _gdrpy_ops(env, d, n, transfer) + [p.op(d, n) for p in provs]
                    for op in ops:
                        salt += 1
                        _verify(op, env, salt)
                    measure_group(ops, cfg)
                    for op in ops:
                        r = op.row("latency") | {"short": op.short}
                        print(_detail_line(r), flush=True)
                        rows.append(r)
            if c is not None and "json" in c:
                crows = [r for r in c_rows(c, "latency") if r["size"] in set(sizes)]
                for r in crows:
                    print(_detail_line(r))
                rows += crows
            iso = measure_isolated(env, transfer, sizes, 20 if args.quick else 2000,
                                   args.gap_us)
            if iso:
                print(f"\nisolated messages: each call timed alone (clock pair included, "
                      f"{timer.get('pair_median_ns', 0):.0f} ns) after {args.gap_us:g} us idle")
                for r in iso:
                    print(f"  {format_size(r['size']):>7} {r['direction']}  {r['method']:<40} "
                          f"median {_fmt(r['median_us'])} us  p99 {_fmt(r['p99_us'])} us")
            rows += iso
        finally:
            for p in provs:
                with contextlib.suppress(Exception):
                    p.close()
            # the last ops hold views of the buffer (torch/cupy/numpy): drop them
            ops = []
            op = None
            gc.collect()
            env.close()
    _finish(args, "latency", meta, rows, {"skipped": skipped, "c_benchmark": _c_for_json(c)})
    _print_errors(rows)
    print()
    print(_latency_summary(rows, sizes, meta))
    return 0


def _calibrate_budget(args) -> float:
    if args.calibrate_budget:
        return args.calibrate_budget
    return 0.5 if args.quick else 5.0


def _print_errors(rows: list) -> None:
    errs = _errors_text(rows)
    if errs:
        print("\nerrors (rows without numbers, or with ok=NO):")
        print("\n".join(errs))
    bad = [r for r in rows if r.get("verified") is False and not r.get("error")]
    for r in bad:
        print(f"  {r['direction']} {format_size(r['size'])} {r['method']}: the bytes did not "
              f"arrive intact (verification failed)")


def _c_for_json(c: dict | None):
    if c is None:
        return None
    out = {k: v for k, v in c.items() if k != "stdout"}
    out["stdout_tail"] = (c.get("stdout") or "")[-4000:]
    return out


_ALT_LIBS = ("cuda-python", "cupy", "torch")


def _latency_summary(rows: list, sizes: list, meta: dict) -> str:
    out = []
    sim = " [" + SIM_NOTE + "]" if meta["sim"] else ""
    for d in DIRECTIONS:
        drows = [r for r in rows if r["direction"] == d]
        cols = []
        for r in drows:
            lab = r.get("short") or r["method"]
            if lab not in cols:
                cols.append(lab)
        cell = {(r["size"], r.get("short") or r["method"]): r for r in drows}
        have_alt = any(r["library"] in _ALT_LIBS for r in drows)
        headers = ["size"] + cols + (["alt/put"] if have_alt else [])
        body = []
        for n in sizes:
            line = [format_size(n)]
            for lab in cols:
                r = cell.get((n, lab))
                if r is None or r.get("median_us") is None:
                    line.append("-")
                else:
                    line.append(f"{_fmt(r['median_us'])}/{_fmt(r['p99_us'])}")
            if have_alt:
                alts = [r["median_us"] for r in drows if r["size"] == n and r["library"] in
                        _ALT_LIBS and r.get("median_us")]
                put = cell.get((n, "put" if d == "h2d" else "get"))
                if alts and put and put.get("median_us"):
                    line.append(f"{min(alts) / put['median_us']:.1f}x")
                else:
                    line.append("-")
            body.append(line)
        out.append(f"summary {d} ({_DIR_TEXT[d]}): median/p99 us{sim}")
        out.append(_table(headers, body))
        out.append("")
    if any(r["library"] in _ALT_LIBS for r in rows):
        out.append("alt/put: the best other library's median / Transfer's median "
                   "(> 1: gdrpy is faster)")
    return "\n".join(out).rstrip()
