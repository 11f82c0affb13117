"""``bench bandwidth``: GB/s of the mapping and the copy engine."""

from __future__ import annotations

import contextlib
import gc
import os
import sys

from .alternatives import _alternatives, _gdrpy_ops
from .common import (
    _DETAIL_COLS,
    _DIR_TEXT,
    DEFAULT_SIZES,
    DIRECTIONS,
    SIM_NOTE,
    _detail_line,
    _fixed_header,
    _fmt,
    _table,
    format_size,
    parse_sizes,
)
from .hostkinds import (
    LATENCY_SIZES,
    HostKinds,
    kinds_summary,
    latency_table,
    verify_bytes_op,
)
from .latency import _c_for_json, _print_errors
from .native import _c_summary_line, c_rows, run_copylat
from .plot import _finish
from .session import _print_methodology, _session
from .timing import Cfg, _Env, _verify, measure_group, timer_overhead

# ---------------------------------------------------------------------------
# bench bandwidth

def cmd_bandwidth(args) -> int:
    sizes = args.sizes or parse_sizes(DEFAULT_SIZES["bandwidth"])
    cfg = Cfg.from_args(args, "bandwidth")
    rows: list = []
    skipped: list = []
    c = None
    with _session(args, "bandwidth") as (ctx, meta):
        env = _Env(ctx, max(max(sizes), max(LATENCY_SIZES)))
        provs: list = []
        try:
            timer = timer_overhead()
            meta["timer"] = timer
            meta["config"] = cfg.as_dict()
            _print_methodology(cfg, timer, f", {cfg.rounds} interleaved round(s)")
            provs, skipped = _alternatives(ctx, env, which=("cuda-python",))
            for p in provs:
                print(f"compared with: {p.library} {p.version}")
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
                    ops = _gdrpy_ops(env, d, n) + [p.op(d, n) for p in provs]
                    for op in ops:
                        salt += 1
                        _verify(op, env, salt)
                    measure_group(ops, cfg)
                    for op in ops:
                        r = op.row("bandwidth") | {"short": op.short}
                        print(_detail_line(r), flush=True)
                        rows.append(r)
            kinds_rows, lat_rows, kinds_text, verdict = _host_kinds(ctx, env, sizes, cfg, args,
                                                                     meta)
            rows += kinds_rows
            if c is not None and "json" in c:
                crows = [r for r in c_rows(c, "bandwidth") if r["size"] in set(sizes)
                         and r["key"] in ("c_kernel", "c_raw", "c_cumemcpy")]
                for r in crows:
                    print(_detail_line(r))
                rows += crows
        finally:
            for p in provs:
                with contextlib.suppress(Exception):
                    p.close()
            # the last ops hold views of the buffer (torch/cupy/numpy): drop them
            ops = []
            op = None
            gc.collect()
            env.close()
    if args.plot:
        _kinds_plot(args.plot, meta, [r for r in rows if r["key"] in KIND_KEYS])
    _finish(args, "bandwidth", meta, rows, {"skipped": skipped, "c_benchmark": _c_for_json(c),
                                            "latency_rows": lat_rows,
                                            "host_kinds_verdict": verdict})
    _print_errors(rows + lat_rows)
    print()
    print(_bandwidth_summary(rows, sizes, meta, c is not None and "json" in c))
    print()
    print(kinds_text)
    print()
    print(latency_table(lat_rows))
    return 0


def _run_group(ops: list, env, cfg, salt: int, command: str, t=None) -> list:
    """Verify, time (interleaved) and report one group of ops; returns the rows.
    The ops (and the host views they hold) die with this call."""
    for i, op in enumerate(ops):
        if op.key == "lat_put_bytes":
            verify_bytes_op(op, env)
        else:
            _verify(op, env, salt + i)
    measure_group(ops, cfg)
    rows = []
    for op in ops:
        r = op.row(command) | {"short": op.short}
        if t is not None and op.library == "gdrpy":
            r["method_chosen"] = t.method_for(op.direction, op.nbytes,
                                              op.extra.get("host_kind", "pageable"))
        print(_detail_line(r), flush=True)
        rows.append(r)
    return rows


