# Unit of gdrpy/_core.pyx: what every object kind uses - the status check, the
# integer and buffer conversions (with their fast paths), the bounded wait for
# calls in flight, and the clock.

from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE,
                             PyBUF_ANY_CONTIGUOUS, PyBUF_FORMAT, PyBUF_ND, PyBUF_STRIDES)
from cpython.long cimport PyLong_CheckExact, PyLong_AsSsize_t
from cpython.pyport cimport PY_SSIZE_T_MAX

PY_SSIZE_T_MAX_ = PY_SSIZE_T_MAX

# Copies at least this large release the GIL.
NOGIL_BYTES = 65536
cdef Py_ssize_t _nogil_bytes = NOGIL_BYTES

try:
    import numpy as _np
    _ndarray = _np.ndarray
except ImportError:   # numpy is a dependency; without it nothing is an ndarray
    _ndarray = None
cdef object _ndarray_t = _ndarray   # a C-level global: no module dict lookup on hot paths


cdef int _check(int rc) except -1:
    """Raises the gdrpy.errors class for a C status, with libgdrpy's message."""
    if rc != 0:
        raise error_for_code(rc, gdrpy_last_error().decode("utf-8", "replace"))
    return 0


# ---- integers ------------------------------------------------------------------

cdef inline Py_ssize_t _index(object v, str what) except -1:
    """A non-negative Py_ssize_t from an int-like, with clear errors."""
    cdef Py_ssize_t r
    if PyLong_CheckExact(v):
        r = gp_as_ssize_t(v)
        if r >= 0:
            return r
        if r == -1:
            gp_err_clear()     # overflow (or -1): _index_slow says which
    return _index_slow(v, what)


cdef Py_ssize_t _index_slow(object v, str what) except -1:
    cdef Py_ssize_t r
    if not PyLong_CheckExact(v):
        if isinstance(v, (float, complex, str, bytes, bool)) or v is None:
            raise ArgumentTypeError(f"{what} must be an integer, not {type(v).__name__}")
        try:
            v = v.__index__()
        except AttributeError:
            raise ArgumentTypeError(f"{what} must be an integer, not {type(v).__name__}") from None
    try:
        r = PyLong_AsSsize_t(v)
    except OverflowError:
        raise OutOfRangeError(f"{what} {v} is out of range", _errno.ERANGE) from None
    if r < 0:
        raise OutOfRangeError(f"{what} {v} is negative", _errno.ERANGE)
    return r


cdef uint64_t _u64(object v, str what) except? 0:
    if isinstance(v, (float, complex, str, bytes)) or v is None:
        raise ArgumentTypeError(f"{what} must be an integer, not {type(v).__name__}")
    try:
        v = v.__index__()
    except AttributeError:
        raise ArgumentTypeError(f"{what} must be an integer, not {type(v).__name__}") from None
    if v < 0 or v >= 2**64:
        raise InvalidArgumentError(f"{what} {v:#x} is not a 64-bit address", _errno.EINVAL)
    return <uint64_t>v


# ---- buffers -------------------------------------------------------------------

cdef void _fill_u8_buffer(Py_buffer *buffer, char *ptr, Py_ssize_t size,
                          Py_ssize_t *shape, Py_ssize_t *strides, int flags) noexcept:
    """A writable 1-D uint8 view of [ptr, ptr+size) (shape/strides: arrays of
    one element owned by the exporter); the caller sets buffer.obj."""
    buffer.buf = ptr
    buffer.len = size
    buffer.readonly = 0
    buffer.itemsize = 1
    buffer.format = NULL
    if flags & PyBUF_FORMAT:
        buffer.format = b"B"
    buffer.ndim = 1
    buffer.shape = shape if (flags & PyBUF_ND) else NULL
    buffer.strides = strides if (flags & PyBUF_STRIDES) == PyBUF_STRIDES else NULL
    buffer.suboffsets = NULL
    buffer.internal = NULL


cdef inline bint _plain_exporter(object obj) noexcept:
    """bytearray, memoryview or ndarray (exact types): C exporters whose
    buffer requests run no Python code and have no side effects, so a failed
    request may simply be repeated by the checked path for its error."""
    t = type(obj)
    return t is _ndarray_t or t is bytearray or t is memoryview


cdef inline int _in_view(object data, Py_buffer *view) except -1:
    """_get_in_buffer with the common exporters' success path first."""
    if _plain_exporter(data):
        if gp_getbuffer(data, view, PyBUF_ANY_CONTIGUOUS) == 0:
            return 0
        gp_err_clear()
    return _get_in_buffer(data, view)


cdef inline int _out_view(object out, Py_buffer *view, Py_ssize_t need) except -1:
    """_get_out_buffer with the common exporters' success path first."""
    if _plain_exporter(out):
        if gp_getbuffer(out, view, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS) == 0:
            if view.len >= need:
                return 0
            PyBuffer_Release(view)
        else:
            gp_err_clear()
    return _get_out_buffer(out, view, need)


cdef inline bint _count_view(object out, Py_buffer *view) noexcept:
    """True with a writable contiguous view of ``out`` in *view when ``out``
    is a buffer to fill, i.e. the request succeeds and is not 0-d.  False
    (nothing held, no error set) otherwise: the caller then decides as for
    any object (a 0-d integer array is a count; an error comes from the
    checked path)."""
    if gp_getbuffer(out, view, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS) != 0:
        gp_err_clear()
        return False
    if view.ndim == 0:
        PyBuffer_Release(view)
        return False
    return True


cdef int _get_in_buffer(object data, Py_buffer *view) except -1:
    try:
        PyObject_GetBuffer(data, view, PyBUF_ANY_CONTIGUOUS)
    except TypeError as e:
        raise ArgumentTypeError(f"data must support the buffer protocol (bytes, bytearray, "
                                f"memoryview, numpy array), not {type(data).__name__}: {e}"
                                ) from None
    except (BufferError, ValueError) as e:   # numpy: non-contiguous arrays
        raise InvalidArgumentError(f"data must be a contiguous buffer: {e}",
                                   _errno.EINVAL) from None
    return 0


cdef int _get_out_buffer(object out, Py_buffer *view, Py_ssize_t need) except -1:
    try:
        PyObject_GetBuffer(out, view, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS)
    except TypeError as e:
        raise ArgumentTypeError(f"out must be a writable buffer (bytearray, memoryview, "
                                f"numpy array), not {type(out).__name__}: {e}") from None
    except (BufferError, ValueError) as e:   # numpy: read-only or non-contiguous
        raise InvalidArgumentError(f"out must be a writable contiguous buffer: {e}",
                                   _errno.EINVAL) from None
    if view.len < need:
        n = view.len
        PyBuffer_Release(view)
        raise InvalidArgumentError(f"out holds {n} bytes, {need} needed", _errno.EINVAL)
    return 0


# ---- waiting for calls in flight, the clock -----------------------------------

def _busy_wait_s():
    import os
    try:
        v = int(os.environ.get("GDRPY_BUSY_WAIT_MS", "3000"))
    except ValueError:
        v = 3000
    return min(max(v, 0), 600000) / 1000.0


cdef int _wait_idle(const int *count) except -1:
    """Sleeps, with the GIL released, until ``*count`` - an object's calls
    running without the GIL in other threads - is 0, for at most
    GDRPY_BUSY_WAIT_MS; returns what is left (0: idle)."""
    if count[0] == 0:
        return 0
    import time
    limit = _busy_wait_s()
    t0 = time.monotonic()
    while count[0] > 0 and time.monotonic() - t0 < limit:
        time.sleep(0.0002)
    return count[0]


cdef inline double _now() nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9
