"""CPU -> GPU -> CPU ping-pong through a BAR1 mapping and a persistent kernel.

``python -m gdrpy bench pingpong`` (or ``python -m gdrpy.tools.pingpong``).

What one round trip is
----------------------
* **gdrpy** (the path under test): a persistent kernel, compiled at run time
  with NVRTC, polls a flag word in GPU memory (a :mod:`gdrpy.memory` buffer,
  pinned and mapped).  The CPU stores the payload through the mapping, then
  the flag (the sequence number): two ``Mapping.write`` calls, each ending
  with an ``sfence``, so the payload reaches GPU memory before the flag
  (gdrpy.transfer's ordering rules).  The kernel sees the flag with an
  acquire load (``ld.acquire.sys``) plus ``__threadfence()``, reads the
  payload with volatile loads, computes a checksum with one thread block, and
  answers ``(checksum, then seq)`` with ``__threadfence_system()`` in between
  into pinned host memory (``cuMemHostAlloc`` + ``cuMemHostGetDevicePointer``).
  The CPU spins on that host word.
* **cuMemcpy** (the usual way, same run): per message
  ``cuMemcpyHtoDAsync`` of the payload from pinned host memory,
  ``cuLaunchKernel`` of a one-shot kernel computing the same checksum,
  ``cuMemcpyDtoHAsync`` of the answer and ``cuStreamSynchronize``, all on
  one non-blocking stream through cuda-python.

Every answer is checked (sequence number and checksum); a wrong one stops the
run with an error.  Times are wall-clock round trips seen from Python
(``time.perf_counter_ns``), so both columns include the interpreter's cost.

Safety: the persistent kernel gives up by itself after ``--kernel-timeout``
seconds without a message (its watchdog reads ``%globaltimer``), the host
waits for every answer with a timeout, and a ``try/finally`` always sets the
stop flag and waits for the kernel before freeing anything.

On the ``sim`` backend there is no GPU: a CPU thread stands in for the
kernel, and the output says so on every table.

The GPU plumbing below (:class:`GpuRuntime`, :class:`Module`,
:class:`PinnedHost`, :class:`Stream`, :class:`KernelArgs`,
:func:`wait_stream`) and :func:`summarize` are also used by the examples
(``examples/trading_feed.py``).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import sys
import threading
import time

import numpy as np

from .._sizes import format_size, parse_size
from .._sizes import parse_sizes as _parse_sizes
from .stats import summarize as _summarize

__all__ = ["add_arguments", "main", "run", "summarize", "parse_size", "parse_sizes",
           "GpuRuntime", "Module", "PinnedHost", "Stream", "KernelArgs", "wait_stream",
           "SIM_LABEL", "KERNEL_SRC", "DEVICE_HELPERS_SRC"]

SIM_LABEL = "SIM: CPU thread stands in for the GPU kernel"

# ---------------------------------------------------------------------------
# Layout of the GPU buffer (pinned + mapped) and of the pinned host answer.

CTRL_SEQ = 0          # u64: the flag; a new value = a new message
CTRL_LEN = 8          # u32: payload length (written before the flag)
CTRL_STOP = 64        # u32: non-zero = stop now
RESP_DEV = 1024       # 64 B: the one-shot kernel's answer (device memory)
PAYLOAD = 4096        # payload bytes

R_SEQ = 0             # u64: seq echoed (written last)
R_CSUM = 8            # u32: checksum of the payload
R_STATUS = 12         # u32: ST_* below
R_COUNT = 16          # u64: messages answered

ST_NONE, ST_RUNNING, ST_STOPPED, ST_TIMEOUT = 0, 1, 2, 3
_STATUS_NAMES = {ST_NONE: "not started", ST_RUNNING: "running", ST_STOPPED: "stopped",
                 ST_TIMEOUT: "gave up (watchdog timeout)"}

BLOCK = 128
MAX_SIZE = 16 << 20
DEFAULT_SIZES = "4,64,1K,4K"
DEFAULT_ITERS = 10000
QUICK_ITERS = 1000

DEVICE_HELPERS_SRC = r"""
/* Shared by the NVRTC kernels of gdrpy.tools.pingpong and examples/: polling
 * words the CPU writes through BAR1 needs system-scope acquire loads. */
typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ u64 gdr_globaltimer()
{
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ u64 gdr_ld_acquire_u64(const u64 *p)
{
    u64 v;
#if __CUDA_ARCH__ >= 700
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#else
    v = *(const volatile u64 *)p;
    __threadfence_system();
#endif
    return v;
}

__device__ __forceinline__ u32 gdr_ld_acquire_u32(const u32 *p)
{
    u32 v;
#if __CUDA_ARCH__ >= 700
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
    v = *(const volatile u32 *)p;
    __threadfence_system();
#endif
    return v;
}

"""

KERNEL_SRC = DEVICE_HELPERS_SRC + r"""

#define ST_RUNNING 1u
#define ST_STOPPED 2u
#define ST_TIMEOUT 3u

/* checksum = sum(byte[i] * ((i & 255) + 1)) mod 2^32, volatile loads (the
 * payload is rewritten by the CPU between messages: never serve it from L1). */
__device__ __forceinline__ u32 gdr_checksum_part(const unsigned char *payload, u32 len)
{
    u32 c = 0;
    u32 nw = len >> 2;
    const volatile u32 *w = (const volatile u32 *)payload;
    for (u32 k = threadIdx.x; k < nw; k += blockDim.x) {
        u32 v = w[k];
        u32 i = k << 2;
        c += (v & 0xffu) * ((i & 255u) + 1u)
           + ((v >> 8) & 0xffu) * (((i + 1u) & 255u) + 1u)
           + ((v >> 16) & 0xffu) * (((i + 2u) & 255u) + 1u)
           + (v >> 24) * (((i + 3u) & 255u) + 1u);
    }
    const volatile unsigned char *b = (const volatile unsigned char *)payload;
    for (u32 i = (nw << 2) + threadIdx.x; i < len; i += blockDim.x)
        c += (u32)b[i] * ((i & 255u) + 1u);
    return c;
}

__device__ __forceinline__ u32 gdr_block_sum(u32 c, u32 *part)
{
    for (int o = 16; o > 0; o >>= 1)
        c += __shfl_down_sync(0xffffffffu, c, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = c;
    __syncthreads();
    u32 s = 0;
    if (threadIdx.x == 0)
        for (u32 k = 0; k < (blockDim.x + 31) / 32; ++k) s += part[k];
    return s;   /* valid in thread 0 */
}

/* One block.  ctrl: the mapped control words (GPU memory); payload: mapped
 * GPU memory; resp: pinned host memory (device pointer). */
extern "C" __global__ void pp_persistent(const unsigned char *ctrl,
                                         const unsigned char *payload, u32 cap,
                                         unsigned char *resp, u64 timeout_ns)
{
    __shared__ u64 s_seq;
    __shared__ u32 s_len;
    __shared__ int s_cmd;
    __shared__ u32 s_part[32];
    volatile u64 *r64 = (volatile u64 *)resp;
    volatile u32 *r32 = (volatile u32 *)resp;
    const u64 *seqp = (const u64 *)(ctrl + 0);
    const u32 *lenp = (const u32 *)(ctrl + 8);
    const u32 *stopp = (const u32 *)(ctrl + 64);
    u64 last = 0;
    u64 count = 0;
    if (threadIdx.x == 0) {
        last = gdr_ld_acquire_u64(seqp);
        r64[0] = last;
        r32[3] = ST_RUNNING;
        __threadfence_system();
    }
    for (;;) {
        if (threadIdx.x == 0) {
            int cmd = 0;
            u64 seq = last;
            u64 t0 = gdr_globaltimer();
            u32 n = 0;
            for (;;) {
                seq = gdr_ld_acquire_u64(seqp);
                if (seq != last) { cmd = 1; break; }
                if (gdr_ld_acquire_u32(stopp)) { cmd = 2; break; }
                if ((++n & 1023u) == 0 && gdr_globaltimer() - t0 > timeout_ns) { cmd = 3; break; }
            }
            __threadfence();
            u32 len = *(const volatile u32 *)lenp;
            s_seq = seq;
            s_len = len < cap ? len : cap;
            s_cmd = cmd;
        }
        __syncthreads();
        int cmd = s_cmd;
        if (cmd != 1) {
            if (threadIdx.x == 0) {
                r32[3] = cmd == 2 ? ST_STOPPED : ST_TIMEOUT;
                __threadfence_system();
            }
            return;
        }
        u64 seq = s_seq;
        u32 c = gdr_block_sum(gdr_checksum_part(payload, s_len), s_part);
        if (threadIdx.x == 0) {
            r32[2] = c;
            r64[2] = ++count;
            __threadfence_system();   /* answer before the seq that publishes it */
            r64[0] = seq;
            __threadfence_system();
            last = seq;
        }
        __syncthreads();              /* shared words are rewritten next round */
    }
}

/* The cuMemcpy path's kernel: one launch per message, answer in device memory. */
extern "C" __global__ void pp_once(const unsigned char *payload, u32 len, u64 seq,
                                   unsigned char *resp_dev)
{
    __shared__ u32 s_part[32];
    u32 c = gdr_block_sum(gdr_checksum_part(payload, len), s_part);
    if (threadIdx.x == 0) {
        ((u32 *)resp_dev)[2] = c;
        ((u64 *)resp_dev)[0] = seq;
    }
}
"""


# ---------------------------------------------------------------------------
# Sizes and statistics

def parse_sizes(text) -> list[int]:
    """``--sizes`` for argparse: gdrpy._sizes.parse_sizes, errors as usage errors."""
    try:
        return _parse_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def summarize(samples_ns) -> dict:
    """Round-trip statistics in microseconds: median, p90, p99, p99.9 (nearest rank:
    gdrpy.tools.stats), max, min, mean and the sample count n."""
    return _summarize(samples_ns, scale=1e3)


_STATS_COLS = ("median", "p90", "p99", "p99.9", "max")


def stats_header(first="") -> str:
    return f"{first:<26s}" + "".join(f" {c:>9s}" for c in _STATS_COLS)


def stats_row(label: str, st: dict) -> str:
    """One table row; every cell starts with a space, so columns never run together
    (a value wider than its column pushes the rest of the row right instead)."""
    if not st.get("n"):
        return f"{label:<26s}   (no samples)"
    return f"{label:<26s}" + "".join(f" {st[c]:9.2f}" for c in _STATS_COLS)


# ---------------------------------------------------------------------------
# GPU plumbing (cuda-python driver API + NVRTC); shared with the examples.

class GpuRuntime:
    """The CUDA device behind a gdrpy context, through cuda-python.

    Makes the device's primary context (the one gdrpy uses) current on the
    calling thread; every call's CUresult is checked and turned into
    :class:`gdrpy.errors.DriverError` naming the call."""

    def __init__(self, device: int = 0):
        from ..memory import cuda_driver, primary_context
        self.cu = cuda_driver()
        self.device = device
        primary_context(device)
        self.dev = self.check(self.cu.cuDeviceGet(device), f"cuDeviceGet({device})")
        A = self.cu.CUdevice_attribute
        self.cc = (int(self.check(self.cu.cuDeviceGetAttribute(
                       A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.dev),
                       "cuDeviceGetAttribute")),
                   int(self.check(self.cu.cuDeviceGetAttribute(
                       A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.dev),
                       "cuDeviceGetAttribute")))
        can_map = self.check(self.cu.cuDeviceGetAttribute(
            A.CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, self.dev), "cuDeviceGetAttribute")
        if not int(can_map):
            from ..errors import NotSupportedError
            raise NotSupportedError(f"CUDA device {device} cannot map host memory "
                                    "(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY is 0)", errno.ENOTSUP)
        self.arch = None

    def make_current(self):
        from ..memory import primary_context
        primary_context(self.device)

    def check(self, result, what):
        from ..memory import _check_cu
        return _check_cu(self.cu, result, what)

    def compile(self, src: str, name: str = "gdrpy_kernels.cu", options=()) -> Module:
        """NVRTC-compile ``src`` for this device and load it (cuModuleLoadData)."""
        image, kind, arch = nvrtc_compile(src, self.cc, name, options)
        self.arch = arch
        return Module(self, image, kind, arch)

    def stream(self) -> Stream:
        return Stream(self)

    def host_alloc(self, nbytes: int) -> PinnedHost:
        return PinnedHost(self, nbytes)


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        try:
            from cuda import nvrtc  # type: ignore  # older cuda-python layout
        except ImportError as e:
            from ..errors import NotSupportedError
            raise NotSupportedError(f"cuda-python's NVRTC binding is missing: {e}",
                                    errno.ENOTSUP) from None
    return nvrtc


def nvrtc_version() -> str:
    """NVRTC's version as 'major.minor' ('?' if unknown)."""
    try:
        err, major, minor = _nvrtc().nvrtcVersion()
        return "?" if err else f"{major}.{minor}"
    except Exception:
        return "?"


def nvrtc_compile(src: str, cc: tuple, name: str = "gdrpy_kernels.cu", options=()):
    """Compile CUDA C++ with NVRTC for compute capability ``cc``.

    Returns ``(image bytes, "cubin" | "ptx", arch string)``: a cubin for
    ``sm_XY`` when this NVRTC supports the device's architecture (runs on
    any driver of the same CUDA major version), else PTX for the newest
    architecture it supports (JIT-compiled by the driver).  A compile error
    raises DriverError with NVRTC's log."""
    from ..errors import DriverError, NotSupportedError
    nvrtc = _nvrtc()
    try:
        err, archs = nvrtc.nvrtcGetSupportedArchs()
    except Exception as e:  # libnvrtc not found
        raise NotSupportedError(
            f"NVRTC is not available ({e}); install it with "
            "'pip install nvidia-cuda-nvrtc' (CUDA 13) or 'nvidia-cuda-nvrtc-cu12'",
            errno.ENOTSUP) from None
    want = cc[0] * 10 + cc[1]
    archs = sorted(int(a) for a in archs) if not err else []
    if want in archs:
        arch, kind = f"sm_{want}", "cubin"
    else:
        lower = [a for a in archs if a <= want]
        if not lower:
            raise NotSupportedError(f"this NVRTC supports {archs}, none at or below the "
                                    f"device's compute capability {cc[0]}.{cc[1]}", errno.ENOTSUP)
        arch, kind = f"compute_{lower[-1]}", "ptx"

    def chk(res, what):
        e = res[0] if isinstance(res, tuple) else res
        if e:
            try:
                msg = nvrtc.nvrtcGetErrorString(e)[1].decode()
            except Exception:
                msg = str(e)
            raise DriverError(f"{what} failed: {msg}", errno.EIO)
        return res[1] if isinstance(res, tuple) and len(res) > 1 else None

    prog = chk(nvrtc.nvrtcCreateProgram(src.encode(), name.encode(), 0, [], []),
               "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", b"-default-device",
                f"-DGDR_BLOCK={BLOCK}".encode()] + [o.encode() for o in options]
        res = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        err = res[0] if isinstance(res, tuple) else res
        if err:
            size = chk(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = b" " * int(size)
            chk(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            log = log.rstrip(b"\0 ").decode(errors="replace")
            raise DriverError(f"NVRTC could not compile {name} for {arch} "
                              f"({nvrtc.nvrtcGetErrorString(err)[1].decode()}):\n{log}", errno.EIO)
        if kind == "cubin":
            size = chk(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            image = b" " * int(size)
            chk(nvrtc.nvrtcGetCUBIN(prog, image), "nvrtcGetCUBIN")
        else:
            size = chk(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
            image = b" " * int(size)
            chk(nvrtc.nvrtcGetPTX(prog, image), "nvrtcGetPTX")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return bytes(image), kind, arch


class Module:
    """A loaded module (cuModuleLoadData); ``function(name)`` -> CUfunction."""

    def __init__(self, rt: GpuRuntime, image: bytes, kind: str, arch: str):
        self.rt = rt
        self.kind = kind
        self.arch = arch
        # A NUL-terminated copy the driver can read (PTX must end in NUL).
        self._img = np.frombuffer(image + b"\0", dtype=np.uint8).copy()
        self.handle = rt.check(rt.cu.cuModuleLoadData(self._img.ctypes.data),
                               f"cuModuleLoadData ({kind} for {arch})")

    def function(self, name: str):
        return self.rt.check(self.rt.cu.cuModuleGetFunction(self.handle, name.encode()),
                             f"cuModuleGetFunction({name})")

    def close(self):
        if self.handle is not None:
            h, self.handle = self.handle, None
            self.rt.check(self.rt.cu.cuModuleUnload(h), "cuModuleUnload")


class PinnedHost:
    """Page-locked host memory mapped into the device (cuMemHostAlloc with
    DEVICEMAP | PORTABLE); ``ptr`` for the CPU, ``dptr`` for kernels."""

    def __init__(self, rt: GpuRuntime, nbytes: int):
        cu = rt.cu
        self.rt = rt
        self.size = int(nbytes)
        flags = cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE
        self.ptr = int(rt.check(cu.cuMemHostAlloc(self.size, flags), f"cuMemHostAlloc({nbytes})"))
        try:
            self.dptr = int(rt.check(cu.cuMemHostGetDevicePointer(self.ptr, 0),
                                     "cuMemHostGetDevicePointer"))
        except BaseException:
            cu.cuMemFreeHost(self.ptr)
            raise
        ctypes.memset(self.ptr, 0, self.size)

    def array(self, dtype=np.uint8, offset: int = 0, count: int | None = None):
        """numpy view (no copy); valid until close()."""
        dt = np.dtype(dtype)
        if count is None:
            count = (self.size - offset) // dt.itemsize
        raw = (ctypes.c_char * (count * dt.itemsize)).from_address(self.ptr + offset)
        return np.frombuffer(raw, dtype=dt)

    def close(self):
        if self.ptr:
            p, self.ptr = self.ptr, 0
            self.rt.check(self.rt.cu.cuMemFreeHost(p), "cuMemFreeHost")


class Stream:
    """A non-blocking stream (never waits for, nor is waited on by, the legacy
    default stream that synchronous cuMemcpy calls use)."""

    def __init__(self, rt: GpuRuntime):
        self.rt = rt
        self.handle = rt.check(rt.cu.cuStreamCreate(rt.cu.CUstream_flags.CU_STREAM_NON_BLOCKING),
                               "cuStreamCreate(NON_BLOCKING)")

    def done(self) -> bool:
        """cuStreamQuery: True when all work finished; raises on a sticky error."""
        res = self.rt.cu.cuStreamQuery(self.handle)
        err = res[0] if isinstance(res, tuple) else res
        if int(err) == int(self.rt.cu.CUresult.CUDA_ERROR_NOT_READY):
            return False
        self.rt.check(res, "cuStreamQuery")
        return True

    def synchronize(self):
        self.rt.check(self.rt.cu.cuStreamSynchronize(self.handle), "cuStreamSynchronize")

    def close(self):
        if self.handle is not None:
            h, self.handle = self.handle, None
            self.rt.check(self.rt.cu.cuStreamDestroy(h), "cuStreamDestroy")


def wait_stream(stream: Stream, timeout_s: float) -> bool:
    """Wait (polling, with a timeout) until the stream's work is done."""
    deadline = time.monotonic() + timeout_s
    while True:
        if stream.done():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)


class KernelArgs:
    """The ``kernelParams`` array for cuLaunchKernel: ``KernelArgs((ctypes.c_uint64,
    ptr), (ctypes.c_uint32, n), ...)``; ``.address`` is what to pass;
    ``set(i, v)`` changes an argument in place between launches."""

    def __init__(self, *args):
        self._vals = [ctype(value) for ctype, value in args]
        self._ptrs = (ctypes.c_void_p * max(1, len(self._vals)))(
            *[ctypes.addressof(v) for v in self._vals])
        self.address = ctypes.addressof(self._ptrs)

    def set(self, i: int, value):
        self._vals[i].value = value


def launch(rt: GpuRuntime, func, grid, block, args: KernelArgs, stream: Stream, shmem=0,
           what="cuLaunchKernel"):
    g = tuple(grid) + (1,) * (3 - len(grid))
    b = tuple(block) + (1,) * (3 - len(block))
    rt.check(rt.cu.cuLaunchKernel(func, g[0], g[1], g[2], b[0], b[1], b[2], shmem,
                                  stream.handle, args.address, 0), what)


# ---------------------------------------------------------------------------
# The benchmark

def _checksums(payloads: np.ndarray, n: int) -> np.ndarray:
    """Expected answer for each payload row (first n bytes)."""
    w = ((np.arange(n, dtype=np.uint64) & 255) + 1)
    return (payloads[:, :n].astype(np.uint64) @ w) & 0xFFFFFFFF


def _payloads(n: int, variants: int, rng) -> np.ndarray:
    rows = rng.integers(0, 256, size=(variants, max(n, 1)), dtype=np.uint8)
    return rows


class _SimConsumer(threading.Thread):
    """SIM only: a CPU thread standing in for the persistent kernel.  Same
    protocol as ``pp_persistent`` on the sim buffer's device side."""

    def __init__(self, dev: np.ndarray, resp: np.ndarray, cap: int, timeout_s: float):
        super().__init__(name="gdrpy-sim-consumer", daemon=True)
        self.dev, self.resp, self.cap, self.timeout_s = dev, resp, cap, timeout_s
        self.error = None

    def run(self):
        try:
            self._run()
        except BaseException as e:  # reported by the host side
            self.error = e
            self.resp[R_STATUS:R_STATUS + 4].view(np.uint32)[0] = ST_TIMEOUT

    def _run(self):
        dev, resp = self.dev, self.resp
        seqv = dev[CTRL_SEQ:CTRL_SEQ + 8].view(np.uint64)
        lenv = dev[CTRL_LEN:CTRL_LEN + 4].view(np.uint32)
        stopv = dev[CTRL_STOP:CTRL_STOP + 4].view(np.uint32)
        r64 = resp[:32].view(np.uint64)
        r32 = resp[:32].view(np.uint32)
        w = ((np.arange(self.cap, dtype=np.uint64) & 255) + 1)
        last = int(seqv[0])
        r64[0] = last
        r32[R_STATUS // 4] = ST_RUNNING
        count = 0
        t0 = time.monotonic()
        sleep = time.sleep
        while True:
            seq = int(seqv[0])
            if seq != last:
                n = min(int(lenv[0]), self.cap)
                c = int(dev[PAYLOAD:PAYLOAD + n].astype(np.uint64) @ w[:n]) & 0xFFFFFFFF
                r32[R_CSUM // 4] = c
                count += 1
                r64[R_COUNT // 8] = count
                r64[0] = seq
                last = seq
                t0 = time.monotonic()
                continue
            if stopv[0]:
                r32[R_STATUS // 4] = ST_STOPPED
                return
            if time.monotonic() - t0 > self.timeout_s:
                r32[R_STATUS // 4] = ST_TIMEOUT
                return
            sleep(0)   # let the host thread run (one interpreter, one GIL)


class PingPong:
    """Owns everything one run allocates; ``close()`` (always called) stops
    the persistent kernel first, then frees in reverse order."""

    def __init__(self, ctx, max_size: int, kernel_timeout_s: float, host_timeout_s: float,
                 log=print):
        from .. import memory
        self.ctx = ctx
        self.sim = ctx.is_sim
        self.max_size = max_size
        self.kernel_timeout_s = kernel_timeout_s
        self.host_timeout_s = host_timeout_s
        self.log = log
        self.rt = self.module = self.stream = self.host = None
        self.buf = self.pin = self.m = None
        self.consumer = None
        self.kernel_live = False
        self.stuck = False
        nbytes = PAYLOAD + max_size
        self.buf = memory.alloc(nbytes, ctx=ctx)
        self.pin = ctx.pin(self.buf)
        self.m = self.pin.map()
        self.m.write(0, bytes(PAYLOAD))            # flag, length, stop = 0
        if self.sim:
            self._resp_store = np.zeros(4096, dtype=np.uint8)
            self.resp = self._resp_store
            self.resp_ptr = self.resp.ctypes.data
        else:
            self.rt = GpuRuntime(ctx.device)
            t0 = time.perf_counter()
            self.module = self.rt.compile(KERNEL_SRC, "gdrpy_pingpong.cu")
            self.compile_s = time.perf_counter() - t0
            self.f_persistent = self.module.function("pp_persistent")
            self.f_once = self.module.function("pp_once")
            self.stream = self.rt.stream()
            self.host = self.rt.host_alloc(4096)
            self.resp = self.host.array(np.uint8)
            self.resp_ptr = self.host.ptr
        self._r_seq = ctypes.c_uint64.from_address(self.resp_ptr + R_SEQ)
        self._r_csum = ctypes.c_uint32.from_address(self.resp_ptr + R_CSUM)
        self._r_status = ctypes.c_uint32.from_address(self.resp_ptr + R_STATUS)
        self.seq = 0

    # -- persistent kernel --------------------------------------------------
    def start(self):
        self.resp[:64] = 0
        self.m.write(0, bytes(128))
        self.seq = 0
        if self.sim:
            self.consumer = _SimConsumer(self.buf.numpy(), self.resp, self.max_size,
                                         self.kernel_timeout_s)
            self.consumer.start()
        else:
            self.rt.make_current()
            args = KernelArgs((ctypes.c_uint64, self.buf.ptr + CTRL_SEQ),
                              (ctypes.c_uint64, self.buf.ptr + PAYLOAD),
                              (ctypes.c_uint32, self.max_size),
                              (ctypes.c_uint64, self.host.dptr),
                              (ctypes.c_uint64, int(self.kernel_timeout_s * 1e9)))
            launch(self.rt, self.f_persistent, (1,), (BLOCK,), args, self.stream,
                   what="cuLaunchKernel(pp_persistent)")
        self.kernel_live = True
        deadline = time.monotonic() + max(10.0, self.host_timeout_s)
        while self._r_status.value != ST_RUNNING:
            if self._r_status.value not in (ST_NONE, ST_RUNNING) or time.monotonic() > deadline:
                raise TimeoutError("the persistent kernel did not report running within "
                                   f"{max(10.0, self.host_timeout_s):.0f} s (status "
                                   f"{_STATUS_NAMES.get(self._r_status.value, '?')})")
            if not self.sim and self.stream.done():
                raise RuntimeError("the persistent kernel exited before it started polling")
            time.sleep(0.0001)

    def stop(self):
        """Set the stop flag and wait for the kernel (bounded)."""
        if not self.kernel_live:
            return
        try:
            self.m.write(CTRL_STOP, (1).to_bytes(4, "little"))
        except Exception as e:  # the mapping is gone: the watchdog stops it
            self.log(f"warning: could not write the stop flag ({e}); waiting for the "
                     "kernel's watchdog", file=sys.stderr)
        limit = self.kernel_timeout_s + 5.0
        if self.sim:
            self.consumer.join(limit)
            ok = not self.consumer.is_alive()
        else:
            ok = wait_stream(self.stream, limit)
        if not ok:
            self.stuck = True
            raise RuntimeError(f"the persistent kernel did not stop within {limit:.0f} s; "
                               "its memory is left allocated (process exit frees it)")
        self.kernel_live = False
        if self.consumer is not None and self.consumer.error is not None:
            raise RuntimeError(f"SIM consumer thread failed: {self.consumer.error!r}")

    def roundtrips(self, size: int, iters: int, warmup: int, rng) -> np.ndarray:
        """gdrpy path: returns round trips in ns (warm-up excluded)."""
        variants = min(iters + warmup, 256)
        pls = _payloads(size, variants, rng)
        expect = [int(c) for c in _checksums(pls, size)]
        pl_bytes = [r.tobytes()[:size] for r in pls]
        m = self.m
        write = m.write
        r_seq, r_csum, r_status = self._r_seq, self._r_csum, self._r_status
        write(CTRL_LEN, size.to_bytes(4, "little"))   # ordered before the next flag
        out = np.empty(iters, dtype=np.int64)
        pc = time.perf_counter_ns
        timeout_ns = int(self.host_timeout_s * 1e9)
        sleep = time.sleep if self.sim else None
        seq = self.seq
        for i in range(warmup + iters):
            v = i % variants
            pl = pl_bytes[v]
            seq += 1
            sb = seq.to_bytes(8, "little")
            t0 = pc()
            write(PAYLOAD, pl)      # payload (stores + sfence) ...
            write(CTRL_SEQ, sb)     # ... then the flag
            spins = 0
            while r_seq.value != seq:
                spins += 1
                if sleep is not None:
                    sleep(0)
                if (spins & 0x3FFF) == 0:
                    if r_status.value != ST_RUNNING:
                        raise RuntimeError("the persistent kernel stopped answering: "
                                           f"{_STATUS_NAMES.get(r_status.value, '?')}")
                    if pc() - t0 > timeout_ns:
                        raise TimeoutError(f"no answer to message {seq} ({size} B) within "
                                           f"{self.host_timeout_s} s")
            t1 = pc()
            if r_csum.value != expect[v]:
                raise RuntimeError(f"wrong checksum for message {seq} ({size} B): got "
                                   f"{r_csum.value:#x}, expected {expect[v]:#x}")
            if i >= warmup:
                out[i - warmup] = t1 - t0
        self.seq = seq
        return out

    # -- the cuMemcpy path ----------------------------------------------------
    def baseline(self, size: int, iters: int, warmup: int, rng) -> np.ndarray:
        variants = min(iters + warmup, 256)
        pls = _payloads(size, variants, rng)
        expect = [int(c) for c in _checksums(pls, size)]
        out = np.empty(iters, dtype=np.int64)
        pc = time.perf_counter_ns
        seq = self.seq
        if self.sim:
            return self._baseline_sim(size, iters, warmup, pls, expect)
        rt, cu = self.rt, self.rt.cu
        rt.make_current()
        stride = (size + 255) // 256 * 256
        staging = rt.host_alloc(stride * variants)
        try:
            stg = staging.array(np.uint8)
            for v in range(variants):
                stg[v * stride:v * stride + size] = pls[v, :size]
            resp_dev = self.buf.ptr + RESP_DEV
            r_seq, r_csum = self._r_seq, self._r_csum
            args = KernelArgs((ctypes.c_uint64, self.buf.ptr + PAYLOAD),
                              (ctypes.c_uint32, size),
                              (ctypes.c_uint64, 0),
                              (ctypes.c_uint64, resp_dev))
            addr = args.address
            f = self.f_once
            h = self.stream.handle
            dst = self.buf.ptr + PAYLOAD
            HtoD, Launch, DtoH, Sync = (cu.cuMemcpyHtoDAsync, cu.cuLaunchKernel,
                                        cu.cuMemcpyDtoHAsync, cu.cuStreamSynchronize)
            for i in range(warmup + iters):
                v = i % variants
                seq += 1
                args.set(2, seq)
                src = staging.ptr + v * stride
                t0 = pc()
                e1, = HtoD(dst, src, size, h)
                e2, = Launch(f, 1, 1, 1, BLOCK, 1, 1, 0, h, addr, 0)
                e3, = DtoH(self.resp_ptr, resp_dev, 16, h)
                e4, = Sync(h)
                t1 = pc()
                if e1 or e2 or e3 or e4:
                    for e, what in ((e1, "cuMemcpyHtoDAsync"), (e2, "cuLaunchKernel(pp_once)"),
                                    (e3, "cuMemcpyDtoHAsync"), (e4, "cuStreamSynchronize")):
                        rt.check((e,), what)
                if r_seq.value != seq or r_csum.value != expect[v]:
                    raise RuntimeError(f"cuMemcpy path: wrong answer for message {seq} ({size} B):"
                                       f" seq {r_seq.value}, checksum {r_csum.value:#x} "
                                       f"(expected {expect[v]:#x})")
                if i >= warmup:
                    out[i - warmup] = t1 - t0
        finally:
            staging.close()
        self.seq = seq
        return out

    def _baseline_sim(self, size, iters, warmup, pls, expect):
        """SIM: memcpy (ctx.memcpy_htod/dtoh) + a Python function call stand in
        for cuMemcpyHtoD + kernel launch + cuMemcpyDtoH."""
        ctx = self.ctx
        dev = self.buf.numpy()
        w = ((np.arange(size, dtype=np.uint64) & 255) + 1)
        dst = self.buf.ptr + PAYLOAD
        resp_dev = self.buf.ptr + RESP_DEV
        r64 = dev[RESP_DEV:RESP_DEV + 16].view(np.uint64)
        r32 = dev[RESP_DEV:RESP_DEV + 16].view(np.uint32)
        out = np.empty(iters, dtype=np.int64)
        pc = time.perf_counter_ns
        seq = self.seq
        pl_bytes = [r.tobytes()[:size] for r in pls]
        for i in range(warmup + iters):
            v = i % len(pl_bytes)
            seq += 1
            t0 = pc()
            ctx.memcpy_htod(dst, pl_bytes[v])
            r32[2] = int(dev[PAYLOAD:PAYLOAD + size].astype(np.uint64) @ w) & 0xFFFFFFFF
            r64[0] = seq
            ans = ctx.memcpy_dtoh(resp_dev, 16)
            t1 = pc()
            got_seq = int.from_bytes(ans[0:8], "little")
            got_c = int.from_bytes(ans[8:12], "little")
            if got_seq != seq or got_c != expect[v]:
                raise RuntimeError(f"sim baseline: wrong answer for message {seq}")
            if i >= warmup:
                out[i - warmup] = t1 - t0
        self.seq = seq
        return out

    def close(self):
        errs = []
        try:
            self.stop()
        except Exception as e:
            errs.append(e)
        if self.stuck:
            # Never free memory a running kernel may still touch.
            return errs
        self.consumer = None   # (sim) drops its numpy view of the buffer first
        for obj in (self.m, self.pin, self.buf):
            try:
                if obj is not None:
                    obj.close()
            except Exception as e:
                errs.append(e)
        for obj in (self.host, self.stream, self.module):
            try:
                if obj is not None:
                    obj.close()
            except Exception as e:
                errs.append(e)
        return errs


def run(ctx, sizes, iters: int, warmup: int, kernel_timeout_s: float = 10.0,
        host_timeout_s: float = 5.0, seed: int = 1234, log=print, baseline: bool = True) -> dict:
    """Run both paths for every size on an open context; returns the result
    dict (what ``--json`` prints)."""
    for s in sizes:
        if s > MAX_SIZE:
            raise ValueError(f"size {s} is larger than {MAX_SIZE} bytes")
    rng = np.random.default_rng(seed)
    sim = ctx.is_sim
    info = ctx.info
    res = {
        "tool": "gdrpy pingpong",
        "backend": ctx.backend,
        "sim": sim,
        "device": ctx.device,
        "gpu": "none (sim)" if sim else info.get("gpu_name"),
        "driver": info.get("driver_version"),
        "iters": iters,
        "warmup": warmup,
        "sizes": list(sizes),
        "consumer": SIM_LABEL if sim else "persistent GPU kernel (NVRTC)",
        "paths": {
            "gdrpy": "payload + flag stored through the mapping; persistent consumer polls the "
                     "flag and answers (seq echo + checksum) into host memory; CPU spins on it",
            "cuMemcpy": ("SIM: ctx.memcpy_htod + a Python call + ctx.memcpy_dtoh" if sim else
                         "cuMemcpyHtoDAsync + cuLaunchKernel + cuMemcpyDtoHAsync + "
                         "cuStreamSynchronize per message (cuda-python, pinned host memory)"),
        },
        "results": [],
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    old_switch = sys.getswitchinterval()
    if sim:
        sys.setswitchinterval(1e-5)  # two Python threads share one GIL in sim
    pp = PingPong(ctx, max(sizes), kernel_timeout_s, host_timeout_s, log=log)
    errs = []
    try:
        if not sim:
            res["arch"] = pp.rt.arch
            res["module"] = pp.module.kind
            res["compile_s"] = round(pp.compile_s, 3)
            res["nvrtc"] = nvrtc_version()
        pp.start()
        gd = {}
        for s in sizes:
            gd[s] = pp.roundtrips(s, iters, warmup, rng)
        pp.stop()
        bl = {}
        if baseline:
            for s in sizes:
                bl[s] = pp.baseline(s, iters, warmup, rng)
        for s in sizes:
            res["results"].append({"size": s, "path": "gdrpy", "stats_us": summarize(gd[s])})
            if baseline:
                res["results"].append({"size": s, "path": "cuMemcpy",
                                       "stats_us": summarize(bl[s])})
    finally:
        errs = pp.close()
        if sim:
            sys.setswitchinterval(old_switch)
    if errs:
        raise errs[0]
    return res


def format_report(res: dict) -> str:
    lines = []
    sim = res["sim"]
    if sim:
        lines.append(f"*** {SIM_LABEL} (backend sim: no GPU is used; these numbers time "
                     "Python threads, not PCIe) ***")
    gpu = res["gpu"] if sim else f"{res['gpu']}, driver {res['driver']}"
    lines.append(f"gdrpy pingpong: device {res['device']} ({gpu}), backend {res['backend']}, "
                 f"{res['iters']} round trips per size (+{res['warmup']} warm-up)")
    if not sim:
        lines.append(f"  kernels: NVRTC {res.get('nvrtc', '?')} {res.get('module')} for "
                     f"{res.get('arch')} "
                     f"(compiled in {res.get('compile_s', 0):.2f} s)")
    lines.append(f"  gdrpy    : {res['paths']['gdrpy']}")
    lines.append(f"             consumer: {res['consumer']}")
    lines.append(f"  cuMemcpy : {res['paths']['cuMemcpy']}")
    lines.append("  times are wall-clock round trips seen from Python, in microseconds")
    lines.append(stats_header("round trip (us)"))
    by = {}
    for r in res["results"]:
        by.setdefault(r["size"], {})[r["path"]] = r["stats_us"]
    for s in res["sizes"]:
        d = by.get(s, {})
        tag = " [SIM]" if sim else ""
        if "gdrpy" in d:
            lines.append(stats_row(f"{format_size(s):>8s}  gdrpy{tag}", d["gdrpy"]))
        if "cuMemcpy" in d:
            lines.append(stats_row(f"{format_size(s):>8s}  cuMemcpy{tag}", d["cuMemcpy"]))
        if not sim and "gdrpy" in d and "cuMemcpy" in d and d["gdrpy"].get("n"):
            sp = d["cuMemcpy"]["median"] / max(d["gdrpy"]["median"], 1e-9)
            lines.append(f"{'':10s}speedup of the median: {sp:.1f}x")
    if sim:
        lines.append(f"*** {SIM_LABEL} ***")
    return "\n".join(lines)


def plot(res: dict, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError(f"--plot needs matplotlib ({e}): pip install matplotlib") from None
    sizes = res["sizes"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = np.arange(len(sizes))
    for k, (path_name, color) in enumerate((("gdrpy", "tab:blue"), ("cuMemcpy", "tab:orange"))):
        st = {r["size"]: r["stats_us"] for r in res["results"] if r["path"] == path_name}
        if not st:
            continue
        med = [st[s]["median"] for s in sizes]
        lo = [st[s]["median"] - st[s]["min"] for s in sizes]
        hi = [st[s]["p99"] - st[s]["median"] for s in sizes]
        ax.errorbar(xs + (k - 0.5) * 0.2, med, yerr=[lo, hi], fmt="o", capsize=4, color=color,
                    label=f"{path_name} (median, min..p99)")
        ax.scatter(xs + (k - 0.5) * 0.2, [st[s]["p99.9"] for s in sizes], marker="x",
                   color=color, label=f"{path_name} p99.9")
    ax.set_xticks(xs, [format_size(s) for s in sizes])
    ax.set_yscale("log")
    ax.set_ylabel("round trip (us)")
    title = "gdrpy pingpong" + (f" - {SIM_LABEL}" if res["sim"] else f" - {res['gpu']}")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------
# CLI

def _add(parser, *flags, **kw):
    """Add an option unless the parser (e.g. bench's common options) has it."""
    have = getattr(parser, "_option_string_actions", {})
    if any(f in have for f in flags):
        return
    parser.add_argument(*flags, **kw)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m gdrpy bench pingpong``."""
    _add(parser, "--device", type=int, default=0, help="CUDA device (default 0)")
    _add(parser, "--backend", default=None,
         help="gdrpy backend (default: $GDRPY_BACKEND or auto; 'sim' runs without a GPU)")
    _add(parser, "--sizes", type=parse_sizes, default=None,
         help=f"payload sizes, comma-separated (default {DEFAULT_SIZES})")
    _add(parser, "--iters", type=int, default=None,
         help=f"round trips per size and path (default {DEFAULT_ITERS}, --quick {QUICK_ITERS})")
    _add(parser, "--warmup", type=int, default=None,
         help="untimed round trips before each size (default iters/10, at least 10)")
    _add(parser, "--json", nargs="?", const="-", default=None, metavar="FILE",
         help="write the results as JSON to FILE ('-' or no FILE: stdout, table omitted)")
    _add(parser, "--plot", default=None, metavar="FILE.png", help="save a plot (needs matplotlib)")
    _add(parser, "--quick", action="store_true", help=f"{QUICK_ITERS} round trips per size")
    _add(parser, "--no-baseline", action="store_true", help="skip the cuMemcpy path")
    _add(parser, "--kernel-timeout", type=float, default=10.0,
         help="the kernel gives up after this many seconds without a message (default 10)")
    _add(parser, "--timeout", type=float, default=5.0,
         help="the host waits at most this long for one answer (default 5 s)")


def main(args) -> int:
    """Run from parsed ``args`` (``add_arguments``); 0 on success, 1 when the
    run failed (wrong answer, timeout, driver error: printed), 2 on bad
    options."""
    from ..errors import GdrError
    try:
        return _main(args)
    except (GdrError, RuntimeError, TimeoutError) as e:
        print(f"gdrpy pingpong: error: {e}", file=sys.stderr)
        return 1


def _main(args) -> int:
    import gdrpy
    sizes = getattr(args, "sizes", None) or parse_sizes(DEFAULT_SIZES)
    if isinstance(sizes, str):
        sizes = parse_sizes(sizes)
    quick = bool(getattr(args, "quick", False))
    iters = getattr(args, "iters", None) or (QUICK_ITERS if quick else DEFAULT_ITERS)
    warmup = getattr(args, "warmup", None)
    if warmup is None:
        warmup = max(10, iters // 10)
    if iters <= 0 or warmup < 0:
        print("gdrpy pingpong: --iters must be positive and --warmup non-negative", file=sys.stderr)
        return 2
    if max(sizes) > MAX_SIZE:
        print(f"gdrpy pingpong: sizes up to {format_size(MAX_SIZE)}", file=sys.stderr)
        return 2
    json_to = getattr(args, "json", None)
    if json_to is True:
        json_to = "-"
    quiet = json_to == "-"
    log = (lambda *a, **k: print(*a, **{"file": sys.stderr, **k})) if quiet else print
    with gdrpy.open(getattr(args, "device", 0) or 0, getattr(args, "backend", None)) as ctx:
        if ctx.is_sim:
            print(f"{SIM_LABEL} (backend sim)", file=sys.stderr)
        res = run(ctx, sizes, iters, warmup,
                  kernel_timeout_s=getattr(args, "kernel_timeout", 10.0),
                  host_timeout_s=getattr(args, "timeout", 5.0),
                  log=log, baseline=not getattr(args, "no_baseline", False))
    if json_to == "-":
        print(json.dumps(res, indent=2))
    else:
        print(format_report(res))
        if json_to:
            with open(json_to, "w") as f:
                json.dump(res, f, indent=2)
            print(f"results written to {json_to}")
    plot_to = getattr(args, "plot", None)
    if plot_to:
        try:
            plot(res, plot_to)
            log(f"plot written to {plot_to}")
        except RuntimeError as e:
            print(f"gdrpy pingpong: {e}", file=sys.stderr)
            return 2
    return 0


def _standalone(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gdrpy.tools.pingpong",
                                description=__doc__.split("\n\n")[0])
    from .. import __version__
    p.add_argument("--version", action="version", version=f"gdrpy {__version__}")
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return main(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(_standalone())
