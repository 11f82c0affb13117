"""Runs the C test programs (native/tests) so that one pytest command covers
the C core, the copy kernels and the libgdrapi drop-in.  On a machine without
a GPU they run on the sim backend; on a GPU machine the gpu-marked variants
run on the real backend too."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import make

HERE = os.path.dirname(os.path.abspath(__file__))
NATIVE = os.path.join(os.path.dirname(HERE), "native")
BUILD = os.path.join(NATIVE, "build")


@pytest.fixture(scope="module")
def native_tests():
    r = make("-C", NATIVE, "-j2", "tests")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return BUILD


def _run(args, env_extra, timeout=600):
    env = dict(os.environ, **env_extra)
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    sys.stdout.write(r.stdout[-3000:])
    assert r.returncode == 0, (f"{args[0]} exited {r.returncode}\n{r.stdout[-6000:]}\n"
                               f"{r.stderr[-3000:]}")
    last = [ln for ln in r.stdout.splitlines() if " passed, " in ln]
    assert last and last[-1].split(": ", 1)[1].split(",")[1].strip().startswith("0 failed"), last
    return r.stdout


def test_c_core_on_sim(native_tests):
    _run([os.path.join(native_tests, "test_core")], {"GDRPY_BACKEND": "sim"})


def test_c_staging_ring_and_host_table_on_sim(native_tests):
    _run([os.path.join(native_tests, "test_staging")], {})


def test_c_copy_kernels_every_size_and_alignment(native_tests):
    _run([os.path.join(native_tests, "test_copy")], {})


def test_c_gdrapi_dropin_on_sim(native_tests):
    _run([os.path.join(native_tests, "test_gdrapi")], {"GDRPY_BACKEND": "sim"})


def test_c_gdrapi_dlopen_by_name_on_sim(native_tests):
    _run([os.path.join(native_tests, "test_gdrapi_dlopen"),
          os.path.join(native_tests, "libgdrapi.so")], {"GDRPY_BACKEND": "sim"})


@pytest.mark.gpu
def test_c_gdrapi_dropin_on_gpu(native_tests):
    _run([os.path.join(native_tests, "test_gdrapi")], {"GDRPY_BACKEND": "nvrm"})


def test_c_gdrapi_rseq_forced_on_sim(native_tests):
    """sim mappings take the per-thread records by default (their pages may
    fault, see rseq_may_use in gdrapi.c); forced, the restartable small-write
    section runs on them (sim populates its mappings at map time)."""
    _run([os.path.join(native_tests, "test_gdrapi")],
         {"GDRPY_BACKEND": "sim", "GDRPY_GDRAPI_RSEQ": "force"})


@pytest.mark.gpu
def test_c_gdrapi_record_path_on_gpu(native_tests):
    _run([os.path.join(native_tests, "test_gdrapi")],
         {"GDRPY_BACKEND": "nvrm", "GDRPY_GDRAPI_RSEQ": "0"})


@pytest.mark.gpu
def test_c_gdrapi_dlopen_by_name_on_gpu(native_tests):
    _run([os.path.join(native_tests, "test_gdrapi_dlopen"),
          os.path.join(native_tests, "libgdrapi.so")], {"GDRPY_BACKEND": "nvrm"})
