"""Pins never wait for the GPU (issue 45): a kernel spins on one of three
streams (the legacy default stream, the per-thread default stream, a blocking
stream from cuStreamCreate(0)) while 64 KiB of every memory kind is pinned and
mapped, through libgdrapi.so.2 (whose first pin opens its context: the nvrm
self-test runs then, under the kernel) and through the Python API (CuPy arrays
and PyTorch tensors pinned as the objects themselves), and while a
second thread writes 8 bytes at a time through an existing mapping of the same
gdr_t / context and records its longest stall.

    python -m tests.gpu_pin_nowait --stream legacy|per_thread|blocking [--json F]
        one process, one stream (the self-test and learning run under the kernel)
    python -m tests.gpu_pin_nowait --report [--json F]
        the three streams, each in a fresh process, and the table: per stream,
        API and kind the first pin+map (learning included) and the longest of
        the next ones, in ms; the writers' longest stall, in ms

The kernel spins at most MAX_S seconds and stops earlier when the host sets a
flag in mapped host memory; every pin and map must return while it still runs
(an event recorded after it is not ready).  tests/test_gpu_pin_nowait.py runs
this and asserts the functional properties; the numbers are for the report.
Memory is allocated and written before the kernel starts: the test's own
copies would wait for it, gdrpy's must not."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

STREAMS = ("legacy", "per_thread", "blocking")
KB64 = 65536
MAX_S = 8.0      # the kernel's own limit
REPEAT = 5       # pins of each kind after the first

KERNEL = r"""
extern "C" __global__ void gdrpy_spin(const volatile unsigned int *stop,
                                      unsigned long long max_ns,
                                      unsigned long long *ran_ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(2000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (!*stop && t - t0 < max_ns);
    *ran_ns = t - t0 + 1;
}
"""

# kind -> how it is made: test_gpu_kinds._Alloc kinds, "cumemalloc", gdrpy.memory
# (cuMemCreate with POSIX_FD), CuPy's allocators, PyTorch's caching allocator
KINDS = ["cumemalloc", "vmm_fd", "vmm_none", "pool_default", "pool_none", "pool_fd",
         "cupy_default", "cupy_async", "torch"]


def _tests_dir_on_path() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)


class Buffers:
    """64 KiB of every kind, written with a pattern of its own; ptr[kind]
    (absent: the kind is not available here, why[kind] says why)."""

    def __init__(self, cu: Any) -> None:
        _tests_dir_on_path()
        from test_gpu_kinds import _Alloc, htod
        self.cu = cu
        self.ptr: dict[str, int] = {}
        self.obj: dict[str, Any] = {}   # CuPy arrays, PyTorch tensors: pinned as objects too
        self.why: dict[str, str] = {}
        self._keep: list[Any] = []
        for i, kind in enumerate(KINDS):
            try:
                p = self._make(kind, _Alloc)
            except ImportError as e:
                self.why[kind] = f"not installed: {e}"
                continue
            if kind not in ("cupy_default", "cupy_async", "torch"):
                pat = bytes((i * 29 + k * 7 + (k >> 8)) & 0xFF for k in range(KB64))
                htod(cu, p, pat)
            self.ptr[kind] = p
        self._sync_frameworks()

    def _make(self, kind: str, alloc_cls: Any) -> int:
        cu = self.cu
        if kind == "cumemalloc":
            from gdrpy.memory import _check_cu
            p = int(_check_cu(cu, cu.cuMemAlloc(KB64), "cuMemAlloc"))
            self._keep.append(("free", p))
            return p
        if kind in ("vmm_fd", "vmm_none", "pool_default", "pool_none", "pool_fd"):
            a = alloc_cls(cu, kind, KB64)
            self._keep.append(a)
            return int(a.ptr)
        if kind == "cupy_default":
            import cupy
            a = cupy.arange(KB64, dtype=cupy.uint8)
            self._keep.append(a)
            self.obj[kind] = a
            return int(a.data.ptr)
        if kind == "cupy_async":
            import cupy
            pool = cupy.cuda.MemoryAsyncPool()
            with cupy.cuda.using_allocator(pool.malloc):
                a = (cupy.arange(KB64, dtype=cupy.uint32) * 3).astype(cupy.uint8)
            self._keep.append((pool, a))
            self.obj[kind] = a
            return int(a.data.ptr)
        import torch
        if not torch.cuda.is_available():
            raise ImportError("torch.cuda is not available")
        t = (torch.arange(KB64, device="cuda", dtype=torch.int32) * 5).to(torch.uint8)
        self._keep.append(t)
        self.obj[kind] = t
        return int(t.data_ptr())

    def _sync_frameworks(self) -> None:
        from gdrpy.memory import _check_cu
        _check_cu(self.cu, self.cu.cuCtxSynchronize(), "cuCtxSynchronize")

    def close(self) -> None:
        for k in self._keep:
            if isinstance(k, tuple) and k[0] == "free":
                self.cu.cuMemFree(k[1])
            elif hasattr(k, "close"):
                k.close()
        self._keep.clear()


def page_range(ptr: int) -> tuple[int, int]:
    """The GPU pages around [ptr, ptr + 64 KiB), as UCX and GDRCopy clients pin."""
    return ptr & ~(KB64 - 1), (ptr + KB64 + KB64 - 1) & ~(KB64 - 1)


class Spinner:
    """The kernel, on one of STREAMS; running() asks an event recorded after
    it, without waiting."""

    def __init__(self, stream: str) -> None:
        from gdrpy.tools.cuda_rt import GpuRuntime, KernelParams, PinnedHost, launch
        self.rt = rt = GpuRuntime(0)
        cu = self.cu = rt.cu
        self.mod = rt.compile(KERNEL, "gdrpy_spin.cu")
        self.host = PinnedHost(rt, 64)
        self.flag = self.host.array("<u4", 0, 1)
        self.ran = self.host.array("<u8", 8, 1)
        self.flag[0] = 0
        self.ran[0] = 0
        self.own = None
        if stream in ("legacy", "per_thread"):   # cuda.h: CU_STREAM_LEGACY 0x1, _PER_THREAD 0x2
            name = "CU_STREAM_LEGACY" if stream == "legacy" else "CU_STREAM_PER_THREAD"
            h = cu.CUstream(int(getattr(cu, name, 1 if stream == "legacy" else 2)))
        else:
            h = self.own = rt.check(cu.cuStreamCreate(0), "cuStreamCreate(0)")
        self.handle = h

        class _S:
            handle = h
        self.event = rt.check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING),
                              "cuEventCreate")
        params = KernelParams(("u64", self.host.dptr), ("u64", int(MAX_S * 1e9)),
                              ("u64", self.host.dptr + 8))
        self._params = params
        self.t0 = time.monotonic()
        launch(rt, self.mod.function("gdrpy_spin"), (1,), (1,), params, _S,
               what=f"the spinning kernel on the {stream} stream")
        rt.check(cu.cuEventRecord(self.event, h), "cuEventRecord")
        time.sleep(0.05)   # the device picks it up

    def running(self) -> bool:
        res = self.cu.cuEventQuery(self.event)
        err = res[0] if isinstance(res, tuple) else res
        return int(err) == int(self.cu.CUresult.CUDA_ERROR_NOT_READY)

    def stop(self) -> float:
        """Stops it (the flag) and waits for it: the ms it ran."""
        self.flag[0] = 1
        self.rt.check(self.cu.cuEventSynchronize(self.event), "cuEventSynchronize")
        return float(self.ran[0]) / 1e6

    def close(self) -> None:
        if self.own is not None:
            self.cu.cuStreamDestroy(self.own)
        self.cu.cuEventDestroy(self.event)
        self.mod.close()
        self.host.close()


class Writer:
    """A thread that writes 8 bytes through an existing mapping in a loop and
    records the longest time between two writes returning, and the gaps in a
    histogram of 1 us bins (a list of every gap would be reallocated as it
    grows: at a million writes one such copy stalls the writer for ~1 ms)."""

    BINS = 10_000     # 1 us each; the last one holds every longer gap

    def __init__(self, write: Any) -> None:
        self.write = write
        self.stop_ev = threading.Event()
        self.hist = [0] * (self.BINS + 1)
        self.n = 0
        self.longest = 0
        self.err = ""
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        hist, top, write, stop = self.hist, self.BINS, self.write, self.stop_ev.is_set
        longest = n = 0
        last = time.perf_counter_ns()
        try:
            while not stop():
                write()
                now = time.perf_counter_ns()
                gap = now - last
                last = now
                hist[min(gap // 1000, top)] += 1
                n += 1
                if gap > longest:
                    longest = gap
        except Exception as e:
            self.err = f"{type(e).__name__}: {e}"
        self.n, self.longest = n, longest

    def finish(self) -> dict:
        self.stop_ev.set()
        self.t.join(10)
        p999 = None
        if self.n:
            need, seen = self.n - int(self.n * 0.999), 0
            for b in range(self.BINS, -1, -1):      # from the longest gaps down
                seen += self.hist[b]
                if seen >= need:
                    p999 = (b + 1) / 1e3        # the bin's upper edge, in ms
                    break
        return {"writes": self.n, "max_stall_ms": self.longest / 1e6 if self.n else None,
                "p999_ms": p999, "error": self.err, "hung": self.t.is_alive()}


def _gdrapi() -> Any:
    import gdrpy
    path = os.path.join(gdrpy.libdir(), "libgdrapi.so.2")
    lib = ctypes.CDLL(path)
    V, U, S = ctypes.c_void_p, ctypes.c_ulong, ctypes.c_size_t
    lib.gdr_open.restype = V
    lib.gdr_open.argtypes = []
    for name, args in {"gdr_close": [V], "gdr_pin_buffer": [V, U, S, ctypes.c_uint64,
                                                             ctypes.c_uint32, V],
                       "gdr_unpin_buffer": [V, U], "gdr_map": [V, U, V, S],
                       "gdr_unmap": [V, U, V, S], "gdr_copy_to_mapping": [U, V, V, S]}.items():
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = ctypes.c_int
    return lib


def _pins(spin: Spinner, bufs: Buffers, pin_map: Any, unmap_unpin: Any,
          objects: bool = False) -> list[dict]:
    """Every kind's GPU pages (objects: CuPy arrays and PyTorch tensors as
    themselves, as users pin them) pinned and mapped 1 + REPEAT times."""
    out = []
    for kind in KINDS:
        if kind not in bufs.ptr:
            out.append({"kind": kind, "skipped": bufs.why.get(kind, "?")})
            continue
        lo, hi = page_range(bufs.ptr[kind])
        what: Any = bufs.obj[kind] if objects and kind in bufs.obj else lo
        times: list[float] = []
        row: dict[str, Any] = {"kind": kind, "ok": True, "while_running": True, "error": ""}
        for _ in range(1 + REPEAT):
            t0 = time.perf_counter()
            try:
                h = pin_map(what, hi - lo)
            except Exception as e:
                row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:400]}")
                break
            times.append((time.perf_counter() - t0) * 1e3)
            row["while_running"] = row["while_running"] and spin.running()
            unmap_unpin(h)
        if times:
            row["first_ms"] = times[0]
            row["max_ms"] = max(times[1:]) if len(times) > 1 else None
        out.append(row)
    return out


def run_gdrapi(spin: Spinner, bufs: Buffers) -> dict:
    lib = _gdrapi()
    g = lib.gdr_open()
    if not g:
        return {"error": "gdr_open failed"}
    res: dict[str, Any] = {}
    try:
        # the writer's mapping: gdr_t's first pin opens its context (self-test)
        lo, hi = page_range(bufs.ptr["vmm_fd"])
        mh = ctypes.c_ulong()
        t0 = time.perf_counter()
        rc = lib.gdr_pin_buffer(g, lo, hi - lo, 0, 0, ctypes.byref(mh))
        vp = ctypes.c_void_p()
        rc = rc or lib.gdr_map(g, mh, ctypes.byref(vp), hi - lo)
        res["open_first_pin_ms"] = (time.perf_counter() - t0) * 1e3
        res["open_while_running"] = spin.running()
        if rc:
            res["error"] = f"the writer's pin/map: {rc}"
            return res
        src = ctypes.create_string_buffer(8)
        w = Writer(lambda: lib.gdr_copy_to_mapping(mh, vp.value, src, 8))

        def pin_map(addr: int, n: int) -> tuple:
            h = ctypes.c_ulong()
            r = lib.gdr_pin_buffer(g, addr, n, 0, 0, ctypes.byref(h))
            if r:
                raise OSError(r, f"gdr_pin_buffer: {os.strerror(r)}")
            m = ctypes.c_void_p()
            r = lib.gdr_map(g, h, ctypes.byref(m), n)
            if r:
                lib.gdr_unpin_buffer(g, h)
                raise OSError(r, f"gdr_map: {os.strerror(r)}")
            return h, m, n

        def unmap_unpin(x: tuple) -> None:
            lib.gdr_unmap(g, x[0], x[1], x[2])
            lib.gdr_unpin_buffer(g, x[0])

        res["pins"] = _pins(spin, bufs, pin_map, unmap_unpin)
        res["writer"] = w.finish()
    finally:
        lib.gdr_close(g)
    return res


def _capi() -> Any:
    """libgdrpy.so.0, the C API (a library of its own: its contexts are not the
    extension's)."""
    import gdrpy
    lib = ctypes.CDLL(os.path.join(gdrpy.libdir(), "libgdrpy.so.0"))
    H, P = ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)
    for name, args in {"gdrpy_open": [ctypes.c_int, ctypes.c_int, P], "gdrpy_close": [H],
                       "gdrpy_pin": [H, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint, P],
                       "gdrpy_map": [H, H, ctypes.c_void_p, ctypes.c_void_p],
                       "gdrpy_write": [H, H, ctypes.c_size_t, ctypes.c_void_p,
                                       ctypes.c_size_t],
                       "gdrpy_unmap": [H, H], "gdrpy_unpin": [H, H]}.items():
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = ctypes.c_int
    return lib


