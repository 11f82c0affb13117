"""The feed handlers and one measured run ("point").

* The Python handler (``pyhandler.py``) on gdrpy's public API: a fixed
  number of calls per batch (receive into a numpy array of ticks, sequence
  check, one ``Channel.send_many``, one stamp call); back-pressure: a batch
  that finds the ring full (``ChannelFullError`` with timeout 0) is counted
  and then waits.  It never waits for an ack.
* The C handler is ``feed_handler_run`` in feedcore.c (gdrpy.h +
  gdrpy_channel.h), called here through ctypes with the GIL released.

Both stamp every tick (send time from the tick, receive, published) into the
ack collector's ring; the collector (a C thread, the same for both) turns
each advance of the consumer's ack word into latencies.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import socket
import subprocess

import numpy as np
import osinfo
from engine import BUILD, SHM_HDR, SHM_MAGIC, SHM_SLOT, HCfg, HStats, Ring
from pyhandler import py_handler

UDP_GRO = 104          # <netinet/udp.h>: the socket takes coalesced datagrams


def udp_socket(rcvbuf: int, gro: bool = False) -> tuple[socket.socket, dict]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    info: dict = {"requested": rcvbuf}
    if gro:
        # the sender's UDP_SEGMENT sends then reach the socket as one
        # message of up to 64 datagrams back to back (Linux >= 5.0)
        s.setsockopt(socket.IPPROTO_UDP, UDP_GRO, 1)
        info["gro"] = True
    try:
        s.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), rcvbuf)
        info["how"] = "SO_RCVBUFFORCE"
    except OSError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        info["how"] = "SO_RCVBUF (capped by net.core.rmem_max)"
    info["got"] = s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    s.bind(("127.0.0.1", 0))
    s.setblocking(False)
    return s, info


def udp_rcvbuf_errors() -> int | None:
    """The kernel's UDP RcvbufErrors counter (datagrams dropped because a
    socket's receive buffer was full; host-wide)."""
    try:
        with open("/proc/net/snmp") as f:
            lines = [ln.split() for ln in f if ln.startswith("Udp:")]
        return int(lines[1][lines[0].index("RcvbufErrors")])
    except (OSError, ValueError, IndexError):
        return None


class ShmRing:
    """The shared-memory source (feed.h): a memfd the sender maps too."""

    def __init__(self, nslots: int):
        self.nslots = nslots
        self.size = SHM_HDR + nslots * SHM_SLOT
        self.fd = os.memfd_create("gdrpy-feed-shm", 0)
        os.ftruncate(self.fd, self.size)
        self.mm = mmap.mmap(self.fd, self.size)
        self.hdr = np.frombuffer(self.mm, dtype=np.uint64, count=SHM_HDR // 8)
        self.hdr[0], self.hdr[1] = SHM_MAGIC, nslots
        self.slots = np.frombuffer(self.mm, dtype=np.uint8,
                                   offset=SHM_HDR).reshape(nslots, SHM_SLOT)
        self.marks = self.slots.view(np.uint64)[:, 7]
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))

    def close(self) -> None:
        self.hdr = self.slots = self.marks = None
        self.addr = 0
        try:
            self.mm.close()
        except BufferError:
            pass
        os.close(self.fd)


