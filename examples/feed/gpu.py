"""The feed example's GPU side: the consumer kernel (NVRTC) and the little
CUDA plumbing it needs (cuda.bindings: module, stream, launch, page-locked
host memory).  Example code, not part of the gdrpy library."""

from __future__ import annotations

import ctypes
import os

KERNEL_SRC = r"""
#include "gdrpy_channel.cuh"
typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ u64 mix64(u64 z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* One tick's fields read in place (a PLAIN slot's payload). */
__device__ __forceinline__ void tick_at(const volatile unsigned char *m, u64 &seq, u64 &px,
                                        u32 &sym, u32 &qty)
{
    seq = *(const volatile u64 *)(m + 0);
    px = *(const volatile u64 *)(m + 16);
    sym = *(const volatile u32 *)(m + 24);
    qty = *(const volatile u32 *)(m + 28);
}

/* One tick's fields from a message the warp took (gdrpy_chan_take): an LL
 * tick's words are in registers, a PLAIN slot's tick is read in place. */
__device__ __forceinline__ void tick_fields(const gdrpy_chan_in_t &in, u64 &seq, u64 &px,
                                            u32 &sym, u32 &qty)
{
    if (in.plain) {
        tick_at(in.plain, seq, px, sym, qty);
    } else if (in.len == 32u) {
        seq = (u64)in.buf[0] | ((u64)in.buf[1] << 32);
        px = (u64)in.buf[4] | ((u64)in.buf[5] << 32);
        sym = in.buf[6];
        qty = in.buf[7];
    }
}

/* The idle poll: lane 1 takes message i + 1, every other lane message i
 * (one request for them), so a tick published right behind another (one
 * handler batch) is taken in the same round, not in the burst round after
 * it.  Lane k < n holds message i + k.  (Measured on the H200, R20g: the
 * written->ack p99 at 20,000 Poisson ticks/s 3.07-3.37 us against
 * 3.59-3.81 with one slot; the median 0.25 us later, 2.47-2.57.) */
__device__ __forceinline__ unsigned poll_two(const gdrpy_chan_desc_t &d, u64 i,
                                             gdrpy_chan_in_t *in)
{
    const unsigned lane = threadIdx.x & 31u;
    const bool ok = (lane != 1u || d.nslots > 1u) && gdrpy_chan_take(d, i + (lane == 1u), in);
    const unsigned m = __ballot_sync(0xffffffffu, ok);
    return (m & 1u) ? ((m & 2u) ? 2u : 1u) : 0u;
}

/* Warp 0 and warp 1 meet from different places in the code: a barrier
 * that allows that (bar.sync / __syncthreads() is .aligned: every thread
 * of the block at the same instruction), with its memory ordering. */
__device__ __forceinline__ void both_warps_meet()
{
    asm volatile("barrier.sync 1, 64;" ::: "memory");
}

/* Two warps (launch exactly 64 threads).  Warp 0 consumes the channel
 * (gdrpy_channel.cuh helpers, LL or PLAIN slots); warp 1 only publishes the
 * consumed count for slot reuse, so the system-scope release that needs
 * never stands between warp 0's ack and its next poll (a tick that follows
 * another by a microsecond would wait for it).  While idle warp 0 looks
 * at messages head and head + 1 (poll_two: two requests per poll); the
 * round after one that found messages looks at 32 slots, lane k at message
 * head + k (bursts).  The ready prefix (up to 32) is
 * checked in parallel (tick against its seq: torn; sequence continuity
 * against the previous tick), then lane 0 stores the count to the host:
 * the ack (out + 64, a plain 8-byte store: these ticks are in the warp's
 * registers and checked; no fence, so nothing waits in front of it), then
 * hands the count to warp 1 through shared memory (a CTA-scope release:
 * the slots' loads are done).  Warp 1 takes it with a CTA-scope acquire and
 * publishes it as the channel's consumed count with st.release.sys, so the
 * host may reuse those slots (release and acquire compose: warp 0's loads
 * come before the host's new stores).  Only then go the per-symbol integer
 * sums (atomics: order-independent, exact), so no store waits for this
 * round's atomics.  published != 0 (cuMemcpy path): PLAIN's slot layout,
 * and a count word at dev_ctrl + 96 says how many messages are complete
 * instead of the slots' sequence words. */
extern "C" __global__ void feed_consumer(gdrpy_chan_desc_t d, int published, u64 *acc,
                                         unsigned char *out, u32 nsym, u64 seed,
                                         u64 idle_ns, u64 delay_ns)
{
    __shared__ volatile u64 s_checked;   /* warp 0 -> warp 1: ticks checked */
    __shared__ volatile int s_done;
    if (blockDim.x != 64u || blockIdx.x != 0) return;
    const unsigned lane = threadIdx.x & 31u;
    const unsigned full = 0xffffffffu;
    if (threadIdx.x == 0) { s_checked = 0; s_done = 0; }
    __syncthreads();
    if (threadIdx.x >= 32u) {
        /* warp 1: the consumed count, off warp 0's path */
        u64 pub = 0;
        for (;;) {
            int done = 0;
            u64 c = 0;
            if (lane == 0) {
                done = s_done;
                __threadfence_block();
                c = s_checked;
                __threadfence_block();               /* acquire (CTA) */
                if (c != pub) gdrpy_chan_consume(d, c);   /* st.release.sys */
            }
            done = __shfl_sync(full, done, 0);
            c = __shfl_sync(full, c, 0);
            if (c != pub) pub = c;
            else if (done) break;
        }
        both_warps_meet();                           /* before warp 0's final report */
        return;
    }
    const unsigned window = d.nslots < 32u ? d.nslots : 32u;
    u64 head = 0, last = 0;
    u64 torn = 0, missing = 0, gaps = 0, backward = 0, badlen = 0;
    if (lane == 0) gdrpy_chan_attach(d);
    __syncwarp();
    u64 t_idle = gdrpy_globaltimer();
    u32 status = GDRPY_CHAN_ST_STOPPED;
    unsigned spins = 0, rounds = 0;
    bool fresh = true, burst = false;
    for (;;) {
        u64 batch = 0;
        for (int r = 0; r < 4; ++r) {
            u64 base = head + batch;
            unsigned n;
            u64 seq = 0, px = 0;
            u32 sym = 0, qty = 0, len = 0;
            if (published) {
                /* one lane loads the count and broadcasts it: lanes loading
                 * it themselves could see different values (divergence) */
                u64 pub = 0;
                if (lane == 0) pub = gdrpy_ld_acquire_sys_u64((const void *)(d.dev_ctrl + 96));
                pub = __shfl_sync(full, pub, 0);
                __syncwarp();
                u64 avail = pub > base ? pub - base : 0;
                n = avail > window ? window : (unsigned)avail;
                if (n == 0) break;
                if (lane < n) tick_at(gdrpy_chan_msg(d, base + lane, &len, 0), seq, px, sym, qty);
            } else {
                gdrpy_chan_in_t in;
                n = burst ? gdrpy_chan_poll_warp_in(d, base, &in) : poll_two(d, base, &in);
                if (n == 0) break;
                if (lane < n) {
                    len = in.len;
                    tick_fields(in, seq, px, sym, qty);
                }
            }
            u64 prev = __shfl_up_sync(full, seq, 1);
            if (lane == 0) prev = last;
            if (lane < n) {
                if (len != 32u) ++badlen;
                u64 h1 = mix64(seq + seed * 0x9e3779b97f4a7c15ULL);
                u64 h2 = mix64(h1);
                u32 rs = (u32)((h1 >> 32) % nsym);
                u32 rq = 1u + (u32)((h1 & 0xffffffffULL) % 1000u);
                u64 rp = 1000000ULL + h2 % 4000000ULL;
                if (rs != sym || rq != qty || rp != px) ++torn;
                if (seq > prev + 1) { ++gaps; missing += seq - prev - 1; }
                else if (seq <= prev) ++backward;
            }
            last = __shfl_sync(full, seq, n - 1);     /* every lane's loads are done */
            if (delay_ns && lane == 0) {              /* test knob: a slow consumer */
                u64 t = gdrpy_globaltimer();
                while (gdrpy_globaltimer() - t < delay_ns * n) { }
            }
            batch += n;
            __syncwarp();
            if (lane == 0) {
                gdrpy_st_relaxed_u64(out + 64, head + batch);    /* the ack */
                __threadfence_block();                           /* release (CTA) */
                s_checked = head + batch;                        /* warp 1: slot reuse */
            }
            if (lane < n && sym < nsym) {
                atomicAdd(&acc[3 * sym], px * (u64)qty);
                atomicAdd(&acc[3 * sym + 1], (u64)qty);
                atomicAdd(&acc[3 * sym + 2], 1ULL);
            }
            if (n < 32u) break;
        }
        burst = batch != 0;
        if (batch == 0) {
            /* idle: every 16th poll looks at the shutdown word (each look is
             * another round trip to memory before the next poll) */
            if ((++spins & 15u) != 0) continue;
            u32 mode = 0;
            if (lane == 0) mode = gdrpy_chan_shutdown_mode(d);
            mode = __shfl_sync(full, mode, 0);
            if (mode == GDRPY_CHAN_ABORT) break;
            if (mode == GDRPY_CHAN_DRAIN) {
                u64 sent = 0;
                if (lane == 0) sent = gdrpy_chan_sent(d);
                sent = __shfl_sync(full, sent, 0);
                if (head >= sent) break;
                continue;
            }
            if (idle_ns && (spins & 255u) == 0) {
                /* the idle clock starts at the first look after the last
                 * message (no timer read on the busy path) */
                u64 now = 0;
                if (lane == 0) now = gdrpy_globaltimer();
                now = __shfl_sync(full, now, 0);
                if (fresh) { t_idle = now; fresh = false; }
                else if (now - t_idle > idle_ns) { status = GDRPY_CHAN_ST_TIMEOUT; break; }
            }
            continue;
        }
        spins = 0;
        fresh = true;
        head += batch;
        if ((++rounds & 63u) == 0) {
            u32 mode = 0;
            if (lane == 0) mode = gdrpy_chan_shutdown_mode(d);
            mode = __shfl_sync(full, mode, 0);
            if (mode == GDRPY_CHAN_ABORT) break;
        }
    }
    if (lane == 0) {
        __threadfence_block();
        s_done = 1;                                  /* after the last count */
    }
    both_warps_meet();                               /* warp 1 has published it */
    for (int o = 16; o > 0; o >>= 1) {
        torn += __shfl_xor_sync(full, torn, o);
        missing += __shfl_xor_sync(full, missing, o);
        gaps += __shfl_xor_sync(full, gaps, o);
        backward += __shfl_xor_sync(full, backward, o);
        badlen += __shfl_xor_sync(full, badlen, o);
    }
    __threadfence();
    __syncwarp();
    volatile u64 *o64 = (volatile u64 *)out;
    for (u32 k = lane; k < 3u * nsym; k += 32u)
        o64[16 + k] = *(volatile u64 *)&acc[k];          /* out + 128: the sums */
    if (lane == 0) {
        o64[0] = head; o64[1] = torn; o64[2] = missing; o64[3] = gaps;
        o64[4] = backward; o64[5] = last; o64[6] = badlen;
    }
    __threadfence_system();
    __syncwarp();
    if (lane == 0) {
        *(volatile u32 *)(out + 56) = 1u;
        gdrpy_chan_stop(d, head, status);
    }
    __syncwarp();
}
"""


