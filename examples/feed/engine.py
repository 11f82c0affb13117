"""The feed example's plumbing: libfeedcore (ctypes), the tick reference, and
one consumer ring per run (a gdrpy channel, or the cuMemcpy path's ring in
the same layout), consumed by the GPU kernel or, on sim, a CPU thread.
Example code, not part of the gdrpy library."""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, "build")
TICK = 32
CHAN_PLAIN = 1    # GDRPY_CHAN_PLAIN (gdrpy_channel.h): the cuMemcpy path's slot layout
SHM_HDR, SHM_SLOT, SHM_MAGIC = 4096, 64, 0x4D48534445454646
OUT_ACK, OUT_SYM = 64, 128   # feedcore.h: FEED_OUT_ACK, FEED_OUT_SYM
HBUCKETS = 1024 + 40 * 512
H_E2E, H_SOCKET, H_HANDLER, H_GPU, H_RECV_ACK = range(5)
TA_BUCKETS, TA_FIELDS = 160, 7          # feedcore.h: FEED_TA_*
TA_STAGES = ("socket", "handler", "ring_ack")
ST_NAMES = {0: "none", 1: "running", 2: "stopped", 3: "timeout"}
SIM_LABEL = "SIM: CPU thread stands in for the GPU kernel"


# ---------------------------------------------------------------------------
# The tick content (feed.h's feed_tick_fill, vectorised)

