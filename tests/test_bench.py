"""Smoke tests of ``python -m gdrpy bench`` (gdrpy/tools/bench/).

They run the CLI in-process on the sim backend with --quick and tiny sizes and
check the JSON (rows, positive statistics, metadata), the SIM note and the
order of the output.  Timings are never asserted: the benchmarks own them.
"""

from __future__ import annotations

import json
import os
import platform
import sys

import pytest
from conftest import GPU_PRESENT

import gdrpy
from gdrpy.__main__ import main
from gdrpy.tools import bench

COPYLAT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "native", "build", "gdrpy_copylat")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("GDRPY_CACHE_DIR", str(tmp_path / "cache"))
    for v in ("GDRPY_THRESHOLD_H2D", "GDRPY_THRESHOLD_D2H", "GDRPY_COPY_ISA"):
        monkeypatch.delenv(v, raising=False)


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _load(path):
    with open(path) as f:
        return json.load(f)


def _positive_stats(row):
    assert row["error"] is None, row
    assert row["samples"] >= 1, row
    assert row["batch"] >= 1, row
    assert row["median_us"] > 0 and row["p99_us"] > 0 and row["min_us"] > 0, row
    assert row["min_us"] <= row["median_us"] <= row["p99_us"] <= row["max_us"], row


def test_parse_sizes_accepts_binary_suffixes_and_sorts():
    assert bench.parse_sizes("8,64,4K,1M") == [8, 64, 4096, 1 << 20]
    assert bench.parse_sizes("1KiB, 2kb,1k") == [1024, 2048]
    assert bench.parse_size("64MiB") == 64 << 20
    for bad in ("0", "-1", "4X", "", "1.5K"):
        with pytest.raises(ValueError):
            bench.parse_sizes(bad) if bad == "" else bench.parse_size(bad)
    assert [bench.format_size(n) for n in (1, 3072, 1 << 20, 1536)] == \
        ["1 B", "3 KiB", "1 MiB", "1536 B"]


def test_bad_size_on_the_command_line_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "latency", "--backend", "sim", "--sizes", "8,0"])
    assert e.value.code == 2
    assert "size '0' must be at least 1 byte" in capsys.readouterr().err


def test_stats_median_and_nearest_rank_p99():
    st = bench.stats(list(range(1000, 101_000, 1000)))   # 1..100 us
    assert st["n"] == 100
    assert st["median_us"] == pytest.approx(50.5)
    assert st["p99_us"] == pytest.approx(99.0)
    assert st["min_us"] == 1.0 and st["max_us"] == 100.0


def test_time_calls_batches_report_per_call_means():
    calls = []
    out: list = []
    bench.time_calls(calls.append, (1,), 7, 5, out)
    assert len(out) == 7 and len(calls) == 35
    out1: list = []
    bench.time_calls(calls.append, (1,), 4, 1, out1)
    assert len(out1) == 4 and len(calls) == 39


def test_measure_group_reports_a_failing_method_and_times_the_others():
    cfg = bench.Cfg(quick=True, iters=6, warmup=2, max_time_ns=1e7, rounds=2, min_samples=2,
                    batch=0, warmup_time_ns=1e6)
    good = bench.Op("ok", "ok", "ok", "test", "h2d", 8, fn=len, args=(b"12345678",))
    bad = bench.Op("bad", "bad", "bad", "test", "h2d", 8, fn=lambda: 1 / 0)
    bench.measure_group([bad, good], cfg)
    assert bad.error and "ZeroDivisionError" in bad.error and not bad.samples
    assert good.error is None and len(good.samples) == 6
    # a fast call is timed in batches; where the host makes even len() slow
    # (qemu-user: ~3.5 us a call) it is timed call by call, as the rule says
    from gdrpy.tools.bench.common import BATCH_BELOW_NS
    assert (good.batch >= 2) == (good.est_ns < BATCH_BELOW_NS), (good.batch, good.est_ns)


