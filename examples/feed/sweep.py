"""The capacity sweep, the Done-when proof points, the report and the plot
(SVG written by hand: no matplotlib needed on the GPU machine)."""

from __future__ import annotations

import math
import os
import time

import osinfo
from handlers import run_point

UDP_RATES = [20_000, 100_000, 200_000, 500_000, 1_000_000, 2_000_000]
SHM_RATES = [1_000_000, 2_000_000, 5_000_000, 10_000_000]
QUICK_UDP = [20_000, 100_000]
QUICK_SHM = [200_000, 1_000_000]
TARGETS = {("udp", "c"): 1_000_000, ("udp", "py"): 500_000,
           ("shm", "c"): 5_000_000, ("shm", "py"): 1_000_000}
P99_LIMIT_US = 10.0
# the half-capacity points' sender: no UDP_SEGMENT batches, one datagram per
# send call (burst = ticks per datagram), busy-wait pacing (no sched_yield
# between sends)
LATENCY_SENDER = {"gso": False, "pace": "spin"}


def gpu_cpus(ctx) -> list[int]:
    """CPUs near the GPU (its NUMA node), this process may run on, CPU 0 last."""
    allowed = sorted(os.sched_getaffinity(0))
    near: list[int] = []
    bus = (ctx.info.get("pci_bus_id") or "").lower()
    for cand in (bus, bus[4:] if bus.count(":") == 2 else "0000:" + bus):
        p = f"/sys/bus/pci/devices/{cand}/local_cpulist"
        if cand and os.path.exists(p):
            with open(p) as f:
                for part in f.read().strip().split(","):
                    a, _, b = part.partition("-")
                    near += list(range(int(a), int(b or a) + 1))
            break
    cpus = [c for c in (near or allowed) if c in allowed]
    return sorted(cpus, key=lambda c: (c == 0, c))


def pick_cpus(ctx, given: list[int] | None = None) -> tuple[tuple, str, int]:
    """Sender, handler, ack collector, sim consumer: one physical core each
    near the GPU, not CPU 0's, fewest device interrupts first (osinfo.pick),
    or the CPUs given (--cpus); and a fifth one (-1: none) for the loopback
    receive processing (--rps-cpu auto)."""
    cpus = gpu_cpus(ctx)
    if given:
        c = tuple(given)
        how = "pinned as asked (--cpus)"
        rest = [x for x in osinfo.pick(cpus, 5) if x not in c]
        spare = rest[0] if rest else -1
    else:
        if len(cpus) < 5:
            return (-1, -1, -1, -1), (f"not pinned ({len(cpus)} CPUs: too few for 4 threads + "
                                      "this one)"), -1
        p = osinfo.pick(cpus, 5)
        c, spare = tuple(p[:4]), (p[4] if len(p) > 4 else -1)
        how = "pinned near the GPU"
    return c, (f"{how}: sender CPU {c[0]}, handler {c[1]}, ack collector {c[2]}, "
               f"sim consumer {c[3]} ({osinfo.describe(list(c))})"), spare


def kept_up(r: dict) -> bool:
    """Processed at (95% of) the rate the sender achieved: the source's buffer
    did not just soak up a backlog that a longer run would overflow."""
    snd = r.get("sender_per_s") or 0
    return (r.get("processed_per_s") or 0) >= 0.95 * snd


def zero_loss(r: dict) -> bool:
    """Nothing lost, the rate really offered, and kept up with."""
    lo = r.get("loss")
    if not lo or r.get("error"):
        return False
    snd = r.get("sender_per_s") or 0
    return lo["lost"] - lo["injected"] == 0 and snd >= 0.95 * r["offered_per_s"] and kept_up(r)


