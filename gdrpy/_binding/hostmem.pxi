# Unit of gdrpy/_core.pyx: page-locked host memory (gdrpy_host.h) and the
# context's staging ring.
#
# HostBuffer  - gdrpy.memory.host_alloc(): page-locked memory, buffer
#               protocol with counted exports, __array_interface__.
# Registration - Context.register(obj): cuMemHostRegister of a caller's
#               buffer, scoped; holds a buffer export on the object for its
#               whole life, so the memory cannot be freed or resized while
#               registered, and nothing about it is remembered afterwards.

HOST_KINDS = {GDRPY_HOST_PAGEABLE: "pageable", GDRPY_HOST_PINNED: "pinned",
              GDRPY_HOST_REGISTERED: "registered", GDRPY_HOST_LOCKED: "page-locked"}


cdef int _python_owned(object obj) noexcept:
    """1 if obj's memory was allocated by Python or numpy itself (bytes,
    bytearray, an ndarray whose base chain ends in an ndarray owning its
    data, memoryviews of those): no other library page-locked it, unless it
    registered it behind our back, so the driver need not be asked."""
    cdef int i
    for i in range(8):
        t = type(obj)
        if t is bytes or t is bytearray:
            return 1
        if t is memoryview:
            obj = (<memoryview>obj).obj
            continue
        if t is _ndarray_t:
            b = (<object>obj).base
            if b is None:
                return 1
            obj = b
            continue
        return 0
    return 0


def host_live():
    """Live gdrpy host allocations + registrations in this process."""
    return gdrpy_host_live()


def host_kind(Context ctx not None, obj):
    """The kind of host memory ``obj`` (a contiguous buffer) lives in:
    'pinned' (gdrpy host_alloc), 'registered' (a live gdrpy registration),
    'page-locked' (cudaHostAlloc / torch pin_memory / CuPy pinned memory /
    another cuMemHostRegister) or 'pageable'.  Asks the table of gdrpy's own
    ranges, then the driver; nothing is cached."""
    ctx._ready()
    cdef Py_buffer view
    cdef int kind = 0
    _get_in_buffer(obj, &view)
    try:
        _check(gdrpy_host_kind(ctx._h, view.buf, <size_t>view.len, &kind))
    finally:
        PyBuffer_Release(&view)
    return HOST_KINDS.get(kind, str(kind))


STAGING_KINDS = ("plain", "nt", "wc", "evict", "ntevict")


def _kind_index(k):
    if k is None:
        return -1
    if k not in STAGING_KINDS:
        raise InvalidArgumentError(f"staging kind {k!r} is not one of {STAGING_KINDS}",
                                   _errno.EINVAL)
    return STAGING_KINDS.index(k)


def staging_config(Context ctx not None, chunk=0, depth=0, threads=0, write_kind=None,
                   read_kind=None):
    """Set (non-zero / non-None arguments) and return the context's staging
    ring parameters as a dict: chunk (bytes), depth (slots), threads (memcpy
    threads), write_kind / read_kind (how the CPU side touches the ring:
    'plain', 'nt', 'wc', 'evict', 'ntevict'; gdrpy_host.h) and write_used / read_used
    (the kinds the ring as built uses, None before it is built).  The ring is
    rebuilt on the next staged copy."""
    ctx._ready()
    cdef Py_ssize_t c = _index(chunk, "chunk")
    cdef Py_ssize_t d = _index(depth, "depth")
    cdef Py_ssize_t t = _index(threads, "threads")
    if d > 1024 or t > 1024:
        raise InvalidArgumentError(f"depth {d} / threads {t} out of range", _errno.EINVAL)
    cdef int wk = _kind_index(write_kind)
    cdef int rk = _kind_index(read_kind)
    if c or d or t:
        _check(gdrpy_staging_set(ctx._h, <size_t>c, <unsigned>d, <unsigned>t))
    if wk >= 0 or rk >= 0:
        _check(gdrpy_staging_set_kinds(ctx._h, wk, rk))
    cdef size_t oc = 0
    cdef unsigned od = 0, ot = 0
    cdef int owk = 0, ork = 0, owu = -1, oru = -1
    _check(gdrpy_staging_get(ctx._h, &oc, &od, &ot))
    _check(gdrpy_staging_get_kinds(ctx._h, &owk, &ork, &owu, &oru))
    return {"chunk": oc, "depth": od, "threads": ot, "write_kind": STAGING_KINDS[owk],
            "read_kind": STAGING_KINDS[ork],
            "write_used": STAGING_KINDS[owu] if owu >= 0 else None,
            "read_used": STAGING_KINDS[oru] if oru >= 0 else None}


