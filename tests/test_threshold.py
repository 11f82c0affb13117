"""Adaptive threshold picker (gdrpy.threshold), CPU only, against synthetic cost models.

Every cost model below is a function of the message size; the true crossover is found by
bisection on the noise-free model, never hard-coded, so each assertion compares what the
picker found from noisy measurements with what the model implies.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import threading
import time

import numpy as np
import pytest

from gdrpy import threshold as th

# ---------------------------------------------------------------------------------------
# Synthetic cost models and a fake transfer engine
# ---------------------------------------------------------------------------------------

def lin(latency_s, bandwidth_Bps):
    return lambda n: latency_s + n / bandwidth_Bps


# Cost shapes measured in C on an H100 80GB HBM3 (driver 580.159.04, nvrm backend): BAR1
# store + sfence 34 ns, store stream ~17 GB/s; synchronous cuMemcpyHtoD (pinned) ~7.0 us
# + n / 40 GB/s; BAR1 8-byte load 1.06 us, streaming loads ~0.8 GB/s; cuMemcpyDtoH
# ~7.3 us + n / 39 GB/s.
H100_H2D = {"mapping": lin(34e-9, 17e9), "ce": lin(7.0e-6, 40e9)}
H100_D2H = {"mapping": lin(1.06e-6, 0.8e9), "ce": lin(7.3e-6, 39e9)}
# Mapping bandwidth collapses past 16 KiB (write-combining buffers exhausted, say).
KNEE = {"mapping": lambda n: 50e-9 + n / 20e9 + max(0, n - 16384) / 4e9,
        "ce": lin(5e-6, 25e9)}
# A cheaper copy engine (e.g. a future driver): crossover far lower than H100_H2D's.
FAST_CE = {"mapping": lin(34e-9, 17e9), "ce": lin(1.5e-6, 40e9)}
CE_ALWAYS = {"mapping": lin(10e-6, 1e9), "ce": lin(1e-6, 50e9)}
MAPPING_ALWAYS = {"mapping": lin(20e-9, 60e9), "ce": lin(8e-6, 30e9)}


def crossover(model, hi=1 << 40):
    """Largest size at which the noise-free mapping cost is <= the ce cost."""
    ok = lambda n: model["mapping"](n) <= model["ce"](n)   # noqa: E731
    if not ok(1):
        return 0
    lo = 1
    if ok(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def _bisect_last(ok, lo=1, hi=1 << 40):
    """Largest n in [lo, hi] with ok(n), for ok true then false (lo-1 if none)."""
    if not ok(lo):
        return lo - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return hi if ok(hi) else lo


def band(model, ratio):
    """Sizes (lo, hi) between which neither path is ``ratio`` times cheaper."""
    m, c = model["mapping"], model["ce"]
    lo = _bisect_last(lambda n: c(n) >= ratio * m(n)) + 1
    hi = _bisect_last(lambda n: m(n) < ratio * c(n))
    return lo, hi


def assert_near_crossover(model, t, ratio=1.15):
    """At threshold ``t`` neither path may be more than ``ratio`` times cheaper."""
    lo, hi = band(model, ratio)
    assert lo <= t <= hi, f"threshold {t} outside [{lo}, {hi}] (crossover {crossover(model)})"


class FakeMeasure:
    """measure(direction, path, nbytes, iters) over per-direction cost models.

    Noise: lognormal per op (``noise``) and per call (``call_noise``), a slow sinusoidal
    drift common to both paths, and whole-call outliers (``outlier_p``, 4x). ``virtual``
    accumulates the simulated time (iters * cost + a per-call overhead) for a virtual
    clock.
    """

    def __init__(self, models, noise=0.05, call_noise=0.03, drift=0.2, outlier_p=0.02,
                 call_overhead_s=20e-6, seed=0):
        self.models = models
        self.noise, self.call_noise, self.drift = noise, call_noise, drift
        self.outlier_p, self.overhead = outlier_p, call_overhead_s
        self.rng = np.random.default_rng(seed)
        self.calls = []
        self.virtual = 0.0

    def __call__(self, direction, path, nbytes, iters):
        assert path in ("mapping", "ce") and nbytes >= 1 and iters >= 1
        self.calls.append((direction, path, nbytes, iters))
        base = self.models[direction][path](nbytes)
        base *= 1 + self.drift * math.sin(len(self.calls) / 5.0)
        k = min(iters, 16)        # per-batch averages, as an engine timing batches may do
        per = base * self.rng.lognormal(0.0, self.noise / math.sqrt(iters / k), k)
        per *= self.rng.lognormal(0.0, self.call_noise)
        if self.rng.random() < self.outlier_p:
            per *= 4
        self.virtual += base * iters + self.overhead
        return per.tolist()

    def clock(self):
        return self.virtual

    def directions_called(self):
        return {c[0] for c in self.calls}


def simulate_engine(picker, model, n_ops, lo, hi, rng, direction="h2d", noise=0.1,
                    outlier_p=0.01, max_records=None):
    """Drive picker.advise()/record() like the transfer engine would: ``n_ops`` transfers
    (or until ``max_records`` timed ones) of log-uniform sizes in [lo, hi]. Returns the
    number of records."""
    records = 0
    llo, lhi = math.log(lo), math.log(hi)
    for _ in range(n_ops):
        n = int(math.exp(rng.uniform(llo, lhi)))
        a = picker.advise(direction, n)
        if a & th.TIMED:
            path = "mapping" if a & th.MAPPING else "ce"
            t = model[path](n) * math.exp(rng.gauss(0.0, noise))
            if rng.random() < outlier_p:
                t *= 5
            picker.record(direction, path, n, t)
            records += 1
            if max_records is not None and records >= max_records:
                break
    return records


def moves(picker, direction="h2d"):
    return picker.state()["directions"][direction]["samples"]["moves"]


IDENT = {"gpu_uuid": "GPU-0a1b2c3d", "driver": "580.159.04", "backend": "nvrm",
         "cpu": "Intel Xeon Platinum 8480+", "numa_node": 0}


@pytest.fixture
def picker_factory(tmp_path):
    def make(**kw):
        kw.setdefault("env", {})
        kw.setdefault("cache_dir", tmp_path / "cache")
        kw.setdefault("identity", IDENT)
        return th.ThresholdPicker(**kw)
    return make


def fast_cal(fake=None, **kw):
    """Calibration keyword arguments for tests. With ``fake``, time is the fake's virtual
    clock, so iteration counts (and hence results) do not depend on this machine's
    speed; the budget is generous so that it never truncates."""
    kw.setdefault("budget_s", 60.0)
    if fake is not None:
        kw.setdefault("clock", fake.clock)
    return kw


# ---------------------------------------------------------------------------------------
# Parsing, overrides, validation
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("4096", 4096), ("4096B", 4096), ("64K", 65536), ("64k", 65536), ("64KiB", 65536),
    ("64 KiB", 65536), ("64kb", 65536), ("1M", 1 << 20), ("2MiB", 2 << 20),
    ("1G", 1 << 30), (" 0 ", 0), (12345, 12345), (np.int64(77), 77),
    ("mapping", th.ALWAYS_MAPPING), ("always-mapping", th.ALWAYS_MAPPING),
    ("Always_Mapping", th.ALWAYS_MAPPING), ("ce", th.ALWAYS_CE), ("ALWAYS-CE", th.ALWAYS_CE),
    (None, None), ("", None), ("auto", None),
])
def test_parse_threshold_accepts_sizes_suffixes_and_words(text, expected):
    assert th.parse_threshold(text) == expected


@pytest.mark.parametrize("bad,exc", [
    ("-1", ValueError), ("1.5K", ValueError), ("64Q", ValueError), ("abc", ValueError),
    ("1T", ValueError), ("K", ValueError), ("64 iB", ValueError), (-5, ValueError),
    (1 << 41, ValueError), (True, TypeError), (4096.0, TypeError), ([4096], TypeError),
    (b"4096", TypeError),
])
def test_parse_threshold_rejects_bad_values_naming_them(bad, exc):
    with pytest.raises(exc) as ei:
        th.parse_threshold(bad, "h2d")
    assert "h2d" in str(ei.value)
    assert repr(bad) in str(ei.value) or str(bad) in str(ei.value)


def test_defaults_are_provisional_and_on_the_mapping_side_of_the_h100_facts():
    p = th.ThresholdPicker(env={})
    assert p.thresholds == dict(th.DEFAULT_THRESHOLDS)
    assert {p.source(d) for d in th.DIRECTIONS} == {"default"}
    for d, model in (("h2d", H100_H2D), ("d2h", H100_D2H)):
        t = p.threshold(d)
        assert p.choose(d, t) is True and p.choose(d, t + 1) is False
        # The provisional value sits below the measured crossover, where the mapping
        # is a clear win (at least 1.5x cheaper than the copy engine).
        assert 0 < t < crossover(model)
        assert model["ce"](t) >= 1.5 * model["mapping"](t)


def test_argument_overrides_fix_threshold_and_disable_adaptation():
    p = th.ThresholdPicker(h2d="8K", d2h="always-ce", env={})
    assert p.threshold("h2d") == 8192 and p.threshold("d2h") == th.ALWAYS_CE
    assert p.source("h2d") == p.source("d2h") == "override"
    assert p.choose("h2d", 8192) and not p.choose("h2d", 8193)
    assert not p.choose("d2h", 0) and not p.choose("d2h", 1)
    q = th.ThresholdPicker(h2d="always-mapping", env={})
    assert q.choose("h2d", 1 << 40) and q.source("d2h") == "default"
    # no probing, no recording for overridden directions
    assert all(p.advise("h2d", 8192) & th.TIMED == 0 for _ in range(2000))
    assert not any(p.should_probe("h2d", 8192) for _ in range(2000))
    assert p.record("h2d", "ce", 8192, 1e-5) is False
    assert p.state()["directions"]["h2d"]["adaptive"] is False


def test_environment_overrides_and_argument_precedence(monkeypatch):
    monkeypatch.setenv("GDRPY_THRESHOLD_H2D", "128K")
    monkeypatch.setenv("GDRPY_THRESHOLD_D2H", "mapping")
    p = th.ThresholdPicker()                       # reads os.environ
    assert p.threshold("h2d") == 128 * 1024 and p.threshold("d2h") == th.ALWAYS_MAPPING
    assert p.source("h2d") == "override"
    q = th.ThresholdPicker(h2d=4096)               # argument wins over the environment
    assert q.threshold("h2d") == 4096 and q.threshold("d2h") == th.ALWAYS_MAPPING
    monkeypatch.setenv("GDRPY_THRESHOLD_H2D", "auto")
    monkeypatch.setenv("GDRPY_THRESHOLD_D2H", "")
    r = th.ThresholdPicker()
    assert r.thresholds == dict(th.DEFAULT_THRESHOLDS)


@pytest.mark.parametrize("var,value", [("GDRPY_THRESHOLD_D2H", "12 apples"),
                                       ("GDRPY_THRESHOLD_H2D", "-4K"),
                                       ("GDRPY_THRESHOLD_H2D", "2048G")])
def test_invalid_environment_value_raises_naming_variable_and_value(var, value):
    with pytest.raises(ValueError) as ei:
        th.ThresholdPicker(env={var: value})
    assert var in str(ei.value) and value in str(ei.value)


def test_hot_path_and_record_validate_arguments():
    p = th.ThresholdPicker(env={})
    for fn in (p.choose, p.advise, p.should_probe):
        with pytest.raises(ValueError, match="'up'"):
            fn("up", 8)
    with pytest.raises(ValueError, match="'dma'"):
        p.record("h2d", "dma", 8, 1e-6)
    with pytest.raises(TypeError, match="nbytes"):
        p.record("h2d", "ce", 8.5, 1e-6)
    with pytest.raises(ValueError, match="-8"):
        p.record("h2d", "ce", -8, 1e-6)
    for s in (0.0, -1e-6, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="seconds"):
            p.record("h2d", "ce", 8, s)
    with pytest.raises(TypeError, match="seconds"):
        p.record("h2d", "ce", 8, "1us")


@pytest.mark.parametrize("kw,exc,word", [
    (dict(probe_every=1), ValueError, "probe_every"),
    (dict(probe_every=8.0), TypeError, "probe_every"),
    (dict(hysteresis=-0.1), ValueError, "hysteresis"),
    (dict(window_factor=1), ValueError, "window_factor"),
    (dict(min_samples=1), ValueError, "min_samples"),
    (dict(confirm=0), ValueError, "confirm"),
    (dict(min_samples=10**6), ValueError, "min_samples"),
    (dict(adapt="yes"), TypeError, "adapt"),
    (dict(identity=["gpu"]), TypeError, "identity"),
    (dict(identity={"gpu": [1, 2]}), TypeError, "gpu"),
    (dict(identity={1: "x"}), TypeError, "keys"),
    (dict(identity={"x": float("nan")}), ValueError, "x"),
    (dict(cache_dir=42), TypeError, "cache_dir"),
    (dict(max_age_s=0), ValueError, "max_age_s"),
    (dict(h2d=3.5), TypeError, "h2d"),
])
def test_constructor_validates_knobs(kw, exc, word):
    kw.setdefault("env", {})
    with pytest.raises(exc, match=word):
        th.ThresholdPicker(**kw)


def test_identity_key_is_order_independent_and_discriminating():
    a = th.identity_key(IDENT)
    assert a == th.identity_key(dict(reversed(list(IDENT.items()))))
    assert a != th.identity_key({**IDENT, "driver": "575.57.08"})
    assert a != th.identity_key({**IDENT, "numa_node": 1})


# ---------------------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------------------

MODELS = {"h100_h2d": H100_H2D, "h100_d2h": H100_D2H, "knee": KNEE, "fast_ce": FAST_CE}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("direction", th.DIRECTIONS)
@pytest.mark.parametrize("seed", [0, 1])
def test_sweep_finds_crossover_within_one_sweep_step(name, direction, seed):
    model = MODELS[name]
    fake = FakeMeasure({direction: model}, seed=seed)
    res = th.calibrate(fake, directions=[direction], refine=False, **fast_cal(fake))
    x, t = crossover(model), res.thresholds[direction]
    sizes = [m.nbytes for m in res.directions[direction].sweep]
    assert t in sizes
    i = sizes.index(t)
    assert sizes[max(i - 1, 0)] <= x < sizes[min(i + 2, len(sizes) - 1)], (x, t)
    assert fake.directions_called() == {direction}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_refinement_narrows_crossover_beyond_sweep_resolution(name, seed):
    model = MODELS[name]
    fake = FakeMeasure({"h2d": model, "d2h": model}, seed=seed)
    res = th.calibrate(fake, **fast_cal(fake))
    for d in th.DIRECTIONS:
        r = res.directions[d]
        t = res.thresholds[d]
        assert r.refinement, "no refinement measurements were taken"
        assert_near_crossover(model, t)
        lo, hi = r.bracket
        assert lo == t and hi > t and hi / lo < 1.34   # narrower than the 1.33x-2x sweep step


def test_two_directions_with_different_models_are_not_mixed():
    fake = FakeMeasure({"h2d": H100_H2D, "d2h": H100_D2H}, seed=3)
    res = th.calibrate(fake, **fast_cal(fake))
    assert_near_crossover(H100_H2D, res.thresholds["h2d"])
    assert_near_crossover(H100_D2H, res.thresholds["d2h"])


def test_one_path_always_faster():
    sizes = [1 << k for k in range(0, 21, 2)]
    fake = FakeMeasure({"h2d": CE_ALWAYS, "d2h": MAPPING_ALWAYS})
    res = th.calibrate(fake, sizes=sizes, early_stop=0, **fast_cal(fake))
    assert res.thresholds["h2d"] == 0 == crossover(CE_ALWAYS)
    assert res.thresholds["d2h"] == sizes[-1]            # mapping won everywhere measured
    assert res.directions["d2h"].bracket is None


def test_sweep_stops_early_once_the_copy_engine_clearly_wins():
    fake = FakeMeasure({"d2h": H100_D2H}, seed=2)
    res = th.calibrate(fake, directions=["d2h"], **fast_cal(fake))
    r = res.directions["d2h"]
    assert r.early_stopped and r.sweep[-1].nbytes <= 64 * crossover(H100_D2H)
    assert all(m.mapping_s >= 1.5 * m.ce_s for m in r.sweep[-3:])
    assert max(c[2] for c in fake.calls) == r.sweep[-1].nbytes   # nothing larger measured
    full = FakeMeasure({"d2h": H100_D2H}, seed=2)
    res = th.calibrate(full, directions=["d2h"], early_stop=0, refine=False, **fast_cal(full))
    assert res.directions["d2h"].sweep[-1].nbytes == 64 << 20
    assert full.virtual > 2 * fake.virtual      # 64 MiB BAR1 reads at 0.8 GB/s are slow


def test_warm_up_call_is_discarded():
    """The first mapping call at each size is 40% slow (first touch of the pages): with
    one round per path, counting that call would push the threshold far down."""
    seen = set()
    fake = FakeMeasure({"h2d": H100_H2D}, noise=0.01, call_noise=0.0, drift=0.0,
                       outlier_p=0.0)

    def cold(direction, path, nbytes, iters):
        out = fake(direction, path, nbytes, iters)
        if path == "mapping" and nbytes not in seen:
            seen.add(nbytes)
            return [v * 1.4 for v in out]
        return out

    res = th.calibrate(cold, directions=["h2d"], repeats=1, **fast_cal(fake))
    assert_near_crossover(H100_H2D, res.thresholds["h2d"])


@pytest.mark.parametrize("verify", [2, 0])
def test_one_spurious_sweep_point_is_caught_by_re_measurement(verify):
    """While the sweep is at 256 KiB (past the ~200 KiB crossover) the mapping looks 30%
    cheaper than it is (a burst of interference on the copy engine, say). Re-measuring
    the bracket's ends catches it; without re-measurement the threshold lands a whole
    sweep step too high."""
    fake = FakeMeasure({"h2d": H100_H2D}, noise=0.01, call_noise=0.0, drift=0.0,
                       outlier_p=0.0)
    spurious = 256 * 1024
    swept_past = []

    def glitch(direction, path, nbytes, iters):
        out = fake(direction, path, nbytes, iters)
        if nbytes > spurious:
            swept_past.append(nbytes)
        if nbytes == spurious and path == "mapping" and not swept_past:
            return [v * 0.7 for v in out]
        return out

    res = th.calibrate(glitch, directions=["h2d"], verify=verify, **fast_cal(fake))
    t = res.thresholds["h2d"]
    sweep = {m.nbytes: m for m in res.directions["h2d"].sweep}
    assert not sweep[spurious].ce_faster                  # the glitch did fool the sweep
    if verify:
        assert_near_crossover(H100_H2D, t, 1.10)
        assert any("did not confirm" in n for n in res.notes)
    else:
        assert t >= spurious                              # what verification prevents


@pytest.mark.parametrize("repeats", [2, 5])
def test_paths_are_interleaved_to_cancel_drift(repeats):
    """Costs ramp up by 30% of the base with every call at a size; ce is 4% cheaper
    throughout. Measuring all mapping rounds first, or always mapping first in each
    round, would make the mapping look cheaper."""
    model = {"mapping": lambda n: 1.04e-6, "ce": lambda n: 1.0e-6}
    per_size = {}

    def ramp(direction, path, nbytes, iters):
        j = per_size[nbytes] = per_size.get(nbytes, -1) + 1
        return [model[path](nbytes) * (1 + 0.3 * j)] * 3

    res = th.calibrate(ramp, sizes=[64, 128, 256, 512], directions=["d2h"], repeats=repeats,
                       early_stop=0, refine=False, **fast_cal())
    assert all(m.ce_faster for m in res.directions["d2h"].sweep)
    assert res.thresholds["d2h"] == 0


def test_iterations_adapt_to_cost_and_default_budget_is_well_under_ten_seconds():
    fake = FakeMeasure({"h2d": H100_H2D, "d2h": H100_D2H}, seed=4)
    res = th.calibrate(fake, clock=fake.clock)        # default sizes and budget
    assert res.duration_s == pytest.approx(fake.virtual)
    assert fake.virtual < 5.0 and not res.truncated
    models = {"h2d": H100_H2D, "d2h": H100_D2H}
    for d in th.DIRECTIONS:
        sweep = res.directions[d].sweep
        assert sweep[0].iters_mapping > 10 * sweep[-1].iters_mapping   # cheap ops: many
        for m in sweep:          # no sample runs far past the 2 ms per-sample target
            for path, iters in (("mapping", m.iters_mapping), ("ce", m.iters_ce)):
                assert iters == 1 or iters * models[d][path](m.nbytes) < 4 * 2e-3


@pytest.mark.parametrize("budget", [0.02, 0.1, 0.5])
def test_budget_respected_with_slow_measure_virtual_clock(budget):
    slow = {"mapping": lin(50e-6, 0.05e9), "ce": lin(200e-6, 1e9)}   # a very slow host
    fake = FakeMeasure({"h2d": slow, "d2h": slow}, call_overhead_s=1e-3, seed=5)
    res = th.calibrate(fake, clock=fake.clock, budget_s=budget)
    # each call is predicted from the last one at that path; allow one call's overrun
    assert fake.virtual <= budget * 1.1 + 2e-3
    assert res.duration_s <= budget * 1.1 + 2e-3
    assert res.truncated and res.notes
    assert all(isinstance(t, int) and t >= 0 for t in res.thresholds.values())


def test_budget_respected_in_wall_time_with_sleeping_measure():
    def sleepy(direction, path, nbytes, iters):
        time.sleep(0.004)
        return [1e-6 * (2 if path == "ce" else 1)]

    t0 = time.perf_counter()
    res = th.calibrate(sleepy, budget_s=0.25)
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.25 + 0.1
    assert res.truncated


def test_progress_callback_is_monotonic_and_failures_do_not_abort():
    fake = FakeMeasure({"h2d": H100_H2D, "d2h": H100_D2H})
    seen = []
    th.calibrate(fake, progress=lambda f, msg: seen.append((f, msg)), **fast_cal(fake))
    fr = [f for f, _ in seen]
    assert len(fr) > 20 and fr[-1] == 1.0 and all(0 <= f <= 1 for f in fr)
    assert all(a <= b for a, b in zip(fr, fr[1:], strict=False))
    assert all(isinstance(m, str) and m for _, m in seen)

    def broken(f, msg):
        raise RuntimeError("terminal went away")
    fake = FakeMeasure({"h2d": H100_H2D})
    res = th.calibrate(fake, directions=["h2d"], progress=broken, **fast_cal(fake))
    assert_near_crossover(H100_H2D, res.thresholds["h2d"])


@pytest.mark.parametrize("kw,exc,word", [
    (dict(measure=42), TypeError, "measure"),
    (dict(sizes=[0, 8]), ValueError, "sizes"),
    (dict(sizes=[]), ValueError, "sizes"),
    (dict(sizes=[8, 2.5]), TypeError, "sizes"),
    (dict(directions="h2d"), TypeError, "directions"),
    (dict(directions=["h2d", "h2d"]), ValueError, "duplicates"),
    (dict(directions=["sideways"]), ValueError, "sideways"),
    (dict(repeats=0), ValueError, "repeats"),
    (dict(verify=-1), ValueError, "verify"),
    (dict(budget_s=0), ValueError, "budget_s"),
    (dict(budget_s=float("nan")), ValueError, "budget_s"),
    (dict(progress="bar"), TypeError, "progress"),
])
def test_calibrate_validates_arguments(kw, exc, word):
    kw.setdefault("measure", FakeMeasure({"h2d": H100_H2D, "d2h": H100_D2H}))
    with pytest.raises(exc, match=word):
        th.calibrate(**kw)


@pytest.mark.parametrize("bad", [[], [float("nan")], [-1e-6], None, ["x"]])
def test_measure_returning_garbage_is_reported(bad, picker_factory):
    def broken(direction, path, nbytes, iters):
        return bad
    with pytest.raises((ValueError, TypeError), match="measure"):
        th.calibrate(broken, **fast_cal())
    p = picker_factory()
    assert p.load_or_calibrate(broken, **fast_cal()) == "default"     # never crashes
    assert "calibration failed" in p.reason and "measure" in p.reason
    assert p.thresholds == dict(th.DEFAULT_THRESHOLDS)


def test_measure_raising_falls_back_to_defaults_but_bad_arguments_raise(picker_factory):
    def no_gpu(direction, path, nbytes, iters):
        raise RuntimeError("CUDA_ERROR_NO_DEVICE")
    with pytest.raises(RuntimeError, match="NO_DEVICE"):
        th.calibrate(no_gpu, **fast_cal())                     # propagates from calibrate()
    p = picker_factory()
    assert p.load_or_calibrate(no_gpu, **fast_cal()) == "default"
    assert "RuntimeError: CUDA_ERROR_NO_DEVICE" in p.reason
    fake = FakeMeasure({"h2d": H100_H2D, "d2h": H100_D2H})
    with pytest.raises(ValueError, match="repeats"):
        p.load_or_calibrate(fake, repeats=0)
    with pytest.raises(TypeError):
        p.load_or_calibrate(fake, budget=3)                    # misspelt keyword


# ---------------------------------------------------------------------------------------
# Persistence
# ---------------------------------------------------------------------------------------

def test_cache_round_trip(picker_factory):
    fake = FakeMeasure({"h2d": H100_H2D, "d2h": H100_D2H}, seed=6)
    a = picker_factory()
    assert a.load_or_calibrate(fake, **fast_cal(fake)) == "calibration"
    assert a.cache_file.is_file() and {a.source(d) for d in th.DIRECTIONS} == {"calibration"}
    doc = json.loads(a.cache_file.read_text())
    assert doc["schema"] == th.SCHEMA_VERSION and doc["identity"] == IDENT
    assert not [f for f in os.listdir(a.cache_file.parent) if f.endswith(".tmp")]

    n_calls = len(fake.calls)
    b = picker_factory()
    assert b.load_or_calibrate(fake, **fast_cal(fake)) == "cache"
    assert len(fake.calls) == n_calls                   # no measuring on a cache hit
    assert b.thresholds == a.thresholds
    assert {b.source(d) for d in th.DIRECTIONS} == {"cache"}
    st = b.state()
    assert st["calibration"]["duration_s"] == pytest.approx(a.state()["calibration"]["duration_s"])
    assert st["identity"] == IDENT and "loaded" in st["reason"]
    json.dumps(st)                                      # introspection is JSON-able


def test_loading_creates_nothing(picker_factory, tmp_path):
    p = picker_factory()
    assert p.load() is False and "no cache file" in p.reason
    assert not (tmp_path / "cache").exists()          # no directory, no lock file
    fake = FakeMeasure({"h2d": H100_H2D, "d2h": H100_D2H})
    p.calibrate(fake, **fast_cal(fake))               # a save creates both
    before = sorted(f.name for f in (tmp_path / "cache").iterdir())
    assert picker_factory().load() is True
    assert sorted(f.name for f in (tmp_path / "cache").iterdir()) == before


@pytest.mark.parametrize("hide_platformdirs", [False, True], ids=["as-installed", "fallback"])
def test_cache_dir_resolution(monkeypatch, tmp_path, hide_platformdirs):
    # fallback: gdrpy installed without its dependencies (pip --no-deps, as on
    # the GPU machines) follows the same XDG rule without platformdirs
    if hide_platformdirs:
        monkeypatch.setitem(sys.modules, "platformdirs", None)
    for v in ("GDRPY_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert th.cache_dir() == tmp_path / "home" / ".cache" / "gdrpy"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert th.cache_dir() == tmp_path / "home" / ".cache" / "gdrpy"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert th.cache_dir() == tmp_path / "xdg" / "gdrpy"
    monkeypatch.setenv("GDRPY_CACHE_DIR", str(tmp_path / "explicit"))
    assert th.cache_dir() == tmp_path / "explicit"
    p = th.ThresholdPicker(identity=IDENT)
    assert p.cache_file.parent == tmp_path / "explicit"
    p.calibrate(fake := FakeMeasure({"h2d": H100_H2D, "d2h": H100_D2H}), **fast_cal(fake))
    assert p.cache_file.is_file()


def _valid_doc(picker_factory):
    p = picker_factory()
    p.calibrate(fake := FakeMeasure({"h2d": H100_H2D, "d2h": H100_D2H}), **fast_cal(fake))
    return p.cache_file, json.loads(p.cache_file.read_text())


def _mutate(doc, path, value):
    d = doc
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    return doc


BAD_CACHES = {
    "truncated": (lambda raw, doc: raw[: len(raw) // 2], "corrupt"),
    "empty": (lambda raw, doc: b"", "corrupt"),
    "binary": (lambda raw, doc: b"\xff\xfe\x00garbage", "corrupt"),
    "not_object": (lambda raw, doc: b"[1, 2, 3]", "not a gdrpy"),
    "wrong_kind": (lambda raw, doc: _mutate(doc, ["kind"], "other"), "not a gdrpy"),
    "wrong_schema": (lambda raw, doc: _mutate(doc, ["schema"], 999), "schema"),
    "schema_string": (lambda raw, doc: _mutate(doc, ["schema"], "1"), "schema"),
    "identity_mismatch": (lambda raw, doc: _mutate(doc, ["identity", "driver"], "1.0"),
                          "identity mismatch"),
    "identity_wrong_type": (lambda raw, doc: _mutate(doc, ["identity"], ["x"]), "identity"),
    "threshold_string": (lambda raw, doc: _mutate(doc, ["directions", "h2d", "threshold"],
                                                  "65536"), "not an integer"),
    "threshold_bool": (lambda raw, doc: _mutate(doc, ["directions", "d2h", "threshold"],
                                                True), "not an integer"),
    "threshold_negative": (lambda raw, doc: _mutate(doc, ["directions", "h2d", "threshold"],
                                                    -5), "absurd"),
    "threshold_huge": (lambda raw, doc: _mutate(doc, ["directions", "d2h", "threshold"],
                                                1 << 50), "absurd"),
    "bad_source": (lambda raw, doc: _mutate(doc, ["directions", "h2d", "source"], "guess"),
                   "source"),
    "directions_list": (lambda raw, doc: _mutate(doc, ["directions"], []), "directions"),
    "unknown_direction": (lambda raw, doc: _mutate(doc, ["directions", "p2p"], {}),
                          "unknown direction"),
    "sweep_nan": (lambda raw, doc: _mutate(doc, ["directions", "h2d", "sweep"],
                                           [[1, float("nan"), 1.0]]), "sweep"),
    "future": (lambda raw, doc: _mutate(doc, ["created"], time.time() + 10 * 86400), "future"),
    "duration_absurd": (lambda raw, doc: _mutate(doc, ["calibration", "duration_s"], -3),
                        "absurd"),
}


@pytest.mark.parametrize("case", sorted(BAD_CACHES))
def test_bad_cache_file_is_reported_and_recalibrated(case, picker_factory):
    f, doc = _valid_doc(picker_factory)
    mutate, words = BAD_CACHES[case]
    raw = f.read_bytes()
    out = mutate(raw, doc)
    f.write_bytes(out if isinstance(out, bytes) else json.dumps(out).encode())

    p = picker_factory()
    assert p.load() is False
    assert words in p.reason, p.reason
    assert p.thresholds == dict(th.DEFAULT_THRESHOLDS)          # nothing half-applied
    fake = FakeMeasure({"h2d": H100_H2D, "d2h": H100_D2H}, seed=7)
    assert p.load_or_calibrate(fake, **fast_cal(fake)) == "calibration"
    assert words in p.reason and fake.calls
    q = picker_factory()                                       # the file was repaired
    assert q.load() is True and q.thresholds == p.thresholds


def test_cache_of_another_identity_is_not_used(picker_factory, tmp_path):
    a = picker_factory()
    a.calibrate(fake := FakeMeasure({"h2d": H100_H2D, "d2h": H100_D2H}), **fast_cal(fake))
    other = {**IDENT, "gpu_uuid": "GPU-ffff"}
    b = picker_factory(identity=other)
    assert b.cache_file != a.cache_file
    assert b.load() is False and "no cache file" in b.reason
    b.cache_file.write_bytes(a.cache_file.read_bytes())    # a copied file
    assert b.load() is False and "identity mismatch" in b.reason and "gpu_uuid" in b.reason


def test_missing_and_unreadable_cache_never_crash(picker_factory, tmp_path):
    p = picker_factory()
    assert p.load() is False and "no cache file" in p.reason
    assert p.load_or_calibrate(None) == "default" and "provisional" in p.reason
    (tmp_path / "blocker").write_text("a file where the cache directory should be")
    q = picker_factory(cache_dir=tmp_path / "blocker" / "sub")
    assert q.load() is False
    fake = FakeMeasure({"h2d": H100_H2D, "d2h": H100_D2H})
    assert q.load_or_calibrate(fake, **fast_cal(fake)) == "calibration"   # works, unsaved
    assert q.save() is False and "cannot" in q.reason
    r = th.ThresholdPicker(env={})                              # no identity
    assert r.load() is False and "persistence disabled" in r.reason
    assert r.load_or_calibrate(fake, **fast_cal(fake)) == "calibration"


def test_max_age_expires_cache(picker_factory):
    f, doc = _valid_doc(picker_factory)
    doc["created"] = time.time() - 3600
    f.write_text(json.dumps(doc))
    assert picker_factory(max_age_s=7200).load() is True
    p = picker_factory(max_age_s=60)
    assert p.load() is False and "older than" in p.reason


def test_partial_cache_calibrates_only_the_missing_direction(picker_factory):
    a = picker_factory(h2d="always-ce")                  # h2d overridden: only d2h measured
    fake = FakeMeasure({"h2d": H100_H2D, "d2h": H100_D2H})
    assert a.load_or_calibrate(fake, **fast_cal(fake)) == "calibration"
    assert fake.directions_called() == {"d2h"}
    assert a.threshold("h2d") == th.ALWAYS_CE

    fake2 = FakeMeasure({"h2d": H100_H2D, "d2h": H100_D2H})
    b = picker_factory()
    assert b.load() is False and "no entry for h2d" in b.reason
    assert b.load_or_calibrate(fake2, **fast_cal(fake2)) == "calibration"
    assert fake2.directions_called() == {"h2d"}
    assert a.uncalibrated() == [] and picker_factory().uncalibrated() == ["h2d", "d2h"]
    assert picker_factory(d2h=0).uncalibrated() == ["h2d"]
    assert b.threshold("d2h") == a.threshold("d2h") and b.source("d2h") == "cache"
    c = picker_factory()
    assert c.load() is True                                # both entries now stored


def test_concurrent_load_or_calibrate_measures_once(picker_factory):
    """Six pickers of one identity start at once: one measures, five load its result."""
    pytest.importorskip("filelock", reason="without filelock the cache is written unlocked")
    lock = threading.Lock()
    measuring_threads = set()
    fake = FakeMeasure({"h2d": H100_H2D, "d2h": H100_D2H})

    def measure(direction, path, nbytes, iters):
        with lock:
            measuring_threads.add(threading.get_ident())
            return fake(direction, path, nbytes, iters)

    pickers = [picker_factory() for _ in range(6)]
    outcomes = []
    barrier = threading.Barrier(len(pickers))

    def go(p):
        barrier.wait()
        outcomes.append(p.load_or_calibrate(measure, **fast_cal(fake)))
    threads = [threading.Thread(target=go, args=(p,)) for p in pickers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["cache"] * 5 + ["calibration"]
    assert len(measuring_threads) == 1
    assert len({tuple(sorted(p.thresholds.items())) for p in pickers}) == 1


def test_concurrent_saves_leave_a_valid_file(picker_factory):
    pickers = []
    for i in range(8):
        p = picker_factory()
        with p._lock:
            p._st["h2d"].persist = {"threshold": 1000 + i, "source": "adapted", "sweep": [],
                                    "time": time.time()}
        pickers.append(p)
    barrier = threading.Barrier(len(pickers))

    def go(p):
        barrier.wait()
        for _ in range(5):
            assert p.save()
    threads = [threading.Thread(target=go, args=(p,)) for p in pickers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    q = picker_factory()
    q.load()
    assert 1000 <= q.threshold("h2d") < 1008
    assert not [f for f in os.listdir(q.cache_file.parent) if f.endswith(".tmp")]


# ---------------------------------------------------------------------------------------
# Online adaptation
# ---------------------------------------------------------------------------------------

D2H_FAST_READS = {"mapping": lin(0.3e-6, 4e9), "ce": H100_D2H["ce"]}


@pytest.mark.parametrize("direction,before,after", [
    ("h2d", H100_H2D, FAST_CE),          # crossover ~200 KiB, then ~42 KiB
    ("d2h", H100_D2H, D2H_FAST_READS),   # crossover ~5 KiB, then ~30 KiB
])
def test_adaptation_follows_a_shifted_cost_model(direction, before, after):
    rng = random.Random(11)
    p = th.ThresholdPicker(env={}, seed=11)
    x0, x1 = crossover(before), crossover(after)
    assert max(x0, x1) / min(x0, x1) > 4          # the shift is large enough to tell
    budget = 4000                                 # records allowed per phase
    # Phase 1: from the provisional default to the model's crossover.
    recs = simulate_engine(p, before, 10**7, 64, 8 << 20, rng, direction, max_records=budget)
    t0 = p.threshold(direction)
    assert recs == budget and p.source(direction) == "adapted"
    # With a 10% margin and 2 standard errors at 10% noise, the threshold settles where
    # neither path is more than ~25% cheaper: inside the 1.3x band around the crossover.
    lo, hi = band(before, 1.3)
    assert lo <= t0 <= hi and lo <= x0 <= hi, (lo, x0, t0, hi)
    # Phase 2: the cost model shifts; the threshold follows within the same budget.
    simulate_engine(p, after, 10**7, 64, 8 << 20, rng, direction, max_records=budget)
    t1 = p.threshold(direction)
    lo, hi = band(after, 1.3)
    assert lo <= t1 <= hi, (lo, x1, t1, hi)
    assert not band(before, 1.3)[0] <= t1 <= band(before, 1.3)[1]   # it did move out
    m = p.state()["directions"][direction]["samples"]["recent_moves"]
    assert m and all(1 <= rec <= 2 * budget for rec, _, _ in m)


def test_hysteresis_prevents_flapping_under_noisy_equal_costs():
    """Both paths cost the same; timings are very noisy (lognormal sigma 0.4, 3% of them
    5x outliers). Ten runs of 150k transfers must never move the threshold. Control: the
    same runs without the confidence requirement and with single-round verdicts do."""
    equal = {"mapping": lin(5e-6, 30e9), "ce": lin(5e-6, 30e9)}

    def total_moves(**kw):
        n = 0
        for seed in range(10):
            p = th.ThresholdPicker(env={}, seed=seed, **kw)
            recs = simulate_engine(p, equal, 150_000, 1024, 1 << 20, random.Random(seed),
                                   noise=0.4, outlier_p=0.03)
            assert recs > 1500
            n += moves(p)
            assert kw or p.threshold("h2d") == th.DEFAULT_THRESHOLDS["h2d"]
        return n

    assert total_moves() == 0
    assert total_moves(confidence=0.0, confirm=1) > 5


def test_small_differences_inside_the_margin_do_not_move_the_threshold():
    # ce 6% faster than the mapping at every size: inside the 10% margin.
    close = {"mapping": lin(6e-6, 30e9), "ce": lambda n: (6e-6 + n / 30e9) / 1.06}
    p = th.ThresholdPicker(env={}, seed=2)
    simulate_engine(p, close, 150_000, 1024, 1 << 20, random.Random(2), noise=0.05)
    assert moves(p) == 0
    # Control: the same evidence without the margin does move it (down, towards ce).
    q = th.ThresholdPicker(env={}, seed=2, hysteresis=0.0, confidence=0.0)
    simulate_engine(q, close, 150_000, 1024, 1 << 20, random.Random(2), noise=0.05)
    assert moves(q) > 0 and q.threshold("h2d") < th.DEFAULT_THRESHOLDS["h2d"]


def test_probe_schedule_is_deterministic_rate_limited_and_windowed():
    def schedule(seed, n):
        p = th.ThresholdPicker(env={}, seed=seed, probe_every=32)
        return [p.advise("h2d", n) for _ in range(20_000)], p
    a, pa = schedule(5, 64 * 1024)
    b, _ = schedule(5, 64 * 1024)
    c, _ = schedule(6, 64 * 1024)
    assert a == b and a != c
    probes = sum(1 for v in a if v & th.TIMED and not v & th.MAPPING)   # ce at T: a probe
    samples = sum(1 for v in a if v & th.TIMED and v & th.MAPPING)
    assert 20_000 / 32 * 0.8 < probes < 20_000 / 32 * 1.25
    assert abs(probes - samples) <= 1
    t = pa.threshold("h2d")
    assert pa.in_window("h2d", t // 4 + 1) and pa.in_window("h2d", t * 4)
    assert not pa.in_window("h2d", t // 8) and not pa.in_window("h2d", t * 8)
    far, _ = schedule(5, 64)                                          # far below T
    assert all(v == th.MAPPING for v in far)
    p = th.ThresholdPicker(env={}, seed=5, probe_every=32)
    n_probe = sum(p.should_probe("h2d", 65536) for _ in range(20_000))
    assert n_probe == probes                                 # same schedule, probes only
    assert not any(p.should_probe("h2d", 1 << 24) for _ in range(5000))


def test_out_of_window_and_disabled_adaptation_samples_are_dropped():
    p = th.ThresholdPicker(env={})
    assert p.record("h2d", "ce", 16, 1e-6) is False
    assert p.record("h2d", "ce", 65536, 1e-6) is True
    s = p.state()["directions"]["h2d"]["samples"]
    assert s["ignored"] == 1 and s["recorded"] == 1
    q = th.ThresholdPicker(env={}, adapt=False)
    assert q.record("h2d", "ce", 65536, 1e-6) is False
    assert all(q.advise("h2d", 65536) & th.TIMED == 0 for _ in range(1000))


def test_adapted_threshold_persists(picker_factory):
    p = picker_factory(seed=3)
    simulate_engine(p, FAST_CE, 100_000, 1024, 1 << 20, random.Random(3))
    assert p.source("h2d") == "adapted" and p.threshold("h2d") != th.DEFAULT_THRESHOLDS["h2d"]
    assert p.save()
    q = picker_factory()
    q.load()
    assert q.threshold("h2d") == p.threshold("h2d") and q.source("h2d") == "cache"


def test_calibration_resets_adaptation_and_sets_source(picker_factory):
    p = picker_factory()
    simulate_engine(p, FAST_CE, 30_000, 1024, 1 << 20, random.Random(1))
    p.calibrate(fake := FakeMeasure({"h2d": H100_H2D, "d2h": H100_D2H}), **fast_cal(fake))
    st = p.state()
    assert st["directions"]["h2d"]["source"] == "calibration"
    assert st["directions"]["h2d"]["samples"]["buckets"] == []
    assert st["calibration"]["time"] <= time.time() and st["calibration"]["duration_s"] > 0
    with pytest.raises(ValueError, match="overridden"):
        picker_factory(h2d=1, d2h=2).calibrate(FakeMeasure({}))


def test_concurrent_record_and_choose_from_threads():
    p = th.ThresholdPicker(env={}, probe_every=4)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    errors, calls = [], []
    stop = threading.Event()

    def engine(seed):
        rng = random.Random(seed)
        n_rec = 0
        try:
            for i in range(10_000):
                n = int(math.exp(rng.uniform(math.log(1024), math.log(1 << 20))))
                a = p.advise("h2d", n)
                if a & th.TIMED:
                    path = "mapping" if a & th.MAPPING else "ce"
                    # mapping gets much faster halfway: the threshold keeps moving
                    m = FAST_CE if i < 5_000 else H100_H2D
                    p.record("h2d", path, n, m[path](n) * math.exp(rng.gauss(0, 0.1)))
                    n_rec += 1
        except Exception as e:   # pragma: no cover - reported below
            errors.append(e)
        calls.append(n_rec)

    def reader():
        try:
            i = 0
            while not stop.is_set():
                r = p.choose("h2d", 100_000)
                assert r is True or r is False
                i += 1
                if i % 200 == 0:
                    json.dumps(p.state())
        except Exception as e:   # pragma: no cover
            errors.append(e)

    try:
        threads = [threading.Thread(target=engine, args=(s,)) for s in range(4)]
        readers = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads + readers:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        for t in readers:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors
    s = p.state()["directions"]["h2d"]["samples"]
    assert s["recorded"] + s["ignored"] == sum(calls)     # no record lost or doubled
    assert s["moves"] > 0
