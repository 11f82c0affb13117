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
  (``$GDRPY_CACHE_DIR``, else platformdirs' user cache dir: ``~/.cache/gdrpy`` on Linux),
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

The default thresholds (:data:`DEFAULT_THRESHOLDS`) are provisional, derived from
measurements on an H100 (the figures are beside them in :mod:`.values`); calibrate on
the target machine.

Layout: :mod:`.values` (directions, special values, parsing), :mod:`.calibrate`
(sweeps), :mod:`.adapt` (online adaptation state), :mod:`.cache` (persistence, a
picker's cache file) and :mod:`.model` (:class:`ThresholdPicker`): pure Python that
imports nothing from the rest of gdrpy.  :mod:`.context` (not imported here) holds the
shared pickers of open gdrpy contexts and measures real transfers for them.
"""

from __future__ import annotations

from .cache import SCHEMA_VERSION, cache_dir, identity_key
from .calibrate import (
                        CalibrationResult,
                        DirectionResult,
                        MeasureResultError,
                        SizeMeasurement,
                        calibrate,
                        default_sizes,
)
from .model import ThresholdPicker
from .values import (
                        ALWAYS_CE,
                        ALWAYS_MAPPING,
                        CE,
                        DEFAULT_THRESHOLDS,
                        DIRECTIONS,
                        MAPPING,
                        MAX_THRESHOLD,
                        PATHS,
                        TIMED,
                        format_threshold,
                        parse_threshold,
)

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
