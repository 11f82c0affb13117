"""Where the feed's threads run, and what else ran there: CPU placement
(one physical core each, away from CPU 0 and from the CPUs that take device
interrupts) and, per measured point, the operating system's own counters for
those CPUs (steal time, interrupt and softirq time, NET_RX softirqs, the
CPU's ksoftirqd thread's run and wait time).  Linux only; every reader
returns nothing where a file is missing.  Example code."""

from __future__ import annotations

import os

ROLES = ("sender", "handler", "collector", "consumer", "rps")
# host-wide /proc/vmstat counters that stall a thread without a context
# switch: NUMA balancing's hinting faults, page migration, THP compaction
VMSTAT = ("numa_hint_faults", "numa_pages_migrated", "numa_pte_updates", "compact_stall",
          "thp_fault_alloc", "pgmajfault")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def core_of(cpu: int) -> tuple:
    """(package, core) of a CPU: CPUs with the same key are SMT siblings."""
    base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
    pkg = _read(base + "physical_package_id").strip()
    core = _read(base + "core_id").strip()
    return (pkg, core) if core else (cpu,)


def device_irqs() -> dict[int, int]:
    """Per CPU, the interrupts of devices (numbered rows of /proc/interrupts:
    not the timer, IPIs, ...) since boot."""
    text = _read("/proc/interrupts").splitlines()
    if not text:
        return {}
    cpus = [int(c[3:]) for c in text[0].split() if c.startswith("CPU")]
    out = dict.fromkeys(cpus, 0)
    for line in text[1:]:
        name, _, rest = line.partition(":")
        if not name.strip().isdigit():
            continue
        vals = rest.split()
        for c, v in zip(cpus, vals, strict=False):
            if v.isdigit():
                out[c] += int(v)
    return out


def sys_irqs() -> dict[str, dict[int, int]]:
    """Per CPU, the architecture's own interrupt rows of /proc/interrupts
    since boot: LOC (local timer), RES, CAL, TLB (IPIs)."""
    text = _read("/proc/interrupts").splitlines()
    if not text:
        return {}
    cpus = [int(c[3:]) for c in text[0].split() if c.startswith("CPU")]
    out: dict[str, dict[int, int]] = {}
    for line in text[1:]:
        name, _, rest = line.partition(":")
        name = name.strip()
        if name not in ("LOC", "RES", "CAL", "TLB"):
            continue
        out[name] = {c: int(v) for c, v in zip(cpus, rest.split(), strict=False) if v.isdigit()}
    return out


def pick(candidates: list[int], n: int = 4) -> list[int]:
    """n CPUs of `candidates` (in preference order), one per physical core,
    never CPU 0's core, fewest device interrupts first; fewer cores than n:
    SMT siblings are used too (then the result says so in `describe`)."""
    irq = device_irqs()
    zero = core_of(0)
    cores: dict[tuple, list[int]] = {}
    for c in candidates:
        k = core_of(c)
        if k == zero and len(candidates) > n:
            continue
        cores.setdefault(k, []).append(c)
    order = sorted(cores.values(), key=lambda cs: (sum(irq.get(c, 0) for c in cs), cs[0]))
    chosen = [cs[0] for cs in order][:n]
    if len(chosen) < n:            # not enough cores: siblings too
        rest = [c for cs in order for c in cs[1:]]
        chosen += rest[:n - len(chosen)]
    return chosen


def spare_cpu(used, allowed) -> int | None:
    """A CPU of `allowed` on a physical core none of `used` (CPUs, -1 = not
    pinned) is on, the highest such; None when every core is taken."""
    busy = {core_of(c) for c in used if c is not None and c >= 0}
    free = [c for c in sorted(allowed) if core_of(c) not in busy]
    return free[-1] if free else None


def describe(cpus: list[int]) -> str:
    cores = [core_of(c) for c in cpus]
    shared = len(set(cores)) < len(cores)
    irq = device_irqs()
    return (f"{'; SMT siblings shared' if shared else 'one physical core each'}; device "
            f"interrupts since boot " + ", ".join(f"cpu{c} {irq.get(c, '?')}" for c in cpus))


# ---------------------------------------------------------------------------
# counters

