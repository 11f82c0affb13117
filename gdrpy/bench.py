"""Benchmarks: ``python -m gdrpy bench latency | bandwidth | transfer | pingpong``.

Every command opens one device (``--backend``, default ``$GDRPY_BACKEND`` or
``auto``), prints one header line (backend, GPU, driver, copy kernel, CPU model,
date) and, on the ``sim`` backend, a loud note that host memory stands in for
the GPU, so that no sim number is ever mistaken for a GPU number.

Commands
--------
latency
    Per size and direction, side by side in one run: gdrpy ``Mapping.write`` /
    ``Mapping.read`` (BAR1 path), ``Transfer.put`` / ``get`` (automatic path),
    ``Pin.ce_write`` / ``ce_read`` (our C cuMemcpy path), and what a Python user
    would pick instead: cuda-python ``cuMemcpyHtoD`` / ``cuMemcpyDtoH`` from a
    numpy (pageable) buffer, CuPy ``ndarray.set`` / ``.get(out=)`` on
    ``cupy.asarray(buf)``, PyTorch ``t.copy_(pinned)`` / ``pinned.copy_(t)`` on
    a tensor over the same memory (each only where importable and on a real
    GPU backend).  ``--c`` also runs the C benchmark ``gdrpy_copylat`` and
    merges its rows (our kernel incl. sfence, with read-back, cuMemcpy from a
    pinned buffer, raw non-temporal store/load loops).
bandwidth
    GB/s (from medians) of Mapping.write/read, Pin.ce_write/ce_read and
    cuda-python cuMemcpy for large sizes; with ``--c`` our C kernel next to
    the raw non-temporal loop of the same run, and their ratio.
transfer
    Per size and direction: ``Transfer.put/get`` with the default (calibrated)
    picker next to Transfers whose pickers are fixed to "always-mapping" and
    "always-ce", measured interleaved, and the regret of the automatic choice,
    ``auto_median / min(fixed medians) - 1``.
pingpong
    Provided by :mod:`gdrpy.pingpong` (imported only when present).

Methodology (printed by every run)
----------------------------------
* Clock: ``time.perf_counter_ns`` (CLOCK_MONOTONIC).  The garbage collector is
  disabled while timing.  Host buffers are numpy arrays (pageable), device
  buffers come from ``gdrpy.memory.alloc`` (sim: host memory).  In latency
  and bandwidth every method copies between the same host buffer and offset 0
  of the same device buffer, except PyTorch, which copies from/to a pinned
  host tensor as its users do; cuda-python gets the host address as an int
  (its cheapest form).
* Each method is first checked once for correctness (a pattern written by the
  method is read back through another path, or the other way round); a
  mismatch is reported in the ``ok`` column and in the JSON.
* Warm-up: an untimed first call, then up to ``--warmup`` individually timed
  calls (bounded in time); their median is the per-call estimate ``e``.
* Samples: ``--iters`` samples per method (fewer where a method would exceed
  ``--max-time`` seconds; never fewer than a handful).  For a method with
  ``e < 2 us`` one sample is a batch of ``B`` back-to-back calls (B chosen so
  that a batch takes about 10 us; ``--batch`` forces it) and the sample is the
  batch mean: this keeps the clock's own cost (~50 ns) from dominating, but
  the p99 of batch means is smoother than the p99 of single calls (the C
  benchmark, ``--c``, times every call with RDTSCP).  Slower methods are
  timed call by call (``B = 1``).  ``B`` is printed for every row.
* Drift: the methods of one size and direction are measured in interleaved
  rounds, so a change of clocks, PCIe traffic or a noisy neighbour hits all
  of them alike.  latency, bandwidth: 5 (3) rounds, each method takes a chunk
  of its samples per round after a short re-warm.  transfer: one sample of
  each variant per round, cycling through every order of the three, all with
  the same number of samples and the same B (that of the fastest); each
  variant copies between its own host and device regions, so one variant's
  cache state never lands on another (on sim, a memcpy right after
  non-temporal stores to the same lines would pay for them).
* Timer overhead is measured in the same run and printed: a back-to-back
  clock pair, an empty Python call timed alone, and the same call in a
  batch.  It is included in every number, not subtracted.
* Reported: median and p99 (nearest rank) in microseconds, also mean, min,
  max, the number of samples, B; GB/s are ``size / median``.

Output: aligned text tables (the short summary last), ``--json FILE`` (every
sample statistic and the metadata), ``--plot FILE.png`` (matplotlib, Agg).
See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import gc
import importlib
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

__all__ = ["add_arguments", "main", "add_common_arguments", "parse_size", "parse_sizes",
           "format_size", "stats", "time_calls", "timer_overhead", "SIM_NOTE",
           "open_context", "print_header"]

SIM_NOTE = "SIM: host memory stands in for the GPU; no GPU numbers"

DEFAULT_SIZES = {
    "latency": "1,8,64,512,4K,64K,1M",
    "bandwidth": "64K,256K,1M,4M,16M,64M",
    "transfer": ",".join([str(1 << i) for i in range(27)] + ["3K", "96K", "192K", "384K"]),
}

#: Methods faster than this (estimate per call, ns) are timed in batches.
BATCH_BELOW_NS = 2000.0
#: A batch is sized to take about this long (ns).
BATCH_TARGET_NS = 10_000.0
BATCH_MAX = 1000

# Per-command defaults: (iters, warmup, max_time_s, rounds, min_samples); quick variants.
_DEFAULTS = {
    "latency": dict(iters=1000, warmup=50, max_time=1.0, rounds=5, min_samples=5),
    "bandwidth": dict(iters=50, warmup=3, max_time=2.0, rounds=3, min_samples=5),
    "transfer": dict(iters=300, warmup=10, max_time=3.0, rounds=0, min_samples=5),
}
_QUICK = {
    "latency": dict(iters=20, warmup=3, max_time=0.02, rounds=1, min_samples=3),
    "bandwidth": dict(iters=3, warmup=1, max_time=0.05, rounds=1, min_samples=2),
    "transfer": dict(iters=10, warmup=2, max_time=0.05, rounds=0, min_samples=3),
}
_WARMUP_TIME_NS = {False: 200e6, True: 20e6}

DIRECTIONS = ("h2d", "d2h")
_DIR_TEXT = {"h2d": "host -> GPU", "d2h": "GPU -> host"}


# ---------------------------------------------------------------------------
# Sizes

_SIZE_RE = re.compile(r"^\s*(\d+)\s*(?:([kmg])(?:i?b)?|b)?\s*$", re.IGNORECASE)
_UNITS = {None: 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """'8' -> 8, '4K' / '4KiB' / '4kb' -> 4096, '1M' -> 1048576 (binary units)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"bad size {text!r} (use e.g. 8, 4K, 1M, 64MiB)")
    v = int(m.group(1)) * _UNITS[m.group(2).lower() if m.group(2) else None]
    if v <= 0:
        raise ValueError(f"bad size {text!r}: must be > 0")
    return v


