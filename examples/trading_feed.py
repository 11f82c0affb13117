#!/usr/bin/env python3
"""Trading feed: UDP market data -> a tick ring in GPU memory -> a persistent kernel.

    python examples/trading_feed.py                      # GPU: gdrpy path and cuMemcpy path
    python examples/trading_feed.py --backend sim        # no GPU: a CPU thread stands in

What runs
---------
* A **feed simulator** (a separate process, so it never shares the handler's
  interpreter) sends ``--ticks`` market-data packets over UDP to 127.0.0.1 at
  ``--rate`` ticks/s, then an END packet, and exits by itself.  A packet is 32
  bytes, little-endian: seq u64, symbol u32, qty u32, price f64, send time
  u64 (CLOCK_MONOTONIC ns).  The feed is deterministic (``--seed``), so the
  handler can recompute the expected per-symbol VWAP.
* The **feed handler** (this process) busy-polls the socket, checks sequence
  numbers (gaps from loss, late packets from reordering, duplicates: all
  counted and reported, never silently dropped), and writes each tick into
  a ring of 64-byte slots in GPU memory: the 32-byte tick first, then the
  slot's ring index (a separate store after the sfence) at byte 56.
* A **persistent kernel** (NVRTC) consumes the ring in order: it waits for
  slot ``i`` to carry ring index ``i`` (acquire load, then
  ``__threadfence()``), updates per-symbol state in GPU memory (volume-
  weighted average price and a signal: +1 when the last price is above
  VWAP by more than ``--band``, -1 below, 0 otherwise), and publishes the
  results plus "last ring index processed" (the ack) into pinned host memory.
* Ring overrun: the handler never overwrites a slot the kernel has not
  acknowledged.  With ``--on-full wait`` (default) it waits for room and
  counts the stall; with ``--on-full drop`` it drops the tick and counts and
  lists it.  The kernel also checks: a slot from a later lap than expected
  stops it with status "lapped", reported as an error.

The same feed then runs through a **cuMemcpy baseline**: the handler writes
the tick and then the ring index with two ``cuMemcpyHtoD`` calls
(``ctx.memcpy_htod``, gdrpy's call from C) into the same ring, consumed by
the same kernel.

Latency, and how it is measured
-------------------------------
"tick -> GPU" is the time from the handler's ``recv`` returning the packet to
the handler seeing the kernel's ack for that tick in pinned host memory (the
handler spins on the ack for up to ``--ack-spin-us`` after each write).  It
is an upper bound on receive -> kernel observed: it includes the ack's trip
back over PCIe (about 1 us) and the spin loop's granularity.  We do not use
``%globaltimer``: the GPU's clock is not the host's clock.  Acks that arrive
after the spin window are timestamped when the handler next sees them; the
report gives how many were seen inside the window.  A production handler
would not wait for acks.

On ``--backend sim`` a CPU thread stands in for the kernel and the output says
so on every section: those numbers time Python threads, not a GPU.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np

TICK = struct.Struct("<QIIdQ")          # seq, symbol, qty, price, send_ns
assert TICK.size == 32
SEQ = struct.Struct("<Q")
END_SEQ = (1 << 64) - 1
SLOT = 64                               # ring slot: tick @0, ring index @56
SLOT_MARK = 56

# GPU buffer layout (pinned + mapped)
CTRL_STOP_AT = 0                        # u64: 0 = run; k = stop once k-1 ticks are processed
CTRL_ABORT = 8                          # u32: non-zero = exit now
RING_OFF = 4096

# host results layout (pinned host memory the kernel writes)
H_ACK, H_STATUS, H_DISC, H_BADSYM, H_LASTSEQ, H_LAPPED = 0, 8, 16, 24, 32, 40
H_SYM = 256                             # per symbol 32 B: vwap f64, last f64, count u64, signal i32
SYM_OUT = 32

ST_NONE, ST_RUNNING, ST_STOPPED, ST_TIMEOUT, ST_ABORTED, ST_LAPPED = range(6)
STATUS = {0: "not started", 1: "running", 2: "stopped", 3: "gave up (watchdog timeout)",
          4: "aborted", 5: "LAPPED (ring overrun reached the consumer)"}

SIM_LABEL = "SIM: CPU thread stands in for the GPU kernel"

from gdrpy.tools.pingpong import DEVICE_HELPERS_SRC  # noqa: E402  (the kernels' shared device helpers)

KERNEL_SRC = DEVICE_HELPERS_SRC + r"""
struct SymAcc { double pq; double q; u64 count; u64 pad; };

/* One thread.  ring/ctrl/acc: GPU memory (ring and ctrl written by the CPU
 * through the BAR1 mapping or cuMemcpy); out: pinned host memory. */