def _ksoftirqd_pids() -> dict[int, int]:
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        comm = _read(f"/proc/{d}/comm").strip()
        if comm.startswith("ksoftirqd/"):
            try:
                out[int(comm.split("/")[1])] = int(d)
            except ValueError:
                pass
    return out


_KSOFT: dict[int, int] | None = None


def snapshot(cpus: list[int]) -> dict:
    """The counters of `cpus` now (see delta)."""
    global _KSOFT
    if _KSOFT is None:
        _KSOFT = _ksoftirqd_pids()
    snap: dict = {"hz": os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100}
    stat = {}
    for line in _read("/proc/stat").splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            f = line.split()
            stat[int(f[0][3:])] = [int(x) for x in f[1:9]]
    soft = {}
    lines = _read("/proc/softirqs").splitlines()
    if lines:
        cols = [int(c[3:]) for c in lines[0].split()]
        for line in lines[1:]:
            name, _, rest = line.partition(":")
            soft[name.strip()] = dict(zip(cols, (int(v) for v in rest.split()), strict=False))
    irq = device_irqs()
    sirq = sys_irqs()
    vm = {}
    for line in _read("/proc/vmstat").splitlines():
        k, _, v = line.partition(" ")
        if k in VMSTAT and v.strip().isdigit():
            vm[k] = int(v)
    snap["vm"] = vm
    for c in cpus:
        if c < 0:
            continue
        ks = _read(f"/proc/{_KSOFT.get(c, -1)}/schedstat").split()
        snap[c] = {"stat": stat.get(c), "net_rx": soft.get("NET_RX", {}).get(c),
                   "timer": soft.get("TIMER", {}).get(c), "dev_irqs": irq.get(c),
                   "loc": sirq.get("LOC", {}).get(c),
                   "ipis": sum(sirq[k].get(c, 0) for k in ("RES", "CAL", "TLB") if k in sirq)
                   if sirq else None,
                   "ksoftirqd": [int(x) for x in ks[:3]] if len(ks) >= 3 else None}
    return snap


def delta(a: dict, b: dict, roles: dict[str, int]) -> dict:
    """Per role: what its CPU did between snapshots a and b (ms; counts)."""
    hz = a.get("hz", 100)
    out: dict = {}
    va, vb = a.get("vm", {}), b.get("vm", {})
    vm = {k: vb[k] - va[k] for k in VMSTAT if k in va and k in vb and vb[k] != va[k]}
    if vm:
        out["host_vmstat"] = vm
    for role, c in roles.items():
        if c < 0 or c not in a or c not in b:
            continue
        x, y = a[c], b[c]
        r: dict = {"cpu": c}
        if x["stat"] and y["stat"]:
            d = [q - p for p, q in zip(x["stat"], y["stat"], strict=True)]
            # user nice system idle iowait irq softirq steal (clock ticks)
            r.update(busy_ms=(d[0] + d[1] + d[2]) * 1000 / hz, irq_ms=d[5] * 1000 / hz,
                     softirq_ms=d[6] * 1000 / hz, steal_ms=d[7] * 1000 / hz,
                     idle_ms=d[3] * 1000 / hz)
        for k in ("net_rx", "timer", "dev_irqs", "loc", "ipis"):
            if x.get(k) is not None and y.get(k) is not None:
                r[k] = y[k] - x[k]
        if x["ksoftirqd"] and y["ksoftirqd"]:
            r["ksoftirqd_run_ms"] = (y["ksoftirqd"][0] - x["ksoftirqd"][0]) / 1e6
            r["ksoftirqd_wait_ms"] = (y["ksoftirqd"][1] - x["ksoftirqd"][1]) / 1e6
            r["ksoftirqd_slices"] = y["ksoftirqd"][2] - x["ksoftirqd"][2]
        out[role] = r
    return out


