"""Online adaptation state: quarter-octave size buckets gathering both paths' timings
in rounds of disjoint samples, and the per-direction state of the picker."""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterable
from typing import Any

from .calibrate import _median


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
