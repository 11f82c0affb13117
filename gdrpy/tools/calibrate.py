"""``python -m gdrpy calibrate``: measure and store this host's staging plan and
put/get thresholds (for pageable and for page-locked host memory)."""

from __future__ import annotations

import sys
import time

from ..identity import host_identity
from ..threshold import ThresholdPicker, format_threshold
from ..threshold.context import (
    HOST_KINDS,
    calibrate_context,
    picker_identity,
    set_default_picker,
)
from .progress import progress_bar


def calibrate_cli(args) -> int:
    from ..staging import calibrate_plan, save_plan, set_plan
    from .bench import open_context
    try:
        ctx = open_context(args, "gdrpy calibrate")    # no GPU: says so, with the sim hint
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else 2
    with ctx:
        if ctx.is_sim:
            print("note: backend sim - host memory stands in for the GPU; these "
                  "thresholds describe the simulation, not a GPU", file=sys.stderr)
        t0 = time.perf_counter()
        plan = calibrate_plan(ctx, budget_s=max(0.5, args.budget / 4))
        set_plan(ctx, plan)
        if not args.no_save:
            save_plan(host_identity(ctx), plan)
        def staged(n: int) -> str:
            return "never" if n >= 1 << 40 else format_threshold(n)
        print(f"staging plan: chunk {plan.chunk >> 10} KiB, depth {plan.depth}, "
              f"threads {plan.threads}; staged from h2d {staged(plan.staged_min['h2d'])}, "
              f"d2h {staged(plan.staged_min['d2h'])}")
        for kind in HOST_KINDS:
            picker = ThresholdPicker(identity=picker_identity(ctx, kind))
            res = calibrate_context(ctx, picker, budget_s=args.budget * 3 / 8,
                                    progress=None if args.quiet else
                                    progress_bar(f"calibrating ({kind})"),
                                    save=not args.no_save, kind=kind)
            set_default_picker(ctx, picker, kind)
            print(f"{kind} host memory: calibrated {ctx.backend} on device {ctx.device}"
                  f"{' (truncated by the budget)' if res.truncated else ''}")
            for d, r in res.directions.items():
                print(f"  {d}: threshold {format_threshold(r.threshold)} "
                      f"(messages up to it go through the mapping)")
                for meas in r.sweep:
                    print(f"    {meas.nbytes:>10d} B  mapping {meas.mapping_s * 1e6:9.2f} us"
                          f"  ce {meas.ce_s * 1e6:9.2f} us")
            if not args.no_save:
                print(f"  stored in {picker.cache_file}")
        print(f"calibrated {ctx.backend} on device {ctx.device} in "
              f"{time.perf_counter() - t0:.2f} s (staging plan, pageable and page-locked "
              "pickers)")
    return 0