def bound_stage(r: dict) -> str:
    """Which stage limits this point, from what was measured."""
    if r.get("error"):
        return f"error: {r['error']}"
    lo, rg = r.get("loss"), r.get("ring", {})
    if not lo:
        return "?"
    offered = r["offered_per_s"]
    snd = r.get("sender_per_s") or 0
    busy = r.get("handler_busy") or 0.0
    if snd < 0.95 * offered:
        return f"sender (offered only {snd:,.0f}/s of {offered:,.0f}/s)"
    if lo["lost"] - lo["injected"] == 0 and kept_up(r):
        return "none (zero loss)"
    if lo["lost"] - lo["injected"] == 0:
        lag = (f"no loss, but processed {(r.get('processed_per_s') or 0):,.0f}/s of "
               f"{snd:,.0f}/s: a backlog built up")
        if rg.get("full_events"):
            return f"consumer kernel (ring full {rg['full_events']} times; {lag})"
        return f"handler (busy {busy:.0%}; {lag})"
    if rg.get("full_events"):
        return (f"consumer kernel (ring full {rg['full_events']} times, "
                f"{rg['stalled_ms']:.1f} ms stalled)")
    sn = r.get("sender") or {}
    slots = r.get("shm_slots") or 0
    if (r["source"] == "shm" and slots and sn.get("max_behind", 0) > slots
            and lo.get("shm_ring_full")):
        # the sender itself stopped (max gap) and then published its backlog
        # at once: more ticks than the ring holds, whatever the handler does
        return (f"sender stall (it stopped for up to {sn.get('max_gap_us', 0) / 1e3:.1f} ms, then "
                f"published {sn['max_behind']:,} ticks at once: more than the {slots:,}-slot "
                f"ring; handler busy {busy:.0%})")
    if r["source"] == "udp":
        if busy >= 0.8:
            return f"handler (busy {busy:.0%}; the socket overflowed)"
        return f"socket (kernel UDP receive; handler busy only {busy:.0%})"
    return f"handler (busy {busy:.0%}; the shm ring overflowed at the producer)"


def fmt_row(r: dict) -> str:
    e = r["latency_us"]["end_to_end"]
    lo = r.get("loss") or {}
    pps = r.get("processed_per_s")
    snd = r.get("sender_per_s")
    lat = (f"{e['median']:8.2f} {e['p99']:8.2f} {e['p99.9']:9.2f}" if e.get("n")
           else f"{'-':>8s} {'-':>8s} {'-':>9s}")
    return (f"{r['source']:>4s} {r['handler']:>3s} {r['path']:>8s} {r['offered_per_s']:>10,.0f} "
            f"{(snd or 0):>10,.0f} {(pps or 0):>11,.0f} {lo.get('lost', '?'):>8} "
            f"{(r.get('ring') or {}).get('full_events', '?'):>6} {lat} "
            f"{r.get('mean_batch', 0):6.1f}  {bound_stage(r)}")


HEADER = (f"{'src':>4s} {'hnd':>3s} {'path':>8s} {'offered/s':>10s} {'sent/s':>10s} "
          f"{'processed/s':>11s} {'lost':>8s} {'full':>6s} {'e2e p50':>8s} {'p99':>8s} "
          f"{'p99.9':>9s} {'batch':>6s}  bound")


