"""Staging plan: how pageable host memory reaches the copy engines.

A copy-engine ``put``/``get`` from or to *pageable* memory goes either
straight to cuMemcpy (``ce-direct``: the driver stages the memory itself) or
through the context's pipelined staging ring (``ce-staged``: page-locked
chunks, the CPU copy of chunk i+1 overlapping the DMA of chunk i, see
native/src/staging/staging.c).  A :class:`StagingPlan` holds, per (device,
backend):

* ``chunk``, ``depth``, ``threads``: the ring's parameters (chunk bytes, slots,
  memcpy threads);
* ``write_kind``, ``read_kind``: how the CPU side of each direction touches
  the ring ('plain' memcpy, 'nt' streaming stores, 'wc' a write-combined
  ring, 'evict' memcpy then the lines leave the CPU's caches, 'ntevict'
  (reads) streaming stores into the caller's memory and evict; see
  gdrpy_host.h): the engine slows down when it must snoop lines that the
  copying threads hold in their caches;
* ``staged_min``: per direction, the smallest message that is staged;
* ``locked_gain_min``: from this size up, page-locked memory is recognised
  and copied without staging or extra waits (below it every kind takes the
  same path, so small messages are never classified).

Sources, in order: ``$GDRPY_STAGING`` (e.g. ``chunk=4M,depth=4,threads=4,
staged_min=1M``; fixes the named fields), the cache of an earlier
calibration on this host (``staging-<key>.json`` next to the threshold
cache, keyed by the same host identity), a calibration (real GPU backends,
unless ``GDRPY_AUTOCALIBRATE=0``), else the defaults.  The sim backend never
calibrates automatically.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from . import _core
from .identity import host_identity
from .threshold import cache_dir, identity_key, parse_threshold

__all__ = ["StagingPlan", "calibrate_plan", "default_plan", "parse_plan_env", "pick_staged_min",
           "ring_sizes"]

KIB = 1 << 10
MIB = 1 << 20
SCHEMA = 5   # 3: ring kinds; 4: worst-cell candidate rounds; 5: up to 64 slots, median rounds
KINDS = ("plain", "nt", "wc", "evict", "ntevict")
NEVER = 1 << 62
MAX_DEPTH = 64          # ring slots (gdrpy_staging_set)
MAX_RING = 256 * MIB    # chunk x depth: the ring's page-locked memory

_plans: dict = {}
_plans_lock = threading.Lock()


def _default_threads() -> int:
    n = os.cpu_count() or 1
    return 4 if n >= 16 else 2 if n >= 8 else 1


@dataclasses.dataclass
class StagingPlan:
    chunk: int = 4 * MIB
    depth: int = 4
    threads: int = dataclasses.field(default_factory=_default_threads)
    write_kind: str = "wc"
    read_kind: str = "ntevict"
    staged_min: dict = dataclasses.field(default_factory=lambda: {"h2d": MIB, "d2h": MIB})
    locked_gain_min: int = 256 * KIB
    source: str = "default"
    sweep: list = dataclasses.field(default_factory=list)
    fixed: tuple = ()

    def apply(self, ctx) -> None:
        """Configure ``ctx``'s staging ring with this plan."""
        _core.staging_config(ctx, self.chunk, self.depth, self.threads,
                             write_kind=self.write_kind, read_kind=self.read_kind)

    def as_dict(self) -> dict:
        return {"chunk": self.chunk, "depth": self.depth, "threads": self.threads,
                "write_kind": self.write_kind, "read_kind": self.read_kind,
                "staged_min": dict(self.staged_min), "locked_gain_min": self.locked_gain_min,
                "source": self.source}


def parse_plan_env(text: str | None, plan: StagingPlan) -> StagingPlan:
    """Apply ``$GDRPY_STAGING``-style overrides to ``plan`` (ValueError names the
    bad item)."""
    if not text:
        return plan
    fixed = list(plan.fixed)
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, val = item.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"GDRPY_STAGING: {item!r} is not key=value")
        if key in ("chunk", "staged_min", "staged_min_h2d", "staged_min_d2h",
                   "locked_gain_min"):
            n = parse_threshold(val, f"GDRPY_STAGING {key}")
            if n is None:
                continue
            n = NEVER if n < 0 or n > 1 << 40 else n
            if key == "chunk":
                plan.chunk = n
            elif key == "locked_gain_min":
                plan.locked_gain_min = n
            else:
                dirs = ("h2d", "d2h") if key == "staged_min" else (key[-3:],)
                for d in dirs:
                    plan.staged_min[d] = n
        elif key in ("write_kind", "read_kind"):
            if val.strip() not in KINDS:
                raise ValueError(f"GDRPY_STAGING: {key}={val!r} is not one of {KINDS}")
            setattr(plan, key, val.strip())
        elif key in ("depth", "threads"):
            try:
                v = int(val)
            except ValueError:
                raise ValueError(f"GDRPY_STAGING: {key}={val!r} is not an integer") from None
            setattr(plan, key, v)
        else:
            raise ValueError(f"GDRPY_STAGING: unknown key {key!r} (chunk, depth, threads, "
                             "write_kind, read_kind, staged_min, staged_min_h2d, "
                             "staged_min_d2h, locked_gain_min)")
        fixed.append(key)
    plan.fixed = tuple(fixed)
    return plan


