"""The staging plan's robust choice (gdrpy.staging_pick): worst-cell scores,
ties to the preferred candidate, pruning, fitting to the host."""

from __future__ import annotations

from gdrpy import staging_pick as sp

MIB = 1 << 20
A = ("evict", "ntevict", 2 * MIB, 4, 12)
B = ("nt", "nt", 8 * MIB, 4, 8)
C = ("wc", "ntevict", 4 * MIB, 4, 8)


def rnd(put4: float, get4: float, get64: float = 0.9) -> dict:
    return {("h2d", 4 * MIB): put4, ("d2h", 4 * MIB): get4, ("d2h", 64 * MIB): get64}


def test_worst_cell_beats_a_higher_mean():
    # B has the higher mean but one slow cell (the round-4 failure: get 46% at 4 MiB)
    res = {A: [rnd(0.74, 0.72)], B: [rnd(0.95, 0.46, 0.95)]}
    assert sp.rank(res, [B, A]) == [A, B]


def test_a_stalled_round_does_not_decide_but_a_steady_slow_cell_does():
    # A stalled once in three rounds (a VM's steal): each cell's median stands
    res = {A: [rnd(0.80, 0.80), rnd(0.80, 0.30), rnd(0.80, 0.80)],
           C: [rnd(0.75, 0.75), rnd(0.74, 0.76), rnd(0.75, 0.75)]}
    assert sp.worst(res[A]) == 0.80
    assert sp.rank(res, [C, A])[0] == A
    # slow at one size in every round: that cell decides
    res[B] = [rnd(0.95, 0.50, 0.95)] * 3
    assert sp.worst(res[B]) == 0.50
    assert sp.rank(res, [B, A, C])[-1] == B
    # slow in most rounds: the median is slow too
    res[A] = [rnd(0.80, 0.40), rnd(0.80, 0.45), rnd(0.80, 0.80)]
    assert sp.worst(res[A]) == 0.45
    assert sp.worst([]) == 0.0


def test_ties_go_to_the_earlier_candidate():
    res = {A: [rnd(0.75, 0.75)], C: [rnd(0.76, 0.76)]}     # within 2%
    assert sp.rank(res, [A, C])[0] == A
    assert sp.rank(res, [C, A])[0] == C
    res[C] = [rnd(0.80, 0.80)]                               # a clear win
    assert sp.rank(res, [A, C])[0] == C


def test_survivors_keep_the_better_half_in_order():
    res = {A: [rnd(0.7, 0.7)], B: [rnd(0.5, 0.5)], C: [rnd(0.8, 0.8)]}
    assert sp.survivors(res, [A, B, C], 2) == [A, C]
    assert sp.survivors(res, [A, B, C], 0) == [C]
    # a candidate without results is not ranked
    assert sp.rank({A: [rnd(0.7, 0.7)], B: []}, [A, B]) == [A]


def test_candidates_fit_the_host():
    got = sp.candidates(tmax=2, max_chunk=4 * MIB)
    assert all(t <= 2 and c <= 4 * MIB for _, _, c, _, t in got)
    assert len(set(got)) == len(got)
    w, r, c, d, _ = sp.CANDIDATES[0]
    assert got[0] == (w, r, min(c, 4 * MIB), d, 2)
    # every candidate's ring fits the library's limit (gdrpy_staging_set)
    from gdrpy.staging import MAX_DEPTH, MAX_RING
    assert all(2 <= d <= MAX_DEPTH and c * d <= MAX_RING for _, _, c, d, _ in sp.CANDIDATES)
    full = sp.candidates(tmax=14, max_chunk=64 * MIB)
    assert full == list(sp.CANDIDATES)
