"""``python -m gdrpy info``: versions, copy kernel, GPUs seen, each backend and why
not, and what ``auto`` picks."""

from __future__ import annotations

import json
import os
import platform


def _gpus():
    """(list of (index, name, pci bus id), reason if none)."""
    try:
        from cuda.bindings import driver as cu
    except ImportError as e:
        return [], f"cuda-python not importable ({e})"
    try:
        err, = cu.cuInit(0)
    except Exception as e:  # libcuda missing
        return [], f"the CUDA driver could not be loaded ({e})"
    if int(err) != 0:
        name = cu.cuGetErrorName(err)[1]
        name = name.decode() if isinstance(name, bytes) else str(name)
        return [], f"cuInit failed: {name} (no NVIDIA GPU or driver on this machine)"
    err, n = cu.cuDeviceGetCount()
    out = []
    for i in range(int(n)):
        _, dev = cu.cuDeviceGet(i)
        _, raw = cu.cuDeviceGetName(64, dev)
        name = raw.split(b"\0", 1)[0].decode(errors="replace")
        _, bus = cu.cuDeviceGetPCIBusId(32, dev)
        bus = bus.split(b"\0", 1)[0].decode(errors="replace")
        out.append((i, name, bus))
    return out, ("" if out else "the CUDA driver reports no devices")


def _locality(auto_info) -> dict | None:
    """The GPU's NUMA node and nearby CPUs (sysfs), when a GPU backend works."""
    if not auto_info or not auto_info.get("pci_bus_id"):
        return None
    from ..numa import device_locality
    return device_locality(pci_bus_id=auto_info["pci_bus_id"])


def _print_nvrm(st: dict) -> None:
    t = st["table"]
    newer = ", driver newer than every table" if t["driver_newer_than_tables"] else ""
    cv = st["cuda_driver"]
    print(f"nvrm self-test: {st['selftest_ms']:.2f} ms; driver {st['driver']}, CUDA "
          f"{cv // 1000}.{cv % 1000 // 10}; ABI table {t['branch']} (tag {t['tag']}{newer})")
    names = {"A": "route A (cuMemCreate)", "C": "route C (cuMemAlloc) "}
    for r, name in names.items():
        rep = st["routes"][r]
        if rep["ok"]:
            extra = ""
            lay = rep.get("ipc_layout")
            if lay:
                extra = (f" (IPC words: size {lay['size']}, offset {lay['offset']}, client "
                         f"{lay['client']}, memory {lay['memory']}; {lay['how']})")
            print(f"  {name}: ok{extra}")
        else:
            print(f"  {name}: disabled at \"{rep['step']}\": {rep['detail']}")


def cmd_info(args) -> int:
    import gdrpy
    gpus, why_no_gpu = _gpus()
    device = args.device
    backends = {}
    for name in gdrpy.backend_names()[1:]:
        ok, why = gdrpy.probe(name, device)
        backends[name] = {"available": ok, "why": why}
    nvrm_st = None
    if backends.get("nvrm", {}).get("available"):
        nvrm_st = gdrpy.nvrm_selftest(device)
        if nvrm_st is not None and not nvrm_st["usable"]:
            backends["nvrm"] = {"available": False, "why": nvrm_st["reason"]}
    auto = None
    auto_err = None
    try:
        with gdrpy.open(device, "auto") as ctx:
            auto = ctx.backend
            auto_info = ctx.info
    except gdrpy.GdrError as e:
        auto_err = str(e)
        auto_info = None
    env_backend = os.environ.get("GDRPY_BACKEND")
    data = {
        "version": gdrpy.__version__,
        "library_version": gdrpy.library_version(),
        "copy_kernel": gdrpy.copy_isa(),
        "copy_kernels_available": gdrpy.copy_isa_available(),
        "copy_kernel_notes": gdrpy.copy_isa_notes(),
        "machine": platform.machine(),
        "gpus": [{"index": i, "name": n, "pci_bus_id": b} for i, n, b in gpus],
        "no_gpu_reason": why_no_gpu or None,
        "device": device,
        "backends": backends,
        "GDRPY_BACKEND": env_backend,
        "auto": auto,
        "auto_error": auto_err,
        "auto_info": auto_info,
        "nvrm_selftest": nvrm_st,
        "libdir": gdrpy.libdir(),
        "gpu_locality": _locality(auto_info),
    }
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"gdrpy {data['version']} (libgdrpy {data['library_version']})")
    print(f"copy kernel: {data['copy_kernel']} "
          f"(this CPU can run: {', '.join(data['copy_kernels_available'])})")
    for note in data["copy_kernel_notes"]:
        print(f"  {note}")
    if data["machine"] in ("aarch64", "arm64"):
        print("aarch64: kernels, fences and the sim backend are tested under emulation; "
              "BAR1 ordering and the nvrm backend are unverified on Arm hardware "
              "(docs/arm.md)")
    if gpus:
        print(f"GPUs seen by the CUDA driver: {len(gpus)}")
        for i, n, b in gpus:
            print(f"  {i}: {n} [{b}]")
    else:
        print(f"GPUs: none ({why_no_gpu})")
    print(f"backends on device {device}:")
    for name, b in backends.items():
        if name == "sim":
            state = ("available - host memory standing in for a GPU; used only when asked "
                     "for (backend='sim' or GDRPY_BACKEND=sim)") if b["available"] else \
                f"unavailable: {b['why']}"
        else:
            state = "available" if b["available"] else f"unavailable: {b['why']}"
        print(f"  {name:7s} {state}")
    if nvrm_st is not None:
        _print_nvrm(nvrm_st)
    if env_backend:
        print(f"GDRPY_BACKEND={env_backend} (overrides auto)")
    if auto:
        extra = " (SIM: no GPU is used)" if auto == "sim" else ""
        print(f"auto selects: {auto}{extra}")
        if auto_info and auto != "sim":
            print(f"  {auto_info['gpu_name']} [{auto_info['pci_bus_id']}] "
                  f"driver {auto_info['driver_version']}")
            loc = data["gpu_locality"]
            if loc and loc.get("pci_bus_id"):
                print(f"  NUMA node {loc['numa_node']}, nearby CPUs "
                      f"{loc['local_cpulist'] or '?'}"
                      + (f" ({loc['why']})" if loc.get("why") else ""))
    else:
        print("auto selects: nothing - no GPU backend works on this machine.")
        print("  To run everything on host memory instead, use backend='sim' or "
              "GDRPY_BACKEND=sim (the sim backend; no GPU involved).")
    print(f"libgdrapi drop-in: {data['libdir']}")
    return 0
