"""The nvrm backend's logic against a stand-in driver (native/tests/fakenv):
ABI table selection, the per-device self-test (both routes, the corrupted-
table switch), route C's IPC-layout learning and its read-only identity check
(including a concurrent writer that must lose nothing), and issue 45's
test_proof_fake / test_gdrapi_fake: no pin, proof, learning or self-test waits
for a kernel on the legacy stream, and proofs that cannot pass vacuously.  No
GPU needed: the
stand-in is LD_PRELOADed into a child process and serves /dev/nvidia* and
libcuda.so.1 from host memory.  The real driver is covered by
tests/test_gpu_nvrm.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import make

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
    "fresh-chunks": {"FAKE_FRESH_CHUNKS": "2"},
}


@pytest.fixture(scope="module")
def built():
    r = make("-C", NATIVE, "-j2", "build/test_nvrm_abi",
                        "build/test_nvrm_fake", "build/test_proof_fake",
                        "build/test_gdrapi_fake")
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


@pytest.mark.parametrize("prog", ["test_proof_fake", "test_gdrapi_fake"])
def test_pins_never_wait_and_proofs_count_on_the_stand_in_driver(built, prog):
    fake = os.path.join(built, "fakenv", "libcuda.so.1")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GDRPY_", "FAKE_", "LD_PRELOAD"))}
    env.update(LD_PRELOAD=fake, LD_LIBRARY_PATH=os.path.dirname(fake))
    r = subprocess.run([os.path.join(built, prog)], capture_output=True, text=True, env=env,
                       timeout=300)
    _check(r.stdout + r.stderr, r.returncode, prog)


def _info_json(built, **env):
    fake = os.path.join(built, "fakenv", "libcuda.so.1")
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("GDRPY_", "FAKE_", "LD_PRELOAD"))}
    e.update(LD_PRELOAD=fake, LD_LIBRARY_PATH=os.path.dirname(fake),
             PYTHONPATH=os.path.dirname(HERE), **env)
    r = subprocess.run([sys.executable, "-m", "gdrpy", "info", "--json"], capture_output=True,
                       text=True, env=e, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_info_reports_the_self_test_through_python(built):
    d = _info_json(built)
    st = d["nvrm_selftest"]
    assert st["usable"] and st["routes"]["A"]["ok"] and st["routes"]["C"]["ok"], st
    assert st["table"] == {"branch": "580", "tag": "580.142", "driver_newer_than_tables": False}
    assert st["selftest_ms"] > 0 and d["auto"] == "nvrm"
    assert st["routes"]["C"]["ipc_layout"]["how"] == "known CUDA 13.0 layout confirmed"


def test_info_shows_a_corrupted_table_as_unavailable(built):
    d = _info_json(built, GDRPY_NVRM_TEST_CORRUPT_ABI="1")
    st = d["nvrm_selftest"]
    assert not st["usable"] and "RM_MAP_MEMORY" in st["reason"], st
    assert d["backends"]["nvrm"] == {"available": False, "why": st["reason"]}
    assert d["auto"] != "nvrm"
