# Unit of gdrpy/_core.pyx: other libraries' objects.
#
# * Device memory (Context.pin): anything with ``__gdrpy_device_range__``
#   (gdrpy.memory buffers; sim buffers have no CUDA array interface) or
#   ``__cuda_array_interface__`` (CuPy arrays, PyTorch CUDA tensors, Numba
#   device arrays), or a raw device pointer (int) with an explicit size.
# * Streams (``stream=``): only objects that prove they are streams, checked
#   before any driver call (a wrong handle can crash the process inside the
#   driver; gdrpy/streams.py documents the rules and holds RawStream, the door
#   for raw integer handles, which speaks ``__cuda_stream__``).

import math as _math

# 0 legacy default stream, 1 CU_STREAM_LEGACY, 2 CU_STREAM_PER_THREAD.
DEFAULT_STREAM_VALUES = (0, 1, 2)


cdef object _nbytes_from_cai(object cai):
    shape = tuple(cai.get("shape", ()))
    typestr = cai.get("typestr", "|u1")
    try:
        itemsize = int(typestr[2:])
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"__cuda_array_interface__ typestr {typestr!r} is not understood",
            _errno.EINVAL) from None
    strides = cai.get("strides")
    if strides is not None:
        # Accept C-contiguous strides only: a pin is one contiguous range.
        expect = itemsize
        for dim, st in zip(reversed(shape), reversed(tuple(strides))):
            if dim > 1 and st != expect:
                raise InvalidArgumentError(
                    f"device array is not C-contiguous (strides {tuple(strides)!r}): pin a "
                    "contiguous array", _errno.EINVAL)
            expect *= dim
    return int(_math.prod(shape)) * itemsize


cdef object _as_size(object size):
    if isinstance(size, bool) or not hasattr(size, "__index__") or isinstance(size, (float, str)):
        raise ArgumentTypeError(f"size must be an integer, not {type(size).__name__}")
    size = int(size.__index__())
    if size <= 0:
        raise InvalidArgumentError(f"size {size} must be positive", _errno.EINVAL)
    return size


cdef tuple _device_range(object obj, object size):
    """(address, nbytes, owner) of the device memory ``obj`` for Context.pin."""
    if isinstance(obj, bool):
        raise ArgumentTypeError("pin() takes device memory or an address, not bool")
    own = getattr(obj, "__gdrpy_device_range__", None)
    if own is not None:
        ptr, nbytes = own()
        if size is not None:
            size = _as_size(size)
            if size > nbytes:
                raise InvalidArgumentError(
                    f"size {size} is larger than the buffer's {nbytes} bytes", _errno.EINVAL)
            nbytes = size
        return ptr, nbytes, obj
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        try:
            ptr = int(cai["data"][0])
        except (KeyError, TypeError, IndexError, ValueError):
            raise InvalidArgumentError("malformed __cuda_array_interface__ (no data pointer)",
                                       _errno.EINVAL) from None
        nbytes = _nbytes_from_cai(cai)
        if size is not None:
            size = _as_size(size)
            if size > nbytes:
                raise InvalidArgumentError(
                    f"size {size} is larger than the object's {nbytes} bytes", _errno.EINVAL)
            nbytes = size
        if nbytes == 0:
            raise InvalidArgumentError("cannot pin an empty array", _errno.EINVAL)
        return ptr, nbytes, obj
    if hasattr(obj, "__array_interface__") or isinstance(obj, (bytes, bytearray, memoryview)):
        raise NotSupportedError(
            f"{type(obj).__name__} is host memory: pin() takes device memory "
            "(gdrpy.memory buffers, CuPy arrays, PyTorch CUDA tensors, device pointers)",
            _errno.ENOTSUP)
    if hasattr(obj, "__index__") and not isinstance(obj, (float, str, bytes)):
        if size is None:
            raise ArgumentTypeError("pin(ptr) of a raw device pointer needs size=")
        return int(obj.__index__()), _as_size(size), None
    raise ArgumentTypeError(
        f"cannot pin {type(obj).__name__}: expected an object with "
        "__cuda_array_interface__ or a device pointer (int) with size=")


cdef uint64_t _handle_u64(object v, str what) except? 0:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ArgumentTypeError(f"{what} must be an int handle, not {type(v).__name__}")
    if not 0 <= v < 2**64:
        raise InvalidArgumentError(f"{what} {v:#x} is not a 64-bit pointer", _errno.EINVAL)
    return <uint64_t>v


cdef uint64_t _stream_handle(object stream) except? 0:
    """The CUstream handle of an accepted stream object (0: none)."""
    if stream is None:
        return 0
    if type(stream) is int:
        if stream in DEFAULT_STREAM_VALUES:
            return <uint64_t>stream
        raise ArgumentTypeError(
            f"stream={stream:#x}: a raw integer is not accepted as a stream (only the default "
            "stream values 0, 1 = legacy and 2 = per-thread are); pass the stream object "
            "(CuPy, PyTorch, cuda.core, cuda.bindings CUstream), or gdrpy.RawStream(handle) "
            "to pass an unchecked handle on purpose")
    proto = getattr(type(stream), "__cuda_stream__", None)
    if proto is not None:   # cuda.core streams, gdrpy.RawStream, any adopter
        attr = stream.__cuda_stream__
        val = attr() if callable(attr) else attr
        if not (isinstance(val, tuple) and len(val) == 2 and isinstance(val[0], int)):
            raise InvalidArgumentError(
                f"{type(stream).__name__}.__cuda_stream__ must return (version, handle)",
                _errno.EINVAL)
        return _handle_u64(val[1], f"{type(stream).__name__}.__cuda_stream__ handle")
    mod = type(stream).__module__ or ""
    name = type(stream).__name__
    if mod.startswith("cuda.") and name in ("CUstream", "cudaStream_t"):
        try:
            return _handle_u64(int(stream), name)
        except (TypeError, ValueError):
            raise ArgumentTypeError(f"{name} could not be read as a handle") from None
    if mod.startswith("cupy") and hasattr(stream, "ptr"):
        return _handle_u64(stream.ptr, "CuPy stream .ptr")
    if mod.startswith("torch") and hasattr(stream, "cuda_stream"):
        return _handle_u64(stream.cuda_stream, "PyTorch stream .cuda_stream")
    raise ArgumentTypeError(
        f"stream must be None, 0/1/2 (default streams), a stream object (__cuda_stream__, "
        f"cuda.bindings CUstream, CuPy or PyTorch stream) or gdrpy.RawStream(handle); got "
        f"{name}{'' if not mod else ' from ' + mod}")


def stream_handle(stream):
    """The CUstream handle (int) of an accepted stream object (0: none); see
    gdrpy.streams for what is accepted."""
    return _stream_handle(stream)


cdef void *_stream_ptr(object stream) except? NULL:
    if stream is None:
        return NULL
    return <void *><uintptr_t>_stream_handle(stream)


cdef int _stream_wait(gdrpy_ctx_t ch, void *s) except -1:
    """Wait (GIL released) until stream ``s`` has reached this point."""
    cdef int rc
    with nogil:
        rc = gdrpy_stream_synchronize(ch, s)
    return _check(rc)