@cython.no_gc_clear
cdef class HostBuffer:
    """Page-locked host memory from :func:`gdrpy.memory.host_alloc`.

    A writable uint8 buffer (``memoryview(b)``, ``numpy.asarray(b)``,
    ``b.numpy()``) that the copy engines move directly.  ``close()`` frees it
    and raises BusyError while buffer exports (memoryviews, numpy arrays made
    through the buffer protocol) are alive.  ``__array_interface__`` hands out
    the raw address: once it has been used, ``close()`` only marks the buffer
    closed and the memory is freed when the last reference to the buffer goes
    (consumers of the interface keep a reference), so it is never freed under
    a view.  The buffer does not depend on the context it was allocated
    through: it stays valid after that context is closed.
    """
    cdef char *_ptr
    cdef Py_ssize_t _size
    cdef Py_ssize_t _shape[1]
    cdef Py_ssize_t _strides[1]
    cdef int _exports
    cdef bint _raw          # __array_interface__ was handed out
    cdef bint _closed
    cdef unsigned _fork_gen
    cdef readonly int device
    cdef readonly bint is_sim
    cdef object __weakref__

    def __cinit__(self):
        self._ptr = NULL
        self._closed = True

    def __init__(self, *args, **kwargs):
        raise TypeError("HostBuffer objects are made by gdrpy.memory.host_alloc()")

    def __dealloc__(self):
        if self._ptr != NULL and self._fork_gen == gdrpy_fork_generation:
            gdrpy_host_free(self._ptr)
        self._ptr = NULL

    cdef int _ready(self) except -1:
        if self._closed:
            raise ClosedError("the host buffer is freed (closed)", _errno.EBADF)
        if self._fork_gen != gdrpy_fork_generation:
            raise WrongProcessError("this host buffer belongs to the parent process (fork)",
                                    _errno.EACCES)
        return 0

    @property
    def closed(self):
        return self._closed

    @property
    def ptr(self):
        self._ready()
        return <uintptr_t>self._ptr

    @property
    def size(self):
        return self._size

    @property
    def nbytes(self):
        return self._size

    @property
    def kind(self):
        return "pinned"

    def __len__(self):
        return self._size

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        self._ready()
        buffer.obj = self
        _fill_u8_buffer(buffer, self._ptr, self._size, self._shape, self._strides, flags)
        self._exports += 1

    def __releasebuffer__(self, Py_buffer *buffer):
        self._exports -= 1

    @property
    def __array_interface__(self):
        self._ready()
        self._raw = True
        return {"shape": (self._size,), "typestr": "|u1", "data": (<uintptr_t>self._ptr, False),
                "strides": None, "version": 3}

    def numpy(self):
        """A uint8 numpy array over the buffer (no copy; counted as an export)."""
        import numpy as np
        return np.frombuffer(self, np.uint8)

    def close(self):
        """Free the memory.  Idempotent.  BusyError while buffer exports live."""
        if self._closed:
            return
        if self._fork_gen != gdrpy_fork_generation:
            self._closed = True
            self._ptr = NULL
            return
        if self._exports > 0:
            raise BusyError(f"the host buffer has {self._exports} live buffer export(s) "
                            "(memoryview / numpy views); release them before freeing it",
                            _errno.EBUSY)
        self._closed = True
        if self._raw:
            return      # freed by __dealloc__, when no interface consumer holds it
        cdef char *p = self._ptr
        self._ptr = NULL
        _check(gdrpy_host_free(p))

    def __enter__(self):
        self._ready()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        state = "freed" if self._closed else f"ptr={<uintptr_t>self._ptr:#x}"
        return f"<gdrpy.memory.HostBuffer {state} size={self._size}{' sim' if self.is_sim else ''}>"