def run_capi(spin: Spinner, bufs: Buffers) -> dict:
    """The C API: pins of every kind on one context while another thread
    writes through gdrpy_write, whose copy path looks its pin up under the
    context's lock (a pin's proof must not hold it)."""
    import gdrpy
    lib = _capi()
    backend = gdrpy.backend_names().index(os.environ.get("GDRPY_GPU_BACKEND", "nvrm"))
    h = ctypes.c_uint64()
    res: dict[str, Any] = {}
    t0 = time.perf_counter()
    rc = lib.gdrpy_open(0, backend, ctypes.byref(h))
    res["open_ms"] = (time.perf_counter() - t0) * 1e3
    res["open_while_running"] = spin.running()
    if rc:
        return {"error": f"gdrpy_open: {rc}"}
    try:
        lo, hi = page_range(bufs.ptr["vmm_fd"])
        ph = ctypes.c_uint64()
        rc = lib.gdrpy_pin(h, lo, hi - lo, 0, ctypes.byref(ph))
        rc = rc or lib.gdrpy_map(h, ph, None, None)
        if rc:
            res["error"] = f"the writer's pin/map: {rc}"
            return res
        src = ctypes.create_string_buffer(8)
        w = Writer(lambda: lib.gdrpy_write(h, ph, 0, src, 8))

        def pin_map(addr: int, n: int) -> tuple:
            p = ctypes.c_uint64()
            r = lib.gdrpy_pin(h, addr, n, 0, ctypes.byref(p))
            if r:
                raise OSError(r, f"gdrpy_pin: {os.strerror(r)}")
            r = lib.gdrpy_map(h, p, None, None)
            if r:
                lib.gdrpy_unpin(h, p)
                raise OSError(r, f"gdrpy_map: {os.strerror(r)}")
            return (p,)

        def unmap_unpin(x: tuple) -> None:
            lib.gdrpy_unmap(h, x[0])
            lib.gdrpy_unpin(h, x[0])

        res["pins"] = _pins(spin, bufs, pin_map, unmap_unpin)
        res["writer"] = w.finish()
        lib.gdrpy_unmap(h, ph)
        lib.gdrpy_unpin(h, ph)
    finally:
        lib.gdrpy_close(h)
    return res


