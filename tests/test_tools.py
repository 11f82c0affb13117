"""The tools' shared helpers and command-line conventions: one size parser and
formatter, one percentile rule, help text on every option, TTY-aware progress."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys

import pytest

from gdrpy.__main__ import build_parser
from gdrpy._sizes import format_size, parse_size, parse_sizes
from gdrpy.tools import stats
from gdrpy.tools.progress import progress_bar


@pytest.mark.parametrize("text, n", [
    ("8", 8), ("8B", 8), ("4K", 4096), ("4k", 4096), ("4KB", 4096), ("4KiB", 4096),
    ("4 kib", 4096), ("1M", 1 << 20), ("64MiB", 64 << 20), ("2G", 2 << 30), (4096, 4096),
])
def test_parse_size_units_are_binary(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "K", "4X", "4.5K", "-1", "4 K B", "lots"])
def test_parse_size_rejects_what_is_not_a_size(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_parse_size_minimum_and_lists():
    with pytest.raises(ValueError, match="at least 1 byte"):
        parse_size("0")
    assert parse_size("0", minimum=0) == 0
    assert parse_sizes("4K, 8,4096 ,1M") == [8, 4096, 1 << 20]
    with pytest.raises(ValueError, match="no sizes"):
        parse_sizes(" , ")


def test_format_size_round_trips_through_parse_size():
    for n in (1, 8, 1000, 1536, 4096, 3 << 20, 5 << 30, (1 << 20) + 1):
        assert parse_size(format_size(n)) == n
    assert [format_size(n) for n in (1, 4096, 1536, 3 << 20)] == \
        ["1 B", "4 KiB", "1536 B", "3 MiB"]


def test_percentiles_are_nearest_rank_everywhere():
    s = list(range(1, 101))                    # 1..100
    assert stats.percentile(s, 99) == 99 and stats.percentile(s, 99.9) == 100
    assert stats.percentile(s, 90) == 90 and stats.percentile(s, 100) == 100
    assert stats.percentile([5.0], 99) == 5.0
    assert stats.median([1, 2, 3, 4]) == 2.5 and stats.median([1, 2, 3]) == 2
    st = stats.summarize([x * 1000 for x in s], scale=1e3)
    assert (st["n"], st["median"], st["p90"], st["p99"], st["p99.9"], st["min"], st["max"]) \
        == (100, 50.5, 90, 99, 100, 1, 100)
    assert st["mean"] == pytest.approx(50.5)
    assert stats.summarize([]) == {"n": 0}
    # bench's stats and pingpong's summarize report the same p99 for the same samples
    from gdrpy.tools import bench, pingpong
    samples = [float(x) for x in range(1000, 201_000, 1000)]
    assert bench.stats(samples)["p99_us"] == pingpong.summarize(samples)["p99"]
    with pytest.raises(ValueError):
        stats.percentile(s, 0)


def _walk(parser: argparse.ArgumentParser, path: str):
    for act in parser._actions:
        if isinstance(act, argparse._SubParsersAction):
            for name, sub in act.choices.items():
                yield from _walk(sub, f"{path} {name}")
        elif act.option_strings:
            yield path, act


def test_every_option_of_every_command_has_help():
    missing = [f"{path} {act.option_strings[0]}" for path, act in _walk(build_parser(), "gdrpy")
               if not act.help or act.help == argparse.SUPPRESS]
    assert not missing, f"options without help text: {missing}"
    paths = {p for p, _ in _walk(build_parser(), "gdrpy")}
    assert {"gdrpy info", "gdrpy calibrate", "gdrpy bench latency", "gdrpy bench pingpong"} \
        <= paths


def test_common_options_are_spelled_alike_across_commands():
    by_cmd: dict[str, set[str]] = {}
    for path, act in _walk(build_parser(), "gdrpy"):
        by_cmd.setdefault(path, set()).update(act.option_strings)
    for cmd in ("gdrpy bench latency", "gdrpy bench bandwidth", "gdrpy bench transfer",
                "gdrpy bench pingpong"):
        assert {"--device", "--backend", "--sizes", "--iters", "--warmup", "--json",
                "--plot", "--quick"} <= by_cmd[cmd], cmd
    assert {"--device", "--backend"} <= by_cmd["gdrpy calibrate"]


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# every installed C tool: one per native/tools/*.c (setup.py ships them all)
C_TOOLS = sorted(n[:-2] for n in os.listdir(os.path.join(ROOT, "native", "tools"))
                 if n.endswith(".c"))


@pytest.mark.parametrize("tool", C_TOOLS)
def test_every_c_tool_answers_help_and_refuses_an_unknown_option(tool):
    """`TOOL --help` and `-h` print the usage on stdout and exit 0 (nothing
    else runs: no device is opened); an unknown option is a usage error."""
    path = os.path.join(ROOT, "native", "build", tool)
    if not os.access(path, os.X_OK):
        pytest.skip(f"native/build/{tool} not built (make -C native tools)")
    env = dict(os.environ, GDRPY_BACKEND="sim")
    for flag in ("--help", "-h"):
        r = subprocess.run([path, flag], capture_output=True, text=True, timeout=30, env=env)
        assert (r.returncode, r.stderr) == (0, ""), (flag, r.returncode, r.stderr)
        assert r.stdout.startswith(f"usage: {tool}") and "--help" in r.stdout, r.stdout
    r = subprocess.run([path, "--no-such-option"], capture_output=True, text=True, timeout=30,
                       env=env)
    assert r.returncode != 0 and r.stderr and not r.stdout, (r.returncode, r.stdout, r.stderr)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_into_a_pipe_is_plain_lines():
    out = io.StringIO()
    p = progress_bar("calibrating", out)
    for i in range(101):
        p(i / 100, f"step {i}")
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0].startswith("calibrating:   0%") and lines[-1].startswith("calibrating: 100%")
    assert 3 <= len(lines) <= 6, lines


def test_progress_on_a_terminal_draws_a_bar():
    pytest.importorskip("tqdm")
    out = _Tty()
    p = progress_bar("calibrating", out)
    for i in range(11):
        p(i / 10, f"step {i}")
    text = out.getvalue()
    assert "\r" in text and "100.0%" in text and text.endswith("\n")


def test_before_after_table_takes_medians_of_round_medians_and_pairs_rounds(tmp_path):
    """scripts/before_after_table.py: per row the median over rounds of each
    round's median and p99, the paired per-round difference, GB/s of the
    bandwidth rows; Python rows come from before_after_py.py's JSON line."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "before_after_table", os.path.join(ROOT, "scripts", "before_after_table.py"))
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # (tree, round): C gdrpy_write 8 B median/p99, bw write 1 MiB median, py put median/p99
    runs = {("old", 1): (100.0, 150.0, 50000.0, 90.0, 200.0),
            ("new", 1): (110.0, 130.0, 40000.0, 99.0, 180.0),
            ("old", 2): (120.0, 170.0, 52000.0, 100.0, 220.0),
            ("new", 2): (126.0, 150.0, 41000.0, 105.0, 190.0),
            ("old", 3): (80.0, 110.0, 51000.0, 80.0, 210.0),
            ("new", 3): (76.0, 100.0, 39000.0, 84.0, 170.0)}
    log = tmp_path / "ba.log"
    with open(log, "w") as f:
        f.write("# META backend=sim\n")
        for (tree, rnd), (w, w99, bw, py, py99) in runs.items():
            f.write(f"=== round {rnd} {tree} py\n")
            f.write(json.dumps({"tree": tree, "rows": {"py Transfer.put 8": [py, py99]}}) + "\n")
            f.write(f"=== round {rnd} {tree} apilat\n# latency: ...\n")
            f.write("method                          bytes      B  median_ns     p99_ns\n")
            f.write(f"gdrpy_write                         8     42      {w}       {w99}\n")
            f.write(f"bw gdrpy_write                1048576      1   {bw}   {bw * 2}\n")
    data, order, meta = mod.parse(str(log))
    assert meta == {"backend": "sim"}
    assert order == ["py Transfer.put 8", "C gdrpy_write 8", "C bw gdrpy_write 1048576"]
    rows = {r["row"]: r for r in mod.summarize(data, order)}
    w = rows["C gdrpy_write 8"]
    assert (w["old_ns"], w["old_p99_ns"], w["new_ns"], w["new_p99_ns"]) == (100, 150, 110, 130)
    assert w["diff_pct"] == pytest.approx(10.0)
    assert w["paired_pct"] == pytest.approx(5.0)       # +10, +5, -5
    assert (w["new_slower"], w["rounds"]) == (2, 3)
    bw = rows["C bw gdrpy_write 1048576"]
    assert bw["old_gbps"] == pytest.approx(1048576 / 51000)
    assert bw["new_gbps"] == pytest.approx(1048576 / 40000)
    py = rows["py Transfer.put 8"]
    assert (py["old_ns"], py["new_ns"], py["old_p99_ns"]) == (90, 99, 210)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "before_after_table.py"),
                          str(log)], capture_output=True, text=True, check=True).stdout
    assert "C bw gdrpy_write 1048576" in out and "20.56 -> 26.21" in out, out


