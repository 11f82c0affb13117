"""The timing core: timed calls in batches or in isolation, the timer's own cost, and
the interleaved measurement of a group of methods."""

from __future__ import annotations

import dataclasses
import gc
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..stats import median
from .common import (
    _DEFAULTS,
    _QUICK,
    _WARMUP_TIME_NS,
    BATCH_BELOW_NS,
    BATCH_MAX,
    BATCH_TARGET_NS,
    stats,
)

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


def measure_isolated(env: _Env, transfer, sizes: list, count: int, gap_us: float) -> list:
    """Rows for gdrpy's mapping paths measured as isolated messages."""
    rows: list[dict] = []
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
    alone: list[float] = []
    batched: list[float] = []
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
    def from_args(cls, args, command: str) -> Cfg:
        d: dict[str, Any] = dict((_QUICK if args.quick else _DEFAULTS)[command])
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
    assert op.fn is not None, op.method
    res = op.fn(*op.args)
    if op.check is not None:
        op.check(res)
    return res


def _prepare(op: Op, cfg: Cfg) -> None:
    """Untimed first call, then timed warm-up calls: per-call estimate and B."""
    _call_checked(op)
    assert op.fn is not None
    times: list = []
    pc = time.perf_counter_ns
    start = pc()
    want = max(2, cfg.warmup)
    while len(times) < want and (len(times) < 2 or pc() - start < cfg.warmup_time_ns):
        time_calls(op.fn, op.args, 1, 1, times)
    op.est_ns = median(sorted(times))
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
        from gdrpy.errors import BusyError
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


def _verify(op: Op, env: _Env, salt: int) -> None:
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
