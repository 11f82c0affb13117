"""GPU-only tests of the nvrm backend (marked gpu: skipped only where no GPU
exists).  Data is verified with cuda-python's own cuMemcpyDtoH / HtoD, never
with gdrpy's copy-engine path, so a wrong mapping cannot vouch for itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

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
    assert c.backend == BACKEND and not c.is_sim
    yield c
    c.close()


def dtoh(cu, dptr, n):
    out = np.empty(n, np.uint8)
    cuda_ok(cu.cuMemcpyDtoH(out.ctypes.data, dptr, n))
    return out.tobytes()


def htod(cu, dptr, data):
    """cuMemcpyHtoD, then wait: from pageable memory the call may return
    once the source is staged, before the DMA lands (a read through the
    mapping right after could see old bytes)."""
    a = np.frombuffer(data, np.uint8)
    cuda_ok(cu.cuMemcpyHtoD(dptr, a.ctypes.data, len(data)))
    cuda_ok(cu.cuCtxSynchronize())


class CuMemAlloc:
    def __init__(self, cu, n):
        self.cu = cu
        self.ptr = int(cuda_ok(cu.cuMemAlloc(n)))
        self.size = n

    def close(self):
        if self.ptr:
            cuda_ok(self.cu.cuMemFree(self.ptr))
            self.ptr = 0


def _alloc(kind, cu, n):
    """(device pointer, owner-object to pin, closer) for each memory source."""
    if kind == "cuMemAlloc":
        a = CuMemAlloc(cu, n)
        return a.ptr, None, a.close
    if kind == "cuMemCreate":
        b = gdrpy.memory.alloc(n, device=0)
        return b.ptr, b, b.close
    if kind == "cupy":
        cp = pytest.importorskip("cupy")
        arr = cp.zeros(n, dtype=cp.uint8)
        return int(arr.data.ptr), arr, lambda: None
    if kind == "torch":
        torch = pytest.importorskip("torch")
        t = torch.zeros(n, dtype=torch.uint8, device="cuda:0")
        return int(t.data_ptr()), t, lambda: None
    raise AssertionError(kind)


KINDS = ["cuMemAlloc", "cuMemCreate", "cupy", "torch"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("size", [1, 7, 64, 4099, PAGE + 3, 1 << 20, 64 << 20])
def test_mapping_writes_and_reads_agree_with_cumemcpy(cu, gctx, kind, size):
    ptr, owner, close = _alloc(kind, cu, size + 4096)
    try:
        rng = np.random.default_rng(size)
        for off in ((0, 1, 13, 4095) if size <= PAGE else (0, 3)):
            data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            pin = gctx.pin(owner, size + 4096) if owner is not None else \
                gctx.pin(ptr, size=size + 4096)
            with pin, pin.map() as m:
                m.write(off, data)
                assert dtoh(cu, ptr + off, size) == data, (kind, size, off)
                back = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
                htod(cu, ptr + off, back)
                assert m.read(off, size) == back, (kind, size, off)
    finally:
        close()


@pytest.mark.parametrize("kind", ["cuMemAlloc", "cuMemCreate"])
def test_sub_range_pin_maps_only_its_pages(cu, gctx, kind):
    ptr, owner, close = _alloc(kind, cu, 8 * PAGE)
    try:
        htod(cu, ptr, b"\x33" * (8 * PAGE))
        start = ptr + 2 * PAGE + 100
        with gctx.pin(start, size=5000) as pin:
            assert pin.va >= ptr and pin.va + pin.mapped_size <= ptr + 8 * PAGE
            # page granularity: no more than the GPU pages the request touches
            assert pin.va >= start & ~(PAGE - 1)
            assert pin.va + pin.mapped_size <= (start + 5000 + PAGE - 1) & ~(PAGE - 1)
            with pin.map() as m:
                assert len(m) == 5000
                m.write(0, b"\x77" * 5000)
                whole = dtoh(cu, ptr, 8 * PAGE)
                assert whole[2 * PAGE + 100: 2 * PAGE + 5100] == b"\x77" * 5000
                assert whole[:2 * PAGE + 100] == b"\x33" * (2 * PAGE + 100)
                assert whole[2 * PAGE + 5100:] == b"\x33" * (6 * PAGE - 5100)
    finally:
        close()


def test_small_cumemalloc_pin_maps_its_gpu_pages_and_writes_stay_in_range(cu, gctx):
    """cuMemAlloc packs small allocations into one RM object (chunk).  A pin
    maps the 64 KiB GPU pages around its range, as GDRCopy does (neighbours
    of the same chunk share them), but copies are bounded by the pinned
    range: the neighbours are never written."""
    allocs = [CuMemAlloc(cu, 4096) for _ in range(4)]
    try:
        for a in allocs:
            htod(cu, a.ptr, b"\x44" * 4096)
        target = allocs[1]
        with gctx.pin(target.ptr, size=4096) as pin, pin.map() as m:
            assert len(m) == 4096
            assert pin.va == target.ptr & ~(PAGE - 1)
            assert pin.va + pin.mapped_size >= target.ptr + 4096
            m.write(0, b"\x99" * 4096)
            with pytest.raises(errors.OutOfRangeError):
                m.write(4096, b"\x99")
        for a in allocs:
            expect = b"\x99" * 4096 if a is target else b"\x44" * 4096
            assert dtoh(cu, a.ptr, 4096) == expect
    finally:
        for a in allocs:
            a.close()


def test_cumemfree_while_pinned_keeps_old_pages_and_never_aliases(cu, gctx):
    a = CuMemAlloc(cu, 1 << 20)
    old_ptr = a.ptr
    htod(cu, a.ptr, b"\x01" * (1 << 20))
    pin = gctx.pin(a.ptr, size=1 << 20)
    m = pin.map()
    a.close()  # freed by CUDA while pinned and mapped
    assert m.read(0, 8) == b"\x01" * 8
    b = CuMemAlloc(cu, 1 << 20)
    try:
        htod(cu, b.ptr, b"\x02" * (1 << 20))
        m.write(0, b"\x03" * 64)
        assert dtoh(cu, b.ptr, 64) == b"\x02" * 64, \
            f"old mapping aliases the new allocation (old {old_ptr:#x}, new {b.ptr:#x})"
        assert m.read(0, 64) == b"\x03" * 64
    finally:
        m.close()
        pin.close()
        b.close()


def _fd_count():
    return len(os.listdir("/proc/self/fd"))


def test_ten_thousand_cycles_leak_no_fds_and_no_rm_objects(cu, gctx):
    buf = gdrpy.memory.alloc(PAGE, device=0)
    small = CuMemAlloc(cu, PAGE)
    try:
        for target in (buf, small):
            with gctx.pin(target.ptr, size=PAGE) as p, p.map():
                pass  # warm up: lazily opened fds exist before counting
            fds0 = _fd_count()
            objs0 = gctx.live_objects()
            for i in range(5000):
                p = gctx.pin(target.ptr, size=PAGE)
                m = p.map()
                if i % 1000 == 0:
                    m.write(0, i.to_bytes(4, "little"))
                    assert dtoh(cu, target.ptr, 4) == i.to_bytes(4, "little")
                m.close()
                p.close()
            assert _fd_count() == fds0
            assert gctx.live_objects() == objs0
    finally:
        buf.close()
        small.close()


def test_managed_memory_is_refused_clearly(cu, gctx):
    ptr = int(cuda_ok(cu.cuMemAllocManaged(PAGE, 1)))
    try:
        with pytest.raises(errors.GdrError) as ei:
            gctx.pin(ptr, size=PAGE)
        assert "managed" in str(ei.value).lower()
    finally:
        cuda_ok(cu.cuMemFree(ptr))


def test_pinned_host_memory_is_refused_clearly(cu, gctx):
    ptr = int(cuda_ok(cu.cuMemHostAlloc(PAGE, 0)))
    try:
        with pytest.raises(errors.GdrError) as ei:
            gctx.pin(ptr, size=PAGE)
        assert "host" in str(ei.value).lower()
    finally:
        cuda_ok(cu.cuMemFreeHost(ptr))


def test_pageable_host_pointer_is_refused(gctx):
    host = np.zeros(PAGE, np.uint8)
    with pytest.raises(errors.GdrError):
        gctx.pin(host.ctypes.data, size=PAGE)


def test_wrong_device_index_is_a_clear_error(cu):
    n = int(cuda_ok(cu.cuDeviceGetCount()))
    with pytest.raises(errors.DeviceNotFoundError) as ei:
        gdrpy.open(n, BACKEND)
    assert str(n) in str(ei.value)


def test_device_index_selects_the_matching_gpu(cu, gctx):
    dev = cuda_ok(cu.cuDeviceGet(0))
    bus = cuda_ok(cu.cuDevicePciBusId(32, dev)) if hasattr(cu, "cuDevicePciBusId") else \
        cuda_ok(cu.cuDeviceGetPCIBusId(32, dev))
    bus = bus.split(b"\0", 1)[0].decode().lower()
    assert gctx.info["pci_bus_id"].lower() == bus


def test_auto_picks_a_real_backend_on_a_gpu_machine():
    with gdrpy.open(0, "auto") as c:
        assert c.backend != "sim"


def test_mapping_is_write_combined(gctx):
    b = gdrpy.memory.alloc(PAGE, device=0)
    try:
        with gctx.pin(b) as p, p.map() as m:
            assert m.mapping_type == "wc"
    finally:
        b.close()


_HOLDER = textwrap.dedent("""
    import os, sys, time, gdrpy
    from gdrpy.memory import cuda_driver, primary_context
    cu = cuda_driver(); primary_context(0)
    n = int(sys.argv[1])
    ctx = gdrpy.open(0, sys.argv[2])
    bufs, maps = [], []
    for i in range(4):
        b = gdrpy.memory.alloc(n // 4, device=0)
        p = ctx.pin(b); m = p.map(); m.write(0, b"held")
        bufs.append(b); maps.append((p, m))
    print("READY", flush=True)
    time.sleep(600)
""")


def test_killed_process_leaves_gpu_memory_reclaimable(cu):
    free0, total = (int(x) for x in cuda_ok(cu.cuMemGetInfo()))
    n = (free0 // 2) & ~((2 << 20) - 1)
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(n), BACKEND],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "READY", line
        free1 = int(cuda_ok(cu.cuMemGetInfo())[0])
        assert free1 < free0 - n // 2  # the child really holds the memory
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    import time
    deadline = time.time() + 30
    while time.time() < deadline:
        free2 = int(cuda_ok(cu.cuMemGetInfo())[0])
        if free2 >= free0 - (64 << 20):
            break
        time.sleep(0.2)
    assert free2 >= free0 - (64 << 20), (free0, free2)
    big = CuMemAlloc(cu, n)  # and the next process can take it all
    big.close()


_RECEIVER = textwrap.dedent("""
    import array, mmap, os, socket, sys
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(sys.argv[1])
    msg, anc, flags, addr = s.recvmsg(64, socket.CMSG_LEN(64 * 4))
    fds = array.array("i")
    for level, typ, data in anc:
        fds.frombytes(data[: len(data) - len(data) % 4])
    leaked = 0
    for fd in fds:
        for length in (4096, 65536):
            try:
                mm = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ)
            except OSError:
                continue
            if b"parent-secret" in mm[:4096]:
                leaked += 1
            mm.close()
    print("LEAKED" if leaked else "SAFE", len(fds), flush=True)