def host_alloc(Context ctx not None, nbytes):
    """Allocate ``nbytes`` of page-locked host memory (cuMemHostAlloc,
    portable; sim: pre-faulted anonymous memory).  Returns a HostBuffer."""
    ctx._ready()
    if isinstance(nbytes, bool):
        raise TypeError("nbytes must be an integer, not bool")
    cdef Py_ssize_t n = _index(nbytes, "nbytes")
    if n == 0:
        raise InvalidArgumentError("nbytes 0 must be positive", _errno.EINVAL)
    cdef void *p = NULL
    cdef int rc
    with nogil:
        rc = gdrpy_host_alloc(ctx._h, <size_t>n, &p)
    _check(rc)
    b = HostBuffer.__new__(HostBuffer)
    (<HostBuffer>b)._ptr = <char *>p
    (<HostBuffer>b)._size = n
    (<HostBuffer>b)._shape[0] = n
    (<HostBuffer>b)._strides[0] = 1
    (<HostBuffer>b)._exports = 0
    (<HostBuffer>b)._fork_gen = gdrpy_fork_generation
    (<HostBuffer>b).device = ctx.device
    (<HostBuffer>b).is_sim = ctx.is_sim
    (<HostBuffer>b)._closed = False
    return b


@cython.no_gc_clear
cdef class Registration:
    """A caller's buffer page-locked with cuMemHostRegister while this object
    is open (``with ctx.register(buf) as reg:``).

    It holds a buffer export on the object from registration to ``close()``:
    a bytearray cannot be resized, a numpy array's memory cannot be released,
    an mmap cannot be closed meanwhile, so the registered range can never be
    freed while registered.  ``close()`` (or leaving the ``with`` block, or
    the object being collected) unregisters first and then releases the
    export; the copy paths keep no record of the range afterwards.  A second
    registration overlapping a live one raises BusyError.
    """
    cdef Py_buffer _view
    cdef bint _held
    cdef object _obj
    cdef unsigned _fork_gen
    cdef readonly int device
    cdef object __weakref__

    def __cinit__(self):
        self._held = False

    def __init__(self, *args, **kwargs):
        raise TypeError("Registration objects are made by Context.register()")

    def __dealloc__(self):
        if self._held:
            if self._fork_gen == gdrpy_fork_generation:
                gdrpy_host_unregister(self._view.buf)
            PyBuffer_Release(&self._view)
            self._held = False

    @property
    def closed(self):
        return not self._held

    @property
    def obj(self):
        return self._obj

    @property
    def ptr(self):
        if not self._held:
            raise ClosedError("the registration is closed", _errno.EBADF)
        return <uintptr_t>self._view.buf

    @property
    def nbytes(self):
        return self._view.len if self._held else 0

    def close(self):
        """Unregister, then release the buffer export.  Idempotent."""
        if not self._held:
            return
        cdef int rc = 0
        if self._fork_gen == gdrpy_fork_generation:
            rc = gdrpy_host_unregister(self._view.buf)
        self._held = False
        PyBuffer_Release(&self._view)
        self._obj = None
        _check(rc)

    def __enter__(self):
        if not self._held:
            raise ClosedError("the registration is closed", _errno.EBADF)
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        if not self._held:
            return "<gdrpy.Registration closed>"
        return (f"<gdrpy.Registration ptr={<uintptr_t>self._view.buf:#x} "
                f"nbytes={self._view.len} of {type(self._obj).__name__}>")


def host_register(Context ctx not None, obj):
    """Page-lock the memory of ``obj`` (any contiguous buffer; writable ones
    may also be the target of gets) until the returned Registration closes."""
    ctx._ready()
    r = Registration.__new__(Registration)
    cdef Registration reg = <Registration>r
    try:
        PyObject_GetBuffer(obj, &reg._view, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS)
    except (BufferError, ValueError):
        try:
            PyObject_GetBuffer(obj, &reg._view, PyBUF_ANY_CONTIGUOUS)
        except (BufferError, ValueError) as e:
            raise InvalidArgumentError(f"register needs a contiguous buffer: {e}",
                                       _errno.EINVAL) from None
    if reg._view.len == 0:
        PyBuffer_Release(&reg._view)
        raise InvalidArgumentError("cannot register an empty buffer", _errno.EINVAL)
    cdef int rc
    with nogil:
        rc = gdrpy_host_register(ctx._h, reg._view.buf, <size_t>reg._view.len)
    if rc:
        PyBuffer_Release(&reg._view)
        _check(rc)
    reg._held = True
    reg._obj = obj
    reg._fork_gen = gdrpy_fork_generation
    reg.device = ctx.device
    return reg