def _cache_file(identity: dict):
    d = cache_dir()
    if d is None:
        return None
    return d / f"staging-{identity_key(identity)}.json"


def load_plan(identity: dict) -> StagingPlan | None:
    """The cached plan for ``identity``, or None (missing, corrupt, other identity)."""
    path = _cache_file(identity)
    if path is None:
        return None
    try:
        if path.stat().st_size > 1 << 20:
            return None
        doc = json.loads(path.read_text())
        if doc.get("kind") != "gdrpy-staging-plan" or doc.get("schema") != SCHEMA or \
                doc.get("identity") != identity:
            return None
        p = doc["plan"]
        plan = StagingPlan(chunk=int(p["chunk"]), depth=int(p["depth"]),
                           threads=int(p["threads"]),
                           staged_min={"h2d": int(p["staged_min"]["h2d"]),
                                       "d2h": int(p["staged_min"]["d2h"])},
                           locked_gain_min=int(p["locked_gain_min"]), source="cache",
                           write_kind=str(p["write_kind"]), read_kind=str(p["read_kind"]),
                           sweep=list(doc.get("sweep", [])))
        if not (64 * KIB <= plan.chunk <= 64 * MIB and 2 <= plan.depth <= MAX_DEPTH and
                plan.chunk * plan.depth <= MAX_RING and
                1 <= plan.threads <= 16 and all(v >= 0 for v in plan.staged_min.values()) and
                plan.write_kind in KINDS and plan.read_kind in KINDS):
            return None
        return plan
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def save_plan(identity: dict, plan: StagingPlan) -> bool:
    path = _cache_file(identity)
    if path is None:
        return False
    doc = {"kind": "gdrpy-staging-plan", "schema": SCHEMA, "identity": identity,
           "created": time.time(), "plan": plan.as_dict(), "sweep": plan.sweep}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, path)
        return True
    except OSError:
        return False


def default_plan(ctx) -> StagingPlan:
    """The shared plan of ``ctx``'s (device, backend), applied to ``ctx``."""
    key = (ctx.device, ctx.backend)
    with _plans_lock:
        plan = _plans.get(key)
        if plan is None:
            ident = host_identity(ctx)
            env = os.environ.get("GDRPY_STAGING")
            plan = load_plan(ident)
            if plan is None:
                plan = StagingPlan()
                auto = os.environ.get("GDRPY_AUTOCALIBRATE", "1") != "0"
                if auto and not ctx.is_sim:
                    try:
                        plan = calibrate_plan(ctx, budget_s=5.0)
                        save_plan(ident, plan)
                    except Exception as e:  # keep the defaults, say why
                        plan = StagingPlan(source=f"default (calibration failed: {e})")
            plan = parse_plan_env(env, plan)
            _plans[key] = plan
    plan.apply(ctx)
    return plan


def set_plan(ctx, plan: StagingPlan) -> None:
    """Install ``plan`` as the shared plan of ctx's (device, backend)."""
    with _plans_lock:
        _plans[(ctx.device, ctx.backend)] = plan
    plan.apply(ctx)


# ---------------------------------------------------------------------------
# Calibration

def _timer(op: Callable[[], Any], reps: int) -> float:
    """Median seconds of ``reps`` calls (after one warm-up)."""
    op()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        op()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _ce(pin: Any, direction: str, host: Any, method: str) -> None:
    if direction == "h2d":
        pin.ce_write(0, host, method=method)
    else:
        pin.ce_read(0, len(host), host, method=method)