""")


def test_fds_passed_over_a_unix_socket_do_not_expose_memory(tmp_path, gctx):
    import socket
    b = gdrpy.memory.alloc(PAGE, device=0)
    path = str(tmp_path / "sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    try:
        with gctx.pin(b) as p, p.map() as m:
            m.write(0, b"parent-secret")
            proc = subprocess.Popen([sys.executable, "-c", _RECEIVER, path],
                                    stdout=subprocess.PIPE, text=True)
            conn, _ = srv.accept()
            fds = [int(f) for f in os.listdir("/proc/self/fd")
                   if os.path.realpath(f"/proc/self/fd/{f}").startswith("/dev/nvidia")]
            import array
            conn.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                   array.array("i", fds).tobytes())])
            out, _ = proc.communicate(timeout=60)
            conn.close()
            assert out.startswith("SAFE"), out
    finally:
        srv.close()
        b.close()


@pytest.mark.parametrize("lib", ["torch", "cupy"])
def test_dlpack_and_cai_exports_alias_our_memory(cu, gctx, lib):
    mod = pytest.importorskip(lib)
    b = gdrpy.memory.alloc(4096, device=0)
    try:
        with gctx.pin(b) as p, p.map() as m:
            m.write(0, b"\x01\x02\x03\x04")
            if lib == "torch":
                t = mod.from_dlpack(b)
                assert t.device.type == "cuda" and t.dtype == mod.uint8 and t.numel() == 4096
                assert t[:4].cpu().tolist() == [1, 2, 3, 4]
                t[4] = 9
                mod.cuda.synchronize()
                t2 = mod.as_tensor(b, device="cuda")  # __cuda_array_interface__
                assert int(t2[4].item()) == 9
                del t, t2
            else:
                a = mod.from_dlpack(b)
                assert a[:4].get().tolist() == [1, 2, 3, 4]
                a[4] = 9
                mod.cuda.Device(0).synchronize()
                assert int(mod.asarray(b)[4].get()) == 9
                del a
            assert m.read(4, 1) == b"\x09"
    finally:
        import gc
        gc.collect()
        b.close()


def _device_count(cu):
    return int(cuda_ok(cu.cuDeviceGetCount()))


def test_each_device_index_maps_its_own_gpu(cu):
    """Multi-GPU: the context of device d maps memory of device d (through
    its own /dev/nvidiaN), verified with cuMemcpyDtoH in d's context; memory
    of another device is refused with a clear error.  Needs >= 2 GPUs."""
    from gdrpy.memory import primary_context
    n = _device_count(cu)
    if n < 2:
        pytest.skip(f"needs two GPUs, this machine has {n}")
    bufs = [gdrpy.memory.alloc(PAGE, device=d) for d in range(n)]
    try:
        for d in range(n):
            dev = cuda_ok(cu.cuDeviceGet(d))
            bus = cuda_ok(cu.cuDeviceGetPCIBusId(32, dev)).split(b"\0", 1)[0].decode().lower()
            with gdrpy.open(d, BACKEND) as c:
                assert c.info["pci_bus_id"].lower() == bus
                with c.pin(bufs[d]) as p, p.map() as m:
                    m.write(0, f"device {d}".encode())
                    primary_context(d)
                    assert dtoh(cu, bufs[d].ptr, 8) == f"device {d}".encode()[:8]
                other = bufs[(d + 1) % n]
                with pytest.raises(errors.DeviceNotFoundError) as ei:
                    c.pin(other)
                assert str((d + 1) % n) in str(ei.value)
    finally:
        for b in bufs:
            b.close()
        primary_context(0)


def test_dmabuf_probe_is_honest(cu):
    """'available' must mean a mapping works: the probe tries a real dma-buf
    mmap (the H100 with driver 580 exports dma-bufs but refuses the mmap)."""
    ok, why = gdrpy.probe("dmabuf", 0)
    if not ok:
        assert why and ("dma-buf" in why or "dmabuf" in why), why
        with pytest.raises(errors.GdrError):
            gdrpy.open(0, "dmabuf")
        return
    b = CuMemAlloc(cu, PAGE)
    try:
        with gdrpy.open(0, "dmabuf") as c, c.pin(b.ptr, size=PAGE) as p, p.map() as m:
            m.write(0, b"dma-buf!")
            assert dtoh(cu, b.ptr, 8) == b"dma-buf!"
    finally:
        b.close()
