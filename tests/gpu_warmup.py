"""A warm-up that leaves a process the way a long-lived GPU application (or a
pytest run of many GPU tests) does: many allocations and frees of every kind
(cuMemAlloc, cuMemCreate with and without a handle type, the default pool,
created pools with and without POSIX_FD, CuPy's MemoryAsyncPool and PyTorch
where installed), pins of some of them through gdrpy, pools destroyed and pools
left alive with many chunks.  Used by tests/test_gpu_pools_busy.py.  Every
CUDA call is checked; a section that fails prints why and the rest goes on."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any


def ok(res: Any) -> Any:
    err = res[0] if isinstance(res, tuple) else res
    if int(err) != 0:
        raise RuntimeError(f"CUDA call failed: {err}")
    if isinstance(res, tuple):
        return res[1] if len(res) == 2 else res[1:]
    return None


SIZES = [4096, 65536, 1 << 20, 3 << 20, 17 << 20, 40 << 20]


class Warmup:
    def __init__(self, cu: Any, gdrpy_mod: Any, seed: int = 1) -> None:
        self.cu, self.g = cu, gdrpy_mod
        self.rng = random.Random(seed)
        self.live: dict[str, list[tuple[int, int]]] = {
            k: [] for k in ("mem", "default", "pool_fd", "pool_none", "vmm", "cupy", "torch")}
        self.vmm: list[tuple[int, int, Any]] = []
        self.pools: list[tuple[Any, str, list[int]]] = []
        self.keep: list[Any] = []   # framework arrays kept alive
        self.n: Counter[str] = Counter()
        self.errors: list[str] = []
        self.pin_failures: list[str] = []
        self.stream = ok(cu.cuStreamCreate(0))
        self._threshold: int | None = None

    # ---- sections ----------------------------------------------------------
    def run(self, rounds: int = 3) -> None:
        for r in range(rounds):
            self._section("cuMemAlloc", self._mem)
            self._section("vmm", self._vmm)
            self._section("default pool", lambda r=r: self._default(raise_threshold=r > 0))
            self._section("pools", self._pools)
            self._section("gdrpy pins", self._pins)
        self._section("cupy", self._cupy)
        self._section("torch", self._torch)

    def _section(self, name: str, f: Callable[[], None]) -> None:
        try:
            f()
        except Exception as e:
            self.errors.append(f"{name}: {type(e).__name__}: {e}")
            print(f"WARMUP {name} failed: {type(e).__name__}: {e}", flush=True)

    def _mem(self) -> None:
        cu = self.cu
        got = []
        for _ in range(150):
            n = self.rng.choice(SIZES[:5])
            got.append((int(ok(cu.cuMemAlloc(n))), n))
            self.n["cuMemAlloc"] += 1
        self.rng.shuffle(got)
        for p, _n in got[:100]:
            ok(cu.cuMemFree(p))
        self.live["mem"] += got[100:]

    def _vmm(self) -> None:
        cu = self.cu
        for i in range(8):
            prop = cu.CUmemAllocationProp()
            prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
            prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            prop.location.id = 0
            prop.requestedHandleTypes = (
                cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR if i % 2
                else cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE)
            prop.allocFlags.gpuDirectRDMACapable = 1 if i % 3 else 0
            g = int(ok(cu.cuMemGetAllocationGranularity(
                prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)))
            size = g * (1 + i % 3)
            h = ok(cu.cuMemCreate(size, prop, 0))
            va = int(ok(cu.cuMemAddressReserve(size, 0, 0, 0)))
            ok(cu.cuMemMap(va, size, 0, h, 0))
            acc = cu.CUmemAccessDesc()
            acc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            acc.location.id = 0
            acc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            ok(cu.cuMemSetAccess(va, size, [acc], 1))
            self.n["cuMemCreate"] += 1
            if i % 4 in (1, 2):   # kept alive: one with POSIX_FD, one without
                self.vmm.append((va, size, h))
                self.live["vmm"].append((va, size))
            else:
                self._vmm_free(va, size, h)

    def _vmm_free(self, va: int, size: int, h: Any) -> None:
        ok(self.cu.cuMemUnmap(va, size))
        ok(self.cu.cuMemRelease(h))
        ok(self.cu.cuMemAddressFree(va, size))

    def _default(self, raise_threshold: bool) -> None:
        cu = self.cu
        if raise_threshold and self._threshold is None:
            # what PyTorch's cudaMallocAsync backend and RMM do: freed chunks stay
            pool = ok(cu.cuDeviceGetDefaultMemPool(0))
            attr = cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
            v = ok(cu.cuMemPoolGetAttribute(pool, attr))
            self._threshold = int(getattr(v, "value", v))
            ok(cu.cuMemPoolSetAttribute(pool, attr, cu.cuuint64_t(8 << 30)))
        got = []
        for _ in range(80):
            n = self.rng.choice(SIZES)
            got.append((int(ok(cu.cuMemAllocAsync(n, self.stream))), n))
            self.n["cuMemAllocAsync"] += 1
        ok(cu.cuStreamSynchronize(self.stream))
        self.rng.shuffle(got)
        for p, _n in got[:50]:
            ok(cu.cuMemFreeAsync(p, self.stream))
        ok(cu.cuStreamSynchronize(self.stream))
        self.live["default"] += got[50:]

    def _pools(self) -> None:
        cu = self.cu
        for kind in ("pool_fd", "pool_none", "pool_fd", "pool_none"):
            props = cu.CUmemPoolProps()
            props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
            props.handleTypes = (
                cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                if kind == "pool_fd" else cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE)
            props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            props.location.id = 0
            pool = ok(cu.cuMemPoolCreate(props))
            self.n["cuMemPoolCreate"] += 1
            got = []
            for _ in range(25):
                n = self.rng.choice(SIZES)
                got.append((int(ok(cu.cuMemAllocFromPoolAsync(n, pool, self.stream))), n))
            ok(cu.cuStreamSynchronize(self.stream))
            self.n["cuMemAllocFromPoolAsync"] += len(got)
            if self.rng.random() < 0.5:   # destroyed again
                for p, _n in got:
                    ok(cu.cuMemFreeAsync(p, self.stream))
                ok(cu.cuStreamSynchronize(self.stream))
                ok(cu.cuMemPoolDestroy(pool))
                self.n["pools destroyed"] += 1
                continue
            self.rng.shuffle(got)
            for p, _n in got[:10]:
                ok(cu.cuMemFreeAsync(p, self.stream))
            ok(cu.cuStreamSynchronize(self.stream))
            self.pools.append((pool, kind, [p for p, _n in got[10:]]))
            self.live[kind] += got[10:]

    def _pins(self) -> None:
        from gdrpy import errors
        ctx = self.g.open(0, "nvrm")
        try:
            for kind in ("mem", "vmm"):
                for p, n in self.live[kind][-4:]:
                    try:
                        with ctx.pin(p, size=min(n, 1 << 20)) as pin, pin.map() as m:
                            m.read(0, 64)
                    except errors.GdrError as e:   # reported, the warm-up goes on
                        self.pin_failures.append(f"{kind} 0x{p:x}+{n}: {e}")
                        print(f"WARMUP pin failed: {kind} 0x{p:x}+{n}: {str(e)[:400]}",
                              flush=True)
                        continue
                    self.n["gdrpy pins"] += 1
        finally:
            ctx.close()

    def _cupy(self) -> None:
        try:
            import cupy as cp
        except ImportError:
            return
        pool = cp.cuda.MemoryAsyncPool()
        for _ in range(40):
            n = self.rng.choice(SIZES[:5])
            a = pool.malloc(n)
            self.n["cupy MemoryAsyncPool"] += 1
            if self.rng.random() < 0.5:
                self.keep.append(a)
                self.live["cupy"].append((int(a.ptr), n))
        cp.cuda.Device().synchronize()

    def _torch(self) -> None:
        try:
            import torch
        except ImportError:
            return
        for _ in range(40):
            n = self.rng.choice(SIZES[:5])
            t = torch.empty(n, dtype=torch.uint8, device="cuda:0")
            self.n["torch tensors"] += 1
            if self.rng.random() < 0.5:
                self.keep.append(t)
                self.live["torch"].append((t.data_ptr(), n))
        torch.cuda.synchronize()
        self.n["torch backend " + str(torch.cuda.get_allocator_backend())] += 1

    # ---- results -----------------------------------------------------------
    def pick(self, kind: str) -> tuple[int, int] | None:
        """A live allocation of `kind` (at least 64 KiB), or None."""
        c = [x for x in self.live.get(kind, []) if x[1] >= 65536]
        return self.rng.choice(c) if c else None

    def summary(self) -> str:
        s = ", ".join(f"{k} {v}" for k, v in sorted(self.n.items()))
        return s + (f"; {len(self.errors)} sections failed" if self.errors else "")

    def close(self) -> None:
        cu = self.cu
        self.keep.clear()
        for p, _n in self.live["mem"]:
            cu.cuMemFree(p)
        for va, size, h in self.vmm:
            self._vmm_free(va, size, h)
        for p, _n in self.live["default"]:
            cu.cuMemFreeAsync(p, self.stream)
        for pool, _k, ptrs in self.pools:
            for p in ptrs:
                cu.cuMemFreeAsync(p, self.stream)
            cu.cuStreamSynchronize(self.stream)
            cu.cuMemPoolDestroy(pool)
        cu.cuStreamSynchronize(self.stream)
        if self._threshold is not None:
            pool = ok(cu.cuDeviceGetDefaultMemPool(0))
            cu.cuMemPoolSetAttribute(pool, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                     cu.cuuint64_t(self._threshold))
        cu.cuStreamDestroy(self.stream)
        for k in self.live:
            self.live[k] = []
        self.vmm, self.pools = [], []
