"""Which objects gdrpy accepts as CUDA streams (``stream=`` arguments).

A stream handle is a pointer the driver dereferences: a wrong integer can
crash the process inside the driver (on an H100, ``cuMemcpyHtoDAsync`` on
``0xdeadbeef`` is a SIGSEGV).  The driver offers no safe way to ask whether
an integer is a stream (``cuStreamQuery``/``cuStreamGetCtx`` dereference
the handle the same way), so gdrpy accepts only objects that prove they are
streams, and checks their type before any driver call:

* ``None``: no stream (synchronous copy);
* the default-stream values ``0`` (the legacy default stream, also
  ``CU_STREAM_LEGACY`` = ``1``) and ``2`` (``CU_STREAM_PER_THREAD``);
* objects implementing the ``__cuda_stream__`` protocol (cuda.core
  ``Stream``, and any library that adopts it): it returns
  ``(version, handle)``;
* cuda-python (``cuda.bindings``) ``CUstream`` and ``cudaStream_t``;
* CuPy streams (``cupy.cuda.Stream``, ``ExternalStream``: ``.ptr``) and
  PyTorch streams (``torch.cuda.Stream``, ``ExternalStream``:
  ``.cuda_stream``);
* :class:`RawStream` (or ``unchecked_stream(handle)``): the one door for a
  raw integer handle, e.g. one received from C.  It is **not checked**: a
  handle that is not a live stream of the current context is undefined
  behaviour in the driver, exactly as in C.

Anything else (other integers, floats, strings, arbitrary objects with a
``ptr`` attribute, ...) raises :class:`~gdrpy.errors.ArgumentTypeError`
(a TypeError) before any driver call.  The binding applies these rules
(:func:`stream_handle`, gdrpy/_binding/interop.pxi) to every ``stream=``.
"""

from __future__ import annotations

import errno

from ._core import DEFAULT_STREAM_VALUES, stream_handle
from .errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["DEFAULT_STREAM_VALUES", "RawStream", "stream_handle", "unchecked_stream"]

_U64 = 1 << 64


class RawStream:
    """An explicitly unchecked raw ``CUstream`` handle (an int).

    ``stream=gdrpy.RawStream(h)`` passes ``h`` to the driver as is: gdrpy
    cannot verify it, and a handle that is not a live stream may crash the
    process inside the driver.  Prefer passing the stream object itself."""

    __slots__ = ("handle",)

    def __init__(self, handle: int) -> None:
        if isinstance(handle, bool) or not isinstance(handle, int):
            raise ArgumentTypeError(
                f"RawStream takes an int handle, not {type(handle).__name__}")
        if not 0 <= handle < _U64:
            raise InvalidArgumentError(f"stream handle {handle:#x} is not a 64-bit pointer",
                                       errno.EINVAL)
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)

    def __repr__(self) -> str:
        return f"gdrpy.RawStream({self.handle:#x})"


def unchecked_stream(handle: int) -> RawStream:
    """``RawStream(handle)``: the documented door for raw integer handles."""
    return RawStream(handle)
