"""Command line: ``python -m gdrpy <command>``.

  info         version, copy kernel, GPUs seen, each backend and why not, what auto picks
  libdir       directory of libgdrapi.so.2 (export LD_LIBRARY_PATH=$(python -m gdrpy libdir))
  includedir   directory of gdrpy.h and gdrapi.h
  bindir       directory of the C tools (gdrpy_copylat, gdrapi_copylat, ...)
  calibrate    measure and store the put/get thresholds for this host
  bench        latency | bandwidth | transfer | pingpong
  ucx-config   measure this host and write a UCX configuration section (docs/ucx.md)
"""

from __future__ import annotations

import argparse
import os
import sys


def cmd_libdir(args) -> int:
    import gdrpy
    print(gdrpy.libdir())
    return 0


def cmd_includedir(args) -> int:
    import gdrpy
    print(gdrpy.includedir())
    return 0


def cmd_bindir(args) -> int:
    import gdrpy
    print(gdrpy.bindir())
    return 0


def cmd_info(args) -> int:
    from .tools.info import cmd_info as run
    return run(args)


def cmd_calibrate(args) -> int:
    from .tools.calibrate import calibrate_cli
    return calibrate_cli(args)


def cmd_bench(args) -> int:
    from .tools import bench
    return bench.main(args)


def cmd_ucx_config(args) -> int:
    from .tools.ucx_config import cli
    return cli(args)


def _version_text() -> str:
    from . import __version__
    try:
        from . import library_version
        return f"gdrpy {__version__} (libgdrpy {library_version()})"
    except ImportError as e:     # extension not built
        return f"gdrpy {__version__} (extension not importable: {e})"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gdrpy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=_version_text())
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("info", help="versions, GPUs, backends and what auto picks")
    s.add_argument("--device", type=int, default=0,
                   help="CUDA device whose backends are probed (default 0)")
    s.add_argument("--json", action="store_true", help="print the same facts as JSON")
    s.set_defaults(fn=cmd_info)
    s = sub.add_parser("libdir", help="print the directory of libgdrapi.so.2")
    s.set_defaults(fn=cmd_libdir)
    s = sub.add_parser("includedir", help="print the directory of gdrpy.h / gdrapi.h")
    s.set_defaults(fn=cmd_includedir)
    s = sub.add_parser("bindir", help="print the directory of the C tools (gdrpy_copylat, ...)")
    s.set_defaults(fn=cmd_bindir)
    s = sub.add_parser("calibrate", help="measure and store put/get thresholds")
    s.add_argument("--device", type=int, default=0, help="CUDA device (default 0)")
    s.add_argument("--backend", default=None,
                   help="auto, nvrm, gdrdrv, dmabuf or sim (default: $GDRPY_BACKEND or auto)")
    s.add_argument("--budget", type=float, default=8.0,
                   help="seconds the calibration may take (default 8)")
    s.add_argument("--no-save", action="store_true",
                   help="measure and print, but do not store the thresholds in the cache")
    s.add_argument("--quiet", action="store_true", help="no progress output")
    s.set_defaults(fn=cmd_calibrate)
    s = sub.add_parser("bench", help="benchmarks: latency, bandwidth, transfer, pingpong")
    try:
        from .tools import bench
        bench.add_arguments(s)
    except ImportError:  # pragma: no cover
        pass
    s.set_defaults(fn=cmd_bench)
    s = sub.add_parser("ucx-config", help="measure this host, write a ucx.conf section for UCX",
                       description="Measures gdr_copy through libgdrapi.so.2, the copy engine "
                       "and UCX's eager and rendezvous paths on this host, chooses UCX settings "
                       "from the measurements and writes them as a section of "
                       "$UCX_CONFIG_DIR/ucx.conf limited to this machine (docs/ucx.md).")
    from .tools.ucx_config import add_arguments as ucx_config_arguments
    ucx_config_arguments(s)
    s.set_defaults(fn=cmd_ucx_config)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc = args.fn(args)
        sys.stdout.flush()              # a closed pipe shows up here, not at exit
        return rc
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `python -m gdrpy info | head -1`: the reader left; no traceback, and no second
        # error when Python flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141                      # 128 + SIGPIPE, as a shell reports it
    except Exception as e:  # clear one-line errors for the CLI
        from .errors import GdrError
        if isinstance(e, GdrError):
            print(f"gdrpy: error: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