def test_latency_on_sim_prints_the_sim_note_and_writes_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GDRPY_BACKEND", "sim")      # the default backend comes from the env
    j = tmp_path / "lat.json"
    rc, out, _ = _run(["bench", "latency", "--quick", "--sizes", "8,4K", "--no-calibrate",
                       "--json", str(j)], capsys)
    assert rc == 0
    assert bench.SIM_NOTE in out
    header = out.splitlines()[0]
    for word in ("backend sim", "GPU", "driver", "copy kernel", "CPU"):
        assert word in header
    assert "timer:" in out and "empty call" in out
    doc = _load(j)
    meta = doc["meta"]
    assert doc["command"] == "latency"
    assert meta["backend"] == "sim" and meta["sim"] is True
    assert meta["copy_kernel"] == gdrpy.copy_isa()
    assert meta["timer"]["pair_median_ns"] > 0 and meta["timer"]["empty_call_median_ns"] > 0
    rows = doc["rows"]
    want = {"h2d": {"write", "put", "ce_write"}, "d2h": {"read", "get", "ce_read"}}
    for n in (8, 4096):
        for d, keys in want.items():
            got = {r["key"]: r for r in rows if r["size"] == n and r["direction"] == d}
            assert keys <= set(got), (n, d, sorted(got))
            for k in keys:
                _positive_stats(got[k])
                assert got[k]["verified"] is True
                assert got[k]["library"] == "gdrpy"
    # other libraries are never compared on sim
    assert {s["library"] for s in doc["skipped"]} == {"cuda-python", "cupy", "torch"}
    assert not any(r["library"] in ("cuda-python", "cupy", "torch") for r in rows)
    # the short summary comes last, after the JSON note
    assert out.rindex("summary d2h") > out.index("JSON written to")
    assert out.rstrip().splitlines()[-1].startswith("4 KiB")


@pytest.mark.skipif(not os.access(COPYLAT, os.X_OK),
                    reason="native/build/gdrpy_copylat not built (make -C native bench)")
def test_latency_with_c_merges_the_c_rows(tmp_path, capsys):
    j = tmp_path / "lat.json"
    rc, out, _ = _run(["bench", "latency", "--backend", "sim", "--quick", "--sizes", "8,4K",
                       "--no-calibrate", "--c", "--copylat", COPYLAT, "--json", str(j)], capsys)
    assert rc == 0
    assert "C benchmark: gdrpy_copylat" in out
    doc = _load(j)
    c = [r for r in doc["rows"] if r["library"] == "C"]
    keys = {(r["direction"], r["key"], r["size"]) for r in c}
    for n in (8, 4096):
        for d in ("h2d", "d2h"):
            assert (d, "c_kernel", n) in keys and (d, "c_cumemcpy", n) in keys
    assert ("h2d", "c_kernel_rb", 8) in keys
    if platform.machine() == "x86_64":   # the raw reference loops are AVX loops
        assert ("h2d", "c_raw", 4096) in keys
    for r in c:
        # x86's TSC always sees a copy; a coarse counter (aarch64 CNTVCT, 25 MHz
        # on some hosts, 62.5 MHz under qemu) may round a short one to 0.
        assert r["median_us"] >= 0 and r["p99_us"] >= r["median_us"]
        if platform.machine() == "x86_64":
            assert r["median_us"] > 0
    assert doc["c_benchmark"]["returncode"] == 0
    assert doc["c_benchmark"]["json"]["backend"] == "sim"


def test_latency_c_flag_without_the_binary_says_how_to_build_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench.native, "_copylat_path", lambda explicit: None)
    rc, out, _ = _run(["bench", "latency", "--backend", "sim", "--quick", "--sizes", "8",
                       "--no-calibrate", "--c"], capsys)
    assert rc == 0
    assert "make -C native bench" in out


def test_bandwidth_on_sim_reports_gbps(tmp_path, capsys):
    j = tmp_path / "bw.json"
    rc, out, _ = _run(["bench", "bandwidth", "--backend", "sim", "--quick",
                       "--sizes", "64K,256K", "--json", str(j)], capsys)
    assert rc == 0
    assert bench.SIM_NOTE in out
    doc = _load(j)
    rows = doc["rows"]
    for n in (65536, 262144):
        for d, keys in (("h2d", ("write", "ce_write")), ("d2h", ("read", "ce_read"))):
            for k in keys:
                (r,) = [r for r in rows if (r["size"], r["direction"], r["key"]) == (n, d, k)]
                _positive_stats(r)
                assert r["gbps_median"] > 0
    assert "Mapping/ce" in out
    assert out.rindex("summary d2h") > out.index("JSON written to")


