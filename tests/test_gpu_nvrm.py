"""GPU tests of the nvrm backend's ABI tables, self-test and read-only route C
identity check (marked gpu: skipped only where no GPU exists; with
GDRPY_REQUIRE_GPU=1 nothing here may skip).

* the self-test passes on this driver with the table of its branch, and its
  cost is reported (``python -m gdrpy info`` in a fresh process);
* GDRPY_NVRM_TEST_CORRUPT_ABI=1/2 (a wrong table entry / a wrong offset) make
  the backend unavailable with a clear reason instead of misbehaving;
* a CUDA kernel keeps incrementing counters in a buffer while the host pins
  that buffer (route C, cuMemAlloc memory) over and over: afterwards every
  counter equals the kernel's own iteration count, so no kernel write was lost
  (the former save/write/restore identity check would lose some).

Data is read with cuda-python's cuMemcpyDtoH, never through gdrpy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import cuda_ok

import gdrpy

pytestmark = pytest.mark.gpu

BRANCHES = ("535", "550", "560", "565", "570", "575", "580", "590", "595")
REQUIRE_GPU = os.environ.get("GDRPY_REQUIRE_GPU") == "1"


def _expected_branch(driver: str) -> str:
    major = int(driver.split(".")[0])
    older = [b for b in BRANCHES if int(b) <= major]
    return older[-1] if older else ""


def _run_py(code: str, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("GDRPY_NVRM_")}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=e, timeout=300)


def test_selftest_passes_with_the_branch_table_and_reports_its_cost():
    st = gdrpy.nvrm_selftest(0)
    print(json.dumps(st, indent=1))
    assert st is not None, "the self-test did not run: " + str(gdrpy.probe("nvrm", 0))
    assert st["usable"], st["reason"]
    for r in ("A", "C"):
        assert st["routes"][r]["tested"] and st["routes"][r]["ok"], (r, st["routes"][r])
    assert st["table"]["branch"] == _expected_branch(st["driver"]), st["table"]
    assert st["table"]["tag"].startswith(st["table"]["branch"] + ".")
    assert st["selftest_ms"] > 0
    lay = st["routes"]["C"]["ipc_layout"]
    assert lay["offset_proven"], lay   # two scratch allocations, one at a non-zero offset


def test_info_in_a_fresh_process_shows_routes_table_and_cost():
    r = subprocess.run([sys.executable, "-m", "gdrpy", "info", "--json"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    st = json.loads(r.stdout)["nvrm_selftest"]
    assert st and st["usable"], st
    print(f"self-test in a fresh process: {st['selftest_ms']:.2f} ms (driver {st['driver']}, "
          f"table {st['table']['branch']} from {st['table']['tag']})")
    txt = subprocess.run([sys.executable, "-m", "gdrpy", "info"], capture_output=True,
                         text=True, timeout=300).stdout
    assert "nvrm self-test:" in txt and "route A (cuMemCreate): ok" in txt, txt
    assert "route C (cuMemAlloc) : ok" in txt, txt


_CORRUPT_PROBE = """
import json, gdrpy
st = gdrpy.nvrm_selftest(0)
try:
    c = gdrpy.open(0, "nvrm"); c.close(); opened = "yes"
except gdrpy.GdrError as e:
    opened = "no: " + str(e)
try:
    c = gdrpy.open(0, "auto"); auto = c.backend; c.close()
except gdrpy.GdrError as e:
    auto = "none: " + str(e)
print(json.dumps({"st": st, "opened": opened, "auto": auto, "probe": gdrpy.probe("nvrm", 0)}))
"""


@pytest.mark.parametrize("mode,step", [("1", "RM_MAP_MEMORY"),
                                       ("2", "read through the mapping")])
def test_corrupted_table_makes_the_backend_unavailable_with_a_reason(mode, step):
    r = _run_py(_CORRUPT_PROBE, GDRPY_NVRM_TEST_CORRUPT_ABI=mode)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    st = out["st"]
    print(json.dumps(out, indent=1))
    assert st is not None and not st["usable"], st
    assert st["test_corrupt_abi"] == int(mode)
    assert "GDRPY_NVRM_TEST_CORRUPT_ABI" in st["reason"] and step in st["reason"], st["reason"]
    for route in ("A", "C"):
        assert not st["routes"][route]["ok"] and st["routes"][route]["step"], st["routes"]
    assert out["opened"].startswith("no: ") and "self-test failed" in out["opened"], out
    assert out["probe"][0] is False and "self-test" in out["probe"][1], out["probe"]
    assert out["auto"] != "nvrm", out["auto"]


_KERNEL = r"""
extern "C" __global__ void bump(unsigned long long *buf, unsigned long long *iters,
                                unsigned long long ns, int stride)
{
    int t = threadIdx.x;
    volatile unsigned long long *c = buf + (long long)t * stride;
    unsigned long long t0, now, n = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        *c = *c + 1ull;          /* read-modify-write: a restored old value shows */
        n++;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - t0 < ns);
    iters[t] = n;
}
"""


def _cupy():
    try:
        import cupy
    except ImportError as e:
        if REQUIRE_GPU:
            pytest.fail(f"CuPy is needed for the concurrent-writer test: {e}")
        pytest.skip(f"CuPy missing: {e}")
    return cupy


def test_concurrent_kernel_writes_survive_route_c_pins(cu):
    cp = _cupy()
    n = 64 * 1024
    ptr = int(cuda_ok(cu.cuMemAlloc(n)))
    ctx = gdrpy.open(0, "nvrm")
    try:
        cuda_ok(cu.cuMemsetD8(ptr, 0, n))
        cuda_ok(cu.cuCtxSynchronize())
        # counters at byte 0 and byte 4088: inside the two windows the
        # identity check samples for a pin of [ptr, ptr + 4096)
        stride = 511
        mem = cp.cuda.UnownedMemory(ptr, n, None)
        buf = cp.ndarray((n // 8,), dtype=cp.uint64, memptr=cp.cuda.MemoryPointer(mem, 0))
        iters = cp.zeros(2, dtype=cp.uint64)
        kern = cp.RawKernel(_KERNEL, "bump")
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            kern((1,), (2,), (buf, iters, np.uint64(1_500_000_000), np.int32(stride)))
        pins, errors = 0, []
        deadline = time.monotonic() + 30
        while not stream.done and time.monotonic() < deadline:
            try:
                with ctx.pin(ptr, size=4096):
                    pass
                pins += 1
            except gdrpy.GdrError as e:
                errors.append(str(e))
        stream.synchronize()
        host = np.empty(n // 8, np.uint64)
        cuda_ok(cu.cuMemcpyDtoH(host.ctypes.data, ptr, n))
        it = iters.get()
        print(f"pins during the kernel: {pins}, refused: {len(errors)}, kernel iterations "
              f"{int(it[0])} / {int(it[1])}, counters {int(host[0])} / {int(host[stride])}")
        assert pins >= 10, f"only {pins} pins overlapped the kernel: the test proves nothing"
        assert not errors, f"{len(errors)} pins refused under a concurrent writer: {errors[:3]}"
        assert int(host[0]) == int(it[0]) and int(host[stride]) == int(it[1]), \
            f"kernel writes lost: counters {int(host[0])}, {int(host[stride])} vs " \
            f"iterations {int(it[0])}, {int(it[1])}"
        rest = np.delete(host, [0, stride])
        assert not rest.any(), f"{int(np.count_nonzero(rest))} other words were written"
    finally:
        ctx.close()
        cuda_ok(cu.cuMemFree(ptr))
