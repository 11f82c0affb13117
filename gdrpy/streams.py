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
(a TypeError) before any driver call.
"""

from __future__ import annotations

import errno

from .errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["DEFAULT_STREAM_VALUES", "RawStream", "stream_handle", "unchecked_stream"]

#: 0 legacy default stream, 1 CU_STREAM_LEGACY, 2 CU_STREAM_PER_THREAD.
DEFAULT_STREAM_VALUES = (0, 1, 2)
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


def _u64(v: object, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ArgumentTypeError(f"{what} must be an int handle, not {type(v).__name__}")
    if not 0 <= v < _U64:
        raise InvalidArgumentError(f"{what} {v:#x} is not a 64-bit pointer", errno.EINVAL)
    return v


def _module_of(obj: object) -> str:
    return type(obj).__module__ or ""


def stream_handle(stream: object) -> int:
    """The CUstream handle (int) of an accepted stream object (0: none)."""
    if stream is None:
        return 0
    if type(stream) is int:
        if stream in DEFAULT_STREAM_VALUES:
            return stream
        raise ArgumentTypeError(
            f"stream={stream:#x}: a raw integer is not accepted as a stream (only the default "
            "stream values 0, 1 = legacy and 2 = per-thread are); pass the stream object "
            "(CuPy, PyTorch, cuda.core, cuda.bindings CUstream), or gdrpy.RawStream(handle) "
            "to pass an unchecked handle on purpose")
    if isinstance(stream, RawStream):
        return stream.handle
    proto = getattr(type(stream), "__cuda_stream__", None)
    if proto is not None:
        attr = stream.__cuda_stream__  # type: ignore[attr-defined]
        val = attr() if callable(attr) else attr
        if not (isinstance(val, tuple) and len(val) == 2 and isinstance(val[0], int)):
            raise InvalidArgumentError(
                f"{type(stream).__name__}.__cuda_stream__ must return (version, handle)",
                errno.EINVAL)
        return _u64(val[1], f"{type(stream).__name__}.__cuda_stream__ handle")
    mod = _module_of(stream)
    name = type(stream).__name__
    if mod.startswith("cuda.") and name in ("CUstream", "cudaStream_t"):
        try:
            return _u64(int(stream), name)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            raise ArgumentTypeError(f"{name} could not be read as a handle") from None
    if mod.startswith("cupy") and hasattr(stream, "ptr"):
        return _u64(stream.ptr, "CuPy stream .ptr")
    if mod.startswith("torch") and hasattr(stream, "cuda_stream"):
        return _u64(stream.cuda_stream, "PyTorch stream .cuda_stream")
    raise ArgumentTypeError(
        f"stream must be None, 0/1/2 (default streams), a stream object (__cuda_stream__, "
        f"cuda.bindings CUstream, CuPy or PyTorch stream) or gdrpy.RawStream(handle); got "
        f"{name}{'' if not mod else ' from ' + mod}")