def parse_sizes(text: str) -> list[int]:
    """'8,64,4K,1M' -> sorted unique byte counts."""
    out = set()
    for tok in str(text).split(","):
        if tok.strip():
            out.add(parse_size(tok))
    if not out:
        raise ValueError(f"no sizes in {text!r}")
    return sorted(out)


def _sizes_arg(text: str) -> list[int]:
    try:
        return parse_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def format_size(n: int) -> str:
    """8 -> '8', 4096 -> '4K', 3<<20 -> '3M', 1536 -> '1536'."""
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def _fmt(x: float | None) -> str:
    """About three significant digits, no exponent."""
    if x is None or not math.isfinite(x):
        return "-"
    a = abs(x)
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


# ---------------------------------------------------------------------------
# Timing core

def _noop(a=None, b=None, c=None):
    return None


def time_calls(fn: Callable, args: tuple, count: int, batch: int, out: list) -> None:
    """Append ``count`` samples (ns per call) of ``fn(*args)`` to ``out``.

    ``batch == 1``: each call timed alone.  ``batch > 1``: each sample is the
    mean of ``batch`` back-to-back calls.  Specialised by arity so that the
    loop adds no argument unpacking to what is measured."""
    pc = time.perf_counter_ns
    app = out.append
    n = len(args)
    if batch <= 1:
        if n == 0:
            for _ in range(count):
                t0 = pc()
                fn()
                t1 = pc()
                app(t1 - t0)
        elif n == 1:
            a, = args
            for _ in range(count):
                t0 = pc()
                fn(a)
                t1 = pc()
                app(t1 - t0)
        elif n == 2:
            a, b = args
            for _ in range(count):
                t0 = pc()
                fn(a, b)
                t1 = pc()
                app(t1 - t0)
        elif n == 3:
            a, b, c = args
            for _ in range(count):
                t0 = pc()
                fn(a, b, c)
                t1 = pc()
                app(t1 - t0)
        else:
            for _ in range(count):
                t0 = pc()
                fn(*args)
                t1 = pc()
                app(t1 - t0)
        return
    r = range(batch)
    if n == 0:
        for _ in range(count):
            t0 = pc()
            for _ in r:
                fn()
            t1 = pc()
            app((t1 - t0) / batch)
    elif n == 1:
        a, = args
        for _ in range(count):
            t0 = pc()
            for _ in r:
                fn(a)
            t1 = pc()
            app((t1 - t0) / batch)
    elif n == 2:
        a, b = args
        for _ in range(count):
            t0 = pc()
            for _ in r:
                fn(a, b)
            t1 = pc()
            app((t1 - t0) / batch)
    elif n == 3:
        a, b, c = args
        for _ in range(count):
            t0 = pc()
            for _ in r:
                fn(a, b, c)
            t1 = pc()
            app((t1 - t0) / batch)
    else:
        for _ in range(count):
            t0 = pc()
            for _ in r:
                fn(*args)
            t1 = pc()
            app((t1 - t0) / batch)


def time_isolated(fn: Callable, args: tuple, count: int, gap_ns: int, out: list) -> None:
    """Append ``count`` samples (ns) of ``fn(*args)``, each call timed alone
    after ``gap_ns`` of idle spinning: the latency of a message that arrives
    after a pause (a tick, an eager send), not the back-to-back throughput.
    For BAR1 writes the two differ: back to back, each store + sfence waits
    for the previous write-combining flush."""
    pc = time.perf_counter_ns
    app = out.append
    for _ in range(count):
        t = pc() + gap_ns
        while pc() < t:
            pass
        t0 = pc()
        fn(*args)
        t1 = pc()
        app(t1 - t0)


ISOLATED_SIZES = (1, 8, 64, 512, 4096)


def measure_isolated(env: "_Env", transfer, sizes: list, count: int, gap_us: float) -> list:
    """Rows for gdrpy's mapping paths measured as isolated messages."""
    rows = []
    gap = int(gap_us * 1e3)
    for n in [x for x in sizes if x in ISOLATED_SIZES]:
        hv = env.host[:n]
        hb = bytes(hv)
        cases = [("h2d", "write_isolated", "Mapping.write(bytes)", env.m.write, (0, hb)),
                 ("h2d", "write_np_isolated", "Mapping.write(numpy)", env.m.write, (0, hv)),
                 ("h2d", "put_isolated", "Transfer.put(bytes)", transfer.put, (0, hb)),
                 ("d2h", "read_isolated", "Mapping.read(out=numpy)", env.m.read, (0, n, hv)),
                 ("d2h", "get_isolated", "Transfer.get(n)", transfer.get, (0, n))]
        for d, key, label, fn, a in cases:
            pat = _pattern(n, len(rows) + 1)
            if d == "h2d":   # check the bytes arrive, through the copy engine
                hv[:] = pat
                if isinstance(a[1], bytes):
                    a = (0, pat.tobytes())
                fn(*a)
                ok = env.pin.ce_read(0, n) == pat.tobytes()
            else:
                env.pin.ce_write(0, pat)
                res = fn(*a)
                got = bytes(hv) if res is None or res is hv else bytes(res)
                ok = got == pat.tobytes()
            samples: list = []
            time_isolated(fn, a, count, gap, samples)
            st = stats(samples)
            rows.append({"command": "latency", "direction": d, "key": key, "library": "gdrpy",
                         "method": f"gdrpy {label} isolated", "size": n,
                         "samples": st.pop("n"), "batch": 1, "gap_us": gap_us, **st,
                         "verified": ok, "error": None, "short": key})
    return rows