def _mix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def tick_fields(seqs, seed: int, nsym: int):
    """(sym, qty, px) of the given seqs."""
    s = np.asarray(seqs, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h1 = _mix64(s + np.uint64((seed * 0x9E3779B97F4A7C15) & (2**64 - 1)))
        h2 = _mix64(h1)
    sym = ((h1 >> np.uint64(32)) % np.uint64(nsym)).astype(np.int64)
    qty = (np.uint64(1) + (h1 & np.uint64(0xFFFFFFFF)) % np.uint64(1000)).astype(np.int64)
    px = (np.uint64(1000000) + h2 % np.uint64(4000000)).astype(np.int64)
    return sym, qty, px


def reference_sums(generated: int, missing_seqs, seed: int, nsym: int, chunk=1 << 22):
    """Per-symbol (sum px*qty, sum qty, count) over seqs 1..generated minus
    `missing_seqs` (exact integers)."""
    pq = np.zeros(nsym, dtype=np.uint64)
    q = np.zeros(nsym, dtype=np.uint64)
    cnt = np.zeros(nsym, dtype=np.uint64)
    miss = np.asarray(sorted(missing_seqs), dtype=np.uint64) if len(missing_seqs) else None
    for a in range(1, generated + 1, chunk):
        s = np.arange(a, min(a + chunk, generated + 1), dtype=np.uint64)
        if miss is not None:
            s = s[~np.isin(s, miss)]
        sym, qty, px = tick_fields(s, seed, nsym)
        np.add.at(pq, sym, (px * qty).astype(np.uint64))
        np.add.at(q, sym, qty.astype(np.uint64))
        cnt += np.bincount(sym, minlength=nsym).astype(np.uint64)
    return pq, q, cnt


# ---------------------------------------------------------------------------
# libfeedcore

class HCfg(ctypes.Structure):
    _fields_ = [("src", ctypes.c_int32), ("path", ctypes.c_int32), ("on_full", ctypes.c_int32),
                ("cpu", ctypes.c_int32), ("fd", ctypes.c_int32),
                ("per_packet_max", ctypes.c_int32), ("shm", ctypes.c_void_p),
                ("chan", ctypes.c_void_p), ("ctx", ctypes.c_uint64),
                ("dev_ctrl", ctypes.c_uint64), ("ring", ctypes.c_uint64),
                ("consumed", ctypes.c_void_p), ("nslots", ctypes.c_uint32),
                ("slot_stride", ctypes.c_uint32), ("batch", ctypes.c_uint32),
                ("gro", ctypes.c_uint32), ("acks", ctypes.c_void_p),
                ("max_ns", ctypes.c_uint64), ("full_timeout_ns", ctypes.c_uint64),
                ("idle_end_ns", ctypes.c_uint64)]


HSTAT_FIELDS = ["received", "forwarded", "missing", "gaps", "backward", "bad_packets",
                "batches", "max_batch", "full_events", "full_wait_ns", "dropped_full",
                "collector_waits", "empty_polls", "busy_ns", "t_first_recv", "t_last_fwd",
                "last_seq", "end_seen", "snd_sent", "snd_generated", "snd_skipped",
                "snd_failed", "snd_t0", "snd_t1", "max_gap_ns", "gaps_50us", "gaps_50us_ns",
                "ctx_invol", "ctx_vol", "minflt", "recv_ns", "publish_ns", "big_batches",
                "big_ticks", "big_publish_ns"]


class HStats(ctypes.Structure):
    _fields_ = [(f, ctypes.c_uint64) for f in HSTAT_FIELDS] + [
        ("error", ctypes.c_int32), ("pad", ctypes.c_int32), ("msg", ctypes.c_char * 160)]


def build() -> None:
    """make -C examples/feed when an output is missing or older than a source."""
    outs = [os.path.join(BUILD, "feed_sender"), os.path.join(BUILD, "libfeedcore.so")]
    srcs = [os.path.join(HERE, f) for f in ("feed_sender.c", "feedcore.c", "feedcore.h",
                                            "feed.h", "Makefile")]
    lib_a = os.path.join(HERE, "..", "..", "native", "build", "libgdrpy.a")
    if os.path.exists(lib_a):
        srcs.append(lib_a)
    newest = max(os.path.getmtime(s) for s in srcs)
    if all(os.path.exists(o) and os.path.getmtime(o) >= newest for o in outs):
        return
    r = subprocess.run(["make", "-s", "-C", HERE], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"building examples/feed failed:\n{r.stdout}{r.stderr}")


_lib = None


def lib():
    global _lib
    if _lib is not None:
        return _lib
    build()
    L = ctypes.CDLL(os.path.join(BUILD, "libfeedcore.so"))
    vp, u64, i32, u32 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_uint32
    sig = {
        "feed_handler_run": (i32, [ctypes.POINTER(HCfg), ctypes.POINTER(HStats)]),
        "feed_acks_new": (vp, [u64]), "feed_acks_free": (None, [vp]),
        "feed_acks_ts": (vp, [vp]), "feed_acks_mask": (u64, [vp]),
        "feed_acks_start": (i32, [vp, vp, i32]), "feed_acks_stop": (i32, [vp]),
        "feed_acks_done": (u64, [vp]), "feed_acks_hist": (vp, [vp, i32]),
        "feed_acks_first_ns": (u64, [vp]), "feed_acks_last_ns": (u64, [vp]),
        "feed_acks_stamp_waits": (u64, [vp]), "feed_hist_value": (ctypes.c_double, [i32]),
        "feed_udp_recv_batch": (i32, [i32, vp, u32, u32, vp]),
        "feed_simc_start": (vp, [vp, i32, vp, u32, u64, u64, u64, i32]),
        "feed_simc_join": (i32, [vp, ctypes.c_double]),
        "feed_cchan_open": (vp, [i32, ctypes.c_char_p, u64, u64, u32, i32, ctypes.c_char_p,
                                 i32]),
        "feed_cchan_chan": (vp, [vp]), "feed_cchan_host_block": (vp, [vp]),
        "feed_chan_device_bytes": (u64, [u32, i32]), "feed_cchan_ctx": (u64, [vp]),
        "feed_cchan_desc": (i32, [vp, vp]),
        "feed_cchan_shutdown": (i32, [vp, i32, ctypes.c_double, vp]),
        "feed_cchan_close": (None, [vp]), "feed_sim_alloc": (u64, [u64]),
        "feed_sim_free": (None, [u64]), "feed_ctx_open": (u64, [i32, ctypes.c_char_p]),
        "feed_ctx_close": (None, [u64]), "feed_last_error": (ctypes.c_char_p, []),
        "feed_now_ns": (u64, []),
        "feed_acks_thread_info": (None, [vp, vp]),
        "feed_stalls_start": (vp, [i32, u64]), "feed_stalls_stop": (None, [vp, vp]),
        "feed_stalls_hist": (vp, [vp, i32]), "feed_stalls_free": (None, [vp]),
        "feed_acks_tail": (None, [vp, vp]), "feed_ta_edge_ns": (ctypes.c_double, [i32]),
        "feed_acks_stamp": (i32, [vp, u64, u32, vp, u32, u64]),
        "feed_udp_rx_new": (vp, [i32, vp, u32, u32, vp, vp, u64]),
        "feed_udp_rx": (i32, [vp]), "feed_udp_rx_free": (None, [vp]),
        "feed_udp_rx_new_gro": (vp, [i32, vp, u32, u32, vp, u64]),
        "feed_udp_rx_end": (None, [vp, vp]),
        "feed_shm_rx_new": (vp, [vp, vp, u32, u64]),
        "feed_shm_rx": (i32, [vp]), "feed_shm_rx_free": (None, [vp]),
        "feed_rx_t_poll": (vp, [vp]), "feed_rx_set_acks": (None, [vp, vp]),
        "feed_rx_commit": (i32, [vp]), "feed_rx_advance": (None, [vp, u64]),
    }
    for name, (res, args) in sig.items():
        f = getattr(L, name)
        f.restype, f.argtypes = res, args
    L.hist_values = np.array([L.feed_hist_value(k) for k in range(HBUCKETS)])
    _lib = L
    return L


def hist_stats(L, acks, k: int) -> dict:
    """median/p90/p99/p99.9/max/mean (us) and n of histogram k."""
    return hist_stats_at(L, L.feed_acks_hist(acks, k))


def hist_stats_at(L, p: int) -> dict:
    """The same for the feed_hist_t at address p."""
    head = (ctypes.c_uint64 * 4).from_address(p)
    n, total, mn, mx = (int(v) for v in head)
    if n == 0:
        return {"n": 0}
    b = np.ctypeslib.as_array((ctypes.c_uint64 * HBUCKETS).from_address(p + 32)).astype(np.int64)
    cum = np.cumsum(b)
    out = {"n": n}
    for name, q in (("median", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)):
        i = int(np.searchsorted(cum, q * n, side="left"))
        out[name] = float(min(L.hist_values[min(i, HBUCKETS - 1)], mx)) / 1e3
    out.update(max=mx / 1e3, min=mn / 1e3, mean=total / n / 1e3)
    return out


STALL_NS = 1500   # the stall probe counts gaps longer than this between two clock reads


class StallProbe:
    """feed_stalls_*: a thread spinning on the clock on a CPU no role uses,
    counting the gaps over STALL_NS - the times the host did not run it -
    while a point runs.  A VM's hypervisor can stop every vCPU at once
    (docs/examples.md, "The host's own stalls"); a spinning ack collector that is
    stopped when an ack lands sees it late, so a run's written->ack tail is
    read against this."""

    def __init__(self, L, cpu: int):
        self.L, self.cpu = L, cpu
        self.p = L.feed_stalls_start(cpu, STALL_NS)
        if not self.p:
            raise RuntimeError(f"stall probe: {L.feed_last_error().decode(errors='replace')}")

    def stop(self) -> dict | None:
        """Stops the thread; the record (stalls per second, the share of the
        time stalled, their durations and the time between their starts).
        None when it was stopped already: a second call does nothing."""
        p, self.p = self.p, None
        if p is None:
            return None
        try:
            out = (ctypes.c_uint64 * 3)()
            self.L.feed_stalls_stop(p, out)
            n, total, wall = (int(v) for v in out)
            return {"cpu": self.cpu, "threshold_us": STALL_NS / 1e3, "seconds": wall / 1e9,
                    "stalls": n, "per_s": n / (wall / 1e9) if wall else None,
                    "stalled_fraction": total / wall if wall else None,
                    "duration_us": hist_stats_at(self.L, self.L.feed_stalls_hist(p, 0)),
                    "interval_us": hist_stats_at(self.L, self.L.feed_stalls_hist(p, 1))}
        finally:
            self.L.feed_stalls_free(p)


def tail_attribution(L, acks, quantiles=(0.5, 0.9, 0.99, 0.999)) -> dict:
    """Which stage makes the slow ticks slow (feed_acks_tail).  For each
    quantile q: the ticks whose end-to-end latency lies at or above the
    bucket holding q (0.5 us wide below 64 us), their mean socket
    (send->recv), handler (recv->written) and ring+consumer+ack
    (written->ack) times in us, and the share of them whose largest stage
    each one was.  Also the same for the ticks over 10 us ("over_10us")."""
    raw = (ctypes.c_uint64 * (TA_BUCKETS * TA_FIELDS))()
    L.feed_acks_tail(acks, raw)
    t = np.frombuffer(raw, dtype=np.uint64).reshape(TA_BUCKETS, TA_FIELDS).astype(np.float64)
    n = t[:, 0]
    total = n.sum()
    if total == 0:
        return {}

    def above(k0: int, **extra) -> dict:
        r = t[k0:].sum(axis=0)
        if r[0] == 0:
            return {"ticks": 0, **extra}
        return {"from_us": L.feed_ta_edge_ns(k0) / 1e3, "ticks": int(r[0]), **extra,
                "mean_us": {s: r[1 + i] / r[0] / 1e3 for i, s in enumerate(TA_STAGES)},
                "largest_share": {s: r[4 + i] / r[0] for i, s in enumerate(TA_STAGES)}}

    cum = np.cumsum(n)
    out = {}
    for q in quantiles:
        k = int(np.searchsorted(cum, q * total, side="left"))
        out[f"p{q * 100:g}"] = above(min(k, TA_BUCKETS - 1))
    out["over_10us"] = above(20)            # 20 x 0.5 us
    return out


# ---------------------------------------------------------------------------
# One consumer ring per run

def ring_is_plain(path: str, plain: bool) -> bool:
    """The ring's slot format: PLAIN on the cuMemcpy path (its slots are
    read in place) or when asked for, else LL."""
    return plain or path == "cuMemcpy"


class Ring:
    """A ring of `nslots` tick slots and its consumer.

    path 'gdrpy': a gdrpy channel (Python handler: ``gdrpy.Channel`` on the
    Python context; C handler: ``gdrpy_chan_create`` on libfeedcore's own
    context, over the same kind of memory), LL slots unless ``plain``.  path
    'cuMemcpy': PLAIN's slot layout (header + tick) in a plain device buffer,
    written with cuMemcpyHtoD, plus a count word.  The consumer (GPU kernel
    or sim thread) acks in host memory: after each round's checks a plain
    store of its count to ``ack_ptr`` (the ack collector's word), then the
    channel's "consumed" count (``consumed_ptr``: a release, slot reuse)."""

    def __init__(self, env, handler: str, path: str, nslots: int, nsym: int, seed: int,
                 delay_ns: int = 0, idle_ns: int = 20_000_000_000, plain: bool = False):
        self.env, self.handler, self.path = env, handler, path
        self.plain = ring_is_plain(path, plain)
        self.nslots, self.nsym, self.seed = nslots, nsym, seed
        self.delay_ns, self.idle_ns = delay_ns, idle_ns
        self.sim = env.sim
        self.chan = self.cchan = self.buf = self._hb = self.acc = None
        self._free = []
        self.live = False
        try:
            self._setup(env, handler, path, nslots, nsym)
        except BaseException:
            self.close()
            raise

    def _setup(self, env, handler: str, path: str, nslots: int, nsym: int) -> None:
        import gdrpy
        L = env.lib
        self.dev_bytes = int(L.feed_chan_device_bytes(nslots, int(self.plain)))
        if not self.dev_bytes:
            raise RuntimeError(L.feed_last_error().decode())
        cpu_dev = self.sim and handler == "c"       # sim memory of libfeedcore's own copy
        if path == "gdrpy" and handler == "py":
            self.chan = gdrpy.Channel(env.ctx, nslots=nslots, slot_size=TICK, comp_size=0,
                                      comp_nslots=2, plain=self.plain)
            self.desc = self.chan.desc
        else:
            if cpu_dev:
                self.dptr = L.feed_sim_alloc(self.dev_bytes)
                if not self.dptr:
                    raise RuntimeError(L.feed_last_error().decode())
                self._free.append(lambda p=self.dptr: L.feed_sim_free(p))
            else:
                self.buf = gdrpy.memory.alloc(self.dev_bytes, ctx=env.ctx)
                self.dptr = self.buf.ptr
                if path == "cuMemcpy":       # (a channel zeroes its memory itself)
                    if self.sim:
                        ctypes.memset(self.dptr, 0, self.dev_bytes)
                    else:
                        env.gpu.memset(self.dptr, self.dev_bytes)
            if path == "gdrpy":
                err = ctypes.create_string_buffer(256)
                self.cchan = L.feed_cchan_open(env.device, env.backend.encode(), self.dptr,
                                               self.dev_bytes, nslots, int(self.plain), err,
                                               256)
                if not self.cchan:
                    raise RuntimeError(f"C channel: {err.value.decode()}")
                d = ctypes.create_string_buffer(64)
                L.feed_cchan_desc(self.cchan, d)
                self.desc = d.raw
            else:
                self.hostblk, hdev = env.host_alloc(4096)
                self.desc = struct.pack("<QQQQIIIIIIII", self.dptr, self.dptr + 128, hdev, 0,
                                        nslots, 64, TICK, 0, 0, 0, CHAN_PLAIN, 0)
        d = struct.unpack_from("<QQQQIII", self.desc)
        self.dev_ctrl, self.ring, self.host_ctrl = d[0], d[1], d[2]
        self.slot_stride = d[5]
        # the consumed word's CPU address (the channel's host block)
        if path == "cuMemcpy":
            self.consumed_ptr = self.hostblk
        elif self.cchan is not None:
            self.consumed_ptr = int(L.feed_cchan_host_block(self.cchan))
        else:
            self._hb = np.frombuffer(self.chan.host_block(), dtype=np.uint8)
            self.consumed_ptr = self._hb.ctypes.data
        self.out, self.out_dev = env.host_alloc(OUT_SYM + 24 * nsym)
        self.ack_ptr = self.out + OUT_ACK
        if not self.sim:
            self.acc = gdrpy.memory.alloc(24 * nsym, ctx=env.ctx)
            env.gpu.memset(self.acc.ptr, 24 * nsym)
        self.simc = None

    # -- consumer lifecycle
    def start(self, cpu: int = -1) -> None:
        env = self.env
        published = self.path == "cuMemcpy"
        if self.sim:
            db = ctypes.create_string_buffer(self.desc, 64)
            self.simc = env.lib.feed_simc_start(db, int(published), self.out, self.nsym,
                                                self.seed, self.idle_ns, self.delay_ns, cpu)
            if not self.simc:
                raise RuntimeError("could not start the sim consumer thread")
        else:
            env.gpu.launch(self.desc, published, self.acc.ptr, self.out_dev, self.nsym,
                           self.seed, self.idle_ns, self.delay_ns)
        self.live = True
        st = ctypes.c_uint32.from_address(self.consumed_ptr + 64)
        t0 = time.monotonic()
        while st.value == 0:
            if time.monotonic() - t0 > 20:
                raise RuntimeError("the consumer did not start")
            time.sleep(0.0005)

    def consumed(self) -> int:
        return ctypes.c_uint64.from_address(self.consumed_ptr).value

    def status(self) -> str:
        return ST_NAMES.get(ctypes.c_uint32.from_address(self.consumed_ptr + 64).value, "?")

    def shutdown(self, sent: int, timeout: float = 20.0) -> str:
        """Drain: the consumer stops once it has consumed `sent` messages."""
        import gdrpy
        if not self.live:
            return self.status()
        env = self.env
        err = None
        try:
            if self.chan is not None:
                self.chan.shutdown(drain=True, timeout=timeout)
            elif self.cchan is not None:
                st5 = (ctypes.c_uint64 * 5)()
                if env.lib.feed_cchan_shutdown(self.cchan, 1, timeout, st5):
                    err = env.lib.feed_last_error().decode()
            else:
                self._htod(self.dev_ctrl + 8, struct.pack("<Q", sent))
                self._htod(self.dev_ctrl + 0, struct.pack("<I", 1))
        except (gdrpy.errors.GdrError, RuntimeError) as e:   # a timeout: see the status
            err = str(e)
        t0 = time.monotonic()
        done = ctypes.c_uint32.from_address(self.out + 56)
        while done.value != 1 and time.monotonic() - t0 < timeout:
            time.sleep(0.001)
        if self.sim:
            self.live = env.lib.feed_simc_join(self.simc, 5.0) != 0
        else:
            while not env.gpu.done() and time.monotonic() - t0 < timeout:
                time.sleep(0.001)
            self.live = not env.gpu.done()
        if err and self.live:
            raise RuntimeError(f"consumer shutdown: {err}")
        return self.status()

    def _htod(self, dptr: int, data: bytes) -> None:
        if self.handler == "c" and self.sim:
            ctypes.memmove(dptr, data, len(data))   # libfeedcore's sim memory
        else:
            self.env.ctx.memcpy_htod(dptr, data)

    def results(self) -> dict:
        o = (ctypes.c_uint64 * 7).from_address(self.out)
        sums = np.ctypeslib.as_array((ctypes.c_uint64 * (3 * self.nsym)).from_address(
            self.out + OUT_SYM)).reshape(self.nsym, 3).copy()
        keys = ("processed", "torn", "missing", "gaps", "backward", "last_seq", "badlen")
        r = {k: int(v) for k, v in zip(keys, o, strict=True)}
        r["final"] = ctypes.c_uint32.from_address(self.out + 56).value == 1
        r["sums"] = sums
        return r

    def close(self) -> None:
        if self.live:
            return          # never free what a running consumer may touch
        self._hb = None
        if self.chan is not None:
            self.chan.close()
        if self.cchan is not None:
            self.env.lib.feed_cchan_close(self.cchan)
            self.cchan = None
        if self.acc is not None:
            self.acc.close()
        if self.buf is not None:
            self.buf.close()
        for f in self._free:
            f()
        self._free = []


class Env:
    """What every run shares: the gdrpy context, the GPU (None on sim),
    libfeedcore, the ack collector, page-locked host allocations."""

    def __init__(self, device: int = 0, backend: str | None = None):
        import gdrpy
        self.ctx = gdrpy.open(device, backend)
        self.device = device
        self.backend = self.ctx.backend
        self.sim = self.ctx.is_sim
        self.lib = lib()
        self.gpu = None
        self._bufs = []
        if not self.sim:
            from gpu import Gpu
            self.gpu = Gpu(device)
        self.acks = self.lib.feed_acks_new(1 << 21)
        if not self.acks:
            raise RuntimeError(self.lib.feed_last_error().decode())

    def cctx(self) -> int:
        """libfeedcore's own gdrpy context (the C handler's cuMemcpy path)."""
        if not getattr(self, "_cctx", 0):
            self._cctx = self.lib.feed_ctx_open(self.device, self.backend.encode())
            if not self._cctx:
                raise RuntimeError(self.lib.feed_last_error().decode())
        return self._cctx

    def host_alloc(self, n: int) -> tuple[int, int]:
        if self.sim:
            b = (ctypes.c_uint8 * (n + 64))()
            self._bufs.append(b)
            p = (ctypes.addressof(b) + 63) & ~63
            return p, p
        return self.gpu.host_alloc(n)

    def close(self) -> None:
        if getattr(self, "_cctx", 0):
            self.lib.feed_ctx_close(self._cctx)
            self._cctx = 0
        if self.acks:
            self.lib.feed_acks_free(self.acks)
            self.acks = None
        if self.gpu is not None:
            self.gpu.close()
        self.ctx.close()