extern "C" __global__ void feed_consumer(const unsigned char *ring, u32 nslots,
                                         const unsigned char *ctrl, unsigned char *accp,
                                         u32 nsym, unsigned char *out, u64 timeout_ns,
                                         double band, u64 delay_ns)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    SymAcc *acc = (SymAcc *)accp;
    volatile u64 *h64 = (volatile u64 *)out;
    volatile u32 *h32 = (volatile u32 *)out;
    const u64 *stopp = (const u64 *)(ctrl + 0);
    const u32 *abortp = (const u32 *)(ctrl + 8);
    u64 expected = 1, last_tick = 0, disc = 0, bad = 0;
    u32 slot_i = 0;
    h32[2] = 1u;                                   /* running */
    __threadfence_system();
    u64 idle0 = gdr_globaltimer();
    u32 polls = 0;
    for (;;) {
        const unsigned char *slot = ring + (u64)slot_i * 64ull;
        u64 mark = gdr_ld_acquire_u64((const u64 *)(slot + 56));
        if (mark == expected) {
            __threadfence();
            u64 tseq = *(const volatile u64 *)(slot + 0);
            u32 sym = *(const volatile u32 *)(slot + 8);
            u32 qty = *(const volatile u32 *)(slot + 12);
            double px = *(const volatile double *)(slot + 16);
            if (last_tick != 0 && tseq != last_tick + 1) ++disc;
            last_tick = tseq;
            if (sym < nsym) {
                SymAcc *a = &acc[sym];
                a->pq += px * (double)qty;
                a->q += (double)qty;
                a->count += 1;
                double vwap = a->q > 0.0 ? a->pq / a->q : px;
                int sig = px > vwap * (1.0 + band) ? 1 : (px < vwap * (1.0 - band) ? -1 : 0);
                volatile unsigned char *o = out + 256 + (u64)sym * 32ull;
                *(volatile double *)(o + 0) = vwap;
                *(volatile double *)(o + 8) = px;
                *(volatile u64 *)(o + 16) = a->count;
                *(volatile int *)(o + 24) = sig;
            } else {
                ++bad;
            }
            if (delay_ns) {                        /* test knob: a slow consumer */
                u64 t = gdr_globaltimer();
                while (gdr_globaltimer() - t < delay_ns) { }
            }
            h64[2] = disc;
            h64[3] = bad;
            h64[4] = last_tick;
            __threadfence_system();                /* results before the ack */
            h64[0] = expected;                     /* ack: ring index processed */
            ++expected;
            if (++slot_i == nslots) slot_i = 0;
            idle0 = gdr_globaltimer();
            polls = 0;
            continue;
        }
        if (mark > expected) {                     /* a later lap overwrote an unread tick */
            h64[5] = mark;
            __threadfence_system();
            h32[2] = 5u;
            __threadfence_system();
            return;
        }
        if ((++polls & 63u) == 0) {
            u64 stop_at = gdr_ld_acquire_u64(stopp);
            u32 st = 0;
            if (stop_at != 0 && expected >= stop_at) st = 2u;
            else if (gdr_ld_acquire_u32(abortp)) st = 4u;
            else if (gdr_globaltimer() - idle0 > timeout_ns) st = 3u;
            if (st) {
                h32[2] = st;
                __threadfence_system();
                return;
            }
        }
    }
}
"""


# ---------------------------------------------------------------------------
# The feed

def make_feed(n: int, nsym: int, seed: int):
    """Deterministic ticks: (symbol u32[n], qty u32[n], price f64[n]); tick i has seq i+1."""
    rng = np.random.default_rng(seed)
    sym = rng.integers(0, nsym, size=n, dtype=np.uint32)
    qty = rng.integers(1, 1001, size=n, dtype=np.uint32)
    base = rng.uniform(20.0, 500.0, size=nsym)
    drift = np.sin(np.arange(n) / 700.0 + sym) * 0.01
    noise = rng.normal(0.0, 0.002, size=n)
    price = np.round(base[sym] * (1.0 + drift + noise), 2)
    return sym, qty, price


def sender_main(a) -> int:
    """The feed simulator process: bounded by --ticks and --max-seconds."""
    sym, qty, price = make_feed(a.ticks, a.symbols, a.seed)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dest = ("127.0.0.1", a.port)
    buf = bytearray(TICK.size)
    pack = TICK.pack_into
    send = sock.sendto
    now = time.monotonic_ns
    order = list(range(a.ticks))
    if a.inject_reorder:
        k = a.inject_reorder
        for i in range(k - 1, a.ticks - 1, k):      # swap seq k*j with k*j+1
            order[i], order[i + 1] = order[i + 1], order[i]
    period = int(1e9 / a.rate) if a.rate > 0 else 0
    t_end = now() + int(a.max_seconds * 1e9)
    time.sleep(0.05)
    t0 = now()
    sent = 0
    for j, i in enumerate(order):
        seq = i + 1
        if period:
            due = t0 + j * period
            while now() < due:
                pass
        if a.inject_loss and seq % a.inject_loss == 0:
            continue
        pack(buf, 0, seq, int(sym[i]), int(qty[i]), float(price[i]), now())
        try:
            send(buf, dest)
        except OSError:       # e.g. ENOBUFS: the handler sees it as a gap
            continue
        sent += 1
        if now() > t_end:
            break
    dur = (now() - t0) / 1e9
    end = TICK.pack(END_SEQ, 0, 0, dur, sent)
    for _ in range(3):
        send(end, dest)
        time.sleep(0.001)
    sock.close()
    return 0


# ---------------------------------------------------------------------------
# Consumers: the GPU kernel, or (sim only) a CPU thread

class SimConsumer(threading.Thread):
    """SIM only: a CPU thread running the kernel's protocol on the sim
    buffer's device side."""

    def __init__(self, dev, out, nslots, nsym, timeout_s, band, acc_off, delay_s=0.0):
        super().__init__(name="gdrpy-sim-feed-consumer", daemon=True)
        self.delay_s = delay_s
        self.dev, self.out, self.nslots, self.nsym = dev, out, nslots, nsym
        self.timeout_s, self.band, self.acc_off = timeout_s, band, acc_off
        self.error = None

    def run(self):
        try:
            self._run()
        except BaseException as e:
            self.error = e
            self.out[H_STATUS:H_STATUS + 4].view(np.uint32)[0] = ST_ABORTED

    def _run(self):
        dev, out = self.dev, self.out
        h64 = out[:64].view(np.uint64)
        h32 = out[:64].view(np.uint32)
        accv = dev[self.acc_off:self.acc_off + 32 * self.nsym].view(np.float64).reshape(-1, 4)
        unpack_tick, unpack_q = TICK.unpack_from, SEQ.unpack_from
        pack_sym = struct.Struct("<ddQi").pack_into
        band = self.band
        expected, last_tick, disc, bad, slot_i = 1, 0, 0, 0, 0
        h32[H_STATUS // 4] = ST_RUNNING
        idle0 = time.monotonic()
        polls = 0
        sleep = time.sleep
        sums = {}
        while True:
            off = RING_OFF + slot_i * SLOT
            mark = unpack_q(dev, off + SLOT_MARK)[0]
            if mark == expected:
                tseq, sym, qty, px, _ = unpack_tick(dev, off)
                if last_tick and tseq != last_tick + 1:
                    disc += 1
                last_tick = tseq
                if sym < self.nsym:
                    pq, q, cnt = sums.get(sym, (0.0, 0.0, 0))
                    pq += px * qty
                    q += qty
                    cnt += 1
                    sums[sym] = (pq, q, cnt)
                    accv[sym, 0], accv[sym, 1] = pq, q
                    vwap = pq / q if q > 0 else px
                    sig = 1 if px > vwap * (1 + band) else (-1 if px < vwap * (1 - band) else 0)
                    pack_sym(out, H_SYM + sym * SYM_OUT, vwap, px, cnt, sig)
                else:
                    bad += 1
                if self.delay_s:
                    sleep(self.delay_s)         # test knob: a slow consumer
                h64[H_DISC // 8], h64[H_BADSYM // 8], h64[H_LASTSEQ // 8] = disc, bad, last_tick
                h64[H_ACK // 8] = expected
                expected += 1
                slot_i = slot_i + 1 if slot_i + 1 < self.nslots else 0
                idle0 = time.monotonic()
                continue
            if mark > expected:
                h64[H_LAPPED // 8] = mark
                h32[H_STATUS // 4] = ST_LAPPED
                return
            polls += 1
            if (polls & 15) == 0:
                stop_at = unpack_q(dev, CTRL_STOP_AT)[0]
                if stop_at and expected >= stop_at:
                    h32[H_STATUS // 4] = ST_STOPPED
                    return
                if unpack_q(dev, CTRL_ABORT)[0] & 0xFFFFFFFF:
                    h32[H_STATUS // 4] = ST_ABORTED
                    return
                if time.monotonic() - idle0 > self.timeout_s:
                    h32[H_STATUS // 4] = ST_TIMEOUT
                    return
            sleep(0)     # one interpreter, one GIL: let the handler run


class Engine:
    """GPU buffer (ring + control + per-symbol state), its pin and mapping,
    the host results, and the consumer.  ``close()`` always stops the
    consumer first."""

    def __init__(self, ctx, nslots, nsym, kernel_timeout_s, band, delay_s=0.0):
        import gdrpy
        self.delay_s = delay_s
        self.ctx, self.nslots, self.nsym = ctx, nslots, nsym
        self.kernel_timeout_s, self.band = kernel_timeout_s, band
        self.sim = ctx.is_sim
        self.rt = self.module = self.stream = self.host = None
        self.buf = self.pin = self.m = None
        self.consumer = None
        self.live = False
        self.stuck = False
        self.acc_off = RING_OFF + nslots * SLOT
        self.size = self.acc_off + nsym * 32
        self.out_size = H_SYM + nsym * SYM_OUT
        self.buf = gdrpy.memory.alloc(self.size, ctx=ctx)
        self.pin = ctx.pin(self.buf)
        self.m = self.pin.map()
        if self.sim:
            self._out_store = np.zeros(self.out_size, dtype=np.uint8)
            self.out = self._out_store
            self.out_ptr = self.out.ctypes.data
        else:
            from gdrpy.tools.pingpong import GpuRuntime
            self.rt = GpuRuntime(ctx.device)
            t0 = time.perf_counter()
            self.module = self.rt.compile(KERNEL_SRC, "gdrpy_trading_feed.cu")
            self.compile_s = time.perf_counter() - t0
            self.func = self.module.function("feed_consumer")
            self.stream = self.rt.stream()
            self.host = self.rt.host_alloc(self.out_size)
            self.out = self.host.array(np.uint8)
            self.out_ptr = self.host.ptr
        self.ack = ctypes.c_uint64.from_address(self.out_ptr + H_ACK)
        self.status = ctypes.c_uint32.from_address(self.out_ptr + H_STATUS)

    def start(self):
        self.m.write(0, bytes(self.size))       # ring, control, per-symbol state = 0
        self.out[:] = 0
        if self.sim:
            self.consumer = SimConsumer(self.buf.numpy(), self.out, self.nslots, self.nsym,
                                        self.kernel_timeout_s, self.band, self.acc_off,
                                        self.delay_s)
            self.consumer.start()
        else:
            from gdrpy.tools.pingpong import KernelArgs, launch
            self.rt.make_current()
            p = self.buf.ptr
            args = KernelArgs((ctypes.c_uint64, p + RING_OFF), (ctypes.c_uint32, self.nslots),
                              (ctypes.c_uint64, p), (ctypes.c_uint64, p + self.acc_off),
                              (ctypes.c_uint32, self.nsym), (ctypes.c_uint64, self.host.dptr),
                              (ctypes.c_uint64, int(self.kernel_timeout_s * 1e9)),
                              (ctypes.c_double, self.band),
                              (ctypes.c_uint64, int(self.delay_s * 1e9)))
            launch(self.rt, self.func, (1,), (1,), args, self.stream,
                   what="cuLaunchKernel(feed_consumer)")
        self.live = True
        deadline = time.monotonic() + max(10.0, self.kernel_timeout_s)
        while self.status.value != ST_RUNNING:
            if self.status.value != ST_NONE or time.monotonic() > deadline:
                raise RuntimeError(f"the consumer did not start (status "
                                   f"{STATUS.get(self.status.value, '?')})")
            if not self.sim and self.stream.done():
                raise RuntimeError("the consumer kernel exited before it started polling")
            time.sleep(0.0001)

    def _exited(self, timeout_s) -> bool:
        if self.sim:
            self.consumer.join(timeout_s)
            return not self.consumer.is_alive()
        from gdrpy.tools.pingpong import wait_stream
        return wait_stream(self.stream, timeout_s)

    def stop(self, final_index: int):
        """Normal stop: the consumer exits once it has processed ``final_index``."""
        if not self.live:
            return
        self.m.write(CTRL_STOP_AT, (final_index + 1).to_bytes(8, "little"))
        if not self._exited(self.kernel_timeout_s + 5.0):
            self.abort()
            return
        self.live = False

    def abort(self):
        if not self.live:
            return
        try:
            self.m.write(CTRL_ABORT, (1).to_bytes(4, "little"))
        except Exception:
            pass
        if not self._exited(self.kernel_timeout_s + 5.0):
            self.stuck = True
            raise RuntimeError("the consumer did not exit; its memory is left allocated "
                               "(process exit frees it)")
        self.live = False

    def results(self):
        h = self.out[:64]
        rec = np.frombuffer(self.out[H_SYM:H_SYM + self.nsym * SYM_OUT].tobytes(),
                            dtype=np.dtype([("vwap", "<f8"), ("last", "<f8"), ("count", "<u8"),
                                            ("signal", "<i4"), ("pad", "<i4")]))
        return {
            "ack": int(h[0:8].view(np.uint64)[0]),
            "status": STATUS.get(int(h[8:12].view(np.uint32)[0]), "?"),
            "seq_discontinuities_seen_by_consumer": int(h[16:24].view(np.uint64)[0]),
            "bad_symbol": int(h[24:32].view(np.uint64)[0]),
            "last_tick_seq": int(h[32:40].view(np.uint64)[0]),
            "lapped_mark": int(h[40:48].view(np.uint64)[0]),
            "vwap": rec["vwap"].copy(), "last": rec["last"].copy(),
            "count": rec["count"].astype(np.int64), "signal": rec["signal"].copy(),
        }

    def close(self):
        try:
            self.abort()
        except RuntimeError as e:
            print(f"trading_feed: {e}", file=sys.stderr)
        if self.stuck:
            return
        self.consumer = None   # (sim) drops its numpy view of the buffer first
        for obj in (self.m, self.pin, self.buf, self.host, self.stream, self.module):
            try:
                if obj is not None:
                    obj.close()
            except Exception as e:
                print(f"trading_feed: cleanup: {e}", file=sys.stderr)


# ---------------------------------------------------------------------------
# The handler

def run_phase(eng: Engine, path: str, a) -> dict:
    """Run the whole feed once through ``path`` ('gdrpy' or 'cuMemcpy')."""
    sim = eng.sim
    nslots = eng.nslots
    eng.start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 8 << 20)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    port = sock.getsockname()[1]
    max_s = a.duration if a.duration else ((a.ticks / a.rate) * 2 + 5 if a.rate > 0 else 20.0)
    cmd = [sys.executable, os.path.abspath(__file__), "--feed-sender", "--port", str(port),
           "--ticks", str(a.ticks), "--rate", str(a.rate), "--symbols", str(a.symbols),
           "--seed", str(a.seed), "--max-seconds", str(max_s),
           "--inject-loss", str(a.inject_loss), "--inject-reorder", str(a.inject_reorder)]
    sender = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    ticks = a.ticks
    recv_ns, wr_ns, tick_seq = [0] * (ticks + 2), [0] * (ticks + 2), [0] * (ticks + 2)
    ack_ns = np.zeros(ticks + 2, dtype=np.int64)
    send_ns = [0] * (ticks + 2)
    in_spin = 0
    gaps, missing = [], set()
    late = dup = out_of_range = bad_packets = 0
    dropped, dropped_seqs = 0, []
    full_events, stall_ns = 0, 0
    end_seen, sent_total, sender_s = False, None, None
    exp = 1
    w = 0
    acked = 0
    rbuf = bytearray(64)
    pkt = memoryview(rbuf)[:TICK.size]
    recv_into = sock.recv_into
    unpack_q = SEQ.unpack_from
    unpack_tick = TICK.unpack_from
    ack = eng.ack
    now = time.monotonic_ns
    sleep = time.sleep
    spin_ns = int(a.ack_spin_us * 1e3)
    full_timeout_ns = int(eng.kernel_timeout_s * 1e9)
    deadline = now() + int((max_s + 5) * 1e9)
    if path == "gdrpy":
        mw = eng.m.write

        def put(off, idxb):
            mw(off, pkt)                 # the tick (stores + sfence) ...
            mw(off + SLOT_MARK, idxb)    # ... then its ring index
    else:
        h2d = eng.ctx.memcpy_htod
        base = eng.buf.ptr

        def put(off, idxb):
            h2d(base + off, pkt)         # cuMemcpyHtoD of the tick ...
            h2d(base + off + SLOT_MARK, idxb)   # ... then of its ring index
    first_recv = None
    idle = 0
    error = None
    try:
        while True:
            try:
                n = recv_into(rbuf)
            except BlockingIOError:
                cur = ack.value
                if cur != acked:
                    ack_ns[acked + 1:cur + 1] = now()
                    acked = cur
                idle += 1
                if (idle & 255) == 0:
                    if now() > deadline:
                        break
                    if eng.status.value != ST_RUNNING:
                        error = f"consumer status: {STATUS.get(eng.status.value, '?')}"
                        break
                if sim:
                    sleep(0)
                continue
            t = now()
            if n != TICK.size:
                bad_packets += 1
                continue
            seq = unpack_q(rbuf)[0]
            if seq == END_SEQ:
                _, _, _, sender_s, sent_total = unpack_tick(rbuf)
                end_seen = True
                break
            if first_recv is None:
                first_recv = t
            if seq == exp:
                exp += 1
            elif seq > exp:
                if seq > ticks:
                    out_of_range += 1
                    continue
                gaps.append((exp, seq - 1))
                missing.update(range(exp, seq))
                exp = seq + 1
            else:
                if seq in missing:
                    missing.discard(seq)
                    late += 1          # reordered: forwarded, counted
                else:
                    dup += 1           # duplicate: counted, not forwarded
                    continue
            if w + 1 - ack.value > nslots:           # ring full: consumer too slow
                full_events += 1
                if a.on_full == "drop":
                    dropped += 1
                    if len(dropped_seqs) < 20:
                        dropped_seqs.append(seq)
                    continue
                ts = now()
                while w + 1 - ack.value > nslots:
                    if now() - ts > full_timeout_ns:
                        raise RuntimeError(f"ring full for {eng.kernel_timeout_s} s: the consumer "
                                           f"stopped (status {STATUS.get(eng.status.value)})")
                    if sim:
                        sleep(0)
                stall_ns += now() - ts
            w += 1
            put(RING_OFF + ((w - 1) % nslots) * SLOT, w.to_bytes(8, "little"))
            tw = now()
            recv_ns[w], wr_ns[w], tick_seq[w] = t, tw, seq
            send_ns[w] = unpack_tick(rbuf)[4]
            lim = tw + spin_ns
            while True:
                cur = ack.value
                if cur >= w or now() > lim:
                    break
                if sim:
                    sleep(0)
            if cur != acked:
                ack_ns[acked + 1:cur + 1] = now()
                if cur == w and cur - acked == 1:
                    in_spin += 1
                acked = cur
        # drain: wait for the consumer to acknowledge everything written
        if error is None:
            t0 = now()
            while ack.value < w:
                if now() - t0 > full_timeout_ns or eng.status.value != ST_RUNNING:
                    error = (f"consumer acknowledged {ack.value} of {w} ticks (status "
                             f"{STATUS.get(eng.status.value, '?')})")
                    break
                if sim:
                    sleep(0)
            cur = ack.value
            if cur != acked:
                ack_ns[acked + 1:cur + 1] = now()
                acked = cur
        eng.stop(w)
    except BaseException:
        eng.abort()
        raise
    finally:
        sock.close()
        if not end_seen and sender.poll() is None:
            sender.kill()          # stopped early (error or deadline): the sender goes too
        try:
            sender.wait(timeout=10)
        except subprocess.TimeoutExpired:
            sender.kill()
            sender.wait()
    res = eng.results()
    if res["status"] != STATUS[ST_STOPPED] and error is None:
        error = f"consumer ended with status: {res['status']}"
    tail_lost = 0
    if end_seen and exp - 1 < ticks:      # seqs after the last one seen never arrived
        tail_lost = ticks - (exp - 1)
        gaps.append((exp, ticks))
    r = np.array(recv_ns[1:w + 1], dtype=np.int64)
    wr = np.array(wr_ns[1:w + 1], dtype=np.int64)
    sn = np.array(send_ns[1:w + 1], dtype=np.int64)
    ak = ack_ns[1:w + 1]
    ok = ak > 0
    from gdrpy.tools.pingpong import summarize
    dur = ((int(ak[ok].max()) - first_recv) / 1e9) if (ok.any() and first_recv) else 0.0
    out = {
        "path": path,
        "sim": sim,
        "end_seen": end_seen,
        "sent": int(sent_total) if sent_total is not None else None,
        "sender_seconds": sender_s,
        "received": int(w + dup + dropped + out_of_range),
        "forwarded": int(w),
        "processed": int(res["ack"]),
        "gaps": {"events": len(gaps), "missing": len(missing) + tail_lost,
                 "missing_at_tail": tail_lost, "first": gaps[:10],
                 "late_reordered": late, "duplicates": dup, "out_of_range": out_of_range,
                 "bad_packets": bad_packets,
                 "consumer_seq_discontinuities": res["seq_discontinuities_seen_by_consumer"]},
        "ring": {"slots": nslots, "full_events": full_events, "stalled_us": stall_ns / 1e3,
                 "policy": a.on_full, "dropped": dropped, "dropped_first": dropped_seqs,
                 "lapped": res["status"] == STATUS[ST_LAPPED]},
        "consumer_status": res["status"],
        "error": error,
        "latency_us": {
            "tick_to_gpu_ack": summarize((ak - r)[ok]),
            "handler_write": summarize(wr - r),
            "udp_send_to_recv": summarize(r - sn),
        },
        "acks_seen_in_spin": in_spin,
        "throughput": {
            "offered_per_s": (sent_total / sender_s) if (sent_total and sender_s) else None,
            "processed_per_s": (int(res["ack"]) / dur) if dur > 0 else None,
            "handler_capacity_per_s": (1e6 / max(summarize(wr - r).get("median", 0), 1e-3))
            if w else None,
        },
        "_seqs": np.array(tick_seq[1:w + 1], dtype=np.int64),
        "_res": res,
    }
    return out


def reference_vwap(seqs, nsym, ticks, seed):
    sym, qty, price = make_feed(ticks, nsym, seed)
    i = seqs - 1
    pq = np.bincount(sym[i], weights=price[i] * qty[i], minlength=nsym)
    q = np.bincount(sym[i], weights=qty[i].astype(np.float64), minlength=nsym)
    cnt = np.bincount(sym[i], minlength=nsym)
    with np.errstate(invalid="ignore", divide="ignore"):
        vwap = np.where(q > 0, pq / np.where(q > 0, q, 1), 0.0)
    return vwap, cnt


def check_results(ph: dict, a) -> dict:
    res = ph["_res"]
    vref, cref = reference_vwap(ph["_seqs"], a.symbols, a.ticks, a.seed)
    have = cref > 0
    rel = np.abs(res["vwap"][have] - vref[have]) / np.maximum(np.abs(vref[have]), 1e-300)
    return {"vwap_max_rel_diff": float(rel.max()) if rel.size else 0.0,
            "counts_match": bool(np.array_equal(res["count"], cref)),
            "ok": bool((rel.size == 0 or rel.max() < 1e-9) and np.array_equal(res["count"], cref))}


def fmt_phase(ph: dict, title: str) -> list[str]:
    from gdrpy.tools.pingpong import stats_header, stats_row
    sim = ph["sim"]
    tag = " [SIM]" if sim else ""
    L = [f"path: {title}{tag}"]
    g, rg, tp = ph["gaps"], ph["ring"], ph["throughput"]
    L.append(f"  ticks: sent {ph['sent'] if ph['sent'] is not None else '? (END not seen)'}, "
             f"received {ph['received']}, forwarded {ph['forwarded']}, processed by the "
             f"consumer {ph['processed']}")
    if g["events"] or g["missing"] or g["late_reordered"] or g["duplicates"] or \
            g["out_of_range"] or g["bad_packets"]:
        L.append(f"  SEQUENCE GAPS: {g['events']} gap(s), {g['missing']} tick(s) missing "
                 f"({g['missing_at_tail']} at the tail), {g['late_reordered']} late (reordered, "
                 f"forwarded), {g['duplicates']} duplicate(s) (not forwarded), "
                 f"{g['out_of_range']} out of range, {g['bad_packets']} malformed")
        if g["first"]:
            L.append("    first gap events (seq ranges missing when seen): " +
                     ", ".join(f"{s}-{e}" if e != s else f"{s}" for s, e in g["first"]))
    else:
        L.append("  sequence: no gaps, no reordering, no duplicates")
    if g["consumer_seq_discontinuities"]:
        L.append(f"  consumer saw {g['consumer_seq_discontinuities']} feed-seq discontinuities "
                 "in ring order (follows from the gaps/reordering above)")
    if rg["dropped"] or rg["full_events"] or rg["lapped"]:
        L.append(f"  RING OVERRUN: ring of {rg['slots']} slots full {rg['full_events']} time(s) "
                 f"(policy {rg['policy']}" +
                 (f": waited {rg['stalled_us']:.0f} us in all)" if rg["policy"] == "wait"
                  else ")") +
                 f", "
                 f"{rg['dropped']} tick(s) DROPPED" +
                 (f" (first seqs {rg['dropped_first']})" if rg["dropped_first"] else "") +
                 ("; CONSUMER LAPPED" if rg["lapped"] else ""))
    else:
        L.append(f"  ring: {rg['slots']} slots, never full")
    off = f"{tp['offered_per_s']:.0f}/s" if tp["offered_per_s"] else "?"
    pro = f"{tp['processed_per_s']:.0f}/s" if tp["processed_per_s"] else "?"
    cap = f"~{tp['handler_capacity_per_s']:.0f}/s" if tp["handler_capacity_per_s"] else "?"
    L.append(f"  throughput: offered {off}, processed {pro}; handler write cost -> capacity {cap}")
    L.append("  " + stats_header("latency (us)"))
    L.append("  " + stats_row("tick -> GPU ack", ph["latency_us"]["tick_to_gpu_ack"]))
    L.append("  " + stats_row("handler write", ph["latency_us"]["handler_write"]))
    L.append("  " + stats_row("UDP send -> recv", ph["latency_us"]["udp_send_to_recv"]))
    L.append(f"  acks seen inside the spin window: {ph['acks_seen_in_spin']} of {ph['forwarded']}")
    L.append(f"  consumer: {ph['consumer_status']}" +
             (f"; ERROR: {ph['error']}" if ph["error"] else ""))
    return L


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ticks", type=int, default=20000, help="ticks per path (default 20000)")
    p.add_argument("--rate", type=float, default=20000.0,
                   help="ticks per second (default 20000; 0 = as fast as the sender can)")
    p.add_argument("--symbols", type=int, default=16, help="number of symbols (default 16)")
    p.add_argument("--ring", type=int, default=1024, help="ring slots (default 1024)")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="results as JSON to PATH ('-' or no PATH: stdout only)")
    p.add_argument("--backend", default=None, help="gdrpy backend (default: auto; sim: no GPU)")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--paths", choices=("both", "gdrpy", "cuMemcpy"), default="both")
    p.add_argument("--on-full", choices=("wait", "drop"), default="wait",
                   help="ring full: wait for the consumer (default) or drop the tick (counted)")
    p.add_argument("--ack-spin-us", type=float, default=200.0,
                   help="after each write, spin this long for the kernel's ack (default 200)")
    p.add_argument("--band", type=float, default=0.001,
                   help="signal band around VWAP (default 0.001 = 10 bp)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--duration", type=float, default=None,
                   help="max seconds per path (default 2 x ticks/rate + 5)")
    p.add_argument("--kernel-timeout", type=float, default=10.0,
                   help="the consumer gives up after this many idle seconds (default 10)")
    p.add_argument("--inject-loss", type=int, default=0, metavar="K",
                   help="test: the sender skips every K-th seq (simulated UDP loss)")
    p.add_argument("--inject-reorder", type=int, default=0, metavar="K",
                   help="test: the sender swaps every K-th seq with the next")
    p.add_argument("--consumer-delay-us", type=float, default=0.0, metavar="US",
                   help="test: the consumer spends this long per tick (exercises ring overruns)")
    p.add_argument("--feed-sender", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--max-seconds", type=float, default=60.0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.feed_sender:
        return sender_main(a)
    if a.ticks <= 0 or a.symbols <= 0 or a.ring < 2 or a.rate < 0:
        p.error("--ticks, --symbols must be positive, --ring >= 2, --rate >= 0")
    if a.ticks > 10_000_000 or a.symbols > 1_000_000 or a.ring > 1 << 22:
        p.error("--ticks <= 10M, --symbols <= 1M, --ring <= 4M slots")

    import gdrpy
    quiet = a.json == "-"
    say = (lambda *x: print(*x, file=sys.stderr)) if quiet else print
    ctx = gdrpy.open(a.device, a.backend)
    eng = None
    phases = {}
    old_switch = None
    try:
        sim = ctx.is_sim
        if sim:
            print(f"{SIM_LABEL} (backend sim)", file=sys.stderr)
            old_switch = sys.getswitchinterval()
            sys.setswitchinterval(1e-5)
        eng = Engine(ctx, a.ring, a.symbols, a.kernel_timeout, a.band,
                     a.consumer_delay_us * 1e-6)
        info = ctx.info
        hdr = [(f"gdrpy trading feed: {a.ticks} ticks at "
                f"{'max rate' if a.rate == 0 else f'{a.rate:.0f}/s'}, {a.symbols} symbols, "
                f"ring of {a.ring} x {SLOT} B slots, device {ctx.device} "
                f"({'none - sim' if sim else info['gpu_name']}), backend {ctx.backend}")]
        if sim:
            hdr.insert(0, f"*** {SIM_LABEL} (backend sim: no GPU is used; the numbers time "
                          "Python threads, not PCIe) ***")
        else:
            from gdrpy.tools.pingpong import nvrtc_version
            hdr.append(f"  consumer: persistent kernel, NVRTC {nvrtc_version()} "
                       f"{eng.module.kind} for {eng.module.arch} "
                       f"(compiled in {eng.compile_s:.2f} s)")
        hdr.append("  feed: UDP on 127.0.0.1 from a separate sender process; the handler "
                   "busy-polls the socket")
        hdr.append("  tick -> GPU ack = handler recv -> handler sees the consumer's ack in host "
                   "memory (upper bound: includes the ack's way back)")
        say("\n".join(hdr))
        paths = ["gdrpy", "cuMemcpy"] if a.paths == "both" else [a.paths]
        titles = {"gdrpy": "gdrpy mapping (tick, then ring index, stored through the mapping)",
                  "cuMemcpy": ("SIM memcpy standing in for cuMemcpyHtoD" if sim else
                               "cuMemcpyHtoD per tick (tick, then ring index; ctx.memcpy_htod)")}
        for path in paths:
            ph = run_phase(eng, path, a)
            ph["check"] = check_results(ph, a)
            phases[path] = ph
            say("\n".join(fmt_phase(ph, titles[path])))
            c = ph["check"]
            say(f"  check: per-symbol VWAP {'matches' if c['ok'] else 'DOES NOT MATCH'} the "
                f"CPU reference (max relative difference {c['vwap_max_rel_diff']:.1e}; tick "
                f"counts {'match' if c['counts_match'] else 'DIFFER'})")
        first = phases[paths[0]]["_res"]
        say("per-symbol results from the consumer (first 8 symbols):")
        say(f"  {'symbol':>6s} {'ticks':>7s} {'VWAP':>12s} {'last':>10s} {'signal':>7s}")
        for s in range(min(8, a.symbols)):
            say(f"  {s:6d} {int(first['count'][s]):7d} {first['vwap'][s]:12.4f} "
                f"{first['last'][s]:10.2f} {int(first['signal'][s]):+7d}")
        if len(paths) == 2:
            g, b = phases["gdrpy"], phases["cuMemcpy"]
            mg = g["latency_us"]["tick_to_gpu_ack"].get("median")
            mb = b["latency_us"]["tick_to_gpu_ack"].get("median")
            same = np.array_equal(g["_res"]["vwap"], b["_res"]["vwap"])
            say(f"both paths: VWAP results {'identical' if same else 'DIFFER'}" +
                (f"; median tick -> GPU ack {mg:.2f} us (gdrpy) vs {mb:.2f} us (cuMemcpy)"
                 if (mg and mb) else ""))
        if sim:
            say(f"*** {SIM_LABEL} ***")
    finally:
        if eng is not None:
            eng.close()
        ctx.close()
        if old_switch is not None:
            sys.setswitchinterval(old_switch)
    report = {
        "tool": "examples/trading_feed.py", "backend": ctx.backend, "sim": ctx.backend == "sim",
        "consumer": SIM_LABEL if ctx.backend == "sim" else "persistent GPU kernel (NVRTC)",
        "ticks": a.ticks, "rate": a.rate, "symbols": a.symbols, "ring": a.ring,
        "latency_definition": "handler recv -> handler sees the consumer's ack (upper bound)",
        "paths": {k: {kk: vv for kk, vv in v.items() if not kk.startswith("_")}
                  for k, v in phases.items()},
    }
    if a.json:
        text = json.dumps(report, indent=2, default=lambda o: o.tolist()
                          if hasattr(o, "tolist") else str(o))
        if a.json == "-":
            print(text)
        else:
            with open(a.json, "w") as f:
                f.write(text)
            say(f"results written to {a.json}")
    bad = any(ph["error"] or not ph["check"]["ok"] for ph in phases.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