def run_point(env, handler: str, path: str, src: str, rate: float, seconds: float, *,
              nsym: int = 16, seed: int = 7, nslots: int = 4096, batch: int = 128,
              shm_slots: int = 1 << 18, rcvbuf: int = 64 << 20, on_full: str = "wait",
              inject_skip: int = 0, delay_ns: int = 0, per_packet: int = 1,
              cpus: tuple = (-1, -1, -1, -1), ticks: int = 0, check: bool = True,
              gso: bool = True, pace: str = "yield", rps_cpu: int = -1,
              gro: bool = False, burst: int = 256, plain: bool = False,
              arrivals: str = "poisson") -> dict:
    """One measured run; returns its record (JSON-able).  plain: the gdrpy
    path's channel uses PLAIN slots instead of LL (the cuMemcpy path always
    writes PLAIN's layout)."""
    from engine import (
        H_E2E,
        H_GPU,
        H_HANDLER,
        H_RECV_ACK,
        H_SOCKET,
        StallProbe,
        hist_stats,
        reference_sums,
        ring_is_plain,
        tail_attribution,
    )
    L = env.lib
    c_snd, c_hnd, c_ack, c_con = cpus
    batch = min(batch, nslots)
    rec: dict = {"handler": handler, "path": path, "source": src, "offered_per_s": rate,
                 "seconds": seconds, "ring_slots": nslots, "batch_max": batch,
                 "sim": env.sim, "on_full": on_full, "per_packet": per_packet,
                 "sender_mode": {"gso": gso, "pace": pace, "burst": burst,
                                 "arrivals": arrivals},
                 "slot_format": "plain" if ring_is_plain(path, plain) else "ll"}
    err = None
    snmp0 = None
    sock = shm = sender = probe = None
    allowed = os.sched_getaffinity(0)
    try:
        ring = Ring(env, handler, path, nslots, nsym, seed, delay_ns=delay_ns, plain=plain)
    except Exception as e:  # a point that could not be set up is reported
        rec.update(error=f"setting up the ring: {type(e).__name__}: {e}",
                   latency_us={k: {"n": 0} for k in ("end_to_end", "socket_or_shm", "handler",
                                                     "ring_consumer_ack", "recv_to_ack")})
        return rec
    try:
        ring.start(cpu=c_con)
        if L.feed_acks_start(env.acks, ring.ack_ptr, c_ack):
            raise RuntimeError("ack collector did not start")
        cmd = [os.path.join(BUILD, "feed_sender"), "--mode", src, "--rate", str(rate),
               "--seconds", str(seconds), "--symbols", str(nsym), "--seed", str(seed),
               "--cpu", str(c_snd), "--inject-skip", str(inject_skip),
               "--per-packet", str(per_packet), "--pace", pace, "--burst", str(burst),
               "--arrivals", arrivals]
        if ticks:
            cmd += ["--ticks", str(ticks)]
        pass_fds: tuple = ()
        if src == "udp":
            if gso:
                cmd.append("--gso")
            sock, rec["rcvbuf"] = udp_socket(rcvbuf, gro)
            rec["gro"] = gro
            cmd += ["--port", str(sock.getsockname()[1])]
            snmp0 = udp_rcvbuf_errors()
        else:
            shm = ShmRing(shm_slots)
            cmd += ["--shm-fd", str(shm.fd)]
            pass_fds = (shm.fd,)
            rec["shm_slots"] = shm_slots
        if c_hnd >= 0:
            os.sched_setaffinity(0, {c_hnd})
        roles = dict(zip(osinfo.ROLES, (*cpus, rps_cpu), strict=True))
        if not env.sim:
            roles.pop("consumer")
        os0 = osinfo.snapshot(list(roles.values()))
        threads = (c_snd, c_hnd, c_ack) + ((c_con,) if env.sim else ())
        if min(threads) < 0:
            rec["host_stalls"] = {"skipped": "the run's threads are not pinned: a probe "
                                             "would take CPU time from them"}
        elif (probe_cpu := osinfo.spare_cpu(list(roles.values()), allowed)) is None:
            rec["host_stalls"] = {"skipped": "no physical core left over for the stall probe"}
        else:
            try:
                probe = StallProbe(L, probe_cpu)
            except RuntimeError as e:      # a diagnostic: the run goes on without it
                rec["host_stalls"] = {"skipped": str(e)}
        sender = subprocess.Popen(cmd, stdout=subprocess.PIPE, pass_fds=pass_fds, text=True)
        max_s = seconds + 10.0
        if handler == "c":
            cfg = HCfg(src=0 if src == "udp" else 1, path=0 if path == "gdrpy" else 1,
                       on_full=0 if on_full == "wait" else 1, cpu=c_hnd,
                       fd=sock.fileno() if sock else -1, per_packet_max=max(per_packet, 1),
                       shm=shm.addr if shm else None,
                       chan=L.feed_cchan_chan(ring.cchan) if ring.cchan else None,
                       ctx=env.cctx() if path == "cuMemcpy" else 0,
                       dev_ctrl=ring.dev_ctrl, ring=ring.ring, consumed=ring.consumed_ptr,
                       nslots=nslots, slot_stride=ring.slot_stride, batch=batch,
                       acks=env.acks, max_ns=int(max_s * 1e9), gro=int(gro and src == "udp"),
                       full_timeout_ns=int(10e9),
                       idle_end_ns=int(0.5e9) if src == "udp" else 0)
            hs = HStats()
            rc = L.feed_handler_run(ctypes.byref(cfg), ctypes.byref(hs))
            st = {f: int(getattr(hs, f)) for f in (x[0] for x in HStats._fields_[:-3])}
            if rc:
                err = f"C handler: {hs.msg.decode(errors='replace')}"
        else:
            st = py_handler(ring, env, src, sock, shm, batch, max_s, on_full, 0.5, per_packet,
                            gro)
        if probe is not None:
            rec["host_stalls"] = probe.stop()
        rec["os"] = osinfo.delta(os0, osinfo.snapshot(list(roles.values())), roles)
        out, _ = sender.communicate(timeout=seconds + 20)
        snd = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        rec["sender"] = snd
        rec["handler_stats"] = st
    except BaseException as e:  # recorded; the consumer is stopped below
        err = f"{type(e).__name__}: {e}"
        if sender is not None and sender.poll() is None:
            sender.kill()
    finally:
        if probe is not None:
            probe.stop()
        try:
            os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        except OSError:
            pass
    fwd = rec.get("handler_stats", {}).get("forwarded", 0)
    try:
        rec["consumer_status"] = ring.shutdown(fwd)
    except RuntimeError as e:
        err = err or str(e)
        rec["consumer_status"] = ring.status()
    L.feed_acks_stop(env.acks)
    ci = (ctypes.c_uint64 * 5)()
    L.feed_acks_thread_info(env.acks, ci)
    rec["collector"] = dict(zip(("max_gap_ns", "gaps_50us", "ctx_invol", "ctx_vol", "minflt"),
                                (int(v) for v in ci), strict=True))
    rec["consumer_stuck"] = ring.live      # did not stop: its memory stays allocated
    res = ring.results()
    if snmp0 is not None:
        snmp1 = udp_rcvbuf_errors()
        rec["socket_drops"] = (snmp1 - snmp0) if snmp1 is not None else None
    if sock is not None:
        sock.close()
    if shm is not None:
        shm.close()
    ring.close()
    rec["error"] = err
    rec["consumer"] = {k: v for k, v in res.items() if k != "sums"}
    lat = {"end_to_end": hist_stats(L, env.acks, H_E2E),
           "socket_or_shm": hist_stats(L, env.acks, H_SOCKET),
           "handler": hist_stats(L, env.acks, H_HANDLER),
           "ring_consumer_ack": hist_stats(L, env.acks, H_GPU),
           "recv_to_ack": hist_stats(L, env.acks, H_RECV_ACK)}
    rec["latency_us"] = lat
    rec["tail"] = tail_attribution(L, env.acks)
    rec["stamp_waits"] = int(L.feed_acks_stamp_waits(env.acks))
    st = rec.get("handler_stats")
    snd = rec.get("sender", {})
    if st is None or not snd:
        return rec
    gen = int(snd.get("generated", 0))
    first, last = int(L.feed_acks_first_ns(env.acks)), int(L.feed_acks_last_ns(env.acks))
    t0 = st["t_first_recv"] or first
    rec["processed"] = res["processed"]
    rec["processed_per_s"] = res["processed"] / ((last - t0) / 1e9) if last > t0 else None
    rec["sender_per_s"] = snd.get("achieved_per_s")
    lost = gen - res["processed"]
    tail = gen - st["last_seq"]
    rec["loss"] = {
        "generated": gen, "lost": lost, "injected": int(snd.get("skipped", 0)),
        "sender_failed": int(snd.get("failed", 0)),
        "shm_ring_full": int(snd.get("dropped_ring_full", 0)),
        "socket_drops_host_counter": rec.get("socket_drops"),
        "handler_missing": st["missing"], "missing_at_tail": tail,
        "handler_ring_full_dropped": st["dropped_full"],
        "consumer_missing": res["missing"],
        "accounted": st["missing"] + tail + st["dropped_full"] == lost,
    }
    rec["ring"] = {"full_events": st["full_events"], "stalled_ms": st["full_wait_ns"] / 1e6,
                   "dropped": st["dropped_full"]}
    wall = (st["t_last_fwd"] - st["t_first_recv"]) if st["t_last_fwd"] else 0
    rec["handler_busy"] = st["busy_ns"] / wall if wall > 0 else None
    rec["mean_batch"] = st["forwarded"] / st["batches"] if st["batches"] else 0
    if check:
        pq, q, cnt = res["sums"][:, 0], res["sums"][:, 1], res["sums"][:, 2]
        rec["vwap"] = [float(a) / float(b) / 1e4 if b else 0.0 for a, b in zip(pq, q, strict=True)]
        rec["sums_digest"] = int(np.bitwise_xor.reduce(
            (pq * np.uint64(3) + q * np.uint64(5) + cnt).astype(np.uint64)))
        ok = (res["torn"] == 0 and res["backward"] == 0 and res["badlen"] == 0
              and res["processed"] == st["forwarded"] and res["final"])
        if ok and lost == 0:        # nothing lost: the exact reference is cheap to state
            rp, rq, rc = reference_sums(gen, [], seed, nsym)
            ok = bool((rp == pq).all() and (rq == q).all() and (rc == cnt).all())
            rec["reference_match"] = ok
        rec["checks_ok"] = ok
    return rec
