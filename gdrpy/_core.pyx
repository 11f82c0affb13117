# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Binding of libgdrpy: Context > Pin > Mapping.

Contract of this wrapper:

* Every C call's status goes through ``_check()``, which raises the
  :mod:`gdrpy.errors` class for the code with libgdrpy's message.
* Objects own their C handles.  A Context tracks its pins and a Pin its
  mapping, so ``Context.close()`` unmaps and unpins in the right order; a
  child keeps its parent alive.  ``close()`` is idempotent; every other
  method of a closed object raises :class:`~gdrpy.errors.ClosedError`.
* A Mapping that still has buffer exports (memoryview / numpy views) cannot
  be unmapped: ``close()`` raises BusyError instead of leaving dangling views.
* After ``fork()`` every object of the parent raises WrongProcessError in the
  child (the child never sees the parent's memory).
* ``Mapping.write/read`` hold the GIL for small copies (tens of ns; releasing
  it would cost more) and release it from ``NOGIL_BYTES`` up; copy-engine
  copies always release it.
"""

from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release,
                             PyBUF_WRITABLE, PyBUF_ANY_CONTIGUOUS, PyBUF_FORMAT,
                             PyBUF_ND, PyBUF_STRIDES)
from cpython.bytes cimport (PyBytes_FromStringAndSize, PyBytes_AS_STRING,
                            PyBytes_GET_SIZE, PyBytes_CheckExact)
from cpython.long cimport PyLong_CheckExact, PyLong_AsSsize_t
from libc.stdint cimport uint64_t, uintptr_t
from cpython.pyport cimport PY_SSIZE_T_MAX

from gdrpy._cgdrpy cimport *
cimport cython

cdef extern from *:
    """
    static inline void gp_store_u64(void *p, unsigned long long v) {
        *(volatile unsigned long long *)p = v;
    #if defined(__x86_64__) || defined(__i386__)
        __asm__ __volatile__("sfence" ::: "memory");
    #else
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
    #endif
    }
    static inline unsigned long long gp_load_u64(const void *p) {
        return *(const volatile unsigned long long *)p;
    }
    """
    void gp_store_u64(void *p, unsigned long long v) nogil
    unsigned long long gp_load_u64(const void *p) nogil

import errno as _errno
import weakref as _weakref

from gdrpy.errors import (error_for_code, GdrError, ClosedError, BusyError, WrongProcessError,
                          InvalidArgumentError, OutOfRangeError, ArgumentTypeError)

PY_SSIZE_T_MAX_ = PY_SSIZE_T_MAX

include "_hostmem.pxi"

cdef object _ndarray_t = _ndarray   # a C-level global: no module dict lookup on hot paths

# Copies at least this large release the GIL.
NOGIL_BYTES = 65536
cdef Py_ssize_t _nogil_bytes = NOGIL_BYTES

_MAPPING_TYPES = {0: "none", 1: "wc", 2: "caching", 3: "device"}


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


cdef int _check(int rc) except -1:
    if rc != 0:
        raise error_for_code(rc, gdrpy_last_error().decode("utf-8", "replace"))
    return 0


cdef int _stream_wait(gdrpy_ctx_t ch, void *s) except -1:
    """Wait (GIL released) until stream ``s`` has reached this point."""
    cdef int rc
    with nogil:
        rc = gdrpy_stream_synchronize(ch, s)
    return _check(rc)


cdef extern from "Python.h":
    # The same C API functions as cpython.*'s, declared without Cython's
    # exception checks for the hot paths below, which test the result
    # themselves and leave every error to the checked slow path.
    Py_ssize_t _gp_as_ssize_t "PyLong_AsSsize_t"(object v)
    int _gp_getbuffer "PyObject_GetBuffer"(object obj, Py_buffer *view, int flags)
    void _gp_err_clear "PyErr_Clear"()


cdef inline Py_ssize_t _index(object v, str what) except -1:
    """A non-negative Py_ssize_t from an int-like, with clear errors."""
    cdef Py_ssize_t r
    if PyLong_CheckExact(v):
        r = _gp_as_ssize_t(v)
        if r >= 0:
            return r
        if r == -1:
            _gp_err_clear()     # overflow (or -1): _index_slow says which
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


def version():
    """libgdrpy's version as a string."""
    cdef int a, b, c
    gdrpy_version(&a, &b, &c)
    return f"{a}.{b}.{c}"


def backend_names():
    """All backend names, 'auto' first."""
    return [gdrpy_backend_name(i).decode() for i in range(GDRPY_BACKEND_COUNT_)]


cdef int _backend_id(object backend) except -1:
    if not isinstance(backend, str):
        raise ArgumentTypeError(f"backend must be a str, not {type(backend).__name__}")
    if "\0" in backend:
        raise InvalidArgumentError(f"backend name {backend!r} contains a NUL character",
                                   _errno.EINVAL)
    cdef int b = gdrpy_backend_from_name(backend.encode())
    if b < 0:
        raise InvalidArgumentError(
            f"unknown backend {backend!r}: choose one of {', '.join(backend_names())}",
            _errno.EINVAL)
    return b


cdef int _device(object device) except -1:
    cdef Py_ssize_t d
    if isinstance(device, bool):
        raise ArgumentTypeError("device must be an integer, not bool")
    try:
        d = _index(device, "device")
    except OutOfRangeError as e:
        raise InvalidArgumentError(str(e.message), _errno.EINVAL) from None
    if d > 1 << 20:
        raise InvalidArgumentError(f"device {device} is out of range", _errno.EINVAL)
    return <int>d


def probe(backend, device=0):
    """(ok, reason) for a backend on a device; opens nothing."""
    cdef int b = _backend_id(backend)
    cdef int d = _device(device)
    cdef char why[512]
    why[0] = 0
    if b == GDRPY_BACKEND_AUTO:
        raise InvalidArgumentError("probe a concrete backend, not 'auto'", _errno.EINVAL)
    rc = gdrpy_backend_probe(b, d, why, sizeof(why))
    return rc == 0, why.decode("utf-8", "replace")


def nvrm_selftest(device=0):
    """The nvrm backend's self-test report for a device, as a dict (it runs
    once per process, at the first open of the device, or here).

    Keys: ``driver``, ``cuda_driver``, ``table`` (``branch``, ``tag``,
    ``driver_newer_than_tables``), ``selftest_ms``, ``usable``, ``reason``,
    ``routes`` (``A``/``C``: ``ok``, ``step``, ``detail``; ``C`` also
    ``ipc_layout``).  Returns None where the self-test could not run (no
    NVIDIA driver or GPU); the reason is then in ``probe('nvrm')``.
    """
    import json
    cdef int d = _device(device)
    cdef bytes buf = PyBytes_FromStringAndSize(NULL, 16384)
    cdef char *p = PyBytes_AS_STRING(buf)
    p[0] = 0
    gdrpy_nvrm_selftest(d, p, 16384)
    if p[0] == 0:
        return None
    return json.loads(p.decode("utf-8", "replace"))


def copy_isa():
    """The copy kernel in use (e.g. 'avx2')."""
    return gdrpy_copy_isa().decode()


def copy_isa_available():
    """Kernels this CPU can run."""
    s = gdrpy_copy_isa_available().decode()
    return [x for x in s.split(",") if x]


def copy_isa_notes():
    """Kernels of this build that cannot run here, were not compiled in, or
    that auto never picks, each as 'name: reason'."""
    s = gdrpy_copy_isa_notes().decode()
    return [x for x in s.split("\n") if x]


def set_copy_isa(name):
    """Force a copy kernel by name ('auto' restores dispatch)."""
    if name is not None and not isinstance(name, str):
        raise ArgumentTypeError(f"name must be a str or None, not {type(name).__name__}")
    cdef bytes b
    if name is None:
        _check(gdrpy_set_copy_isa(NULL))
    else:
        if "\0" in name:
            raise InvalidArgumentError(f"copy kernel name {name!r} contains a NUL character",
                                       _errno.EINVAL)
        b = name.encode()
        _check(gdrpy_set_copy_isa(b))


def sim_alloc(size):
    """Allocate sim "device" memory (64 KiB aligned); returns its address."""
    cdef Py_ssize_t n = _index(size, "size")
    cdef uint64_t p = 0
    _check(gdrpy_sim_alloc(<size_t>n, &p))
    return p


def sim_free(ptr):
    _check(gdrpy_sim_free(_u64(ptr, "ptr")))


def fork_generation():
    return gdrpy_fork_generation


cdef class Context:
    """An open device (``gdrpy.open()``); closes its pins and mappings first."""

    cdef gdrpy_ctx_t _h
    cdef unsigned _fork_gen
    cdef readonly int device
    cdef readonly str backend
    cdef dict _info
    cdef object _pins          # WeakSet[Pin]
    # Set by close() (under the GIL) before it lists the pins to close, so
    # that no pin or mapping made by another thread meanwhile escapes the
    # list: gdrpy_close() tears down every pin of the context in C, and a
    # Mapping object still open in Python would then point at unmapped
    # memory.  pin() and Pin.map() register their object first, then look
    # at this flag (see _refuse_while_closing).
    cdef bint _closing
    cdef object __weakref__

    def __cinit__(self, device=0, backend="auto"):
        self._h = 0
        self._closing = False
        cdef int d = _device(device)
        cdef int b = _backend_id(backend)
        cdef gdrpy_ctx_t h = 0
        cdef int rc
        # The backend named here is final: $GDRPY_BACKEND is read by
        # gdrpy.open() only when no backend is given.
        with nogil:
            rc = gdrpy_open(d, b | GDRPY_OPEN_NO_ENV, &h)
        _check(rc)
        self._h = h
        self._fork_gen = gdrpy_fork_generation
        self.device = d
        self._pins = _weakref.WeakSet()
        cdef gdrpy_ctx_info_t info
        _check(gdrpy_ctx_get_info(self._h, &info))
        self.backend = info.backend_name.decode()
        self._info = {
            "device": info.device,
            "backend": self.backend,
            "gpu_name": info.gpu_name.decode("utf-8", "replace"),
            "pci_bus_id": info.pci_bus_id.decode("utf-8", "replace"),
            "driver_version": info.driver_version.decode("utf-8", "replace"),
        }

    def __dealloc__(self):
        if self._h and self._fork_gen == gdrpy_fork_generation:
            gdrpy_close(self._h)
        self._h = 0

    cdef int _ready(self) except -1:
        if self._h == 0:
            raise ClosedError("the context is closed", _errno.EBADF)
        if self._fork_gen != gdrpy_fork_generation:
            raise WrongProcessError(
                "this context belongs to the parent process (fork); open a new one "
                "in the child", _errno.EACCES)
        if self._closing:
            return self._refuse_while_closing()
        return 0

    cdef int _refuse_while_closing(self) except -1:
        raise ClosedError("the context is being closed by another thread", _errno.EBADF)

    @property
    def closed(self):
        return self._h == 0

    @property
    def is_sim(self):
        """True when host memory stands in for the GPU (the sim backend)."""
        return self.backend == "sim"

    @property
    def info(self):
        return dict(self._info)

    def live_objects(self):
        """Driver-level objects this context holds now (for leak checks)."""
        self._ready()
        cdef uint64_t n = 0
        _check(gdrpy_ctx_live_objects(self._h, &n))
        return n

    @property
    def handle(self):
        return self._h

    def __repr__(self):
        state = "closed" if self._h == 0 else "open"
        extra = " (host memory standing in for a GPU)" if self.backend == "sim" else ""
        return f"<gdrpy.Context device={self.device} backend={self.backend!r}{extra} {state}>"

    def pin(self, obj, size=None, flags=0):
        """Pin device memory: an object with ``__cuda_array_interface__`` (CuPy,
        PyTorch CUDA tensors, gdrpy.memory buffers) or a raw device pointer
        with ``size``.  Returns a :class:`Pin`."""
        self._ready()
        from gdrpy._interop import device_range
        addr, nbytes, owner = device_range(obj, size)
        cdef uint64_t a = _u64(addr, "address")
        cdef Py_ssize_t n = _index(nbytes, "size")
        cdef Py_ssize_t f = _index(flags, "flags")
        if f > 0xFFFFFFFF:
            raise InvalidArgumentError(f"unknown pin flags {flags:#x}", _errno.EINVAL)
        cdef gdrpy_pin_t ph = 0
        cdef int rc
        with nogil:
            rc = gdrpy_pin(self._h, a, <size_t>n, <unsigned>f, &ph)
        _check(rc)
        p = Pin.__new__(Pin)
        (<Pin>p)._init(self, ph, owner)
        self._pins.add(p)
        if self._closing:
            # close() began while the pin was made: it is registered, so
            # close() or gdrpy_close() releases it; the caller never gets it
            self._refuse_while_closing()
        return p

    def register(self, obj):
        """Page-lock ``obj``'s memory (cuMemHostRegister) for the copy engines
        while the returned :class:`Registration` is open:
        ``with ctx.register(buf) as reg: ...``."""
        return host_register(self, obj)

    def memcpy_htod(self, dptr, data):
        """cuMemcpyHtoD (sim: memcpy) of a host buffer to a device address."""
        self._ready()
        cdef uint64_t d = _u64(dptr, "dptr")
        cdef Py_buffer view
        _get_in_buffer(data, &view)
        cdef int rc
        try:
            with nogil:
                rc = gdrpy_memcpy_htod(self._h, d, view.buf, <size_t>view.len)
            _check(rc)
        finally:
            PyBuffer_Release(&view)

    def memcpy_dtoh(self, dptr, n):
        """cuMemcpyDtoH (sim: memcpy) of ``n`` bytes; returns bytes."""
        self._ready()
        cdef uint64_t d = _u64(dptr, "dptr")
        cdef Py_ssize_t cnt = _index(n, "n")
        cdef char probe[1]
        cdef int prc
        if cnt > 0 and d + <uint64_t>cnt < d:
            raise InvalidArgumentError(f"memcpy_dtoh: [{dptr:#x}, +{cnt}) wraps around",
                                       _errno.EINVAL)
        if cnt > 65536:
            # Validate before allocating: both ends must be device memory the
            # driver (sim: a live allocation) accepts.
            with nogil:
                prc = gdrpy_memcpy_dtoh(self._h, probe, d + <uint64_t>cnt - 1, 1)
                if prc == 0:
                    prc = gdrpy_memcpy_dtoh(self._h, probe, d, 1)
            _check(prc)
        out = PyBytes_FromStringAndSize(NULL, cnt)
        cdef char *buf = PyBytes_AS_STRING(out)
        cdef int rc
        with nogil:
            rc = gdrpy_memcpy_dtoh(self._h, buf, d, <size_t>cnt)
        _check(rc)
        return out

    def close(self):
        """Unmap and unpin everything, then close.  Idempotent.  Raises
        BusyError while a mapping has live buffer exports (then nothing is
        closed), while another thread's copies are still in flight (then
        the context stays open: close again once they are done) or while
        another thread is closing it.  From the start of the close, pins
        and maps on it in other threads raise ClosedError."""
        if self._h == 0:
            return
        if self._fork_gen != gdrpy_fork_generation:
            self._h = 0     # the parent's; nothing to do in the child
            return
        if self._closing:
            raise BusyError("the context is being closed by another thread; close it "
                            "again once that returns", _errno.EBUSY)
        cdef gdrpy_ctx_t h = self._h
        cdef int rc
        # From here other threads can no longer hand out new pins or
        # mappings (they register, see the flag and give up), so the list
        # below holds every Pin object that can reach this context's memory.
        self._closing = True
        try:
            pins = list(self._pins)
            for p in pins:
                (<Pin>p)._check_closable()
            for p in pins:
                (<Pin>p).close()
            with nogil:   # waits (bounded) for calls in flight in other threads
                rc = gdrpy_close(h)
            if rc != _errno.EBUSY:   # EBUSY: still open; close again later
                self._h = 0
            _check(rc)
        finally:
            self._closing = False

    def __enter__(self):
        self._ready()
        return self

    def __exit__(self, *exc):
        self.close()
        return False


@cython.no_gc_clear
cdef class Pin:
    """Pinned device memory ``[addr, addr+size)``; ``map()`` gives a Mapping."""

    cdef Context _ctx
    cdef gdrpy_pin_t _h
    cdef object _owner         # keeps the allocation alive while pinned
    cdef object _mapping       # weakref to the Mapping, or None
    cdef readonly uint64_t addr
    cdef readonly size_t size
    cdef readonly uint64_t va
    cdef readonly size_t mapped_size
    cdef readonly unsigned page_size
    cdef object __weakref__

    def __cinit__(self):
        self._h = 0
        self._mapping = None

    cdef _init(self, Context ctx, gdrpy_pin_t h, object owner):
        self._ctx = ctx
        self._h = h
        self._owner = owner
        cdef gdrpy_pin_info_t info
        _check(gdrpy_pin_get_info(ctx._h, h, &info))
        self.addr = info.addr
        self.size = <size_t>info.size
        self.va = info.va
        self.mapped_size = <size_t>info.mapped_size
        self.page_size = info.page_size

    def __dealloc__(self):
        if self._h and self._ctx is not None and self._ctx._h and \
                self._ctx._fork_gen == gdrpy_fork_generation:
            gdrpy_unpin(self._ctx._h, self._h)
        self._h = 0

    cdef int _ready(self) except -1:
        if self._h == 0:
            raise ClosedError("the pin is unpinned (closed)", _errno.EBADF)
        self._ctx._ready()
        return 0

    def __init__(self, *args, **kwargs):
        raise ArgumentTypeError("Pin objects are made by Context.pin()")

    @property
    def closed(self):
        return self._h == 0 or self._ctx is None or self._ctx._h == 0

    @property
    def context(self):
        return self._ctx

    @property
    def owner(self):
        return self._owner

    @property
    def mapping(self):
        """The live Mapping, or None."""
        m = self._mapping() if self._mapping is not None else None
        if m is not None and (<Mapping>m)._closed:
            return None
        return m

    def info(self):
        """dict: addr, size, va, mapped_size, page_size, mapped, mapping_type, invalidated."""
        self._ready()
        cdef gdrpy_pin_info_t i
        _check(gdrpy_pin_get_info(self._ctx._h, self._h, &i))
        return {"addr": i.addr, "size": i.size, "va": i.va, "mapped_size": i.mapped_size,
                "page_size": i.page_size, "mapped": bool(i.mapped),
                "mapping_type": _MAPPING_TYPES.get(i.mapping_type, str(i.mapping_type)),
                "invalidated": bool(i.invalidated)}

    def map(self):
        """Map the pinned range into this process; returns a :class:`Mapping`.
        One mapping per pin (AlreadyMappedError otherwise)."""
        self._ready()
        cdef void *mp = NULL
        cdef void *up = NULL
        cdef int rc
        with nogil:
            rc = gdrpy_map(self._ctx._h, self._h, &mp, &up)
        _check(rc)
        m = Mapping.__new__(Mapping)
        (<Mapping>m)._init(self, <char *>mp, <char *>up)
        self._mapping = _weakref.ref(m)
        if self._ctx._closing:
            # The context's close() began during the map: it may not have
            # seen this mapping, so undo it here and never hand it out.
            try:
                m.close()
            except GdrError:
                pass
            self._ctx._refuse_while_closing()
        return m

    cdef int _check_closable(self) except -1:
        m = self.mapping
        if m is not None:
            (<Mapping>m)._check_closable()
        return 0

    def close(self):
        """Unmap (if mapped) and unpin.  Idempotent."""
        if self._h == 0:
            return
        if self._ctx._h == 0 or self._ctx._fork_gen != gdrpy_fork_generation:
            self._h = 0
            return
        m = self.mapping
        if m is not None:
            m.close()
        cdef gdrpy_ctx_t ch = self._ctx._h
        cdef gdrpy_pin_t ph = self._h
        cdef int rc
        with nogil:   # waits (bounded) for copy-engine copies in other threads
            rc = gdrpy_unpin(ch, ph)
        if rc != _errno.EBUSY:   # EBUSY: copies in flight; nothing changed
            self._h = 0
        _check(rc)

    def ce_write(self, offset, data, stream=None, method="direct"):
        """Copy-engine write (cuMemcpyHtoD, or HtoDAsync on ``stream``) at
        ``offset`` in the pin.  ``method``: 'direct' (cuMemcpy from ``data``),
        'locked' (``data`` is page-locked: no extra wait) or 'staged' (through
        the context's staging ring).  Returns the number of bytes."""
        self._ready()
        return self._ce_write_obj(_index(offset, "offset"), data, _stream_ptr(stream),
                                  _ce_method(method))

    def ce_read(self, offset, n, out=None, stream=None, method="direct"):
        """Copy-engine read (cuMemcpyDtoH[Async]); returns bytes or ``out``.
        With a stream the copy is ordered on it and this call waits for it.
        ``method`` as for :meth:`ce_write`."""
        self._ready()
        return self._ce_read_obj(_index(offset, "offset"), _index(n, "n"), out,
                                 _stream_ptr(stream), _ce_method(method))

    cdef Py_ssize_t _ce_write_obj(self, Py_ssize_t off, object data, void *s,
                                  int method=CE_DIRECT) except -1:
        cdef Py_buffer view
        cdef int rc
        _get_in_buffer(data, &view)
        try:
            with nogil:
                rc = _ce_copy(self._ctx, self._h, 0, method, off, view.buf, view.len, s)
            _check(rc)
            return view.len
        finally:
            PyBuffer_Release(&view)

    cdef object _ce_read_obj(self, Py_ssize_t off, Py_ssize_t cnt, object out, void *s,
                             int method=CE_DIRECT):
        cdef Py_buffer view
        cdef int rc
        cdef char *buf
        if <size_t>off > self.size or <size_t>cnt > self.size - <size_t>off:
            raise OutOfRangeError(f"ce_read: [{off}, {off}+{cnt}) is outside the pinned "
                                  f"{self.size} bytes", _errno.ERANGE)
        if out is None:
            res = PyBytes_FromStringAndSize(NULL, cnt)
            buf = PyBytes_AS_STRING(res)
            with nogil:
                rc = _ce_copy(self._ctx, self._h, 1, method, off, buf, cnt, s)
                if rc == 0 and s != NULL and method != CE_STAGED:
                    rc = gdrpy_stream_synchronize(self._ctx._h, s)
            _check(rc)
            return res
        _get_out_buffer(out, &view, cnt)
        try:
            with nogil:
                rc = _ce_copy(self._ctx, self._h, 1, method, off, view.buf, cnt, s)
                if rc == 0 and s != NULL and method != CE_STAGED:
                    rc = gdrpy_stream_synchronize(self._ctx._h, s)
            _check(rc)
        finally:
            PyBuffer_Release(&view)
        return out

    def __repr__(self):
        state = "closed" if self.closed else ("mapped" if self.mapping is not None else "pinned")
        return (f"<gdrpy.Pin addr={self.addr:#x} size={self.size} backend="
                f"{self._ctx.backend!r} {state}>")

    def __enter__(self):
        self._ready()
        return self

    def __exit__(self, *exc):
        self.close()
        return False


cdef int _ce_method(object method) except -1:
    try:
        return _CE_METHODS[method]
    except (KeyError, TypeError):
        raise InvalidArgumentError(f"method must be one of {', '.join(_CE_METHODS)}, "
                                   f"not {method!r}", _errno.EINVAL) from None


cdef void *_stream_ptr(object stream) except? NULL:
    if stream is None:
        return NULL
    from gdrpy._interop import stream_handle
    cdef uintptr_t h = <uintptr_t>_u64(stream_handle(stream), "stream")
    return <void *>h


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
        if _gp_getbuffer(data, view, PyBUF_ANY_CONTIGUOUS) == 0:
            return 0
        _gp_err_clear()
    return _get_in_buffer(data, view)


cdef inline int _out_view(object out, Py_buffer *view, Py_ssize_t need) except -1:
    """_get_out_buffer with the common exporters' success path first."""
    if _plain_exporter(out):
        if _gp_getbuffer(out, view, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS) == 0:
            if view.len >= need:
                return 0
            PyBuffer_Release(view)
        else:
            _gp_err_clear()
    return _get_out_buffer(out, view, need)


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


@cython.no_gc_clear
cdef class Mapping:
    """CPU view of a pinned range (through BAR1 on a GPU backend).

    Supports the buffer protocol (``memoryview(m)``, ``numpy.asarray(m)``:
    uint8, writable, exactly the pinned ``size`` bytes starting at the pinned
    address), ``write(offset, data)`` and ``read(offset, n, out=None)``.
    Offsets are relative to the pinned address.  Out-of-range requests raise
    OutOfRangeError before any memory is touched.
    """

    cdef Pin _pin
    cdef char *_ptr            # CPU address of pin.addr
    cdef char *_map_ptr        # CPU address of pin.va
    cdef Py_ssize_t _size
    cdef Py_ssize_t _shape[1]
    cdef Py_ssize_t _strides[1]
    cdef int _exports
    cdef int _inflight
    cdef bint _closed
    cdef unsigned _fork_gen
    # Cached Transfer for gdrpy.put/get.  Mapping <-> Transfer is a reference
    # cycle: the garbage collector breaks it by clearing the Transfer (Pin and
    # Mapping are no_gc_clear, so their __dealloc__ still sees their parents
    # and unmaps/unpins).
    cdef object _transfer
    cdef object __weakref__

    def __cinit__(self):
        self._closed = True
        self._ptr = NULL
        self._transfer = None

    def transfer(self, picker=None):
        """The Transfer (put/get with automatic path choice) of this mapping:
        one is created on first use with the context's default picker and
        reused; pass ``picker`` to replace it."""
        self._ready()
        if picker is not None or self._transfer is None:
            self._transfer = Transfer(self, picker)
        return self._transfer

    cdef _init(self, Pin pin, char *map_ptr, char *user_ptr):
        self._pin = pin
        self._map_ptr = map_ptr
        self._ptr = user_ptr
        self._size = <Py_ssize_t>pin.size
        self._shape[0] = self._size
        self._strides[0] = 1
        self._exports = 0
        self._inflight = 0
        self._fork_gen = gdrpy_fork_generation
        self._closed = False

    def __dealloc__(self):
        if not self._closed and self._pin is not None and self._pin._h and \
                self._pin._ctx._h and self._fork_gen == gdrpy_fork_generation:
            gdrpy_unmap(self._pin._ctx._h, self._pin._h)
        self._closed = True

    cdef inline int _ready(self) except -1:
        # Hot path (every write/read/put/get, some twice): two loads and a
        # compare, inlined; the raising part stays out of line.
        if self._closed or self._fork_gen != gdrpy_fork_generation:
            return self._not_ready()
        return 0

    cdef int _not_ready(self) except -1:
        if self._closed:
            raise ClosedError("the mapping is unmapped (closed)", _errno.EBADF)
        raise WrongProcessError(
            "this mapping belongs to the parent process (fork): mappings are not "
            "inherited; open a context in the child", _errno.EACCES)

    cdef inline int _range(self, Py_ssize_t off, Py_ssize_t n) except -1:
        if off > self._size or n > self._size - off:
            raise OutOfRangeError(
                f"[{off}, {off}+{n}) is outside the mapping's {self._size} bytes",
                _errno.ERANGE)
        return 0

    @property
    def closed(self):
        return self._closed

    @property
    def size(self):
        return self._size

    def __len__(self):
        return self._size

    @property
    def ptr(self):
        """CPU address of the pinned address (int)."""
        self._ready()
        return <uintptr_t>self._ptr

    @property
    def map_ptr(self):
        """CPU address of ``pin.va`` (start of the mapped range)."""
        self._ready()
        return <uintptr_t>self._map_ptr

    @property
    def pin(self):
        return self._pin

    @property
    def mapping_type(self):
        self._ready()
        return self._pin.info()["mapping_type"]

    def write(self, offset, data):
        """Copy ``data`` (bytes, bytearray, memoryview, numpy array: any
        contiguous buffer) to ``offset`` with the CPU copy kernel (stores +
        sfence).  Returns the number of bytes written."""
        # Conversions first: they may run Python code (a user __index__, a
        # collection) and so let another thread unmap.  Nothing but C runs
        # between _ready() and the stores (see _write_obj).
        cdef Py_ssize_t off = _index(offset, "offset")
        self._ready()
        return self._write_obj(off, data)

    def read(self, offset, n, out=None):
        """Copy ``n`` bytes at ``offset`` out of the mapping (streaming loads).
        Returns new bytes, or fills and returns ``out`` (a writable buffer of
        at least ``n`` bytes)."""
        self._ready()
        return self._read_obj(_index(offset, "offset"), _index(n, "n"), out)

    def write_u64(self, offset, value):
        """Store ``value`` (0 <= value < 2**64, little-endian) at ``offset`` with
        one aligned 8-byte store, then sfence: the way to write a flag or a
        sequence number after a payload (a reader never sees a torn value).
        The address must be 8-byte aligned."""
        # Every conversion before _ready() (see write()).
        cdef Py_ssize_t off = _index(offset, "offset")
        if isinstance(value, (bool, float, complex, str, bytes)) or value is None or \
                not hasattr(value, "__index__"):
            raise ArgumentTypeError(f"value must be an int, not {type(value).__name__}")
        value = value.__index__()
        if value < 0 or value >= 2**64:
            raise InvalidArgumentError(f"value {value} does not fit in 64 bits", _errno.EINVAL)
        cdef unsigned long long v = <unsigned long long>value
        self._ready()
        self._aligned_u64(off)
        gp_store_u64(self._ptr + off, v)

    def put_many(self, items):
        """Vectored put: ``items`` = [(offset, buffer), ...]; every range is
        checked first, then all are stored with ONE store fence at the end
        (``gdrpy_writev``).  Returns the total bytes."""
        return mapping_put_many(self, items)

    def read_u64(self, offset):
        """Load one aligned 8-byte little-endian value at ``offset`` (a single
        load: never torn)."""
        cdef Py_ssize_t off = _index(offset, "offset")   # before _ready() (see write())
        self._ready()
        self._aligned_u64(off)
        return gp_load_u64(self._ptr + off)

    cdef inline int _aligned_u64(self, Py_ssize_t off) except -1:
        self._range(off, 8)
        if (<uintptr_t>(self._ptr + off)) & 7:
            raise InvalidArgumentError(
                f"offset {off} is not 8-byte aligned in device memory", _errno.EINVAL)
        return 0

    # _inflight counts copies running without the GIL: close() waits for them
    # (bounded) and marks the mapping closed before it releases the GIL to
    # unmap.  Copies that hold the GIL re-check _ready() after any step that
    # may run Python code (buffer exports, allocation), right before storing.
    cdef inline void _store(self, char *dst, const void *src, Py_ssize_t n):
        if n < _nogil_bytes:
            gdrpy_copy_to_mapping(dst, src, <size_t>n)
        else:
            self._inflight += 1
            with nogil:
                gdrpy_copy_to_mapping(dst, src, <size_t>n)
            self._inflight -= 1

    cdef inline void _load(self, void *dst, const char *src, Py_ssize_t n):
        if n < _nogil_bytes:
            gdrpy_copy_from_mapping(dst, src, <size_t>n)
        else:
            self._inflight += 1
            with nogil:
                gdrpy_copy_from_mapping(dst, src, <size_t>n)
            self._inflight -= 1

    cdef Py_ssize_t _write_obj(self, Py_ssize_t off, object data) except -1:
        cdef Py_ssize_t n
        cdef Py_buffer view
        if PyBytes_CheckExact(data):
            n = PyBytes_GET_SIZE(data)
            self._range(off, n)
            self._store(self._ptr + off, PyBytes_AS_STRING(data), n)
            return n
        _in_view(data, &view)
        try:
            # Getting the buffer may have run Python code (and let another
            # thread close the mapping): look again before storing.
            self._ready()
            n = view.len
            self._range(off, n)
            self._store(self._ptr + off, view.buf, n)
        finally:
            PyBuffer_Release(&view)
        return n

    cdef object _read_obj(self, Py_ssize_t off, Py_ssize_t cnt, object out):
        self._range(off, cnt)
        cdef Py_buffer view
        if out is None:
            res = PyBytes_FromStringAndSize(NULL, cnt)
            self._ready()   # the allocation may have run Python code (gc)
            self._load(PyBytes_AS_STRING(res), self._ptr + off, cnt)
            return res
        _out_view(out, &view, cnt)
        try:
            self._ready()
            self._load(view.buf, self._ptr + off, cnt)
        finally:
            PyBuffer_Release(&view)
        return out

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        self._ready()
        buffer.obj = self
        _fill_u8_buffer(buffer, self._ptr, self._size, self._shape, self._strides, flags)
        self._exports += 1

    def __releasebuffer__(self, Py_buffer *buffer):
        self._exports -= 1

    @property
    def __array_interface__(self):
        # Only reached by numpy when the buffer protocol failed (a closed or
        # foreign mapping): raise the reason instead of letting
        # numpy.asarray() build a 0-d object array.
        self._ready()
        raise AttributeError("__array_interface__")

    cdef int _check_closable(self) except -1:
        if self._closed:
            return 0
        if self._exports > 0:
            raise BusyError(
                f"the mapping has {self._exports} live buffer export(s) (memoryview / "
                f"numpy views); release them before unmapping", _errno.EBUSY)
        return 0

    cdef int _drain(self) except -1:
        """Stops new copies (the mapping reads as closed) and waits, with the GIL
        released, for those in other threads; BusyError (mapping unchanged) if
        they are still running after GDRPY_BUSY_WAIT_MS (default 3000 ms)."""
        if self._inflight == 0:
            return 0
        self._closed = True
        left = _wait_idle(&self._inflight)
        self._closed = False
        if left > 0:
            raise BusyError(f"{left} copies through the mapping are still in flight "
                            f"in other threads after {_busy_wait_s():.1f} s; it stays mapped",
                            _errno.EBUSY)
        return 0

    def close(self):
        """Unmap.  Idempotent.  BusyError while buffer exports are alive."""
        if self._closed:
            return
        if self._fork_gen != gdrpy_fork_generation or self._pin._ctx._h == 0:
            self._closed = True
            return
        self._check_closable()
        self._drain()
        cdef gdrpy_ctx_t ch = self._pin._ctx._h
        cdef gdrpy_pin_t ph = self._pin._h
        cdef int rc
        self._closed = True      # before the GIL is released: no new copies
        with nogil:
            rc = gdrpy_unmap(ch, ph)
        if rc == _errno.EBUSY:   # copies in flight in C; still mapped
            self._closed = False
        _check(rc)

    def __init__(self, *args, **kwargs):
        raise ArgumentTypeError("Mapping objects are made by Pin.map()")

    def __repr__(self):
        state = "closed" if self._closed else "open"
        backend = self._pin._ctx.backend if self._pin is not None else None
        return f"<gdrpy.Mapping size={self._size} backend={backend!r} {state}>"

    def __enter__(self):
        self._ready()
        return self

    def __exit__(self, *exc):
        self.close()
        return False


cdef extern from "time.h" nogil:
    ctypedef long time_t
    cdef struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk, timespec *ts)
    int CLOCK_MONOTONIC


