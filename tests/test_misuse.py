"""Misuse never crashes or stalls (issue 17), on sim: stream type gate, errors
that are both GdrError and the matching builtin, validation before allocation,
environment handling, teardown under concurrency, fork, the cache directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import gdrpy
from gdrpy.threshold import cache as tcache


@pytest.fixture
def mapped():  # type: ignore[no-untyped-def]
    ctx = gdrpy.open(0, "sim")
    buf = gdrpy.memory.alloc(1 << 20, ctx=ctx)
    pin = ctx.pin(buf)
    m = pin.map()
    yield ctx, buf, pin, m
    ctx.close()
    buf.close()


# ---- streams ----------------------------------------------------------------

class _Proto:
    def __init__(self, h: int) -> None:
        self.h = h

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.h)


@pytest.mark.parametrize("bad", [0xdeadbeef, 3, -1, 2**64, 1.0, "0", b"0", True, [0],
                                 object(), np.int64(0)])
def test_stream_that_does_not_prove_it_is_one_is_a_type_error(mapped, bad) -> None:
    _, _, pin, m = mapped
    for call in (lambda: pin.ce_write(0, b"x", stream=bad),
                 lambda: pin.ce_read(0, 1, stream=bad),
                 lambda: m.transfer().put(0, b"x", stream=bad),
                 lambda: m.transfer().get(0, 1, stream=bad)):
        with pytest.raises(TypeError) as ei:
            call()
        assert isinstance(ei.value, gdrpy.GdrError)
        assert "stream" in str(ei.value)


def test_stream_with_a_ptr_attribute_only_is_refused(mapped) -> None:
    _, _, pin, _ = mapped

    class Fake:
        ptr = 0xdeadbeef
        cuda_stream = 0xdeadbeef

    with pytest.raises(gdrpy.ArgumentTypeError):
        pin.ce_write(0, b"x", stream=Fake())


@pytest.mark.parametrize("good", [None, 0, 1, 2, _Proto(0), gdrpy.RawStream(0),
                                  gdrpy.unchecked_stream(2)])
def test_accepted_streams(mapped, good) -> None:
    _, _, pin, _ = mapped
    assert pin.ce_write(0, b"ab", stream=good) == 2
    assert pin.ce_read(0, 2, stream=good) == b"ab"


def test_raw_stream_checks_only_its_type_and_range() -> None:
    with pytest.raises(gdrpy.ArgumentTypeError):
        gdrpy.RawStream("1")  # type: ignore[arg-type]
    with pytest.raises(gdrpy.InvalidArgumentError):
        gdrpy.RawStream(-5)
    assert "0xdeadbeef" in repr(gdrpy.RawStream(0xdeadbeef))


def test_stream_protocol_returning_junk_is_a_clear_error(mapped) -> None:
    _, _, pin, _ = mapped

    class Junk:
        def __cuda_stream__(self) -> str:
            return "junk"

    with pytest.raises(gdrpy.InvalidArgumentError):
        pin.ce_write(0, b"x", stream=Junk())


# ---- errors are GdrError and the builtin ------------------------------------

def test_error_classes_match_both_except_styles(mapped) -> None:
    _, _, pin, m = mapped
    with pytest.raises(IndexError) as ei:
        m.write(m.size, b"x")
    assert isinstance(ei.value, gdrpy.OutOfRangeError) and isinstance(ei.value, ValueError)
    with pytest.raises(TypeError) as ti:
        m.write("0", b"x")  # type: ignore[arg-type]
    assert isinstance(ti.value, gdrpy.GdrError)
    with pytest.raises(ValueError) as vi:
        m.write(0, np.zeros(8)[::2])
    assert isinstance(vi.value, gdrpy.InvalidArgumentError)
    ro = np.zeros(8, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(gdrpy.InvalidArgumentError):
        m.read(0, 8, out=ro)
    with pytest.raises(gdrpy.ArgumentTypeError):
        m.write(0, 12345)  # type: ignore[arg-type]


def test_asarray_of_a_closed_mapping_raises(mapped) -> None:
    _, _, _, m = mapped
    m.close()
    with pytest.raises(gdrpy.ClosedError):
        np.asarray(m)


# ---- validation before allocation --------------------------------------------

def test_huge_reads_are_refused_before_allocating(mapped) -> None:
    ctx, buf, pin, _ = mapped
    with pytest.raises(gdrpy.OutOfRangeError):
        pin.ce_read(0, 2**40)
    with pytest.raises(gdrpy.InvalidArgumentError):
        ctx.memcpy_dtoh(buf.ptr, 2**40)
    with pytest.raises(gdrpy.InvalidArgumentError):
        ctx.memcpy_dtoh(2**64 - 8, 64)
    assert ctx.memcpy_dtoh(buf.ptr, 1 << 20)[:0] == b""


# ---- names and environment ----------------------------------------------------

def test_names_with_nul_are_refused() -> None:
    with pytest.raises(gdrpy.InvalidArgumentError):
        gdrpy.open(0, "sim\0nvrm")
    with pytest.raises(gdrpy.InvalidArgumentError):
        gdrpy.set_copy_isa("generic\0")


def test_explicit_backend_wins_over_environment(monkeypatch) -> None:
    monkeypatch.setenv("GDRPY_BACKEND", "sim")
    try:
        c = gdrpy.open(0, "auto")
    except gdrpy.GdrError:
        pass          # no GPU here: auto fails, it did not silently become sim
    else:
        assert c.backend != "sim"
        c.close()
    with gdrpy.open(0) as c:      # no explicit backend: the environment applies
        assert c.backend == "sim"


def test_unusable_environment_values_are_reported(monkeypatch) -> None:
    monkeypatch.setenv("GDRPY_BACKEND", "bogus")
    with pytest.raises(gdrpy.InvalidArgumentError, match="GDRPY_BACKEND"):
        gdrpy.open()
    from gdrpy._env import check_environment
    with pytest.warns(UserWarning, match="GDRPY_BACKEND"):
        check_environment(gdrpy.backend_names())
    env = dict(os.environ, GDRPY_COPY_ISA="bogus", GDRPY_BACKEND="sim")
    r = subprocess.run([sys.executable, "-c", ("import gdrpy; c = gdrpy.open(); m = "
                        "c.pin(gdrpy.memory.alloc(65536, ctx=c)).map(); m.write(0, b'x')")],
                       env=env, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert "GDRPY_COPY_ISA=bogus" in r.stderr


# ---- teardown under concurrency ----------------------------------------------

@pytest.mark.parametrize("what", ["mapping", "pin", "context"])
@pytest.mark.parametrize("copy", ["write", "ce_write", "put"])
def test_teardown_while_another_thread_copies(mapped, what, copy) -> None:
    ctx, _, pin, m = mapped
    big = np.ones(1 << 20, np.uint8)
    fn = {"write": lambda: m.write(0, big), "ce_write": lambda: pin.ce_write(0, big),
          "put": lambda: m.transfer().put(0, b"12345678")}[copy]
    stop, other = threading.Event(), []

    def loop() -> None:
        while not stop.is_set():
            try:
                fn()
            except gdrpy.GdrError:
                pass
            except BaseException as e:
                other.append(e)
                return

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    time.sleep(0.02)
    target = {"mapping": m, "pin": pin, "context": ctx}[what]
    deadline = time.monotonic() + 15
    while True:
        try:
            target.close()
            break
        except gdrpy.BusyError:
            assert time.monotonic() < deadline
    stop.set()
    t.join(10)
    assert not t.is_alive() and not other, other
    assert target.closed


def test_open_is_not_blocked_by_copies_of_another_context(mapped) -> None:
    """Functional: opens complete while 4 threads copy (timing: gdrpy_apilat)."""
    _, _, pin, _ = mapped
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            pin.ce_write(0, b"x" * 64)

    ts = [threading.Thread(target=loop, daemon=True) for _ in range(4)]
    for t in ts:
        t.start()
    done = threading.Event()

    def opener() -> None:
        for _ in range(20):
            gdrpy.open(0, "sim").close()
        done.set()

    threading.Thread(target=opener, daemon=True).start()
    ok = done.wait(30)
    stop.set()
    for t in ts:
        t.join(10)
    assert ok, "open/close of another context did not complete while copies ran"


# ---- fork ---------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_fork_child_sees_no_parent_memory(mapped) -> None:
    _, buf, _, m = mapped
    m.write(0, b"secret")
    view, dev = np.asarray(m), buf.numpy()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        bad = 0
        bad |= int(bytes(view[:6]) != bytes(6)) << 0
        bad |= int(bytes(dev[:6]) != bytes(6)) << 1
        view[:3] = 1
        dev[:3] = 2
        for call in (lambda: m.read(0, 1), lambda: buf.ptr):
            try:
                call()
                bad |= 4
            except gdrpy.WrongProcessError:
                pass
        os._exit(bad)
    _, st = os.waitpid(pid, 0)
    assert os.WIFEXITED(st), f"child killed by signal {os.WTERMSIG(st)}"
    assert os.WEXITSTATUS(st) == 0, f"child expectation mask {os.WEXITSTATUS(st):#x}"
    assert m.read(0, 6) == b"secret" and bytes(dev[:6]) == b"secret"
    del view, dev


# ---- threshold cache directory ------------------------------------------------

def test_cache_dir_writable_by_others_is_refused(tmp_path) -> None:
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    tcache.check_dir(d)
    os.chmod(d, 0o777)
    with pytest.raises(tcache.InsecureCacheDir, match="chmod go-w"):
        tcache.check_dir(d)


def test_cache_files_are_opened_without_following_links(tmp_path) -> None:
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    target = tmp_path / "victim"
    target.write_text("keep")
    (d / "x.lock").symlink_to(target)
    with pytest.raises(OSError):
        tcache.open_nofollow(d / "x.lock", os.O_RDWR | os.O_CREAT)
    with tcache._file_lock(d / "x.lock", 1.0) as got:
        assert got is False
    assert target.read_text() == "keep"


# ---- the hostile-input sweep ------------------------------------------------

def test_sweep_runs_its_cases_from_the_repository_root(tmp_path) -> None:
    """`python -m tests.misuse.sweep` (CI's sanitizer and fuzz stages run it
    whole): a Python and a C-ABI family on sim, every case as it expects
    (bad values refused with a clear error)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "sweep.json"
    for only in ("py.write_u64.value=", "c.pin_"):
        r = subprocess.run([sys.executable, "-m", "tests.misuse.sweep", "--backend", "sim",
                            "--only", only, "--jobs", "2", "--json", str(out)], cwd=root,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "PASS" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
        res = json.loads(out.read_text())
        outcomes = [c["outcome"] for c in res["cases"]]
        assert len(outcomes) >= 5 and set(outcomes) <= {"clear_error", "ok"}, res
        assert outcomes.count("clear_error") >= len(outcomes) - 1, res
