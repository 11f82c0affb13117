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


def test_before_after_own_cost_cancels_the_process_level(tmp_path):
    """scripts/before_after_table.py: libgdrapi's own cost is taken within each
    round's process, so a process whose every BAR1 row is slower does not count."""
    import importlib.util
    import os
    spec = importlib.util.spec_from_file_location(
        "before_after_table",
        os.path.join(os.path.dirname(__file__), "..", "scripts", "before_after_table.py"))
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = {("old", 1): (130.0, 129.0), ("new", 1): (121.0, 120.0),
            ("old", 2): (110.0, 111.0), ("new", 2): (175.0, 158.0)}
    log = tmp_path / "ba.log"
    with open(log, "w") as f:
        for (tree, rnd), (lib, bare) in rows.items():
            f.write(f"=== round {rnd} {tree} apilat\n")
            f.write(f"gdr_copy_to_mapping                 8    202      {lib}       6.4\n")
            f.write(f"copy_to_mapping (gdr map)           8    256      {bare}       5.0\n")
    data, _order, _opens, _meta = mod.parse(str(log))
    (own,) = mod.own_cost(data)
    assert own["size"] == 8 and own["rounds"] == 2
    assert own["old_ns"] == pytest.approx(0.0)       # (+1, -1)
    assert own["new_ns"] == pytest.approx(9.0)       # (+1, +17)
    assert own["new_pct"] == pytest.approx((1 / 120 + 17 / 158) / 2 * 100)


@pytest.mark.parametrize("script, args", [
    ("staging_plans.py", ["--plans", "nt/nt/1M/4/2,wc/ntevict/1M/4/2/ppt=1/dry=nocopy",
                          "--rounds", "2"]),
    ("staging_sweep.py", ["--threads", "1,2", "--chunks", "1M", "--depths", "4"]),
])
def test_staging_diagnostics_run_on_sim(script, args):
    """The staging diagnostics (scripts/staging_*.py, on their shared helper
    scripts/staging_bench.py) run end to end on sim and print every row."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, os.path.join(root, "scripts", script), "--backend", "sim",
                        "--sizes", "1M,2M", "--reps", "2", *args],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=root))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.count("pinned ") >= 2          # a reference row per size
    if script == "staging_plans.py":
        assert "median round per cell" in r.stdout
        assert "wc/ntevict/1M/4/2/ppt=1/dry=nocopy" in r.stdout
    else:
        assert "best get 2 MiB" in r.stdout


def test_suite_summary_puts_gdrcopy_pplat_beside_the_channel(tmp_path):
    # scripts/summarize.py reads scripts/gdrcopy_tests.sh's pplat lines
    # (channel_pplat.log) into the ping-pong section: the median of each run,
    # what it measured, and a run without a result as such
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "scripts", "summarize.py")

    def summarize() -> str:
        return subprocess.run([sys.executable, script, str(tmp_path)], capture_output=True,
                              text=True, check=True).stdout

    (tmp_path / "pingpong.json").write_text(json.dumps({
        "sizes": [4], "results": [{"size": 4, "path": "c", "stats_us": {"median": 1.5, "p99": 2}}],
        "summary": {}}))
    (tmp_path / "channel_pplat.log").write_text(
        "built gdrcopy_pplat\n"
        "gdrcopy_pplat -a cuMemAlloc: exit 0: Round-trip latency per iteration is (min) 1.40457,"
        " (median) 1.40984 us\n"
        "gdrcopy_pplat -a cuMemAlloc -s 4 -B 1: exit 0: Round-trip latency per iteration is "
        "(min) 2.53757, (median) 2.54036 us\n"
        "gdrcopy_pplat -a cuMemCreate: exit 124: \n")
    out = summarize()
    assert "GDRCopy pplat -a cuMemAlloc (flag only), same run: 1.410 us" in out, out
    assert ("GDRCopy pplat -a cuMemAlloc -s 4 -B 1 (4 B data + flag), same run: 2.540 us"
            in out), out
    assert "GDRCopy pplat -a cuMemCreate (flag only), same run: no result (exit 124)" in out, out
    # without the ping-pong's numbers the pplat lines are still there
    (tmp_path / "pingpong.json").unlink()
    out = summarize()
    assert "GDRCopy pplat -a cuMemAlloc (flag only), same run: 1.410 us" in out, out
