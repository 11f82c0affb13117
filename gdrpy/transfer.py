"""Transfer engine: ``put`` (host -> GPU) and ``get`` (GPU -> host) on a
pinned, mapped buffer, each message sent over the faster path for its size.

* Small messages go through the mapping (CPU stores + sfence, or streaming
  loads); large ones through the copy engine (cuMemcpy, from C, without the
  GIL).  The crossover per direction comes from a :class:`ThresholdPicker`
  (gdrpy.threshold) that is calibrated on this host, persisted per host
  identity, and adapted online.
* ``gdrpy.put(m, offset, src)`` / ``gdrpy.get(m, offset, out)`` use the
  mapping's cached :class:`~gdrpy.Transfer`; in a hot loop keep
  ``t = m.transfer()`` and call ``t.put`` / ``t.get`` directly.

Ordering rules
--------------
* After ``put`` returns (no stream), the data is in GPU memory's write path:
  the mapping path ends with an ``sfence``, and PCIe keeps the CPU's posted
  writes to the GPU in order, so a kernel launched afterwards (from this
  thread) sees the data.  The copy-engine path is a synchronous cuMemcpyHtoD.
* With ``stream=``: the mapping path first waits for the stream's earlier
  work, the copy-engine path is enqueued on the stream; kernels enqueued on
  that stream afterwards see the data.
* A *running* (persistent) kernel must not poll the payload itself: write
  the payload, then a flag (a separate ``put``/``write`` after the payload;
  the sfence between them orders them), and have the kernel poll the flag
  with a volatile load, then issue ``__threadfence()`` (or an acquire load,
  ``ld.acquire.sys``) before reading the payload.
* ``get`` returns when the data is in host memory (with a stream: after the
  stream's earlier work).

Calibration policy
------------------
On first use per (device, backend) the picker loads this host's thresholds
from the cache.  If there are none (first run, identity changed, corrupt
cache) and the backend is a real GPU backend, it calibrates (a few seconds)
and stores the result, unless ``GDRPY_AUTOCALIBRATE=0``; then it uses the
provisional defaults, adapted online.  On ``sim`` it never calibrates
automatically.  ``python -m gdrpy calibrate`` recalibrates on demand.
"""

from __future__ import annotations

import errno
import os
import platform
import threading
import time
import warnings

import numpy as np

from ._core import Mapping, Pin, Transfer
from .errors import ArgumentTypeError, InvalidArgumentError
from .threshold import ThresholdPicker

__all__ = ["put", "get", "Transfer", "default_picker", "host_identity", "make_measure",
           "calibrate_context"]

_pickers: dict = {}
_pickers_lock = threading.Lock()
CALIBRATION_MAX_BYTES = 64 << 20


def _mapping_of(obj) -> Mapping:
    if isinstance(obj, Mapping):
        return obj
    if isinstance(obj, Pin):
        m = obj.mapping
        if m is None:
            raise InvalidArgumentError("the pin is not mapped: call pin.map() first",
                                       errno.EINVAL)
        return m
    raise ArgumentTypeError(f"expected a gdrpy Mapping (or a mapped Pin), not {type(obj).__name__}")


def put(dst, offset, src, stream=None) -> int:
    """Host -> GPU: write ``src`` at ``offset`` of mapping ``dst``."""
    return _mapping_of(dst).transfer().put(offset, src, stream)


def get(src, offset, out, stream=None):
    """GPU -> host: ``out`` is a byte count (returns bytes) or a writable buffer."""
    return _mapping_of(src).transfer().get(offset, out, stream)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _numa_node(pci_bus_id: str) -> int:
    if not pci_bus_id or pci_bus_id == "sim":
        return -1
    try:
        with open(f"/sys/bus/pci/devices/{pci_bus_id.lower()}/numa_node") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return -1


def _gpu_uuid(device: int) -> str:
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
    from . import __version__, copy_isa
    info = ctx.info
    return {
        "gpu_uuid": "sim" if ctx.is_sim else _gpu_uuid(ctx.device),
        "gpu_name": info["gpu_name"],
        "pci_bus_id": info["pci_bus_id"],
        "driver_version": info["driver_version"],
        "backend": ctx.backend,
        "cpu_model": _cpu_model(),
        "numa_node": _numa_node(info["pci_bus_id"]),
        "gdrpy_version": __version__,
        "copy_kernel": copy_isa(),
    }