def stage_row(r: dict) -> str:
    L = r["latency_us"]
    parts = []
    for k, name in (("socket_or_shm", "send->recv"), ("handler", "recv->written"),
                    ("ring_consumer_ack", "written->ack seen"), ("recv_to_ack", "recv->ack seen")):
        s = L[k]
        parts.append(f"{name} {s.get('median', float('nan')):.2f}/{s.get('p99', float('nan')):.2f}")
    sn = r.get("sender") or {}
    sc, lag = sn.get("send_call_us") or {}, sn.get("stamp_lag_us") or {}
    if sc.get("n"):
        parts.append(f"sender: send call {sc['median']:.2f}/{sc['p99']:.2f} (max "
                     f"{sc['max']:.0f}; > 5 us: {sc.get('over_5us', 0) / r['seconds']:,.0f}/s; "
                     f"{sn.get('sent', 0) / sc['n']:.1f} "
                     f"ticks/call), stamp after schedule {lag.get('median', 0):.2f}/"
                     f"{lag.get('p99', 0):.2f} (not in e2e)")
    st = r.get("handler_stats") or {}
    if st.get("batches"):
        parts.append(f"handler busy {(r.get('handler_busy') or 0):.0%}, "
                     f"{st['busy_ns'] / st['batches'] / 1e3:.2f} us/batch incl. receive "
                     f"(mean {st['forwarded'] / st['batches']:.1f} ticks): receive "
                     f"{st.get('recv_ns', 0) / st['batches'] / 1e3:.2f}, channel write "
                     f"{st.get('publish_ns', 0) / max(st['forwarded'], 1):.0f} ns/tick")
        if st.get("big_ticks"):
            parts.append(f"batches >= 64: {st['big_batches']}, channel write "
                         f"{st['big_publish_ns'] / st['big_ticks']:.0f} ns/tick")
    return "      stages p50/p99 us: " + ", ".join(parts)


def tail_row(r: dict) -> str:
    """Per end-to-end percentile: the mean of each stage over the ticks at or
    above it and how often each stage was a tick's largest (feed_acks_tail)."""
    ta = r.get("tail") or {}
    parts = []
    for k, v in ta.items():
        if not v.get("ticks"):
            continue
        m, sh = v["mean_us"], v["largest_share"]
        parts.append(f"{k} (>= {v['from_us']:.1f} us, {v['ticks']:,} ticks): "
                     + " / ".join(f"{m[s]:.2f}" for s in m) + " us, largest "
                     + " / ".join(f"{sh[s]:.0%}" for s in sh))
    if not parts:
        return ""
    return ("      tail, mean socket / handler / ring+ack over the ticks at or above: "
            + "; ".join(parts))


def tail_bound(r: dict, key: str = "p99") -> str:
    """The stage that is largest for most ticks at or above the p99."""
    v = (r.get("tail") or {}).get(key) or {}
    if not v.get("ticks"):
        return ""
    sh, m = v["largest_share"], v["mean_us"]
    s = max(sh, key=lambda k: sh[k])
    return (f"; ticks at or above the {key} ({v['from_us']:.1f} us): {s} the largest stage "
            f"for {sh[s]:.0%} of them (means socket {m['socket']:.2f}, handler "
            f"{m['handler']:.2f}, ring+ack {m['ring_ack']:.2f} us)")


def _log_point(log, r: dict, suffix: str = "") -> None:
    log(fmt_row(r) + suffix)
    log(stage_row(r))
    t = tail_row(r)
    if t:
        log(t)
    if osinfo.stall_row(r):
        log(osinfo.stall_row(r))
    log(osinfo.evidence_row(r))


class ConsumerStuck(RuntimeError):
    """A consumer did not stop: later kernels would queue behind it."""


def _run(env, log, *args, **kw) -> dict:
    r = run_point(env, *args, **kw)
    if r.get("consumer_stuck"):
        log(fmt_row(r))
        raise ConsumerStuck(f"the consumer of {args[:4]} did not stop; the sweep ends here")
    return r


def run_sweep(env, a, log=print) -> dict:
    cpus, pin_note = a.picked
    log(f"threads: {pin_note}")
    handlers = [h for h in ("c", "py") if h in a.handlers]
    paths = [p for p in ("gdrpy", "cuMemcpy") if p in a.paths]
    sources = [s for s in ("udp", "shm") if s in a.sources]
    udp = a.udp_rates or (QUICK_UDP if a.quick else UDP_RATES)
    shm = a.shm_rates or (QUICK_SHM if a.quick else SHM_RATES)
    secs = a.seconds or (0.5 if a.quick else 2.0)
    common = {"nsym": a.symbols, "seed": a.seed, "nslots": a.ring, "batch": a.batch,
              "cpus": cpus, "rcvbuf": a.rcvbuf, "per_packet": a.per_packet, "gso": not a.no_gso,
              "pace": a.pace, "shm_slots": a.shm_slots, "rps_cpu": a.rps, "gro": a.gro,
              "burst": a.sender_burst, "plain": a.slots == "plain", "arrivals": a.arrivals}
    points: list[dict] = []
    report: dict = {"points": points, "threads": pin_note, "zero_loss_capacity": {}}
    t0 = time.monotonic()
    try:
        _phases(env, a, log, points, report, handlers, paths, sources, udp, shm, secs, common)
    except ConsumerStuck as e:
        log(str(e))
        report["aborted"] = str(e)
    report["wall_s"] = time.monotonic() - t0
    report["done_when"] = done_when(points)
    return report


