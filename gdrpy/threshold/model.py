"""The picker: per-direction threshold, lock-free choice, online adaptation, and the
glue to calibration and the cache."""

from __future__ import annotations

import contextlib
import math
import os
import pathlib
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .adapt import (
    _EV_NONE,
    _EV_PROBE,
    _EV_SAMPLE,
    _Bucket,
    _bucket,
    _bucket_hi,
    _bucket_lo,
    _Dir,
)
from .cache import CacheFile, _CacheInvalid, _check_identity, identity_key
from .cache import cache_dir as _default_cache_dir
from .calibrate import (
    CalibrationResult,
    MeasureFn,
    MeasureResultError,
    _MeasureFailed,
    calibrate,
)
from .values import (
    CE,
    DEFAULT_THRESHOLDS,
    DIRECTIONS,
    ENV_THRESHOLD,
    MAPPING,
    MAX_THRESHOLD,
    TIMED,
    _as_int,
    _as_real,
    _check_direction,
    _check_path,
    format_threshold,
    log,
    parse_threshold,
)


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
        if max_age_s is not None:
            max_age_s = _as_real(max_age_s, "max_age_s")
            if not max_age_s > 0:
                raise ValueError(f"max_age_s must be > 0 or None, got {max_age_s!r}")

        self._identity = None if identity is None else _check_identity(identity)
        self._key = None if self._identity is None else identity_key(self._identity)
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir must be a path, got {type(cache_dir).__name__} "
                            f"{cache_dir!r}")
        directory = (pathlib.Path(cache_dir) if cache_dir is not None
                     else _default_cache_dir(env))
        self._file = (None if self._identity is None or self._key is None or directory is None
                      else CacheFile(directory, self._identity, self._key,
                                     lock_timeout_s=lock_timeout_s, max_age_s=max_age_s))

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
        return None if self._file is None else self._file.path

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
            if save and self._file is not None and self._ensure_dir():
                with self._file.lock():
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

    @property
    def _no_cache(self) -> str:
        """Why there is no cache file (when there is none)."""
        return ("no identity given; persistence disabled" if self._key is None
                else "no cache directory (no $HOME)")

    def _read_cache(self) -> tuple[dict[str, dict[str, Any]], Any]:
        """(valid entries, calibration info) of the cache file; raises _CacheInvalid."""
        if self._file is None:
            raise _CacheInvalid(self._no_cache)
        return self._file.read()

    def load(self) -> bool:
        """Load thresholds from the cache. True if every non-overridden direction got one.

        Never raises for a bad cache: ``self.reason`` says what happened.  Reads only
        (writes are atomic, so no lock is needed): creates no directory or lock file.
        """
        if self._file is None:
            self.reason = self._no_cache
            return False
        return self._load_entries()

    def _load_entries(self) -> bool:
        try:
            entries, cal = self._read_cache()
        except _CacheInvalid as e:
            self.reason = str(e)
            log.info("threshold cache not used: %s", e)
            return False
        with self._lock:
            for d, entry in entries.items():
                st = self._st[d]
                st.persist = entry
                if st.override is None:
                    st.buckets = {}
                    self._set(d, entry["threshold"], "cache")
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
        if self._file is None:
            self.reason = self._no_cache
            return False
        if not self._ensure_dir():
            return False
        with self._file.lock():
            return self._save_unlocked()

    def _ensure_dir(self) -> bool:
        """Create the cache directory (the lock file lives there). False, with reason."""
        assert self._file is not None
        why = self._file.ensure_dir()
        if why is not None:
            self.reason = why
            log.warning("threshold cache: %s", why)
            return False
        return True

    def _save_unlocked(self) -> bool:
        f = self._file
        assert f is not None
        try:
            try:
                old = f.read()[0]  # keep other processes' entries we lack
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
                calibration = self._calibration
            f.write(entries, calibration)
        except (OSError, ValueError) as e:
            self.reason = f"cannot write {f.path}: {e}"
            log.warning("threshold cache: %s", self.reason)
            return False
        self.reason = f"saved to {f.path}"
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
        if self._file is not None:
            self._ensure_dir()      # failure shows up again, with reason, at load/save
        lock = self._file.lock() if self._file is not None else contextlib.nullcontext(False)
        with self._calib_lock, lock:
            if self._file is None:
                why = self._no_cache
            elif self._load_entries():
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
            if self._file is not None:
                saved = self._save_unlocked()
                done += f"; {self.reason}" if not saved else f"; saved to {self.cache_file}"
            self.reason = done
            return "calibration"