def test_suite_summary_lists_steps_and_puts_gdrcopy_pplat_beside_the_channel(tmp_path):
    # scripts/summarize.py: failed and skipped steps and every step's time
    # (steps.log); GDRCopy's pplat lines (scripts/gdrcopy_tests.sh, in
    # gdrcopy_tests.log) in the ping-pong section: the median of each run,
    # what it measured, and a run without a result as such
    script = os.path.join(ROOT, "scripts", "summarize.py")

    def summarize() -> str:
        return subprocess.run([sys.executable, script, str(tmp_path)], capture_output=True,
                              text=True, check=True).stdout

    (tmp_path / "steps.log").write_text(
        "stages: test; budget 560 s\n=== build: bash -c make\n=== build: rc=0 in 80 s\n"
        "=== pytest: python3 -m pytest\n=== pytest: rc=1 in 170 s\n"
        "=== mpi_eager: skipped: 12 s of the suite's 560 s left\n")
    (tmp_path / "pingpong.json").write_text(json.dumps({
        "sizes": [4], "results": [{"size": 4, "path": "c", "stats_us": {"median": 1.5, "p99": 2}}],
        "summary": {}}))
    (tmp_path / "gdrcopy_tests.log").write_text(
        "built gdrcopy_pplat\n"
        "gdrcopy_sanity: Total: 30, Passed: 30, Failed: 0, Waived: 0\n"
        "gdrcopy_pplat -a cuMemAlloc: exit 0: Round-trip latency per iteration is (min) 1.40457,"
        " (median) 1.40984 us\n"
        "gdrcopy_pplat -a cuMemAlloc -s 4 -B 1: exit 0: Round-trip latency per iteration is "
        "(min) 2.53757, (median) 2.54036 us\n"
        "gdrcopy_pplat -a cuMemCreate: exit 124: \n")
    out = summarize()
    assert "steps: 2 run, 2 failed or skipped" in out, out
    assert "FAILED pytest: rc=1 in 170 s" in out and "FAILED mpi_eager: skipped" in out, out
    assert "seconds: build 80, pytest 170 (total 250)" in out, out
    assert "GDRCopy pplat -a cuMemAlloc (flag only), same run: 1.410 us" in out, out
    assert ("GDRCopy pplat -a cuMemAlloc -s 4 -B 1 (4 B data + flag), same run: 2.540 us"
            in out), out
    assert "GDRCopy pplat -a cuMemCreate (flag only), same run: no result (exit 124)" in out, out
    assert "GDRCopy's sanity on libgdrapi.so.2: Total: 30, Passed: 30, Failed: 0" in out, out
    # without the ping-pong's numbers the pplat lines are still there
    (tmp_path / "pingpong.json").unlink()
    out = summarize()
    assert "GDRCopy pplat -a cuMemAlloc (flag only), same run: 1.410 us" in out, out


def test_gpu_suite_lists_its_stages_and_refuses_an_unknown_one_before_building():
    suite = os.path.join(ROOT, "scripts", "gpu_suite.sh")
    r = subprocess.run(["bash", suite, "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("gdrpy's GPU suite"), r.stdout
    for stage in ("test", "bench", "examples", "beforeafter"):
        assert f"\n  {stage} " in r.stdout, stage
    r = subprocess.run(["bash", suite, "test", "nosuchstage"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and "unknown stage nosuchstage" in r.stdout, r.stdout + r.stderr
