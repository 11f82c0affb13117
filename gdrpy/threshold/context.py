"""The pickers of open gdrpy contexts: one shared :class:`ThresholdPicker` per
(device, backend, host-memory kind), and the calibration that measures real
transfers on a context.

Unlike the rest of :mod:`gdrpy.threshold` (pure Python, nothing of gdrpy) this
module drives the library: it allocates and pins device memory (:mod:`gdrpy.memory`),
reads the staging plan (:mod:`gdrpy.staging`) and the host identity
(:mod:`gdrpy.identity`).  The package's ``__init__`` does not import it, so the
staging plan can use the package's cache helpers without a loop.

Calibration policy: on first use per (device, backend, kind) the picker loads this
host's thresholds from the cache.  If there are none (first run, identity changed,
corrupt cache) and the backend is a real GPU backend, it calibrates (a few seconds)
and stores the result, unless ``GDRPY_AUTOCALIBRATE=0``; then it uses the
provisional defaults, adapted online.  On ``sim`` it never calibrates automatically.
``python -m gdrpy calibrate`` recalibrates on demand.
"""

from __future__ import annotations

import errno
import os
import threading
import time
import warnings

import numpy as np

from .. import memory
from ..errors import InvalidArgumentError
from ..identity import host_identity
from ..staging import SCHEMA as STAGING_SCHEMA
from ..staging import default_plan
from .model import ThresholdPicker

__all__ = ["CALIBRATION_MAX_BYTES", "HOST_KINDS", "calibrate_context", "default_picker",
           "make_measure", "picker_identity", "set_default_picker"]

#: The host-memory kinds a context has a picker for: pageable (numpy arrays, bytes)
#: and page-locked ('locked': gdrpy host buffers, registrations, pinned memory).
HOST_KINDS = ("pageable", "locked")
#: The largest message a calibration times (its buffers' size).
CALIBRATION_MAX_BYTES = 64 << 20

_pickers: dict = {}
_pickers_lock = threading.Lock()


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
        ident["staging"] = STAGING_SCHEMA
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


def set_default_picker(ctx, picker: ThresholdPicker, kind: str = "pageable") -> None:
    """Install ``picker`` as the shared picker of ``ctx``'s (device, backend) for
    host memory of ``kind`` (Transfers made from now on use it)."""
    with _pickers_lock:
        _pickers[(ctx.device, ctx.backend, _check_kind(kind))] = picker


def make_measure(ctx, max_bytes: int = CALIBRATION_MAX_BYTES, kind: str = "pageable"):
    """A ``measure(direction, path, nbytes, iters)`` callback for the picker
    that times real transfers on ``ctx`` (through the same Python entry points
    a user calls) with host memory of ``kind``: 'pageable' (a numpy array;
    the copy-engine side is direct or staged as the staging plan says) or
    'locked' (a gdrpy host buffer, copied directly).  Returns (measure, close)."""
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
    """Calibrate ``picker`` with transfers on ``ctx`` (:func:`make_measure`) within
    ``budget_s`` seconds; stores the result in the cache if ``save``."""
    measure, close = make_measure(ctx, max_bytes, kind)
    try:
        return picker.calibrate(measure, budget_s=budget_s, progress=progress, save=save)
    finally:
        close()
