"""Issue 44 on the GPU, through the Python API (the libgdrapi side runs in
native/tests/test_gdrapi.c, which tests/test_native.py runs on the GPU):

* cuMemAlloc(4 GiB + 2): CUDA's memory object behind it ends at +4 GiB + 4 KiB,
  inside the last 64 KiB GPU page.  Pinned by its exact size, by the 64 KiB-
  rounded size (UCX) and by libfabric's rule [addr & ~64K, (end & ~64K) + 64K):
  the pin covers the whole GPU pages, the last owned bytes are written and read
  back (checked with cuda-python's own cuMemcpy), and past the object's end
  validated copies raise OutOfRangeError (ERANGE) and a raw load faults (in a
  forked child, whose placeholders keep the tail without access).
* Pin flag FORCE_PCIE: NotSupportedError with GDRCopy's ENOTSUPP (524) on a GPU
  without a coherent CPU-GPU link, accepted on one.
* Copy-engine reads without a stream (Pin.ce_read, each method; Transfer.get;
  libgdrapi's gdr_copy_from_mapping) return while a kernel still spins on the
  legacy default stream; a read on that stream, asked for, waits for it."""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import threading

import numpy as np
import pytest
from conftest import child_status, cuda_ok

import gdrpy
from gdrpy import errors

pytestmark = pytest.mark.gpu

BACKEND = os.environ.get("GDRPY_GPU_BACKEND", "nvrm")
PAGE = 65536
N = (4 << 30) + 2
OBJ = (N + 4095) & ~4095        # measured on an H200 (driver 580): the RM object's end


@pytest.fixture(scope="module")
def big(cu):
    ptr = int(cuda_ok(cu.cuMemAlloc(N)))
    assert ptr % PAGE == 0
    yield ptr
    cuda_ok(cu.cuMemFree(ptr))


@pytest.fixture
def gctx():
    c = gdrpy.open(0, BACKEND)
    yield c
    c.close()


@pytest.mark.parametrize("how", ["exact", "ucx", "libfabric"])
def test_4g_plus_2_pins_whole_pages_and_the_tail_stays_unreachable(cu, big, gctx, how):
    end = big + N
    lo, hi = {"exact": (big, end), "ucx": (big, (end + PAGE - 1) & ~(PAGE - 1)),
              "libfabric": (big & ~(PAGE - 1), (end & ~(PAGE - 1)) + PAGE)}[how]
    whole = ((hi + PAGE - 1) & ~(PAGE - 1)) - lo
    last = np.frombuffer(os.urandom(16), np.uint8)
    cuda_ok(cu.cuMemcpyHtoD(end - 16, last.ctypes.data, 16))
    cuda_ok(cu.cuCtxSynchronize())
    with gctx.pin(lo, size=hi - lo) as pin, pin.map() as m:
        assert (pin.va, pin.mapped_size, pin.backed_size) == (lo, whole, OBJ), \
            (hex(pin.va), pin.mapped_size, pin.backed_size)
        assert len(m) == min(hi - lo, OBJ)
        assert m.read(N - 16, 16) == last.tobytes()
        m.write(N - 8, b"tail-ok!")
        got = np.zeros(8, np.uint8)
        cuda_ok(cu.cuMemcpyDtoH(got.ctypes.data, end - 8, 8))
        assert got.tobytes() == b"tail-ok!"
        with pytest.raises(errors.OutOfRangeError):
            m.write(OBJ - 4, b"\0" * 8)
        if hi - lo > OBJ:
            with pytest.raises(errors.OutOfRangeError) as ei:
                pin.ce_read(OBJ, 8)
            assert ei.value.code == errno.ERANGE
        base = m.map_ptr
        assert child_status(lambda: ctypes.string_at(base + OBJ - 1, 1)) == 0
        st = child_status(lambda: ctypes.string_at(base + OBJ, 1))
        assert os.WIFSIGNALED(st) and os.WTERMSIG(st) in (signal.SIGSEGV, signal.SIGBUS), st


def test_force_pcie_follows_the_gpus_coherence(cu, gctx):
    attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES
    coherent = int(cuda_ok(cu.cuDeviceGetAttribute(attr, 0)))
    ptr = int(cuda_ok(cu.cuMemAlloc(PAGE)))
    try:
        if coherent:
            with gctx.pin(ptr, size=PAGE, flags=1) as pin:
                assert pin.size == PAGE
        else:
            with pytest.raises(errors.NotSupportedError) as ei:
                gctx.pin(ptr, size=PAGE, flags=1)
            assert (ei.value.code, ei.value.code_name) == (524, "ENOTSUPP")
    finally:
        cuda_ok(cu.cuMemFree(ptr))


def test_reads_without_a_stream_never_wait_for_a_running_kernel(cu, gctx):
    import gpu_pin_nowait as nw
    n = 4 << 20
    ptr = int(cuda_ok(cu.cuMemAlloc(n)))
    data = np.frombuffer(os.urandom(n), np.uint8)
    cuda_ok(cu.cuMemcpyHtoD(ptr, data.ctypes.data, n))
    cuda_ok(cu.cuCtxSynchronize())
    host = gdrpy.memory.host_alloc(n, ctx=gctx)
    lib = nw._gdrapi()
    lib.gdr_copy_from_mapping.argtypes = [ctypes.c_ulong, ctypes.c_void_p, ctypes.c_void_p,
                                          ctypes.c_size_t]
    g = lib.gdr_open()
    mh, gmap = ctypes.c_ulong(0), ctypes.c_void_p()
    assert lib.gdr_pin_buffer(g, ptr, n, 0, 0, ctypes.byref(mh)) == 0
    assert lib.gdr_map(g, mh.value, ctypes.byref(gmap), n) == 0
    pin = gctx.pin(ptr, size=n)
    m = pin.map()
    t = m.transfer()
    reads = {
        "ce_read direct": lambda: pin.ce_read(0, n),
        "ce_read staged": lambda: pin.ce_read(0, n, method="staged"),
        "ce_read locked": lambda: pin.ce_read(0, n, out=host, method="locked"),
        "Transfer.get": lambda: t.get(0, n),
    }
    for fn in reads.values():       # the first of each builds what it needs
        fn()
    spin = nw.Spinner("legacy")
    try:
        for what, fn in reads.items():
            out = fn()
            assert bytes(out) == data.tobytes(), what
            assert spin.running(), f"{what} waited for the kernel"
        out = np.zeros(n, np.uint8)
        for size in (64 << 10, n):      # the first one measures the crossover
            assert lib.gdr_copy_from_mapping(mh.value, out.ctypes.data, gmap, size) == 0
            assert out[:size].tobytes() == data[:size].tobytes()
            assert spin.running(), f"gdr_copy_from_mapping of {size} B waited for the kernel"
        # asked for: a read on the legacy stream is ordered after the kernel
        th = threading.Thread(target=lambda: pin.ce_read(0, 4096, stream=1))
        th.start()
        th.join(0.3)
        assert th.is_alive(), "a read on the legacy stream did not wait for its kernel"
        spin.stop()
        th.join(10)
        assert not th.is_alive()
    finally:
        if spin.running():
            spin.stop()
        spin.close()
        m.close()
        pin.close()
        lib.gdr_unmap(g, mh.value, gmap, n)
        lib.gdr_unpin_buffer(g, mh.value)
        lib.gdr_close(g)
        host.close()
        cuda_ok(cu.cuMemFree(ptr))
