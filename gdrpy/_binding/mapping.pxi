# Unit of gdrpy/_core.pyx: Mapping, the CPU's view of a pinned range - stores
# and loads through it, its buffer exports, vectored puts (gdrpy_writev) - and
# the Transfer it caches.

from cpython.bytes cimport (PyBytes_FromStringAndSize, PyBytes_AS_STRING,
                            PyBytes_GET_SIZE, PyBytes_CheckExact)
from libc.stdlib cimport malloc, free


@cython.no_gc_clear
cdef class Mapping:
    """CPU view of a pinned range (through BAR1 on a GPU backend).

    Supports the buffer protocol (``memoryview(m)``, ``numpy.asarray(m)``:
    uint8, writable, exactly the pinned ``size`` bytes starting at the pinned
    address), ``write(offset, data)`` and ``read(offset, n, out=None)``.
    Offsets are relative to the pinned address.  Out-of-range requests raise
    OutOfRangeError before any memory is touched.  A pin that reaches past
    the end of the allocation's memory (into the rest of its last GPU page,
    ``pin.backed_size < pin.mapped_size``) maps only the bytes up to that
    end: ``size`` stops there.
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
            self._transfer = _make_transfer(self, picker)
        return self._transfer

    cdef _init(self, Pin pin, char *map_ptr, char *user_ptr):
        self._pin = pin
        self._map_ptr = map_ptr
        self._ptr = user_ptr
        # never past the allocation's memory (the rest of the range is no one's)
        self._size = <Py_ssize_t>min(pin.size, pin.va + pin.backed_size - pin.addr)
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


def mapping_put_many(Mapping m not None, items):
    """Vectored put (``gdrpy_writev``): ``items`` is a sequence of
    ``(offset, buffer)``; every range is checked first (OutOfRangeError and
    nothing written), then all are stored with one store fence at the end.
    Returns the total bytes."""
    m._ready()
    cdef Py_ssize_t n = len(items), i, got = 0, total = 0
    if n == 0:
        return 0
    cdef gdrpy_iov_t *iov = <gdrpy_iov_t *>malloc(n * sizeof(gdrpy_iov_t))
    cdef Py_buffer *views = <Py_buffer *>malloc(n * sizeof(Py_buffer))
    cdef int rc
    if iov == NULL or views == NULL:
        free(iov)
        free(views)
        raise MemoryError()
    try:
        for i in range(n):
            off, data = items[i]
            iov[i].offset = <size_t>_index(off, "offset")
            _get_in_buffer(data, &views[i])
            got += 1
            iov[i].buf = views[i].buf
            iov[i].len = <size_t>views[i].len
            total += views[i].len
        m._ready()   # the conversions and exports above may have run Python code
        m._inflight += 1
        if total >= _nogil_bytes:
            with nogil:
                rc = gdrpy_writev(m._pin._ctx._h, m._pin._h, iov, <size_t>n)
        else:
            rc = gdrpy_writev(m._pin._ctx._h, m._pin._h, iov, <size_t>n)
        m._inflight -= 1
        _check(rc)
        return total
    finally:
        for i in range(got):
            PyBuffer_Release(&views[i])
        free(views)
        free(iov)