def include_dirs() -> list[str]:
    """Where gdrpy_channel.cuh is: the installed package's, else this tree's."""
    out = []
    try:
        import gdrpy
        inc = os.path.join(os.path.dirname(gdrpy.__file__), "include")
        if os.path.exists(os.path.join(inc, "gdrpy_channel.cuh")):
            out.append(inc)
    except ImportError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    tree = os.path.normpath(os.path.join(here, "..", "..", "native", "include"))
    if os.path.exists(os.path.join(tree, "gdrpy_channel.cuh")):
        out.append(tree)
    return out


def _chk(res, what):
    err = res[0] if isinstance(res, tuple) else res
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err!r}")
    if isinstance(res, tuple):
        return res[1] if len(res) == 2 else res[1:]
    return None


class Gpu:
    """Primary context of `device`, the consumer kernel compiled by NVRTC,
    one non-blocking stream, page-locked host allocations."""

    def __init__(self, device: int = 0):
        from cuda.bindings import driver as cu
        from cuda.bindings import nvrtc
        self.cu, self.nvrtc = cu, nvrtc
        _chk(cu.cuInit(0), "cuInit")
        self.dev = _chk(cu.cuDeviceGet(device), "cuDeviceGet")
        self.ctx = _chk(cu.cuDevicePrimaryCtxRetain(self.dev), "cuDevicePrimaryCtxRetain")
        _chk(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        A = cu.CUdevice_attribute
        self.cc = (int(_chk(cu.cuDeviceGetAttribute(
                       A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.dev), "attr")),
                   int(_chk(cu.cuDeviceGetAttribute(
                       A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.dev), "attr")))
        self.module = self._compile(KERNEL_SRC)
        self.func = _chk(cu.cuModuleGetFunction(self.module, b"feed_consumer"),
                         "cuModuleGetFunction")
        self.stream = _chk(cu.cuStreamCreate(1), "cuStreamCreate")
        self._host = []
        self._keep = None

    def _compile(self, src: str):
        nv, cu = self.nvrtc, self.cu
        err, archs = nv.nvrtcGetSupportedArchs()
        want = self.cc[0] * 10 + self.cc[1]
        archs = sorted(int(a) for a in archs) if not int(err) else [want]
        cubin = want in archs
        arch = f"sm_{want}" if cubin else f"compute_{max(a for a in archs if a <= want)}"
        prog = _chk(nv.nvrtcCreateProgram(src.encode(), b"feed_consumer.cu", 0, [], []),
                    "nvrtcCreateProgram")
        opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"]
        opts += [f"-I{d}".encode() for d in include_dirs()]
        res = nv.nvrtcCompileProgram(prog, len(opts), opts)
        if int(res[0]) != 0:
            n = _chk(nv.nvrtcGetProgramLogSize(prog), "log size")
            log = b" " * n
            nv.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"NVRTC failed: {log.decode(errors='replace')}")
        if cubin:
            n = _chk(nv.nvrtcGetCUBINSize(prog), "cubin size")
            img = b" " * n
            _chk(nv.nvrtcGetCUBIN(prog, img), "nvrtcGetCUBIN")
        else:
            n = _chk(nv.nvrtcGetPTXSize(prog), "ptx size")
            img = b" " * n
            _chk(nv.nvrtcGetPTX(prog, img), "nvrtcGetPTX")
        self.arch = arch
        return _chk(cu.cuModuleLoadData(img), "cuModuleLoadData")

    def host_alloc(self, nbytes: int) -> tuple[int, int]:
        """Zeroed page-locked host memory mapped into the device: (cpu, dev)."""
        cu = self.cu
        p = int(_chk(cu.cuMemHostAlloc(nbytes, 0x01 | 0x02), "cuMemHostAlloc"))
        ctypes.memset(p, 0, nbytes)
        d = int(_chk(cu.cuMemHostGetDevicePointer(p, 0), "cuMemHostGetDevicePointer"))
        self._host.append(p)
        return p, d

    def launch(self, desc: bytes, published: bool, acc: int, out_dev: int, nsym: int,
               seed: int, idle_ns: int, delay_ns: int) -> None:
        cu = self.cu
        _chk(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        vals = [(ctypes.c_char * 64).from_buffer_copy(desc), ctypes.c_int(int(published)),
                ctypes.c_uint64(acc), ctypes.c_uint64(out_dev), ctypes.c_uint32(nsym),
                ctypes.c_uint64(seed), ctypes.c_uint64(idle_ns), ctypes.c_uint64(delay_ns)]
        ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        self._keep = (vals, ptrs)
        _chk(cu.cuLaunchKernel(self.func, 1, 1, 1, 64, 1, 1, 0, self.stream,
                               ctypes.addressof(ptrs), 0), "cuLaunchKernel(feed_consumer)")

    def done(self) -> bool:
        return int(self.cu.cuStreamQuery(self.stream)[0]) == 0

    def memset(self, dptr: int, nbytes: int) -> None:
        """Zero device memory on the kernel's stream: ordered before the next
        launch (a plain cuMemsetD8 may still run when the kernel starts)."""
        _chk(self.cu.cuMemsetD8Async(dptr, 0, nbytes, self.stream), "cuMemsetD8Async")

    def close(self) -> None:
        cu = self.cu
        for p in self._host:
            cu.cuMemFreeHost(p)
        self._host = []
        if self.stream is not None:
            cu.cuStreamDestroy(self.stream)
            self.stream = None
        if self.module is not None:
            cu.cuModuleUnload(self.module)
            self.module = None