def _capacity(points: list[dict]) -> dict:
    """Highest zero-loss offered rate per source/handler/path (sweep points)."""
    cap: dict = {}
    for r in points:
        if r.get("kind") != "sweep":
            continue
        k = f"{r['source']}/{r['handler']}/{r['path']}"
        if zero_loss(r):
            cap[k] = max(cap.get(k, 0), r["offered_per_s"])
        else:
            cap.setdefault(k, 0)
    return cap


def _phases(env, a, log, points, report, handlers, paths, sources, udp, shm, secs,
            common) -> None:
    log(HEADER)
    for src in sources:
        for h in handlers:
            for p in paths:
                for rate in (udp if src == "udp" else shm):
                    r = _run(env, log, h, p, src, rate, secs, **common)
                    r["kind"] = "sweep"
                    points.append(r)
                    if a.stages:
                        _log_point(log, r)
                    else:
                        log(fmt_row(r))
                    if (r.get("processed_per_s") or 0) < 0.5 * rate or r.get("error"):
                        log(f"     ({src}/{h}/{p}: higher rates skipped: this one is already "
                            "at twice the capacity or more)")
                        break
    cap = report["zero_loss_capacity"] = _capacity(points)
    half = getattr(a, "half_capacity", False)
    if a.quick or (a.no_proof and not half):
        return
    proof_s = a.proof_seconds
    log("\nzero-loss capacity in this run: " + ", ".join(f"{k} {v:,.0f}/s"
                                                       for k, v in cap.items()))
    log("half-capacity latency (proof points skipped):" if a.no_proof else
        f"proof points ({proof_s:.0f} s each, gdrpy path) and half-capacity latency:")
    log(HEADER)
    for (src, h), rate in TARGETS.items():
        if a.no_proof:
            break
        if src not in sources or h not in handlers or "gdrpy" not in paths:
            continue
        r = _run(env, log, h, "gdrpy", src, rate, proof_s, **common)
        r["kind"] = "proof"
        points.append(r)
        _log_point(log, r)
        b = bound_stage(r)
        if src == "udp" and a.per_packet == 1 and b.startswith(("sender", "socket")):
            # one datagram per tick is bound by the kernel's UDP path: the
            # same rate with 4 ticks per datagram (as MoldUDP64 packs
            # messages) shows what the handler and the GPU path carry
            r = _run(env, log, h, "gdrpy", src, rate, proof_s, **{**common, "per_packet": 4})
            r["kind"] = "proof_packed"
            points.append(r)
            _log_point(log, r, "  [4 ticks/datagram]")
    if "udp" in sources:
        for h in handlers:
            for p in paths:
                c = cap.get(f"udp/{h}/{p}", 0)
                if c <= 0:
                    continue
                # a feed at half its peak is paced, not catching up: the
                # latency sender (one datagram per send, each stamped just
                # before its own call, busy-wait pacing; LATENCY_SENDER)
                hs = getattr(a, "half_seconds", 3.0)
                r = _run(env, log, h, p, "udp", c / 2, hs, **{**common, **LATENCY_SENDER,
                                                              "burst": a.per_packet})
                r["kind"] = "half_capacity"
                r["capacity_per_s"] = c
                points.append(r)
                _log_point(log, r)
                if a.per_packet == 1 and bound_stage(r).startswith("sender"):
                    # one send call per tick cannot offer the rate (about 2.3 us
                    # a call on the H100 VM): the same sender, a datagram now
                    # carrying the ticks already due when it goes (at most 4;
                    # none waits for a datagram to fill)
                    r = _run(env, log, h, p, "udp", c / 2, hs,
                             **{**common, **LATENCY_SENDER, "per_packet": 4, "burst": 4})
                    r["kind"] = "half_capacity"
                    r["capacity_per_s"] = c
                    points.append(r)
                    _log_point(log, r, "  [<= 4 ticks/datagram, those already due]")


