# Unit of gdrpy/_core.pyx: Transfer, put/get on one mapping with the path (the
# mapping or the copy engine) chosen per message from the pickers' thresholds.
# The pickers and the staging plan come from the caller: gdrpy.Transfer
# (gdrpy/transfer.py) fills in the shared defaults, and installs itself as the
# factory of Mapping.transfer() (set_transfer_factory).

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_CheckExact

# Path flags (the same values as gdrpy.threshold.MAPPING / TIMED).
DEF ADVISE_MAPPING = 1
DEF ADVISE_TIMED = 2
# Re-read the picker's thresholds at least this often (calls).
DEF REFRESH_EVERY = 4096

_DIRECTIONS = ("h2d", "d2h")

# The direction of _move (the one body of Transfer.put and get) as a type:
# Cython emits one copy of the body per direction with the other direction's
# branches removed, each called from one place (put or get) and so inlined there
# by the C compiler - one body in the source, and on the hot path no call and no
# test of the direction.
ctypedef unsigned char _h2d_t
ctypedef unsigned short _d2h_t
ctypedef fused _dir_t:
    _h2d_t
    _d2h_t

# Makes the Transfer of Mapping.transfer(): factory(mapping, picker or None).
cdef object _transfer_factory = None


def set_transfer_factory(factory):
    """Install ``factory(mapping, picker)`` -> Transfer, which Mapping.transfer()
    calls (picker None: the defaults).  gdrpy.transfer installs gdrpy.Transfer
    at import."""
    global _transfer_factory
    if not callable(factory):
        raise ArgumentTypeError(f"the transfer factory must be callable, not "
                                f"{type(factory).__name__}")
    _transfer_factory = factory