def run_python(spin: Spinner, bufs: Buffers) -> dict:
    """The Python API: ctx.pin/map of every kind (CuPy arrays and PyTorch
    tensors as themselves) while another thread writes through a mapping."""
    import gdrpy
    res: dict[str, Any] = {}
    t0 = time.perf_counter()
    ctx = gdrpy.open(0, os.environ.get("GDRPY_GPU_BACKEND", "nvrm"))
    res["open_ms"] = (time.perf_counter() - t0) * 1e3
    res["open_while_running"] = spin.running()
    try:
        lo, hi = page_range(bufs.ptr["vmm_fd"])
        wpin = ctx.pin(lo, size=hi - lo)
        wmap = wpin.map()
        w2 = Writer(lambda: wmap.write(8, b"12345678"))

        def pin_map(what: Any, n: int) -> tuple:
            p = ctx.pin(what, size=n) if isinstance(what, int) else ctx.pin(what)
            try:
                return p, p.map()
            except BaseException:
                p.close()
                raise

        def unmap_unpin(x: tuple) -> None:
            x[1].close()
            x[0].close()

        res["pins"] = _pins(spin, bufs, pin_map, unmap_unpin, objects=True)
        res["writer_mapping"] = w2.finish()
        wmap.close()
        wpin.close()
    finally:
        ctx.close()
    return res


