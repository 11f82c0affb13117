"""GPU tests: pins by GPU page around small allocations (issue 18: what UCX and
GDRCopy clients do), through the Python API and through libgdrapi.so.2, and
every memory kind of issue 13: pinned and round-tripped, or refused with the
driver's reason.  Data is checked with cuda-python's cuMemcpyDtoH/HtoD."""

from __future__ import annotations

import ctypes
import errno
import os

import numpy as np
import pytest
from conftest import cuda_ok

import gdrpy
from gdrpy import errors

pytestmark = pytest.mark.gpu

BACKEND = os.environ.get("GDRPY_GPU_BACKEND", "nvrm")
PAGE = 65536


@pytest.fixture
def gctx():
    c = gdrpy.open(0, BACKEND)
    yield c
    c.close()


def dtoh(cu, dptr: int, n: int) -> bytes:
    out = np.empty(n, np.uint8)
    cuda_ok(cu.cuMemcpyDtoH(out.ctypes.data, dptr, n))
    return out.tobytes()


def htod(cu, dptr: int, data: bytes) -> None:
    a = np.frombuffer(data, np.uint8)
    cuda_ok(cu.cuMemcpyHtoD(dptr, a.ctypes.data, len(data)))
    cuda_ok(cu.cuCtxSynchronize())


def page_range(ptr: int, n: int) -> tuple[int, int]:
    """UCX's gdr_copy registration range."""
    return ptr & ~(PAGE - 1), (ptr + n + PAGE - 1) & ~(PAGE - 1)


# ---- issue 18: pins by GPU page ---------------------------------------------

@pytest.mark.parametrize("size", [1, 8, 16, 64, 512, 4096, PAGE])
def test_page_pins_around_small_allocations_leave_neighbours_untouched(cu, gctx, size):
    ptrs = [int(cuda_ok(cu.cuMemAlloc(size))) for _ in range(6)]
    try:
        for i, p in enumerate(ptrs):
            htod(cu, p, bytes([0x40 + i]) * size)
        for t, p in enumerate(ptrs):
            lo, hi = page_range(p, size)
            with gctx.pin(lo, size=hi - lo) as pin, pin.map() as m:
                assert pin.va == lo and pin.mapped_size >= hi - lo, (hex(pin.va), pin.mapped_size)
                m.write(p - lo, bytes([0xA0 + t]) * size)
                with pytest.raises(errors.OutOfRangeError):
                    m.write(hi - lo, b"\x00")   # one byte past the pinned pages
            for j, q in enumerate(ptrs):
                want = bytes([0xA0 + t if j == t else 0x40 + j]) * size
                assert dtoh(cu, q, size) == want, (size, t, j, hex(q))
            htod(cu, p, bytes([0x40 + t]) * size)
    finally:
        for p in ptrs:
            cuda_ok(cu.cuMemFree(p))


def test_interior_pointer_pin_reads_and_writes_its_bytes(cu, gctx):
    d = int(cuda_ok(cu.cuMemAlloc(3 * PAGE)))
    try:
        htod(cu, d, b"\x11" * (3 * PAGE))
        addr = d + PAGE + 100
        with gctx.pin(addr, size=10) as pin, pin.map() as m:
            assert len(m) == 10
            m.write(0, b"0123456789")
            with pytest.raises(errors.OutOfRangeError):
                m.write(5, b"0123456789")
        whole = dtoh(cu, d, 3 * PAGE)
        assert whole[PAGE + 100:PAGE + 110] == b"0123456789"
        assert whole[:PAGE + 100] == b"\x11" * (PAGE + 100)
        assert whole[PAGE + 110:] == b"\x11" * (2 * PAGE - 110)
    finally:
        cuda_ok(cu.cuMemFree(d))


