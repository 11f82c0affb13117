"""Command line of ``python -m gdrpy bench``: options and subcommands."""

from __future__ import annotations

import argparse
import importlib
import math
import sys

from .bandwidth import cmd_bandwidth
from .common import DEFAULT_SIZES, _sizes_arg
from .latency import cmd_latency
from .transfer import cmd_transfer

_PINGPONG = "gdrpy.tools.pingpong"


# ---------------------------------------------------------------------------
# pingpong (gdrpy.tools.pingpong, someone else's module)

def _pingpong_unavailable(args) -> int:
    print(f"gdrpy bench pingpong: unavailable: {args.pingpong_error}", file=sys.stderr)
    print("  The pingpong benchmark is gdrpy/tools/pingpong.py; this installation lacks it or it "
          "failed to import.", file=sys.stderr)
    return 2


def _pingpong_main(args) -> int:
    return importlib.import_module(_PINGPONG).main(args)


def _add_pingpong(sub) -> None:
    helptext = "CPU<->GPU round trips (gdrpy.tools.pingpong)"
    try:
        pingpong = importlib.import_module(_PINGPONG)  # here, not at import
    except Exception as e:       # absent, or broken: `bench pingpong` says so, nothing else breaks
        if isinstance(e, ModuleNotFoundError) and e.name == _PINGPONG:
            why = "the module gdrpy.tools.pingpong is not installed"
        else:
            why = f"importing gdrpy.tools.pingpong failed: {type(e).__name__}: {e}"
        p = sub.add_parser("pingpong", help=f"{helptext} - unavailable", add_help=False,
                           prefix_chars="\0")
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(bench_fn=_pingpong_unavailable, pingpong_error=why)
        return
    p = sub.add_parser("pingpong", help=helptext,
                       description=(pingpong.__doc__ or helptext).strip().split("\n\n")[0])
    try:
        pingpong.add_arguments(p)
    except Exception as e:
        p.set_defaults(bench_fn=_pingpong_unavailable,
                       pingpong_error=f"gdrpy.tools.pingpong.add_arguments failed: "
                                      f"{type(e).__name__}: {e}")
        return
    p.set_defaults(bench_fn=_pingpong_main)


# ---------------------------------------------------------------------------
# Command line

def _nonneg_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return v


def _pos_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text} must be >= 1")
    return v


def _pos_float(text: str) -> float:
    v = float(text)
    if not v > 0 or not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return v