def path_stalls(r: dict) -> str:
    """The hypervisor's steal on the CPUs a tick crosses and the longest
    stall of each thread: a vCPU that is not running holds every tick
    behind it (the p99 is 1% of ticks)."""
    os_ = r.get("os") or {}
    steal = {k: os_[k]["steal_ms"] for k in ("sender", "handler", "collector")
             if "steal_ms" in (os_.get(k) or {})}
    if not steal:
        return ""
    gaps = {"sender": (r.get("sender") or {}).get("max_gap_us", 0),
            "handler": (r.get("handler_stats") or {}).get("max_gap_ns", 0) / 1e3,
            "collector": (r.get("collector") or {}).get("max_gap_ns", 0) / 1e3}
    return ("; steal on the path's CPUs " + ", ".join(f"{k} {v:.0f} ms" for k, v in
                                                       steal.items())
            + f" in {r['seconds']:.0f} s; longest thread stalls "
            + ", ".join(f"{k} {v:,.0f} us" for k, v in gaps.items()))


def sender_mode(r: dict) -> str:
    m = r.get("sender_mode") or {}
    if not m.get("gso") and m.get("burst", 256) <= r.get("per_packet", 1):
        k = r.get("per_packet", 1)
        what = "one tick" if k == 1 else f"the ticks already due (at most {k})"
        return (f"sender: one datagram per send call carrying {what}, stamped just before "
                f"it, {m.get('pace')} pacing, {m.get('arrivals', 'even')} arrivals")
    return (f"sender: up to {m.get('burst')} ticks per send call sharing one stamp"
            f"{', UDP_SEGMENT' if m.get('gso') else ''}, {m.get('pace')} pacing, "
            f"{m.get('arrivals', 'even')} arrivals")


def _verdict(r: dict, ok: bool, what: str) -> dict:
    return {"what": what, "ok": ok,
            "measured": f"lost {r.get('loss', {}).get('lost')}, processed "
                        f"{(r.get('processed_per_s') or 0):,.0f}/s, sender "
                        f"{(r.get('sender_per_s') or 0):,.0f}/s",
            "bound": None if ok else bound_stage(r)}


