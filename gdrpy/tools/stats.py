"""Sample statistics for every tool's report (bench, pingpong, the examples).

Conventions, one for all:

* median: the middle sample of the sorted samples (the mean of the two middle ones for
  an even count);
* tail percentiles (p90, p99, p99.9): **nearest rank**, the smallest sample with at
  least q % of the samples at or below it, so a reported p99 is always a latency that
  was observed (no interpolation between samples).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = ["median", "percentile", "summarize"]

#: Quantiles :func:`summarize` reports, by name.
QUANTILES = (("p90", 90.0), ("p99", 99.0), ("p99.9", 99.9))


def median(sorted_samples: Sequence[float]) -> float:
    """Median of already sorted samples (mean of the two middle ones for even n)."""
    s, n = sorted_samples, len(sorted_samples)
    if n == 0:
        raise ValueError("median of no samples")
    return float(s[n // 2]) if n & 1 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def percentile(sorted_samples: Sequence[float], q: float) -> float:
    """Nearest-rank ``q``-th percentile (0 < q <= 100) of already sorted samples."""
    n = len(sorted_samples)
    if n == 0:
        raise ValueError("percentile of no samples")
    if not 0 < q <= 100:
        raise ValueError(f"q must be in (0, 100], got {q!r}")
    return float(sorted_samples[max(0, math.ceil(q / 100 * n) - 1)])


def summarize(samples: Iterable[float], scale: float = 1.0) -> dict:
    """``{"n", "median", "p90", "p99", "p99.9", "min", "max", "mean"}`` of ``samples``
    divided by ``scale`` (e.g. 1e3: ns -> us); ``{"n": 0}`` for no samples."""
    s = sorted(float(x) / scale for x in samples)
    if not s:
        return {"n": 0}
    out = {"n": len(s), "median": median(s)}
    out.update((name, percentile(s, q)) for name, q in QUANTILES)
    out.update(min=s[0], max=s[-1], mean=math.fsum(s) / len(s))
    return out
