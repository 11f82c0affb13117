"""Issue 45: no pin, map or proof waits for work the caller queued.  A kernel
spins on the legacy default stream, the per-thread default stream or a
blocking stream while every memory kind (cuMemAlloc, cuMemCreate with and
without a handle type, the default pool, pools with and without POSIX_FD,
CuPy's default and async allocators, PyTorch's caching allocator) is pinned
and mapped through libgdrapi.so.2 and the Python API, and a second thread
writes through an existing mapping (tests/gpu_pin_nowait.py does it, one
process per stream).  Asserted: every pin and map returns while the kernel
still runs (so none waited for it), the first one included (libgdrapi opens
its context and the nvrm self-test runs then), and the writers never stall
for more than a fraction of the kernel's spin.  The times themselves are for
``python -m tests.gpu_pin_nowait --report``."""

from __future__ import annotations

import os
import shutil
import subprocess

import gpu_pin_nowait as nw
import pytest


@pytest.mark.gpu
@pytest.mark.parametrize("stream", nw.STREAMS)
def test_pins_and_maps_never_wait_for_a_running_kernel(stream: str) -> None:
    r = nw.run_in_subprocess(stream)
    print(nw.table([r]))
    assert r["still_running_at_end"], "the kernel ended before the pins did"
    assert r["kernel_ms"] < r["kernel_limit_ms"], "the kernel ran to its limit"
    for api in ("gdrapi", "capi", "python"):
        a = r[api]
        assert not a.get("error"), (api, a.get("error"))
        assert a["open_while_running"], f"{api}: opening waited for the kernel"
        for row in a["pins"]:
            if "skipped" in row:
                assert row["kind"] in ("cupy_default", "cupy_async", "torch"), row
                continue
            assert row["ok"], (api, row["kind"], row["error"])
            assert row["while_running"], f"{api} {row['kind']}: a pin waited for the kernel"
        for wk in ("writer", "writer_mapping"):
            w = a.get(wk)
            if w is None:
                continue
            assert not w["error"] and not w["hung"] and w["writes"] > 0, (api, wk, w)
            assert w["max_stall_ms"] < r["kernel_ms"] / 4, (api, wk, w, r["kernel_ms"])


def test_the_report_names_the_longest_pin_and_stall() -> None:
    """The table the lead quotes: the longest pin+map after the first, and the
    longest write stall, over every stream, API and kind."""
    row = {"kind": "cumemalloc", "ok": True, "while_running": True, "error": "",
           "first_ms": 30.0, "max_ms": 1.25}
    slow = dict(row, kind="pool_none", max_ms=4.5)
    w = {"writes": 10, "max_stall_ms": 0.2, "p999_ms": 0.1, "error": "", "hung": False}
    res = [{"stream": s, "kernel_ms": 900.0, "kernel_limit_ms": 8000.0,
            "gdrapi": {"pins": [row, {"kind": "torch", "skipped": "not installed"}],
                       "writer": w, "open_first_pin_ms": 40.0},
            "python": {"pins": [slow], "writer": dict(w, max_stall_ms=0.7),
                       "open_ms": 2.0}} for s in nw.STREAMS]
    t = nw.table(res)
    assert "longest pin+map after the first: 4.50 ms" in t
    assert "longest write stall: 0.700 ms" in t
    assert t.count("skipped: not installed") == 3


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    cand = os.path.join(home, "bin", "nvcc") if home else None
    return cand if cand and os.access(cand, os.X_OK) else shutil.which("nvcc")


def test_the_spinning_kernel_compiles_for_hopper(tmp_path) -> None:  # type: ignore[no-untyped-def]
    nvcc = _nvcc()
    if not nvcc:
        pytest.skip("nvcc not found (CUDA_HOME or PATH); on the GPU machine NVRTC compiles it")
    src = tmp_path / "spin.cu"
    src.write_text(nw.KERNEL)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # the sanitizer stage's
    p = subprocess.run([nvcc, "-arch=sm_90", "-c", str(src), "-o", str(tmp_path / "spin.o")],
                       capture_output=True, text=True, check=False, env=env)
    assert p.returncode == 0, p.stderr
