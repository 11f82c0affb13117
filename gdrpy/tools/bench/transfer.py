"""``bench transfer``: the automatic picker next to fixed pickers, and its regret."""

from __future__ import annotations

import gc
from typing import Any

from .common import (
    DEFAULT_SIZES,
    DIRECTIONS,
    SIM_NOTE,
    _fixed_header,
    _fixed_line,
    _fmt,
    _table,
    format_size,
    parse_sizes,
)
from .latency import _calibrate_budget, _print_errors
from .plot import _finish
from .session import (
    _picker_line,
    _print_methodology,
    _ready_default_picker,
    _session,
)
from .timing import Cfg, Op, _Env, _verify, measure_group, timer_overhead

# ---------------------------------------------------------------------------
# bench transfer

_TRANSFER_COLS = (("dir", 4, "l"), ("size", 8, "l"), ("auto med", 9, "r"),
                  ("auto p99", 9, "r"), ("path", 7, "l"), ("map med", 9, "r"),
                  ("map p99", 9, "r"), ("ce med", 9, "r"), ("ce p99", 9, "r"), ("B", 5, "r"),
                  ("n", 5, "r"), ("ok", 4, "l"), ("regret", 10, "r"))


def cmd_transfer(args) -> int:
    import gdrpy
    from gdrpy.threshold import ThresholdPicker, format_threshold
    sizes = args.sizes or parse_sizes(DEFAULT_SIZES["transfer"])
    cfg = Cfg.from_args(args, "transfer")
    rows: list = []
    regret: list = []
    # Each variant has its own host region: sharing one made a copy-engine
    # get look up to 42% slower after a mapping get had just written the same
    # host lines.  On a GPU the variants share the device bytes: the cost of
    # a BAR1 write depends on where in GPU memory it lands (on the H100,
    # 128-byte puts cost 393, 421 and 402 ns at offsets 0, 64 and 128 MiB of
    # one buffer in one run), so separate device regions would measure
    # placement, not the path choice.  On sim ("GPU" memory is host memory)
    # the device regions stay separate too, for the same reason as the host
    # ones.
    region = -(-max(max(sizes), 4096) // 65536) * 65536
    with _session(args, "transfer") as (ctx, meta):
        env = _Env(ctx, 3 * region)
        pinned = getattr(args, "host", "pageable") == "pinned"
        hostbuf = None
        host: Any = env.host
        hv: Any = None
        try:
            if pinned:     # page-locked host memory: the page-locked picker decides
                hostbuf = gdrpy.memory.host_alloc(3 * region, ctx=ctx)
                host = hostbuf.numpy()
                host[:] = env.host
                meta["host_memory"] = "pinned (gdrpy.memory.host_alloc)"
            else:
                meta["host_memory"] = "pageable (numpy)"
            timer = timer_overhead()
            meta["timer"] = timer
            meta["config"] = cfg.as_dict()
            _print_methodology(cfg, timer, "; the three variants interleaved sample by sample "
                               "(every order in turn), with the same B")
            desc = _ready_default_picker(ctx, calibrate=not args.no_calibrate,
                                         budget=_calibrate_budget(args),
                                         save=not args.quick)
            picker = desc.pop("picker")
            print(_picker_line(desc))
            meta["picker"] = desc
            auto = env.m.transfer()       # what gdrpy.put/get use: the default picker
            if auto.picker is not picker:
                auto = gdrpy.Transfer(env.m, picker)
            kind = "pinned" if pinned else "pageable"
            print(f"host memory: {meta['host_memory']}; thresholds by kind "
                  f"{auto.thresholds_by_kind()}")
            meta["thresholds_by_kind"] = auto.thresholds_by_kind()
            variants = (
                ("auto", auto),
                ("mapping", gdrpy.Transfer(env.m, ThresholdPicker(
                    h2d="always-mapping", d2h="always-mapping", identity=None))),
                ("ce", gdrpy.Transfer(env.m, ThresholdPicker(
                    h2d="always-ce", d2h="always-ce", identity=None))),
            )
            print()
            print(_fixed_header(_TRANSFER_COLS))
            salt = 0
            for d in DIRECTIONS:
                for n in sizes:
                    ops = []
                    for i, (key, t) in enumerate(variants):
                        name = ("Transfer.put" if d == "h2d" else "Transfer.get") + \
                            (" (auto)" if key == "auto" else f" (always-{key})")
                        off = i * region if ctx.is_sim else 0
                        hoff = i * region
                        hv = host[hoff:hoff + n]
                        ops.append(Op(key, name, key, "gdrpy", d, n,
                                      t.put if d == "h2d" else t.get, (off, hv), hv,
                                      offset=off))
                    for op in ops:
                        salt += 1
                        _verify(op, env, salt)
                    measure_group(ops, cfg, per_sample=True, same_batch=True)
                    path = auto.path_for(d, n, kind)
                    new = [op.row("transfer") | {"variant": op.key, "short": op.key}
                           for op in ops]
                    new[0]["path"] = path
                    rows += new
                    g = _regret(d, n, path, *new)
                    regret.append(g)
                    ok = "yes" if all(r["verified"] and not r["error"] for r in new) else "NO"
                    a, mp, ce = new
                    print(_fixed_line(
                        [d, format_size(n), _fmt(a["median_us"]), _fmt(a["p99_us"]), path,
                         _fmt(mp["median_us"]), _fmt(mp["p99_us"]), _fmt(ce["median_us"]),
                         _fmt(ce["p99_us"]), a["batch"], a["samples"], ok,
                         _regret_text(g["regret"])], _TRANSFER_COLS), flush=True)
            thr_after = {dd: picker.threshold(dd) for dd in DIRECTIONS}
        finally:
            # the last ops hold views of the buffer (torch/cupy/numpy): drop them
            ops = []
            op = None  # type: ignore[assignment]
            host = hv = None
            gc.collect()
            if hostbuf is not None:
                hostbuf.close()
            env.close()
    meta["thresholds_after"] = thr_after
    summary = _regret_summary(regret)
    _finish(args, "transfer", meta, rows, {"regret": regret, "summary": summary})
    _print_errors(rows)
    print()
    sim = f"  [{SIM_NOTE}]" if meta["sim"] else ""
    print(f"summary: regret = auto median / min(always-mapping, always-ce median) - 1; "
          f"* over 5%{sim}")
    before = desc["thresholds"]
    print("  thresholds: " + ", ".join(
        f"{dd} <= {format_threshold(before[dd])}"
        + (f" -> {format_threshold(thr_after[dd])} (adapted during the run)"
           if before[dd] != thr_after[dd] else "")
        for dd in DIRECTIONS))
    body = []
    for dd in DIRECTIONS:
        dv = [g for g in regret if g["direction"] == dd and g["regret"] is not None]
        if not dv:
            continue
        w = max(dv, key=lambda g: g["regret"])
        over = [g for g in dv if g["regret"] > 0.05]
        body.append([dd, f"{w['regret'] * 100:+.1f}%", format_size(w["size"]),
                     f"{len(over)} of {len(dv)}",
                     ", ".join(format_size(g["size"]) for g in over[:10])
                     + (" ..." if len(over) > 10 else "") or "-"])
    if body:
        print(_table(["dir", "worst regret", "at", "sizes over 5%", "which"], body, "lrrrl"))
    w = summary["worst_at"]
    if w is None:
        print("worst regret: - (no size was measured on all three variants)")
    else:
        n_over, n = len(summary["over_5pct"]), summary["measured"]
        # A --quick run (a handful of samples) or the sim backend (host memory, no GPU)
        # makes no statement about the picker: say so instead of a yes/no.
        caveats = [c for c, on in (("--quick: too few samples", args.quick),
                                   ("sim: no GPU", meta["sim"])) if on]
        if caveats:
            verdict = f"not judged ({'; '.join(caveats)}); {n_over} of {n} sizes over 5%"
        elif summary["within_5pct"]:
            verdict = "yes"
        else:
            verdict = f"no, {n_over} of {n} sizes over 5%"
        print(f"worst regret: {summary['worst_regret'] * 100:+.1f}% ({w['direction']} "
              f"{format_size(w['size'])}); every size within 5%: {verdict}")
    return 0


def _regret(d: str, n: int, path: str, a: dict, mp: dict, ce: dict) -> dict:
    fixed = [x["median_us"] for x in (mp, ce) if x["median_us"]]
    rg = a["median_us"] / min(fixed) - 1 if a["median_us"] and len(fixed) == 2 else None
    best = None
    if mp["median_us"] and ce["median_us"]:
        best = "mapping" if mp["median_us"] <= ce["median_us"] else "ce"
    return {"direction": d, "size": n, "auto_median_us": a["median_us"],
            "auto_p99_us": a["p99_us"], "mapping_median_us": mp["median_us"],
            "mapping_p99_us": mp["p99_us"], "ce_median_us": ce["median_us"],
            "ce_p99_us": ce["p99_us"], "auto_path": path, "best_fixed": best, "regret": rg}


def _regret_text(rg: float | None) -> str:
    if rg is None:
        return "-"
    return f"{rg * 100:+.1f}%" + (" *" if rg > 0.05 else "  ")


def _regret_summary(regret: list) -> dict:
    valid = [g for g in regret if g["regret"] is not None]
    worst = max(valid, key=lambda g: g["regret"]) if valid else None
    over = [g for g in valid if g["regret"] > 0.05]
    return {"worst_regret": worst["regret"] if worst else None,
            "worst_at": ({"direction": worst["direction"], "size": worst["size"]}
                         if worst else None),
            "within_5pct": bool(valid) and not over and len(valid) == len(regret),
            "measured": len(valid), "sizes": len(regret),
            "over_5pct": [{"direction": g["direction"], "size": g["size"],
                           "regret": g["regret"]} for g in over]}
