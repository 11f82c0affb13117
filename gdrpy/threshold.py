"""Adaptive threshold picker: which path a host<->GPU message takes.

Contract
--------
For each direction (``"h2d"`` = put, host -> GPU; ``"d2h"`` = get, GPU -> host) the
picker holds one integer threshold ``T`` in bytes: a message of ``nbytes <= T`` goes
through the BAR1 mapping (CPU stores/loads, ``"mapping"``), a larger one through the
GPU's copy engines (cuMemcpy, ``"ce"``).

* :meth:`ThresholdPicker.choose` is the hot path: one dict lookup and one int
  comparison, no lock, no allocation. Thresholds are replaced (never mutated in place)
  under a lock, so a reader sees either the old or the new value.
* :func:`calibrate` measures both paths through a ``measure`` callback supplied by the
  transfer engine and picks the crossover from the measurements (sweep, then bisection).
* Results persist per host identity in a JSON file in the user's cache directory
  (``$GDRPY_CACHE_DIR``, else ``$XDG_CACHE_HOME/gdrpy``, else ``~/.cache/gdrpy``),
  written atomically under a file lock. A cache that is missing, corrupt, of another
  schema or another identity, or holds absurd values is never an error: it is reported
  (``picker.reason``, logger ``gdrpy.threshold``) and the caller recalibrates.
* Online adaptation: the engine asks :meth:`ThresholdPicker.advise` (or
  :meth:`~ThresholdPicker.should_probe`) which path to take and whether to time the
  transfer, then reports timings with :meth:`~ThresholdPicker.record`. Per size bucket
  near ``T`` the picker gathers both paths' timings in rounds of disjoint samples and
  moves ``T`` only when consecutive rounds agree that the other path is faster by more
  than the hysteresis margin, with statistical confidence (median/MAD of log-times).
* Overrides (constructor arguments, then ``$GDRPY_THRESHOLD_H2D`` /
  ``$GDRPY_THRESHOLD_D2H``) fix a direction's threshold and disable its adaptation.

Thread safety: every method may be called from any thread. ``choose``, ``advise`` and
``should_probe`` take no lock (their probe counters may lose an increment under
contention, which only perturbs the probe rate). ``record``, calibration results,
loading and saving update state under ``self._lock``; calibrations in one process are
serialised, and across processes by the cache file lock.

The default thresholds (:data:`DEFAULT_THRESHOLDS`) are provisional, derived from the
H100 measurements in facts/nvrm-bar1.md; calibrate on the target machine.

This module imports nothing from the rest of gdrpy and needs only the standard library.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import math
import operator
import os
import pathlib
import random
import re
import sys
import tempfile
import threading
import time
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

__all__ = [
    "ALWAYS_CE",
    "ALWAYS_MAPPING",
    "CE",
    "DEFAULT_THRESHOLDS",
    "DIRECTIONS",
    "MAPPING",
    "MAX_THRESHOLD",
    "PATHS",
    "SCHEMA_VERSION",
    "TIMED",
    "CalibrationResult",
    "DirectionResult",
    "MeasureResultError",
    "SizeMeasurement",
    "ThresholdPicker",
    "cache_dir",
    "calibrate",
    "default_sizes",
    "format_threshold",
    "identity_key",
    "parse_threshold",
]

log = logging.getLogger("gdrpy.threshold")

DIRECTIONS: tuple[str, ...] = ("h2d", "d2h")
PATHS: tuple[str, ...] = ("mapping", "ce")

#: Threshold value meaning "every size goes through the mapping".
ALWAYS_MAPPING: int = sys.maxsize
#: Threshold value meaning "every size goes through the copy engine".
ALWAYS_CE: int = -1
#: Largest finite threshold accepted from arguments, environment or cache (1 TiB).
MAX_THRESHOLD: int = 1 << 40

#: Provisional thresholds used before any calibration (bytes).
#:
#: h2d 64 KiB: on the H100 of facts/nvrm-bar1.md a BAR1 store stream runs at 16-19 GB/s
#: (64 KiB ~ 3.6 us) while a synchronous cuMemcpyHtoD costs ~7 us + size/38 GB/s (~8.7 us
#: at 64 KiB, ~11.5 us from Python); the crossover there is ~200-250 KiB. 64 KiB keeps the
#: mapping a clear (>2x) win even on hosts with half that write bandwidth.
#: d2h 2 KiB: BAR1 reads cost ~1 us + size/0.8 GB/s with streaming loads (2 KiB ~ 3.5 us)
#: against ~7.3 us for cuMemcpyDtoH; the crossover is ~4-5 KiB with streaming loads and
#: far lower (~0.4 KiB) with plain loads, so 2 KiB is the safe side.
DEFAULT_THRESHOLDS: Mapping[str, int] = {"h2d": 64 * 1024, "d2h": 2 * 1024}

SCHEMA_VERSION = 1
_CACHE_KIND = "gdrpy-threshold-cache"
_MAX_CACHE_BYTES = 1 << 20

ENV_THRESHOLD = {"h2d": "GDRPY_THRESHOLD_H2D", "d2h": "GDRPY_THRESHOLD_D2H"}
ENV_CACHE_DIR = "GDRPY_CACHE_DIR"

#: ``advise()`` flag: take the mapping (else the copy engine).
MAPPING = 1
#: ``advise()`` flag: time this transfer and ``record()`` it.
TIMED = 2
#: ``advise()`` result for an untimed copy-engine transfer (no flag set).
CE = 0

SOURCES = ("default", "cache", "calibration", "override", "adapted")

_WORDS = {
    "mapping": ALWAYS_MAPPING,
    "always-mapping": ALWAYS_MAPPING,
    "ce": ALWAYS_CE,
    "always-ce": ALWAYS_CE,
}
_AUTO_WORDS = ("", "auto")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_SIZE_RE = re.compile(r"^(\d+)\s*(?:([kmg])(?:ib|b)?|b)?$", re.IGNORECASE)


# ---------------------------------------------------------------------------------------
# Parsing and validation helpers
# ---------------------------------------------------------------------------------------

def _check_direction(direction: object) -> str:
    if direction in DIRECTIONS:
        return direction  # type: ignore[return-value]
    raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


def _check_path(path: object) -> str:
    if path in PATHS:
        return path  # type: ignore[return-value]
    raise ValueError(f"path must be one of {PATHS}, got {path!r}")


def _as_int(value: object, name: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got bool {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{name} must be an integer, got {type(value).__name__} {value!r}") from None


def _as_real(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(
            value, "__float__"):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TypeError(
            f"{name} must be a real number, got {type(value).__name__} {value!r}") from None


def parse_threshold(value: object, name: str = "threshold") -> int | None:
    """Parse a threshold given as an argument or an environment value.

    Accepts ``None``, ``""`` or ``"auto"`` (no override: returns ``None``); a
    non-negative int up to :data:`MAX_THRESHOLD`; a string holding such an int with an
    optional binary suffix ``K``/``KB``/``KiB``, ``M``/``MB``/``MiB``, ``G``/``GB``/``GiB``
    (all powers of 1024, case-insensitive) or ``B``; or the words ``"mapping"`` /
    ``"always-mapping"`` (returns :data:`ALWAYS_MAPPING`) and ``"ce"`` / ``"always-ce"``
    (returns :data:`ALWAYS_CE`). Raises TypeError / ValueError naming ``name`` and the
    bad value otherwise.
    """
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower().replace("_", "-")
        if text in _AUTO_WORDS:
            return None
        if text in _WORDS:
            return _WORDS[text]
        m = _SIZE_RE.match(text)
        if not m:
            raise ValueError(
                f"{name}: cannot parse {value!r}; expected a byte count such as 4096, 64K, "
                f"64KiB, 1M, or one of 'mapping', 'ce', 'always-mapping', 'always-ce', 'auto'")
        n = int(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    else:
        n = _as_int(value, name)
    if n < 0:
        raise ValueError(f"{name}: threshold must be >= 0 bytes, got {value!r}")
    if n > MAX_THRESHOLD:
        raise ValueError(
            f"{name}: threshold {value!r} exceeds {MAX_THRESHOLD} bytes (1 TiB); "
            f"use 'always-mapping' to send every size through the mapping")
    return n


def format_threshold(t: int) -> str:
    """Human-readable form of a threshold value (``"always-ce"``, ``"64 KiB"``...)."""
    if t == ALWAYS_MAPPING:
        return "always-mapping"
    if t == ALWAYS_CE:
        return "always-ce"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if t >= size and t % size == 0:
            return f"{t // size} {unit}"
    return f"{t} B"


_JSON_SCALARS = (str, int, float, bool, type(None))


def _check_identity(identity: object) -> dict[str, Any]:
    if not isinstance(identity, Mapping):
        raise TypeError(f"identity must be a dict, got {type(identity).__name__} {identity!r}")
    out: dict[str, Any] = {}
    for k, v in identity.items():
        if not isinstance(k, str):
            raise TypeError(f"identity keys must be str, got {type(k).__name__} {k!r}")
        if not isinstance(v, _JSON_SCALARS):
            raise TypeError(
                f"identity[{k!r}] must be str, int, float, bool or None, "
                f"got {type(v).__name__} {v!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"identity[{k!r}] must be finite, got {v!r}")
        out[k] = v
    return out


def identity_key(identity: Mapping[str, Any]) -> str:
    """Stable short hash of a host identity dict (keys sorted, canonical JSON)."""
    ident = _check_identity(identity)
    blob = json.dumps(ident, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def cache_dir(env: Mapping[str, str] | None = None) -> pathlib.Path | None:
    """The directory holding threshold caches, or None if no home can be found.

    ``$GDRPY_CACHE_DIR`` if set and non-empty, else ``$XDG_CACHE_HOME/gdrpy`` if that is
    an absolute path (per the XDG spec), else ``~/.cache/gdrpy``.
    """
    env = os.environ if env is None else env
    d = env.get(ENV_CACHE_DIR, "")
    if d:
        return pathlib.Path(d).expanduser()
    xdg = env.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return pathlib.Path(xdg) / "gdrpy"
    try:
        return pathlib.Path.home() / ".cache" / "gdrpy"
    except (RuntimeError, KeyError, OSError):   # no $HOME and no passwd entry
        return None


_default_cache_dir = cache_dir


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
        wins = sum(a < b for a, b in zip(m, c))
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


# ---------------------------------------------------------------------------------------
# Online adaptation
# ---------------------------------------------------------------------------------------

def _bucket(n: int) -> int:
    """Quarter-octave size bucket: n < 4 -> n; else 4*floor(log2 n) + next two bits."""
    if n < 4:
        return n
    k = n.bit_length() - 1
    return 4 * k + ((n >> (k - 2)) & 3)


def _bucket_lo(b: int) -> int:
    if b < 4:
        return b
    k, j = divmod(b, 4)
    return (4 + j) << (k - 2)


def _bucket_hi(b: int) -> int:
    return _bucket_lo(8 if b == 3 else b + 1) - 1


_MEDIAN_SE = 1.2533 * 1.4826     # SE of a median ~ 1.2533 sigma/sqrt(n); sigma ~ 1.4826 MAD


def _med_mad(xs: Iterable[float]) -> tuple[float, float]:
    s = sorted(xs)
    med = _median(s)
    return med, _median([abs(x - med) for x in s])


class _Bucket:
    """Evidence for one size bucket, gathered in rounds of disjoint samples.

    A round closes when both paths have ``round_size`` samples; it yields +1 (mapping
    faster), -1 (copy engine faster) or 0 (unclear): the difference of the median
    log-times must exceed the hysteresis margin by ``z`` standard errors (estimated from
    the MADs). The bucket's verdict is that of its last ``confirm`` rounds when they all
    agree, else 0. Rounds share no samples, so a noise-made verdict must recur on fresh
    data before it counts: false verdicts multiply away, which a sliding window (checked
    after every sample on overlapping data) does not give.
    """
    __slots__ = ("m", "c", "rounds", "verdict", "diff", "med_m", "med_c", "n_rounds")

    def __init__(self, round_size: int, confirm: int) -> None:
        self.m: deque[float] = deque(maxlen=4 * round_size)   # log seconds, mapping
        self.c: deque[float] = deque(maxlen=4 * round_size)   # log seconds, copy engine
        self.rounds: deque[int] = deque(maxlen=confirm)
        self.verdict = 0
        self.diff = math.nan          # last round: median log(ce) - median log(mapping)
        self.med_m = math.nan         # last round's medians, seconds
        self.med_c = math.nan
        self.n_rounds = 0

    def add(self, path: str, log_s: float, round_size: int, margin: float,
            z: float) -> bool:
        """Add a sample; True when a round closed (the verdict may have changed)."""
        (self.m if path == "mapping" else self.c).append(log_s)
        nm, nc = len(self.m), len(self.c)
        if nm < round_size or nc < round_size:
            return False
        mm, am = _med_mad(self.m)
        mc, ac = _med_mad(self.c)
        diff = mc - mm                       # > 0: mapping faster
        se = _MEDIAN_SE * math.sqrt(am * am / nm + ac * ac / nc)
        v = 1 if diff - z * se > margin else -1 if -diff - z * se > margin else 0
        self.m.clear()
        self.c.clear()
        self.diff, self.med_m, self.med_c = diff, math.exp(mm), math.exp(mc)
        self.n_rounds += 1
        self.rounds.append(v)
        first = self.rounds[0]
        self.verdict = (first if len(self.rounds) == self.rounds.maxlen
                        and all(r == first for r in self.rounds) else 0)
        return True


_EV_NONE, _EV_PROBE, _EV_SAMPLE = 0, 1, 2


class _Dir:
    """Per-direction state. lo/hi/count/next_event are read without the lock."""

    def __init__(self, name: str, seed: int | None) -> None:
        self.name = name
        self.source = "default"
        self.override: int | None = None
        self.adaptive = False
        self.lo = 1          # adaptation window [lo, hi]; lo > hi: empty
        self.hi = 0
        self.count = 0
        self.rng = random.Random(None if seed is None else f"{seed}:{name}")
        self.next_event = 0
        self.kind = 0
        self.gap = (1, 1)
        self.buckets: dict[int, _Bucket] = {}
        self.records = 0
        self.ignored = 0
        self.probes = 0
        self.samples = 0
        self.conflicts = 0
        self.moves: deque[tuple[int, int, int]] = deque(maxlen=32)  # (record no, old, new)
        self.n_moves = 0
        # What persists for this direction: {"threshold", "source", "sweep", "time"}.
        self.persist: dict[str, Any] | None = None


# ---------------------------------------------------------------------------------------
# Cache file
# ---------------------------------------------------------------------------------------

class _CacheInvalid(Exception):
    pass


@contextlib.contextmanager
def _file_lock(path: pathlib.Path, timeout_s: float) -> Iterator[bool]:
    """Exclusive flock on ``path`` (created if needed); yields whether it was taken.

    Never raises for lock trouble: without fcntl, on an unwritable directory or after
    ``timeout_s`` it yields False and the caller proceeds (writes stay atomic anyway).
    """
    try:
        import fcntl
    except ImportError:         # not POSIX: atomic replace alone
        yield False
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError as e:
        log.debug("threshold cache: cannot open lock file %s: %s", path, e)
        yield False
        return
    got = False
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                got = True
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    log.debug("threshold cache: flock %s failed: %s", path, e)
                    break
                if time.monotonic() >= deadline:
                    log.warning("threshold cache: lock %s still held after %.0f s; "
                                "going on without it", path, timeout_s)
                    break
                time.sleep(0.01)
        yield got
    finally:
        if got:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _atomic_write(path: pathlib.Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _finite(x: object) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)
            and math.isfinite(x))


def _validate_cache(obj: object, identity: dict[str, Any], key: str, now: float,
                    max_age_s: float | None) -> dict[str, dict[str, Any]]:
    """Return the valid per-direction entries of a cache document or raise _CacheInvalid."""
    if not isinstance(obj, dict) or obj.get("kind") != _CACHE_KIND:
        raise _CacheInvalid("not a gdrpy threshold cache (no kind "
                            f"{_CACHE_KIND!r})")
    schema = obj.get("schema")
    if schema != SCHEMA_VERSION:
        raise _CacheInvalid(f"schema {schema!r} is not {SCHEMA_VERSION}")
    ident = obj.get("identity")
    if not isinstance(ident, dict):
        raise _CacheInvalid("identity missing or not an object")
    if ident != identity or obj.get("key") != key:
        diff = sorted(k for k in set(ident) | set(identity) if ident.get(k) != identity.get(k))
        shown = ", ".join(f"{k}: cached {ident.get(k)!r} != current {identity.get(k)!r}"
                          for k in diff[:4])
        raise _CacheInvalid(f"identity mismatch ({shown or 'key differs'})")
    created = obj.get("created")
    if not _finite(created) or created <= 0:
        raise _CacheInvalid(f"created {created!r} is not a Unix time")
    if created > now + 86400:
        raise _CacheInvalid(f"created {created!r} lies in the future")
    if max_age_s is not None and now - created > max_age_s:
        raise _CacheInvalid(f"older than max_age_s={max_age_s:g} s "
                            f"(created {now - created:.0f} s ago)")
    entries = obj.get("directions")
    if not isinstance(entries, dict):
        raise _CacheInvalid("directions missing or not an object")
    out: dict[str, dict[str, Any]] = {}
    for d, e in entries.items():
        if d not in DIRECTIONS:
            raise _CacheInvalid(f"unknown direction {d!r}")
        if not isinstance(e, dict):
            raise _CacheInvalid(f"{d}: entry is not an object")
        t = e.get("threshold")
        if not isinstance(t, int) or isinstance(t, bool):
            raise _CacheInvalid(f"{d}: threshold {t!r} is not an integer")
        if not 0 <= t <= MAX_THRESHOLD:
            raise _CacheInvalid(f"{d}: threshold {t!r} is absurd (not in 0..{MAX_THRESHOLD})")
        src = e.get("source")
        if src not in ("calibration", "adapted"):
            raise _CacheInvalid(f"{d}: source {src!r} is not 'calibration' or 'adapted'")
        sweep = e.get("sweep", [])
        if not isinstance(sweep, list) or len(sweep) > 4096 or not all(
                isinstance(r, list) and len(r) == 3 and isinstance(r[0], int)
                and not isinstance(r[0], bool) and r[0] >= 0
                and all(_finite(v) and v >= 0 for v in r[1:]) for r in sweep):
            raise _CacheInvalid(f"{d}: sweep table malformed")
        tm = e.get("time", created)
        if not _finite(tm):
            raise _CacheInvalid(f"{d}: time {tm!r} is not a number")
        out[d] = {"threshold": t, "source": src, "sweep": sweep, "time": float(tm)}
    cal = obj.get("calibration")
    if cal is not None:
        if not isinstance(cal, dict):
            raise _CacheInvalid("calibration is not an object")
        dur = cal.get("duration_s")
        if not _finite(dur) or not 0 <= dur < 86400:
            raise _CacheInvalid(f"calibration duration_s {dur!r} is absurd")
    return out


# ---------------------------------------------------------------------------------------
# The picker
# ---------------------------------------------------------------------------------------

class ThresholdPicker:
    """Per-direction mapping-vs-copy-engine threshold with calibration and adaptation.

    ``h2d`` / ``d2h``: override for that direction (int bytes, a string accepted by
    :func:`parse_threshold`, "always-mapping", "always-ce"; None or "auto": no override).
    Arguments take precedence over ``$GDRPY_THRESHOLD_H2D`` / ``$GDRPY_THRESHOLD_D2H``
    (read from ``env``, default ``os.environ``, at construction). An overridden
    direction is never calibrated, loaded or adapted.

    ``identity``: dict of JSON scalars describing the host (GPU UUID, driver version,
    backend, CPU model, NUMA node...); None disables persistence. ``cache_dir``: where
    cache files live (default: :func:`cache_dir`).

    Adaptation knobs: ``adapt`` (on/off), ``probe_every`` (one probe and one baseline
    sample per ``probe_every`` transfers in the window, on average), ``window_factor``
    (sizes within ``T/f .. T*f`` are watched), ``hysteresis`` (the other path must be
    faster by more than this fraction), ``confidence`` (and by that many standard errors
    beyond it), ``min_samples`` (samples per path in one round of evidence for a size
    bucket), ``confirm`` (consecutive rounds, on disjoint samples, that must agree before
    the threshold moves), ``seed`` (probe schedule; None: random).
    """

    def __init__(self, h2d: object = None, d2h: object = None, *,
                 identity: Mapping[str, Any] | None = None,
                 cache_dir: str | os.PathLike | None = None,
                 env: Mapping[str, str] | None = None,
                 adapt: bool = True, probe_every: int = 64, window_factor: float = 4.0,
                 hysteresis: float = 0.10, confidence: float = 2.0,
                 min_samples: int = 16, confirm: int = 2, seed: int | None = 0,
                 lock_timeout_s: float = 30.0, max_age_s: float | None = None) -> None:
        env = os.environ if env is None else env
        if not isinstance(env, Mapping):
            raise TypeError(f"env must be a mapping, got {type(env).__name__}")
        if not isinstance(adapt, bool):
            raise TypeError(f"adapt must be a bool, got {adapt!r}")
        self._probe_every = _as_int(probe_every, "probe_every")
        if self._probe_every < 2:
            raise ValueError(f"probe_every must be >= 2, got {probe_every!r}")
        self._window = _as_real(window_factor, "window_factor")
        if not (1 < self._window <= 1024):
            raise ValueError(f"window_factor must be in (1, 1024], got {window_factor!r}")
        h = _as_real(hysteresis, "hysteresis")
        if not (0 <= h <= 10):
            raise ValueError(f"hysteresis must be in [0, 10], got {hysteresis!r}")
        self._hysteresis = h
        self._margin = math.log1p(h)
        self._z = _as_real(confidence, "confidence")
        if not (0 <= self._z <= 100):
            raise ValueError(f"confidence must be in [0, 100], got {confidence!r}")
        self._round = _as_int(min_samples, "min_samples")
        if not 2 <= self._round <= 4096:
            raise ValueError(f"min_samples must be in 2..4096, got {min_samples!r}")
        self._confirm = _as_int(confirm, "confirm")
        if not 1 <= self._confirm <= 64:
            raise ValueError(f"confirm must be in 1..64, got {confirm!r}")
        if seed is not None:
            seed = _as_int(seed, "seed")
        lock_timeout_s = _as_real(lock_timeout_s, "lock_timeout_s")
        if not (lock_timeout_s >= 0 and math.isfinite(lock_timeout_s)):
            raise ValueError(f"lock_timeout_s must be >= 0, got {lock_timeout_s!r}")
        self._lock_timeout = lock_timeout_s
        if max_age_s is not None:
            max_age_s = _as_real(max_age_s, "max_age_s")
            if not max_age_s > 0:
                raise ValueError(f"max_age_s must be > 0 or None, got {max_age_s!r}")
        self._max_age = max_age_s

        self._identity = None if identity is None else _check_identity(identity)
        self._key = None if self._identity is None else identity_key(self._identity)
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir must be a path, got {type(cache_dir).__name__} "
                            f"{cache_dir!r}")
        self._cache_dir = (pathlib.Path(cache_dir) if cache_dir is not None
                           else _default_cache_dir(env))

        self._lock = threading.RLock()
        self._calib_lock = threading.Lock()
        self.reason = "not loaded yet"
        self._calibration: dict[str, Any] | None = None

        # Hot-path table: direction -> threshold. Items are replaced, never mutated.
        self._thr: dict[str, int] = dict(DEFAULT_THRESHOLDS)
        self._st = {d: _Dir(d, seed) for d in DIRECTIONS}
        gap_mean = self._probe_every / 2        # probe and baseline events alternate
        for d, arg in (("h2d", h2d), ("d2h", d2h)):
            st = self._st[d]
            st.gap = (max(1, int(gap_mean / 2)), max(1, int(gap_mean * 3 / 2)))
            st.next_event = st.rng.randint(1, st.gap[1])
            ov = parse_threshold(arg, d)
            if ov is None and env.get(ENV_THRESHOLD[d], "").strip():
                ov = parse_threshold(env[ENV_THRESHOLD[d]], f"${ENV_THRESHOLD[d]}")
            st.override = ov
            st.adaptive = adapt and ov is None
            if ov is not None:
                self._set(d, ov, "override")
            else:
                self._set(d, DEFAULT_THRESHOLDS[d], "default")

    # -- hot path --------------------------------------------------------------------

    def choose(self, direction: str, nbytes: int) -> bool:
        """True: send ``nbytes`` in ``direction`` through the mapping; False: copy engine.

        Lock-free: one dict lookup, one comparison. ``nbytes`` is not validated here.
        """
        try:
            return nbytes <= self._thr[direction]
        except KeyError:
            raise ValueError(
                f"direction must be one of {DIRECTIONS}, got {direction!r}") from None

    def advise(self, direction: str, nbytes: int) -> int:
        """Path and timing advice in one cheap call: ``MAPPING`` bit, ``TIMED`` bit.

        Without ``TIMED`` (the common case) just take the path. With ``TIMED``, time the
        transfer over the path given and pass the time to :meth:`record`. Near the
        threshold, about one transfer in ``probe_every`` is sent over the other path (a
        probe) and one over the chosen path is timed (a baseline sample).
        """
        try:
            t = self._thr[direction]
            st = self._st[direction]
        except KeyError:
            raise ValueError(
                f"direction must be one of {DIRECTIONS}, got {direction!r}") from None
        use = nbytes <= t
        if nbytes < st.lo or nbytes > st.hi:
            return MAPPING if use else CE
        ev = self._event(st)
        if ev == _EV_PROBE:
            return TIMED | (CE if use else MAPPING)
        if ev == _EV_SAMPLE:
            return TIMED | (MAPPING if use else CE)
        return MAPPING if use else CE

    def should_probe(self, direction: str, nbytes: int) -> bool:
        """True about once per ``probe_every`` transfers near the threshold.

        When True, the engine should send this transfer over the *other* path than
        :meth:`choose` says, time it and :meth:`record` it. Engines using this instead of
        :meth:`advise` must also record timings of chosen-path transfers near the
        threshold (``in_window``), or adaptation has no baseline to compare against.
        Deterministic for a given ``seed`` and call sequence.
        """
        try:
            st = self._st[direction]
        except KeyError:
            raise ValueError(
                f"direction must be one of {DIRECTIONS}, got {direction!r}") from None
        if nbytes < st.lo or nbytes > st.hi:
            return False
        return self._event(st) == _EV_PROBE

    def in_window(self, direction: str, nbytes: int) -> bool:
        """Whether ``record()`` would use a sample of this size (adaptation window)."""
        st = self._st[_check_direction(direction)]
        return st.lo <= nbytes <= st.hi

    @staticmethod
    def _event(st: _Dir) -> int:
        st.count += 1
        if st.count < st.next_event:
            return _EV_NONE
        st.next_event = st.count + st.rng.randint(*st.gap)
        st.kind ^= 1
        if st.kind:
            st.probes += 1
            return _EV_PROBE
        st.samples += 1
        return _EV_SAMPLE

    # -- recording and adaptation ----------------------------------------------------

    def record(self, direction: str, path: str, nbytes: int, seconds: float) -> bool:
        """Report one timed transfer. Returns True if it was used for adaptation.

        Samples of overridden (or non-adaptive) directions and of sizes outside the
        adaptation window are counted and dropped.
        """
        st = self._st[_check_direction(direction)]
        _check_path(path)
        n = _as_int(nbytes, "nbytes")
        if n < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
        s = _as_real(seconds, "seconds")
        if not (s > 0 and math.isfinite(s)):
            raise ValueError(f"seconds must be a positive finite number, got {seconds!r}")
        with self._lock:
            if not st.adaptive or not st.lo <= n <= st.hi:
                st.ignored += 1
                return False
            b = _bucket(n)
            bk = st.buckets.get(b)
            if bk is None:
                bk = st.buckets[b] = _Bucket(self._round, self._confirm)
            st.records += 1
            if bk.add(path, math.log(s), self._round, self._margin, self._z) and bk.verdict:
                self._maybe_move(st)
            return True

    def _maybe_move(self, st: _Dir) -> None:
        """Move T to the nearest value consistent with all clear verdicts (lock held)."""
        max_m = min_c = None
        for b, bk in st.buckets.items():
            if bk.verdict > 0:
                max_m = b if max_m is None or b > max_m else max_m
            elif bk.verdict < 0:
                min_c = b if min_c is None or b < min_c else min_c
        if max_m is not None and min_c is not None and max_m >= min_c:
            st.conflicts += 1          # contradictory evidence: hold still
            return
        t = self._thr[st.name]
        new = t
        if max_m is not None and t < _bucket_hi(max_m):
            new = _bucket_hi(max_m)
        elif min_c is not None and t >= _bucket_lo(min_c):
            new = _bucket_lo(min_c) - 1
        new = max(0, min(MAX_THRESHOLD, new))
        if new == t:
            return
        st.n_moves += 1
        st.moves.append((st.records, t, new))
        log.info("threshold %s adapted: %s -> %s after %d samples", st.name,
                 format_threshold(t), format_threshold(new), st.records)
        self._set(st.name, new, "adapted")
        st.persist = {"threshold": new, "source": "adapted",
                      "sweep": (st.persist or {}).get("sweep", []), "time": time.time()}

    def _set(self, d: str, t: int, source: str) -> None:
        """Install a threshold and recompute the adaptation window (lock held or init)."""
        st = self._st[d]
        st.source = source
        if st.adaptive:
            lo = int(t / self._window)
            hi = max(int(t * self._window), 16)
            blo, bhi = _bucket(lo), _bucket(hi)
            st.buckets = {b: bk for b, bk in st.buckets.items() if blo <= b <= bhi}
            # Order matters for lock-free readers only marginally: a reader may see one
            # bound updated and not the other, which only mis-sizes one probe window.
            st.lo, st.hi = lo, hi
        else:
            st.lo, st.hi = 1, 0
            st.buckets = {}
        self._thr[d] = t

    def reset_adaptation(self, direction: str | None = None) -> None:
        """Forget adaptation samples (all directions, or one)."""
        dirs = DIRECTIONS if direction is None else (_check_direction(direction),)
        with self._lock:
            for d in dirs:
                self._st[d].buckets = {}

    # -- introspection ---------------------------------------------------------------

    def threshold(self, direction: str) -> int:
        """Current threshold of ``direction`` (ALWAYS_MAPPING / ALWAYS_CE for those modes)."""
        return self._thr[_check_direction(direction)]

    @property
    def thresholds(self) -> dict[str, int]:
        return dict(self._thr)

    def source(self, direction: str) -> str:
        return self._st[_check_direction(direction)].source

    @property
    def identity(self) -> dict[str, Any] | None:
        return None if self._identity is None else dict(self._identity)

    @property
    def cache_file(self) -> pathlib.Path | None:
        if self._key is None or self._cache_dir is None:
            return None
        return self._cache_dir / f"threshold-{self._key}.json"

    def state(self) -> dict[str, Any]:
        """A JSON-able snapshot: thresholds, sources, samples, calibration, identity."""
        with self._lock:
            dirs = {}
            for d, st in self._st.items():
                t = self._thr[d]
                buckets = []
                for b in sorted(st.buckets):
                    bk = st.buckets[b]
                    buckets.append({
                        "lo": _bucket_lo(b), "hi": _bucket_hi(b),
                        "rounds": bk.n_rounds,
                        "pending_mapping": len(bk.m), "pending_ce": len(bk.c),
                        "last_median_mapping_s": None if bk.n_rounds == 0 else bk.med_m,
                        "last_median_ce_s": None if bk.n_rounds == 0 else bk.med_c,
                        "recent_rounds": [{1: "mapping", -1: "ce", 0: None}[v]
                                          for v in bk.rounds],
                        "verdict": {1: "mapping", -1: "ce", 0: None}[bk.verdict],
                    })
                dirs[d] = {
                    "threshold": t,
                    "threshold_text": format_threshold(t),
                    "source": st.source,
                    "adaptive": st.adaptive,
                    "window": [st.lo, st.hi] if st.adaptive else None,
                    "samples": {
                        "recorded": st.records, "ignored": st.ignored,
                        "probes_advised": st.probes, "samples_advised": st.samples,
                        "conflicts": st.conflicts, "moves": st.n_moves,
                        "recent_moves": [list(m) for m in st.moves],
                        "buckets": buckets,
                    },
                }
            return {
                "directions": dirs,
                "calibration": None if self._calibration is None else dict(self._calibration),
                "identity": self.identity,
                "identity_key": self._key,
                "cache_file": None if self.cache_file is None else str(self.cache_file),
                "reason": self.reason,
            }

    def __repr__(self) -> str:
        parts = ", ".join(f"{d}={format_threshold(self._thr[d])} ({self._st[d].source})"
                          for d in DIRECTIONS)
        return f"<ThresholdPicker {parts}>"

    # -- calibration and persistence -------------------------------------------------

    def _needed(self) -> list[str]:
        return [d for d in DIRECTIONS if self._st[d].override is None]

    def uncalibrated(self) -> list[str]:
        """Directions still on the provisional default (not overridden, loaded,
        calibrated or adapted): what a calibration would measure."""
        return [d for d in self._needed() if self._st[d].source == "default"]

    def calibrate(self, measure: MeasureFn, *, directions: Iterable[str] | None = None,
                  save: bool = True, **kwargs: Any) -> CalibrationResult:
        """Run :func:`calibrate` and install the result (and save it if ``save``).

        ``directions`` defaults to the directions not overridden; an overridden direction
        named explicitly is measured and persisted but its override stays in force.
        """
        dirs = self._needed() if directions is None else list(directions)
        if not dirs:
            raise ValueError("every direction is overridden; nothing to calibrate "
                             "(name directions= explicitly to measure anyway)")
        with self._calib_lock:
            res = calibrate(measure, directions=dirs, **kwargs)
            self._install(res)
            if save and self.cache_file is not None and self._ensure_dir():
                with _file_lock(self._lock_path(), self._lock_timeout):
                    self._save_unlocked()
        return res

    def _install(self, res: CalibrationResult) -> None:
        with self._lock:
            for d, r in res.directions.items():
                st = self._st[d]
                if not r.sweep:        # nothing measured: keep what we had
                    continue
                st.persist = {"threshold": r.threshold, "source": "calibration",
                              "sweep": [m.as_row() for m in r.sweep + r.refinement],
                              "time": res.started}
                if st.override is None:
                    st.buckets = {}
                    self._set(d, r.threshold, "calibration")
            self._calibration = {"time": res.started, "duration_s": res.duration_s,
                                 "budget_s": res.budget_s, "truncated": res.truncated,
                                 "directions": sorted(res.directions), "notes": list(res.notes)}

    def _lock_path(self) -> pathlib.Path:
        f = self.cache_file
        assert f is not None
        return f.with_suffix(".lock")

    def _read_cache(self) -> tuple[dict[str, dict[str, Any]], Any]:
        """(valid entries, calibration info) of the cache file; raises _CacheInvalid."""
        f = self.cache_file
        if f is None:
            raise _CacheInvalid("no identity given; persistence disabled" if self._key is None
                                else "no cache directory (no $HOME)")
        try:
            with open(f, "rb") as fh:
                data = fh.read(_MAX_CACHE_BYTES + 1)
        except FileNotFoundError:
            raise _CacheInvalid(f"no cache file {f}") from None
        except OSError as e:
            raise _CacheInvalid(f"cannot read {f}: {e}") from None
        if len(data) > _MAX_CACHE_BYTES:
            raise _CacheInvalid(f"{f} is larger than {_MAX_CACHE_BYTES} bytes")
        try:
            obj = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise _CacheInvalid(f"corrupt cache file {f}: {e}") from None
        try:
            entries = _validate_cache(obj, self._identity or {}, self._key or "",
                                      time.time(), self._max_age)
        except _CacheInvalid as e:
            raise _CacheInvalid(f"{f}: {e}") from None
        return entries, obj.get("calibration")

    def load(self) -> bool:
        """Load thresholds from the cache. True if every non-overridden direction got one.

        Never raises for a bad cache: ``self.reason`` says what happened.
        """
        if self.cache_file is None:
            self.reason = ("no identity given; persistence disabled" if self._key is None
                           else "no cache directory (no $HOME)")
            return False
        with _file_lock(self._lock_path(), self._lock_timeout):
            return self._load_unlocked()

    def _load_unlocked(self) -> bool:
        try:
            entries, cal = self._read_cache()
        except _CacheInvalid as e:
            self.reason = str(e)
            log.info("threshold cache not used: %s", e)
            return False
        with self._lock:
            for d, e in entries.items():
                st = self._st[d]
                st.persist = e
                if st.override is None:
                    st.buckets = {}
                    self._set(d, e["threshold"], "cache")
            if isinstance(cal, dict):
                self._calibration = {k: cal.get(k) for k in
                                     ("time", "duration_s", "budget_s", "truncated",
                                      "directions")}
        missing = [d for d in self._needed() if d not in entries]
        if missing:
            self.reason = f"cache {self.cache_file} has no entry for {', '.join(missing)}"
            log.info("threshold cache: %s", self.reason)
            return False
        self.reason = f"loaded from {self.cache_file}"
        return True

    def save(self) -> bool:
        """Write calibrated/adapted thresholds to the cache. False (with reason) on failure."""
        if self.cache_file is None:
            self.reason = ("no identity given; persistence disabled" if self._key is None
                           else "no cache directory (no $HOME)")
            return False
        if not self._ensure_dir():
            return False
        with _file_lock(self._lock_path(), self._lock_timeout):
            return self._save_unlocked()

    def _ensure_dir(self) -> bool:
        """Create the cache directory (the lock file lives there). False, with reason."""
        assert self._cache_dir is not None
        try:
            self._cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            self.reason = f"cannot create cache directory {self._cache_dir}: {e}"
            log.warning("threshold cache: %s", self.reason)
            return False
        return True

    def _save_unlocked(self) -> bool:
        f = self.cache_file
        assert f is not None and self._cache_dir is not None
        try:
            self._cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                old = self._read_cache()[0]  # keep other processes' entries we lack
            except _CacheInvalid:
                old = {}
            with self._lock:
                entries = dict(old)
                for d, st in self._st.items():
                    if st.persist is not None:
                        entries[d] = st.persist
                if not entries:
                    self.reason = "nothing calibrated or adapted to save"
                    return False
                doc = {
                    "kind": _CACHE_KIND,
                    "schema": SCHEMA_VERSION,
                    "key": self._key,
                    "identity": self._identity,
                    "created": time.time(),
                    "calibration": self._calibration,
                    "directions": entries,
                }
            data = json.dumps(doc, indent=1, sort_keys=True, allow_nan=False).encode()
            _atomic_write(f, data)
        except (OSError, ValueError) as e:
            self.reason = f"cannot write {f}: {e}"
            log.warning("threshold cache: %s", self.reason)
            return False
        self.reason = f"saved to {f}"
        return True

    def load_or_calibrate(self, measure: MeasureFn | None = None, **kwargs: Any) -> str:
        """Load the cache; calibrate the directions it lacks; save. Never raises for a
        bad cache or a failing ``measure`` (the defaults stay; ``reason`` says why).

        Returns the outcome: "override" (nothing to do), "cache", "calibration" or
        "default". Calibrations of the same identity in several processes are
        serialised by the cache file lock, so a second process finds the first one's
        result instead of measuring while the first one measures.
        """
        needed = self._needed()
        if not needed:
            self.reason = "all directions overridden"
            return "override"
        if self.cache_file is not None:
            self._ensure_dir()      # failure shows up again, with reason, at load/save
        lock = (_file_lock(self._lock_path(), self._lock_timeout)
                if self.cache_file is not None else contextlib.nullcontext(False))
        with self._calib_lock, lock:
            if self.cache_file is None:
                why = ("no identity given; persistence disabled" if self._key is None
                       else "no cache directory (no $HOME)")
            elif self._load_unlocked():
                return "cache"
            else:
                why = self.reason
            missing = [d for d in needed if self._st[d].source not in ("cache",)]
            if measure is None:
                self.reason = f"{why}; no measure given: provisional defaults in use"
                return "default"
            def guarded(*args: Any) -> Sequence[float]:
                try:
                    return measure(*args)
                except Exception as e:
                    raise _MeasureFailed(e) from e

            try:
                res = calibrate(guarded, directions=missing, **kwargs)
            except (_MeasureFailed, MeasureResultError) as e:
                # Never let a broken measure take the engine down. (Bad arguments to
                # calibrate() still raise: they are the caller's bug, not the host's.)
                err = e.__cause__ if isinstance(e, _MeasureFailed) else e
                self.reason = (f"{why}; calibration failed ({type(err).__name__}: {err}): "
                               f"provisional defaults in use")
                log.warning("threshold calibration failed", exc_info=True)
                return "default"
            self._install(res)
            done = f"{why}; calibrated {', '.join(missing)} in {res.duration_s:.2f} s"
            if self.cache_file is not None:
                saved = self._save_unlocked()
                done += f"; {self.reason}" if not saved else f"; saved to {self.cache_file}"
            self.reason = done
            return "calibration"
