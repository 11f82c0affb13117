"""Calibration: measure both paths over a size sweep and pick each direction's
crossover threshold (sweep, then bisection), within a time budget."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .values import (
    DEFAULT_THRESHOLDS,
    DIRECTIONS,
    MAX_THRESHOLD,
    PATHS,
    _as_int,
    _as_real,
    _check_direction,
    format_threshold,
    log,
)

# ---------------------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------------------

def default_sizes() -> list[int]:
    """Default sweep: powers of two 1 B .. 64 MiB plus 1.5x points 768 B .. 768 KiB."""
    sizes = {1 << k for k in range(27)}
    sizes |= {3 << k for k in range(8, 19)}      # 768 B .. 768 KiB
    return sorted(sizes)


@dataclasses.dataclass(frozen=True)
class SizeMeasurement:
    """Both paths measured at one size: medians of per-round medians, seconds per op."""
    nbytes: int
    mapping_s: float
    ce_s: float
    rounds: int
    iters_mapping: int
    iters_ce: int

    @property
    def ce_faster(self) -> bool:
        return self.ce_s < self.mapping_s

    def as_row(self) -> list:
        return [self.nbytes, self.mapping_s, self.ce_s]


@dataclasses.dataclass
class DirectionResult:
    direction: str
    threshold: int
    sweep: list[SizeMeasurement]
    refinement: list[SizeMeasurement]
    #: (mapping-side size, ce-side size) around the crossover after refinement, or None
    #: when one path won at every measured size.
    bracket: tuple[int, int] | None
    early_stopped: bool
    truncated: bool


@dataclasses.dataclass
class CalibrationResult:
    thresholds: dict[str, int]
    directions: dict[str, DirectionResult]
    started: float          # Unix time
    duration_s: float
    budget_s: float
    truncated: bool         # the budget ran out before the planned work was done
    notes: list[str]


MeasureFn = Callable[[str, str, int, int], Sequence[float]]
ProgressFn = Callable[[float, str], Any]


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    h = n // 2
    return s[h] if n % 2 else 0.5 * (s[h - 1] + s[h])


class _OutOfTime(Exception):
    pass


class _MeasureFailed(Exception):
    """Wraps an exception raised by a measure callback (load_or_calibrate only)."""


class MeasureResultError(TypeError, ValueError):
    """A measure callback returned something other than a list of seconds per op."""


class _Calibrator:
    def __init__(self, measure: MeasureFn, *, repeats: int, max_iters: int,
                 max_sample_s: float, clock: Callable[[], float],
                 progress: ProgressFn | None) -> None:
        self.measure = measure
        self.repeats = repeats
        self.max_iters = max_iters
        self.max_sample_s = max_sample_s
        self.clock = clock
        self.progress = progress
        self.done = 0
        self.total = 1
        self.last_fraction = 0.0
        # (direction, path) -> (nbytes, wall seconds per iteration) of the last call
        self.wall: dict[tuple[str, str], tuple[int, float]] = {}

    def report(self, message: str) -> None:
        if self.progress is None:
            return
        frac = min(1.0, max(self.last_fraction, self.done / self.total))
        self.last_fraction = frac
        try:
            self.progress(frac, message)
        except Exception:   # a broken progress bar must not lose the calibration
            log.warning("threshold calibration: progress callback failed; disabling it",
                        exc_info=True)
            self.progress = None

    def predicted(self, direction: str, path: str, nbytes: int, iters: int) -> float:
        last = self.wall.get((direction, path))
        if last is None:
            return 0.0
        n0, per_iter = last
        return per_iter * iters * max(1.0, nbytes / max(n0, 1))

    def call(self, direction: str, path: str, nbytes: int, iters: int,
             deadline: float) -> tuple[float, float]:
        """One measure() call: (median seconds per op, wall seconds). Raises _OutOfTime."""
        if self.clock() + self.predicted(direction, path, nbytes, iters) > deadline:
            raise _OutOfTime
        t0 = self.clock()
        raw = self.measure(direction, path, nbytes, iters)
        wall = self.clock() - t0
        try:
            vals = [float(x) for x in raw]
        except (TypeError, ValueError):
            raise MeasureResultError(
                f"measure({direction!r}, {path!r}, {nbytes}, {iters}) must return a sequence "
                f"of seconds per op, got {raw!r:.200}") from None
        if not vals or any(not math.isfinite(v) or v < 0 for v in vals):
            raise MeasureResultError(
                f"measure({direction!r}, {path!r}, {nbytes}, {iters}) returned invalid "
                f"timings {vals[:8]!r}: need a non-empty list of finite seconds >= 0")
        med = _median(vals)
        # Wall time per iteration, call overhead amortised at this iteration count.
        self.wall[(direction, path)] = (nbytes, max(wall, 1e-9) / iters)
        return med, wall

    @staticmethod
    def unstable(meds: dict[str, list[float]]) -> bool:
        """Whether the round medians disagree so much that more rounds are needed: the
        paths' order is not the same in most rounds, or a path's rounds spread > 1.5x
        (interference bursts can spoil several rounds in a row)."""
        m, c = meds["mapping"], meds["ce"]
        wins = sum(a < b for a, b in zip(m, c, strict=False))
        if min(wins, len(m) - wins) * 4 > len(m):
            return True
        return any(min(v) <= 0 or max(v) > 1.5 * min(v) for v in (m, c) if v)

    def point(self, direction: str, nbytes: int, target_s: float,
              deadline: float) -> SizeMeasurement | None:
        """Measure both paths at one size (warm-up discarded, interleaved rounds)."""
        est: dict[str, float] = {}
        try:
            for path in PATHS:
                # Warm-up, discarded. Like timeit's autorange it grows the iteration
                # count until a call takes a fair share of the per-sample target, so
                # the per-iteration cost used to size the real samples has the call
                # overhead amortised as it will be.
                prev = self.wall.get((direction, path))
                it = 1 if prev is None else int(max(1, min(self.max_iters,
                                                           target_s / 4 / prev[1])))
                for k in range(4):
                    try:
                        _, wall = self.call(direction, path, nbytes, it, deadline)
                    except _OutOfTime:
                        if k == 0:
                            raise
                        break               # keep the estimate we have
                    if wall >= target_s / 4 or it >= self.max_iters:
                        break
                    it = int(min(self.max_iters,
                                 max(2 * it, it * target_s / 2 / max(wall, 1e-9))))
                est[path] = self.wall[(direction, path)][1]
        except _OutOfTime:
            return None
        iters = {p: int(max(1, min(self.max_iters, target_s / max(est[p], 1e-12))))
                 for p in PATHS}
        meds: dict[str, list[float]] = {p: [] for p in PATHS}
        # Rounds alternate the paths' order (AB BA AB BA ...). An even number of rounds
        # makes the two paths' sample times symmetric, so a linear drift cancels in the
        # medians exactly; extra rounds for unstable results come in pairs too.
        base = self.repeats + self.repeats % 2 if self.repeats > 1 else 1
        try:
            r = 0
            while r < 2 * base:
                if r >= base and (r - base) % 2 == 0 and not self.unstable(meds):
                    break
                for path in (PATHS if r % 2 == 0 else PATHS[::-1]):  # cancel drift
                    meds[path].append(
                        self.call(direction, path, nbytes, iters[path], deadline)[0])
                r += 1
        except _OutOfTime:
            pass
        rounds = min(len(meds["mapping"]), len(meds["ce"]))
        if rounds == 0:
            return None
        return SizeMeasurement(nbytes, _median(meds["mapping"]), _median(meds["ce"]),
                               rounds, iters["mapping"], iters["ce"])


def calibrate(measure: MeasureFn, sizes: Iterable[int] | None = None,
              directions: Iterable[str] = DIRECTIONS, repeats: int = 5,
              budget_s: float = 6.0, *, progress: ProgressFn | None = None,
              refine: bool = True, refine_steps: int = 5, refine_tol: float = 0.03,
              verify: int = 2,
              early_stop: int = 3, early_stop_ratio: float = 1.5,
              max_iters: int = 10_000, max_sample_s: float = 2e-3,
              clock: Callable[[], float] = time.perf_counter) -> CalibrationResult:
    """Measure both paths and pick each direction's crossover threshold.

    ``measure(direction, path, nbytes, iters)`` performs ``iters`` transfers of
    ``nbytes`` in ``direction`` over ``path`` ("mapping" or "ce") and returns a non-empty
    sequence of seconds per transfer (one per transfer, or per-batch averages). It must
    measure a complete transfer (for "h2d" over the mapping: stores plus a fence; the
    engine decides whether a read-back is part of a put).

    Per direction: sweep ``sizes`` upwards. At each size, one discarded warm-up call per
    path, then ``repeats`` interleaved rounds (path order alternating each round), with
    ``iters`` adapted so that one sample takes about ``max_sample_s`` (or less when the
    budget is tight); each path's cost is the median of its round medians. When the
    rounds disagree (paths' order flips in over a quarter of them, or one path's round
    medians spread beyond 1.5x) up to ``repeats`` more rounds are taken. The threshold
    is the last swept size before the run of sizes, reaching to the end of the sweep, at
    which the copy engine was faster (sizes up to it go to "mapping"). The sweep stops
    early (``early_stop``) once the copy engine has been faster by ``early_stop_ratio``
    at that many consecutive sizes. Then
    the bracket is bisected geometrically (``refine_steps`` at most, until the bracket is
    narrower than ``refine_tol``) with fresh measurements, after re-measuring up to
    ``verify`` bracket ends (majority of the sweep's and up to two new measurements; an
    end that does not confirm moves the bracket one sweep point, so one noisy sweep
    point cannot shift the result by a whole step).

    ``budget_s`` bounds the wall time (by ``clock``): a call predicted to overrun is not
    made and the result is marked ``truncated``; thresholds then come from what was
    measured (the default threshold when a direction got no measurement at all).
    ``progress(fraction, message)`` is called after each size with a non-decreasing
    fraction in [0, 1]. Exceptions from ``measure`` propagate.

    ``repeats`` > 1 is rounded up to an even number (paths alternate AB, BA, ... so that
    linear drift cancels).
    """
    if not callable(measure):
        raise TypeError(f"measure must be callable, got {type(measure).__name__} {measure!r}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable or None, got {progress!r}")
    if isinstance(directions, str):
        raise TypeError(f"directions must be a sequence of direction names, got {directions!r}")
    dirs = [_check_direction(d) for d in directions]
    if not dirs:
        raise ValueError("directions must name at least one direction")
    if len(set(dirs)) != len(dirs):
        raise ValueError(f"directions has duplicates: {dirs!r}")
    if sizes is None:
        size_list = default_sizes()
    else:
        if isinstance(sizes, (str, bytes)):
            raise TypeError(f"sizes must be an iterable of ints, got {sizes!r}")
        size_list = sorted({_as_int(s, "sizes[]") for s in sizes})
        if not size_list:
            raise ValueError("sizes must not be empty")
        if size_list[0] < 1 or size_list[-1] > MAX_THRESHOLD:
            raise ValueError(f"sizes must lie in 1..{MAX_THRESHOLD}, got {size_list[0]} "
                             f"..{size_list[-1]}")
    repeats = _as_int(repeats, "repeats")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    budget_s = _as_real(budget_s, "budget_s")
    if not (budget_s > 0 and math.isfinite(budget_s)):
        raise ValueError(f"budget_s must be a positive finite number of seconds, got {budget_s!r}")
    refine_steps = _as_int(refine_steps, "refine_steps")
    if refine_steps < 0:
        raise ValueError(f"refine_steps must be >= 0, got {refine_steps}")
    verify = _as_int(verify, "verify")
    if verify < 0:
        raise ValueError(f"verify must be >= 0, got {verify}")
    refine_tol = _as_real(refine_tol, "refine_tol")
    if not refine_tol > 0:
        raise ValueError(f"refine_tol must be > 0, got {refine_tol!r}")
    early_stop = _as_int(early_stop, "early_stop")
    if early_stop < 0:
        raise ValueError(f"early_stop must be >= 0 (0 disables), got {early_stop}")
    early_stop_ratio = _as_real(early_stop_ratio, "early_stop_ratio")
    if not early_stop_ratio >= 1:
        raise ValueError(f"early_stop_ratio must be >= 1, got {early_stop_ratio!r}")
    max_iters = _as_int(max_iters, "max_iters")
    if max_iters < 1:
        raise ValueError(f"max_iters must be >= 1, got {max_iters}")
    max_sample_s = _as_real(max_sample_s, "max_sample_s")
    if not max_sample_s > 0:
        raise ValueError(f"max_sample_s must be > 0, got {max_sample_s!r}")

    cal = _Calibrator(measure, repeats=repeats, max_iters=max_iters,
                      max_sample_s=max_sample_s, clock=clock, progress=progress)
    n_refine = refine_steps if refine else 0
    n_verify = verify if refine else 0
    cal.total = len(dirs) * (len(size_list) + n_verify + n_refine)
    started_unix = time.time()
    t_start = clock()
    deadline_all = t_start + budget_s
    results: dict[str, DirectionResult] = {}
    notes: list[str] = []
    truncated_any = False
    cal.report("starting")

    for i, d in enumerate(dirs):
        now = clock()
        share = max(0.0, deadline_all - now) / (len(dirs) - i)
        dir_deadline = now + share
        sweep_deadline = now + share * (0.75 if n_refine else 1.0)
        # Per-sample time target: a third of an even split of the sweep budget.
        target_s = min(max_sample_s,
                       share * 0.75 / (len(size_list) * 2 * (repeats + 1)) / 3)
        sweep: list[SizeMeasurement] = []
        early = truncated = False
        streak = 0
        base = cal.done
        for k, n in enumerate(size_list):
            pt = cal.point(d, n, target_s, sweep_deadline)
            if pt is None:
                truncated = True
                notes.append(f"{d}: budget ran out in the sweep at {n} B")
                break
            sweep.append(pt)
            cal.done = base + k + 1
            cal.report(f"{d} {n} B: mapping {pt.mapping_s * 1e6:.3g} us, "
                       f"ce {pt.ce_s * 1e6:.3g} us")
            streak = streak + 1 if pt.mapping_s >= early_stop_ratio * pt.ce_s else 0
            if early_stop and streak >= early_stop and k + 1 < len(size_list):
                early = True
                notes.append(f"{d}: sweep stopped after {n} B (copy engine faster by "
                             f">= {early_stop_ratio}x at {early_stop} sizes in a row)")
                break
        cal.done = base + len(size_list)
        cal.report(f"{d}: sweep done")

        refinement: list[SizeMeasurement] = []
        bracket: tuple[int, int] | None = None
        if not sweep:
            thr = DEFAULT_THRESHOLDS[d]
            notes.append(f"{d}: nothing measured; keeping the default {thr} B")
        else:
            j = len(sweep)
            for idx in range(len(sweep) - 1, -1, -1):
                if sweep[idx].ce_faster:
                    j = idx
                else:
                    break
            if j == len(sweep):
                thr = sweep[-1].nbytes          # mapping won at every size measured
            else:
                # Re-measure the bracket's ends: one noisy sweep point next to the
                # crossover must not shift the bracket a whole sweep step. A side that
                # does not confirm moves the bracket one sweep point that way.
                lo_i, hi_i = j - 1, j
                checked: set[int] = set()
                for _ in range(n_verify):
                    if lo_i >= 0 and lo_i not in checked:
                        k, want_ce = lo_i, False
                    elif hi_i + 1 < len(sweep) and hi_i not in checked:
                        k, want_ce = hi_i, True
                    else:
                        break
                    checked.add(k)
                    # Re-measure; on disagreement a third measurement breaks the tie.
                    votes = [sweep[k].ce_faster]
                    while len(votes) < 3 and not (len(votes) == 2 and votes[0] == votes[1]):
                        pt = cal.point(d, sweep[k].nbytes, target_s, dir_deadline)
                        if pt is None:
                            break
                        refinement.append(pt)
                        votes.append(pt.ce_faster)
                    if len(votes) == 1 or (len(votes) == 2 and votes[0] != votes[1]):
                        truncated = True
                        notes.append(f"{d}: budget ran out verifying {sweep[k].nbytes} B")
                        break
                    cal.done += 1
                    cal.report(f"{d} verify {sweep[k].nbytes} B")
                    if (sum(votes) * 2 > len(votes)) != want_ce:
                        notes.append(f"{d}: {sweep[k].nbytes} B did not confirm on "
                                     f"re-measurement; bracket moved")
                        lo_i, hi_i = (lo_i - 1, hi_i - 1) if want_ce is False else (
                            lo_i + 1, hi_i + 1)
                lo = sweep[lo_i].nbytes if lo_i >= 0 else 0
                hi = sweep[hi_i].nbytes
                steps = 0
                while (n_refine and steps < n_refine and hi - lo > 1
                       and (lo == 0 or hi > lo * (1 + refine_tol))):
                    mid = math.isqrt(lo * hi) if lo > 0 else hi // 2
                    mid = min(max(mid, lo + 1), hi - 1)
                    pt = cal.point(d, mid, target_s, dir_deadline)
                    if pt is None:
                        truncated = True
                        notes.append(f"{d}: budget ran out while refining at {mid} B")
                        break
                    refinement.append(pt)
                    steps += 1
                    cal.done += 1
                    cal.report(f"{d} refine {mid} B")
                    if pt.ce_faster:
                        hi = mid
                    else:
                        lo = mid
                thr = lo
                bracket = (lo, hi)
        cal.done = base + len(size_list) + n_verify + n_refine
        truncated_any = truncated_any or truncated
        results[d] = DirectionResult(d, thr, sweep, refinement, bracket, early, truncated)
        log.info("threshold calibration %s: %s (%d sizes, %d refinement points%s)",
                 d, format_threshold(thr), len(sweep), len(refinement),
                 ", truncated by budget" if truncated else "")

    duration = clock() - t_start
    cal.done = cal.total
    cal.report("done")
    return CalibrationResult({d: r.threshold for d, r in results.items()}, results,
                             started_unix, duration, budget_s, truncated_any, notes)