HOST_KINDS = ("pageable", "locked")


def _check_kind(kind: str) -> str:
    if kind not in HOST_KINDS:
        raise InvalidArgumentError(f"host memory kind must be one of {HOST_KINDS}, "
                                   f"not {kind!r}", errno.EINVAL)
    return kind


def picker_identity(ctx, kind: str = "pageable") -> dict:
    """The picker's identity: the host's, plus the host-memory kind its copy-engine
    side was measured with."""
    ident = {**host_identity(ctx), "host_memory": _check_kind(kind)}
    if kind == "pageable":      # its copy-engine side is the staging ring's
        from .staging import SCHEMA
        ident["staging"] = SCHEMA
    return ident


def default_picker(ctx, kind: str = "pageable") -> ThresholdPicker:
    """The shared picker of ``ctx``'s (device, backend) for host memory of
    ``kind`` ('pageable' or 'locked' = page-locked): loaded from the cache,
    else calibrated (real GPU backends) or left at the defaults (sim)."""
    key = (ctx.device, ctx.backend, _check_kind(kind))
    with _pickers_lock:
        p = _pickers.get(key)
        if p is not None:
            return p
        p = ThresholdPicker(identity=picker_identity(ctx, kind))
        if not p.load():
            auto = os.environ.get("GDRPY_AUTOCALIBRATE", "1") != "0"
            if auto and not ctx.is_sim and p.uncalibrated():
                try:
                    calibrate_context(ctx, p, budget_s=4.0, kind=kind)
                except Exception as e:  # keep the defaults; never retry on every put
                    p.reason = f"automatic calibration failed ({e}); using the defaults"
                    warnings.warn(f"gdrpy: {p.reason}", RuntimeWarning, stacklevel=3)
        _pickers[key] = p
        return p


def make_measure(ctx, max_bytes: int = CALIBRATION_MAX_BYTES, kind: str = "pageable"):
    """A ``measure(direction, path, nbytes, iters)`` callback for the picker
    that times real transfers on ``ctx`` (through the same Python entry points
    a user calls) with host memory of ``kind``: 'pageable' (a numpy array;
    the copy-engine side is direct or staged as the staging plan says) or
    'locked' (a gdrpy host buffer, copied directly).  Returns (measure, close)."""
    from . import memory
    from .staging import default_plan
    _check_kind(kind)
    buf = memory.alloc(max_bytes, ctx=ctx)
    pin = ctx.pin(buf)
    m = pin.map()
    hb = None
    if kind == "locked":
        hb = memory.host_alloc(max_bytes, ctx=ctx)
        host_mv = memoryview(hb)
    else:
        host = np.zeros(max_bytes, np.uint8)
        host_mv = host.data
    plan = default_plan(ctx)
    perf = time.perf_counter

    def method(direction, nbytes):
        if kind == "locked":
            return "locked"
        return "staged" if nbytes >= plan.staged_min[direction] else "direct"

    def measure(direction, path, nbytes, iters):
        if nbytes > max_bytes:
            raise InvalidArgumentError(f"{nbytes} > calibration buffer {max_bytes}", errno.EINVAL)
        src = host_mv[:nbytes]
        how = method(direction, nbytes)
        if direction == "h2d":
            op = (lambda: m.write(0, src)) if path == "mapping" else \
                (lambda: pin.ce_write(0, src, method=how))
        else:
            op = (lambda: m.read(0, nbytes, src)) if path == "mapping" else \
                (lambda: pin.ce_read(0, nbytes, src, method=how))
        out = []
        for _ in range(iters):
            t0 = perf()
            op()
            out.append(perf() - t0)
        return out

    def close():
        m.close()
        pin.close()
        buf.close()
        if hb is not None:
            host_mv.release()
            hb.close()

    return measure, close


def calibrate_context(ctx, picker: ThresholdPicker, budget_s: float = 8.0, progress=None,
                      save: bool = True, max_bytes: int = CALIBRATION_MAX_BYTES,
                      kind: str = "pageable"):
    measure, close = make_measure(ctx, max_bytes, kind)
    try:
        return picker.calibrate(measure, budget_s=budget_s, progress=progress, save=save)
    finally:
        close()
