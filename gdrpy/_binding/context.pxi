# Unit of gdrpy/_core.pyx: Context, an open device (gdrpy.open()).  It tracks its
# pins, so close() unpins (and unmaps) them first.

from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING


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
        with ``size``.  Returns a :class:`Pin`.  ``flags``: GDRCopy's pin
        flags; 1 (FORCE_PCIE) raises NotSupportedError (code 524, ENOTSUPP,
        as GDRCopy) on a GPU without a coherent CPU-GPU link."""
        self._ready()
        addr, nbytes, owner = _device_range(obj, size)
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