def test_one_pin_over_several_allocations_of_one_chunk(cu, gctx):
    """UCX's registration cache merges neighbouring regions into one pin."""
    allocs = [int(cuda_ok(cu.cuMemAlloc(4096))) for _ in range(8)]
    try:
        # the largest group of them in one RM object (chunk): legacy IPC handle
        # words 12/13 name CUDA's RM client and object (docs: route C)
        groups: dict[tuple, list[int]] = {}
        for p in allocs:
            words = np.frombuffer(bytes(cuda_ok(cu.cuIpcGetMemHandle(p)).reserved), np.uint32)
            groups.setdefault((int(words[12]), int(words[13])), []).append(p)
        ptrs = max(groups.values(), key=len)
        assert len(ptrs) >= 2, f"no two 4 KiB allocations share a chunk: {groups}"
        lo, hi = page_range(min(ptrs), max(ptrs) + 4096 - min(ptrs))
        for i, p in enumerate(ptrs):
            htod(cu, p, bytes([i]) * 4096)
        with gctx.pin(lo, size=hi - lo) as pin, pin.map() as m:
            for i, p in enumerate(ptrs):
                assert m.read(p - lo, 4096) == bytes([i]) * 4096, hex(p)
                m.write(p - lo, bytes([0x80 + i]) * 4096)
        for i, p in enumerate(ptrs):
            assert dtoh(cu, p, 4096) == bytes([0x80 + i]) * 4096
    finally:
        for p in allocs:
            cuda_ok(cu.cuMemFree(p))


def test_pin_reaching_past_the_chunk_is_refused_naming_the_allowed_range(cu, gctx):
    n = 64 << 20
    d = int(cuda_ok(cu.cuMemAlloc(n)))
    try:
        with pytest.raises(errors.GdrError) as ei:
            gctx.pin(d, size=n + PAGE)
        assert ei.value.code == errno.EINVAL
        assert "pin within [0x" in str(ei.value), str(ei.value)
    finally:
        cuda_ok(cu.cuMemFree(d))


class _Gdr:
    """libgdrapi.so.2 through ctypes, as a C client would call it."""

    class Info(ctypes.Structure):
        _fields_ = [("va", ctypes.c_uint64), ("mapped_size", ctypes.c_uint64),
                    ("page_size", ctypes.c_uint32), ("tm_cycles", ctypes.c_uint64),
                    ("cycles_per_ms", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                    ("mapping_type", ctypes.c_int)]

    def __init__(self):
        path = os.path.join(gdrpy.libdir(), "libgdrapi.so.2")
        if not os.path.exists(path):
            path = os.path.join(os.path.dirname(__file__), "..", "native", "build",
                                "libgdrapi.so.2")
        lib = ctypes.CDLL(path)
        lib.gdr_open.restype = ctypes.c_void_p
        lib.gdr_close.argtypes = [ctypes.c_void_p]
        lib.gdr_pin_buffer.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_size_t,
                                       ctypes.c_uint64, ctypes.c_uint32,
                                       ctypes.POINTER(ctypes.c_ulong)]
        lib.gdr_unpin_buffer.argtypes = [ctypes.c_void_p, ctypes.c_ulong]
        lib.gdr_map.argtypes = [ctypes.c_void_p, ctypes.c_ulong,
                                ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.gdr_unmap.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p,
                                  ctypes.c_size_t]
        lib.gdr_get_info_v2.argtypes = [ctypes.c_void_p, ctypes.c_ulong,
                                        ctypes.POINTER(_Gdr.Info)]
        lib.gdr_copy_to_mapping.argtypes = [ctypes.c_ulong, ctypes.c_void_p, ctypes.c_void_p,
                                            ctypes.c_size_t]
        self.lib = lib


