"""``python -m gdrpy calibrate``: measure and store this host's put/get thresholds."""

from __future__ import annotations

import sys
import time

from ..threshold import ThresholdPicker, format_threshold
from ..transfer import _pickers, _pickers_lock, calibrate_context, host_identity


def _progress_bar(stream=sys.stderr):
    width = 30

    def progress(frac, msg):
        n = int(round(frac * width))
        stream.write(f"\r[{'#' * n}{'.' * (width - n)}] {frac * 100:5.1f}% {msg[:50]:<50}")
        stream.flush()
        if frac >= 1.0:
            stream.write("\n")
    return progress



def calibrate_cli(args) -> int:
    from .. import open as gopen
    with gopen(args.device, args.backend) as ctx:
        picker = ThresholdPicker(identity=host_identity(ctx))
        if ctx.is_sim:
            print("note: backend sim - host memory stands in for the GPU; these "
                  "thresholds describe the simulation, not a GPU", file=sys.stderr)
        t0 = time.perf_counter()
        res = calibrate_context(ctx, picker, budget_s=args.budget,
                                progress=None if args.quiet else _progress_bar(),
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
