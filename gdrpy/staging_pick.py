"""Choosing the staging ring's plan robustly (issue 14).

A plan is judged by its *worst* cell, not a mean: the staged rate as a
fraction of the pinned copy-engine rate at each scored size and direction,
each cell's median over the rounds, and the lowest cell.  Candidates are timed in
interleaved rounds (every candidate once per round, the order alternating)
so that drift in the machine hits all of them alike, and a plan that falls
off at one size loses to one that is never slow there.  After two rounds
only the better half is timed again, which bounds the calibration time.

The candidate list is pruned to the class that held up on the H100; its
order is the prior: when two candidates score within :data:`TIE` of each
other the earlier one wins, so repeated calibrations on one machine settle on
the same plan.  First the large rings (32 slots of 2 MiB, 64 MiB of
page-locked memory): a get's DMA rewrites a slot only after the CPU's
private caches have let go of the lines it copied out of that slot, so the
engine is not slowed by snoops and the copy-out needs no eviction (round 6,
H100, fresh calibrations: gets of 16-64 MiB at 85-93% of pinned against
72-78% with a 4-slot ring and evicted lines; 4 MiB gets unchanged at 60-65%,
see docs/large-messages.md); then the 4-8 slot rings that keep the ring
small with streaming or evicting copies (16 slots measured worse than 32
for 4 MiB gets: 60-63% against 76-81% in the same runs).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

KIB = 1 << 10
MIB = 1 << 20

#: (write_kind, read_kind, chunk, depth, threads), in order of preference
CANDIDATES: tuple[tuple[str, str, int, int, int], ...] = (
    ("nt", "nt", 2 * MIB, 32, 12),
    ("evict", "nt", 2 * MIB, 32, 12),
    ("nt", "plain", 2 * MIB, 32, 12),
    ("wc", "ntevict", 2 * MIB, 4, 12),
    ("evict", "ntevict", 2 * MIB, 4, 12),
)

#: relative margin within which the earlier (preferred) candidate wins
TIE = 0.02

Cand = tuple[str, str, int, int, int]
Cell = tuple[str, int]          # (direction, nbytes)


def candidates(tmax: int, max_chunk: int,
               base: Iterable[Cand] = CANDIDATES) -> list[Cand]:
    """``base`` fitted to this host: threads at most ``tmax`` (at least 1),
    slots at most ``max_chunk``; duplicates after fitting are dropped, the
    order kept."""
    out: list[Cand] = []
    for w, r, c, d, t in base:
        cand = (w, r, min(c, max(max_chunk, 64 * KIB)), d, max(1, min(t, tmax)))
        if cand not in out:
            out.append(cand)
    return out


def worst(rounds: Sequence[dict[Cell, float]]) -> float:
    """The lowest cell, each cell taken as its median over the rounds (0.0 when
    nothing was timed).  A median, not the lowest round: on a VM one round
    in a few can stall for milliseconds (hypervisor steal), and the lowest
    round then picks a plan at random; a plan slow at one size every time
    still scores low."""
    cells: dict[Cell, list[float]] = {}
    for rnd in rounds:
        for k, v in rnd.items():
            cells.setdefault(k, []).append(v)
    return min(statistics.median(vs) for vs in cells.values()) if cells else 0.0


def rank(results: dict[Cand, list[dict[Cell, float]]], order: Sequence[Cand]) -> list[Cand]:
    """Candidates best first by :func:`worst` score; a candidate earlier in
    ``order`` goes ahead of a later one whose score is within :data:`TIE`
    (relative) of its own.  Candidates not in ``results`` are left out."""
    cands = [c for c in order if c in results and results[c]]
    scores = {c: worst(results[c]) for c in cands}
    ranked: list[Cand] = []
    left = list(cands)
    while left:
        top = max(scores[c] for c in left)
        # the earliest candidate within TIE of the best score
        pick = next(c for c in left if scores[c] >= top * (1 - TIE))
        ranked.append(pick)
        left.remove(pick)
    return ranked


def survivors(results: dict[Cand, list[dict[Cell, float]]], order: Sequence[Cand],
              keep: int) -> list[Cand]:
    """The ``keep`` best candidates (at least 1) by :func:`rank`, in ``order``'s order
    (so the next round interleaves them as before)."""
    best = set(rank(results, order)[:max(1, keep)])
    return [c for c in order if c in best]