def test_libgdrapi_pins_ucx_page_ranges_like_gdrcopy(cu):
    api = _Gdr().lib
    g = api.gdr_open()
    assert g, "gdr_open failed"
    ptrs = [int(cuda_ok(cu.cuMemAlloc(16))) for _ in range(4)]
    try:
        for i, p in enumerate(ptrs):
            htod(cu, p, bytes([0x30 + i]) * 16)
        target = ptrs[2]
        lo, hi = page_range(target, 16)
        mh = ctypes.c_ulong(0)
        assert api.gdr_pin_buffer(g, lo, hi - lo, 0, 0, ctypes.byref(mh)) == 0
        info = _Gdr.Info()
        assert api.gdr_get_info_v2(g, mh, ctypes.byref(info)) == 0
        assert info.va == lo and info.mapped_size == hi - lo
        bar = ctypes.c_void_p()
        assert api.gdr_map(g, mh, ctypes.byref(bar), hi - lo) == 0
        src = ctypes.create_string_buffer(b"\xee" * 16, 16)
        assert api.gdr_copy_to_mapping(mh, bar.value + (target - info.va), src, 16) == 0
        assert api.gdr_unmap(g, mh, bar, hi - lo) == 0
        assert api.gdr_unpin_buffer(g, mh) == 0
        for i, p in enumerate(ptrs):
            assert dtoh(cu, p, 16) == (b"\xee" * 16 if p == target else bytes([0x30 + i]) * 16)
    finally:
        api.gdr_close(g)
        for p in ptrs:
            cuda_ok(cu.cuMemFree(p))


# ---- issue 13: memory kinds -------------------------------------------------

