"""Shared fixtures: every sanity test runs against each backend in BACKENDS.

* ``sim`` always runs (host memory standing in for a GPU).
* ``nvrm`` runs wherever an NVIDIA GPU is present and is skipped only where
  none is.  On a GPU machine a broken nvrm backend FAILS the tests: it is
  never skipped there.  Set GDRPY_REQUIRE_GPU=1 (the GPU script does) to turn
  "no GPU found" into a failure as well.
"""

from __future__ import annotations

import faulthandler
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import zlib

import pytest

# The suite never reads or writes the user's calibration cache: tests that
# calibrate with small budgets would otherwise leave plans and thresholds there
# that later benchmarks and programs load (seen on the GPU machine: a staging
# plan of "never stage" stored by a test run was used by `bench bandwidth`).
os.environ["GDRPY_CACHE_DIR"] = tempfile.mkdtemp(prefix="gdrpy-test-cache-")

import gdrpy


def _gpu_present() -> tuple[bool, str]:
    if not os.path.exists("/dev/nvidiactl"):
        return False, "no NVIDIA GPU on this machine (/dev/nvidiactl missing)"
    try:
        from cuda.bindings import driver as cu
    except ImportError as e:
        return False, f"cuda-python missing: {e}"
    err, = cu.cuInit(0)
    if int(err) != 0:
        return False, f"cuInit failed: {err}"
    err, n = cu.cuDeviceGetCount()
    if int(err) != 0 or int(n) == 0:
        return False, "the CUDA driver reports no devices"
    return True, ""


GPU_PRESENT, NO_GPU_REASON = _gpu_present()
REQUIRE_GPU = os.environ.get("GDRPY_REQUIRE_GPU") == "1"


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MAKE_LOCK = os.path.join(tempfile.gettempdir(),
                          f"gdrpy-tests-make-{zlib.crc32(ROOT.encode()):08x}.lock")


def make(*args: str) -> subprocess.CompletedProcess:
    """`make ARGS` in this checkout, one at a time across the parallel test
    workers (pyproject.toml runs the suite with `-n auto`): two makes writing
    the same file of native/build or examples/feed/build at once could
    corrupt it."""
    with open(_MAKE_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return subprocess.run(["make", *args], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="session", autouse=True)
def _feed_example_built():
    """The feed example builds itself when first run (examples/feed/engine.py):
    build it here, under the lock, so that parallel tests never race to."""
    if shutil.which("make") and shutil.which("cc"):
        make("-s", "-C", os.path.join(ROOT, "examples", "feed"))
    yield


# GPU tests whose processes keep a kernel running (the channel's, the feed's,
# the examples' and benchmarks' programs): one of the two GPU workers.
GPU_KERNEL_MODULES = {"test_channel_gpu", "test_feed", "test_examples", "test_bench"}


def _serial_group(item) -> str | None:
    """The GPU tests run in two workers (xdist groups; pyproject.toml runs the
    suite with `-n auto --dist loadgroup`), one after the other in each: those
    of GPU_KERNEL_MODULES, and the rest (pins, memory kinds, copies). Never
    more than two processes share the GPU at a time."""
    if "gpu" not in item.keywords:
        return None
    module = getattr(item, "module", None)
    name = module.__name__.rpartition(".")[2] if module is not None else ""
    return "gpu-kernels" if name in GPU_KERNEL_MODULES else "gpu"


@pytest.hookimpl(tryfirst=True)   # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = _serial_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    if GPU_PRESENT:
        return
    if REQUIRE_GPU:
        raise pytest.UsageError(f"GDRPY_REQUIRE_GPU=1 but {NO_GPU_REASON}")
    skip = pytest.mark.skip(reason=NO_GPU_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


BACKENDS = [pytest.param("sim", id="sim"),
            pytest.param("nvrm", id="nvrm", marks=pytest.mark.gpu)]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture
def ctx(backend):
    c = gdrpy.open(0, backend)
    assert c.backend == backend
    yield c
    c.close()


class Alloc:
    """Allocates device memory of the context's kind and reads the device
    side back through the copy engine (cuMemcpyDtoH on a GPU, the sim
    allocation's own pages on sim)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.bufs = []

    def __call__(self, nbytes):
        b = gdrpy.memory.alloc(nbytes, ctx=self.ctx)
        self.bufs.append(b)
        return b

    def device_read(self, addr, n):
        return self.ctx.memcpy_dtoh(addr, n)

    def device_write(self, addr, data):
        self.ctx.memcpy_htod(addr, data)

    def close(self):
        for b in self.bufs:
            b.close()


@pytest.fixture
def alloc(ctx):
    a = Alloc(ctx)
    yield a
    a.close()


@pytest.fixture
def sim_ctx():
    c = gdrpy.open(0, "sim")
    yield c
    c.close()


# ---- helpers of the GPU tests (and the forked-child checks) -------------------

def cuda_ok(res):
    """A cuda-python call's result, checked: its value (or values), or the test fails
    with the CUDA error."""
    err = res[0] if isinstance(res, tuple) else res
    assert int(err) == 0, f"CUDA call failed: {err}"
    if isinstance(res, tuple):
        return res[1] if len(res) == 2 else res[1:]
    return None


@pytest.fixture(scope="module")
def cu():
    """cuda-python's driver module, with device 0's primary context current."""
    from gdrpy.memory import cuda_driver, primary_context
    d = cuda_driver()
    primary_context(0)
    return d


def child_status(fn) -> int:
    """Runs fn() in a forked child; its wait status (exit 3: fn raised; a signal:
    fn faulted, which is what the callers expect of a touch of unmapped memory)."""
    pid = os.fork()
    if pid == 0:
        faulthandler.disable()      # a fault is the expected outcome: no dump
        # and it ends the child by the signal, also where a sanitizer's handler
        # would turn it into an abort (the CI's ASan run)
        for sig in (signal.SIGSEGV, signal.SIGBUS):
            signal.signal(sig, signal.SIG_DFL)
        try:
            fn()
        except BaseException:
            os._exit(3)
        os._exit(0)
    return os.waitpid(pid, 0)[1]


def run_threads(target, n: int, timeout: float = 60.0) -> None:
    """Runs target(0) .. target(n - 1) in n daemon threads and waits for them; the
    test fails if one has not returned within `timeout` seconds (a hang)."""
    threads = [threading.Thread(target=target, args=(k,), daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), \
        f"a thread hung (no return within {timeout:.0f} s)"
