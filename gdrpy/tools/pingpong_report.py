"""The ping-pong benchmark's report: statistics rows, the summary of the
headline numbers (targets included), the text table and the plot
(``gdrpy.tools.pingpong`` measures; this module only formats)."""

from __future__ import annotations

import numpy as np

from .._sizes import format_size as fmt_size

SIM_LABEL = "SIM: CPU thread stands in for the GPU kernel"
TARGETS = {"python_us": 2.6, "c_us": 1.6, "batch_ratio": 2.0}


_STATS_COLS = ("median", "p90", "p99", "p99.9", "max")


def stats_header(first="") -> str:
    return f"{first:<30s}" + "".join(f" {c:>9s}" for c in _STATS_COLS)


def stats_row(label: str, st: dict) -> str:
    """One table row; every cell starts with a space, so columns never run
    together."""
    if not st.get("n"):
        return f"{label:<30s}   (no samples)"
    return f"{label:<30s}" + "".join(f" {st[c]:9.2f}" for c in _STATS_COLS)


def _get(res: dict, path: str, size: int) -> dict | None:
    for r in res["results"]:
        if r["path"] == path and r["size"] == size:
            return r["stats_us"]
    return None


def summary(res: dict) -> dict:
    """The headline numbers: Python / C round trip of the smallest size,
    batch-of-N vs one-tick ratios."""
    s0 = min(res["sizes"])
    out: dict = {"size": s0}
    py, c = _get(res, "python", s0), _get(res, "c", s0)
    if py:
        out["python_median_us"], out["python_p99_us"] = py["median"], py["p99"]
    if c:
        out["c_median_us"], out["c_p99_us"] = c["median"], c["p99"]
    for lang in ("python", "c"):
        avg = _get(res, f"{lang}-avg10", s0)
        if avg:
            out[f"{lang}_avg10_median_us"] = avg["median"]
    b = res["batch"]
    for lang in ("python", "c"):
        one = _get(res, f"{lang}-tick", res["tick"])
        many = _get(res, f"{lang}-batch{b}", res["tick"])
        if one and many:
            out[f"{lang}_tick_median_us"] = one["median"]
            out[f"{lang}_batch_median_us"] = many["median"]
            out[f"{lang}_batch_ratio"] = many["median"] / max(one["median"], 1e-9)
    return out


def summary_lines(res: dict) -> list[str]:
    sm = res["summary"]
    tag = " [SIM: not GPU numbers]" if res["sim"] else ""
    s0 = fmt_size(sm["size"])
    lines = [f"SUMMARY{tag}"]

    def verdict(v, lim, less=False):
        ok = v < lim if less else v <= lim
        return f"{'meets' if ok else 'MISSES'} the target {'<' if less else '<='} {lim:g}"

    for lang, name, pad in (("python", "Python", ""), ("c", "C", "     ")):
        if f"{lang}_median_us" not in sm:
            continue
        lim = TARGETS[f"{lang}_us"]
        lines.append(f"  {name} channel round trip {s0}:{pad} median {sm[f'{lang}_median_us']:.2f} "
                     f"us, p99 {sm[f'{lang}_p99_us']:.2f} us per round trip "
                     f"({verdict(sm[f'{lang}_median_us'], lim)} us)")
        if f"{lang}_avg10_median_us" in sm:
            lines.append(f"    {name}, blocks of 10 round trips timed together (GDRCopy pplat's "
                         f"method): median {sm[f'{lang}_avg10_median_us']:.2f} us "
                         f"({verdict(sm[f'{lang}_avg10_median_us'], lim)} us)")
    for lang in ("python", "c"):
        if f"{lang}_batch_ratio" in sm:
            lines.append(f"  batch of {res['batch']} ticks ({fmt_size(res['tick'])}) vs one tick, "
                         f"{lang}: {sm[f'{lang}_batch_median_us']:.2f} / "
                         f"{sm[f'{lang}_tick_median_us']:.2f} us = "
                         f"{sm[f'{lang}_batch_ratio']:.2f}x "
                         f"({verdict(sm[f'{lang}_batch_ratio'], TARGETS['batch_ratio'], True)}x)")
    return lines


