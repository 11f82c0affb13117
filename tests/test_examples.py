"""Smoke tests of the ping-pong benchmark and the examples.

Each runs as a subprocess, bounded in size and time (its own process group,
killed on timeout), and its output is checked for sanity: percentile lines,
no sequence gaps on a quiet loopback feed, the loud label of the CPU stand-in
on sim, data checks passed.  The sim variants run everywhere (CI included);
the ``gpu`` variants run the real thing where a GPU is (conftest skips them
only where none exists).  No timing is asserted: the benchmarks own that.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLES = os.path.join(ROOT, "examples")
SIM_LABEL = "SIM: CPU thread stands in for the GPU kernel"
PERCENTILE_HEADER = ("median", "p90", "p99", "p99.9", "max")


def run(args, timeout=120, env_extra=None, expect_rc=0):
    """Run a command in its own process group; kill the whole group on timeout
    (mpi_eager's local mode starts two rank processes of its own)."""
    env = dict(os.environ)
    env.pop("GDRPY_BACKEND", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(env_extra or {})
    p = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"{' '.join(args)} ran past {timeout} s\n{out[-3000:]}\n{err[-3000:]}")
    if expect_rc is not None:
        assert p.returncode == expect_rc, (f"{' '.join(args)} exited {p.returncode}\n"
                                           f"stdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}")
    return p.returncode, out, err


def assert_percentile_header(text):
    lines = [ln for ln in text.splitlines() if all(h in ln.split() for h in PERCENTILE_HEADER)]
    assert lines, f"no percentile header in:\n{text[-3000:]}"


# ---------------------------------------------------------------------------
# gdrpy pingpong

PINGPONG = [sys.executable, "-m", "gdrpy.tools.pingpong"]


def test_pingpong_sim_reports_percentiles_for_each_size_and_path_and_labels_the_stand_in():
    rc, out, err = run(PINGPONG + ["--backend", "sim", "--sizes", "4,64,1K", "--iters", "60"])
    assert SIM_LABEL in out and SIM_LABEL in err
    assert_percentile_header(out)
    for size in ("4 B", "64 B", "1 KiB"):
        for path in ("python", "c", "cuMemcpy"):
            rows = [ln for ln in out.splitlines()
                    if ln.strip().startswith(size) and ln.split()[2:3] == [path]]
            assert rows, f"no {size} {path} row:\n{out}"
            nums = [float(x) for x in rows[0].split()[-5:]]
            assert all(x > 0 for x in nums) and nums == sorted(nums), rows[0]
    summary = out[out.index("SUMMARY"):]
    assert "Python channel round trip 4 B" in summary and "C channel round trip 4 B" in summary
    assert "batch of 32 ticks" in summary and "[SIM: not GPU numbers]" in summary


def test_pingpong_sim_json_has_every_statistic():
    rc, out, err = run(PINGPONG + ["--backend", "sim", "--sizes", "4,4K", "--iters", "40",
                                   "--json"])
    res = json.loads(out)
    assert res["sim"] is True and res["consumer"] == SIM_LABEL
    got = {(r["size"], r["path"]) for r in res["results"]}
    for s in (4, 4096):
        for path in ("python", "c", "cuMemcpy"):
            assert (s, path) in got, (s, path, got)
    for path in ("python-tick", "python-batch32", "c-tick", "c-batch32"):
        assert (32, path) in got, (path, got)
    # the C batch taken apart (the same batches, timed from one start each):
    # send_batch alone <= up to the first completion <= up to the second
    parts = {r["path"]: r["stats_us"]["median"] for r in res["results"]
             if r["path"].startswith("c-batch32")}
    assert set(parts) == {"c-batch32", "c-batch32-send", "c-batch32-first",
                          "c-batch32-second"}, parts
    assert parts["c-batch32-send"] <= parts["c-batch32-first"] <= parts["c-batch32-second"], parts
    for r in res["results"]:
        st = r["stats_us"]
        assert st["n"] == (40 if r["path"] in ("python", "c", "cuMemcpy") else st["n"])
        assert 0 < st["min"] <= st["median"] <= st["p90"] <= st["p99"] <= st["p99.9"] <= st["max"]
    sm = res["summary"]
    for k in ("python_median_us", "python_p99_us", "c_median_us", "c_p99_us",
              "python_batch_ratio", "c_batch_ratio"):
        assert sm[k] > 0, k


def test_pingpong_rejects_a_bad_size_with_a_clear_message():
    rc, out, err = run(PINGPONG + ["--backend", "sim", "--sizes", "4,lots"], expect_rc=2)
    assert "not a size" in err


def test_pingpong_is_reachable_through_gdrpy_bench_when_bench_exposes_it():
    if importlib.util.find_spec("gdrpy.tools.bench") is None:
        pytest.skip("gdrpy.tools.bench is not there yet "
                    "(python -m gdrpy bench pingpong comes with it)")
    rc, out, err = run([sys.executable, "-m", "gdrpy", "bench", "--help"], expect_rc=None)
    if "pingpong" not in out:
        pytest.skip("gdrpy.tools.bench does not list pingpong yet")
    # the Python paths only: the C tool and the cuMemcpy baseline are the
    # same code behind bench as without it (bench calls pingpong.main), and
    # the two tests above run them
    rc, out, err = run([sys.executable, "-m", "gdrpy", "bench", "pingpong", "--sizes", "4",
                        "--iters", "30", "--no-c", "--no-baseline"],
                       env_extra={"GDRPY_BACKEND": "sim"})
    assert SIM_LABEL in out
    assert_percentile_header(out)


NVCC = shutil.which("nvcc") or next(
    (p for p in [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")]
     if os.access(p, os.X_OK)), None)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_pingpong_kernels_compile_for_sm90(tmp_path):
    """gdrpy/tools/channel_kernels.cu (bench pingpong, the channel's GPU tests,
    examples/mpi_eager.py) builds on gdrpy_channel.cuh for sm_90 - where the
    benchmark compiles it with NVRTC at run time, a break would show only on a
    GPU.  One compile, every kernel in the image."""
    import gdrpy.tools
    src = os.path.join(os.path.dirname(gdrpy.tools.__file__), "channel_kernels.cu")
    inc = os.path.join(ROOT, "native", "include")
    out = tmp_path / "channel_kernels.cubin"
    # nvcc is a third-party tool: it does not run under the sanitizer runtime
    # that the sanitizer stage preloads into the test processes
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
    p = subprocess.run([NVCC, "-cubin", "-arch=sm_90", f"-I{inc}", "-o", str(out), src],
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    image = out.read_bytes()
    for kernel in (b"gdrpy_pp_serve", b"gdrpy_chan_check", b"gdrpy_chan_echo", b"gdrpy_pp_once"):
        assert kernel in image, kernel


@pytest.mark.gpu
def test_pingpong_gpu_persistent_kernel_and_cumemcpy_paths_answer_correctly():
    rc, out, err = run(PINGPONG + ["--sizes", "4,64,4K", "--iters", "500", "--json"],
                       timeout=300)
    res = json.loads(out)
    assert res["sim"] is False and res["backend"] != "sim"
    assert res["module"] in ("cubin", "ptx")
    assert not res.get("c_tool", {}).get("error"), res.get("c_tool")
    got = {(r["size"], r["path"]): r["stats_us"] for r in res["results"]}
    for s in (4, 64, 4096):
        for path in ("python", "c", "cuMemcpy"):
            st = got[(s, path)]
            assert st["n"] == 500 and st["median"] > 0, (s, path, st)
    assert res["summary"]["c_batch_ratio"] > 0 and res["summary"]["python_batch_ratio"] > 0


@pytest.mark.gpu
def test_pingpong_gpu_table_has_no_sim_label():
    rc, out, err = run(PINGPONG + ["--sizes", "4", "--iters", "200"], timeout=300)
    assert SIM_LABEL not in out
    assert_percentile_header(out)
    assert "SUMMARY" in out and "[SIM" not in out


# examples/trading_feed.py: tests/test_feed.py


# ---------------------------------------------------------------------------
# examples/mpi_eager.py

MPI_EAGER = [sys.executable, os.path.join(EXAMPLES, "mpi_eager.py")]
SMALL = ["--max-size", "4096", "--iters", "30", "--skip", "3"]


def _check_osu_table(out, max_size=4096):
    assert "# Size" in out and "gdrpy (us)" in out and "cuMemcpy-staged (us)" in out
    rows = [ln.split() for ln in out.splitlines() if ln and ln[0].isdigit()]
    sizes = [int(r[0]) for r in rows]
    expect, n = [], 1
    while n <= max_size:
        expect.append(n)
        n *= 2
    assert sizes == expect, out
    for r in rows:
        assert float(r[1]) > 0 and float(r[2]) > 0
    # the channel column (persistent echo kernel per rank) up to the eager limit
    assert "channel (us)" in out
    for r in rows:
        if int(r[0]) <= 8192:
            assert float(r[4]) > 0, r


def test_mpi_eager_local_mode_sim_prints_the_osu_table_labelled_local_and_sim():
    rc, out, err = run(MPI_EAGER + ["--mode", "local", "--backend", "sim"] + SMALL)
    assert "LOCAL: 2 processes" in out and "NOT MPI" in out
    assert "SIM backend" in out
    _check_osu_table(out)


def _mpiexec():
    """An MPI launcher matching mpi4py's MPI, if any (pip's mpich puts one
    next to the interpreter)."""
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed (pip install mpich mpi4py); local mode is "
                    "tested instead")
    for cand in (os.path.join(os.path.dirname(sys.executable), "mpiexec"),
                 shutil.which("mpiexec"), shutil.which("mpirun")):
        if cand and os.path.exists(cand):
            return cand
    pytest.skip("mpi4py is installed but no mpiexec/mpirun was found")


def _run_mpi(extra, timeout):
    launcher = _mpiexec()
    env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    rc, out, err = run([launcher, "-n", "2"] + MPI_EAGER + extra, timeout=timeout,
                       env_extra=env, expect_rc=None)
    if rc == 2 and "needs exactly 2 ranks" in err:
        pytest.skip(f"{launcher} does not match mpi4py's MPI (each rank saw 1 process)")
    assert rc == 0, f"mpirun exited {rc}\n{out[-4000:]}\n{err[-4000:]}"
    return out


def test_mpi_eager_under_mpirun_sim_prints_the_osu_table():
    out = _run_mpi(["--backend", "sim"] + SMALL, timeout=180)
    assert "mode: MPI via mpi4py" in out and "SIM backend" in out
    _check_osu_table(out)


@pytest.mark.gpu
def test_mpi_eager_local_mode_gpu_moves_correct_data_device_to_device():
    rc, out, err = run(MPI_EAGER + ["--mode", "local", "--max-size", "1048576", "--iters", "100",
                                    "--skip", "10", "--iters-large", "20"], timeout=300)
    assert "SIM" not in out
    _check_osu_table(out, 1048576)


@pytest.mark.gpu
def test_mpi_eager_under_mpirun_gpu():
    out = _run_mpi(["--max-size", "65536", "--iters", "100", "--skip", "10"], timeout=300)
    assert "mode: MPI via mpi4py" in out and "SIM" not in out
    _check_osu_table(out, 65536)
