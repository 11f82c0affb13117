# Unit of gdrpy/_core.pyx: Pin, pinned device memory, and its copy-engine copies
# (direct, from page-locked memory, or through the context's staging ring).

from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING

_MAPPING_TYPES = {0: "none", 1: "wc", 2: "caching", 3: "device"}

# Copy-engine methods (Pin.ce_write/ce_read ``method=``).
cdef enum:
    CE_DIRECT = 0     # cuMemcpy from/to the caller's memory (the driver stages pageable memory)
    CE_LOCKED = 1     # cuMemcpy, the caller's memory is page-locked (no extra wait)
    CE_STAGED = 2     # through the context's staging ring
_CE_METHODS = {"direct": CE_DIRECT, "locked": CE_LOCKED, "staged": CE_STAGED}


cdef int _ce_method(object method) except -1:
    try:
        return _CE_METHODS[method]
    except (KeyError, TypeError):
        raise InvalidArgumentError(f"method must be one of {', '.join(_CE_METHODS)}, "
                                   f"not {method!r}", _errno.EINVAL) from None


cdef int _ce_copy(Context ctx, gdrpy_pin_t ph, int d, int method, Py_ssize_t off,
                  void *buf, Py_ssize_t n, void *s) noexcept nogil:
    if d == 0:
        if method == CE_STAGED:
            return gdrpy_ce_write_staged(ctx._h, ph, <size_t>off, buf, <size_t>n, s)
        if method == CE_LOCKED:
            return gdrpy_ce_write_locked(ctx._h, ph, <size_t>off, buf, <size_t>n, s)
        return gdrpy_ce_write(ctx._h, ph, <size_t>off, buf, <size_t>n, s)
    if method == CE_STAGED:
        return gdrpy_ce_read_staged(ctx._h, ph, <size_t>off, buf, <size_t>n, s)
    if method == CE_LOCKED:
        return gdrpy_ce_read_locked(ctx._h, ph, <size_t>off, buf, <size_t>n, s)
    return gdrpy_ce_read(ctx._h, ph, <size_t>off, buf, <size_t>n, s)


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
    cdef readonly size_t backed_size
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
        self.backed_size = <size_t>info.backed_size
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
        """dict: addr, size, va, mapped_size, backed_size, page_size, mapped,
        mapping_type, invalidated.  ``backed_size`` < ``mapped_size`` where the
        pinned GPU pages run past the end of the allocation's memory (its last
        64 KiB page): those bytes are never reachable."""
        self._ready()
        cdef gdrpy_pin_info_t i
        _check(gdrpy_pin_get_info(self._ctx._h, self._h, &i))
        return {"addr": i.addr, "size": i.size, "va": i.va, "mapped_size": i.mapped_size,
                "backed_size": i.backed_size, "page_size": i.page_size, "mapped": bool(i.mapped),
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
        Without one it runs on gdrpy's own non-blocking stream: it waits for
        none of the caller's kernels (as a read through the mapping).
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