cdef inline double _now() nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


# Path flags (the same values as gdrpy.threshold.MAPPING / TIMED).
DEF ADVISE_MAPPING = 1
DEF ADVISE_TIMED = 2
# Re-read the picker's thresholds at least this often (calls).
DEF REFRESH_EVERY = 4096


cdef inline bint _count_view(object out, Py_buffer *view) noexcept:
    """For get(): True with a writable contiguous view of ``out`` in *view
    when ``out`` (a plain exporter) is a buffer to fill, i.e. the request
    succeeds and is not 0-d.  False (nothing held, no error set) otherwise:
    the caller then decides as for any object (a 0-d integer array is a
    count; an error comes from the checked path)."""
    if _gp_getbuffer(out, view, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS) != 0:
        _gp_err_clear()
        return False
    if view.ndim == 0:
        PyBuffer_Release(view)
        return False
    return True


cdef class Transfer:
    """put/get on one mapped pin with automatic path choice.

    ``put(offset, src)`` (host -> GPU) and ``get(offset, out)`` (GPU -> host)
    send a message through the mapping (CPU stores / streaming loads) when it
    is at most the threshold for that direction and host-memory kind, else
    through the copy engine, issued from C without the GIL:

    * page-locked host memory (gdrpy host buffers and registrations,
      cudaHostAlloc / torch ``pin_memory()`` / CuPy pinned memory): cuMemcpy
      straight from/to it (``ce-locked``);
    * pageable memory: cuMemcpy from/to it (``ce-direct``, the driver stages
      it) below the staging plan's ``staged_min``, else through the
      context's pipelined staging ring (``ce-staged``).

    Two pickers hold the thresholds: ``picker`` for pageable memory and
    ``picker_locked`` for page-locked memory (one picker given explicitly
    serves both).  The host memory is classified (gdrpy_host_kind: gdrpy's
    own ranges, then - unless Python or numpy allocated the memory - two
    cuPointerGetAttributes) only for messages of at
    least ``classify_min`` bytes: below it every kind takes the same path, so
    small messages pay nothing.  The thresholds are cached as C integers and
    re-read every 4096 calls and after every timed sample, so choosing costs
    a comparison.  Inside a picker's adaptation window one transfer in
    ``2 * probe_every`` is timed and recorded, alternately on the other path
    (a probe) and on the chosen one (a baseline sample), to the picker of the
    message's memory kind (online adaptation).

    ``stream`` (any stream object or handle; None: synchronous):
      * put over the copy engine: enqueued on the stream.  A pageable source
        (direct or staged) has been consumed when the call returns, so the
        caller may reuse it at once; a page-locked source is read by the copy
        engine later, as with cuMemcpyHtoDAsync: keep it unchanged until the
        stream has reached the copy;
      * put over the mapping: waits for the stream's earlier work first, then
        stores; work launched on the stream afterwards sees the data;
      * get (either path): ordered after the stream's earlier work; returns
        when the data is in host memory.
    """

    cdef Mapping _m
    cdef Pin _pin
    cdef readonly object picker
    cdef readonly object picker_locked
    cdef readonly object plan
    cdef Py_ssize_t _t[4]          # thresholds [kind * 2 + dir]: kind 0 pageable, 1 locked
    cdef Py_ssize_t _lo[4]
    cdef Py_ssize_t _hi[4]
    cdef Py_ssize_t _classify_min[2]
    cdef Py_ssize_t _staged_min[2]
    cdef unsigned _calls
    cdef unsigned _tick[4]         # in-window calls since the last timed one
    cdef unsigned _every           # in-window calls between timed transfers
    cdef unsigned char _probe[4]   # next timed transfer is a probe (1) or a sample (0)

    def __cinit__(self, Mapping mapping not None, picker=None, picker_locked=None, plan=None):
        mapping._ready()
        self._m = mapping
        self._pin = mapping._pin
        ctx = mapping._pin._ctx
        if picker is None:
            from gdrpy.threshold.context import default_picker
            picker = default_picker(ctx)
            if picker_locked is None:
                picker_locked = default_picker(ctx, "locked")
        if picker_locked is None:
            picker_locked = picker
        if plan is None:
            from gdrpy.staging import default_plan
            plan = default_plan(ctx)
        self.picker = picker
        self.picker_locked = picker_locked
        self.plan = plan
        self.refresh()

    def refresh(self):
        """Re-read thresholds, adaptation windows and the staging plan."""
        cdef int j
        for k, pk in enumerate((self.picker, self.picker_locked)):
            thr = pk._thr
            st = pk._st
            for i, d in enumerate(("h2d", "d2h")):
                j = k * 2 + i
                t = thr[d]
                self._t[j] = t if t < PY_SSIZE_T_MAX_ else PY_SSIZE_T_MAX_
                w = st[d]
                self._lo[j] = max(0, min(int(w.lo), PY_SSIZE_T_MAX_))
                self._hi[j] = max(-1, min(int(w.hi), PY_SSIZE_T_MAX_)) if w.adaptive else -1
        for i, d in enumerate(("h2d", "d2h")):
            sm = int(self.plan.staged_min[d])
            self._staged_min[i] = max(0, min(sm, PY_SSIZE_T_MAX_))
            cm = min(self._staged_min[i], int(self.plan.locked_gain_min))
            if self._t[2 + i] != self._t[i]:     # the kinds' thresholds differ: from
                cm = min(cm, min(self._t[2 + i], self._t[i]) + 1)   # the lower one up
            self._classify_min[i] = max(0, cm)
        self._every = max(2, 2 * int(getattr(self.picker, "_probe_every", 64)))
        self._calls = 0

    @property
    def mapping(self):
        return self._m

    def thresholds(self):
        """The cached thresholds (bytes) for pageable memory: {'h2d': T, 'd2h': T}."""
        return {"h2d": self._t[0], "d2h": self._t[1]}

    def thresholds_by_kind(self):
        """{'pageable': {...}, 'page-locked': {...}, 'staged_min': {...},
        'classify_min': {...}} in bytes."""
        return {"pageable": {"h2d": self._t[0], "d2h": self._t[1]},
                "page-locked": {"h2d": self._t[2], "d2h": self._t[3]},
                "staged_min": {"h2d": self._staged_min[0], "d2h": self._staged_min[1]},
                "classify_min": {"h2d": self._classify_min[0], "d2h": self._classify_min[1]}}

    cdef int _dir(self, direction) except -1:
        if direction == "h2d":
            return 0
        if direction == "d2h":
            return 1
        raise InvalidArgumentError(f"direction must be 'h2d' or 'd2h', not {direction!r}",
                                   _errno.EINVAL)

    def path_for(self, direction, nbytes, kind="pageable"):
        """'mapping' or 'ce': the path a message of ``nbytes`` in memory of
        ``kind`` ('pageable' or 'page-locked') takes now."""
        cdef int i = self._dir(direction)
        cdef int k = 1 if kind in ("page-locked", "pinned", "registered", "locked") else 0
        cdef Py_ssize_t n = _index(nbytes, "nbytes")
        if n < self._classify_min[i]:
            k = 0
        return "mapping" if n <= self._t[k * 2 + i] else "ce"

    def method_for(self, direction, nbytes, kind="pageable"):
        """'mapping', 'ce-direct', 'ce-locked' or 'ce-staged' (untimed choice)."""
        cdef int i = self._dir(direction)
        cdef Py_ssize_t n = _index(nbytes, "nbytes")
        p = self.path_for(direction, n, kind)
        if p == "mapping":
            return p
        if n >= self._classify_min[i] and kind in ("page-locked", "pinned", "registered",
                                                   "locked"):
            return "ce-locked"
        return "ce-staged" if n >= self._staged_min[i] else "ce-direct"

    cdef inline int _advice(self, int j, Py_ssize_t n) except -1:
        cdef int use = ADVISE_MAPPING if n <= self._t[j] else 0
        self._calls += 1
        if self._calls >= REFRESH_EVERY:
            self.refresh()
        if n < self._lo[j] or n > self._hi[j]:
            return use
        self._tick[j] += 1
        if self._tick[j] < self._every:
            return use
        self._tick[j] = 0
        self._probe[j] ^= 1
        if self._probe[j]:
            return ADVISE_TIMED | (use ^ ADVISE_MAPPING)
        return ADVISE_TIMED | use

    cdef inline int _kind(self, object obj, void *buf, Py_ssize_t n) except -1:
        """1 if [buf, buf+n) is page-locked, else 0."""
        cdef int kind = 0
        if type(obj) is HostBuffer:
            return 1
        if _python_owned(obj):
            kind = gdrpy_host_kind_known(buf, <size_t>n)
        else:
            _check(gdrpy_host_kind(self._pin._ctx._h, buf, <size_t>n, &kind))
        return 1 if kind != GDRPY_HOST_PAGEABLE else 0

    cdef inline int _method(self, int i, int kind, Py_ssize_t n) noexcept:
        if kind:
            return CE_LOCKED
        return CE_STAGED if n >= self._staged_min[i] else CE_DIRECT

    def put(self, offset, src, stream=None):
        """Host -> GPU: copy ``src`` (any contiguous buffer) to ``offset``.
        Returns the number of bytes."""
        self._m._ready()
        cdef Py_ssize_t off = _index(offset, "offset")
        cdef void *s = NULL
        cdef Py_ssize_t n
        cdef Py_buffer view
        cdef const char *p
        cdef bint held = False
        cdef int adv = 0, kind = 0
        cdef double t0 = 0
        if stream is not None:
            s = _stream_ptr(stream)
        if PyBytes_CheckExact(src):
            n = PyBytes_GET_SIZE(src)
            p = PyBytes_AS_STRING(src)
        else:
            _in_view(src, &view)
            held = True
            n = view.len
            p = <const char *>view.buf
        try:
            if n >= self._classify_min[0]:
                kind = self._kind(src, <void *>p, n)
            self._m._range(off, n)
            adv = self._advice(kind * 2, n)
            if adv & ADVISE_TIMED:
                t0 = _now()
            if adv & ADVISE_MAPPING:
                # Stores straight from the buffer acquired above (held until
                # the copy is done: one export per put, not two).
                if stream is not None:
                    _stream_wait(self._pin._ctx._h, s)
                self._m._ready()   # the export / the wait may have run Python code
                self._m._store(self._m._ptr + off, p, n)
            else:
                if held:
                    held = False
                    PyBuffer_Release(&view)
                self._pin._ce_write_obj(off, src, s, self._method(0, kind, n))
            if adv & ADVISE_TIMED:
                t0 = _now() - t0
        finally:
            if held:
                PyBuffer_Release(&view)
        if adv & ADVISE_TIMED:
            (self.picker_locked if kind else self.picker).record(
                "h2d", "mapping" if adv & ADVISE_MAPPING else "ce", n, t0)
            self.refresh()
        return n

    def get(self, offset, out, stream=None):
        """GPU -> host: ``out`` is a byte count (returns new bytes) or a
        writable buffer (filled from its start and returned)."""
        self._m._ready()
        cdef Py_ssize_t off = _index(offset, "offset")
        cdef void *s = NULL
        cdef Py_ssize_t n
        cdef Py_buffer view
        cdef bint held = False
        cdef int adv = 0, kind = 0
        cdef double t0 = 0
        if stream is not None:
            s = _stream_ptr(stream)
        if PyLong_CheckExact(out):
            n = _index(out, "n")
            out = None
        elif _plain_exporter(out) and _count_view(out, &view):
            held = True     # the common case: a writable array/bytearray/memoryview
            n = view.len
        elif isinstance(out, int) or (getattr(out, "ndim", None) == 0 and
                                      hasattr(out, "__index__")):   # numpy integer scalars
            n = _index(out, "n")
            out = None
        else:
            _get_out_buffer(out, &view, 0)
            held = True
            n = view.len
        try:
            if held and n >= self._classify_min[1]:
                kind = self._kind(out, view.buf, n)
            self._m._range(off, n)
            adv = self._advice(kind * 2 + 1, n)
            if adv & ADVISE_TIMED:
                t0 = _now()
            if adv & ADVISE_MAPPING:
                if stream is not None:
                    _stream_wait(self._pin._ctx._h, s)
                if held:
                    # Loads straight into the buffer acquired above.
                    self._m._ready()
                    self._m._load(view.buf, self._m._ptr + off, n)
                    res = out
                else:
                    res = self._m._read_obj(off, n, None)
            else:
                if held:
                    held = False
                    PyBuffer_Release(&view)
                res = self._pin._ce_read_obj(off, n, out, s, self._method(1, kind, n))
            if adv & ADVISE_TIMED:
                t0 = _now() - t0
        finally:
            if held:
                PyBuffer_Release(&view)
        if adv & ADVISE_TIMED:
            (self.picker_locked if kind else self.picker).record(
                "d2h", "mapping" if adv & ADVISE_MAPPING else "ce", n, t0)
            self.refresh()
        return res

    def __repr__(self):
        return (f"<gdrpy.Transfer h2d<={self._t[0]} d2h<={self._t[1]} "
                f"(page-locked h2d<={self._t[2]} d2h<={self._t[3]}) mapping={self._m!r}>")