def format_report(res: dict) -> str:
    sim = res["sim"]
    lines = []
    if sim:
        lines.append(f"*** {SIM_LABEL} (backend sim: these numbers time CPU threads, not "
                     "PCIe) ***")
    gpu = res["gpu"] if sim else f"{res['gpu']}, driver {res['driver']}"
    lines.append(f"gdrpy pingpong: device {res['device']} ({gpu}), backend {res['backend']}, "
                 f"{res['iters']} round trips per size (+{res['warmup']} warm-up)")
    loc = res.get("locality") or {}
    if not sim:
        lines.append(f"  kernels: NVRTC {res.get('nvrtc', '?')} {res.get('module')} for "
                     f"{res.get('arch')} (compiled in {res.get('compile_s', 0):.2f} s)")
        lines.append(f"  GPU NUMA node {loc.get('numa_node')}, nearby CPUs "
                     f"{loc.get('local_cpulist') or '?'}; measuring thread on CPU "
                     f"{res.get('cpu', 'any')}")
    answer = ("the checksum as the tag" if res.get("answer") == "tag"
              else "{seq, checksum, len}")
    lines.append(f"  consumer: {res['consumer']}; slot format {res.get('format', 'll').upper()}, "
                 f"{res.get('slots', 'all')} slots; answers: {answer}")
    if not sim:
        ct = res.get("c_tool", {})
        lines.append(f"  kernel SM: python run {res.get('python_sm')}, C run {ct.get('sm', '?')}; "
                     f"rings: python gdrpy.memory.alloc (cuMemCreate), C {ct.get('alloc', '?')}")
    lines.append("  python: Channel.send + Channel.recv_into; c: gdrpy_chan_send + "
                 "gdrpy_chan_recv (gdrpy_chanpp);")
    lines.append("  cuMemcpy: cuMemcpyHtoDAsync + cuLaunchKernel + cuMemcpyDtoHAsync + "
                 "cuStreamSynchronize" + (" (SIM: memcpy + C checksum)" if sim else ""))
    ct = res.get("c_tool", {})
    lines.append(f"  timers (one read, ns): python perf_counter_ns "
                 f"{res.get('python_timer_ns', '?')}; C {ct.get('timer', '?')} "
                 f"(clock_gettime {ct.get('clock_gettime_ns', '?')}, "
                 f"rdtscp {ct.get('rdtscp_ns', '?')}); every per-round-trip sample holds about "
                 f"one read")
    if res.get("c_tool", {}).get("error"):
        lines.append(f"  C tool: {res['c_tool']['error']}")
    lines.append(stats_header("round trip (us)"))
    order = ["python", "python-avg10", "c", "c-avg10", "cuMemcpy"]
    for s in res["sizes"]:
        for p in order:
            st = _get(res, p, s)
            if st:
                lines.append(stats_row(f"{fmt_size(s):>8s}  {p}", st))
    b = res["batch"]
    for p in ("python-tick", f"python-batch{b}", "c-tick", f"c-batch{b}", f"c-batch{b}-send",
              f"c-batch{b}-first", f"c-batch{b}-second"):
        st = _get(res, p, res["tick"])
        if st:
            lines.append(stats_row(f"{fmt_size(res['tick']):>8s}  {p}", st))
    lines.extend(summary_lines(res))
    if sim:
        lines.append(f"*** {SIM_LABEL} ***")
    return "\n".join(lines)


def plot(res: dict, path: str) -> None:
    """Median round trip per size and path (bars: min..p99), log scale."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError(f"--plot needs matplotlib ({e}): pip install matplotlib") from None
    sizes = res["sizes"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = np.arange(len(sizes))
    paths = (("python", "tab:blue"), ("c", "tab:green"), ("cuMemcpy", "tab:orange"))
    for k, (name, color) in enumerate(paths):
        got = {s: _get(res, name, s) for s in sizes}
        st = {s: v for s, v in got.items() if v}
        if len(st) != len(sizes):
            continue
        med = [st[s]["median"] for s in sizes]
        lo = [st[s]["median"] - st[s]["min"] for s in sizes]
        hi = [st[s]["p99"] - st[s]["median"] for s in sizes]
        ax.errorbar(xs + (k - 1) * 0.2, med, yerr=[lo, hi], fmt="o", capsize=4, color=color,
                    label=f"{name} (median, min..p99)")
    ax.set_xticks(xs, [fmt_size(s) for s in sizes])
    ax.set_yscale("log")
    ax.set_ylabel("round trip (us)")
    ax.set_title("gdrpy pingpong through gdrpy.Channel" +
                 (f" - {SIM_LABEL}" if res["sim"] else f" - {res['gpu']}"), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