class _Alloc:
    def __init__(self, cu, kind: str, n: int):
        self.cu, self.kind, self.n = cu, kind, n
        self.ptr = 0
        self._free = None
        self.stream = None
        self.pool = None
        getattr(self, "_" + kind)()

    def _vmm(self, handle_types, rdma):
        cu = self.cu
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = 0
        prop.requestedHandleTypes = handle_types
        prop.allocFlags.gpuDirectRDMACapable = rdma
        gran = int(cuda_ok(cu.cuMemGetAllocationGranularity(
            prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)))
        size = (self.n + gran - 1) // gran * gran
        h = cuda_ok(cu.cuMemCreate(size, prop, 0))
        ptr = int(cuda_ok(cu.cuMemAddressReserve(size, 0, 0, 0)))
        cuda_ok(cu.cuMemMap(ptr, size, 0, h, 0))
        acc = cu.CUmemAccessDesc()
        acc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        acc.location.id = 0
        acc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        cuda_ok(cu.cuMemSetAccess(ptr, size, [acc], 1))
        self.ptr = ptr

        def free():
            cuda_ok(cu.cuMemUnmap(ptr, size))
            cuda_ok(cu.cuMemRelease(h))
            cuda_ok(cu.cuMemAddressFree(ptr, size))
        self._free = free

    def _vmm_none_rdma(self):
        self._vmm(self.cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE, 1)

    def _vmm_none(self):
        self._vmm(self.cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE, 0)

    def _vmm_fd(self):
        self._vmm(self.cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1)

    def _pool(self, handle_types, rmm_like=False, offset=False):
        cu = self.cu
        self.stream = cuda_ok(cu.cuStreamCreate(0))
        extra = None
        if offset:   # an earlier allocation: ptr then sits at an offset in the chunk
            extra = int(cuda_ok(cu.cuMemAllocAsync(65536, self.stream)))
        if handle_types is None:
            ptr = int(cuda_ok(cu.cuMemAllocAsync(self.n, self.stream)))
        else:
            props = cu.CUmemPoolProps()
            props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
            props.handleTypes = handle_types
            props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            props.location.id = 0
            self.pool = cuda_ok(cu.cuMemPoolCreate(props))
            if rmm_like:
                # what RMM's cuda_async_memory_resource does after creating
                # its pool: release threshold = the device's total memory
                total = int(cuda_ok(cu.cuDeviceTotalMem(0)))
                cuda_ok(cu.cuMemPoolSetAttribute(
                    self.pool, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    cu.cuuint64_t(total)))
            ptr = int(cuda_ok(cu.cuMemAllocFromPoolAsync(self.n, self.pool, self.stream)))
        cuda_ok(cu.cuStreamSynchronize(self.stream))
        self.ptr = ptr

        def free():
            if extra is not None:
                cuda_ok(cu.cuMemFreeAsync(extra, self.stream))
            cuda_ok(cu.cuMemFreeAsync(ptr, self.stream))
            cuda_ok(cu.cuStreamSynchronize(self.stream))
        self._free = free

    def _pool_default(self):
        self._pool(None)

    def _pool_fd(self):
        self._pool(self.cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)

    def _pool_none(self):
        self._pool(self.cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE)

    def _pool_rmm_like(self):
        """The pool RMM's cuda_async_memory_resource creates with its defaults:
        pinned, device 0, no export handle type, release threshold raised."""
        self._pool(self.cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE, rmm_like=True)

    def _pool_default_offset(self):
        self._pool(None, offset=True)

    def _pitch(self):
        ptr, _pitch = cuda_ok(self.cu.cuMemAllocPitch(1000, max(1, self.n // 1000 + 1), 16))
        self.ptr = int(ptr)
        self._free = lambda: cuda_ok(self.cu.cuMemFree(self.ptr))

    def _managed(self):
        self.ptr = int(cuda_ok(self.cu.cuMemAllocManaged(
            self.n, self.cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value)))
        self._free = lambda: cuda_ok(self.cu.cuMemFree(self.ptr))

    def free(self):
        if self._free:
            f, self._free = self._free, None
            f()

    def close(self):
        self.free()
        if self.pool is not None:
            self.cu.cuMemPoolDestroy(self.pool)
        if self.stream is not None:
            self.cu.cuStreamDestroy(self.stream)


KINDS = ["pitch", "vmm_fd", "vmm_none_rdma", "vmm_none", "pool_default", "pool_default_offset",
         "pool_fd", "pool_none", "pool_rmm_like"]
# On nvrm every kind here pins (route V reads CUDA's own records, learned on
# scratch memory of its own; measured on the H100, docs/memory-kinds.md).
MUST_PIN = set(KINDS) if BACKEND == "nvrm" else {"pitch", "vmm_fd"}


@pytest.mark.parametrize("kind", KINDS)
def test_memory_kind_round_trips_or_is_refused_with_the_driver_reason(cu, gctx, kind):
    _kind_check(cu, gctx, kind)


def _kind_check(cu, gctx, kind: str) -> None:
    n = 1 << 20
    a = _Alloc(cu, kind, n)
    try:
        # the caller's bytes before the pin: pinning must not change them
        # (route V's proof is read-only)
        orig = np.random.default_rng(7 + len(kind)).integers(0, 256, n, dtype=np.uint8).tobytes()
        htod(cu, a.ptr, orig)
        try:
            pin = gctx.pin(a.ptr, size=n)
        except errors.GdrError as e:
            assert kind not in MUST_PIN, str(e)
            # refused: must say which kind it is, why, and what works instead
            assert e.code in (errno.ENOTSUP, errno.EINVAL), str(e)
            msg = str(e)
            assert "what works" in msg or "allocate with" in msg, msg
            assert any(w in msg for w in ("CUDA_ERROR", "NV_ERR", "exactly one",
                                          "identity check")), msg
            print(f"{kind}: refused: {msg}")
            return
        assert dtoh(cu, a.ptr, n) == orig, "pinning changed the caller's memory"
        rng = np.random.default_rng(len(kind))
        with pin, pin.map() as m:
            assert m.read(0, 4096) == orig[:4096] and m.read(n - 4096, 4096) == orig[-4096:]
            data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            m.write(0, data)
            assert dtoh(cu, a.ptr, n) == data
            back = rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
            htod(cu, a.ptr + 8192, back)
            assert m.read(8192, 4096) == back
            # both paths: copy engine (ce_write/ce_read) and put/get (picker)
            payload = rng.integers(0, 256, 65536, dtype=np.uint8).tobytes()
            pin.ce_write(4096, payload)
            assert dtoh(cu, a.ptr + 4096, 65536) == payload
            assert bytes(pin.ce_read(4096, 65536)) == payload
            payload = rng.integers(0, 256, 65536, dtype=np.uint8).tobytes()
            gdrpy.put(m, 4096, payload)
            assert dtoh(cu, a.ptr + 4096, 65536) == payload
            assert bytes(gdrpy.get(m, 4096, 65536)) == payload
            # freed by CUDA while mapped: the pin keeps the pages (persistent)
            before = m.read(0, 64)
            a.free()
            assert m.read(0, 64) == before
            m.write(0, b"\x5a" * 64)
            assert m.read(0, 64) == b"\x5a" * 64
        print(f"{kind}: pinned and round-tripped")
    finally:
        a.close()


@pytest.mark.parametrize("fd", [True, False], ids=["posix_fd", "no_handle_type"])
def test_pin_across_two_cumemcreate_chunks_in_one_va_range(cu, gctx, fd):
    cu_ = cu
    ht = (cu_.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR if fd
          else cu_.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE)
    prop = cu_.CUmemAllocationProp()
    prop.type = cu_.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu_.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    prop.requestedHandleTypes = ht
    prop.allocFlags.gpuDirectRDMACapable = 1
    c = int(cuda_ok(cu_.cuMemGetAllocationGranularity(
        prop, cu_.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)))
    va = int(cuda_ok(cu_.cuMemAddressReserve(2 * c, 0, 0, 0)))
    hs = [cuda_ok(cu_.cuMemCreate(c, prop, 0)) for _ in range(2)]
    try:
        for i, h in enumerate(hs):
            cuda_ok(cu_.cuMemMap(va + i * c, c, 0, h, 0))
        acc = cu_.CUmemAccessDesc()
        acc.location.type = cu_.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        acc.location.id = 0
        acc.flags = cu_.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        cuda_ok(cu_.cuMemSetAccess(va, 2 * c, [acc], 1))
        htod(cu, va + c - PAGE, b"\x01" * PAGE)   # one copy per chunk
        htod(cu, va + c, b"\x01" * PAGE)
        try:
            pin = gctx.pin(va + c - PAGE, size=2 * PAGE)
        except errors.GdrError as e:
            assert fd is False and BACKEND != "nvrm", str(e)   # nvrm: route V pins it
            assert "what works" in str(e), str(e)
            return
        data = bytes(range(256)) * 2
        with pin, pin.map() as m:
            m.write(PAGE - 256, data)   # 256 bytes on each side of the seam
            assert m.read(PAGE - 256, 512) == data
        assert dtoh(cu, va + c - 256, 256) == data[:256]
        assert dtoh(cu, va + c, 256) == data[256:]
    finally:
        for i in range(2):
            cu_.cuMemUnmap(va + i * c, c)
        for h in hs:
            cu_.cuMemRelease(h)
        cu_.cuMemAddressFree(va, 2 * c)


def test_managed_memory_is_refused_with_a_clear_message(cu, gctx):
    a = _Alloc(cu, "managed", 1 << 20)
    try:
        with pytest.raises(errors.GdrError) as ei:
            gctx.pin(a.ptr, size=1 << 20)
        assert ei.value.code == errno.ENOTSUP
        assert "managed" in str(ei.value)
    finally:
        a.close()


# ---- allocators of CuPy and PyTorch (each in a fresh process: the allocator
# ---- is chosen before the library touches the GPU) ---------------------------

_ALLOCATOR_SCRIPT = r"""
import os, sys
import numpy as np
import gdrpy
from gdrpy import errors
lib, mode = sys.argv[1], sys.argv[2]
n = 1 << 20
if lib == "torch":
    import torch
    t = torch.zeros(n, dtype=torch.uint8, device="cuda:0")
    obj, ptr = t, t.data_ptr()
    def device_bytes():
        torch.cuda.synchronize()
        return t.cpu().numpy().tobytes()
else:
    import cupy as cp
    if mode == "async":
        cp.cuda.set_allocator(cp.cuda.MemoryAsyncPool().malloc)
    a = cp.zeros(n, dtype=cp.uint8)
    obj, ptr = a, int(a.data.ptr)
    def device_bytes():
        cp.cuda.Device().synchronize()
        return cp.asnumpy(a).tobytes()
ctx = gdrpy.open(0, os.environ.get("GDRPY_GPU_BACKEND", "nvrm"))
try:
    pin = ctx.pin(obj)
except errors.GdrError as e:
    print("REFUSED", e)
    sys.exit(0)
data = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8).tobytes()
with pin, pin.map() as m:
    m.write(0, data)
    ok = device_bytes() == data
    ok = ok and m.read(4096, 64) == data[4096:4160]
print("PINNED", "round-trip ok" if ok else "WRONG DATA", hex(ptr))
sys.exit(0 if ok else 1)
"""

ALLOCATORS = [
    ("torch", "default", {}),
    ("torch", "expandable_segments", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    ("torch", "cudaMallocAsync", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
    ("cupy", "default", {}),
    ("cupy", "async", {}),
]


@pytest.mark.parametrize(("lib", "mode", "env"), ALLOCATORS,
                         ids=[f"{a}-{b}" for a, b, _ in ALLOCATORS])
def test_framework_allocator_memory_pins_or_is_refused_with_reason(lib, mode, env):
    import subprocess
    import sys
    pytest.importorskip(lib)
    e = dict(os.environ, **env)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    e["PYTHONPATH"] = root + os.pathsep + e.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", _ALLOCATOR_SCRIPT, lib, mode], env=e, check=False,
                       capture_output=True, text=True, timeout=240)
    out = (r.stdout + r.stderr).strip()
    print(f"{lib}/{mode}: {out.splitlines()[-1] if out else '(no output)'}")
    assert r.returncode == 0, out
    assert "PINNED round-trip ok" in out or "REFUSED" in out, out
    if "REFUSED" in out:
        assert "what works" in out or "allocate with" in out, out
    if BACKEND == "nvrm" or (lib, mode) in {("torch", "default"), ("cupy", "default")}:
        assert "PINNED round-trip ok" in out, out


# ---- RMM's cuda_async_memory_resource ------------------------------------------

_RMM_SCRIPT = r"""
import os, sys
import numpy as np
import gdrpy
import rmm
from gdrpy import errors
from gdrpy.memory import cuda_driver, primary_context
n = 1 << 20
mr = rmm.mr.CudaAsyncMemoryResource()
buf = rmm.DeviceBuffer(size=n, mr=mr)
ptr = int(buf.ptr)
cu = cuda_driver()
primary_context(0)
ctx = gdrpy.open(0, os.environ.get("GDRPY_GPU_BACKEND", "nvrm"))
try:
    pin = ctx.pin(ptr, size=n)
except errors.GdrError as e:
    print("REFUSED", e)
    sys.exit(0)
data = np.random.default_rng(3).integers(0, 256, n, dtype=np.uint8)
out = np.empty(n, np.uint8)
with pin, pin.map() as m:
    m.write(0, data.tobytes())
    cu.cuMemcpyDtoH(out.ctypes.data, ptr, n)
    ok = out.tobytes() == data.tobytes() and m.read(4096, 64) == data[4096:4160].tobytes()
print("PINNED", "round-trip ok" if ok else "WRONG DATA", hex(ptr), "rmm", rmm.__version__)
sys.exit(0 if ok else 1)
"""


def test_rmm_cuda_async_memory_resource_pins_or_is_refused_with_reason(cu, gctx):
    """RMM's default async resource; where RMM is not installed, the pool it
    would create (cuMemPoolCreate with its attributes) is checked instead."""
    import importlib.util
    import subprocess
    import sys
    if importlib.util.find_spec("rmm") is None:
        print("RMM is NOT installed on this machine: checking the pool its "
              "cuda_async_memory_resource creates (cuMemPoolCreate: pinned, device 0, "
              "no handle type, release threshold = total memory) instead")
        _kind_check(cu, gctx, "pool_rmm_like")
        return
    e = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    e["PYTHONPATH"] = root + os.pathsep + e.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", _RMM_SCRIPT], env=e, check=False,
                       capture_output=True, text=True, timeout=240)
    out = (r.stdout + r.stderr).strip()
    print(f"rmm/cuda_async: {out.splitlines()[-1] if out else '(no output)'}")
    assert r.returncode == 0, out
    assert "PINNED round-trip ok" in out or "REFUSED" in out, out
    if "REFUSED" in out:
        assert "what works" in out, out
    if BACKEND == "nvrm":
        assert "PINNED round-trip ok" in out, out