cdef object _make_transfer(Mapping m, object picker):
    if _transfer_factory is None:
        raise NotSupportedError("Mapping.transfer() has no Transfer factory: it is installed "
                                "by gdrpy.transfer (import gdrpy)", _errno.ENOTSUP)
    t = _transfer_factory(m, picker)
    if not isinstance(t, Transfer):
        raise ArgumentTypeError(f"the transfer factory returned {type(t).__name__}, "
                                "not a Transfer")
    return t


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
    ``picker_locked`` for page-locked memory; ``plan`` is the staging plan
    (gdrpy.Transfer fills in the context's shared ones, and one picker given
    alone serves both kinds).  The host memory is classified (gdrpy_host_kind: gdrpy's
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
        when the data is in host memory.  Without a stream a get waits for
        none of the caller's kernels on either path (the copy engine's runs
        on gdrpy's own non-blocking stream).
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

    def __cinit__(self, Mapping mapping not None, picker, picker_locked, plan):
        mapping._ready()
        if picker is None or picker_locked is None or plan is None:
            raise ArgumentTypeError("Transfer(mapping, picker, picker_locked, plan) takes all "
                                    "four; gdrpy.Transfer fills in the defaults")
        self._m = mapping
        self._pin = mapping._pin
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
            for i, d in enumerate(_DIRECTIONS):
                j = k * 2 + i
                t = thr[d]
                self._t[j] = t if t < PY_SSIZE_T_MAX_ else PY_SSIZE_T_MAX_
                w = st[d]
                self._lo[j] = max(0, min(int(w.lo), PY_SSIZE_T_MAX_))
                self._hi[j] = max(-1, min(int(w.hi), PY_SSIZE_T_MAX_)) if w.adaptive else -1
        for i, d in enumerate(_DIRECTIONS):
            sm = int(self.plan.staged_min[d])
            self._staged_min[i] = max(0, min(sm, PY_SSIZE_T_MAX_))
            cm = min(self._staged_min[i], int(self.plan.locked_gain_min))
            if self._t[2 + i] != self._t[i]:     # the kinds' thresholds differ: from
                cm = min(cm, min(self._t[2 + i], self._t[i]) + 1)   # the lower one up
            self._classify_min[i] = max(0, cm)
        self._every = max(2, 2 * int(getattr(self.picker, "_probe_every", 64)))
        self._calls = 0

    @staticmethod
    def _context_of(Mapping mapping not None):
        """The context of ``mapping``, which must be open (for the defaults of
        a Transfer, looked up before it is made)."""
        mapping._ready()
        return mapping._pin._ctx

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
        return _move(self, <_h2d_t>0, offset, src, stream)

    def get(self, offset, out, stream=None):
        """GPU -> host: ``out`` is a byte count (returns new bytes) or a
        writable buffer (filled from its start and returned)."""
        return _move(self, <_d2h_t>1, offset, out, stream)

    def __repr__(self):
        return (f"<gdrpy.Transfer h2d<={self._t[0]} d2h<={self._t[1]} "
                f"(page-locked h2d<={self._t[2]} d2h<={self._t[3]}) mapping={self._m!r}>")


cdef inline object _move(Transfer self, _dir_t d, object offset, object obj, object stream):
    """Transfer.put (d 0, _h2d_t: ``obj`` is the source) and Transfer.get
    (d 1, _d2h_t: ``obj`` is a byte count or the buffer to fill)."""
    self._m._ready()
    cdef Py_ssize_t off = _index(offset, "offset")
    cdef void *s = NULL
    cdef Py_ssize_t n = 0
    cdef Py_buffer view
    cdef char *p = NULL        # the host bytes: the source, or the buffer to fill
    cdef bint held = False     # view holds an export of obj
    cdef bint host = True      # p is set (a get of a byte count has no buffer yet)
    cdef int adv = 0, kind = 0
    cdef double t0 = 0
    if stream is not None:
        s = _stream_ptr(stream)
    if _dir_t is _h2d_t:
        if PyBytes_CheckExact(obj):
            n = PyBytes_GET_SIZE(obj)
            p = PyBytes_AS_STRING(obj)
        else:
            _in_view(obj, &view)
            held = True
    else:
        if PyLong_CheckExact(obj):
            n = _index(obj, "n")
            obj = None
            host = False
        elif _plain_exporter(obj) and _count_view(obj, &view):
            held = True     # the common case: a writable array/bytearray/memoryview
        elif isinstance(obj, int) or (getattr(obj, "ndim", None) == 0 and
                                      hasattr(obj, "__index__")):   # numpy integer scalars
            n = _index(obj, "n")
            obj = None
            host = False
        else:
            _get_out_buffer(obj, &view, 0)
            held = True
    if held:
        n = view.len
        p = <char *>view.buf
    try:
        if host and n >= self._classify_min[d]:
            kind = self._kind(obj, p, n)
        self._m._range(off, n)
        adv = self._advice(kind * 2 + d, n)
        if adv & ADVISE_TIMED:
            t0 = _now()
        if adv & ADVISE_MAPPING:
            if stream is not None:
                _stream_wait(self._pin._ctx._h, s)
            if host:
                # Straight from / into the buffer acquired above (held
                # until the copy is done: one export per call, not two).
                self._m._ready()   # the export / the wait may have run Python code
                if _dir_t is _h2d_t:
                    self._m._store(self._m._ptr + off, p, n)
                else:
                    self._m._load(p, self._m._ptr + off, n)
            else:
                obj = self._m._read_obj(off, n, None)
        else:
            if held:
                held = False
                PyBuffer_Release(&view)
            if _dir_t is _h2d_t:
                self._pin._ce_write_obj(off, obj, s, self._method(d, kind, n))
            else:
                obj = self._pin._ce_read_obj(off, n, obj, s, self._method(d, kind, n))
        if adv & ADVISE_TIMED:
            t0 = _now() - t0
    finally:
        if held:
            PyBuffer_Release(&view)
    if adv & ADVISE_TIMED:
        (self.picker_locked if kind else self.picker).record(
            _DIRECTIONS[d], "mapping" if adv & ADVISE_MAPPING else "ce", n, t0)
        self.refresh()
    if _dir_t is _h2d_t:
        return n
    else:
        return obj
