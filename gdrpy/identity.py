"""What this host's measurements depend on: the identity a threshold picker or a
staging plan is stored under (``python -m gdrpy calibrate``) and the one a benchmark
header reports.

A cached calibration is used only while every field is unchanged: a new GPU,
driver, backend, CPU, NUMA node, gdrpy version or copy kernel means new figures.
"""

from __future__ import annotations

import platform

from ._core import copy_isa
from ._version import __version__
from .numa import device_locality

__all__ = ["cpu_model", "gpu_uuid", "host_identity", "numa_node"]


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what :mod:`platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numa_node(pci_bus_id: str) -> int:
    """The NUMA node of the GPU at ``pci_bus_id`` (sysfs), -1 when unknown or on sim."""
    return device_locality(pci_bus_id=pci_bus_id or "")["numa_node"]


def gpu_uuid(device: int) -> str:
    """The GPU's UUID (hex) from the CUDA driver, "unknown" when it cannot be read."""
    try:
        from .memory import cuda_driver
        cu = cuda_driver()
        err, dev = cu.cuDeviceGet(device)
        err, uuid = cu.cuDeviceGetUuid(dev)
        return bytes(uuid.bytes).hex()
    except Exception:
        return "unknown"


def host_identity(ctx) -> dict:
    """What the calibration depends on: GPU, driver, backend, CPU, NUMA node,
    gdrpy version and copy kernel."""
    info = ctx.info
    return {
        "gpu_uuid": "sim" if ctx.is_sim else gpu_uuid(ctx.device),
        "gpu_name": info["gpu_name"],
        "pci_bus_id": info["pci_bus_id"],
        "driver_version": info["driver_version"],
        "backend": ctx.backend,
        "cpu_model": cpu_model(),
        "numa_node": numa_node(info["pci_bus_id"]),
        "gdrpy_version": __version__,
        "copy_kernel": copy_isa(),
    }
