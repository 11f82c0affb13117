"""Device memory that every gdrpy backend can map.

``alloc(nbytes, device=0, ctx=None)`` returns:

* on a GPU: a :class:`VmmBuffer` - memory from ``cuMemCreate`` with a POSIX
  file-descriptor shareable handle and ``gpuDirectRDMACapable`` set, mapped
  with ``cuMemAddressReserve/cuMemMap/cuMemSetAccess`` (the allocation route
  the nvrm backend imports directly).  It exposes ``__cuda_array_interface__``
  (v3) and ``__dlpack__`` / ``__dlpack_device__`` so CuPy and PyTorch can use
  it without a copy (``cupy.asarray(buf)``, ``torch.from_dlpack(buf)``).
* with a ``sim`` context (or ``kind="sim"``): a :class:`SimBuffer` - host
  memory from libgdrpy's sim allocator standing in for GPU memory.  It does
  *not* claim to be CUDA memory: it exposes ``__dlpack__`` as CPU memory and
  ``numpy()`` for its "device side".

Page-locked *host* memory for the copy engines: ``host_alloc(nbytes, ctx=ctx)``
(a :class:`HostBuffer`; see gdrpy.hostmem, also for ``ctx.register(buf)``).

Every buffer is a context manager; ``close()`` frees it (pins taken on it
keep their pages alive until unpinned, as on a GPU).
"""

from __future__ import annotations

import errno
import threading

from . import _core
from .errors import (
    ArgumentTypeError,
    DriverError,
    InvalidArgumentError,
    NotSupportedError,
)

__all__ = ["DeviceBuffer", "SimBuffer", "VmmBuffer", "alloc", "cuda_driver"]


def _as_nbytes(nbytes) -> int:
    if isinstance(nbytes, bool) or not hasattr(nbytes, "__index__") or isinstance(nbytes, float):
        raise ArgumentTypeError(f"nbytes must be an integer, not {type(nbytes).__name__}")
    n = int(nbytes.__index__())
    if n <= 0:
        raise InvalidArgumentError(f"nbytes {n} must be positive", errno.EINVAL)
    if n >= 1 << 48:   # 256 TiB: beyond any GPU; keeps driver calls' size_t safe
        raise InvalidArgumentError(f"nbytes {n} is larger than any device memory",
                                   errno.EINVAL)
    return n


class DeviceBuffer:
    """Base: ``ptr`` (device address), ``size`` (bytes), ``device``."""

    kind = "abstract"

    def __init__(self, ptr: int, size: int, device: int):
        self._ptr: int | None = ptr
        self.size = size
        self.device = device
        self._exports = 0   # live DLPack exports (numpy/torch/cupy views)
        self._fork_gen = _core.fork_generation()

    @property
    def _foreign(self) -> bool:
        """True in a forked child: the memory belongs to the parent."""
        return self._fork_gen != _core.fork_generation()

    @property
    def ptr(self) -> int:
        if self._ptr is None:
            from .errors import ClosedError
            raise ClosedError("the buffer is freed", errno.EBADF)
        if self._foreign:
            from .errors import WrongProcessError
            raise WrongProcessError(
                "this buffer belongs to the parent process (fork): device memory is not "
                "inherited; allocate a new buffer in the child", errno.EACCES)
        return self._ptr

    @property
    def closed(self) -> bool:
        return self._ptr is None

    @property
    def nbytes(self) -> int:
        return self.size

    def __gdrpy_device_range__(self):
        return self.ptr, self.size

    def __len__(self) -> int:
        return self.size

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        raise NotImplementedError

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "freed" if self._ptr is None else f"ptr={self._ptr:#x}"
        return f"<gdrpy.memory.{type(self).__name__} {state} size={self.size} device={self.device}>"

    # DLPack (v0.x capsule protocol) ------------------------------------
    def __dlpack_device__(self):
        raise NotImplementedError

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("gdrpy buffers export without copying only")
        dev_type, dev_id = self.__dlpack_device__()
        return _core.dlpack_capsule(_Export(self), self.ptr, self.size, dev_type, dev_id)

    def _check_closable(self) -> None:
        if self._exports:
            from .errors import BusyError
            raise BusyError(f"the buffer has {self._exports} live DLPack export(s) "
                            "(numpy/torch/cupy views); drop them before freeing it",
                            errno.EBUSY)


class _Export:
    """Owner of one DLPack export: keeps the buffer alive and counted until
    the consumer releases the tensor, so that close() can refuse meanwhile."""

    __slots__ = ("buf",)

    def __init__(self, buf):
        self.buf = buf
        buf._exports += 1

    def __del__(self):
        self.buf._exports -= 1


class SimBuffer(DeviceBuffer):
    """Host memory from the sim allocator, standing in for GPU memory."""

    kind = "sim"

    def __init__(self, nbytes: int):
        n = _as_nbytes(nbytes)
        ptr = _core.sim_alloc(n)
        super().__init__(ptr, n, 0)

    def close(self) -> None:
        if self._ptr is not None and self._foreign:
            self._ptr = None   # the parent's: nothing to free in the child
        if self._ptr is not None:
            self._check_closable()
            p, self._ptr = self._ptr, None
            _core.sim_free(p)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU: it is host memory

    def numpy(self):
        """The "device side" as a numpy uint8 array (no copy).  The array
        keeps the buffer alive, and close() refuses while it exists."""
        import numpy as np
        return np.frombuffer(_core.host_view(_Export(self), self.ptr, self.size), np.uint8)


