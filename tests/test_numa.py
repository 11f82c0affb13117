"""gdrpy.numa: the GPU's NUMA node and nearby CPUs from sysfs (a fake sysfs
tree here; the real one on a GPU machine), and pinning a thread near it."""

from __future__ import annotations

import os
import threading

import pytest
from conftest import GPU_PRESENT

import gdrpy
from gdrpy.numa import (
    device_locality,
    near_cpu,
    parse_cpulist,
    pin_thread_near_gpu,
    sysfs_pci_dir,
)


def test_parse_cpulist():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []
    with pytest.raises(ValueError):
        parse_cpulist("a-b")


def test_sysfs_dir_from_cuda_bus_ids(tmp_path):
    assert sysfs_pci_dir("00000000:41:00.0", str(tmp_path)) == str(tmp_path / "0000:41:00.0")
    assert sysfs_pci_dir("0000:C1:00.0", str(tmp_path)) == str(tmp_path / "0000:c1:00.0")


def test_locality_from_a_fake_sysfs(tmp_path):
    d = tmp_path / "0000:41:00.0"
    d.mkdir()
    (d / "numa_node").write_text("1\n")
    cpus = sorted(os.sched_getaffinity(0))
    (d / "local_cpulist").write_text(f"{cpus[0]}-{cpus[-1]}\n")
    loc = device_locality(pci_bus_id="00000000:41:00.0", root=str(tmp_path))
    assert loc["numa_node"] == 1 and loc["why"] is None
    assert loc["local_cpus"] == list(range(cpus[0], cpus[-1] + 1))
    assert loc["allowed_local_cpus"] == cpus
    missing = device_locality(pci_bus_id="0000:42:00.0", root=str(tmp_path))
    assert missing["numa_node"] == -1 and "numa_node" in missing["why"]


def test_sim_has_no_locality_and_pins_nothing():
    with gdrpy.open(0, "sim") as ctx:
        assert device_locality(ctx)["why"].startswith("no GPU")
        assert near_cpu(ctx) is None
        assert pin_thread_near_gpu(ctx) is None


def test_pin_to_an_explicit_cpu_in_a_thread():
    cpu = max(os.sched_getaffinity(0))
    got = {}

    def body():
        with gdrpy.open(0, "sim") as ctx:
            got["cpu"] = pin_thread_near_gpu(ctx, cpu)
            got["aff"] = os.sched_getaffinity(0)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert got == {"cpu": cpu, "aff": {cpu}}


@pytest.mark.gpu
def test_gpu_locality_is_read_from_sysfs():
    assert GPU_PRESENT
    with gdrpy.open(0) as ctx:
        loc = device_locality(ctx)
        assert loc["pci_bus_id"] and loc["why"] is None, loc
        assert loc["local_cpus"], loc
        assert near_cpu(ctx) == loc["allowed_local_cpus"][-1], loc