# ---------------------------------------------------------------------------
# DLPack export (legacy unversioned DLManagedTensor in a "dltensor" capsule).
# Struct layouts are DLPack's ABI; the capsule keeps `owner` alive until the
# consumer calls the deleter, or until the capsule dies unconsumed.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t
from libc.stdlib cimport malloc, free
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF

cdef extern from *:
    """
    typedef struct { int32_t device_type; int32_t device_id; } gp_DLDevice;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } gp_DLDataType;
    typedef struct {
        void *data; gp_DLDevice device; int32_t ndim; gp_DLDataType dtype;
        int64_t *shape; int64_t *strides; uint64_t byte_offset;
    } gp_DLTensor;
    typedef struct gp_DLManagedTensor {
        gp_DLTensor dl_tensor; void *manager_ctx;
        void (*deleter)(struct gp_DLManagedTensor *self);
    } gp_DLManagedTensor;
    """
    ctypedef struct gp_DLDevice:
        int32_t device_type
        int32_t device_id
    ctypedef struct gp_DLDataType:
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct gp_DLTensor:
        void *data
        gp_DLDevice device
        int32_t ndim
        gp_DLDataType dtype
        int64_t *shape
        int64_t *strides
        uint64_t byte_offset
    ctypedef struct gp_DLManagedTensor:
        gp_DLTensor dl_tensor
        void *manager_ctx
        void (*deleter)(gp_DLManagedTensor *) noexcept