# --------------------------------------------------------------------------
# CUDA (cuda-python) helpers

_cu = None
_cu_lock = threading.Lock()


def cuda_driver():
    """cuda.bindings.driver, initialised (cuInit)."""
    global _cu
    if _cu is None:
        with _cu_lock:
            if _cu is None:
                try:
                    from cuda.bindings import driver as cu
                except ImportError:  # older cuda-python layout
                    try:
                        from cuda import cuda as cu
                    except ImportError as e:
                        raise NotSupportedError(
                            f"cuda-python (cuda-bindings) is not installed: {e}",
                            errno.ENOTSUP) from None
                _check_cu(cu, cu.cuInit(0), "cuInit")
                _cu = cu
    return _cu


def _check_cu(cu, result, what):
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        try:
            name = cu.cuGetErrorName(err)[1].decode()
        except Exception:
            name = str(err)
        raise DriverError(f"{what} failed: {name}", errno.EIO)
    if isinstance(result, tuple):
        rest = result[1:]
        return rest[0] if len(rest) == 1 else (rest or None)
    return None


def primary_context(device: int):
    """Make ``device``'s primary context current on this thread (retained
    once per device for the process lifetime, as CuPy and PyTorch do)."""
    cu = cuda_driver()
    dev = _check_cu(cu, cu.cuDeviceGet(device), f"cuDeviceGet({device})")
    with _cu_lock:
        ctx = _primary.get(device)
        if ctx is None:
            ctx = _check_cu(cu, cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            _primary[device] = ctx
    _check_cu(cu, cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


_primary: dict = {}


class VmmBuffer(DeviceBuffer):
    """cuMemCreate memory (POSIX-fd shareable, GPUDirect-RDMA capable)."""

    kind = "vmm"

    def __init__(self, nbytes: int, device: int = 0):
        n = _as_nbytes(nbytes)
        cu = cuda_driver()
        primary_context(device)
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = device
        prop.requestedHandleTypes = \
            cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        prop.allocFlags.gpuDirectRDMACapable = 1
        gran = _check_cu(cu, cu.cuMemGetAllocationGranularity(
            prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
            "cuMemGetAllocationGranularity")
        gran = int(gran)
        self._alloc_size = (n + gran - 1) // gran * gran
        self._handle = _check_cu(cu, cu.cuMemCreate(self._alloc_size, prop, 0), "cuMemCreate")
        try:
            ptr = _check_cu(cu, cu.cuMemAddressReserve(self._alloc_size, 0, 0, 0),
                            "cuMemAddressReserve")
            self._reserved = ptr
            try:
                _check_cu(cu, cu.cuMemMap(ptr, self._alloc_size, 0, self._handle, 0), "cuMemMap")
                acc = cu.CUmemAccessDesc()
                acc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
                acc.location.id = device
                acc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                _check_cu(cu, cu.cuMemSetAccess(ptr, self._alloc_size, [acc], 1),
                          "cuMemSetAccess")
            except BaseException:
                cu.cuMemUnmap(ptr, self._alloc_size)
                cu.cuMemAddressFree(ptr, self._alloc_size)
                raise
        except BaseException:
            cu.cuMemRelease(self._handle)
            raise
        super().__init__(int(ptr), n, device)

    def close(self) -> None:
        if self._ptr is not None and self._foreign:
            self._ptr = None   # the parent's: CUDA is not usable in the child
        if self._ptr is None:
            return
        self._check_closable()
        cu = cuda_driver()
        ptr = self._reserved
        self._ptr = None
        primary_context(self.device)
        cu.cuCtxSynchronize()
        cu.cuMemUnmap(ptr, self._alloc_size)
        cu.cuMemAddressFree(ptr, self._alloc_size)
        cu.cuMemRelease(self._handle)

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.ptr, False),
                "version": 3, "strides": None, "stream": None}

    def __dlpack_device__(self):
        return (2, self.device)  # kDLCUDA


def alloc(nbytes: int, device: int = 0, ctx=None, kind: str | None = None) -> DeviceBuffer:
    """Allocate ``nbytes`` of device memory mappable by every backend.

    ``kind``: ``"vmm"`` (a GPU) or ``"sim"``; by default ``"sim"`` when
    ``ctx`` is a sim context, else ``"vmm"``."""
    if ctx is not None:
        device = ctx.device
        if kind is None:
            kind = "sim" if ctx.is_sim else "vmm"
    kind = kind or "vmm"
    if kind == "sim":
        return SimBuffer(nbytes)
    if kind == "vmm":
        return VmmBuffer(nbytes, device)
    raise InvalidArgumentError(f"unknown memory kind {kind!r} (vmm or sim)", errno.EINVAL)


# Page-locked host memory for the copy engines (gdrpy.hostmem; issue 14).
from .hostmem import HostBuffer, Registration, host_alloc  # noqa: E402

__all__ += ["host_alloc", "HostBuffer", "Registration"]
