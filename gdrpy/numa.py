"""Where the CPU runs relative to the GPU.

A CPU store to BAR1 and the GPU's answer in host memory cross the
CPU<->PCIe path; from a core on the GPU's own NUMA node (socket) that path
is shortest.  ``device_locality(ctx)`` reads the GPU's NUMA node and its
nearby CPUs from sysfs (``/sys/bus/pci/devices/<bus id>/numa_node`` and
``local_cpulist``); ``near_cpu(ctx)`` picks one of those CPUs and
``pin_thread_near_gpu(ctx)`` restricts the calling thread to it
(``os.sched_setaffinity``).  The sim backend has no
GPU: both report that and change nothing.
"""

from __future__ import annotations

import os

__all__ = ["device_locality", "near_cpu", "parse_cpulist", "pin_thread_near_gpu",
           "sysfs_pci_dir"]

SYSFS_PCI = "/sys/bus/pci/devices"


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    out: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def sysfs_pci_dir(pci_bus_id: str, root: str = SYSFS_PCI) -> str:
    """The sysfs directory of a PCI device given CUDA's bus id
    ('00000000:41:00.0' or '0000:41:00.0')."""
    bid = pci_bus_id.strip().lower()
    dom, rest = bid.split(":", 1)
    return os.path.join(root, f"{int(dom, 16):04x}:{rest}")


def device_locality(ctx=None, pci_bus_id: str | None = None, root: str = SYSFS_PCI) -> dict:
    """dict: pci_bus_id, numa_node (-1: none/unknown), local_cpus (list),
    local_cpulist (text), allowed_local_cpus (also in this process's
    affinity), why (set when something could not be read)."""
    if pci_bus_id is None and ctx is not None:
        pci_bus_id = "" if ctx.is_sim else (ctx.info.get("pci_bus_id") or "")
    res: dict = {"pci_bus_id": pci_bus_id or None, "numa_node": -1, "local_cpus": [],
                 "local_cpulist": "", "allowed_local_cpus": [], "why": None}
    if not pci_bus_id:
        res["why"] = "no GPU (sim backend or no PCI bus id)"
        return res
    try:
        d = sysfs_pci_dir(pci_bus_id, root)
    except ValueError:
        res["why"] = f"unparsable PCI bus id {pci_bus_id!r}"
        return res
    why: list[str] = []
    try:
        with open(os.path.join(d, "numa_node")) as f:
            res["numa_node"] = int(f.read().strip())
    except (OSError, ValueError) as e:
        why.append(f"cannot read {d}/numa_node: {e}")
    try:
        with open(os.path.join(d, "local_cpulist")) as f:
            res["local_cpulist"] = f.read().strip()
        res["local_cpus"] = parse_cpulist(res["local_cpulist"])
    except (OSError, ValueError) as e:
        why.append(f"cannot read {d}/local_cpulist: {e}")
    res["why"] = "; ".join(why) or None
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        allowed = set(res["local_cpus"])
    res["allowed_local_cpus"] = [c for c in res["local_cpus"] if c in allowed]
    return res


def near_cpu(ctx) -> int | None:
    """The CPU near the GPU that gdrpy pins to: the last local CPU in this
    process's affinity (the first ones tend to take interrupts), or None
    when there is none (sim, no locality information, none allowed)."""
    cands = device_locality(ctx)["allowed_local_cpus"]
    return cands[-1] if cands else None


def pin_thread_near_gpu(ctx, cpu: int | None = None) -> int | None:
    """Restrict the calling thread to one CPU near the GPU (``cpu``, or
    ``near_cpu(ctx)``).  Returns the CPU, or None when there is nothing to
    pin to (sim, no locality information, or no local CPU in this
    process's affinity)."""
    if cpu is None:
        cpu = near_cpu(ctx)
        if cpu is None:
            return None
    os.sched_setaffinity(0, {cpu})
    return cpu
