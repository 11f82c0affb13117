"""Threshold values: directions, paths, special values, defaults, and parsing.

The vocabulary shared by the model, the calibration sweeps and the cache.
"""

from __future__ import annotations

import logging
import operator
import sys
from collections.abc import Mapping

from .._sizes import format_size, parse_size

log = logging.getLogger("gdrpy.threshold")

DIRECTIONS: tuple[str, ...] = ("h2d", "d2h")
PATHS: tuple[str, ...] = ("mapping", "ce")

#: Threshold value meaning "every size goes through the mapping".
ALWAYS_MAPPING: int = sys.maxsize
#: Threshold value meaning "every size goes through the copy engine".
ALWAYS_CE: int = -1
#: Largest finite threshold accepted from arguments, environment or cache (1 TiB).
MAX_THRESHOLD: int = 1 << 40

#: Provisional thresholds used before any calibration (bytes), from C timings (medians)
#: on an H100 80GB HBM3 (driver 580.159.04, CUDA 13.0, nvrm backend, AVX-512 host):
#:
#: h2d 64 KiB: a BAR1 store + sfence takes 34 ns for 8 B and 496 ns for 4 KiB, a store
#: stream runs at 16-19 GB/s (64 KiB ~ 3.6 us), while a synchronous cuMemcpyHtoD from
#: pinned memory costs 6.96 us for 8 B and ~7 us + size/38 GB/s beyond (~8.7 us at
#: 64 KiB, ~11.5 us from Python); the crossover there is ~200-250 KiB. 64 KiB keeps the
#: mapping a clear (>2x) win even on hosts with half that write bandwidth.
#: d2h 2 KiB: a BAR1 8-byte load takes 1.06 us and streaming loads (AVX2) read 0.7-0.8
#: GB/s (2 KiB ~ 3.5 us; plain loads 0.06 GB/s) against 7.3 us for cuMemcpyDtoH; the
#: crossover is ~4-5 KiB with streaming loads and far lower (~0.4 KiB) with plain loads,
#: so 2 KiB is the safe side.
DEFAULT_THRESHOLDS: Mapping[str, int] = {"h2d": 64 * 1024, "d2h": 2 * 1024}

ENV_THRESHOLD = {"h2d": "GDRPY_THRESHOLD_H2D", "d2h": "GDRPY_THRESHOLD_D2H"}

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

# ---------------------------------------------------------------------------------------
# Parsing and validation helpers
# ---------------------------------------------------------------------------------------

def _check_direction(direction: object) -> str:
    if direction in DIRECTIONS:
        return direction
    raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


def _check_path(path: object) -> str:
    if path in PATHS:
        return path
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
        return float(value)
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
        try:
            n = parse_size(text, minimum=0)
        except ValueError:
            raise ValueError(
                f"{name}: cannot parse {value!r}; expected a byte count such as 4096, 64K, "
                f"64KiB, 1M, or one of 'mapping', 'ce', 'always-mapping', 'always-ce', "
                f"'auto'") from None
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
    return format_size(t)

