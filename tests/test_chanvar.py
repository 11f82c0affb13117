"""gdrpy_chanpp --variants (the channel protocol's variant matrix) on sim,
and every kernel variant through nvcc where nvcc exists."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from gdrpy.tools.chanvar import KERNEL_FILE, list_variants
from gdrpy.tools.pingpong import chanpp_path

TOOL = chanpp_path()
pytestmark = pytest.mark.skipif(TOOL is None, reason="native/build/gdrpy_chanpp not built")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TOOL, "--variants", "--sim", "--iters", "400", "--rounds", "2",
                           "--warmup", "10", *args], capture_output=True, text=True, timeout=120)


def _rows(out: str) -> dict[str, str]:
    rows = {}
    for line in out.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            rows[r["variant"]] = r["check"]
    return rows


def test_list_variants():
    vs = list_variants(TOOL)
    names = [v[0] for v in vs]
    assert len(names) == len(set(names)) >= 8
    assert {"library", "floor-flag", "floor-data", "lib-like"} <= set(names)
    for _name, macros, order, _what in vs:
        assert order in ("model", "empirical")
        assert all(m.startswith("-DVAR_") for m in macros) or (
            macros[0] == "@channel_kernels.cu"
            and all(m.startswith("-D") for m in macros[1:]))


def test_sim_all_pass():
    p = _run()
    assert p.returncode == 0, p.stdout + p.stderr
    rows = _rows(p.stdout)
    assert set(rows) == {v[0] for v in list_variants(TOOL)}
    assert set(rows.values()) == {"PASS"}, rows
    assert f"SUMMARY chanperf: {len(rows)} variants, all passed" in p.stdout


def test_sim_stale_payload_fails():
    # the stand-in answers every 997th message from a stale payload: only
    # those variants fail, the table is still printed, the exit status is 1
    p = _run("--iters", "3000", "--only", "lib-like,pub-LL,floor-data",
             "--sim-corrupt", "pub-LL,floor-data")
    assert p.returncode == 1, p.stdout + p.stderr
    rows = _rows(p.stdout)
    assert rows["lib-like"] == "PASS"
    assert rows["pub-LL"].startswith("FAIL host ")
    assert rows["floor-data"].startswith("FAIL host ")
    assert "SOME FAILED" in p.stdout


def test_bad_option():
    p = subprocess.run([TOOL, "--variants", "--bogus", "1"], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 2 and "unknown option" in p.stderr


NVCC = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",
                                                  "/usr/local/cuda-13.0/bin/nvcc")
                                     if os.access(p, os.X_OK)), None)


# nvcc is a third-party tool: it does not run with the sanitizer runtime that
# the sanitizer stage preloads into the test processes.
_TOOL_ENV = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_every_variant_compiles_for_sm90(tmp_path):
    src = os.path.join(os.path.dirname(__import__("gdrpy.tools", fromlist=["x"]).__file__),
                       KERNEL_FILE)
    here = os.path.dirname(src)
    inc = os.path.join(os.path.dirname(os.path.dirname(here)), "native", "include")
    for name, macros, _order, _what in list_variants(TOOL):
        if macros[0].startswith("@"):   # the library's kernels, with the variant's macros
            src = os.path.join(here, macros[0][1:])
            macros = [f"-I{inc}", *macros[1:]]
        else:
            src = os.path.join(here, KERNEL_FILE)
        out = tmp_path / f"{name}.cubin"
        p = subprocess.run([NVCC, "-cubin", "-arch=sm_90", *macros, "-o", str(out), src],
                           capture_output=True, text=True, timeout=300, env=_TOOL_ENV)
        assert p.returncode == 0 and out.stat().st_size > 0, f"{name}: {p.stderr}"


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("macro", ["-DGDRPY_PP_ROUNDS", "-DGDRPY_PP_AB", "-DGDRPY_PP_RSTAMPS"])
def test_library_kernel_diagnostics_compile_for_sm90(tmp_path, macro):
    """The serving kernel's diagnostic builds that no variant row uses:
    -DGDRPY_PP_ROUNDS (`gdrpy_chanpp --kernel-rounds`), -DGDRPY_PP_AB
    (`gdrpy_chanpp --ab-answer`, the in-place A/B) and -DGDRPY_PP_RSTAMPS
    (`gdrpy_chanpp --timeline`, the kernel's columns)."""
    here = os.path.dirname(__import__("gdrpy.tools", fromlist=["x"]).__file__)
    inc = os.path.join(os.path.dirname(os.path.dirname(here)), "native", "include")
    out = tmp_path / "diag.cubin"
    p = subprocess.run([NVCC, "-cubin", "-arch=sm_90", f"-I{inc}", macro, "-o",
                        str(out), os.path.join(here, "channel_kernels.cu")],
                       capture_output=True, text=True, timeout=300, env=_TOOL_ENV)
    assert p.returncode == 0 and out.stat().st_size > 0, p.stderr


def test_timeline_on_sim_takes_batches_apart():
    """`gdrpy_chanpp --timeline` on sim: every batch's answers checked (exit
    status 0), the host's columns there and in the order the completions
    are taken, no kernel columns (the stand-in leaves no stamps)."""
    p = subprocess.run([TOOL, "--sim", "--sizes", "32", "--iters", "300", "--timeline"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [json.loads(x) for x in p.stdout.splitlines() if '"path": "timeline"' in x]
    assert len(lines) == 1, p.stdout
    t = lines[0]
    assert (t["size"], t["batch"], t["batches"], t["kernel_batches"]) == (32, 32, 100, 0)
    assert "A_end" not in t and "B_end" not in t
    for col in ("send", "comp0", "c1-c0", "c2-c0", "c8-c0", "c16-c0", "clast-c0", "recv_all",
                "jump_clast-c1"):
        p10, med, p90 = t[col]
        assert 0 <= p10 <= med <= p90, (col, t[col])
    # completion 0 comes after the send returned; later completions after earlier ones
    assert t["comp0"][1] >= t["send"][1]
    order = [t[c][1] for c in ("c1-c0", "c2-c0", "c8-c0", "c16-c0", "clast-c0")]
    assert order == sorted(order), order


def test_timeline_kernel_columns_on_made_up_stamps():
    """The kernel columns' arithmetic (`gdrpy_chanpp --timeline-selftest`):
    made-up rounds give the expected ns; a batch with a round's entry
    missing, or overwritten by a round 4096 messages later, gives none."""
    p = subprocess.run([TOOL, "--timeline-selftest"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and "timeline selftest: ok" in p.stdout, p.stdout + p.stderr