cdef extern from "Python.h":
    int gp_capsule_is_valid "PyCapsule_IsValid"(PyObject *o, const char *name)
    void *gp_capsule_get_pointer "PyCapsule_GetPointer"(PyObject *o, const char *name)
    object gp_capsule_new "PyCapsule_New"(void *p, const char *name,
                                          void (*destructor)(PyObject *) noexcept)


cdef void _dl_deleter(gp_DLManagedTensor *mt) noexcept with gil:
    cdef PyObject *owner = <PyObject *>mt.manager_ctx
    mt.manager_ctx = NULL
    free(mt)
    if owner != NULL:
        Py_DECREF(<object>owner)


cdef void _dl_capsule_destructor(PyObject *capsule) noexcept:
    # Still named "dltensor": nobody consumed it, so release it here.  The
    # capsule is being destroyed: touch it only through borrowed pointers.
    cdef gp_DLManagedTensor *mt
    if gp_capsule_is_valid(capsule, b"dltensor"):
        mt = <gp_DLManagedTensor *>gp_capsule_get_pointer(capsule, b"dltensor")
        if mt != NULL and mt.deleter != NULL:
            mt.deleter(mt)


def dlpack_capsule(owner, ptr, nbytes, int device_type, int device_id):
    """A DLPack capsule of ``nbytes`` uint8 at ``ptr`` owned by ``owner``."""
    cdef uint64_t p = _u64(ptr, "ptr")
    cdef Py_ssize_t n = _index(nbytes, "nbytes")
    cdef gp_DLManagedTensor *mt = <gp_DLManagedTensor *>malloc(
        sizeof(gp_DLManagedTensor) + sizeof(int64_t))
    if mt == NULL:
        raise MemoryError()
    cdef int64_t *shape = <int64_t *>(<char *>mt + sizeof(gp_DLManagedTensor))
    shape[0] = n
    mt.dl_tensor.data = <void *><uintptr_t>p
    mt.dl_tensor.device.device_type = device_type
    mt.dl_tensor.device.device_id = device_id
    mt.dl_tensor.ndim = 1
    mt.dl_tensor.dtype.code = 1     # kDLUInt
    mt.dl_tensor.dtype.bits = 8
    mt.dl_tensor.dtype.lanes = 1
    mt.dl_tensor.shape = shape
    mt.dl_tensor.strides = NULL
    mt.dl_tensor.byte_offset = 0
    Py_INCREF(owner)
    mt.manager_ctx = <void *>owner
    mt.deleter = _dl_deleter
    try:
        return gp_capsule_new(mt, b"dltensor", _dl_capsule_destructor)
    except BaseException:
        _dl_deleter(mt)
        raise


cdef class _HostView:
    """A writable buffer over host memory at ``ptr`` that keeps ``owner``
    alive (sim buffers' numpy views)."""
    cdef object owner
    cdef char *ptr
    cdef Py_ssize_t size
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        buffer.obj = self
        _fill_u8_buffer(buffer, self.ptr, self.size, self.shape, self.strides, flags)

    def __releasebuffer__(self, Py_buffer *buffer):
        pass

    cdef _set(self, object owner, char *ptr, Py_ssize_t size):
        self.owner = owner
        self.ptr = ptr
        self.size = size
        self.shape[0] = size
        self.strides[0] = 1
        return self


def host_view(owner, ptr, nbytes):
    """A writable buffer of ``nbytes`` host bytes at ``ptr`` owned by ``owner``."""
    return (<_HostView>_HostView.__new__(_HostView))._set(
        owner, <char *><uintptr_t>_u64(ptr, "ptr"), _index(nbytes, "nbytes"))


include "_channel.pxi"
