"""The little CUDA plumbing gdrpy's tools and examples need, on cuda-python
(``cuda.bindings``: driver API and NVRTC) - no hand-written ctypes bindings.

* :class:`GpuRuntime` - the device behind a gdrpy context, its primary
  context current; ``compile()`` (NVRTC -> cubin/PTX, gdrpy's include
  directory on the include path, so kernels can ``#include
  "gdrpy_channel.cuh"``), ``stream()``, ``host_alloc()``.
* :class:`Module`, :class:`Stream`, :class:`PinnedHost` (page-locked, mapped
  into the device: cuMemHostAlloc DEVICEMAP), :func:`launch` with
  :class:`KernelParams` (argument cells in one numpy buffer: scalars, device
  pointers and structures passed by value such as ``Channel.desc``).
"""

from __future__ import annotations

import errno
import os
import time

import numpy as np

__all__ = [
    "GpuRuntime",
    "KernelParams",
    "Module",
    "PinnedHost",
    "Stream",
    "include_dirs",
    "launch",
    "nvrtc_compile",
    "nvrtc_version",
    "wait_stream",
]


def include_dirs() -> list[str]:
    """Where gdrpy_channel.cuh is: the installed package's include directory,
    and native/include of a source checkout."""
    import gdrpy
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cands = [gdrpy.includedir(), os.path.join(here, "native", "include")]
    return [d for d in cands if os.path.exists(os.path.join(d, "gdrpy_channel.cuh"))]


class GpuRuntime:
    """The CUDA device behind a gdrpy context, through cuda-python."""

    def __init__(self, device: int = 0):
        from ..memory import cuda_driver, primary_context
        self.cu = cuda_driver()
        self.device = device
        primary_context(device)
        self.dev = self.check(self.cu.cuDeviceGet(device), f"cuDeviceGet({device})")
        A = self.cu.CUdevice_attribute
        attr = self.cu.cuDeviceGetAttribute
        self.cc = (int(self.check(attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.dev),
                                  "cuDeviceGetAttribute")),
                   int(self.check(attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.dev),
                                  "cuDeviceGetAttribute")))
        if not int(self.check(attr(A.CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, self.dev),
                              "cuDeviceGetAttribute")):
            from ..errors import NotSupportedError
            raise NotSupportedError(f"CUDA device {device} cannot map host memory",
                                    errno.ENOTSUP)
        self.arch: str | None = None

    def make_current(self) -> None:
        from ..memory import primary_context
        primary_context(self.device)

    def check(self, result, what: str):
        from ..memory import _check_cu
        return _check_cu(self.cu, result, what)

    def compile(self, src: str, name: str = "gdrpy_kernels.cu", options=()) -> Module:
        """NVRTC-compile ``src`` for this device and load it."""
        opts = [f"-I{d}" for d in include_dirs()] + list(options)
        image, kind, arch = nvrtc_compile(src, self.cc, name, opts)
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
            from cuda import nvrtc  # type: ignore[no-redef,unused-ignore]  # older layout
        except ImportError as e:
            from ..errors import NotSupportedError
            raise NotSupportedError(f"cuda-python's NVRTC binding is missing: {e}",
                                    errno.ENOTSUP) from None
    return nvrtc


def nvrtc_version() -> str:
    try:
        err, major, minor = _nvrtc().nvrtcVersion()
        return "?" if err else f"{major}.{minor}"
    except Exception:
        return "?"


