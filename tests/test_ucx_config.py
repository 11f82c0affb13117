"""gdrpy/tools/ucx_config.py (`python -m gdrpy ucx-config`): the choosing rule on
recorded measurements, the ucx.conf section and its merge into a file, the parsers
of the tools' outputs, and the command's refusals.  No GPU or UCX needed; one test
reads the section back with a real UCX when $UCX_PREFIX names one."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gdrpy.tools import ucx_config as uc

# The H200's reads through BAR1 (gdr_copy_from_mapping), median us by size.
BAR1_GET = {8: 0.45, 64: 0.6, 1024: 1.42, 2048: 3.14, 4096: 5.33, 8192: 9.32, 16384: 17.8,
            32768: 34.2, 65536: 67.8, 262144: 287.0, 1 << 20: 1145.0, 4 << 20: 4600.0}


def copy_rows(get: dict[int, float] | None = None) -> list[dict[str, float]]:
    get = get or BAR1_GET
    return [{"size": s, "get_us": g, "put_us": 0.35 + s / 6900.0,
             "htod_us": 7.0 + s / 40000.0, "dtoh_us": 7.0 + s / 40000.0}
            for s, g in sorted(get.items())]


def eager_us(n: int, payload: int, get=lambda n: 0.4 + n / 900.0) -> float:
    """One-way eager time of n bytes in fragments of `payload` bytes, each read
    with one gdr_copy get and written with one put."""
    frags = max(1, math.ceil(n / payload))
    each = min(n, payload)
    return 1.8 + frags * (get(each) + 0.35 + each / 6900.0)


def rndv_us(n: int, base: float = 150.0) -> float:
    return base + n / 20000.0


SIZES = list(uc.SIZES)


def measurements(variants: dict[str, dict] | None = None, rows=None) -> dict:
    if variants is None:
        variants = {
            "eager": {"kind": "eager", "default": True, "setting": {},
                      "us": {s: eager_us(s, 8192) for s in SIZES}},
            "rndv": {"kind": "rndv", "default": True, "setting": {},
                     "us": {s: rndv_us(s) for s in SIZES if s >= 1024}},
        }
    return {"schema": uc.SCHEMA, "when": "2026-11-29 12:00 UTC", "gdrpy": "0.test",
            "host": {"hostname": "h", "gpu": "NVIDIA H200", "driver": "580.159.04", "device": 0,
                     "cpu_vendor": "Intel", "cpu_model": "unknown",
                     "product_name": "Test Box [v2]*"},
            "copy": {"rows": copy_rows() if rows is None else rows},
            "ucx": {"version": "1.22.0", "test": "tag_lat", "variants": variants}}


# ---------------------------------------------------------------- the rule


def test_crossover_of_two_lines_is_exact():
    e = {s: 2 + s / 1000 for s in SIZES}
    r = {s: 150 + s / 10000 for s in SIZES}
    t, how = uc.crossover(e, r)
    # 2 + n/1000 = 150 + n/10000  ->  n = 148 / 0.0009
    assert t == math.ceil(148 / 0.0009), how
    assert 65536 < t <= 262144


def test_crossover_needs_rendezvous_faster_at_every_larger_size():
    e = {1024: 5.0, 4096: 20.0, 16384: 30.0, 65536: 40.0}
    r = {1024: 10.0, 4096: 10.0, 16384: 35.0, 65536: 30.0}   # a dip at 4 KiB only
    t, _ = uc.crossover(e, r)
    assert 16384 < t <= 65536


def test_crossover_ends():
    e = {1024: 1.0, 65536: 2.0}
    assert uc.crossover(e, {1024: 9.0, 65536: 9.0})[0] is None  # eager throughout
    assert uc.crossover(e, {1024: 0.5, 65536: 1.0})[0] == 1024  # rendezvous from the start
    assert uc.crossover(e, {})[0] is None


def test_choose_puts_the_threshold_where_the_measured_curves_cross():
    meas = measurements()
    ch = uc.choose(meas)
    s = {x.name: x.value for x in ch.settings}
    assert ch.eager == "eager" and ch.rndv == "rndv"
    e, r = meas["ucx"]["variants"]["eager"]["us"], meas["ucx"]["variants"]["rndv"]["us"]
    below = max(x for x in SIZES if x >= 1024 and e[x] <= r[x])
    above = min(x for x in SIZES if x > below)
    assert below < ch.threshold <= above
    assert s["UCX_RNDV_THRESH"] == f"auto,intra:{ch.threshold}"
    # default fragments: nothing about segments or schemes is written
    assert not any("SEG_SIZE" in k or "SCHEME" in k for k in s)
    # the gdr_copy line stops at the fragment payload (8 KiB), below the threshold
    get_lat = float(s["UCX_GDR_COPY_LAT"].split("get:")[1].split("us")[0])
    assert get_lat == pytest.approx(BAR1_GET[8], rel=0.01)
    bw = float(s["UCX_GDR_COPY_BW"].split("get_dedicated:")[1].split("MBs")[0])
    want = (8192 - 8) / (BAR1_GET[8192] - BAR1_GET[8]) * 1e6 / 2**20
    assert bw == pytest.approx(want, rel=0.01)


def test_a_larger_fragment_is_written_only_when_it_pays():
    big = uc.SEG_MAX
    fast = {s: eager_us(s, big - 64, get=lambda n: 0.4 + n / 900.0 if n < 16384
                        else 8 + n / 8000.0)               # copy-engine reads from 16 KiB
            for s in SIZES if s >= 16384}
    same = {s: eager_us(s, 8192) for s in SIZES if s >= 16384}
    base = measurements()["ucx"]["variants"]
    for us, written in ((fast, True), (same, False)):
        v = dict(base, **{f"eager_seg{big}": {
            "kind": "eager", "setting": {"UCX_POSIX_SEG_SIZE": str(big),
                                         "UCX_SYSV_SEG_SIZE": str(big)}, "us": us}})
        ch = uc.choose(measurements(v))
        names = {x.name: x.value for x in ch.settings}
        assert ("UCX_POSIX_SEG_SIZE" in names) is written, ch.ranking
        if written:
            assert names["UCX_SYSV_SEG_SIZE"] == str(big)
            assert ch.eager == f"eager_seg{big}"
            # the eager range grew: the threshold moved up with the faster eager path
            assert ch.threshold > uc.choose(measurements(base)).threshold


def test_a_variant_that_failed_a_size_is_never_chosen():
    base = measurements()["ucx"]["variants"]
    v = dict(base, eager_seg32832={
        "kind": "eager", "setting": {"UCX_POSIX_SEG_SIZE": "32832"},
        "us": {16384: 0.1, 65536: 0.1}, "failed": [1 << 20]})
    ch = uc.choose(measurements(v))
    assert ch.eager == "eager"
    assert "UCX_POSIX_SEG_SIZE" not in {x.name for x in ch.settings}


def test_no_threshold_when_ucxs_own_variant_failed():
    base = measurements()["ucx"]["variants"]
    base["eager"]["failed"] = [4 << 20]
    ch = uc.choose(measurements(base))
    assert ch.threshold is None
    assert [x.name for x in ch.settings] == ["UCX_GDR_COPY_LAT", "UCX_GDR_COPY_BW"]
    assert any("did not complete" in n for n in ch.notes)


def test_rendezvous_scheme_by_measurement():
    base = measurements()["ucx"]["variants"]
    put = {s: rndv_us(s, 20.0) for s in SIZES if s >= 16384}
    v = dict(base, rndv_put={"kind": "rndv", "setting": {"UCX_RNDV_SCHEME": "put_zcopy"},
                             "us": put})
    ch = uc.choose(measurements(v))
    names = {x.name: x.value for x in ch.settings}
    assert names.get("UCX_RNDV_SCHEME") == "put_zcopy"
    # a scheme within noise of UCX's own is not written
    v["rndv_put"]["us"] = {s: rndv_us(s) * 0.995 for s in put}
    assert "UCX_RNDV_SCHEME" not in {x.name for x in uc.choose(measurements(v)).settings}


def test_without_ucx_only_the_gdr_copy_model_is_written():
    meas = measurements()
    del meas["ucx"]
    ch = uc.choose(meas)
    assert [x.name for x in ch.settings] == ["UCX_GDR_COPY_LAT", "UCX_GDR_COPY_BW"]
    assert any("--ucx-prefix" in n for n in ch.notes)


def test_fit_line_uses_the_largest_size_within_reach():
    rows = copy_rows()
    lat, bw, lo, hi, t_hi = uc.fit_line(rows, "get_us", 40000)
    assert (lo, hi, t_hi) == (8, 32768, BAR1_GET[32768])
    assert lat == BAR1_GET[8]
    assert bw == pytest.approx((32768 - 8) / (BAR1_GET[32768] - BAR1_GET[8]))
    # noise: the larger size no slower than 8 B - a finite bandwidth all the same
    flat = [{"size": 8, "put_us": 1.0}, {"size": 8192, "put_us": 0.9}]
    assert uc.fit_line(flat, "put_us", 8192)[1] == pytest.approx(8192 / 0.9)
    with pytest.raises(uc.ToolError):
        uc.fit_line([{"size": 8, "get_us": 1.0}], "get_us", 1 << 20)


# ---------------------------------------------------------------- the section and the file


def test_section_is_what_ucx_parses():
    meas = measurements()
    meas["ucx"]["variants"]["eager_seg32832"] = {
        "kind": "eager", "setting": {"UCX_POSIX_SEG_SIZE": "32832", "UCX_SYSV_SEG_SIZE": "32832"},
        "us": {s: 1.0 for s in SIZES if s >= 16384}}
    block = uc.render_section(uc.choose(meas), meas)
    lines = block.splitlines()
    assert lines[0].startswith(uc.BEGIN) and lines[-1] == uc.END
    assert f"[{uc.SECTION}]" in lines
    sec = lines.index(f"[{uc.SECTION}]")
    body = [ln for ln in lines[sec + 1:] if ln and not ln.startswith("#")]
    # filters first (UCX decides at a section's filter lines), literal patterns
    assert body[0] == "CPU vendor=Intel"
    assert body[1] == r"Product name=Test Box \[v2\]\*"
    assert not any(ln.startswith("CPU model") for ln in body)    # "unknown" is no filter
    assert all(ln.startswith("UCX_") for ln in body[2:])
    for ln in lines:
        assert len(ln) < 200 and not ln[:1].isspace()
        assert ";" not in ln.split("#")[0]
    # every value has its comment right above it (a pair of values shares one)
    names = [ln.split("=")[0] for ln in body[2:]]
    assert "UCX_POSIX_SEG_SIZE" in names and "UCX_RNDV_THRESH" in names
    for i, ln in enumerate(lines):
        if ln.startswith("UCX_"):
            above = lines[i - 1]
            assert above.startswith("# ") or (above.startswith("UCX_") and
                                              lines[i - 2].startswith("# ")), (ln, above)


def test_section_without_filters_says_so():
    meas = measurements()
    meas["host"].update(cpu_vendor="unknown", cpu_model="unknown", product_name="unknown")
    block = uc.render_section(uc.choose(meas), meas)
    assert "WARNING" in block and "Product name=" not in block


def test_merge_keeps_other_settings_and_replaces_its_own_block():
    meas = measurements()
    block = uc.render_section(uc.choose(meas), meas)
    user = "# mine\nUCX_LOG_LEVEL=info\n\n[Other]\nCPU model=Milan\nUCX_X=1\n"
    once = uc.merge_conf(user, block)
    assert once.startswith(user.rstrip("\n")) and once.endswith(block)
    # a second run replaces, moving the block after settings added later
    later = once + "UCX_Y=2\n"
    twice = uc.merge_conf(later, block.replace("auto,intra:", "auto,intra:1"))
    assert twice.count(uc.BEGIN) == 1 and twice.count(uc.END) == 1
    assert "UCX_Y=2" in twice and twice.index("UCX_Y=2") < twice.index(uc.BEGIN)
    assert "[Other]" in twice and "UCX_LOG_LEVEL=info" in twice
    assert uc.merge_conf(None, block) == block
    with pytest.raises(uc.ToolError, match="incomplete"):
        uc.merge_conf(user + block.replace(uc.END, "# cut"), block)


def test_never_writes_into_a_ucx_installation(tmp_path: Path):
    prefix = tmp_path / "ucx"
    (prefix / "etc" / "ucx").mkdir(parents=True)
    (prefix / "lib").mkdir()
    (prefix / "lib" / "libucs.so.0").write_text("")
    with pytest.raises(uc.ToolError, match="installation"):
        uc.refuse_ucx_install_dir(prefix / "etc" / "ucx", None)
    with pytest.raises(uc.ToolError, match="installation"):
        uc.refuse_ucx_install_dir(prefix / "etc" / "ucx", prefix)
    uc.refuse_ucx_install_dir(tmp_path / "conf", prefix)    # any other folder is fine


# ---------------------------------------------------------------- parsers (recorded outputs)

COPYLAT = """\
# gdrapi_copylat: libgdrapi 2.6, GPU, mapping GDR_MAPPING_TYPE_WC, timer cost 0.020 us (median)
# latency per call in us: median and p99; sizes 8 .. 16 B
size,to_map_med,to_map_p99,from_map_med,from_map_p99,htod_med,htod_p99,dtoh_med,dtoh_p99
8,0.110,0.200,0.950,1.100,7.100,8.000,7.200,8.100
16,0.120,0.210,0.960,1.200,7.150,8.100,7.250,8.300
# verify: ok
"""


def test_parse_copylat():
    head, rows = uc.parse_copylat(COPYLAT)
    assert len(head) == 3
    assert rows == [{"size": 8, "put_us": 0.11, "get_us": 0.95, "htod_us": 7.1, "dtoh_us": 7.2},
                    {"size": 16, "put_us": 0.12, "get_us": 0.96, "htod_us": 7.15,
                     "dtoh_us": 7.25}]
    _h, sim = uc.parse_copylat("size,to_map_med,to_map_p99,from_map_med,from_map_p99\n"
                               "8,0.040,0.050,0.030,0.041\n")
    assert sim == [{"size": 8, "put_us": 0.04, "get_us": 0.03}]


# ucx_perftest -b output (UCX 1.22), as it prints a batch of two tests
PERFTEST = """\
+--------------+--------------+------------------------------+---------------------+-----------------------+
|              |              |       overhead (usec)        |   bandwidth (MB/s)  |  message rate (msg/s) |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
+s8------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
Final:                  1000      1.993     2.075     2.075        3.68       3.68      481938      481938
+s65536--------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
Final:                   300    155.721   160.344   160.344      389.78     389.78        6237        6237
"""  # noqa: E501


def test_parse_perftest_batch_and_single():
    got = uc.parse_perftest(PERFTEST)
    assert set(got) == {"s8", "s65536"}
    assert got["s8"]["p50_us"] == 1.993 and got["s8"]["iters"] == 1000
    assert got["s65536"]["bw_overall_mbs"] == 389.78
    single = uc.parse_perftest("Final:       10  4.0  4.1  4.2  1.0  1.0  10  10\n")
    assert single[""]["overall_us"] == 4.2


PROTO = """\
[1795448798.134868] [h:2943 :0]   +---------------+---------------------------------+--------------+
[1795448798.134868] [h:2943 :0]   | perftest intra-node cfg#2                                     |
[1795448798.134868] [h:2943 :0]   | tagged message by ucp_tag_send* from cuda/GPU0              |
[1795448798.134868] [h:2943 :0]   +---------------+---------------------------------+--------------+
[1795448798.134868] [h:2943 :0]   |             0 | eager short                     | sysv/memory  |
[1795448798.134868] [h:2943 :0]   |       1..8248 | eager copy-in copy-out          | sysv/memory  |
[1795448798.134868] [h:2943 :0]   |  8249..131000 | multi-frag eager copy-in copy-out | sysv/memory |
[1795448798.134868] [h:2943 :0]   |    131001..inf| rendezvous zero-copy flushed write to remote | cuda_ipc/cuda |
[1795448798.134868] [h:2943 :0]   +---------------+---------------------------------+--------------+
"""  # noqa: E501


def test_protocol_lines_per_size():
    got = uc.protocol_lines(PROTO, [2048, 32768, 1 << 20], "cuda")
    assert got[2048].startswith("1..8248 eager copy-in copy-out")
    assert got[32768].startswith("8249..131000 multi-frag eager")
    assert "cuda_ipc" in got[1 << 20]


def test_batch_lines():
    lines = uc.batch_lines([8, 4 << 20], "cuda", None)
    assert lines[0] == ("s8", "-t tag_lat -m cuda -s 8 -n 1000 -w 100")
    assert lines[1][1].endswith("-n 40 -w 5")
    assert "-a cuda:1" in uc.batch_lines([8], "cuda", 1)[0][1]


def test_child_env_drops_the_users_ucx_settings(monkeypatch):
    monkeypatch.setenv("UCX_TLS", "^gdr_copy")
    monkeypatch.setenv("UCX_CONFIG_DIR", "/somewhere")
    env = uc.child_env(uc.Ucx(Path("/opt/ucx")), "/lib/gdr", "/tmp/h", {"UCX_RNDV_THRESH": "0"})
    assert "UCX_TLS" not in env and "UCX_CONFIG_DIR" not in env
    assert env["UCX_RNDV_THRESH"] == "0" and env["HOME"] == "/tmp/h"
    assert env["LD_LIBRARY_PATH"].startswith("/lib/gdr:/opt/ucx/lib")


# ---------------------------------------------------------------- the command


def gdrpy_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.pop("UCX_CONFIG_DIR", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "gdrpy", "ucx-config", *args],
                          capture_output=True, text=True, env=e, timeout=120)


def test_cli_from_json_dry_run_and_write(tmp_path: Path):
    mf = tmp_path / "meas.json"
    mf.write_text(json.dumps(measurements()))
    r = gdrpy_cli("--from-json", str(mf), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert uc.BEGIN in r.stdout and "UCX_RNDV_THRESH=auto,intra:" in r.stdout
    assert not list(tmp_path.glob("ucx.conf"))
    # writing needs a folder
    r = gdrpy_cli("--from-json", str(mf))
    assert r.returncode == 2 and "--config-dir" in r.stderr
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "ucx.conf").write_text("UCX_LOG_LEVEL=info\n")
    out = tmp_path / "out.json"
    r = gdrpy_cli("--from-json", str(mf), "--json", str(out), env={"UCX_CONFIG_DIR": str(conf)})
    assert r.returncode == 0, r.stderr
    text = (conf / "ucx.conf").read_text()
    assert text.startswith("UCX_LOG_LEVEL=info\n") and text.count(uc.BEGIN) == 1
    saved = json.loads(out.read_text())
    assert saved["choice"]["threshold"] == uc.choose(measurements()).threshold


def test_cli_refusals(tmp_path: Path):
    r = gdrpy_cli("--dry-run", env={"GDRPY_BACKEND": "sim"})
    assert r.returncode == 2 and "needs a GPU" in r.stderr and "--from-json" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": 99}')
    r = gdrpy_cli("--from-json", str(bad), "--dry-run")
    assert r.returncode == 2 and "not a measurements file" in r.stderr
    r = gdrpy_cli("--from-json", str(tmp_path / "none.json"), "--dry-run")
    assert r.returncode == 2 and "cannot read" in r.stderr
    r = gdrpy_cli("--seg-sizes", "65600", "--dry-run")
    assert r.returncode == 2 and "16 bits" in r.stderr
    r = gdrpy_cli("--ucx-prefix", str(tmp_path), "--dry-run", env={"GDRPY_BACKEND": ""})
    assert r.returncode == 2


UCX_PREFIX = os.environ.get("UCX_PREFIX", "")


@pytest.mark.skipif(not os.path.isfile(os.path.join(UCX_PREFIX, "bin", "ucx_info")),
                    reason="needs a UCX installation in $UCX_PREFIX")
def test_ucx_applies_the_section_on_this_machine_only(tmp_path: Path):
    ucx = uc.Ucx(Path(UCX_PREFIX))
    env = uc.child_env(ucx, "/nonexistent", str(tmp_path))
    meas = measurements()
    meas["host"].update(uc.ucx_host_info(ucx, env))
    ch = uc.choose(meas)
    (tmp_path / "ucx.conf").write_text(uc.render_section(ch, meas))

    def thresh(conf_env: dict) -> str:
        out = subprocess.run([str(ucx.info), "-c"], env=dict(env, **conf_env),
                             capture_output=True, text=True, timeout=60).stdout
        return next(ln for ln in out.splitlines() if ln.startswith("UCX_RNDV_THRESH="))

    assert f"intra:{ch.threshold}" in thresh({"UCX_CONFIG_DIR": str(tmp_path)}) or \
        f"intra:{ch.threshold // 1024}K" in thresh({"UCX_CONFIG_DIR": str(tmp_path)})
    # another machine: a product name that is not this one's
    meas["host"].update(product_name="Some Other Box", cpu_model="Naples")
    (tmp_path / "ucx.conf").write_text(uc.render_section(ch, meas))
    assert "intra:auto" in thresh({"UCX_CONFIG_DIR": str(tmp_path)})


@pytest.mark.skipif(not os.path.isfile(os.path.join(UCX_PREFIX, "bin", "ucx_perftest")),
                    reason="needs a UCX installation in $UCX_PREFIX")
def test_verify_reads_the_section_back_and_the_protocols(tmp_path: Path):
    """The check run after writing, on host memory: UCX reports the chosen threshold
    and the protocol of each size comes from its UCX_PROTO_INFO tables."""
    import argparse

    ucx = uc.Ucx(Path(UCX_PREFIX))
    meas = measurements()
    meas["host"].update(uc.ucx_host_info(ucx, uc.child_env(ucx, "/x", str(tmp_path))))
    meas["ucx"]["variants"] = {k: dict(v, us={s: x for s, x in v["us"].items() if s <= 65536})
                               for k, v in meas["ucx"]["variants"].items()}
    ch = uc.choose(meas)
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "ucx.conf").write_text(uc.render_section(ch, meas))
    args = argparse.Namespace(device=0, mem="host")
    said: list[str] = []
    res = uc.verify(ucx, conf, ch, meas, args, tmp_path / "work", said.append)
    assert res["threshold_applied"] is True, said
    assert set(res["protocols"]) >= {2048, 8192, 32768}, res["protocols"]
    assert all(res["us"][s] > 0 for s in (2048, 8192, 32768))


def fake_copylat(tmp_path: Path, out: str, rc: int = 0, err: str = "") -> str:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (tmp_path / "out.txt").write_text(out)
    tool = bindir / "gdrapi_copylat"
    tool.write_text(f"#!/bin/sh\necho \"$*\" > {tmp_path}/args.txt\ncat {tmp_path}/out.txt\n"
                    f"echo '{err}' >&2\nexit {rc}\n")
    tool.chmod(0o755)
    return str(bindir)


def test_measure_copies_reads_the_tool_and_refuses_without_a_gpu(tmp_path: Path):
    bindir = fake_copylat(tmp_path, COPYLAT)
    got = uc.measure_copies("/lib", bindir, 1, quick=True, allow_sim=False)
    assert [r["size"] for r in got["rows"]] == [8, 16] and not got["sim"]
    args = (tmp_path / "args.txt").read_text().split()
    assert args[args.index("--max") + 1] == str(1 << 20) and "--csv" in args
    sim = ("# gdrapi_copylat: libgdrapi 2.6, sim backend (host memory: NOT GPU numbers)\n"
           "size,to_map_med,to_map_p99,from_map_med,from_map_p99\n8,0.04,0.05,0.03,0.04\n")
    bindir = fake_copylat(tmp_path, sim)
    with pytest.raises(uc.NeedsGPU, match="sim backend"):
        uc.measure_copies("/lib", bindir, 0, quick=False, allow_sim=False)
    assert uc.measure_copies("/lib", bindir, 0, quick=False, allow_sim=True)["sim"]
    bindir = fake_copylat(tmp_path, "", 2, "gdrapi_copylat: no device memory: no libcuda.so.1")
    with pytest.raises(uc.NeedsGPU, match="no libcuda"):
        uc.measure_copies("/lib", bindir, 0, quick=False, allow_sim=False)
    with pytest.raises(uc.ToolError, match="no .*gdrapi_copylat"):
        uc.measure_copies("/lib", str(tmp_path / "none"), 0, quick=False, allow_sim=False)
