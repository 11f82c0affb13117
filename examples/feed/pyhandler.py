"""The Python feed handler, on gdrpy's public API (``gdrpy.Channel``).

Per batch it makes a fixed number of calls, whatever the batch holds:

1. one receive into a preallocated numpy array of ticks (libfeedcore's
   ``feed_udp_rx``: recvmmsg from C, because Python's socket module has
   none; or ``feed_shm_rx``, the shared-memory ring's "rx burst", as a
   kernel-bypass NIC library hands packets over).  The call polls in C
   (up to 100 us) until the first tick is there, so an idle handler does not
   go round the Python loop between polls.  Full datagrams land back
   to back, so the batch is one contiguous (m, 32) array: no copy;
2. the sequence check on Python ints (first and last seq; for longer
   batches one numpy comparison), so in-order ticks cost no per-tick Python;
3. one ``Channel.send`` (one tick) or ``Channel.send_many`` (one fence for
   the batch); a full ring raises ``ChannelFullError`` at timeout 0: counted
   (back-pressure), then the same call waits;
4. one call that stamps the batch for the ack collector (send time from each
   tick, receive and written times) - the measurement, not the handler.

It never waits for an ack: the collector (a C thread, the same for both
handlers) sees them.  No other Python thread runs, so nothing contends for
the GIL; the cyclic garbage collector is off while the loop runs (a
collection would stall it; the loop creates no reference cycles).
Gaps, reordering, short datagrams and the END packet take a slow path, tick
by tick, with the same counters as the C handler (feedcore.c).
"""

from __future__ import annotations

import gc
import os
import resource
import threading
import time

import numpy as np
from engine import TICK

END_SEQ = (1 << 64) - 1
GRO_SEGS = 64          # the sender's UDP_SEGMENT sends carry at most 64 datagrams
SPIN_NS = 100_000      # a receive call polls in C this long for the first tick
STAT_KEYS = ("received", "forwarded", "missing", "gaps", "backward", "bad_packets",
             "batches", "max_batch", "full_events", "full_wait_ns", "dropped_full",
             "collector_waits", "empty_polls", "busy_ns", "t_first_recv", "t_last_fwd",
             "last_seq", "end_seen", "snd_sent", "snd_generated", "snd_skipped",
             "snd_failed", "snd_t0", "snd_t1", "max_gap_ns", "gaps_50us", "gaps_50us_ns",
             "ctx_invol", "ctx_vol", "minflt", "recv_ns", "publish_ns", "big_batches",
             "big_ticks", "big_publish_ns", "python_threads")


