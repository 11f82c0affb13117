#!/usr/bin/env python3
"""Short summary table of a scripts/gpu_suite.sh run: reads the logs and JSON
files in the run directory and prints the key figures (medians / p99)."""

from __future__ import annotations

import json
import os
import re
import sys


def load(d, name):
    try:
        with open(os.path.join(d, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read(d, name):
    try:
        with open(os.path.join(d, name)) as f:
            return f.read()
    except OSError:
        return ""


def us(x):
    if x is None:
        return "-"
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def row_of(js, key, direction, size):
    for r in (js or {}).get("rows", []):
        if r.get("key") == key and r.get("direction") == direction and r.get("size") == size:
            return r
    return None


def cell(r):
    if not r or r.get("median_us") is None:
        return "-"
    return f"{us(r['median_us'])} / {us(r.get('p99_us'))}"


def main(d):
    out = []
    p = out.append
    p("=" * 78)
    p("gdrpy GPU suite summary  (median / p99 in us unless noted)")
    info = read(d, "info.log")
    m = re.search(r"^\s+(NVIDIA .*)$", info, re.M)
    p(f"machine: {m.group(1).strip() if m else '?'}")
    steps = read(d, "steps.log")
    fails = [ln for ln in steps.splitlines()
             if ("rc=" in ln and "rc=0 " not in ln) or ": skipped: " in ln]
    times = re.findall(r"^=== (\S+): rc=\d+ in (\d+) s$", steps, re.M)
    p(f"steps: {len(times)} run, {len(fails)} failed or skipped"
      + ("".join(f"\n  FAILED {ln[4:]}" for ln in fails)))
    if times:
        p("seconds: " + ", ".join(f"{name} {sec}" for name, sec in times)
          + f" (total {sum(int(sec) for _, sec in times)})")
    for name, label in (("pytest.log", "pytest (GPU tests)"), ("pytest_all.log", "pytest (all)")):
        tail = [ln for ln in read(d, name).splitlines()
                if re.search(r"\d+ (passed|failed)", ln)]
        if tail:
            p(f"{label}: {tail[-1].strip('= ')}")
    for name in ("c_core_gpu.log", "c_nvrm_backend.log"):
        t = [ln for ln in read(d, name).splitlines() if "passed" in ln and "failed" in ln]
        if t:
            p(f"{name[:-4]}: {t[-1].strip()}")

    lat = load(d, "latency.json")
    if lat:
        p("")
        p("latency, host -> GPU")
        p(f"  {'size':>6}  {'Mapping.write':>17}  {'Transfer.put':>17}  {'C kernel':>15}  "
          f"{'C cuMemcpyHtoD':>17}  {'cuda-python':>17}  {'CuPy set':>15}  {'torch copy_':>15}")
        for size in (8, 64, 4096):
            p(f"  {size:>6}  {cell(row_of(lat, 'write', 'h2d', size)):>17}  "
              f"{cell(row_of(lat, 'put', 'h2d', size)):>17}  "
              f"{cell(row_of(lat, 'c_kernel', 'h2d', size)):>15}  "
              f"{cell(row_of(lat, 'c_cumemcpy', 'h2d', size)):>17}  "
              f"{cell(row_of(lat, 'cuMemcpyHtoD', 'h2d', size)):>17}  "
              f"{cell(row_of(lat, 'cupy', 'h2d', size)):>15}  "
              f"{cell(row_of(lat, 'torch', 'h2d', size)):>15}")
        p("latency, GPU -> host")
        p(f"  {'size':>6}  {'Mapping.read':>17}  {'Transfer.get':>17}  {'C kernel':>15}  "
          f"{'C cuMemcpyDtoH':>17}  {'cuda-python':>17}  {'CuPy get':>15}  {'torch copy_':>15}")
        for size in (8, 64, 4096):
            p(f"  {size:>6}  {cell(row_of(lat, 'read', 'd2h', size)):>17}  "
              f"{cell(row_of(lat, 'get', 'd2h', size)):>17}  "
              f"{cell(row_of(lat, 'c_kernel', 'd2h', size)):>15}  "
              f"{cell(row_of(lat, 'c_cumemcpy', 'd2h', size)):>17}  "
              f"{cell(row_of(lat, 'cuMemcpyDtoH', 'd2h', size)):>17}  "
              f"{cell(row_of(lat, 'cupy', 'd2h', size)):>15}  "
              f"{cell(row_of(lat, 'torch', 'd2h', size)):>15}")

        iso = [r for r in lat.get("rows", []) if r.get("key", "").endswith("_isolated")]
        if iso:
            gap = iso[0].get("gap_us")
            p(f"isolated messages (each call timed alone after {gap} us idle; clock pair included)")
            for key, label in (("write_isolated", "Mapping.write(bytes)"),
                               ("write_np_isolated", "Mapping.write(numpy)"),
                               ("put_isolated", "Transfer.put(bytes)"),
                               ("read_isolated", "Mapping.read(out=)"),
                               ("get_isolated", "Transfer.get(n)")):
                cells = []
                for size in (8, 64, 4096):
                    r = next((x for x in iso if x["key"] == key and x["size"] == size), None)
                    cells.append(f"{size}B {cell(r)}")
                p(f"  {label:<22} " + "   ".join(cells))

    ga = read(d, "c_gdrapi_copylat.log")
    if ga:
        p("")
        p("libgdrapi drop-in (gdrapi_copylat, C, us):  size  to_map med/p99  from_map med/p99  bar1"
          "  cuMemcpyHtoD  cuMemcpyDtoH")
        for ln in ga.splitlines():
            f = ln.split()
            if f and f[0].isdigit() and int(f[0]) in (1, 8, 64, 4096, 65536, 1 << 20, 16 << 20):
                p("  " + "  ".join(f"{x:>9}" for x in f))
        hdr = [ln for ln in ga.splitlines() if ln.startswith("#")][:3]
        for h in hdr:
            p("  " + h)

    bw = load(d, "bandwidth.json")
    if bw:
        p("")
        p("bandwidth GB/s (median)     1 MiB               64 MiB")
        for key, direction, label in (("c_kernel", "h2d", "C write kernel"),
                                      ("c_raw", "h2d", "raw NT store loop"),
                                      ("write", "h2d", "Mapping.write"),
                                      ("ce_write", "h2d", "ce_write (cuMemcpy)"),
                                      ("c_kernel", "d2h", "C read kernel"),
                                      ("c_raw", "d2h", "raw NT load loop"),
                                      ("read", "d2h", "Mapping.read")):
            vals = []
            for size in (1 << 20, 64 << 20):
                r = row_of(bw, key, direction, size)
                vals.append(f"{r['gbps_median']:.2f}" if r and r.get("gbps_median") else "-")
            p(f"  {label:<24} {vals[0]:>8}            {vals[1]:>8}")
        for size in (1 << 20, 64 << 20):
            a, b = row_of(bw, "c_kernel", "h2d", size), row_of(bw, "c_raw", "h2d", size)
            if a and b and a.get("gbps_median") and b.get("gbps_median"):
                p(f"  C write kernel / raw at {size >> 20} MiB: "
                  f"{100 * a['gbps_median'] / b['gbps_median']:.1f}% (target >= 95%)")

    if bw and bw.get("host_kinds_verdict"):
        p("")
        p("large messages by host-memory kind (% of pinned cuMemcpy, same run)")
        for key, v in bw["host_kinds_verdict"].items():
            if v.get("min_pct") is None:
                p(f"  {key:<16} not measured")
                continue
            p(f"  {key:<16} >= {v['from'] >> 20} MiB: worst {v['min_pct']:.1f}% at "
              f"{v['at'] >> 20} MiB (target {v['target_pct']:.0f}%): "
              f"{'PASS' if v['ok'] else 'FAIL'}")
        lat = bw.get("latency_rows") or []
        if lat:
            p("  <= 64 KiB latencies (median/p99 us): " + "; ".join(
                f"{r['key'][4:]} {r['size']}B {r['median_us']:.3f}/{r['p99_us']:.3f}"
                for r in lat if r.get("median_us") is not None and r["size"] in (8, 65536)))

    harness = read(d, "c_nvrm_backend.log")
    pins = [ln for ln in harness.splitlines()
            if ln.startswith("TIME") and re.search(r"(pin|map) 64 (KiB|MiB)", ln)
            and "zeroed" not in ln and "unmap" not in ln]
    if pins:
        p("")
        p("pin / map cost (C, nvrm; route C = cuMemAlloc, route A = cuMemCreate)")
        for ln in pins:
            p("  " + re.sub(r"\s+", " ", ln[5:]).replace(" (content-verified for C)", ""))

    cal = re.search(r"calibrated \S+ on device \d+ in ([\d.]+) s.*", read(d, "calibrate.log"))
    if cal:
        p("")
        p(f"calibration from scratch: {cal.group(0)} (target < 10 s)")
        for ln in read(d, "calibrate.log").splitlines():
            if "threshold" in ln and ":" in ln:
                p("  " + ln.strip())
    for fname, label in (("transfer.json", "transfer"),
                         ("transfer_pinned.json", "transfer, page-locked host memory")):
        tr = load(d, fname)
        if not tr:
            continue
        s = tr.get("summary", {})
        pk = tr.get("meta", {}).get("picker", {})
        p("")
        p(f"{label}: thresholds {pk.get('thresholds')} ({pk.get('sources')}); "
          f"calibration {pk.get('calibration_s', '-')} s")
        byk = tr.get("meta", {}).get("thresholds_by_kind")
        if byk:
            p(f"  thresholds by kind: {byk}")
        worst = s.get("worst_regret")
        p(f"  worst regret {100 * worst:+.1f}% at {s.get('worst_at')}; every size within 5%: "
          f"{'YES' if s.get('within_5pct') else 'NO'} ({s.get('measured')} sizes x directions)"
          if worst is not None else "  (no regret summary)")

    pp = load(d, "pingpong.json")
    if pp:
        p("")
        p("ping-pong round trip through gdrpy.Channel (us), median / p99:")
        p("  payload     python            C                 cuMemcpy+launch")
        by = {}
        for r in pp.get("results", []):
            by.setdefault(r["size"], {})[r["path"]] = r["stats_us"]
        for size in pp.get("sizes", []):
            v = by.get(size, {})
            cols = [v.get(k, {}) for k in ("python", "c", "cuMemcpy")]
            p(f"  {size:>6} B   " + "   ".join(f"{us(c.get('median'))} / {us(c.get('p99'))}"
                                           for c in cols))
        sm = pp.get("summary") or {}
        if sm:
            p(f"  targets: Python {us(sm.get('python_median_us'))} us (<= 2.6), "
              f"C {us(sm.get('c_median_us'))} us (<= 1.6), batch/tick Python "
              f"{sm.get('python_batch_ratio', float('nan')):.2f}x, C "
              f"{sm.get('c_batch_ratio', float('nan')):.2f}x (< 2)")
        if (pp.get("c_tool") or {}).get("error"):
            p(f"  C tool: {pp['c_tool']['error']}")
    # GDRCopy's pplat in the same run (scripts/gdrcopy_tests.sh lines:
    # "gdrcopy_pplat -a X [-s 4 -B 1]: exit N: ... (median) Y us"), printed
    # under the ping-pong's numbers, or alone when the ping-pong left none
    for m in re.finditer(r"^gdrcopy_pplat (.*?): exit (\d+): .*?(?:\(median\) ([\d.]+) us)?$",
                         read(d, "gdrcopy_tests.log"), re.M):
        what = "4 B data + flag" if "-s 4" in m.group(1) else "flag only"
        got = f"{float(m.group(3)):.3f} us" if m.group(3) else f"no result (exit {m.group(2)})"
        p(f"  GDRCopy pplat {m.group(1)} ({what}), same run: {got}")
    sanity = re.findall(r"^gdrcopy_sanity: .*$", read(d, "gdrcopy_tests.log"), re.M)
    if sanity:
        p(f"GDRCopy's sanity on libgdrapi.so.2: {sanity[-1][len('gdrcopy_sanity: '):]}")

    for fname in ("trading_feed.json", "feed_sweep.json"):
        tf = load(d, fname)
        if not tf:
            continue
        p("")
        p(f"trading feed ({fname}): end-to-end (sender stamp -> ack seen) p50 / p99 us, "
          "written -> ack seen p50 / p99 us")
        for r in tf.get("points", []):
            lat = r.get("latency_us") or {}
            e, w = lat.get("end_to_end", {}), lat.get("ring_consumer_ack", {})
            lo = r.get("loss") or {}
            where = f"{r.get('source')}/{r.get('handler')}/{r.get('path')}/{r.get('slot_format')}"
            p(f"  {r.get('kind', ''):<13} {where:<21} "
              f"{r.get('offered_per_s', 0):>11,.0f}/s  "
              f"processed {r.get('processed_per_s') or 0:>11,.0f}/s"
              f"  lost {lo.get('lost')}  full {(r.get('ring') or {}).get('full_events')}  "
              f"{us(e.get('median'))} / {us(e.get('p99'))}  {us(w.get('median'))} / "
              f"{us(w.get('p99'))}"
              f"{'' if r.get('checks_ok') else '  CHECK FAILED'}")
            hs = r.get("host_stalls") or {}
            if hs.get("per_s") is not None:
                p(f"    host stalls during it: {hs['per_s']:,.0f}/s, "
                  f"{hs['stalled_fraction']:.2%} of the time, median "
                  f"{(hs.get('duration_us') or {}).get('median', float('nan')):.1f} us "
                  f"(a spinning thread on CPU {hs['cpu']})")
        for k, v in (tf.get("zero_loss_capacity") or {}).items():
            p(f"  zero-loss capacity {k}: {v:,.0f}/s")
        for dw in tf.get("done_when") or []:
            p(f"  [{'PASS' if dw['ok'] else 'SHORT'}] {dw['what']}: {dw['measured']}"
              + (f"; bound: {dw['bound']}" if dw.get("bound") else ""))

    mp = load(d, "mpi_eager.json")
    if mp:
        p("")
        p(f"MPI eager ({mp.get('mode')}), device-to-device one-way latency median us:"
          "  size  gdrpy  cuMemcpy-staged")
        for r in mp.get("rows", []):
            if r["size"] in (1, 8, 64, 1024, 8192, 65536, 1 << 20):
                p(f"  {r['size']:>8}  {us(r['gdrpy']['median_us']):>7}  "
                  f"{us(r['staged']['median_us']):>7}"
                  f"   ({r['gdrpy'].get('path')})")
    gt = read(d, "ucx_gtest.log")
    gl = [ln for ln in gt.splitlines() if ln.startswith("ucx gtest ")]
    if gl:
        p("")
        p(gl[-1])
        p("\n".join("  " + ln.strip() for ln in gt.splitlines() if ln.startswith("  FAILED ")))
    mb = load(d, "mpi_bench.json")
    if mb:
        p("")
        res = mb.get("results", {})
        conf = (mb.get("meta") or {}).get("conf") or ""
        thr = re.search(r"^UCX_RNDV_THRESH=(.*)$", conf, re.M)
        p(f"MPI over UCX ({(mb.get('meta') or {}).get('placement')}), us or MB/s: "
          f"defaults / ^gdr_copy / ucx-config (threshold {thr.group(1) if thr else '-'})")
        for key in ("ompi osu_latency D D", "mpich osu_latency D D", "ompi osu_bw D D",
                    "ucx_perftest tag_lat -m cuda"):
            r = res.get(key)
            if not r:
                continue
            cells = []
            for size in (8, 2048, 8192, 32768, 1 << 20):
                v = [r.get(k, {}).get(str(size)) for k in ("defaults", "nogdr", "conf")]
                if any(x is not None for x in v):
                    cells.append(f"{size}B " + "/".join("-" if x is None else f"{x:.4g}"
                                                      for x in v))
            p(f"  {key:<26} " + "  ".join(cells))
        for ln in read(d, "mpi_bench.log").splitlines():
            if ln.startswith(("[PASS]", "[FAIL]", "[n/a]", "  protocol at ")):
                p("  " + ln.strip())
    ba = read(d, "before_after.log")
    if "row (ns per call)" in ba:
        p("")
        p("before/after (scripts/before_after.sh):")
        keep = False
        for ln in ba.splitlines():
            keep = keep or ln.startswith(("--- before/after", "median / p99:"))
            if keep:
                p("  " + ln)
            if ln.startswith("time: "):
                break
    asvlog = read(d, "asv.log")
    if asvlog:
        n_ok = len(re.findall(r"··· \S+\s+ok", asvlog))
        n_fail = len(re.findall(r"··· \S+\s+failed", asvlog))
        p("")
        p(f"asv: {n_ok} benchmarks recorded ok, {n_fail} failed (results in asv_results/)")
    p("=" * 78)
    print("\n".join(out))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: summarize.py RUN_DIR   (the $WORK of scripts/gpu_suite.sh)")
    main(sys.argv[1])