def evidence_row(rec: dict) -> str:
    """One line: the stall evidence of a point (threads and CPUs)."""
    parts = []
    snd = rec.get("sender") or {}
    st = rec.get("handler_stats") or {}
    col = rec.get("collector") or {}
    if snd:
        parts.append(f"sender max gap {snd.get('max_gap_us', 0):.0f} us "
                     f"({snd.get('gaps_over_50us', 0)}, "
                     f"{snd.get('ctx_switches_involuntary', '?')}; yields included)")
    if st:
        parts.append(f"handler {st.get('max_gap_ns', 0) / 1e3:.0f} us "
                     f"({st.get('gaps_50us', 0)}, {st.get('ctx_invol', '?')})")
    if col:
        parts.append(f"collector {col.get('max_gap_ns', 0) / 1e3:.0f} us "
                     f"({col.get('gaps_50us', 0)}, {col.get('ctx_invol', '?')})")
    flt = [f"{k} {d.get('minflt')}" for k, d in (("sender", snd), ("handler", st),
                                                  ("collector", col)) if d.get("minflt")]
    if flt:
        parts.append("minor faults " + ", ".join(flt))
    for role, r in (rec.get("os") or {}).items():
        if role == "host_vmstat":
            parts.append("host " + ", ".join(f"{k} {v}" for k, v in r.items()))
            continue
        if "steal_ms" not in r:
            continue
        s = (f"{role} cpu{r['cpu']}: steal {r['steal_ms']:.0f} ms, irq+softirq "
             f"{r['irq_ms'] + r['softirq_ms']:.0f} ms, NET_RX {r.get('net_rx', '?')}")
        if "loc" in r:
            s += f", local timer irqs {r['loc']}, IPIs {r.get('ipis', '?')}"
        if "ksoftirqd_run_ms" in r:
            s += (f", ksoftirqd run {r['ksoftirqd_run_ms']:.1f} ms wait "
                  f"{r['ksoftirqd_wait_ms']:.1f} ms")
        parts.append(s)
    return "      stalls (max gap, gaps > 50 us, involuntary switches): " + "; ".join(parts)


def stall_row(rec: dict) -> str:
    """One line: what the stall probe (engine.StallProbe) saw during the
    point - how often the host stopped a spinning thread and for how long."""
    hs = rec.get("host_stalls")
    if not hs:
        return ""
    if hs.get("skipped"):
        return f"      host stalls: not measured ({hs['skipped']})"
    if hs.get("per_s") is None:
        return f"      host stalls: the probe on CPU {hs['cpu']} ran for no measurable time"
    d, i = hs.get("duration_us") or {}, hs.get("interval_us") or {}
    s = (f"      host stalls (a thread spinning on the clock on CPU {hs['cpu']}, gaps over "
         f"{hs['threshold_us']:g} us): {hs['per_s']:,.0f}/s, {hs['stalled_fraction']:.2%} of "
         f"the time")
    if d.get("n"):
        s += f"; each median {d['median']:.1f} us, p99 {d['p99']:.1f}, max {d['max']:.0f}"
    if i.get("n"):
        s += f"; one to the next median {i['median']:,.0f} us"
    return s


# ---------------------------------------------------------------------------
# loopback receive processing (RPS)

RPS_PATH = "/sys/class/net/lo/queues/rx-0/rps_cpus"


def set_loopback_rps(cpu: int) -> tuple[str | None, str]:
    """Steer the kernel's receive processing of loopback packets (the NET_RX
    softirq: IP and UDP receive, socket enqueue) to `cpu` with RPS.  Without
    it that work runs on the SENDING CPU, inside the sender's sendmmsg (on a
    real feed host it runs on the receiving host's interrupt CPU).  Needs
    root.  Returns (previous mask to restore or None, what happened)."""
    old = _read(RPS_PATH).strip()
    if not old:
        return None, f"loopback RPS not available ({RPS_PATH} missing)"
    words = old.split(",")
    mask = 1 << cpu
    nwords = max(len(words), cpu // 32 + 1)
    new = ",".join(f"{(mask >> (32 * (nwords - 1 - k))) & 0xFFFFFFFF:08x}"
                   for k in range(nwords))
    try:
        with open(RPS_PATH, "w") as f:
            f.write(new)
    except OSError as e:
        return None, f"loopback RPS not set ({e.strerror}; needs root)"
    return old, f"loopback receive processing steered to CPU {cpu} (RPS mask {new}, was {old})"


def restore_loopback_rps(old: str | None) -> None:
    if old is None:
        return
    try:
        with open(RPS_PATH, "w") as f:
            f.write(old)
    except OSError:
        pass