def add_common_arguments(p: argparse.ArgumentParser, default_sizes: str | None = None) -> None:
    """The options every gdrpy benchmark takes."""
    g = p.add_argument_group("common options")
    g.add_argument("--device", type=_nonneg_int, default=0, help="CUDA device (default 0)")
    g.add_argument("--backend", default=None,
                   help="auto, nvrm, gdrdrv, dmabuf or sim (default: $GDRPY_BACKEND or auto)")
    g.add_argument("--sizes", type=_sizes_arg, default=None,
                   help="comma-separated sizes, K/M/G binary suffixes"
                        + (f" (default {default_sizes})" if default_sizes else ""))
    g.add_argument("--iters", type=_pos_int, default=None,
                   help="samples per method and size (a sample is a batch mean when B > 1)")
    g.add_argument("--warmup", type=_nonneg_int, default=None,
                   help="timed warm-up calls per method (default 50 latency, 3 bandwidth, "
                        "10 transfer)")
    g.add_argument("--max-time", type=_pos_float, default=None, dest="max_time",
                   help="seconds at most per method and size (transfer: per size and "
                        "direction), which may lower --iters")
    g.add_argument("--batch", type=_nonneg_int, default=0,
                   help="calls per sample; 0 (default): automatic (batches under 2 us, "
                        "else 1); 1: every call timed alone")
    g.add_argument("--isa", default=None,
                   help="force the copy kernel (gdrpy.set_copy_isa): generic, sse41, avx2, "
                        "avx512, movdir64b")
    g.add_argument("--cpu", type=int, default=None, help="pin this process to CPU N")
    g.add_argument("--json", metavar="FILE", default=None,
                   help="write every statistic and the metadata as JSON")
    g.add_argument("--plot", metavar="FILE.png", default=None,
                   help="plot (matplotlib, Agg); skipped with a note where matplotlib is missing")
    g.add_argument("--quick", action="store_true",
                   help="tiny iteration counts (CI smoke test; numbers are not meaningful)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the bench subcommands to ``parser`` (the ``bench`` subparser)."""
    sub = parser.add_subparsers(dest="bench_cmd", required=True, metavar="BENCH")
    fmt = argparse.RawDescriptionHelpFormatter

    p = sub.add_parser("latency", formatter_class=fmt,
                       help="per-size latency: gdrpy vs cuMemcpy / CuPy / PyTorch",
                       description="Latency per size and direction, gdrpy next to what a "
                                   "Python user would pick instead, in one run.")
    add_common_arguments(p, DEFAULT_SIZES["latency"])
    p.add_argument("--c", action="store_true",
                   help="also run the C benchmark gdrpy_copylat (installed in `python -m gdrpy "
                        "bindir`; in a checkout: make -C native bench) and merge its rows")
    p.add_argument("--copylat", metavar="PATH", default=None,
                   help="path of gdrpy_copylat (default: $GDRPY_COPYLAT, native/build/, "
                        "bindir, PATH)")
    p.add_argument("--no-calibrate", action="store_true",
                   help="do not calibrate the default picker where it has no calibration")
    p.add_argument("--calibrate-budget", type=_pos_float, default=None,
                   help="seconds for that calibration (default 5; --quick 0.5)")
    p.add_argument("--gap-us", type=_pos_float, default=5.0,
                   help="idle gap before each isolated-message sample (default 5 us)")
    p.set_defaults(bench_fn=cmd_latency)

    p = sub.add_parser("bandwidth", formatter_class=fmt,
                       help="GB/s of the mapping and the copy engine (with --c: vs raw NT loop)",
                       description="Bandwidth (GB/s from medians) per size and direction.")
    add_common_arguments(p, DEFAULT_SIZES["bandwidth"])
    p.add_argument("--c", action="store_true",
                   help="also run gdrpy_copylat: our C kernel vs the raw non-temporal loop")
    p.add_argument("--copylat", metavar="PATH", default=None, help="path of gdrpy_copylat")
    p.set_defaults(bench_fn=cmd_bandwidth)

    p = sub.add_parser("transfer", formatter_class=fmt,
                       help="Transfer.put/get: auto picker vs always-mapping / always-ce, regret",
                       description="Transfer.put/get with the default picker next to fixed "
                                   "pickers, interleaved; regret = auto / min(fixed) - 1.")
    add_common_arguments(p, "1 B .. 64M: powers of two and 3K, 96K, 192K, 384K")
    p.add_argument("--no-calibrate", action="store_true",
                   help="use the picker as it is (stored calibration or defaults)")
    p.add_argument("--calibrate-budget", type=_pos_float, default=None,
                   help="seconds for the calibration where one is needed (default 5; "
                        "--quick 0.5)")
    p.add_argument("--host", choices=("pageable", "pinned"), default="pageable",
                   help="host memory the messages come from / go to: a pageable numpy "
                        "array (default) or page-locked memory from gdrpy.memory.host_alloc "
                        "(then the page-locked picker decides)")
    p.set_defaults(bench_fn=cmd_transfer)

    _add_pingpong(sub)


def main(args) -> int:
    fn = getattr(args, "bench_fn", None)
    if fn is None:
        print("gdrpy bench: choose one of latency, bandwidth, transfer, pingpong",
              file=sys.stderr)
        return 2
    try:
        return fn(args)
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else 2
