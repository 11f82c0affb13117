"""``python -m gdrpy calibrate``: measure and store this host's put/get thresholds."""

from __future__ import annotations

import sys
import time

from ..threshold import ThresholdPicker, format_threshold
from ..transfer import _pickers, _pickers_lock, calibrate_context, host_identity
from .progress import progress_bar


def calibrate_cli(args) -> int:
    from .. import open as gopen
    with gopen(args.device, args.backend) as ctx:
        picker = ThresholdPicker(identity=host_identity(ctx))
        if ctx.is_sim:
            print("note: backend sim - host memory stands in for the GPU; these "
                  "thresholds describe the simulation, not a GPU", file=sys.stderr)
        t0 = time.perf_counter()
        res = calibrate_context(ctx, picker, budget_s=args.budget,
                                progress=None if args.quiet else progress_bar("calibrating"),
                                save=not args.no_save)
        dt = time.perf_counter() - t0
        with _pickers_lock:
            _pickers[(ctx.device, ctx.backend)] = picker
        print(f"calibrated {ctx.backend} on device {ctx.device} in {dt:.2f} s"
              f"{' (truncated by the budget)' if res.truncated else ''}")
        for d, r in res.directions.items():
            print(f"  {d}: threshold {format_threshold(r.threshold)} "
                  f"(messages up to it go through the mapping)")
            for meas in r.sweep:
                print(f"    {meas.nbytes:>10d} B  mapping {meas.mapping_s * 1e6:9.2f} us"
                      f"  ce {meas.ce_s * 1e6:9.2f} us")
        if not args.no_save:
            print(f"stored in {picker.cache_file}")
    return 0