def run_stream(stream: str) -> dict:
    """One process, one stream: the kernel, libgdrapi's pins, the Python API's."""
    from gdrpy.memory import cuda_driver, primary_context
    cu = cuda_driver()
    primary_context(0)
    bufs = Buffers(cu)
    sys.setswitchinterval(5e-5)    # the writers' GIL waits stay short
    spin = Spinner(stream)
    out: dict[str, Any] = {"stream": stream, "kinds_skipped": bufs.why}
    try:
        out["gdrapi"] = run_gdrapi(spin, bufs)
        out["capi"] = run_capi(spin, bufs)
        out["python"] = run_python(spin, bufs)
        out["still_running_at_end"] = spin.running()
    finally:
        out["kernel_ms"] = spin.stop()
        out["kernel_limit_ms"] = MAX_S * 1e3
        spin.close()
        bufs.close()
    return out


def run_in_subprocess(stream: str, timeout: float = 120.0) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-m", "tests.gpu_pin_nowait", "--stream", stream,
                        "--json", "-"], cwd=root, capture_output=True, text=True,
                       timeout=timeout, check=False)
    for line in p.stdout.splitlines():
        if line.startswith("NOWAIT-JSON "):
            return json.loads(line[len("NOWAIT-JSON "):])
    raise RuntimeError(f"no result (exit {p.returncode}): {p.stdout[-2000:]} {p.stderr[-3000:]}")


