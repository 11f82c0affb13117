"""The UCX/MPI scripts without a GPU: scripts/ucx_gtest.sh on a stand-in gtest
binary (UCX's gtest output format), scripts/mpi_bench.py's parsing and verdicts on
recorded OSU output, and the argument and missing-input errors of
scripts/osu_build.sh and scripts/mpi_bench.py."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"


def load_mpi_bench():
    spec = importlib.util.spec_from_file_location("mpi_bench", SCRIPTS / "mpi_bench.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


mb = load_mpi_bench()


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


# ------------------------------------------------------------------ ucx_gtest.sh

# UCX 1.22's gtest output: gtest's lines plus UCX's own "[     SKIP ]" line
GTEST_OUT = r"""[==========] Running 5 tests from 2 test suites.
[----------] 4 tests from gdr_copy/test_gdr_copy
[ RUN      ] gdr_copy/test_gdr_copy.gdr_copy_reg_cuda_default_pin/0
[       OK ] gdr_copy/test_gdr_copy.gdr_copy_reg_cuda_default_pin/0 (10 ms)
[ RUN      ] gdr_copy/test_gdr_copy.gdr_copy_reg_cuda_pcie_pin_fail/0
[     INFO ] something
test_md.cc:1297: Failure
[  FAILED  ] gdr_copy/test_gdr_copy.gdr_copy_reg_cuda_pcie_pin_fail/0, where GetParam() = gdr_copy (4 ms)
[ RUN      ] gdr_copy/test_gdr_copy.gdr_copy_reg_cuda_try_pcie_pin/0
[     SKIP ] (no C2C link)
[       OK ] gdr_copy/test_gdr_copy.gdr_copy_reg_cuda_try_pcie_pin/0 (1 ms)
[ RUN      ] gdr_copy/uct_p2p_rma_test.put_short/0
[       OK ] gdr_copy/uct_p2p_rma_test.put_short/0 (100 ms)
[ RUN      ] gdr_copy/uct_p2p_rma_test.get_short/0
"""  # noqa: E501


def fake_ucx(tmp_path: Path, output: str, rc: int) -> tuple[Path, Path]:
    ucx = tmp_path / "ucx"
    (ucx / "bin").mkdir(parents=True)
    (ucx / "lib" / "ucx").mkdir(parents=True)
    (tmp_path / "out.txt").write_text(output)
    gt = ucx / "bin" / "ucx_gtest"
    gt.write_text(f"#!/bin/sh\necho \"args: $*\" > {tmp_path}/args.txt\n"
                  f"env > {tmp_path}/env.txt\ncat {tmp_path}/out.txt\nexit {rc}\n")
    gt.chmod(gt.stat().st_mode | stat.S_IXUSR)
    lib = tmp_path / "gdrlib"
    lib.mkdir()
    (lib / "libgdrapi.so.2").write_text("")
    return ucx, lib


def test_ucx_gtest_counts_and_names_failures(tmp_path: Path):
    ucx, lib = fake_ucx(tmp_path, GTEST_OUT, 1)
    r = run(["bash", str(SCRIPTS / "ucx_gtest.sh"), "--ucx", str(ucx), "--lib", str(lib),
             "--work", str(tmp_path / "w")], env=dict(os.environ, UCX_TLS="^gdr_copy"))
    assert r.returncode == 1, r.stdout + r.stderr
    last = [ln for ln in r.stdout.splitlines() if ln.startswith("ucx gtest ")]
    assert last and last[0].startswith("ucx gtest *gdr_copy*: 2 passed, 2 failed, 1 skipped of 5")
    assert "FAILED gdr_copy/test_gdr_copy.gdr_copy_reg_cuda_pcie_pin_fail/0\n" in r.stdout
    assert "FAILED gdr_copy/uct_p2p_rma_test.get_short/0 (no result" in r.stdout
    assert "--gtest_filter=*gdr_copy*" in (tmp_path / "args.txt").read_text()
    env = (tmp_path / "env.txt").read_text()
    assert "UCX_TLS=" not in env and "UCX_HANDLE_ERRORS=bt" in env
    assert f"LD_LIBRARY_PATH={lib}:{ucx}/lib" in env


def test_ucx_gtest_all_passed(tmp_path: Path):
    ok = "\n".join(ln for ln in GTEST_OUT.splitlines()
                   if "pcie_pin_fail" not in ln and "Failure" not in ln
                   and "get_short" not in ln) + "\n"
    ucx, lib = fake_ucx(tmp_path, ok, 0)
    r = run(["bash", str(SCRIPTS / "ucx_gtest.sh"), "--ucx", str(ucx), "--lib", str(lib),
             "--work", str(tmp_path / "w"), "--filter", "*gdr*"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ucx gtest *gdr*: 2 passed, 0 failed, 1 skipped of 3" in r.stdout


def test_ucx_gtest_missing_inputs(tmp_path: Path):
    r = run(["bash", str(SCRIPTS / "ucx_gtest.sh"), "--ucx", str(tmp_path)])
    assert r.returncode == 2 and "ucx_build.sh --gtest" in r.stderr
    ucx, _lib = fake_ucx(tmp_path, "", 0)
    r = run(["bash", str(SCRIPTS / "ucx_gtest.sh"), "--ucx", str(ucx), "--lib", str(tmp_path)])
    assert r.returncode == 2 and "no libgdrapi.so.2" in r.stderr
    r = run(["bash", str(SCRIPTS / "ucx_gtest.sh"), "--bogus"])
    assert r.returncode == 2


# ------------------------------------------------------------------ osu_build.sh


def test_osu_build_refuses_missing_inputs(tmp_path: Path):
    sh = ["bash", str(SCRIPTS / "osu_build.sh")]
    r = run(sh)
    assert r.returncode != 0 and "--mpi" in r.stderr
    r = run(sh + ["--mpi", str(tmp_path / "nope")])
    assert r.returncode != 0 and "no MPI at" in r.stderr
    r = run(sh + ["--mpi", str(tmp_path), "--cuda", str(tmp_path)])
    assert r.returncode != 0 and "CUDA headers" in r.stderr
    r = run(sh + ["--bogus"])
    assert r.returncode == 2
    assert "--osu-src" in run(sh + ["--help"]).stdout


# ------------------------------------------------------------------ mpi_bench.py

OSU_LAT = """
# OSU MPI-CUDA Latency Test v7.4
# Datatype: MPI_CHAR.
# Size       Avg Latency(us)
1                       1.85
8                       1.84
2048                  150.60
# a comment 5 6
"""


def test_parse_osu_and_where_ucx_came_from():
    assert mb.parse_osu(OSU_LAT) == {1: 1.85, 8: 1.84, 2048: 150.6}
    line = ("[1795915414.246316] [vm:397  :0]     ucp_context.c:2725 UCX  INFO  Version 1.22.0 "
            "(loaded from /opt/ucx/lib/libucp.so.0)")
    assert mb.ucx_loaded_from("noise\n" + line + "\n") == "/opt/ucx/lib/libucp.so.0"
    assert mb.ucx_loaded_from("nothing") is None


def test_compare_and_the_issue_checks():
    res = {"defaults": {8: 1.85, 2048: 150.6, 8192: 150.1, 32768: 150.0, 1 << 20: 300.0},
           "nogdr": {8: 153.4, 2048: 154.3, 8192: 160.4, 32768: 155.0, 1 << 20: 280.0},
           "conf": {8: 1.84, 2048: 4.09, 8192: 12.57, 32768: 24.0, 1 << 20: 295.0}}
    rows = {r["size"]: r for r in mb.compare(res, higher=False)}
    assert rows[8]["conf_ok"] and rows[2048]["conf_ok"]
    assert rows[1 << 20]["best_other"] == 280.0 and rows[1 << 20]["conf_ok"] is False
    lines = mb.report({"ompi osu_latency D D": res}, {"placement": "two ranks on GPU 0"})
    text = "\n".join(lines)
    assert "[FAIL] Open MPI osu_latency D D with conf never slower" in text and "1 MiB" in text
    assert "[PASS] Open MPI conf 2 KiB 4.09 us <= 5" in text
    assert "[FAIL] Open MPI conf 8 KiB 12.57 us <= 10" in text
    # bandwidth: higher is better
    bw = {"defaults": {8: 5.0}, "nogdr": {8: 1.0}, "conf": {8: 4.9}}
    assert mb.compare(bw, higher=True)[0]["conf_ok"] is True
    bw["conf"][8] = 4.0
    assert mb.compare(bw, higher=True)[0]["conf_ok"] is False
    mpich = mb.report({"mpich osu_latency D D": {"conf": {8: 2.9, 2048: 8.0}}}, {})
    assert any(ln.startswith("[PASS] MPICH conf 8 B 2.9 us <= 3") for ln in mpich)
    assert any(ln.startswith("[FAIL] MPICH conf 2 KiB 8.0 us <= 7.5") for ln in mpich)
    assert any(ln.startswith("[n/a] MPICH conf 8 KiB") for ln in mpich)


def test_mpi_bench_missing_inputs(tmp_path: Path, capsys):
    env_ucx = os.environ.pop("UCX_PREFIX", None)
    try:
        assert mb.main(["--work", str(tmp_path / "w")]) == 2
        assert "no UCX" in capsys.readouterr().err
        assert mb.main(["--ucx", str(tmp_path), "--work", str(tmp_path / "w")]) == 2
        assert "bin/ucx_perftest" in capsys.readouterr().err
        ucx = tmp_path / "ucx"
        (ucx / "bin").mkdir(parents=True)
        (ucx / "bin" / "ucx_perftest").write_text("")
        assert mb.main(["--ucx", str(ucx), "--work", str(tmp_path / "w")]) == 2
        assert "no Open MPI" in capsys.readouterr().err
        assert mb.main(["--ucx", str(ucx), "--ompi", str(tmp_path / "nompi"),
                        "--work", str(tmp_path / "w")]) == 2
        assert "no MPI launcher" in capsys.readouterr().err
    finally:
        if env_ucx is not None:
            os.environ["UCX_PREFIX"] = env_ucx


@pytest.mark.parametrize("script", ["ucx_gtest.sh", "osu_build.sh", "ucx_build.sh",
                                    "ucx_perftest.sh"])
def test_help(script: str):
    r = run(["bash", str(SCRIPTS / script), "--help"])
    assert r.returncode == 0 and script.split(".")[0] in r.stdout


def test_mpi_bench_help():
    r = run([sys.executable, str(SCRIPTS / "mpi_bench.py"), "--help"])
    assert r.returncode == 0 and "--bench" in r.stdout and "UCX_TLS=^gdr_copy" in r.stdout
