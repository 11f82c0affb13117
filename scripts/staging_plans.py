#!/usr/bin/env python3
"""Time fixed staging plans side by side, interleaved, against the pinned
copy-engine rate measured in the same run (issue 14: which plans are robust).

    PYTHONPATH=. python3 scripts/staging_plans.py [--backend nvrm] [--sizes 4M,16M,64M]
        [--plans wc/ntevict/4M/4/8,evict/ntevict/2M/4/12] [--rounds 3] [--reps 5]
        [--calibrate N]

A plan is WRITE_KIND/READ_KIND/CHUNK/DEPTH/THREADS, optionally followed by
/ppt=N (GDRPY_STAGING_PPT, pieces per thread and chunk) and /dry=nocopy or
/dry=nodma (GDRPY_STAGING_DRY, diagnostics: one side of the pipeline alone,
moving stale data; the bound the other side sets).  Every round times every
plan once (median of --reps calls per size and direction), so drift in the
machine hits all plans alike; the tables show each plan's worst and median
round per cell as a % of pinned, and its worst cell overall.  --calibrate N also runs
N fresh calibrations (gdrpy.staging.calibrate_plan) and prints the plan each
chose with its time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from staging_bench import pinned_rates, staging_bench

from gdrpy import _core
from gdrpy._sizes import parse_size
from gdrpy.staging import _timer as _median_s  # median seconds after one warm-up
from gdrpy.staging import calibrate_plan
from gdrpy.staging_pick import CANDIDATES

#: the calibration's candidates (gdrpy.staging_pick.CANDIDATES)
DEFAULT_PLANS = ",".join(f"{w}/{r}/{c >> 20}M/{d}/{t}" for w, r, c, d, t in CANDIDATES)


ENV_KEYS = {"ppt": "GDRPY_STAGING_PPT", "dry": "GDRPY_STAGING_DRY"}

Plan = tuple[str, str, int, int, int, tuple[tuple[str, str], ...]]


def parse_plan(text: str) -> Plan:
    w, r, c, d, t, *extra = text.split("/")
    env = []
    for kv in extra:
        key, _, val = kv.partition("=")
        if key not in ENV_KEYS or not val:
            raise SystemExit(f"plan {text!r}: unknown field {kv!r} (known: "
                             f"{', '.join(k + '=...' for k in ENV_KEYS)})")
        env.append((ENV_KEYS[key], val))
    return w, r, parse_size(c), int(d), int(t), tuple(env)


def apply_plan(ctx, pin, host, p: Plan) -> None:
    """Configures the ring for plan p; the environment fields are read when the
    ring is built, so a tiny ring is built first to force a rebuild."""
    w, r, c, d, t, env = p
    for var in ENV_KEYS.values():
        os.environ.pop(var, None)
    os.environ.update(dict(env))
    _core.staging_config(ctx, 64 << 10, 2, 1)
    pin.ce_write(0, host[:1], method="staged")
    _core.staging_config(ctx, c, d, t, write_kind=w, read_kind=r)
    pin.ce_write(0, host[:1], method="staged")


def plan_name(p: Plan) -> str:
    w, r, c, d, t, env = p
    size = f"{c >> 20}M" if c >= 1 << 20 else f"{c >> 10}K"
    extra = "".join(f"/{k}={dict(env)[v]}" for k, v in ENV_KEYS.items() if v in dict(env))
    return f"{w}/{r}/{size}/{d}/{t}{extra}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="nvrm")
    ap.add_argument("--sizes", default="4M,16M,64M")
    ap.add_argument("--plans", default=DEFAULT_PLANS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--calibrate", type=int, default=0)
    a = ap.parse_args(argv)
    sizes = [parse_size(x) for x in a.sizes.split(",") if x.strip()]
    plans = [parse_plan(p) for p in a.plans.split(",") if p.strip()]
    top = max(sizes)
    with staging_bench(a.backend, top) as b:
        ctx, pin, host = b.ctx, b.pin, b.host
        ref = pinned_rates(b, sizes, a.reps)
        # pct[plan][(dir, n)] = list of % per round
        pct: dict = {p: {} for p in plans}
        for rnd in range(a.rounds):
            order = plans if rnd % 2 == 0 else plans[::-1]
            for p in order:
                apply_plan(ctx, pin, host, p)
                for n in sizes:
                    src = host[:n]
                    tw = _median_s(lambda src=src: pin.ce_write(0, src, method="staged"),
                                   a.reps)
                    tr = _median_s(lambda src=src, n=n: pin.ce_read(0, n, src,
                                                                     method="staged"),
                                   a.reps)
                    for key, tt in (("put", tw), ("get", tr)):
                        pct[p].setdefault((key, n), []).append(
                            100 * n / tt / 1e9 / ref[n][key])
        for var in ENV_KEYS.values():
            os.environ.pop(var, None)
        head = "plan (w/r/chunk/depth/thr)   " + " ".join(
            f"{k} {n >> 20:>2d}M" for k in ("put", "get") for n in sizes) + "   worst  mean"
        for label, pick in (("worst", min), ("median", statistics.median)):
            print(f"{label} round per cell, % of pinned ({a.rounds} rounds):")
            print(head)
            for p in plans:
                cells = [pick(pct[p][(k, n)]) for k in ("put", "get") for n in sizes]
                allv = [v for vs in pct[p].values() for v in vs]
                print(f"{plan_name(p):28s} " + " ".join(f"{v:7.1f}" for v in cells)
                      + f"   {min(cells):5.1f} {sum(allv) / len(allv):5.1f}", flush=True)
        for i in range(a.calibrate):
            t0 = time.perf_counter()
            plan = calibrate_plan(ctx, budget_s=5.0)
            dt = time.perf_counter() - t0
            print(f"calibration {i + 1}: {dt:.1f} s -> {plan.as_dict()}", flush=True)
            for e in plan.sweep:
                if "round" in e:
                    print(f"    round {e['round']} {e['write_kind']}/{e['read_kind']}/"
                          f"{e['chunk'] >> 10}K/{e['depth']}/{e['threads']}: worst "
                          f"{100 * e['worst']:.1f}% of pinned")
    return 0


if __name__ == "__main__":
    sys.exit(main())