def test_transfer_on_sim_interleaves_variants_and_reports_regret(tmp_path, capsys):
    j = tmp_path / "tr.json"
    rc, out, _ = _run(["bench", "transfer", "--backend", "sim", "--quick", "--sizes", "1,4K,64K",
                       "--calibrate-budget", "0.3", "--json", str(j)], capsys)
    assert rc == 0
    assert bench.SIM_NOTE in out
    assert "default picker:" in out
    doc = _load(j)
    picker = doc["meta"]["picker"]
    assert set(picker["thresholds"]) == {"h2d", "d2h"}
    assert all(s != "default" for s in picker["sources"].values())  # calibrated (now or before)
    rows = doc["rows"]
    for d in ("h2d", "d2h"):
        for n in (1, 4096, 65536):
            got = {r["variant"]: r for r in rows if (r["direction"], r["size"]) == (d, n)}
            assert set(got) == {"auto", "mapping", "ce"}
            for r in got.values():
                _positive_stats(r)
                assert r["verified"] is True
            # interleaved: every variant gets the same number of samples and the same B
            assert len({r["samples"] for r in got.values()}) == 1
            assert len({r["batch"] for r in got.values()}) == 1
            assert got["auto"]["path"] in ("mapping", "ce")
    assert len(doc["regret"]) == 6
    for g in doc["regret"]:
        assert g["regret"] == pytest.approx(
            g["auto_median_us"] / min(g["mapping_median_us"], g["ce_median_us"]) - 1)
    s = doc["summary"]
    assert s["measured"] == 6 and isinstance(s["within_5pct"], bool)
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("worst regret:") and "every size within 5%:" in last


def test_transfer_no_calibrate_keeps_the_picker_as_it_is(tmp_path, capsys, monkeypatch):
    import gdrpy.threshold.context as gtc
    monkeypatch.setattr(gtc, "_pickers", {})          # a fresh default picker for this test
    j = tmp_path / "tr.json"
    rc, out, _ = _run(["bench", "transfer", "--backend", "sim", "--quick", "--sizes", "8",
                       "--no-calibrate", "--json", str(j)], capsys)
    assert rc == 0
    picker = _load(j)["meta"]["picker"]
    assert picker["calibrated_now"] is False
    assert picker["sources"] == {"h2d": "default", "d2h": "default"}
    assert "--no-calibrate" in out


def test_plot_is_written_or_skipped_with_a_note(tmp_path, capsys, monkeypatch):
    png = tmp_path / "lat.png"
    argv = ["bench", "latency", "--backend", "sim", "--quick", "--sizes", "8,64",
            "--no-calibrate", "--plot", str(png)]
    try:
        import matplotlib  # noqa: F401
        have = True
    except ImportError:
        have = False
    if have:
        rc, out, _ = _run(argv, capsys)
        assert rc == 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        png.unlink()
    for name in ["matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"] + [
            m for m in list(sys.modules) if m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)        # as if it were not installed
    rc, out, err = _run(argv, capsys)
    assert rc == 0
    assert "matplotlib is not installed" in err
    assert not png.exists()


def test_pingpong_subcommand_without_the_module_fails_clearly(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "gdrpy.tools.pingpong", None)
    rc = main(["bench", "pingpong", "--iters", "3"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "pingpong" in err and "unavailable" in err


@pytest.mark.skipif(GPU_PRESENT, reason="checks the message shown where no GPU exists")
def test_no_gpu_backend_points_at_sim(capsys, monkeypatch):
    monkeypatch.delenv("GDRPY_BACKEND", raising=False)
    rc = main(["bench", "latency", "--quick", "--sizes", "8"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "--backend sim" in err


@pytest.mark.gpu
def test_latency_on_gpu_compares_with_the_importable_libraries(tmp_path, capsys):
    import importlib.util
    j = tmp_path / "lat.json"
    rc, out, _ = _run(["bench", "latency", "--backend", "nvrm", "--quick", "--sizes", "8,4K",
                       "--json", str(j)], capsys)
    assert rc == 0
    assert bench.SIM_NOTE not in out
    doc = _load(j)
    assert doc["meta"]["sim"] is False
    libs = {"cuda-python": "cuda.bindings", "cupy": "cupy", "torch": "torch"}
    skipped = {s["library"]: s["reason"] for s in doc["skipped"]}
    for lib, mod in libs.items():
        if importlib.util.find_spec(mod.split(".")[0]) is None:
            assert lib in skipped
            continue
        rows = [r for r in doc["rows"] if r["library"] == lib]
        assert {(r["direction"], r["size"]) for r in rows} == \
            {(d, n) for d in ("h2d", "d2h") for n in (8, 4096)}, (lib, skipped.get(lib))
        for r in rows:
            _positive_stats(r)
            assert r["verified"] is True, r
    for r in doc["rows"]:
        if r["library"] == "gdrpy":
            _positive_stats(r)
            assert r["verified"] is True, r