def table(results: list[dict]) -> str:
    lines = [f"{'stream':11s} {'api':7s} {'kind':14s} {'first ms':>9s} {'max ms':>8s}  note"]
    worst_pin = worst_stall = 0.0
    for r in results:
        for api in ("gdrapi", "capi", "python"):
            a = r.get(api, {})
            for row in a.get("pins", []):
                if "skipped" in row:
                    lines.append(f"{r['stream']:11s} {api:7s} {row['kind']:14s} "
                                 f"{'-':>9s} {'-':>8s}  skipped: {row['skipped'][:60]}")
                    continue
                mx = row.get("max_ms")
                worst_pin = max(worst_pin, mx or 0.0)
                note = "" if row["ok"] and row["while_running"] else (
                    row["error"][:80] or "returned after the kernel ended")
                lines.append(f"{r['stream']:11s} {api:7s} {row['kind']:14s} "
                             f"{row.get('first_ms', float('nan')):9.2f} "
                             f"{mx if mx is not None else float('nan'):8.2f}  {note}")
            for wk in ("writer", "writer_mapping"):
                wr = a.get(wk)
                if wr and wr.get("max_stall_ms") is not None:
                    worst_stall = max(worst_stall, wr["max_stall_ms"])
                    lines.append(f"{r['stream']:11s} {api:7s} {wk:14s} writes {wr['writes']}, "
                                 f"longest stall {wr['max_stall_ms']:.3f} ms, p99.9 "
                                 f"{wr['p999_ms']:.3f} ms {wr['error']}")
        lines.append(f"{r['stream']:11s} kernel ran {r.get('kernel_ms', 0):.0f} ms (limit "
                     f"{r.get('kernel_limit_ms', 0):.0f}); libgdrapi open + first pin "
                     f"{r.get('gdrapi', {}).get('open_first_pin_ms', float('nan')):.1f} ms, "
                     f"Python open {r.get('python', {}).get('open_ms', float('nan')):.1f} ms")
    lines.append(f"longest pin+map after the first: {worst_pin:.2f} ms (target < 10 ms); "
                 f"longest write stall: {worst_stall:.3f} ms (target < 1 ms)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.gpu_pin_nowait",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--stream", choices=STREAMS)
    ap.add_argument("--report", action="store_true", help="all streams, one process each")
    ap.add_argument("--json", default="", help="write the results here ('-': stdout)")
    a = ap.parse_args(argv)
    if a.stream:
        res = run_stream(a.stream)
        if a.json == "-":
            print("NOWAIT-JSON " + json.dumps(res), flush=True)
        elif a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        else:
            print(table([res]))
        return 0
    if not a.report:
        ap.error("give --stream or --report")
    results = [run_in_subprocess(s) for s in STREAMS]
    print(table(results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