def _host_kinds(ctx, env, sizes: list, cfg, args, meta: dict):
    """Put/get for each host-memory kind next to cuMemcpy and torch (pinned and
    pageable), interleaved per size; then the small-message latencies."""
    hk = HostKinds(ctx, env)
    rows: list = []
    lat_rows: list = []
    try:
        print()
        print(f"host-memory kinds: {hk.kinds_text()}; staging plan "
              f"{hk.t.plan.as_dict()}; thresholds {hk.t.thresholds_by_kind()}")
        meta["host_kinds"] = {"plan": hk.t.plan.as_dict(),
                              "thresholds": hk.t.thresholds_by_kind(),
                              "staging_ring": _core_staging(ctx), "notes": hk.notes}
        for note in hk.notes:
            print(f"note: {note}")
        print(_fixed_header(_DETAIL_COLS))
        salt = 1000
        for n in sizes:
            for d in DIRECTIONS:
                rows += _run_group(hk.ops(d, n), env, cfg, salt, "bandwidth", hk.t)
                salt += 100
        lcfg = Cfg.from_args(args, "latency")
        for n in LATENCY_SIZES:
            for d in DIRECTIONS:
                lat_rows += _run_group(hk.latency_ops(d, n), env, lcfg, salt, "latency")
                salt += 100
        text, verdict = kinds_summary(rows, sizes, meta["sim"])
    finally:
        hk.close()
    return rows, lat_rows, text, verdict


KIND_KEYS = {f"{op}_{k}" for op in ("put", "get") for k in ("pinned", "registered", "pageable")} \
    | {f"{lib}_{k}" for lib in ("cumemcpy", "torch") for k in ("pinned", "pageable")}


def _kinds_plot(path: str, meta: dict, rows: list) -> None:
    """<plot>_kinds.png: only the host-memory kinds and their references."""
    from .plot import _save_plot
    root, ext = os.path.splitext(path)
    try:
        _save_plot(f"{root}_kinds{ext or '.png'}", "bandwidth", meta, rows, {})
    except Exception as e:  # a plot never costs the measurements
        print(f"note: kinds plot failed: {type(e).__name__}: {e}", file=sys.stderr)


def _core_staging(ctx) -> dict:
    from gdrpy import _core
    return _core.staging_config(ctx)


def _bandwidth_summary(rows: list, sizes: list, meta: dict, have_c: bool) -> str:
    out = []
    sim = " [" + SIM_NOTE + "]" if meta["sim"] else ""
    for d in DIRECTIONS:
        mk, ck = ("write", "ce_write") if d == "h2d" else ("read", "ce_read")
        cols = [(mk, "Mapping." + mk), (ck, "Pin." + ck)]
        if any(r["key"].startswith("cuMemcpy") and r["direction"] == d for r in rows):
            cols.append(("cuMemcpyHtoD" if d == "h2d" else "cuMemcpyDtoH", "cuMemcpy(py)"))
        if have_c:
            cols += [("c_kernel", "C kernel"), ("c_raw", "C raw NT"), ("c_cumemcpy",
                                                                        "C cuMemcpy")]
        cell = {(r["size"], r["key"]): r for r in rows if r["direction"] == d}
        headers = ["size"] + [lab for _, lab in cols]
        headers += ["C kernel/raw", "Mapping/raw"] if have_c else ["Mapping/ce"]
        body = []

        def g(n, key, cell=cell):
            r = cell.get((n, key))
            return r.get("gbps_median") if r and not r.get("error") else None
        for n in sizes:
            line = [format_size(n)] + [_fmt(g(n, k)) for k, _ in cols]
            if have_c:
                kern, raw, py = g(n, "c_kernel"), g(n, "c_raw"), g(n, mk)
                line.append(f"{100 * kern / raw:.1f}%" if kern and raw else "-")
                line.append(f"{100 * py / raw:.1f}%" if py and raw else "-")
            else:
                a, b = g(n, mk), g(n, ck)
                line.append(f"{a / b:.2f}x" if a and b else "-")
            body.append(line)
        out.append(f"summary {d} ({_DIR_TEXT[d]}): GB/s from medians{sim}")
        out.append(_table(headers, body))
        out.append("")
    if have_c:
        out.append("C kernel/raw: our C copy kernel vs the raw non-temporal loop of the same "
                   "run (the hardware limit); Mapping/raw: the Python call vs that loop")
    return "\n".join(out).rstrip()