def ring_sizes(max_bytes: int) -> tuple[int, ...]:
    """The message sizes the ring parameters are scored at: 4, 16 and 64 MiB
    (the sizes staging is for), fewer/smaller when ``max_bytes`` is smaller."""
    sizes = tuple(n for n in (4 * MIB, 16 * MIB, 64 * MIB) if n <= max_bytes)
    return sizes or (max(64 * KIB, max_bytes // 16), max_bytes // 4 or 1, max_bytes)


def pick_staged_min(points: list[tuple[int, float, float]]) -> int:
    """The smallest staged size from (nbytes, direct_s, staged_s) points.

    Chooses the threshold t (a measured size, or NEVER) that minimises the
    summed relative time sum(time_of_chosen_path / best_time) over all points,
    with direct below t and staged from t up: one noisy point costs at most
    its own ratio and cannot switch staging off for a whole range of sizes."""
    pts = sorted(points)
    best_t, best_cost = NEVER, None
    for i in range(len(pts) + 1):
        cost = 0.0
        for j, (_, d, s_) in enumerate(pts):
            t = d if j < i else s_
            cost += t / max(min(d, s_), 1e-12)
        if best_cost is None or cost < best_cost - 1e-9:
            best_cost = cost
            best_t = pts[i][0] if i < len(pts) else NEVER
    return best_t


def _pinned_rates(ctx, pin: Any, sizes: tuple[int, ...]) -> dict:
    """Bytes/s of the copy engines from a page-locked gdrpy host buffer per
    (direction, size), or {} when no page-locked buffer can be had."""
    from . import memory
    try:
        hb = memory.host_alloc(max(sizes), ctx=ctx)
    except Exception:
        return {}
    try:
        locked = hb.numpy()
        locked[:] = 1
        out = {}
        for n in sizes:
            for d in ("h2d", "d2h"):
                out[(d, n)] = n / _timer(functools.partial(_ce, pin, d, locked[:n], "locked"), 3)
        return out
    finally:
        locked = None
        hb.close()


def calibrate_plan(ctx, budget_s: float = 3.0, max_bytes: int = 64 * MIB,
                   progress: Callable[[str], None] | None = None) -> StagingPlan:
    """Measure the staging ring on ``ctx`` and return a plan.

    1. The ring (kinds, slot size, depth, threads) from the fixed candidate
       list of :mod:`gdrpy.staging_pick`, timed in interleaved rounds at 4, 16
       and 64 MiB (:func:`ring_sizes`), both directions, median of 5 calls
       each; a candidate's score is its lowest cell (each cell's median over
       the rounds), as a fraction of the pinned copy-engine rate at that size
       and direction
       (a page-locked gdrpy host buffer, timed first).  From the second
       round on only the better half (at least two) is timed again, until 60% of
       ``budget_s`` is spent or 5 rounds are done; ties (within 2%) go to the
       earlier candidate.
    2. ``staged_min`` per direction: direct and staged copies, interleaved,
       at 64 KiB .. ``max_bytes`` (powers of two), and the threshold that
       minimises the summed relative time (:func:`pick_staged_min`).
    """
    import numpy as np

    from . import memory
    from . import staging_pick as sp
    t_start = time.perf_counter()
    deadline = t_start + 0.6 * budget_s     # ring search; the staged_min sweep gets the rest
    buf = memory.alloc(max_bytes, ctx=ctx)
    pin = ctx.pin(buf)
    host = np.ones(max_bytes, np.uint8)   # touched: pages are present
    plan = StagingPlan(source="calibration")
    sweep: list = []
    say = progress or (lambda msg: None)
    sizes = ring_sizes(max_bytes)
    try:
        ref = _pinned_rates(ctx, pin, sizes)

        def cells() -> dict:
            out = {}
            for n in sizes:
                src = host[:n]
                for d in ("h2d", "d2h"):
                    t = _timer(functools.partial(_ce, pin, d, src, "staged"), 5)
                    rate = n / t
                    out[(d, n)] = rate / ref[(d, n)] if ref else rate
            return out

        ncpu = os.cpu_count() or 1
        tmax = max(1, min(16, ncpu - 2))      # leave the caller's core and one more
        order = sp.candidates(tmax, max(max_bytes, MIB))
        results: dict = {}
        live = list(order)
        for rnd in range(5):
            for cand in (live if rnd % 2 == 0 else live[::-1]):
                if rnd and time.perf_counter() > deadline:
                    break
                w, r, c, dp, th = cand
                _core.staging_config(ctx, c, dp, th, write_kind=w, read_kind=r)
                got = cells()
                results.setdefault(cand, []).append(got)
                low = min(got.values())
                sweep.append({"round": rnd, "write_kind": w, "read_kind": r, "chunk": c,
                              "depth": dp, "threads": th, "worst": low,
                              "gbps": min(v * ref.get(k, 1.0) for k, v in got.items()) / 1e9})
                say(f"round {rnd} {w}/{r} chunk {c >> 10} KiB depth {dp} threads {th}: "
                    f"worst {low:.3f}")
            if time.perf_counter() > deadline:
                break
            if rnd >= 1:    # every candidate gets two rounds: one stalled round prunes none
                live = sp.survivors({c: results[c] for c in live if c in results}, live,
                                    max(2, len(live) // 2))
        best = sp.rank({c: results[c] for c in live if c in results}, order)[0]
        plan.write_kind, plan.read_kind, plan.chunk, plan.depth, plan.threads = best
        plan.apply(ctx)

        for d in ("h2d", "d2h"):
            n = 64 * KIB
            points = []
            end = t_start + budget_s * (0.8 if d == "h2d" else 1.0)
            while n <= max_bytes and time.perf_counter() < end:
                src = host[:n]
                ops = (functools.partial(_ce, pin, d, src, "direct"),
                       functools.partial(_ce, pin, d, src, "staged"))
                reps = 7 if n <= 4 * MIB else 3
                td, ts = [], []
                for _ in range(reps):     # interleaved
                    td.append(_timer(ops[0], 1))
                    ts.append(_timer(ops[1], 1))
                dmed, smed = statistics.median(td), statistics.median(ts)
                points.append((n, dmed, smed))
                sweep.append({"direction": d, "nbytes": n, "direct_s": dmed, "staged_s": smed})
                n *= 2
            plan.staged_min[d] = pick_staged_min(points) if points else NEVER
        plan.sweep = sweep
        return plan
    finally:
        pin.close()
        buf.close()
        plan.apply(ctx)
