"""The nvrm backend's logic against a stand-in driver (native/tests/fakenv):
ABI table selection, the per-device self-test (both routes, the corrupted-
table switch), route C's IPC-layout learning and its read-only identity check
(including a concurrent writer that must lose nothing).  No GPU needed: the
stand-in is LD_PRELOADed into a child process and serves /dev/nvidia* and
libcuda.so.1 from host memory.  The real driver is covered by
tests/test_gpu_nvrm.py."""

from __future__ import annotations

import os
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
NATIVE = os.path.join(os.path.dirname(HERE), "native")
BUILD = os.path.join(NATIVE, "build")

MODES = {
    "default": {},
    "alt": {"FAKE_IPC_LAYOUT": "alt"},
    "corrupt1": {"GDRPY_NVRM_TEST_CORRUPT_ABI": "1"},
    "corrupt2": {"GDRPY_NVRM_TEST_CORRUPT_ABI": "2"},
    "v535": {"FAKE_NV_VERSION": "535.288.01", "FAKE_NV_EXPORT_SIZE": "76"},
    "v535-wrong": {"FAKE_NV_VERSION": "535.288.01"},
    "newer": {"FAKE_NV_VERSION": "610.1.2"},
    "old": {"FAKE_NV_VERSION": "470.256.02"},
    "mapbase-alloc": {"FAKE_MAPBASE": "alloc"},
}


@pytest.fixture(scope="module")
def built():
    r = subprocess.run(["make", "-C", NATIVE, "-j2", "build/test_nvrm_abi",
                        "build/test_nvrm_fake"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return BUILD


def _check(out: str, rc: int, what: str) -> None:
    last = [ln for ln in out.splitlines() if " passed, " in ln]
    assert rc == 0 and last and last[-1].rstrip().endswith(" 0 failed"), \
        f"{what} exited {rc}\n{out[-6000:]}"


def test_tables_agree_with_definitions_and_selection(built):
    r = subprocess.run([os.path.join(built, "test_nvrm_abi")], capture_output=True, text=True)
    _check(r.stdout + r.stderr, r.returncode, "test_nvrm_abi")


@pytest.mark.parametrize("mode", sorted(MODES))
def test_nvrm_logic_on_the_stand_in_driver(built, mode):
    fake = os.path.join(built, "fakenv", "libcuda.so.1")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GDRPY_", "FAKE_", "LD_PRELOAD"))}
    env.update(LD_PRELOAD=fake, LD_LIBRARY_PATH=os.path.dirname(fake), **MODES[mode])
    r = subprocess.run([os.path.join(built, "test_nvrm_fake"), mode], capture_output=True,
                       text=True, env=env, timeout=300)
    _check(r.stdout + r.stderr, r.returncode, f"test_nvrm_fake {mode}")
