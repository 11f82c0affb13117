"""The trading feed (examples/trading_feed.py, examples/feed/): integrity at the
highest rate, exact loss accounting under injected overload, C and Python
handlers agreeing, the sweep's outputs.  Each test runs the example as a
subprocess with --json and checks the records; the sim variants run
everywhere (a CPU thread stands in for the kernel), the ``gpu`` ones run the
kernel.  No timing is asserted: the sweep reports it."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from test_examples import EXAMPLES, ROOT, SIM_LABEL, run

FEED = [sys.executable, os.path.join(EXAMPLES, "trading_feed.py")]
BACKENDS = [pytest.param("sim", id="sim"), pytest.param(None, id="gpu", marks=pytest.mark.gpu)]


def feed(args, backend, timeout=240, expect_rc=0):
    cmd = FEED + ["--json", "-"] + args + (["--backend", backend] if backend else [])
    _, out, err = run(cmd, timeout=timeout, expect_rc=expect_rc,
                       env_extra={"PYTHONPATH": ROOT})
    rep = json.loads(out)
    return rep, err


def feed_module(name: str):
    """A module of examples/feed (engine, osinfo, ...)."""
    sys.path.insert(0, os.path.join(EXAMPLES, "feed"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def describe(r):
    keep = ("handler", "path", "source", "offered_per_s", "error", "consumer_status", "loss",
            "ring", "consumer", "handler_stats", "sender")
    return json.dumps({k: r.get(k) for k in keep}, indent=1, default=str)


def assert_clean(r):
    """No torn, reordered or duplicated tick reached the consumer; it consumed
    exactly what the handler forwarded; every lost tick is accounted for."""
    c, st, lo = r["consumer"], r["handler_stats"], r["loss"]
    assert r["error"] is None, describe(r)
    assert r["consumer_status"] == "stopped" and c["final"], describe(r)
    assert c["torn"] == 0 and c["backward"] == 0 and c["badlen"] == 0, describe(r)
    assert c["processed"] == st["forwarded"], describe(r)
    assert lo["accounted"], describe(r)
    assert r["checks_ok"], describe(r)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("handler", ["c", "py"])
@pytest.mark.parametrize("slots", ["ll", "plain"])
def test_feed_no_torn_reordered_or_duplicated_ticks_at_full_speed(backend, handler, slots):
    # rate 0: the shm sender publishes as fast as it can; the NIC-style ring
    # drops what does not fit (counted), the channel ring pushes back.  The
    # gdrpy path's channel in either slot format (the kernel and the sim
    # consumer take both); the cuMemcpy path always writes PLAIN's layout.
    rep, _ = feed(["--handlers", handler, "--paths", "gdrpy,cuMemcpy", "--sources", "shm",
                     "--rate", "0", "--ticks", "300000", "--seconds", "3", "--slots", slots],
                  backend)
    assert len(rep["points"]) == 2
    for r in rep["points"]:
        assert r["slot_format"] == (slots if r["path"] == "gdrpy" else "plain"), describe(r)
        assert_clean(r)
        lo = r["loss"]
        assert lo["generated"] == 300000, describe(r)
        # the only loss possible is the producer's ring-full drop, and it is exact
        assert lo["lost"] == lo["shm_ring_full"], describe(r)
        assert lo["consumer_missing"] == lo["handler_missing"], describe(r)
        if r["sim"]:
            assert rep["consumer"] == SIM_LABEL


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", ["udp", "shm"])
def test_feed_injected_loss_is_counted_exactly(backend, source):
    rep, _ = feed(["--handlers", "c,py", "--paths", "gdrpy", "--sources", source,
                     "--rate", "20000", "--ticks", "7000", "--seconds", "3",
                     "--inject-skip", "9"], backend)
    for r in rep["points"]:
        assert_clean(r)
        lo = r["loss"]
        assert lo["generated"] == 7000 and lo["injected"] == 7000 // 9, describe(r)
        assert lo["lost"] == lo["injected"], describe(r)
        # 7000 is not a multiple of 9: every skipped seq has a later one
        assert lo["handler_missing"] == lo["injected"] and lo["missing_at_tail"] == 0
        assert lo["consumer_missing"] == lo["handler_missing"], describe(r)
        assert r["handler_stats"]["gaps"] == lo["injected"], describe(r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_feed_slow_consumer_overload_loss_is_exact(backend):
    # a consumer that spends 20 us a tick against 100k ticks/s: the channel
    # ring fills (back-pressure, counted), the handler stalls, the shm
    # producer's ring overflows and drops (counted by the producer); what the
    # producer dropped is exactly what the handler and the consumer miss
    rep, _ = feed(["--handlers", "c,py", "--paths", "gdrpy", "--sources", "shm",
                     "--rate", "100000", "--ticks", "15000", "--seconds", "3",
                     "--ring", "256", "--shm-slots", "1024", "--consumer-delay-ns", "20000"],
                    backend)
    for r in rep["points"]:
        assert_clean(r)
        lo = r["loss"]
        assert r["ring"]["full_events"] > 0, describe(r)
        assert lo["shm_ring_full"] > 0, describe(r)
        assert lo["lost"] == lo["shm_ring_full"], describe(r)
        assert lo["handler_missing"] + lo["missing_at_tail"] == lo["lost"], describe(r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_feed_ring_full_drop_policy_counts_every_tick(backend):
    rep, _ = feed(["--handlers", "c,py", "--paths", "gdrpy", "--sources", "udp",
                     "--rate", "50000", "--ticks", "5000", "--seconds", "3", "--ring", "16",
                     "--batch", "16", "--on-full", "drop", "--consumer-delay-ns", "50000"],
                    backend)
    for r in rep["points"]:
        assert_clean(r)
        lo = r["loss"]
        assert lo["handler_ring_full_dropped"] > 0, describe(r)
        assert lo["lost"] == (lo["handler_missing"] + lo["missing_at_tail"]
                              + lo["handler_ring_full_dropped"]), describe(r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_feed_c_and_python_handlers_agree_on_both_paths(backend):
    rep, _ = feed(["--handlers", "c,py", "--paths", "gdrpy,cuMemcpy", "--sources", "shm",
                     "--rate", "50000", "--ticks", "5000", "--seconds", "5",
                     "--symbols", "37"], backend)
    pts = rep["points"]
    assert len(pts) == 4
    for r in pts:
        assert_clean(r)
        assert r["loss"]["lost"] == 0 and r["loss"]["generated"] == 5000, describe(r)
        assert r["reference_match"], describe(r)      # exact per-symbol sums vs the CPU
    assert len({r["sums_digest"] for r in pts}) == 1
    assert rep["results_agree"]


@pytest.mark.parametrize("pace", ["yield", "sleep", "spin"])
def test_feed_packed_datagrams_and_sender_pacing(pace):
    # 4 ticks a datagram (the END packet is then shorter than a datagram: the
    # Python handler's odd-datagram path) with injected gaps, under each
    # pacing of the sender: clean, loss exact, both handlers the same
    rep, _ = feed(["--handlers", "c,py", "--paths", "gdrpy", "--sources", "udp",
                   "--rate", "40000", "--ticks", "6001", "--seconds", "3", "--per-packet", "4",
                   "--inject-skip", "13", "--pace", pace, "--stages"], "sim")
    pts = rep["points"]
    assert len(pts) == 2
    for r in pts:
        assert_clean(r)
        lo, snd, st = r["loss"], r["sender"], r["handler_stats"]
        assert lo["generated"] == 6001 and lo["lost"] == lo["injected"] == 6001 // 13, describe(r)
        assert st["end_seen"] == 1 and st["snd_generated"] == 6001, describe(r)
        assert snd["pace"] == pace and snd["max_gap_us"] > 0, describe(r)
        assert st["max_gap_ns"] > 0 and r["collector"]["max_gap_ns"] > 0, describe(r)
    py = next(r for r in pts if r["handler"] == "py")
    assert py["handler_stats"]["python_threads"] == 1, describe(py)   # nothing else takes the GIL
    assert len({r["sums_digest"] for r in pts}) == 1


def sender_stamps(arrivals: str, rate: float, seconds: float, seed: int = 7):
    """Runs feed_sender into a shared-memory ring large enough for every
    tick (nothing drains it) and returns its JSON line and every tick's
    send stamp (ns), in seq order."""
    import mmap
    import struct

    import numpy as np
    engine = feed_module("engine")
    engine.build()
    nslots = 1 << 16
    size = engine.SHM_HDR + nslots * engine.SHM_SLOT
    fd = os.memfd_create("feed-test", 0)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as m:
            struct.pack_into("<QQ", m, 0, engine.SHM_MAGIC, nslots)
            out = subprocess.run(
                [os.path.join(engine.BUILD, "feed_sender"), "--mode", "shm", "--shm-fd", str(fd),
                 "--rate", str(rate), "--seconds", str(seconds), "--pace", "spin",
                 "--seed", str(seed), "--arrivals", arrivals],
                pass_fds=(fd,), capture_output=True, text=True, timeout=60, check=True).stdout
            snd = json.loads(out.strip().splitlines()[-1])
            n = snd["sent"]
            assert 0 < n < nslots and snd["dropped_ring_full"] == 0, snd
            ticks = np.frombuffer(m[engine.SHM_HDR:engine.SHM_HDR + n * engine.SHM_SLOT],
                                  dtype=np.uint64).reshape(n, engine.SHM_SLOT // 8)
            assert (ticks[:, 0] == np.arange(1, n + 1)).all(), "seqs out of order"
            return snd, ticks[:, 1].astype(np.int64)
    finally:
        os.close(fd)


def due_times(arrivals: str, rate: float, n: int, seed: int):
    """The sender's schedule rebuilt here (feed_sender.c, sched_*): seq k+1
    is due this many ns after the start.  Poisson: splitmix64 from the
    seed (feed.h's mixer, engine._mix64), gaps -ln(u) / rate, summed in
    order as the sender does; even: k / rate."""
    import numpy as np
    if arrivals == "even":
        return (np.arange(n) * (1e9 / rate)).astype(np.int64)
    mix64 = feed_module("engine")._mix64
    with np.errstate(over="ignore"):
        states = (np.uint64((seed ^ 0x5851F42D4C957F2D) & (2**64 - 1))
                  + np.arange(1, n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
        z = mix64(states)
    u = ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53
    gaps = -np.log(u) * 1e9 / rate
    return np.concatenate(([0.0], np.cumsum(gaps))).astype(np.int64)


def lag_against(stamps, due):
    """How late each tick went out against a schedule, taking the start as
    the first tick's stamp (due at once; the true start is at most that)."""
    return stamps - stamps[0] - due


def test_feed_sender_poisson_arrivals_follow_the_seeded_schedule():
    # A sender never sends a tick before it is due, however busy the host:
    # its stamps must never come before the schedule rebuilt here (50 us of
    # slack for the start), and on average follow it.  Other schedules must
    # fail that check (the sender would have sent before them).  The
    # rebuilt Poisson schedule has exponential gaps at the rate: ~39% under
    # half the mean (1 - e^-0.5), ~13.5% over twice it (e^-2).
    import numpy as np
    rate, secs = 20000.0, 0.5
    for arrivals in ("poisson", "even"):
        snd, t = sender_stamps(arrivals, rate, secs, seed=7)
        assert snd["arrivals"] == arrivals, snd
        assert abs(snd["generated"] / secs - rate) < 0.06 * rate, snd
        lag = lag_against(t, due_times(arrivals, rate, len(t), 7))
        assert lag.min() > -50_000 and np.median(lag) < 50e6, (lag.min(), np.median(lag))
        if arrivals == "poisson":
            for other in (due_times("poisson", rate, len(t), 8),
                          due_times("even", rate, len(t), 7)):
                assert lag_against(t, other).min() < -1_000_000
    gaps = np.diff(due_times("poisson", rate, 20000, 7))
    mean = 1e9 / rate
    assert abs(gaps.mean() - mean) < 0.03 * mean
    assert 0.37 < (gaps < 0.5 * mean).mean() < 0.41
    assert 0.12 < (gaps > 2 * mean).mean() < 0.15


@pytest.mark.parametrize("per_packet", [1, 3])
def test_feed_latency_sender_sends_one_datagram_per_call(per_packet):
    # --latency-sender: one datagram per send call (its own stamp), no GSO,
    # busy-wait pacing; the sender's send-call histogram counts every call,
    # and a call never carries more than one datagram; clean, loss exact
    rep, _ = feed(["--handlers", "c,py", "--paths", "gdrpy", "--sources", "udp",
                   "--rate", "30000", "--ticks", "4500", "--seconds", "3", "--latency-sender",
                   "--per-packet", str(per_packet), "--inject-skip", "17", "--stages"], "sim")
    pts = rep["points"]
    assert len(pts) == 2
    for r in pts:
        assert_clean(r)
        lo, snd = r["loss"], r["sender"]
        assert lo["generated"] == 4500 and lo["lost"] == lo["injected"] == 4500 // 17, describe(r)
        assert r["sender_mode"] == {"gso": False, "pace": "spin", "burst": per_packet,
                                    "arrivals": "poisson"}, describe(r)
        assert snd["arrivals"] == "poisson", describe(r)
        assert snd["gso"] == 0 and snd["pace"] == "spin" and snd["burst"] == per_packet
        sc, lag = snd["send_call_us"], snd["stamp_lag_us"]
        assert sc["n"] == snd["batches"] == snd["packets"], describe(r)
        assert 0 < sc["median"] <= sc["p99"] <= sc["max"], describe(r)
        assert lag["n"] == snd["batches"] and lag["median"] <= lag["p99"] <= lag["max"]
        # each call goes out when its tick is due (sched_at), not seconds after the start
        assert lag["median"] < 40_000, describe(r)
    assert len({r["sums_digest"] for r in pts}) == 1


@pytest.mark.parametrize("per_packet", [1, 4])
def test_feed_udp_gro_coalesced_receive(per_packet):
    # --gro: a UDP_SEGMENT send reaches the socket as one message of several
    # datagrams; both handlers split it back into ticks: clean, loss exact
    # (injected gaps inside coalesced messages), END seen, same sums
    rep, _ = feed(["--handlers", "c,py", "--paths", "gdrpy,cuMemcpy", "--sources", "udp",
                   "--rate", "100000", "--ticks", "9001", "--seconds", "3", "--gro",
                   "--per-packet", str(per_packet), "--inject-skip", "11"], "sim")
    pts = rep["points"]
    assert len(pts) == 4
    for r in pts:
        assert_clean(r)
        lo, st = r["loss"], r["handler_stats"]
        assert r["gro"] and r["rcvbuf"]["gro"], describe(r)
        assert lo["generated"] == 9001 and lo["lost"] == lo["injected"] == 9001 // 11, describe(r)
        assert st["end_seen"] == 1 and st["snd_generated"] == 9001, describe(r)
        assert st["bad_packets"] == 0, describe(r)
    assert len({r["sums_digest"] for r in pts}) == 1


def test_feed_quick_sweep_writes_report_and_plot(tmp_path):
    svg = tmp_path / "feed.svg"
    # 0.2 s a point (--quick: 0.5): the checks are on the report's shape,
    # the latency records and the plot, none on the rates reached
    rep, _ = feed(["--sweep", "--quick", "--seconds", "0.2", "--handlers", "c", "--paths",
                   "gdrpy,cuMemcpy", "--plot", str(svg)], "sim")
    assert rep["sim"] and rep["consumer"] == SIM_LABEL
    kinds = {(r["source"], r["path"]) for r in rep["points"]}
    assert kinds == {("udp", "gdrpy"), ("udp", "cuMemcpy"), ("shm", "gdrpy"), ("shm", "cuMemcpy")}
    assert set(rep["zero_loss_capacity"]) == {"udp/c/gdrpy", "udp/c/cuMemcpy", "shm/c/gdrpy",
                                              "shm/c/cuMemcpy"}
    for r in rep["points"]:
        e = r["latency_us"]["end_to_end"]
        assert e["n"] == r["processed"] and e["median"] <= e["p99"] <= e["max"], describe(r)
        assert r["sender"]["achieved_per_s"] > 0
    text = svg.read_text()
    assert text.startswith("<svg") and text.count("<polyline") == 4


def test_feed_rejects_bad_options():
    _, _, err = run(FEED + ["--ring", "1000", "--backend", "sim"], expect_rc=2)
    assert "power of two" in err
    _, _, err = run(FEED + ["--cpus", "1,1,2,3", "--backend", "sim"], expect_rc=2)
    assert "four different CPU" in err
    _, _, err = run(FEED + ["--gro", "--ring", "32", "--backend", "sim"], expect_rc=2)
    assert "--gro" in err


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("skip", [0, 5])
def test_feed_python_handler_single_tick_path_is_exact(backend, skip):
    # --batch 1: every receive holds one tick, so the Python handler's
    # numpy-free path carries the feed; an injected gap sends it to the
    # general path for that tick
    rep, _ = feed(["--handlers", "py", "--paths", "gdrpy", "--sources", "udp", "--batch", "1",
                   "--rate", "5000", "--ticks", "1000", "--seconds", "3",
                   "--inject-skip", str(skip)], backend)
    (r,) = rep["points"]
    assert_clean(r)
    assert r["mean_batch"] == 1.0, describe(r)
    lo = r["loss"]
    assert lo["lost"] == lo["injected"] == (1000 // skip if skip else 0), describe(r)
    if not skip:
        assert r["reference_match"], describe(r)


def test_feed_python_drop_room_reads_the_consumed_count_once():
    # the GPU consumer advances between any two reads of its count: the room
    # the Python handler's drop policy computes must come from one read, so
    # it never exceeds the batch (a second, newer read once made the handler
    # count 12 ticks forwarded that it never sent, on the H100)
    drop_room = feed_module("pyhandler").drop_room

    class Advancing:
        def __init__(self, v):
            self.v, self.reads = v, 0

        @property
        def value(self):
            self.reads += 1
            self.v += 8            # the consumer took 8 more since the last look
            return self.v - 8

    for w, m, c0, nslots, want in ((100, 16, 90, 16, 6), (100, 16, 84, 16, 0),
                                   (100, 4, 90, 16, None), (100, 16, 60, 16, 0),
                                   (100, 4, 85, 16, 1)):
        c = Advancing(c0)
        room = drop_room(w, m, c, nslots)
        assert c.reads == 1
        assert room == want, (w, m, c0, nslots, room)
        assert room is None or 0 <= room < m


def check_host_stalls(r, measured: bool | None = None):
    """A point's stall-probe record: measured (numbers that agree with each
    other) or skipped with its reason; `measured` says which it must be."""
    hs = r["host_stalls"]
    if measured is not None:
        assert ("skipped" not in hs) == measured, describe(r) + json.dumps(hs)
    if "skipped" in hs:
        assert hs["skipped"], hs
        return
    n = hs["stalls"]
    assert hs["seconds"] > 0 and 0 <= hs["stalled_fraction"] <= 1, hs
    assert hs["duration_us"]["n"] == n and hs["interval_us"]["n"] == max(n - 1, 0), hs
    assert abs(hs["per_s"] - n / hs["seconds"]) < 1e-6 * max(n, 1), hs
    if n:
        assert hs["duration_us"]["min"] >= hs["threshold_us"], hs
        assert hs["duration_us"]["max"] * 1e-6 <= hs["seconds"] + 1e-3, hs


def test_feed_stall_probe_counts_the_time_its_process_is_stopped():
    # The probe counts the gaps in which its thread did not run.  A child
    # process runs one; the test stops the whole child (SIGSTOP) three times
    # for 150 ms.  The probe must report those three stops - whatever else
    # the machine does, they are there: the stalled time, the longest stall,
    # the count - and a record that agrees with itself.  A second stop()
    # does nothing.
    feed_module("engine").lib()          # built here, not in the child
    cpu = max(os.sched_getaffinity(0))
    child_src = (f"import json, sys, time\nsys.path.insert(0, {os.path.join(EXAMPLES, 'feed')!r})\n"
                 "import engine\n"
                 f"p = engine.StallProbe(engine.lib(), {cpu})\n"
                 "print('ready', flush=True)\n"
                 "sys.stdin.readline()\n"
                 "rec = p.stop()\n"
                 "assert p.stop() is None\n"
                 "print(json.dumps(rec), flush=True)\n")
    child = subprocess.Popen([sys.executable, "-c", child_src], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        for _ in range(3):
            time.sleep(0.1)
            os.kill(child.pid, signal.SIGSTOP)
            time.sleep(0.15)
            os.kill(child.pid, signal.SIGCONT)
        time.sleep(0.1)
        out, _ = child.communicate("\n", timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0
    rec = json.loads(out)
    assert rec["cpu"] == cpu
    check_host_stalls({"host_stalls": rec}, measured=True)
    assert rec["duration_us"]["max"] >= 140e3, rec
    assert rec["stalls"] >= 3 and rec["stalled_fraction"] * rec["seconds"] >= 0.42, rec


@pytest.mark.parametrize("backend", BACKENDS)
def test_feed_run_reports_the_hosts_stalls_beside_it(backend):
    # every point says what the stall probe saw during it, or why it did not
    # run; on the GPU machine (16 CPUs, the run's threads pinned) it runs.
    # (On a machine too small to pin the run's threads - CI's two CPUs - the
    # record is "skipped": the probe's own counting is the test above.)
    rep, out = feed(["--handlers", "c", "--paths", "gdrpy", "--sources", "udp",
                     "--rate", "20000", "--seconds", "0.3"], backend)
    (r,) = rep["points"]
    assert_clean(r)
    check_host_stalls(r, measured=True if backend is None else None)


def check_tail(r):
    """The tail attribution counts every acknowledged tick once: the ticks at
    or above the p50 bucket are at least half of them, the shares of the
    largest stage sum to 1, and deeper quantiles hold no more ticks."""
    ta, n = r["tail"], r["latency_us"]["end_to_end"]["n"]
    assert n > 0 and set(ta) == {"p50", "p90", "p99", "p99.9", "over_10us"}, describe(r)
    prev = n
    for q in ("p50", "p90", "p99", "p99.9"):
        v = ta[q]
        assert 0 < v["ticks"] <= prev, (q, ta)
        prev = v["ticks"]
        assert abs(sum(v["largest_share"].values()) - 1.0) < 1e-9, (q, ta)
        assert all(x >= 0 for x in v["mean_us"].values()), (q, ta)
    assert ta["p50"]["ticks"] >= n / 2, ta


def test_feed_half_capacity_without_proofs_uses_this_runs_capacity():
    # --no-proof --half-capacity: the sweep, then each handler's half-capacity
    # point at half of the zero-loss capacity this same sweep measured, with
    # the latency sender, and a done-when line for it; every point carries a
    # consistent tail attribution
    rep, err = feed(["--sweep", "--handlers", "c", "--paths", "gdrpy", "--sources", "udp",
                     "--udp-rates", "20000,40000", "--seconds", "0.5", "--no-proof",
                     "--half-capacity", "--half-seconds", "0.5"], "sim")
    sweep = [r for r in rep["points"] if r["kind"] == "sweep"]
    half = [r for r in rep["points"] if r["kind"] == "half_capacity"]
    cap = rep["zero_loss_capacity"]["udp/c/gdrpy"]
    assert not [r for r in rep["points"] if r["kind"].startswith("proof")]
    if cap == 0:        # this (shared, slow) host lost ticks even at 20k/s
        assert not half, err
        return
    assert half and half[0]["offered_per_s"] == cap / 2, err
    assert half[0]["capacity_per_s"] == cap
    assert half[0]["sender_mode"]["gso"] is False and half[0]["sender_mode"]["pace"] == "spin"
    for r in sweep + half:
        assert_clean(r)
        check_tail(r)
    dw = [d for d in rep["done_when"] if "half capacity" in d["what"]]
    assert dw and f"{cap:,.0f}/s zero-loss capacity" in dw[0]["what"], rep["done_when"]
