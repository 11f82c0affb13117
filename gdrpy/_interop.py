"""Turning user objects into device ranges and stream handles.

* Device memory: anything with ``__cuda_array_interface__`` (CuPy arrays,
  PyTorch CUDA tensors, Numba device arrays, gdrpy.memory buffers) or a raw
  device pointer (int) with an explicit size.
* Streams: see :mod:`gdrpy.streams` (only objects that prove they are
  streams; raw integers through ``gdrpy.RawStream``).
"""

from __future__ import annotations

import errno
import math

from .errors import ArgumentTypeError, InvalidArgumentError, NotSupportedError

_ITEMSIZE_CHARS = "biufcmMOSUV"


def _nbytes_from_cai(cai: dict) -> int:
    shape = tuple(cai.get("shape", ()))
    typestr = cai.get("typestr", "|u1")
    try:
        itemsize = int(typestr[2:])
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"__cuda_array_interface__ typestr {typestr!r} is not understood",
            errno.EINVAL) from None
    strides = cai.get("strides")
    if strides is not None:
        # Accept C-contiguous strides only: a pin is one contiguous range.
        expect = itemsize
        for dim, st in zip(reversed(shape), reversed(tuple(strides)), strict=False):
            if dim > 1 and st != expect:
                raise InvalidArgumentError(
                    f"device array is not C-contiguous (strides {tuple(strides)!r}): pin a "
                    "contiguous array", errno.EINVAL)
            expect *= dim
    return int(math.prod(shape)) * itemsize


def device_range(obj, size=None):
    """(address, nbytes, owner) for ``Context.pin``."""
    if isinstance(obj, bool):
        raise ArgumentTypeError("pin() takes device memory or an address, not bool")
    own = getattr(obj, "__gdrpy_device_range__", None)
    if own is not None:  # gdrpy.memory buffers (sim buffers have no CAI)
        ptr, nbytes = own()
        if size is not None:
            size = _as_size(size)
            if size > nbytes:
                raise InvalidArgumentError(
                    f"size {size} is larger than the buffer's {nbytes} bytes", errno.EINVAL)
            nbytes = size
        return ptr, nbytes, obj
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        try:
            ptr = int(cai["data"][0])
        except (KeyError, TypeError, IndexError, ValueError):
            raise InvalidArgumentError("malformed __cuda_array_interface__ (no data pointer)",
                                       errno.EINVAL) from None
        nbytes = _nbytes_from_cai(cai)
        if size is not None:
            size = _as_size(size)
            if size > nbytes:
                raise InvalidArgumentError(
                    f"size {size} is larger than the object's {nbytes} bytes", errno.EINVAL)
            nbytes = size
        if nbytes == 0:
            raise InvalidArgumentError("cannot pin an empty array", errno.EINVAL)
        return ptr, nbytes, obj
    if hasattr(obj, "__array_interface__") or isinstance(obj, (bytes, bytearray, memoryview)):
        raise NotSupportedError(
            f"{type(obj).__name__} is host memory: pin() takes device memory "
            "(gdrpy.memory buffers, CuPy arrays, PyTorch CUDA tensors, device pointers)",
            errno.ENOTSUP)
    if hasattr(obj, "__index__") and not isinstance(obj, (float, str, bytes)):
        if size is None:
            raise ArgumentTypeError("pin(ptr) of a raw device pointer needs size=")
        return int(obj.__index__()), _as_size(size), None
    raise ArgumentTypeError(
        f"cannot pin {type(obj).__name__}: expected an object with "
        "__cuda_array_interface__ or a device pointer (int) with size=")


def _as_size(size) -> int:
    if isinstance(size, bool) or not hasattr(size, "__index__") or isinstance(size, (float, str)):
        raise ArgumentTypeError(f"size must be an integer, not {type(size).__name__}")
    size = int(size.__index__())
    if size <= 0:
        raise InvalidArgumentError(f"size {size} must be positive", errno.EINVAL)
    return size


def stream_handle(stream) -> int:
    """The CUstream handle (int) of a stream object: see :mod:`gdrpy.streams`."""
    from .streams import stream_handle as _sh
    return _sh(stream)
