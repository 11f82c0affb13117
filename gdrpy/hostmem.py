"""Page-locked host memory for the copy engines.

* :func:`host_alloc` - page-locked memory (cuMemHostAlloc, portable): a
  :class:`HostBuffer`, a writable uint8 buffer (buffer protocol with counted
  exports, ``__array_interface__``, ``numpy()``) and a context manager.  Puts
  from and gets into it run at the copy engines' speed.
* :func:`register` / ``Context.register(obj)`` - page-locks a caller's
  long-lived buffer (cuMemHostRegister) for the lifetime of the returned
  :class:`Registration` (a context manager).  The registration holds a buffer
  export on the object, so the memory cannot be freed or resized while it is
  registered; closing unregisters first, then lets go of the object.  Nothing
  is cached by address: after ``close()`` no copy path knows the range, so a
  stale entry cannot exist.  What ends a registration: ``close()``, leaving
  the ``with`` block, or the Registration being garbage-collected.
* :func:`kind_of` - 'pinned', 'registered', 'page-locked' (cudaHostAlloc,
  torch ``pin_memory()``, CuPy pinned memory, another registration) or
  'pageable', asked afresh each time.

Registration costs a system call per page range and pins memory: register
buffers that are reused (rings, snapshots), not one-shot messages; one-shot
pageable messages go through the context's staging ring instead.
"""

from __future__ import annotations

from typing import Any

from . import _core
from .context import open as gopen

__all__ = ["HostBuffer", "Registration", "host_alloc", "kind_of", "live", "register"]

HostBuffer = _core.HostBuffer
Registration = _core.Registration


def _ctx(ctx: Any, device: int):
    if ctx is not None:
        return ctx, False
    return gopen(device), True


def host_alloc(nbytes: int, device: int = 0, ctx: Any = None) -> HostBuffer:
    """``nbytes`` of page-locked host memory usable with ``ctx``'s device
    (without ``ctx``: a context on ``device`` is opened for the call; the
    buffer outlives it).  On a sim context: pre-faulted anonymous memory."""
    c, owned = _ctx(ctx, device)
    try:
        return _core.host_alloc(c, nbytes)
    finally:
        if owned:
            c.close()


def register(obj: Any, ctx: Any) -> Registration:
    """Page-lock ``obj``'s memory until the returned Registration closes."""
    return _core.host_register(ctx, obj)


def kind_of(obj: Any, ctx: Any) -> str:
    """The host-memory kind of ``obj`` (see the module docstring)."""
    return _core.host_kind(ctx, obj)


def live() -> int:
    """Live gdrpy host allocations and registrations in this process."""
    return int(_core.host_live())