def nvrtc_compile(src: str, cc: tuple, name: str = "gdrpy_kernels.cu", options=()):
    """Compile with NVRTC for compute capability ``cc``: ``(image, "cubin" |
    "ptx", arch)`` - a cubin for ``sm_XY`` when NVRTC supports the device,
    else PTX for the newest architecture it supports.  Errors raise
    DriverError with NVRTC's log."""
    from ..errors import DriverError, NotSupportedError
    nvrtc = _nvrtc()
    try:
        err, archs = nvrtc.nvrtcGetSupportedArchs()
    except Exception as e:
        raise NotSupportedError(f"NVRTC is not available ({e})", errno.ENOTSUP) from None
    want = cc[0] * 10 + cc[1]
    archs = sorted(int(a) for a in archs) if not err else []
    if want in archs:
        arch, kind = f"sm_{want}", "cubin"
    else:
        lower = [a for a in archs if a <= want]
        if not lower:
            raise NotSupportedError(f"this NVRTC supports {archs}, none at or below compute "
                                    f"capability {cc[0]}.{cc[1]}", errno.ENOTSUP)
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
        opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17",
                b"-default-device"] + [o.encode() for o in options]
        res = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        err = res[0] if isinstance(res, tuple) else res
        if err:
            size = chk(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = b" " * int(size)
            chk(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            text = log.rstrip(b"\0 ").decode(errors="replace")
            raise DriverError(f"NVRTC could not compile {name} for {arch}:\n{text}", errno.EIO)
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


def _addr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


class Module:
    """A loaded module (cuModuleLoadData); ``function(name)`` -> CUfunction;
    ``image`` keeps the cubin/PTX bytes (the C tools load it from a file)."""

    def __init__(self, rt: GpuRuntime, image: bytes, kind: str, arch: str):
        self.rt = rt
        self.kind = kind
        self.arch = arch
        self.image = image
        self._img = np.frombuffer(image + b"\0", dtype=np.uint8).copy()
        self.handle = rt.check(rt.cu.cuModuleLoadData(_addr(self._img)),
                               f"cuModuleLoadData ({kind} for {arch})")

    def function(self, name: str):
        return self.rt.check(self.rt.cu.cuModuleGetFunction(self.handle, name.encode()),
                             f"cuModuleGetFunction({name})")

    def close(self) -> None:
        if self.handle is not None:
            h, self.handle = self.handle, None
            self.rt.check(self.rt.cu.cuModuleUnload(h), "cuModuleUnload")


class PinnedHost:
    """Page-locked host memory mapped into the device (cuMemHostAlloc
    DEVICEMAP | PORTABLE): ``ptr`` for the CPU, ``dptr`` for kernels."""

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
        self.array(np.uint8)[:] = 0

    def array(self, dtype=np.uint8, offset: int = 0, count: int | None = None) -> np.ndarray:
        """numpy view (no copy); valid until close()."""
        from .._core import host_view
        dt = np.dtype(dtype)
        if count is None:
            count = (self.size - offset) // dt.itemsize
        return np.frombuffer(host_view(self, self.ptr + offset, count * dt.itemsize), dt)

    def close(self) -> None:
        if self.ptr:
            p, self.ptr = self.ptr, 0
            self.rt.check(self.rt.cu.cuMemFreeHost(p), "cuMemFreeHost")


class Stream:
    """A non-blocking stream."""

    def __init__(self, rt: GpuRuntime):
        self.rt = rt
        self.handle = rt.check(rt.cu.cuStreamCreate(rt.cu.CUstream_flags.CU_STREAM_NON_BLOCKING),
                               "cuStreamCreate(NON_BLOCKING)")

    def done(self) -> bool:
        res = self.rt.cu.cuStreamQuery(self.handle)
        err = res[0] if isinstance(res, tuple) else res
        if int(err) == int(self.rt.cu.CUresult.CUDA_ERROR_NOT_READY):
            return False
        self.rt.check(res, "cuStreamQuery")
        return True

    def synchronize(self) -> None:
        self.rt.check(self.rt.cu.cuStreamSynchronize(self.handle), "cuStreamSynchronize")

    def close(self) -> None:
        if self.handle is not None:
            h, self.handle = self.handle, None
            self.rt.check(self.rt.cu.cuStreamDestroy(h), "cuStreamDestroy")


def wait_stream(stream: Stream, timeout_s: float) -> bool:
    """Poll until the stream's work is done (True) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        if stream.done():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)


_FMT = {"u64": "<u8", "i64": "<i8", "u32": "<u4", "i32": "<i4", "f32": "<f4", "f64": "<f8"}


class KernelParams:
    """``kernelParams`` for cuLaunchKernel: ``KernelParams(("u64", ptr),
    ("u32", n), ("bytes", channel.desc), ...)``; every argument gets a
    16-byte aligned cell of one numpy buffer and ``address`` is the array of
    cell pointers.  ``set(i, value)`` rewrites a scalar between launches."""

    def __init__(self, *args):
        sizes = [len(v) if kind == "bytes" else 8 for kind, v in args]
        offs, off = [], 0
        for s in sizes:
            offs.append(off)
            off += (s + 15) // 16 * 16
        self._buf = np.zeros(max(off, 16), dtype=np.uint8)
        self._kinds = [k for k, _ in args]
        self._offs = offs
        for i, (_, v) in enumerate(args):
            self.set(i, v)
        self._ptrs = np.array([_addr(self._buf) + o for o in offs] or [0], dtype=np.uint64)
        self.address = _addr(self._ptrs)

    def set(self, i: int, value) -> None:
        kind, o = self._kinds[i], self._offs[i]
        if kind == "bytes":
            b = bytes(value)
            self._buf[o:o + len(b)] = np.frombuffer(b, np.uint8)
        else:
            dt = np.dtype(_FMT[kind])
            self._buf[o:o + dt.itemsize] = np.array([value], dtype=dt).view(np.uint8)


def launch(rt: GpuRuntime, func, grid, block, params: KernelParams, stream: Stream,
           shmem: int = 0, what: str = "cuLaunchKernel") -> None:
    g = tuple(grid) + (1,) * (3 - len(grid))
    b = tuple(block) + (1,) * (3 - len(block))
    rt.check(rt.cu.cuLaunchKernel(func, g[0], g[1], g[2], b[0], b[1], b[2], shmem,
                                  stream.handle, params.address, 0), what)