def done_when(points: list[dict]) -> list[dict]:
    out = []
    for (src, h), rate in TARGETS.items():
        for r in points:
            if r.get("kind") not in ("proof", "proof_packed") or r["source"] != src or \
                    r["handler"] != h:
                continue
            ok = zero_loss(r) and r["seconds"] >= 10
            packed = f", {r['per_packet']} ticks/datagram" if r.get("per_packet", 1) > 1 else ""
            out.append(_verdict(r, ok, f"{src} {h} handler zero loss for {r['seconds']:.0f} s at "
                                       f"{rate:,}/s offered{packed}"))
    for r in points:
        if r.get("kind") != "half_capacity" or r["path"] != "gdrpy":
            continue
        e = r["latency_us"]["end_to_end"]
        p99 = e.get("p99", float("inf"))
        ok = p99 <= P99_LIMIT_US and zero_loss(r)
        stages = {k: r["latency_us"][k].get("p99", 0) for k in
                  ("socket_or_shm", "handler", "ring_consumer_ack")}
        worst = max(stages, key=lambda k: stages[k])
        why = f"largest stage p99: {worst} {stages[worst]:.2f} us"
        snd_os = (r.get("os") or {}).get("sender") or {}
        sc = (r.get("sender") or {}).get("send_call_us") or {}
        if worst == "socket_or_shm" and sc.get("n") and (r.get("sender") or {}).get(
                "burst", 256) <= r.get("per_packet", 1):
            # one datagram per call: the call is the kernel's whole loopback path
            why += (f" (the sender's own send call - stamp until the datagram is in the "
                    f"handler's socket, the loopback receive work inline - p50 "
                    f"{sc['median']:.2f} / p99 {sc['p99']:.2f} us, calls over 5 us "
                    f"{sc.get('over_5us', 0) / r['seconds']:,.0f}/s"
                    + (f"; local timer interrupts on the sender's CPU "
                       f"{snd_os['loc'] / r['seconds']:,.0f}/s" if "loc" in snd_os else "")
                    + ")")
        elif worst == "socket_or_shm" and snd_os.get("softirq_ms") is not None and r["seconds"]:
            why += (f" (the sender's CPU spent {snd_os['softirq_ms'] / r['seconds'] / 10:.0f}% "
                    "of the point in softirq: the kernel's loopback receive work runs there; "
                    f"sender max gap {(r.get('sender') or {}).get('max_gap_us', 0) / 1e3:.1f} ms)")
        why += tail_bound(r)
        why += f"; handler busy {(r.get('handler_busy') or 0):.0%}"
        why += path_stalls(r)
        cap = r.get("capacity_per_s")
        capn = f" of the {cap:,.0f}/s zero-loss capacity measured in this run" if cap else ""
        out.append({"what": f"udp {r['handler']} handler end-to-end p99 <= {P99_LIMIT_US} us at "
                            f"half capacity ({r['offered_per_s']:,.0f}/s{capn}; "
                            f"{sender_mode(r)})",
                    "ok": ok,
                    "measured": f"p99 {p99:.2f} us (p50 {e.get('median', 0):.2f}); stage p99s: "
                                + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()),
                    "bound": None if ok else why})
    return out


def write_svg(points: list[dict], path: str, title: str) -> None:
    """Offered rate (log) vs end-to-end p99 (log), one line per series."""
    series: dict = {}
    for r in points:
        if r.get("kind") != "sweep":
            continue
        e = r["latency_us"]["end_to_end"]
        if not e.get("n"):
            continue
        k = f"{r['source']} / {r['handler']} handler / {r['path']}"
        series.setdefault(k, []).append((r["offered_per_s"], e["p99"], zero_loss(r)))
    W, H, ml, mr, mt, mb = 860, 520, 70, 260, 40, 50
    xs = [p[0] for s in series.values() for p in s] or [1e4, 1e7]
    ys = [p[1] for s in series.values() for p in s] or [1, 1e3]
    x0, x1 = math.log10(min(xs)) - 0.1, math.log10(max(xs)) + 0.1
    y0, y1 = math.log10(max(min(ys), 0.1)) - 0.2, math.log10(max(ys)) + 0.2

    def X(v):
        return ml + (math.log10(v) - x0) / (x1 - x0) * (W - ml - mr)

    def Y(v):
        return H - mb - (math.log10(max(v, 0.1)) - y0) / (y1 - y0) * (H - mt - mb)

    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
              "#7f7f7f"]
    el = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">'),
          f'<rect width="{W}" height="{H}" fill="white"/>',
          f'<text x="{ml}" y="22" font-size="14">{title}</text>']
    for d in range(math.floor(x0), math.ceil(x1) + 1):
        for m in (1, 2, 5):
            v = m * 10 ** d
            if x0 <= math.log10(v) <= x1:
                el.append(f'<line x1="{X(v):.1f}" y1="{mt}" x2="{X(v):.1f}" y2="{H - mb}" '
                          f'stroke="#ddd"/><text x="{X(v):.1f}" y="{H - mb + 16}" '
                          f'text-anchor="middle">{v:,.0f}</text>')
    for d in range(math.floor(y0), math.ceil(y1) + 1):
        for m in (1, 2, 5):
            v = m * 10 ** d
            if y0 <= math.log10(v) <= y1:
                el.append(f'<line x1="{ml}" y1="{Y(v):.1f}" x2="{W - mr}" y2="{Y(v):.1f}" '
                          f'stroke="#ddd"/><text x="{ml - 6}" y="{Y(v) + 4:.1f}" '
                          f'text-anchor="end">{v:g}</text>')
    el.append(f'<text x="{(ml + W - mr) / 2}" y="{H - 12}" text-anchor="middle">offered '
              f'ticks/s</text>')
    el.append(f'<text x="16" y="{(mt + H - mb) / 2}" transform="rotate(-90 16 '
              f'{(mt + H - mb) / 2})" text-anchor="middle">end-to-end p99 (us)</text>')
    for i, (k, pts) in enumerate(sorted(series.items())):
        c = colors[i % len(colors)]
        pts.sort()
        el.append('<polyline fill="none" stroke="{}" stroke-width="1.6" points="{}"/>'.format(
            c, " ".join(f"{X(a):.1f},{Y(b):.1f}" for a, b, _ in pts)))
        for a, b, ok in pts:
            el.append(f'<circle cx="{X(a):.1f}" cy="{Y(b):.1f}" r="4" stroke="{c}" '
                      f'fill="{c if ok else "white"}"/>')
        ly = mt + 14 + 18 * i
        el.append(f'<line x1="{W - mr + 12}" y1="{ly - 4}" x2="{W - mr + 32}" y2="{ly - 4}" '
                  f'stroke="{c}" stroke-width="2"/><text x="{W - mr + 38}" y="{ly}">{k}</text>')
    ly = mt + 14 + 18 * len(series) + 10
    el.append(f'<text x="{W - mr + 12}" y="{ly}">filled: zero loss; hollow: loss</text>')
    el.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(el))