class _Rx:
    """The receive side: ``ticks`` (cap, 32) uint8, contiguous; ``take()``
    returns how many rows of it hold ticks (all full datagrams), or calls
    ``odd(n)`` for a batch with short datagrams or the END packet."""

    def __init__(self, L, src: str, sock, shm, batch: int, per_packet: int, gro: bool = False,
                 nslots: int = 4096):
        self.L, self.src, self.k = L, src, per_packet
        self.gro = src == "udp" and gro
        self.end = False
        self.end_counts: dict = {}
        self.bad = 0
        if self.gro:
            # a message may carry 64 datagrams: every one full stays in the ring
            per = GRO_SEGS * per_packet
            self.ndg = max(1, min(batch // per_packet, min(nslots, 4096) // per))
            cap = self.ndg * per
        elif src == "udp":
            self.ndg = max(1, min(batch // per_packet, 1024))
            cap = self.ndg * per_packet
        else:
            self.ndg = 0
            cap = batch
        self.ticks = np.zeros((cap, TICK), dtype=np.uint8)
        self.tptr = self.ticks.ctypes.data
        if self.gro:
            self.lens = np.zeros(2, dtype=np.uint32)      # [0] malformed, [1] END came
            self.h = L.feed_udp_rx_new_gro(sock.fileno(), self.tptr, per_packet, self.ndg,
                                           self.lens.ctypes.data, SPIN_NS)
            self.call = L.feed_udp_rx
        elif src == "udp":
            self.side = np.zeros((self.ndg, 64), dtype=np.uint8)
            self.lens = np.zeros(self.ndg + 1, dtype=np.uint32)   # [ndg]: odd ones
            self.h = L.feed_udp_rx_new(sock.fileno(), self.tptr, per_packet, self.ndg,
                                       self.side.ctypes.data, self.lens.ctypes.data, SPIN_NS)
            self.call = L.feed_udp_rx
        else:
            self.hdr = shm.hdr
            self.h = L.feed_shm_rx_new(shm.addr, self.tptr, cap, SPIN_NS)
            self.call = L.feed_shm_rx
        if not self.h:
            raise RuntimeError(L.feed_last_error().decode())

    def close(self) -> None:
        if self.h:
            (self.L.feed_udp_rx_free if self.src == "udp" else self.L.feed_shm_rx_free)(self.h)
            self.h = None

    def odd(self, n: int) -> np.ndarray:
        """UDP batch of n datagrams, not all full: the ticks they carry (a
        compact array) and the END packet's counts."""
        row = self.k * TICK
        parts = []
        for d in range(n):
            ln = int(self.lens[d])
            body = self.ticks[d * self.k:(d + 1) * self.k].reshape(-1)
            if ln >= 56 and int(body[:8].view(np.uint64)[0]) == END_SEQ:
                raw = np.concatenate([body[:min(ln, row)], self.side[d, :max(0, ln - row)]])
                e = raw[:56].view(np.uint64)
                if not self.end:
                    self.end_counts = dict(zip(("snd_sent", "snd_generated", "snd_skipped",
                                                "snd_failed", "snd_t0", "snd_t1"),
                                               (int(x) for x in e[1:7]), strict=True))
                self.end = True
            elif ln and ln % TICK == 0 and ln <= row:
                parts.append(self.ticks[d * self.k:d * self.k + ln // TICK])
            else:
                self.bad += 1
        return np.concatenate(parts) if parts else self.ticks[:0]

    def gro_end(self) -> None:
        """The END packet came (GRO receiver): its counts."""
        import ctypes
        e = (ctypes.c_uint64 * 6)()
        self.L.feed_udp_rx_end(self.h, e)
        self.end = True
        self.end_counts = dict(zip(("snd_sent", "snd_generated", "snd_skipped", "snd_failed",
                                    "snd_t0", "snd_t1"), (int(x) for x in e), strict=True))

    def shm_end(self) -> None:
        h = self.hdr
        self.end = True
        self.end_counts = {"snd_sent": int(h[24]), "snd_failed": int(h[25]),
                           "snd_generated": int(h[26]), "snd_t0": int(h[27]),
                           "snd_t1": int(h[28])}


def drop_room(w: int, m: int, consumed, nslots: int) -> int | None:
    """--on-full drop: how many of m ticks fit the ring now (None: all).
    The consumed count is read once: a second, newer read could give more
    room than m (the GPU consumer advances between the reads) and count
    ticks as forwarded that were never sent."""
    c = consumed.value
    if w + m - c <= nslots:
        return None
    return max(0, nslots - (w - c))


def _publisher(ring, env, st: dict, full_timeout: float):
    """publish(arr, w): one call per batch on the ring's path."""
    import gdrpy
    nslots = ring.nslots
    if ring.path == "gdrpy":
        send_one, send_many = ring.chan.send, ring.chan.send_many
        Full = gdrpy.errors.ChannelFullError

        def publish(arr, w):
            try:
                if len(arr) == 1:
                    send_one(arr, 0, 0)
                else:
                    send_many(arr, None, 0)
            except Full:
                st["full_events"] += 1
                t0 = time.monotonic_ns()
                send_many(arr, None, full_timeout)
                st["full_wait_ns"] += time.monotonic_ns() - t0
        return publish
    import ctypes
    htod = env.ctx.memcpy_htod
    consumed = ctypes.c_uint64.from_address(ring.consumed_ptr)
    stage = np.zeros((nslots, 64), dtype=np.uint8)
    s64, s32 = stage.view(np.uint64), stage.view(np.uint32)

    def publish_cumemcpy(arr, w):
        n = len(arr)
        if w + n - consumed.value > nslots:
            st["full_events"] += 1
            t0 = time.monotonic_ns()
            while w + n - consumed.value > nslots:
                if time.monotonic_ns() - t0 > full_timeout * 1e9:
                    raise RuntimeError("ring full too long: the consumer stopped")
            st["full_wait_ns"] += time.monotonic_ns() - t0
        done = 0
        while done < n:
            pos = (w + done) % nslots
            cnt = min(n - done, nslots - pos)
            s64[:cnt, 0] = np.arange(w + done + 1, w + done + cnt + 1, dtype=np.uint64)
            s32[:cnt, 2] = TICK
            s32[:cnt, 3] = 0
            stage[:cnt, 16:48] = arr[done:done + cnt]
            htod(ring.ring + pos * 64, stage[:cnt])
            done += cnt
        htod(ring.dev_ctrl + 96, (w + n).to_bytes(8, "little"))
    return publish_cumemcpy


def py_handler(ring, env, src: str, sock, shm, batch: int, max_s: float, on_full: str,
               idle_end_s: float, per_packet: int = 1, gro: bool = False) -> dict:
    """The Python handler; returns the same counters as the C handler."""
    import ctypes
    L = env.lib
    st = dict.fromkeys(STAT_KEYS, 0)
    rx = _Rx(L, src, sock, shm, batch, per_packet, gro, ring.nslots)
    gc_was = gc.isenabled()
    gc.disable()
    st["python_threads"] = threading.active_count()    # 1: no thread to take the GIL
    ru0 = resource.getrusage(resource.RUSAGE_THREAD)
    try:
        _loop(ring, env, src, rx, st, batch, max_s, on_full, idle_end_s, per_packet, ctypes)
    finally:
        ru1 = resource.getrusage(resource.RUSAGE_THREAD)
        st["ctx_invol"] = ru1.ru_nivcsw - ru0.ru_nivcsw
        st["ctx_vol"] = ru1.ru_nvcsw - ru0.ru_nvcsw
        st["minflt"] = ru1.ru_minflt - ru0.ru_minflt
        if gc_was:
            gc.enable()
        rx.close()
    st.update(rx.end_counts)
    st["end_seen"] = int(rx.end)
    st["bad_packets"] += rx.bad + (int(rx.lens[0]) if rx.gro else 0)
    return st


def _loop(ring, env, src, rx: _Rx, st: dict, batch: int, max_s: float, on_full: str,
          idle_end_s: float, per_packet: int, ctypes) -> None:
    L = env.lib
    now = time.monotonic_ns
    acks = env.acks
    stamp = L.feed_acks_stamp
    call, h = rx.call, rx.h
    t_poll = ctypes.c_uint64.from_address(L.feed_rx_t_poll(h))   # busy time starts there
    t_recv = ctypes.c_uint64.from_address(L.feed_rx_t_poll(h) + 8)  # the receive returned
    commit, advance = L.feed_rx_commit, L.feed_rx_advance
    L.feed_rx_set_acks(h, acks)
    udp = src == "udp"
    ticks, tptr = rx.ticks, rx.tptr
    cap = len(ticks)
    tq = memoryview(ticks).cast("B").cast("Q")       # seq of row j: tq[4 * j]
    seqcol = ticks.view(np.uint64)[:, 0]
    ar = np.arange(cap, dtype=np.uint64)
    views = [ticks[:m] for m in range(cap + 1)]      # no slicing in the loop
    gro = rx.gro
    udp = udp and not gro                          # a GRO receive returns ticks, as shm
    lens = memoryview(rx.lens) if (udp or gro) else None
    odd_at = rx.ndg
    publish = _publisher(ring, env, st, 10.0)
    drop = on_full == "drop"
    fast = ring.path == "gdrpy" and not drop
    if fast:
        import gdrpy
        send_one, send_many = ring.chan.send, ring.chan.send_many
        Full = gdrpy.errors.ChannelFullError
    nslots = ring.nslots
    consumed = ctypes.c_uint64.from_address(ring.consumed_ptr)
    exp = 1
    w = 0
    received = forwarded = batches = max_batch = empty = busy = cwaits = 0
    max_gap = gaps50 = gaps50_ns = 0
    pub_ns = recv_ns = big_b = big_t = big_ns = 0
    t_first = t_last = 0
    t_start = now()
    deadline = t_start + int(max_s * 1e9)
    idle_end = int(idle_end_s * 1e9)
    t_data = t_prev = t_start
    try:
        while True:
            t_call = now()
            g = t_call - t_prev
            t_prev = t_call
            if g > 50000:
                gaps50 += 1
                gaps50_ns += g
                if g > max_gap:
                    max_gap = g
            if t_call > deadline:
                raise RuntimeError("handler deadline reached")
            n = call(h)
            if gro and lens[1] and not rx.end:
                rx.gro_end()                # END came (this batch's ticks still go on)
            if n <= 0:
                if n < 0:
                    if udp or gro:
                        raise OSError(-n, os.strerror(-n))
                    rx.shm_end()
                    break
                if rx.end:
                    break
                empty += 1
                if (udp or gro) and received and t_call - t_data > idle_end:
                    break                   # END lost with the overflowed datagrams
                continue
            t_data = t_call
            if not t_first:
                t_first = now()
            arr = None
            if udp:
                if lens[odd_at] == 0:           # all datagrams full: the usual case
                    m = n * per_packet
                else:
                    arr = rx.odd(n)
                    m = len(arr)
            else:
                m = n
            received += m
            if arr is None and m and tq[0] == exp and tq[4 * (m - 1)] == exp + m - 1 and (
                    m <= 2 or (tq[0:4 * m:4].tolist() == list(range(exp, exp + m)) if m <= 16
                               else bool((seqcol[:m] == ar[:m] + exp).all()))):
                exp += m
                arr = views[m]
                if fast:
                    # in order, all of it goes on: one send, one stamp call
                    t_pub = now()
                    try:
                        if m == 1:
                            send_one(arr, 0, 0)
                        else:
                            send_many(arr, None, 0)
                    except Full:
                        st["full_events"] += 1
                        t0 = now()
                        send_many(arr, None, 10.0)
                        st["full_wait_ns"] += now() - t0
                    t_pd = now() - t_pub
                    cwaits += commit(h)
                    t_wr = now()
                    tp = t_poll.value
                    pub_ns += t_pd
                    recv_ns += t_pub - tp
                    if m >= 64:
                        big_b += 1
                        big_t += m
                        big_ns += t_pd
                    w += m
                    forwarded += m
                    batches += 1
                    if m > max_batch:
                        max_batch = m
                    t_last = t_wr
                    busy += t_wr - tp
                    if rx.end:
                        break
                    continue
            elif m:
                arr, exp = _checked(arr if arr is not None else views[m], st, exp)
                m = len(arr)
            room = drop_room(w, m, consumed, nslots) if m and drop else None
            if room is not None:
                st["full_events"] += 1
                st["dropped_full"] += m - room
                arr = np.ascontiguousarray(arr[:room])
                m = room
            if m:
                t_pub = now()
                publish(arr, w)
                t_pd = now() - t_pub
                pub_ns += t_pd
                recv_ns += t_pub - t_poll.value
                if m >= 64:
                    big_b += 1
                    big_t += m
                    big_ns += t_pd
                cwaits += stamp(acks, w + 1, m, arr.ctypes.data if arr.base is not ticks
                                else tptr, TICK, t_recv.value)
                advance(h, m)
                t_wr = now()
                w += m
                forwarded += m
                batches += 1
                if m > max_batch:
                    max_batch = m
                t_last = t_wr
                busy += t_wr - t_poll.value
            if rx.end:
                break
    finally:
        st.update(received=received, forwarded=forwarded, batches=batches, max_batch=max_batch,
                  empty_polls=empty, busy_ns=busy, collector_waits=cwaits, t_first_recv=t_first,
                  t_last_fwd=t_last, last_seq=exp - 1, max_gap_ns=max_gap, gaps_50us=gaps50,
                  gaps_50us_ns=gaps50_ns, recv_ns=recv_ns, publish_ns=pub_ns, big_batches=big_b,
                  big_ticks=big_t, big_publish_ns=big_ns)


def _checked(tk: np.ndarray, st: dict, exp: int) -> tuple[np.ndarray, int]:
    """Tick by tick: forward in-order and forward-jumping ticks (gaps
    counted), drop backward ones (reordered or duplicated, counted)."""
    keep = []
    seqs = tk.view(np.uint64).reshape(-1, 4)[:, 0]
    for j in range(len(tk)):
        q = int(seqs[j])
        if q == END_SEQ:               # a cut END datagram: never a tick
            st["bad_packets"] += 1
            continue
        if q == exp:
            exp += 1
        elif q > exp:
            st["gaps"] += 1
            st["missing"] += q - exp
            exp = q + 1
        else:
            st["backward"] += 1
            continue
        keep.append(j)
    return np.ascontiguousarray(tk[keep]), exp