def _median_sorted(s: list) -> float:
    n = len(s)
    return float(s[n // 2]) if n & 1 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def stats(samples_ns: list) -> dict:
    """median / p99 (nearest rank) / mean / min / max in microseconds, and n."""
    s = sorted(samples_ns)
    n = len(s)
    if n == 0:
        return {"n": 0, "median_us": None, "p99_us": None, "mean_us": None, "min_us": None,
                "max_us": None}
    i99 = max(0, math.ceil(0.99 * n) - 1)
    return {"n": n,
            "median_us": _median_sorted(s) / 1e3,
            "p99_us": float(s[i99]) / 1e3,
            "mean_us": sum(s) / n / 1e3,
            "min_us": float(s[0]) / 1e3,
            "max_us": float(s[-1]) / 1e3}


def timer_overhead(n: int = 2000, batch: int = 100) -> dict:
    """The cost of the measurement itself, measured now: a back-to-back
    perf_counter_ns pair, an empty Python call timed alone, and the same
    call in batches of ``batch`` (per call)."""
    pc = time.perf_counter_ns
    pair = []
    for _ in range(n):
        t0 = pc()
        t1 = pc()
        pair.append(t1 - t0)
    alone, batched = [], []
    time_calls(_noop, (0, None), n, 1, alone)
    time_calls(_noop, (0, None), max(20, n // 10), batch, batched)
    info = time.get_clock_info("perf_counter")
    sp, sa, sb = stats(pair), stats(alone), stats(batched)
    return {"clock": f"time.perf_counter_ns ({info.implementation})",
            "resolution_ns": info.resolution * 1e9,
            "pair_median_ns": sp["median_us"] * 1e3, "pair_p99_ns": sp["p99_us"] * 1e3,
            "empty_call_median_ns": sa["median_us"] * 1e3,
            "empty_call_p99_ns": sa["p99_us"] * 1e3,
            "empty_call_in_batch_ns": sb["median_us"] * 1e3, "batch": batch}


@dataclasses.dataclass
class Cfg:
    quick: bool
    iters: int
    warmup: int
    max_time_ns: float
    rounds: int
    min_samples: int
    batch: int          # 0: automatic
    warmup_time_ns: float

    @classmethod
    def from_args(cls, args, command: str) -> "Cfg":
        d = dict((_QUICK if args.quick else _DEFAULTS)[command])
        if args.iters is not None:
            d["iters"] = args.iters
        if args.warmup is not None:
            d["warmup"] = args.warmup
        if args.max_time is not None:
            d["max_time"] = args.max_time
        return cls(quick=bool(args.quick), iters=d["iters"], warmup=d["warmup"],
                   max_time_ns=d["max_time"] * 1e9, rounds=d["rounds"],
                   min_samples=min(d["min_samples"], d["iters"]), batch=args.batch or 0,
                   warmup_time_ns=_WARMUP_TIME_NS[bool(args.quick)])

    def as_dict(self) -> dict:
        return {"iters": self.iters, "warmup": self.warmup,
                "max_time_s": self.max_time_ns / 1e9, "rounds": self.rounds,
                "min_samples": self.min_samples, "batch": self.batch or "auto",
                "batch_below_ns": BATCH_BELOW_NS, "batch_target_ns": BATCH_TARGET_NS,
                "quick": self.quick}


@dataclasses.dataclass
class Op:
    """One timed method at one size and direction."""
    key: str                      # stable id: "write", "put", "cupy", ...
    method: str                   # display name: "Mapping.write"
    short: str                    # summary column label
    library: str                  # gdrpy / cuda-python / cupy / torch / C
    direction: str
    nbytes: int
    fn: Callable | None = None
    args: tuple = ()
    host: Any = None              # numpy view of the host bytes the op copies from/to
    check: Callable | None = None  # check(result): raise if the call reported failure
    samples: list = dataclasses.field(default_factory=list)
    batch: int = 1
    target: int = 0
    est_ns: float = 0.0
    error: str | None = None
    verified: bool | None = None
    extra: dict = dataclasses.field(default_factory=dict)
    offset: int = 0               # device offset (in the pin) the op copies to/from

    def row(self, command: str) -> dict:
        st = stats(self.samples)
        r = {"command": command, "direction": self.direction, "method": self.method,
             "key": self.key, "library": self.library, "size": self.nbytes,
             "samples": st.pop("n"), "batch": self.batch,
             "calls": len(self.samples) * self.batch, **st,
             "estimate_us": self.est_ns / 1e3 if self.est_ns else None,
             "verified": self.verified, "error": self.error}
        med = st["median_us"]
        r["gbps_median"] = self.nbytes / (med * 1e3) if med else None
        r.update(self.extra)
        return r


def _call_checked(op: Op):
    res = op.fn(*op.args)
    if op.check is not None:
        op.check(res)
    return res


def _prepare(op: Op, cfg: Cfg) -> None:
    """Untimed first call, then timed warm-up calls: per-call estimate and B."""
    _call_checked(op)
    times: list = []
    pc = time.perf_counter_ns
    start = pc()
    want = max(2, cfg.warmup)
    while len(times) < want and (len(times) < 2 or pc() - start < cfg.warmup_time_ns):
        time_calls(op.fn, op.args, 1, 1, times)
    op.est_ns = _median_sorted(sorted(times))
    if cfg.batch:
        op.batch = cfg.batch
    elif op.est_ns < BATCH_BELOW_NS:
        op.batch = int(min(BATCH_MAX, max(2, math.ceil(BATCH_TARGET_NS / max(op.est_ns, 1.0)))))
    else:
        op.batch = 1


def _target(cfg: Cfg, cost_ns: float) -> int:
    """Samples for a measurement whose one sample costs ``cost_ns``."""
    by_time = int(cfg.max_time_ns / max(cost_ns, 1.0))
    return max(cfg.min_samples, min(cfg.iters, by_time))


def _pattern(n: int, salt: int) -> np.ndarray:
    """n bytes of a salted pattern (period 4099: no alignment with pages or
    lines), built without an n-sized temporary of wider integers."""
    base = ((np.arange(4099, dtype=np.uint32) * 131 + salt) & 0xFF).astype(np.uint8)
    return np.resize(base, n)


def _verify(op: Op, env: "_Env", salt: int) -> None:
    """Run ``op`` once on a pattern and check the bytes arrived (through the
    copy-engine path of the pin, or the pattern it wrote)."""
    n = op.nbytes
    pat = _pattern(n, 17 * salt + n)
    try:
        if op.direction == "h2d":
            op.host[:] = pat
            _call_checked(op)
            back = env.pin.ce_read(op.offset, n)
            op.verified = back == pat.tobytes()
        else:
            env.pin.ce_write(op.offset, pat)
            op.host[:] = ~pat
            _call_checked(op)
            op.verified = bool(np.array_equal(op.host, pat))
    except Exception as e:   # reported with the row; timing is skipped
        op.error = f"{type(e).__name__}: {e}"
        op.verified = False


def measure_group(ops: list, cfg: Cfg, *, per_sample: bool = False,
                  same_batch: bool = False) -> None:
    """Warm up, then time every op of ``ops`` interleaved.

    ``per_sample=False``: ``cfg.rounds`` rounds, each op takes a chunk of its
    samples per round (re-warmed first), the order rotating.
    ``per_sample=True``: one sample of every op per round, cycling through
    every order of the ops; all ops get the same number of samples (bounded
    by ``max_time`` for the whole group) and, with ``same_batch``, the same B
    (the one of the fastest op).  An op that raises keeps its error (reported
    with its row) and the others go on."""
    was = gc.isenabled()
    gc.disable()
    try:
        live = []
        for op in ops:
            if op.error:
                continue
            try:
                _prepare(op, cfg)
            except Exception as e:
                op.error = f"{type(e).__name__}: {e}"
                continue
            live.append(op)
        if not live:
            return
        if per_sample:
            if same_batch and not cfg.batch:
                b = max(op.batch for op in live)
                for op in live:
                    op.batch = b
            n = _target(cfg, sum(op.est_ns * op.batch for op in live))
            for op in live:
                op.target = n
            rounds = n
        else:
            for op in live:
                op.target = _target(cfg, op.est_ns * op.batch)
            rounds = max(1, min(cfg.rounds or 1, min(op.target for op in live)))
        orders = _orders(live, per_sample)
        for r in range(rounds):
            order = orders[r % len(orders)]
            for op in order:
                if op.error:
                    continue
                want = (op.target * (r + 1)) // rounds - len(op.samples)
                if want <= 0:
                    continue
                try:
                    if not per_sample and rounds > 1 and op.est_ns < 1e6:
                        rewarm = int(min(2 * op.batch, max(1, 100_000 / max(op.est_ns, 1.0))))
                        time_calls(op.fn, op.args, rewarm, 1, [])
                    time_calls(op.fn, op.args, want, op.batch, op.samples)
                except Exception as e:
                    op.error = f"{type(e).__name__}: {e}"
    finally:
        if was:
            gc.enable()


def _orders(ops: list, all_permutations: bool) -> list:
    """Orders to cycle through, one per round: every permutation (up to 4
    ops), so that each op precedes and follows every other equally often and
    the state one op leaves behind (caches, write-combining buffers) biases
    none; else the rotations."""
    k = len(ops)
    if all_permutations and k <= 4:
        import itertools
        return [list(p) for p in itertools.permutations(ops)]
    return [ops[r:] + ops[:r] for r in range(k)]


# ---------------------------------------------------------------------------
# Context, header, environment

def open_context(args):
    """gdrpy.open(args.device, args.backend) with a clear message where no GPU
    backend works.  Returns the Context or raises SystemExit(2)."""
    import gdrpy
    try:
        return gdrpy.open(args.device, args.backend)
    except gdrpy.GdrError as e:
        backend = args.backend or os.environ.get("GDRPY_BACKEND") or "auto"
        print(f"gdrpy bench: cannot open device {args.device} with backend {backend!r}: {e}",
              file=sys.stderr)
        if backend != "sim":
            print("  With no GPU, run on the sim backend instead (host memory stands in for "
                  "the GPU): --backend sim or GDRPY_BACKEND=sim", file=sys.stderr)
        raise SystemExit(2) from None


def metadata(ctx, command: str) -> dict:
    import gdrpy
    from .transfer import host_identity
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


class _Env:
    """One device buffer, pinned and mapped, and a host numpy buffer."""

    def __init__(self, ctx, nbytes: int):
        import gdrpy
        self.ctx = ctx
        self.size = nbytes
        self.buf = gdrpy.memory.alloc(nbytes, ctx=ctx)
        try:
            self.pin = ctx.pin(self.buf)
            self.m = self.pin.map()
        except BaseException:
            self.buf.close()
            raise
        self.host = _pattern(nbytes, 3)

    def close(self) -> None:
        from .errors import BusyError
        for obj in (getattr(self, "m", None), getattr(self, "pin", None)):
            if obj is not None:
                obj.close()
        try:
            self.buf.close()
        except BusyError as e:
            # A library's view of the buffer (a torch/cupy tensor) is still
            # referenced somewhere; freeing would leave it dangling, so keep
            # the buffer until the process ends, and say so.
            print(f"note: benchmark buffer kept allocated: {e}", file=sys.stderr)


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
    print("method: warm-up (1 untimed call + up to %d timed), then up to %d samples per "
          "method (max %.3g s each, at least %d)%s;" % (
              cfg.warmup, cfg.iters, cfg.max_time_ns / 1e9, cfg.min_samples, extra))
    print("        methods under %.0f us are timed in batches of B calls (batch ~%.0f us; "
          "sample = batch mean), others call by call (B=1)%s;" % (
              BATCH_BELOW_NS / 1e3, BATCH_TARGET_NS / 1e3,
              f"; --batch {cfg.batch} forced" if cfg.batch else ""))
    print("        GC off while timing; median and p99 (nearest rank) in us; each method's "
          "bytes checked once before timing (column ok).")
    print("timer:  %s, resolution %.0f ns; clock pair %.0f ns; empty call timed alone "
          "%.0f ns (p99 %.0f); in a batch of %d: %.1f ns per call - included below, "
          "not subtracted" % (
              timer["clock"], timer["resolution_ns"], timer["pair_median_ns"],
              timer["empty_call_median_ns"], timer["empty_call_p99_ns"], timer["batch"],
              timer["empty_call_in_batch_ns"]))


# ---------------------------------------------------------------------------
# What a Python user would pick instead

class _CudaPython:
    library = "cuda-python"

    def __init__(self, ctx, env: _Env):
        from .memory import cuda_driver, primary_context
        self.cu = cuda_driver()
        primary_context(ctx.device)
        self.env = env
        self.dptr = int(env.buf.ptr)
        self.hptr = int(env.host.ctypes.data)
        try:
            import cuda.bindings
            self.version = getattr(cuda.bindings, "__version__", "?")
        except Exception:
            self.version = "?"
        cu = self.cu

        def check(res, _cu=cu):
            err = res[0] if isinstance(res, tuple) else res
            if int(err) != 0:
                try:
                    name = _cu.cuGetErrorName(err)[1].decode()
                except Exception:
                    name = str(err)
                raise RuntimeError(f"cuMemcpy failed: {name}")
        self.check = check

    def op(self, direction: str, n: int) -> Op:
        if direction == "h2d":
            return Op("cuMemcpyHtoD", "cuda-python cuMemcpyHtoD", "cuMemcpy(py)", self.library,
                      direction, n, self.cu.cuMemcpyHtoD, (self.dptr, self.hptr, n),
                      self.env.host[:n], self.check)
        return Op("cuMemcpyDtoH", "cuda-python cuMemcpyDtoH", "cuMemcpy(py)", self.library,
                  direction, n, self.cu.cuMemcpyDtoH, (self.hptr, self.dptr, n),
                  self.env.host[:n], self.check)

    def close(self):
        pass


class _CuPy:
    library = "cupy"

    def __init__(self, ctx, env: _Env):
        import cupy
        self.cupy = cupy
        self.version = cupy.__version__
        cupy.cuda.Device(ctx.device).use()
        self.a = cupy.asarray(env.buf)          # over our memory, through CAI
        if int(self.a.data.ptr) != int(env.buf.ptr):
            raise RuntimeError("cupy.asarray(buf) did not alias the buffer")
        self.env = env

    def op(self, direction: str, n: int) -> Op:
        av = self.a[:n]
        hv = self.env.host[:n]
        if direction == "h2d":
            return Op("cupy", "cupy ndarray.set (pageable)", "cupy", self.library, direction, n,
                      av.set, (hv,), hv)
        return Op("cupy", "cupy ndarray.get(out=) (pageable)", "cupy", self.library, direction,
                  n, functools.partial(av.get, out=hv), (), hv)

    def close(self):
        self.a = None


class _Torch:
    library = "torch"

    def __init__(self, ctx, env: _Env):
        import torch
        self.version = torch.__version__
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        torch.cuda.set_device(ctx.device)
        why = []
        t = None
        for how, make in (("torch.from_dlpack", lambda: torch.from_dlpack(env.buf)),
                          ("torch.as_tensor (CAI)",
                           lambda: torch.as_tensor(env.buf, device=f"cuda:{ctx.device}"))):
            try:
                cand = make()
            except Exception as e:
                why.append(f"{how}: {type(e).__name__}: {e}")
                continue
            if cand.data_ptr() != int(env.buf.ptr) or cand.numel() != env.buf.size:
                why.append(f"{how}: did not alias the buffer")
                continue
            t, self.how = cand, how + (f"; {'; '.join(why)}" if why else "")
            break
        if t is None:
            raise RuntimeError("no torch tensor over our memory: " + "; ".join(why))
        self.t = t
        self.pinned = torch.empty(env.size, dtype=torch.uint8, pin_memory=True)
        self.pinned_np = self.pinned.numpy()

    def op(self, direction: str, n: int) -> Op:
        dv = self.t[:n]
        hv = self.pinned[:n]
        if direction == "h2d":
            return Op("torch", "torch t.copy_(pinned)", "torch", self.library, direction, n,
                      dv.copy_, (hv,), self.pinned_np[:n])
        return Op("torch", "torch pinned.copy_(t)", "torch", self.library, direction, n,
                  hv.copy_, (dv,), self.pinned_np[:n])

    def close(self):
        self.t = None
        self.pinned = None
        self.pinned_np = None


_ALTERNATIVES = (("cuda-python", _CudaPython, "cuda.bindings"),
                 ("cupy", _CuPy, "cupy"),
                 ("torch", _Torch, "torch"))


def _alternatives(ctx, env: _Env, which=("cuda-python", "cupy", "torch")):
    """(providers, skipped): the other libraries' copies, each only where it
    is importable and the backend is a real GPU."""
    import importlib.util
    provs, skipped = [], []
    for name, cls, module in _ALTERNATIVES:
        if name not in which:
            continue
        if ctx.is_sim:
            skipped.append({"library": name, "reason": "sim backend: no GPU to copy to"})
            continue
        try:
            spec = importlib.util.find_spec(module.split(".")[0])
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            skipped.append({"library": name, "reason": f"{module} is not importable"})
            continue
        try:
            provs.append(cls(ctx, env))
        except Exception as e:
            skipped.append({"library": name, "reason": f"{type(e).__name__}: {e}"})
    return provs, skipped


def _gdrpy_ops(env: _Env, direction: str, n: int, transfer=None) -> list:
    """Mapping.write/read, Transfer.put/get (when ``transfer`` is given) and
    Pin.ce_write/ce_read, all between env.host and offset 0 of the pin."""
    m, pin, host = env.m, env.pin, env.host
    hv = host[:n]
    if direction == "h2d":
        ops = [Op("write", "gdrpy Mapping.write", "write", "gdrpy", direction, n,
                  m.write, (0, hv), hv)]
        if transfer is not None:
            ops.append(Op("put", "gdrpy Transfer.put (auto)", "put", "gdrpy", direction, n,
                          transfer.put, (0, hv), hv))
        ops.append(Op("ce_write", "gdrpy Pin.ce_write", "ce_write", "gdrpy", direction, n,
                      pin.ce_write, (0, hv), hv))
        return ops
    ops = [Op("read", "gdrpy Mapping.read", "read", "gdrpy", direction, n,
              m.read, (0, n, host), hv)]
    if transfer is not None:
        ops.append(Op("get", "gdrpy Transfer.get (auto)", "get", "gdrpy", direction, n,
                      transfer.get, (0, hv), hv))
    ops.append(Op("ce_read", "gdrpy Pin.ce_read", "ce_read", "gdrpy", direction, n,
                  pin.ce_read, (0, n, host), hv))
    return ops


def _ready_default_picker(ctx, calibrate: bool = True, budget: float = 5.0) -> dict:
    """The context's default picker, calibrated first where it has no
    calibration (unless ``calibrate`` is False).  Returns a description."""
    from .threshold import format_threshold
    from .transfer import calibrate_context, default_picker
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
        res = calibrate_context(ctx, picker, budget_s=budget)
        desc.update(calibrated_now=True, calibration_s=time.perf_counter() - t0,
                    budget_s=budget, truncated=bool(getattr(res, "truncated", False)))
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
               f"{desc['budget_s']:g} s{', truncated' if desc.get('truncated') else ''})")
    elif all(s == "default" for s in desc["sources_before"].values()):
        how = "not calibrated (--no-calibrate): provisional defaults"
    else:
        how = "stored calibration"
    return f"default picker: {thr}; {how}"


# ---------------------------------------------------------------------------
# The C benchmark (native/build/gdrpy_copylat)

def _copylat_path(explicit: str | None) -> str | None:
    cands = []
    if explicit:
        cands.append(explicit)
    if os.environ.get("GDRPY_COPYLAT"):
        cands.append(os.environ["GDRPY_COPYLAT"])
    here = os.path.dirname(os.path.abspath(__file__))
    cands.append(os.path.join(os.path.dirname(here), "native", "build", "gdrpy_copylat"))
    w = shutil.which("gdrpy_copylat")
    if w:
        cands.append(w)
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def run_copylat(ctx, sizes: list, args, no_ce: bool = False) -> dict:
    """Run gdrpy_copylat on the same backend and device; its JSON (plus how
    it ran) or a dict with an 'error'."""
    path = _copylat_path(getattr(args, "copylat", None))
    if path is None:
        return {"error": "native/build/gdrpy_copylat not found: build it with "
                         "`make -C native bench` (or pass --copylat PATH)"}
    if len(sizes) > 64:
        sizes = sizes[:64]
    with tempfile.TemporaryDirectory(prefix="gdrpy-bench-") as td:
        jpath = os.path.join(td, "copylat.json")
        cmd = [path, "--backend", ctx.backend, "--device", str(ctx.device),
               "--sizes", ",".join(str(s) for s in sizes), "--json", jpath]
        if args.quick:
            cmd.append("--quick")
        if args.isa:
            cmd += ["--isa", args.isa]
        if args.cpu is not None:
            cmd += ["--cpu", str(args.cpu)]
        if no_ce:
            cmd.append("--no-ce")
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as e:
            return {"error": f"{path}: {e}", "cmd": cmd}
        dt = time.perf_counter() - t0
        out = {"cmd": cmd, "returncode": proc.returncode, "seconds": dt,
               "stdout": proc.stdout, "stderr": proc.stderr}
        try:
            with open(jpath) as f:
                out["json"] = json.load(f)
        except (OSError, ValueError) as e:
            out["error"] = (f"gdrpy_copylat exited {proc.returncode} without JSON ({e}): "
                            f"{proc.stderr.strip()[-500:]}")
    return out


# C op name -> (direction, key, method, short)
_C_OPS = {
    "to_mapping": ("h2d", "c_kernel", "C copy_to_mapping (+sfence)", "C kernel"),
    "to_mapping+rb": ("h2d", "c_kernel_rb", "C copy_to_mapping + 8 B read-back", "C kern+rb"),
    "from_mapping": ("d2h", "c_kernel", "C copy_from_mapping", "C kernel"),
    "cuMemcpyHtoD (pinned)": ("h2d", "c_cumemcpy", "C cuMemcpyHtoD (pinned)", "C cuMemcpy"),
    "gdrpy_memcpy_htod (sim)": ("h2d", "c_cumemcpy", "C gdrpy_memcpy_htod (sim)", "C cuMemcpy"),
    "cuMemcpyDtoH (pinned)": ("d2h", "c_cumemcpy", "C cuMemcpyDtoH (pinned)", "C cuMemcpy"),
    "gdrpy_memcpy_dtoh (sim)": ("d2h", "c_cumemcpy", "C gdrpy_memcpy_dtoh (sim)", "C cuMemcpy"),
    "raw NT store": ("h2d", "c_raw", "C raw NT store loop (best ISA)", "C raw NT"),
    "raw NT load": ("d2h", "c_raw", "C raw NT load loop (best ISA)", "C raw NT"),
}


def c_rows(c: dict, command: str) -> list:
    """Rows of the C benchmark in our row format (raw loops: the best ISA per
    size; kernels: the dispatched one unless --isa)."""
    js = c.get("json") or {}
    best: dict = {}
    for r in js.get("results", []):
        spec = _C_OPS.get(r.get("op"))
        if spec is None:
            continue
        direction, key, method, short = spec
        k = (direction, key, r["size"])
        if k in best and best[k]["median_ns"] <= r["median_ns"]:
            continue
        best[k] = r
    rows = []
    korder = ["c_kernel", "c_kernel_rb", "c_cumemcpy", "c_raw"]
    for (direction, key, size), r in sorted(
            best.items(), key=lambda kv: (kv[0][2], DIRECTIONS.index(kv[0][0]),
                                          korder.index(kv[0][1]))):
        spec = _C_OPS[r["op"]]
        med = r["median_ns"] / 1e3
        rows.append({
            "command": command, "direction": direction, "method": spec[2], "key": key,
            "library": "C", "size": size, "samples": r.get("iters"), "batch": 1,
            "calls": r.get("iters"), "median_us": med, "p99_us": r["p99_ns"] / 1e3,
            "mean_us": r.get("mean_ns", 0) / 1e3, "min_us": r["min_ns"] / 1e3, "max_us": None,
            "estimate_us": None, "verified": js.get("verify_ok"), "error": None,
            "gbps_median": r.get("gbps_median"), "bytes_per_iter": r.get("bytes"),
            "isa": r.get("isa"), "timer": "rdtscp", "short": spec[3],
            "pct_of_raw": r.get("pct_of_raw")})
    return rows


def _c_summary_line(c: dict) -> str:
    js = c.get("json") or {}
    if "error" in c:
        return f"C benchmark: skipped - {c['error']}"
    return (f"C benchmark: {os.path.basename(c['cmd'][0])} ({c['seconds']:.2f} s, exit "
            f"{c['returncode']}), TSC {js.get('tsc_ghz', 0):.3f} GHz, rdtscp overhead "
            f"{js.get('timer_overhead_ns', 0):.1f} ns (included), copy kernel "
            f"{js.get('auto_isa')}, verify {'OK' if js.get('verify_ok') else 'FAILED'}; each "
            f"call timed alone")


# ---------------------------------------------------------------------------
# Tables

def _table(headers: list, rows: list, aligns: str | None = None) -> str:
    """Aligned text table; aligns: one of 'l'/'r' per column (default: first
    column left, others right)."""
    cols = len(headers)
    aligns = aligns or ("l" + "r" * (cols - 1))
    widths = [len(str(h)) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(str(c)))

    def line(cells):
        out = []
        for i, c in enumerate(cells):
            s = str(c)
            out.append(s.ljust(widths[i]) if aligns[i] == "l" else s.rjust(widths[i]))
        return "  ".join(out).rstrip()
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def _ok_text(row: dict) -> str:
    if row.get("error"):
        return "ERROR"
    v = row.get("verified")
    return "yes" if v else ("-" if v is None else "NO")


_DETAIL_COLS = (("size", 6, "l"), ("dir", 4, "l"), ("method", 36, "l"),
                ("median us", 10, "r"), ("p99 us", 10, "r"), ("mean us", 10, "r"),
                ("min us", 10, "r"), ("B", 5, "r"), ("n", 6, "r"), ("GB/s", 8, "r"),
                ("ok", 5, "l"))


def _fixed_line(cells, cols) -> str:
    out = []
    for c, (_, w, a) in zip(cells, cols):
        s = str(c)
        out.append(s.ljust(w) if a == "l" else s.rjust(w))
    return "  ".join(out).rstrip()


def _fixed_header(cols) -> str:
    return (_fixed_line([c[0] for c in cols], cols) + "\n"
            + "  ".join("-" * w for _, w, _ in cols))


def _detail_line(r: dict) -> str:
    return _fixed_line([format_size(r["size"]), r["direction"], r["method"],
                        _fmt(r["median_us"]), _fmt(r["p99_us"]), _fmt(r["mean_us"]),
                        _fmt(r["min_us"]), r["batch"],
                        r["samples"] if r["samples"] is not None else "-",
                        _fmt(r.get("gbps_median")), _ok_text(r)], _DETAIL_COLS)


def _errors_text(rows: list) -> list:
    return [f"  {r['direction']} {format_size(r['size'])} {r['method']}: {r['error']}"
            for r in rows if r.get("error")]


# ---------------------------------------------------------------------------
# JSON and plots

def _write_json(path: str, doc: dict) -> None:
    def clean(o):
        if isinstance(o, float):
            return o if math.isfinite(o) else None
        if isinstance(o, dict):
            return {str(k): clean(v) for k, v in o.items() if not callable(v)}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        if isinstance(o, (np.integer,)):
            return int(o)
        if isinstance(o, (np.floating,)):
            return clean(float(o))
        if isinstance(o, (str, int, bool)) or o is None:
            return o
        return str(o)
    with open(path, "w") as f:
        json.dump(clean(doc), f, indent=1, allow_nan=False)
        f.write("\n")
    print(f"JSON written to {path}")


def _matplotlib():
    try:
        from matplotlib.figure import Figure
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError as e:
        print(f"note: --plot skipped: matplotlib is not installed ({e}); "
              f"pip install matplotlib", file=sys.stderr)
        return None
    return Figure, FigureCanvasAgg


def _title(meta: dict, what: str) -> str:
    t = f"gdrpy {what} - {meta['backend']}, {meta['gpu']}, {meta['copy_kernel']}"
    if meta["sim"]:
        t += "\nSIM: host memory stands in for the GPU - no GPU numbers"
    return t


def _plot_lines(ax, rows: list, direction: str, ykey: str, keys_order: list) -> None:
    by: dict = {}
    for r in rows:
        if r["direction"] != direction or r.get(ykey) is None or r.get("error"):
            continue
        by.setdefault(r["method"], []).append((r["size"], r[ykey]))
    for method in keys_order:
        pts = sorted(by.get(method, []))
        if not pts:
            continue
        xs, ys = zip(*pts)
        style = "--" if method.startswith("C ") else "-"
        ax.plot(xs, ys, style, marker="o", markersize=3, label=method)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _size_ticks(ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _size_ticks(ax) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator
    ax.xaxis.set_major_locator(LogLocator(base=4))
    ax.xaxis.set_major_formatter(FuncFormatter(
        lambda x, _pos: format_size(int(round(x))) if x >= 1 else ""))


def _methods_in_order(rows: list) -> list:
    seen = []
    for r in rows:
        if r["method"] not in seen:
            seen.append(r["method"])
    return seen


def _save_plot(path: str, command: str, meta: dict, rows: list, extra: dict | None = None):
    mp = _matplotlib()
    if mp is None:
        return False
    Figure, Canvas = mp
    order = _methods_in_order(rows)
    if command == "transfer":
        fig = Figure(figsize=(15, 5))
        Canvas(fig)
        axes = fig.subplots(1, 3)
    else:
        fig = Figure(figsize=(12, 5))
        Canvas(fig)
        axes = fig.subplots(1, 2)
    ykey = "gbps_median" if command == "bandwidth" else "median_us"
    ylabel = "GB/s (from median)" if command == "bandwidth" else "median latency (us)"
    for ax, d in zip(axes, DIRECTIONS):
        _plot_lines(ax, rows, d, ykey, order)
        ax.set_title(f"{d} ({_DIR_TEXT[d]})")
        ax.set_xlabel("bytes")
        ax.set_ylabel(ylabel)
    if command == "transfer" and extra:
        ax = axes[2]
        for d in DIRECTIONS:
            pts = sorted((g["size"], g["regret"] * 100) for g in extra["regret"]
                         if g["direction"] == d and g["regret"] is not None)
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o", markersize=3, label=d)
        ax.axhline(5, color="red", linestyle=":", linewidth=1, label="5 %")
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_xscale("log", base=2)
        _size_ticks(ax)
        ax.set_title("regret: auto / min(fixed) - 1")
        ax.set_xlabel("bytes")
        ax.set_ylabel("%")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(_title(meta, command), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")
    return True


def _finish(args, command: str, meta: dict, rows: list, doc_extra: dict) -> None:
    if args.json:
        doc = {"tool": "gdrpy bench", "schema": 1, "command": command, "meta": meta,
               "rows": rows, **doc_extra}
        _write_json(args.json, doc)
    if args.plot:
        try:
            _save_plot(args.plot, command, meta, rows, doc_extra)
        except Exception as e:  # a plot never costs the measurements
            print(f"note: --plot failed: {type(e).__name__}: {e}", file=sys.stderr)


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
                                         budget=_calibrate_budget(args))
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
                    print(f"  {format_size(r['size']):>5} {r['direction']}  {r['method']:<40} "
                          f"median {_fmt(r['median_us'])} us  p99 {_fmt(r['p99_us'])} us")
            rows += iso
        finally:
            for p in provs:
                with contextlib.suppress(Exception):
                    p.close()
            ops = op = None   # the last ops hold views of the buffer (torch/cupy/numpy)
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


# ---------------------------------------------------------------------------
# bench bandwidth

def cmd_bandwidth(args) -> int:
    sizes = args.sizes or parse_sizes(DEFAULT_SIZES["bandwidth"])
    cfg = Cfg.from_args(args, "bandwidth")
    rows: list = []
    skipped: list = []
    c = None
    with _session(args, "bandwidth") as (ctx, meta):
        env = _Env(ctx, max(sizes))
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
            ops = op = None   # the last ops hold views of the buffer (torch/cupy/numpy)
            gc.collect()
            env.close()
    _finish(args, "bandwidth", meta, rows, {"skipped": skipped, "c_benchmark": _c_for_json(c)})
    _print_errors(rows)
    print()
    print(_bandwidth_summary(rows, sizes, meta, c is not None and "json" in c))
    return 0


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

        def g(n, key):
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


# ---------------------------------------------------------------------------
# bench transfer

_TRANSFER_COLS = (("dir", 4, "l"), ("size", 6, "l"), ("auto med", 9, "r"),
                  ("auto p99", 9, "r"), ("path", 7, "l"), ("map med", 9, "r"),
                  ("map p99", 9, "r"), ("ce med", 9, "r"), ("ce p99", 9, "r"), ("B", 5, "r"),
                  ("n", 5, "r"), ("ok", 4, "l"), ("regret", 10, "r"))


def cmd_transfer(args) -> int:
    import gdrpy
    from .threshold import ThresholdPicker, format_threshold
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
        try:
            timer = timer_overhead()
            meta["timer"] = timer
            meta["config"] = cfg.as_dict()
            _print_methodology(cfg, timer, "; the three variants interleaved sample by sample "
                               "(every order in turn), with the same B")
            desc = _ready_default_picker(ctx, calibrate=not args.no_calibrate,
                                         budget=_calibrate_budget(args))
            picker = desc.pop("picker")
            print(_picker_line(desc))
            meta["picker"] = desc
            auto = env.m.transfer()       # what gdrpy.put/get use: the default picker
            if auto.picker is not picker:
                auto = gdrpy.Transfer(env.m, picker)
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
                        hv = env.host[hoff:hoff + n]
                        ops.append(Op(key, name, key, "gdrpy", d, n,
                                      t.put if d == "h2d" else t.get, (off, hv), hv,
                                      offset=off))
                    for op in ops:
                        salt += 1
                        _verify(op, env, salt)
                    measure_group(ops, cfg, per_sample=True, same_batch=True)
                    path = auto.path_for(d, n)
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
            ops = op = None   # the last ops hold views of the buffer (torch/cupy/numpy)
            gc.collect()
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
        verdict = "yes" if summary["within_5pct"] else \
            f"NO ({len(summary['over_5pct'])} over)"
        print(f"worst regret: {summary['worst_regret'] * 100:+.1f}% ({w['direction']} "
              f"{format_size(w['size'])}); every size within 5%: {verdict}{sim}")
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


# ---------------------------------------------------------------------------
# pingpong (gdrpy.pingpong, someone else's module)

def _pingpong_unavailable(args) -> int:
    print(f"gdrpy bench pingpong: unavailable: {args.pingpong_error}", file=sys.stderr)
    print("  The pingpong benchmark is gdrpy/pingpong.py; this installation lacks it or it "
          "failed to import.", file=sys.stderr)
    return 2


def _pingpong_main(args) -> int:
    return importlib.import_module(f"{__package__}.pingpong").main(args)


def _add_pingpong(sub) -> None:
    helptext = "CPU<->GPU round trips (gdrpy.pingpong)"
    try:
        pingpong = importlib.import_module(f"{__package__}.pingpong")  # here, not at import
    except Exception as e:       # absent, or broken: `bench pingpong` says so, nothing else breaks
        if isinstance(e, ModuleNotFoundError) and e.name == f"{__package__}.pingpong":
            why = "the module gdrpy.pingpong is not installed"
        else:
            why = f"importing gdrpy.pingpong failed: {type(e).__name__}: {e}"
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
                       pingpong_error=f"gdrpy.pingpong.add_arguments failed: "
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
                   help="also run the C benchmark native/build/gdrpy_copylat (make -C native "
                        "bench) and merge its rows")
    p.add_argument("--copylat", metavar="PATH", default=None,
                   help="path of gdrpy_copylat (default: native/build/, $GDRPY_COPYLAT, PATH)")
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
