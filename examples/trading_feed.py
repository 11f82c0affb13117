#!/usr/bin/env python3
"""Trading feed: market data -> a gdrpy channel in GPU memory -> a persistent kernel.

    python examples/trading_feed.py                    # both handlers, both paths, UDP at 20k/s
    python examples/trading_feed.py --sweep --json feed.json --plot feed.svg   # GPU: ~4 min
    python examples/trading_feed.py --sweep --quick --backend sim              # no GPU

What runs (docs/examples.md has the whole story):

* a sender process (examples/feed/feed_sender.c) offers ticks at a paced
  rate (Poisson arrivals: random gaps of mean 1/rate; --arrivals even: a
  metronome) over UDP loopback (sendmmsg) or into a shared-memory ring (as
  kernel-bypass NIC libraries hand packets over); it reports its own rate;
* a handler - Python on gdrpy's public API, or C on gdrpy.h - drains the
  source in batches, checks sequence numbers, and writes each batch into a
  gdrpy channel with one fence; it waits only when the ring is full
  (counted); it never waits for an ack;
* a persistent kernel (two warps; gdrpy_channel.cuh) checks every tick
  (content vs its seq: torn; order: reordered/duplicate/missing), keeps exact
  per-symbol sums (VWAP), and stores its count - the ack - into host memory
  (and the channel's consumed count, which frees the slots); on sim a CPU
  thread stands in for it;
* an ack collector thread sees each advance of that word and records, per
  tick, end-to-end latency = ack seen - the sender's CLOCK_MONOTONIC stamp in
  the tick (socket queueing included), and the stages in between.
The gdrpy path's channel has LL slots (--slots plain: PLAIN's header +
payload slots).  The cuMemcpy path writes PLAIN's layout with cuMemcpyHtoD
(slots, then a count word) for the same kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "feed"))

SIM_LABEL = "SIM: CPU thread stands in for the GPU kernel"


def _rates(text: str) -> list[float]:
    out = []
    for t in text.split(","):
        t = t.strip().lower()
        if not t:
            continue
        mult = 1e6 if t.endswith("m") else 1e3 if t.endswith("k") else 1
        out.append(float(t.rstrip("mk")) * mult)
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"bad rate list {text!r} (e.g. 20k,100k,1M; "
                                         "0 = as fast as the sender can)")
    return out


def _list(choices):
    def parse(text):
        vals = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in vals if v not in choices]
        if bad or not vals:
            raise argparse.ArgumentTypeError(f"choose from {','.join(choices)}")
        return vals
    return parse


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default=None, help="gdrpy backend (sim: no GPU)")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--handlers", type=_list(("c", "py")), default=["c", "py"])
    p.add_argument("--paths", type=_list(("gdrpy", "cuMemcpy")), default=["gdrpy", "cuMemcpy"])
    p.add_argument("--sources", type=_list(("udp", "shm")), default=None,
                   help="udp,shm (default: udp for one run, both for --sweep)")
    p.add_argument("--rate", type=_rates, default=[20000.0], help="ticks/s (one run)")
    p.add_argument("--seconds", type=float, default=None,
                   help="seconds per point (default 2; --quick 0.5)")
    p.add_argument("--sweep", action="store_true", help="capacity sweep + proof points")
    p.add_argument("--quick", action="store_true", help="short sweep for tests")
    p.add_argument("--udp-rates", type=_rates, default=None)
    p.add_argument("--shm-rates", type=_rates, default=None)
    p.add_argument("--proof-seconds", type=float, default=10.0)
    p.add_argument("--no-proof", action="store_true",
                   help="sweep without the 10 s proof points (and without the half-capacity "
                        "points unless --half-capacity)")
    p.add_argument("--half-capacity", action="store_true",
                   help="with --no-proof: still run the half-capacity latency points (half "
                        "of each zero-loss UDP capacity this sweep measured)")
    p.add_argument("--half-seconds", type=float, default=3.0,
                   help="duration of each half-capacity point (default 3)")
    p.add_argument("--ring", type=int, default=4096, help="channel slots (power of two)")
    p.add_argument("--slots", choices=("ll", "plain"), default="ll",
                   help="the gdrpy path's slot format (default ll; plain: the header + "
                        "payload format the cuMemcpy path writes)")
    p.add_argument("--shm-slots", type=int, default=1 << 18,
                   help="shared-memory source ring slots (power of two; default 262144, "
                        "16 MiB: about what the UDP socket buffer holds)")
    p.add_argument("--batch", type=int, default=128, help="most ticks per batch")
    p.add_argument("--symbols", type=int, default=16)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--rcvbuf", type=int, default=64 << 20,
                   help="socket receive buffer to ask for (bytes; default 64 MiB, about 70k "
                        "queued datagrams: tens of ms at 1-2M/s)")
    p.add_argument("--per-packet", type=int, default=1, help="ticks per UDP datagram")
    p.add_argument("--gro", action="store_true",
                   help="UDP: the handlers' socket takes coalesced datagrams (UDP_GRO): a "
                        "UDP_SEGMENT send of up to 64 datagrams arrives as one message, so the "
                        "kernel's per-datagram receive work goes (needs --ring >= 64 x "
                        "--per-packet)")
    p.add_argument("--no-gso", action="store_true",
                   help="UDP sender: one send per datagram instead of UDP_SEGMENT batches")
    p.add_argument("--sender-burst", type=int, default=256, metavar="N",
                   help="UDP sender: at most N ticks per send call (they share one stamp)")
    p.add_argument("--latency-sender", action="store_true",
                   help="UDP sender in latency mode: one datagram per send call, each stamped "
                        "just before its own call, busy-wait pacing (= --no-gso --pace spin "
                        "--sender-burst <--per-packet>: with --per-packet K a datagram carries "
                        "the ticks already due, at most K); the sweep's half-capacity points "
                        "use it")
    p.add_argument("--on-full", choices=("wait", "drop"), default="wait")
    p.add_argument("--inject-skip", type=int, default=0, metavar="K",
                   help="test: the sender skips every K-th seq (counted loss)")
    p.add_argument("--consumer-delay-ns", type=int, default=0,
                   help="test: the consumer spends this long per tick")
    p.add_argument("--ticks", type=int, default=0, help="stop the sender after N ticks")
    p.add_argument("--stages", action="store_true",
                   help="per-stage latency and stall-evidence rows")
    p.add_argument("--cpus", type=lambda t: [int(x) for x in t.split(",")], default=None,
                   metavar="S,H,C,K", help="CPUs of the sender, handler, ack collector and sim "
                   "consumer (default: one physical core each near the GPU, not CPU 0's)")
    p.add_argument("--rps-cpu", default="off", metavar="auto|off|handler|N",
                   help="steer the kernel's loopback receive processing (NET_RX softirq) off "
                        "the sender's CPU to CPU N (auto: a fifth core near the GPU) with RPS, "
                        "restored at exit; needs root (default off: it runs on the sender's "
                        "CPU, inside its sends; handler: the handler's own CPU, which polls "
                        "and so never sleeps)")
    p.add_argument("--pace", choices=("yield", "sleep", "spin"), default="yield",
                   help="the sender between ticks: yield its CPU (default; the kernel's "
                        "loopback receive work runs on it), sleep, or busy-wait")
    p.add_argument("--arrivals", choices=("poisson", "even"), default="poisson",
                   help="when the sender's ticks are due: gaps drawn from an exponential "
                        "distribution of mean 1/rate (default; a Poisson process, seeded by "
                        "--seed), or exactly 1/rate apart (a metronome, which can keep one "
                        "phase to a periodic host stall for long stretches)")
    p.add_argument("--json", default=None, metavar="PATH", help="results as JSON ('-': stdout)")
    p.add_argument("--plot", default=None, metavar="SVG", help="rate vs end-to-end p99 plot")
    p.add_argument("--markdown", default=None, metavar="MD", help="tables for docs/results.md")
    a = p.parse_args(argv)
    if a.shm_slots < 2 or a.shm_slots & (a.shm_slots - 1):
        p.error("--shm-slots: power of two >= 2")
    if a.ring < 2 or a.ring & (a.ring - 1) or a.batch < 1 or a.symbols < 1 or a.symbols > 65536:
        p.error("--ring: power of two >= 2; --batch >= 1; 1 <= --symbols <= 65536")
    if a.cpus is not None and (len(a.cpus) != 4 or len(set(a.cpus)) != 4 or min(a.cpus) < 0):
        p.error("--cpus: four different CPU numbers (sender,handler,collector,consumer)")
    if a.sender_burst < 1:
        p.error("--sender-burst: >= 1")
    if a.latency_sender:
        a.no_gso, a.pace, a.sender_burst = True, "spin", a.per_packet
    if a.gro and (a.no_gso or a.ring < 64 * a.per_packet):
        p.error("--gro: needs the sender's GSO (no --no-gso) and --ring >= 64 x --per-packet")
    if a.rps_cpu not in ("auto", "off", "handler") and not a.rps_cpu.isdigit():
        p.error("--rps-cpu: auto, off, handler or a CPU number")
    if a.sources is None:
        a.sources = ["udp", "shm"] if a.sweep else ["udp"]

    import engine
    import handlers
    import osinfo
    import sweep
    quiet = a.json == "-"
    out = sys.stderr if quiet else sys.stdout

    def log(*x):
        print(*x, file=out, flush=True)

    # a SIGTERM (timeout, kill) unwinds through the finally below: the
    # loopback RPS setting is restored and the consumer stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    env = engine.Env(a.device, a.backend)
    rps_old = None
    try:
        hdr = (f"gdrpy trading feed: backend {env.backend}, device {a.device} "
               f"({'none - ' + SIM_LABEL if env.sim else env.ctx.info.get('gpu_name')}), "
               f"ring {a.ring} x 32 B ticks, batches up to {a.batch}, {a.symbols} symbols")
        log(hdr)
        if env.sim:
            log(f"*** {SIM_LABEL}: the numbers time CPU threads on this host, not a GPU ***")
        else:
            log(f"  consumer: one-warp persistent kernel, NVRTC {env.gpu.arch}")
        log("  latency: end-to-end = ack seen by the collector thread - sender's CLOCK_MONOTONIC "
            "stamp in the tick (socket queueing included); stages beside it")
        cpus, note, spare = sweep.pick_cpus(env.ctx, a.cpus)
        a.picked = (cpus, note)
        rps_cpu, rps_note = -1, "loopback receive processing on the sender's CPU (no RPS)"
        if a.rps_cpu != "off":
            want = (spare if a.rps_cpu == "auto" else cpus[1] if a.rps_cpu == "handler"
                    else int(a.rps_cpu))
            if want < 0 or (want in cpus and a.rps_cpu != "handler"):
                rps_note = f"--rps-cpu {a.rps_cpu}: no free CPU for it; not set"
            else:
                rps_old, rps_note = osinfo.set_loopback_rps(want)
                rps_cpu = want if rps_old is not None else -1
        a.rps = rps_cpu
        log(f"loopback: {rps_note}")
        if a.sweep:
            rep = sweep.run_sweep(env, a, log)
        else:
            log(f"threads: {note}")
            log(f"gdrpy path: {a.slots.upper()} slots")
            log(sweep.HEADER)
            pts = []
            for src in a.sources:
                for h in a.handlers:
                    for path in a.paths:
                        for rate in a.rate:
                            r = handlers.run_point(
                                env, h, path, src, rate, a.seconds or 2.0, nsym=a.symbols,
                                seed=a.seed, nslots=a.ring, batch=a.batch, cpus=cpus,
                                rcvbuf=a.rcvbuf, on_full=a.on_full, inject_skip=a.inject_skip,
                                delay_ns=a.consumer_delay_ns, per_packet=a.per_packet,
                                ticks=a.ticks, shm_slots=a.shm_slots, gso=not a.no_gso,
                                pace=a.pace, rps_cpu=rps_cpu, gro=a.gro,
                                burst=a.sender_burst, plain=a.slots == "plain",
                                arrivals=a.arrivals)
                            r["kind"] = "run"
                            pts.append(r)
                            log(sweep.fmt_row(r))
                            log(sweep.stage_row(r))
                            if sweep.tail_row(r):
                                log(sweep.tail_row(r))
                            if osinfo.stall_row(r):
                                log(osinfo.stall_row(r))
                            if a.stages:
                                log(osinfo.evidence_row(r))
            rep = {"points": pts, "threads": note}
        rep.update(tool="examples/trading_feed.py", backend=env.backend, sim=env.sim,
                   loopback=rps_note,
                   consumer=SIM_LABEL if env.sim else "persistent GPU kernel (two warps)",
                   latency_definition="end-to-end: sender's CLOCK_MONOTONIC stamp in the tick "
                                      "-> the ack collector sees the consumer's ack count "
                                      "cover it (same host clock)")
        rb = next((r.get("rcvbuf") for r in rep["points"] if r.get("rcvbuf")), None)
        if rb:
            log(f"socket receive buffer: asked {rb['requested']:,} B with {rb['how']}, "
                f"got {rb['got']:,} B")
        # agreement: lossless runs of the same feed (same tick count) produced
        # the same per-symbol sums, whichever handler and path
        groups: dict = {}
        for r in rep["points"]:
            if r.get("loss") and r["loss"]["lost"] == 0 and "sums_digest" in r:
                groups.setdefault(r["loss"]["generated"], set()).add(r["sums_digest"])
        dig = {k for k, v in groups.items() if len(v) > 1}
        same = [k for k, v in groups.items() if len(v) == 1]
        for r in rep["points"]:
            r.pop("vwap", None)
        bad = [r for r in rep["points"] if r.get("error") or r.get("checks_ok") is False]
        failed = [(r["source"], r["handler"], r["path"], r["offered_per_s"], r.get("error"))
                  for r in bad]
        log(f"checks: {len(rep['points']) - len(bad)} of {len(rep['points'])} runs clean "
            "(no torn, reordered or duplicated ticks; consumer count = forwarded; loss "
            "accounted)" + (f"; FAILED: {failed}" if bad else ""))
        if rep.get("zero_loss_capacity"):
            log("highest zero-loss offered rate: " + ", ".join(
                f"{k} {v:,.0f}/s" for k, v in rep["zero_loss_capacity"].items()))
        if rep.get("done_when"):
            log("done-when:")
            for d in rep["done_when"]:
                log(f"  [{'PASS' if d['ok'] else 'SHORT'}] {d['what']}: {d['measured']}"
                    + (f"; bound: {d['bound']}" if d["bound"] else ""))
        rep["results_agree"] = not dig
        if groups:
            log("per-symbol sums of lossless runs of the same feed agree across handlers and "
                f"paths: {'yes' if not dig else 'NO'} ({len(groups)} feed length(s), "
                f"{sum(len(v) for v in groups.values())} distinct result(s))")
        if env.sim:
            log(f"*** {SIM_LABEL} ***")
    finally:
        osinfo.restore_loopback_rps(rps_old)
        env.close()
    if a.plot:
        sweep.write_svg(rep["points"], a.plot,
                        "gdrpy trading feed: offered rate vs end-to-end p99" +
                        (f" ({SIM_LABEL})" if rep["sim"] else ""))
        log(f"plot written to {a.plot}")
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(sweep.markdown(rep))
        log(f"markdown written to {a.markdown}")
    if a.json:
        text = json.dumps(rep, indent=1, default=lambda o: o.tolist() if hasattr(o, "tolist")
                          else str(o))
        if a.json == "-":
            print(text)
        else:
            with open(a.json, "w") as f:
                f.write(text)
            log(f"results written to {a.json}")
    del same
    return 1 if bad or not rep["results_agree"] else 0


if __name__ == "__main__":
    sys.exit(main())
