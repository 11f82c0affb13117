"""The asv suite (asv_bench/) is healthy: asv discovers and checks it, runs it
on the sim backend, and skips (does not fail) GPU benchmarks where no GPU
backend opens.  Skipped where asv is not installed (pip install asv; it is in
the `test` and `bench` extras).  Results go to a temporary directory: the
configuration is copied there with absolute paths."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import GPU_PRESENT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASV_DIR = os.path.join(ROOT, "asv_bench")

pytestmark = pytest.mark.skipif(importlib.util.find_spec("asv") is None,
                                reason="asv is not installed (pip install asv)")


def _load_conf(path):
    """asv.conf.json allows // comments (asv strips them); so do we."""
    with open(path) as f:
        text = "\n".join(line for line in f.read().splitlines()
                         if not line.lstrip().startswith("//"))
    return json.loads(text)


@pytest.fixture
def asv(tmp_path):
    conf = _load_conf(os.path.join(ASV_DIR, "asv.conf.json"))
    assert conf["environment_type"] == "existing"
    assert conf["repo"] == ".." and conf["branches"] == ["main"]
    for key in ("results_dir", "html_dir", "env_dir"):
        assert conf[key].startswith(".asv/"), (key, conf[key])   # ignored by git
    conf.update(repo=ROOT, benchmark_dir=os.path.join(ASV_DIR, conf["benchmark_dir"]),
                results_dir=str(tmp_path / "results"), html_dir=str(tmp_path / "html"),
                env_dir=str(tmp_path / "env"))
    cpath = tmp_path / "asv.conf.json"
    cpath.write_text(json.dumps(conf))
    env = dict(os.environ, HOME=str(tmp_path), GDRPY_CACHE_DIR=str(tmp_path / "cache"),
               GDRPY_BENCH_SAMPLES="5", GDRPY_BENCH_MAX_TIME="0.01")
    env.pop("GDRPY_BENCH_BACKEND", None)

    def run(*args, backend=None, timeout=300):
        e = dict(env)
        if backend:
            e["GDRPY_BENCH_BACKEND"] = backend
        p = subprocess.run([sys.executable, "-m", "asv", *args, "--config", str(cpath)],
                           cwd=str(tmp_path), env=e, capture_output=True, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout + p.stderr

    rc, out = run("machine", "--yes")
    assert rc == 0, out
    return run


def test_asv_check_finds_no_problems(asv):
    rc, out = asv("check", "--python=same")
    assert rc == 0, out
    assert "No problems found" in out


def test_asv_quick_run_on_sim_measures_every_kind_of_benchmark(asv):
    # one benchmark of each module/kind: every size of one, every picker of the
    # Transfer one at one size (asv matches -b against "name(params)"; the whole
    # suite would take ~20 s)
    rc, out = asv("run", "--python=same", "--quick", "--dry-run", "--show-stderr",
                  "-b", r"track_write_us|track_put_us\(65536, |track_write_gbps|track_pin_map_us",
                  backend="sim")
    assert rc == 0, out
    for name in ("latency.MappingLatency.track_write_us", "latency.TransferLatency.track_put_us",
                 "bandwidth.Bandwidth.track_write_gbps", "pinmap.PinMap.track_pin_map_us"):
        assert re.search(re.escape(name) + r"\s+ok", out), (name, out[-3000:])
    assert "failed" not in out.lower(), out[-3000:]
    # sim runs all that was asked: the Transfer table's 64 KiB row has a number
    # per picker, and its other rows (not asked for) are the only "n/a"
    put = out.split("TransferLatency.track_put_us", 1)[1].split("pinmap.PinMap", 1)[0]
    rest = out.replace(put, "")
    assert re.search(r"\n\s*65536\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s*\n", put), put
    assert "n/a" not in rest, out[-3000:]


def test_asv_skips_gpu_benchmarks_where_no_gpu_backend_opens(asv):
    rc, out = asv("run", "--python=same", "--quick", "--dry-run", "-b", r"PinMap.track_pin_map")
    assert rc == 0, out
    assert "failed" not in out.lower(), out[-3000:]
    if not GPU_PRESENT:
        assert "n/a" in out, out[-3000:]        # NotImplementedError in setup: skipped
