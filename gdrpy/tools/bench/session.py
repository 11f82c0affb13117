"""Context, header and environment of a run: open the device, describe the host,
hold the buffers, and get the default threshold picker ready."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import sys
import time

import numpy as np

from .common import BATCH_BELOW_NS, BATCH_TARGET_NS, DIRECTIONS, SIM_NOTE
from .timing import Cfg

# ---------------------------------------------------------------------------
# Context, header, environment

def open_context(args, prog: str = "gdrpy bench"):
    """gdrpy.open(args.device, args.backend) with a clear message where no GPU
    backend works (``prog``: the command that says it).  Returns the Context or
    raises SystemExit(2)."""
    import gdrpy
    try:
        return gdrpy.open(args.device, args.backend)
    except gdrpy.GdrError as e:
        backend = args.backend or os.environ.get("GDRPY_BACKEND") or "auto"
        print(f"{prog}: cannot open device {args.device} with backend {backend!r}: {e}",
              file=sys.stderr)
        if backend != "sim":
            print("  With no GPU, run on the sim backend instead (host memory stands in for "
                  "the GPU): --backend sim or GDRPY_BACKEND=sim", file=sys.stderr)
        raise SystemExit(2) from None


def metadata(ctx, command: str) -> dict:
    import gdrpy
    from gdrpy.identity import host_identity
    ident = host_identity(ctx)
    info = ctx.info
    return {
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "backend": ctx.backend,
        "sim": bool(ctx.is_sim),
        "device": ctx.device,
        "gpu": info["gpu_name"],
        "pci_bus_id": info["pci_bus_id"],
        "driver": info["driver_version"],
        "copy_kernel": gdrpy.copy_isa(),
        "copy_kernels_available": gdrpy.copy_isa_available(),
        "cpu_model": ident.get("cpu_model"),
        "numa_node": ident.get("numa_node"),
        "host": platform.node(),
        "gdrpy": gdrpy.__version__,
        "libgdrpy": gdrpy.library_version(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else None,
    }


def print_header(meta: dict, out=None) -> None:
    """The one header line (and, on sim, the loud note)."""
    out = out or sys.stdout
    gpu = meta["gpu"] + (f" [{meta['pci_bus_id']}]" if meta["pci_bus_id"] else "")
    print(f"gdrpy bench {meta['command']}: backend {meta['backend']} | GPU {gpu} | "
          f"driver {meta['driver']} | copy kernel {meta['copy_kernel']} | "
          f"CPU {meta['cpu_model']} | {meta['date']} | gdrpy {meta['gdrpy']}, "
          f"Python {meta['python']}, numpy {meta['numpy']}", file=out)
    if meta["sim"]:
        lines = [SIM_NOTE, "(backend 'sim': every \"GPU\" copy below is a host memory copy)"]
        w = max(len(x) for x in lines)
        print("*" * (w + 8), file=out)
        for x in lines:
            print(f"*** {x.ljust(w)} ***", file=out)
        print("*" * (w + 8), file=out)


@contextlib.contextmanager
def _session(args, command: str):
    """Open the context, set the copy kernel / CPU affinity, print the header."""
    import gdrpy
    ctx = open_context(args)
    old_isa = gdrpy.copy_isa()
    try:
        if args.isa:
            gdrpy.set_copy_isa(args.isa)
        if args.cpu is not None and args.cpu >= 0:
            os.sched_setaffinity(0, {args.cpu})
        meta = metadata(ctx, command)
        meta["options"] = _options(args)
        print_header(meta)
        yield ctx, meta
    finally:
        if args.isa:
            with contextlib.suppress(Exception):
                gdrpy.set_copy_isa(old_isa)
        ctx.close()


def _options(args) -> dict:
    out = {}
    for k, v in vars(args).items():
        if callable(v):
            continue
        out[k] = v
    return out


def _print_methodology(cfg: Cfg, timer: dict, extra: str = "") -> None:
    print(f"method: warm-up (1 untimed call + up to {cfg.warmup} timed), then up to "
          f"{cfg.iters} samples per method (max {cfg.max_time_ns / 1e9:.3g} s each, at least "
          f"{cfg.min_samples}){extra};")
    forced = f"; --batch {cfg.batch} forced" if cfg.batch else ""
    print(f"        methods under {BATCH_BELOW_NS / 1e3:.0f} us are timed in batches of B "
          f"calls (batch ~{BATCH_TARGET_NS / 1e3:.0f} us; sample = batch mean), others call "
          f"by call (B=1){forced};")
    print("        GC off while timing; median and p99 (nearest rank) in us; each method's "
          "bytes checked once before timing (column ok).")
    print(f"timer:  {timer['clock']}, resolution {timer['resolution_ns']:.0f} ns; clock pair "
          f"{timer['pair_median_ns']:.0f} ns; empty call timed alone "
          f"{timer['empty_call_median_ns']:.0f} ns (p99 {timer['empty_call_p99_ns']:.0f}); in a "
          f"batch of {timer['batch']}: {timer['empty_call_in_batch_ns']:.1f} ns per call - "
          f"included below, not subtracted")


def _ready_default_picker(ctx, calibrate: bool = True, budget: float = 5.0,
                          save: bool = True) -> dict:
    """The context's default picker, calibrated first where it has no
    calibration (unless ``calibrate`` is False), and the calibration stored in the
    cache only if ``save`` (a --quick smoke run's truncated calibration must not be
    what later runs load).  Returns a description."""
    from gdrpy.threshold import format_threshold
    from gdrpy.threshold.context import calibrate_context, default_picker
    old = os.environ.get("GDRPY_AUTOCALIBRATE")
    os.environ["GDRPY_AUTOCALIBRATE"] = "0"   # we calibrate below, timed, under our budget
    try:
        picker = default_picker(ctx)
    finally:
        if old is None:
            os.environ.pop("GDRPY_AUTOCALIBRATE", None)
        else:
            os.environ["GDRPY_AUTOCALIBRATE"] = old
    sources = {d: picker.source(d) for d in DIRECTIONS}
    need = [d for d in DIRECTIONS if sources[d] == "default"]
    desc: dict = {"calibrated_now": False, "calibration_s": None, "budget_s": None,
                  "sources_before": sources, "reason": getattr(picker, "reason", None)}
    if need and calibrate:
        t0 = time.perf_counter()
        res = calibrate_context(ctx, picker, budget_s=budget, save=save)
        desc.update(calibrated_now=True, calibration_s=time.perf_counter() - t0,
                    budget_s=budget, truncated=bool(getattr(res, "truncated", False)),
                    saved=save)
    # page-locked host memory has its own picker (gdrpy.threshold.context.default_picker)
    old = os.environ.get("GDRPY_AUTOCALIBRATE")
    os.environ["GDRPY_AUTOCALIBRATE"] = "0"
    try:
        locked = default_picker(ctx, "locked")
    finally:
        if old is None:
            os.environ.pop("GDRPY_AUTOCALIBRATE", None)
        else:
            os.environ["GDRPY_AUTOCALIBRATE"] = old
    if calibrate and any(locked.source(d) == "default" for d in DIRECTIONS):
        calibrate_context(ctx, locked, budget_s=budget, save=save, kind="locked")
    desc["thresholds_locked"] = {d: locked.threshold(d) for d in DIRECTIONS}
    desc["thresholds"] = {d: picker.threshold(d) for d in DIRECTIONS}
    desc["thresholds_text"] = {d: format_threshold(picker.threshold(d)) for d in DIRECTIONS}
    desc["sources"] = {d: picker.source(d) for d in DIRECTIONS}
    desc["cache_file"] = str(picker.cache_file) if picker.cache_file else None
    desc["picker"] = picker
    return desc


def _picker_line(desc: dict) -> str:
    thr = ", ".join(f"{d} <= {desc['thresholds_text'][d]} ({desc['sources'][d]})"
                    for d in DIRECTIONS)
    if desc["calibrated_now"]:
        how = (f"calibrated now in {desc['calibration_s']:.2f} s (budget "
               f"{desc['budget_s']:g} s{', truncated' if desc.get('truncated') else ''}"
               f"{'' if desc.get('saved', True) else '; not stored: --quick'})")
    elif all(s == "default" for s in desc["sources_before"].values()):
        how = "not calibrated (--no-calibrate): provisional defaults"
    else:
        how = "stored calibration"
    return f"default picker: {thr}; {how}"
