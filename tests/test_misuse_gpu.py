"""Issue 17 on the GPU, default backend (``gdrpy.open(0)`` = auto): stream misuse,
teardown during copies (Python API and libgdrapi.so.2), SIGKILL reclaim, fork.
Every test prints what it saw when it fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import gdrpy

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def gpu():  # type: ignore[no-untyped-def]
    ctx = gdrpy.open(0)                     # the default backend
    assert ctx.backend != "sim"
    buf = gdrpy.memory.alloc(1 << 20, ctx=ctx)
    pin = ctx.pin(buf)
    m = pin.map()
    yield ctx, buf, pin, m
    ctx.close()
    buf.close()


def _run(code: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    e = dict(os.environ, **env)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e,
                          capture_output=True, text=True, timeout=timeout, check=False)


# ---- streams ------------------------------------------------------------------

def test_gpu_bogus_integer_stream_is_refused_before_the_driver(gpu) -> None:
    # This exact call killed the interpreter with SIGSEGV before (issue 17); run it
    # in a subprocess so a regression shows as a signal, not a dead test run.
    r = _run("""
        import gdrpy
        c = gdrpy.open(0); b = gdrpy.memory.alloc(65536, ctx=c); p = c.pin(b)
        for bad in (0xdeadbeef, 3, 1 << 40):
            try:
                p.ce_write(0, b"x", stream=bad)
                print("ACCEPTED", hex(bad))
            except TypeError as e:
                assert isinstance(e, gdrpy.GdrError)
                print("refused", hex(bad))
        print("done")
    """)
    assert r.returncode == 0 and "done" in r.stdout and "ACCEPTED" not in r.stdout, \
        (r.returncode, r.stdout, r.stderr[-2000:])


def test_gpu_real_stream_objects_are_accepted(gpu) -> None:
    _, _, pin, m = gpu
    seen = []
    from cuda.bindings import driver as cu
    err, s = cu.cuStreamCreate(0)
    assert int(err) == 0
    try:
        assert pin.ce_write(0, b"abcd", stream=s) == 4
        assert pin.ce_read(0, 4, stream=s) == b"abcd"
        assert pin.ce_read(0, 4, stream=gdrpy.RawStream(int(s))) == b"abcd"
        seen.append("cuda.bindings")
    finally:
        cu.cuStreamDestroy(s)
    for mod in ("cupy", "torch"):
        try:
            lib = __import__(mod)
        except ImportError:
            continue
        st = lib.cuda.Stream()
        assert m.transfer().put(0, b"wxyz", stream=st) == 4
        assert pin.ce_read(0, 4, stream=st) == b"wxyz"
        seen.append(mod)
    for default in (0, 1, 2):
        assert pin.ce_write(0, b"q", stream=default) == 1
    print("stream kinds exercised:", seen)


# ---- teardown during copies -------------------------------------------------------

@pytest.mark.parametrize("what", ["mapping", "pin", "context"])
@pytest.mark.parametrize("copy", ["write", "ce_write", "read"])
def test_gpu_teardown_while_another_thread_copies(gpu, what, copy) -> None:
    ctx, _, pin, m = gpu
    big = np.ones(1 << 20, np.uint8)
    fn = {"write": lambda: m.write(0, big), "ce_write": lambda: pin.ce_write(0, big),
          "read": lambda: m.read(0, 65536)}[copy]
    stop, other, n = threading.Event(), [], [0]

    def loop() -> None:
        while not stop.is_set():
            try:
                fn()
                n[0] += 1
            except gdrpy.GdrError:
                pass
            except BaseException as e:
                other.append(e)
                return

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    time.sleep(0.05)
    target = {"mapping": m, "pin": pin, "context": ctx}[what]
    deadline = time.monotonic() + 20
    busy = 0
    while True:
        try:
            target.close()
            break
        except gdrpy.BusyError:
            busy += 1
            assert time.monotonic() < deadline, f"still busy after 20 s ({busy} tries)"
    stop.set()
    t.join(20)
    assert not t.is_alive() and not other, (other, n[0], busy)
    print(f"{copy} x{n[0]} then {what}.close() ok after {busy} BusyError")


def test_gpu_sweep_teardown_races_and_c_abi() -> None:
    """The sweep's teardown races and C-ABI cases on the GPU, each in a subprocess."""
    r = subprocess.run([sys.executable, "-m", "tests.misuse.sweep", "--backend", "auto",
                        "--only", "race", "--jobs", "4"], capture_output=True, text=True,
                       timeout=600, check=False, env=dict(os.environ, PYTHONPATH=ROOT))
    print(r.stdout[-3000:])
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-2000:])


# ---- SIGKILL reclaim --------------------------------------------------------------

def _free_bytes() -> int:
    from cuda.bindings import driver as cu
    gdrpy.memory.primary_context(0)
    err, free, _total = cu.cuMemGetInfo()
    assert int(err) == 0
    return int(free)


def test_gpu_sigkill_while_pinned_and_mapped_gives_the_memory_back() -> None:
    size = 256 << 20
    base = _free_bytes()
    results = []
    for _ in range(3):
        p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import sys, time, gdrpy
            c = gdrpy.open(0); b = gdrpy.memory.alloc({size}, ctx=c)
            p = c.pin(b); m = p.map(); m.write(0, b"x" * 4096)
            print("ready", flush=True); time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONPATH=ROOT))
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.strip() == "ready", line
        during = _free_bytes()
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        deadline = time.monotonic() + 20
        after = _free_bytes()
        while after < base - (32 << 20) and time.monotonic() < deadline:
            time.sleep(0.2)
            after = _free_bytes()
        results.append((base - during, base - after))
        assert after >= base - (32 << 20), \
            f"GPU memory not reclaimed: base {base}, during {during}, after {after}"
    print("held during / left after (bytes):", results)


# ---- fork -------------------------------------------------------------------------

def test_gpu_fork_child_gets_no_parent_mapping(gpu) -> None:
    _, _, _, m = gpu
    m.write(0, b"secret")
    view = np.asarray(m)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child; no CUDA here (not fork-safe)
        bad = int(bytes(view[:6]) != bytes(6))      # zeros, not the parent's bytes
        view[:3] = 1                                 # the child's own memory
        try:
            m.write(0, b"x")
            bad |= 2
        except gdrpy.WrongProcessError:
            pass
        os._exit(bad)
    _, st = os.waitpid(pid, 0)
    assert os.WIFEXITED(st), f"child killed by signal {os.WTERMSIG(st)}"
    assert os.WEXITSTATUS(st) == 0, f"child expectation mask {os.WEXITSTATUS(st):#x}"
    assert m.read(0, 6) == b"secret"
    del view
