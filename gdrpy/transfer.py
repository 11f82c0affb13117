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
  stream's earlier work).  Without a stream it waits for none of the
  caller's kernels on either path, as GDRCopy's BAR1 read never does: the
  copy-engine path runs on gdrpy's own non-blocking stream and waits for
  that stream only, so a kernel still writing the range may be seen half
  done (synchronize the kernel's stream first, or pass it as ``stream``).
  It still sees this thread's earlier ``put``/``write`` (they completed).

The default pickers (loaded from this host's cache, calibrated, or the
provisional defaults) come from :func:`gdrpy.threshold.context.default_picker`,
which also states the calibration policy.
"""

from __future__ import annotations

import errno

from . import _core
from ._core import Mapping, Pin
from .errors import ArgumentTypeError, InvalidArgumentError
from .staging import default_plan
from .threshold.context import default_picker

__all__ = ["put", "get", "Transfer", "default_picker"]


class Transfer(_core.Transfer):
    """put/get on one mapping with automatic path choice (the binding's
    Transfer, see there) with the context's shared defaults:
    ``Transfer(mapping, picker=None, picker_locked=None, plan=None)``.

    ``picker`` None: the default picker for pageable host memory and, unless
    ``picker_locked`` is given, the one for page-locked memory
    (:func:`default_picker`); a ``picker`` given alone serves both kinds.
    ``plan`` None: the context's staging plan (:func:`gdrpy.staging.default_plan`).
    """

    __slots__ = ()

    def __new__(cls, mapping: Mapping, picker=None, picker_locked=None, plan=None):
        if picker is None or plan is None:
            ctx = _core.Transfer._context_of(mapping)   # an open Mapping, or the error
            if picker is None:
                picker = default_picker(ctx)
                if picker_locked is None:
                    picker_locked = default_picker(ctx, "locked")
            if plan is None:
                plan = default_plan(ctx)
        if picker_locked is None:
            picker_locked = picker
        return super().__new__(cls, mapping, picker, picker_locked, plan)


# Mapping.transfer() (in the binding) makes its Transfer with these defaults.
_core.set_transfer_factory(Transfer)


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