def markdown(rep: dict) -> str:
    """The report as markdown tables (for docs/results.md)."""
    L = [f"Consumer: {rep.get('consumer')}; threads: {rep.get('threads')}.", "",
         ("| kind | source | handler | path | offered/s | sender/s | processed/s | lost | "
          "ring full | e2e p50 | p99 | p99.9 | send->recv p99 | handler p99 | "
          "ring+GPU+ack p99 | bound |"),
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rep["points"]:
        lat = r["latency_us"]
        e = lat["end_to_end"]

        def f(st, k):
            return f"{st[k]:.2f}" if st.get("n") else "-"
        pp = f" ({r['per_packet']}/dgram)" if r.get("per_packet", 1) > 1 else ""
        L.append(f"| {r.get('kind')} | {r['source']}{pp} | {r['handler']} | {r['path']} | "
                 f"{r['offered_per_s']:,.0f} | {(r.get('sender_per_s') or 0):,.0f} | "
                 f"{(r.get('processed_per_s') or 0):,.0f} | {(r.get('loss') or {}).get('lost')} | "
                 f"{(r.get('ring') or {}).get('full_events')} | {f(e, 'median')} | {f(e, 'p99')} | "
                 f"{f(e, 'p99.9')} | {f(lat['socket_or_shm'], 'p99')} | "
                 f"{f(lat['handler'], 'p99')} | {f(lat['ring_consumer_ack'], 'p99')} | "
                 f"{bound_stage(r)} |")
    if rep.get("zero_loss_capacity"):
        L += ["", "Highest zero-loss offered rate (sweep points): " + ", ".join(
            f"{k} {v:,.0f}/s" for k, v in rep["zero_loss_capacity"].items()) + "."]
    if rep.get("done_when"):
        L += ["", "Done-when:", ""]
        L += [f"- **{'PASS' if d['ok'] else 'SHORT'}** {d['what']}: {d['measured']}"
              + (f"; bound: {d['bound']}" if d.get("bound") else "") for d in rep["done_when"]]
    return "\n".join(L) + "\n"
