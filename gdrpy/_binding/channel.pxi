# Unit of gdrpy/_core.pyx: Channel, a host<->GPU message channel
# (native/include/gdrpy_channel.h).  Its ring's GPU memory comes from the caller
# (buffer=) or from ``self._new_buffer(nbytes)``, which gdrpy.Channel
# (gdrpy/channel.py) provides with gdrpy.memory.alloc.

from libc.stdint cimport int64_t as _i64, uint32_t as _u32
from libc.stdlib cimport malloc, free
from cpython.float cimport PyFloat_CheckExact, PyFloat_AS_DOUBLE
from cpython.bytearray cimport PyByteArray_CheckExact, PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport (PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE,
                            PyBytes_CheckExact)

# Waits shorter than this spin with the GIL held (a round trip is ~2 us;
# releasing and re-taking the GIL would add to it); longer waits go on
# without the GIL.
DEF SPIN_WITH_GIL_NS = 50000
# send_many of up to this many messages describes them on the stack (no
# allocation per call).
DEF STACK_MSGS = 64

_ST_NAMES = {0: "none", 1: "running", 2: "stopped", 3: "timeout"}

# Memory of channels whose kernel did not stop when they were closed: the
# GPU may still read the ring and write completions, so the ring's buffer,
# pin and mapping are kept here for the life of the process (never freed
# under a running kernel).  C keeps the host block the same way.
_orphaned = []


cdef _i64 _timeout_ns(object timeout) except? -2:
    """None: forever (-1); seconds (float or int, >= 0) -> ns."""
    cdef double v
    if PyFloat_CheckExact(timeout):     # the common case, no Python-level work
        v = PyFloat_AS_DOUBLE(timeout)
        if 0.0 <= v <= 1e9:
            return <_i64>(v * 1e9)
    if timeout is None:
        return -1
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be seconds (int/float) or None, not "
                        f"{type(timeout).__name__}")
    if timeout < 0:
        raise InvalidArgumentError(f"timeout {timeout} is negative", _errno.EINVAL)
    if timeout > 1e9:
        return -1
    return <_i64>(timeout * 1e9)


cdef int _chan_check(int rc) except -1:
    if rc == 0:
        return 0
    msg = gdrpy_last_error().decode("utf-8", "replace")
    if rc == _errno.EAGAIN:
        raise ChannelFullError(msg, rc)
    if rc == GDRPY_ETIMEDOUT:
        raise ChannelTimeoutError(msg, rc)
    if rc == GDRPY_EPIPE:
        raise ChannelClosedError(msg, rc)
    return _check(rc)


@cython.no_gc_clear
cdef class Channel:
    """A host<->GPU message channel (``gdrpy_channel.h``).

    ``Channel(ctx, nslots=64, slot_size=64, comp_size=16, comp_nslots=0,
    buffer=None, plain=False, near=False)``: a ring of ``nslots`` (power of
    two) message slots of ``slot_size`` payload bytes in GPU memory
    (``buffer``, pinned and mapped here; by default ``_new_buffer()``'s, in
    gdrpy.Channel a new :func:`gdrpy.memory.alloc` buffer of ``device_bytes``
    bytes), and a ring of ``comp_nslots`` (0: ``nslots``) completions of
    ``comp_size`` bytes in page-locked host memory.  Slot format: LL
    (default: every 8-byte word carries the sequence number, no
    fences between payload and flag on either side) or ``plain=True``
    (sequence word written last; for kernels that read slots in place with
    ``gdrpy_chan_msg``); see docs/channel.md.  ``near=True``: the ring has
    twice as many slots (at least 64 KiB of them) and the kernel keeps the
    ``nslots`` nearest to its SM when
    it attaches (``gdrpy_chan_attach``; on GPUs with a split L2 such as the
    H100 a message on a near slot is seen ~0.1-0.2 us sooner); sends wait for
    the attach (``wait_attached``), docs/channel.md "Near slots".

    * ``send(payload, tag=0, timeout=1.0)``: one call = payload stores,
      sfence, sequence-word store.  ``timeout`` 0: raise ChannelFullError at
      once when the ring is full; None: wait forever; else seconds
      (ChannelTimeoutError).
    * ``send_many(payloads, tags=None, timeout=1.0)``: a 2-D C-contiguous
      buffer (one row per message) or a sequence of buffers; one fence for
      all, all or nothing.
    * ``recv(timeout=1.0)`` -> bytes, ``recv_into(buf, timeout)`` -> length,
      ``poll()`` -> bytes or None (no wait), ``recv_many(min, max, out,
      timeout)`` -> count; ``last_tag`` is the tag of the last completion.
    * ``shutdown(drain=True, timeout=5.0)`` -> stats dict; ``close()`` (also on
      ``with`` exit) shuts down (drain) if not done and frees the channel.
    * ``desc`` (bytes, 64): the ``gdrpy_chan_desc_t`` to pass to a kernel by
      value; ``device_pointers()`` the same as a dict.

    The ring's mapping is exported (held) for the channel's lifetime, so the
    context cannot unmap it underneath (``Context.close()`` raises BusyError
    while a channel is open).  Tiny sends keep the GIL (tens of ns);
    waits longer than 50 us release it.  Single producer, single consumer.
    ``close()`` from another thread while a send or receive waits: the wait
    ends (ChannelClosedError once the kernel has stopped) and the close
    waits for it, bounded (``GDRPY_BUSY_WAIT_MS``); then BusyError, with
    the channel left open.
    """

    cdef gdrpy_chan_t *_c
    cdef readonly Context context
    cdef readonly object buffer
    cdef readonly Pin pin
    cdef readonly Mapping mapping
    cdef object _hold           # memoryview holding the mapping's export
    cdef bint _own_buffer
    cdef bint _stopped
    cdef unsigned _fork_gen
    # Calls running on _c without the GIL (waits), and close() in progress:
    # close() frees _c only once the count is 0, and sets _closing first so
    # that no new call starts meanwhile (_ready refuses).
    cdef int _inflight
    cdef bint _closing
    cdef int _host_exports      # live buffer exports of host_block() views
    cdef object _sims           # handles of sim consumers not joined yet
    cdef readonly _u32 nslots
    cdef readonly _u32 slot_size
    cdef readonly _u32 comp_nslots
    cdef readonly _u32 comp_size
    cdef readonly _u32 last_tag
    cdef readonly _u32 last_len
    cdef readonly bint plain
    cdef readonly bint near
    cdef object __weakref__

    def __cinit__(self):
        self._c = NULL
        self._stopped = False
        self._inflight = 0
        self._closing = False
        self._host_exports = 0
        self._sims = set()

    def __init__(self, Context ctx not None, nslots=64, slot_size=64, comp_size=16,
                 comp_nslots=0, buffer=None, plain=False, near=False):
        ctx._ready()
        if self._c != NULL:
            raise InvalidArgumentError("Channel.__init__ called twice", _errno.EINVAL)
        cdef gdrpy_chan_config_t cfg
        cfg.nslots = <_u32>min(_index(nslots, "nslots"), 0xFFFFFFFF)
        cfg.slot_size = <_u32>min(_index(slot_size, "slot_size"), 0xFFFFFFFF)
        cfg.comp_nslots = <_u32>min(_index(comp_nslots, "comp_nslots"), 0xFFFFFFFF)
        cfg.comp_size = <_u32>min(_index(comp_size, "comp_size"), 0xFFFFFFFF)
        cfg.flags = (GDRPY_CHAN_PLAIN if plain else 0) | (GDRPY_CHAN_NEAR if near else 0)
        cfg.reserved = 0
        cdef size_t need = 0
        _check(gdrpy_chan_device_bytes(&cfg, &need))
        self.context = ctx
        self._fork_gen = gdrpy_fork_generation
        if buffer is None:
            buffer = self._new_buffer(need)
            self._own_buffer = True
        self.buffer = buffer
        cdef gdrpy_chan_t *c = NULL
        cdef int rc
        try:
            self.pin = ctx.pin(buffer)
            if self.pin.size < need:
                raise InvalidArgumentError(
                    f"the buffer holds {self.pin.size} bytes; a channel of {cfg.nslots} x "
                    f"{cfg.slot_size} B slots needs {need}", _errno.EINVAL)
            self.mapping = self.pin.map()
            with nogil:
                rc = gdrpy_chan_create(ctx._h, self.pin._h, &cfg, &c)
            _check(rc)
            self._c = c
            self._hold = memoryview(self.mapping)
        except BaseException:
            self._release_memory()
            raise
        cdef gdrpy_chan_desc_t d
        gdrpy_chan_get_desc(self._c, &d)
        self.nslots = d.nslots
        self.slot_size = d.slot_size
        self.comp_nslots = d.comp_nslots
        self.comp_size = d.comp_size
        self.plain = (d.flags & GDRPY_CHAN_PLAIN) != 0
        self.near = (d.flags & GDRPY_CHAN_NEAR) != 0

    @staticmethod
    def device_bytes(nslots=64, slot_size=64, comp_size=16, comp_nslots=0, plain=False,
                     near=False):
        """Bytes of GPU memory a channel of this shape (and slot format) needs."""
        cdef gdrpy_chan_config_t cfg
        cfg.nslots = <_u32>min(_index(nslots, "nslots"), 0xFFFFFFFF)
        cfg.slot_size = <_u32>min(_index(slot_size, "slot_size"), 0xFFFFFFFF)
        cfg.comp_nslots = <_u32>min(_index(comp_nslots, "comp_nslots"), 0xFFFFFFFF)
        cfg.comp_size = <_u32>min(_index(comp_size, "comp_size"), 0xFFFFFFFF)
        cfg.flags = (GDRPY_CHAN_PLAIN if plain else 0) | (GDRPY_CHAN_NEAR if near else 0)
        cfg.reserved = 0
        cdef size_t need = 0
        _check(gdrpy_chan_device_bytes(&cfg, &need))
        return need

    def _new_buffer(self, nbytes):
        """The ring's GPU memory (``nbytes``) when no ``buffer`` is given:
        gdrpy.Channel allocates it with gdrpy.memory.alloc; the binding has no
        allocator of its own."""
        raise ArgumentTypeError("this Channel class allocates no memory: pass buffer= "
                                "(gdrpy.Channel allocates it)")

    cdef _release_memory(self):
        self._hold = None
        m, p = self.mapping, self.pin
        self.mapping = None
        self.pin = None
        if m is not None:
            try:
                m.close()
            except Exception:
                pass
        if p is not None:
            try:
                p.close()
            except Exception:
                pass
        if self._own_buffer and self.buffer is not None:
            try:
                self.buffer.close()
            except Exception:
                pass
        self.buffer = None

    def __dealloc__(self):
        # Not closed: stop the kernel quickly (abort), then free, keeping
        # the memory if it still runs (see close()).
        cdef gdrpy_chan_stats_t s
        if self._c != NULL and self._fork_gen == gdrpy_fork_generation:
            gdrpy_chan_get_stats(self._c, &s)
            if s.status == 1:
                gdrpy_chan_shutdown(self._c, GDRPY_CHAN_ABORT, 100000000, NULL)
            try:
                self._destroy()
            except BaseException:
                pass
        self._c = NULL

    cdef inline int _ready(self) except -1:
        if self._c == NULL or self._closing:
            return self._not_ready()
        if self._fork_gen != gdrpy_fork_generation:
            raise WrongProcessError("this channel belongs to the parent process (fork)",
                                    _errno.EACCES)
        return 0

    cdef int _not_ready(self) except -1:
        if self._c == NULL:
            raise ClosedError("the channel is closed", _errno.EBADF)
        raise ClosedError("the channel is being closed by another thread", _errno.EBADF)

    cdef inline int _enter_nogil(self) except -1:
        # Right before a call that releases the GIL: nothing in between may
        # run Python code, so close() either refused it here or waits for it.
        self._ready()
        self._inflight += 1
        return 0

    cdef int _wait_calls(self) except -1:
        """Waits (GIL released, bounded by GDRPY_BUSY_WAIT_MS) for calls of
        other threads still inside the channel; BusyError if they stay."""
        cdef int left = _wait_idle(&self._inflight)
        if left > 0:
            raise BusyError(f"{left} call(s) on the channel are still waiting in other "
                            f"threads after {_busy_wait_s():.1f} s (its kernel has not "
                            f"stopped); it stays open: close it again once they return",
                            _errno.EBUSY)
        return 0

    @property
    def closed(self):
        return self._c == NULL

    @property
    def desc(self):
        """The 64-byte ``gdrpy_chan_desc_t`` (pass by value to a kernel)."""
        self._ready()
        cdef gdrpy_chan_desc_t d
        gdrpy_chan_get_desc(self._c, &d)
        return PyBytes_FromStringAndSize(<char *>&d, sizeof(d))

    def device_pointers(self):
        """dict: dev_ctrl, ring, host_ctrl, comp (device addresses), strides."""
        self._ready()
        cdef gdrpy_chan_desc_t d
        gdrpy_chan_get_desc(self._c, &d)
        return {"dev_ctrl": d.dev_ctrl, "ring": d.ring, "host_ctrl": d.host_ctrl,
                "comp": d.comp, "nslots": d.nslots, "slot_stride": d.slot_stride,
                "slot_size": d.slot_size, "comp_nslots": d.comp_nslots,
                "comp_stride": d.comp_stride, "comp_size": d.comp_size,
                "place_nslots": d.place_nslots}

    def slot_offset(self, i):
        """Byte offset of message ``i``'s slot from slot 0, as sends use it
        (near channels: the kernel's choice; ChannelFullError [EAGAIN] until
        ``wait_attached`` or a send has taken it)."""
        cdef uint64_t k = <uint64_t>_index(i, "i")
        cdef size_t off = 0
        self._ready()
        _check(gdrpy_chan_slot_offset(self._c, k, &off))
        return off

    def send(self, payload, unsigned int tag=0, timeout=1.0):
        """Publish one message (payload: bytes or any contiguous buffer,
        at most ``slot_size`` bytes)."""
        cdef _i64 t = _timeout_ns(timeout)
        cdef Py_buffer view
        cdef int rc
        self._ready()
        if PyBytes_CheckExact(payload):
            return _chan_check(self._send(PyBytes_AS_STRING(payload),
                                          PyBytes_GET_SIZE(payload), tag, t))
        _get_in_buffer(payload, &view)
        try:
            self._ready()   # the export may have run Python code (a close)
            rc = self._send(<const char *>view.buf, view.len, tag, t)
        finally:
            PyBuffer_Release(&view)
        return _chan_check(rc)

    cdef inline int _send(self, const char *p, Py_ssize_t n, _u32 tag, _i64 t) except -1:
        # Spin up to SPIN_WITH_GIL_NS with the GIL (the common case costs no
        # wait at all), then go on without it.
        cdef _i64 first = SPIN_WITH_GIL_NS if (t < 0 or t > SPIN_WITH_GIL_NS) else t
        cdef int rc = gdrpy_chan_send(self._c, p, <size_t>n, tag, first)
        if rc == GDRPY_ETIMEDOUT and (t < 0 or t > first):
            self._enter_nogil()
            with nogil:
                rc = gdrpy_chan_send(self._c, p, <size_t>n, tag, t - first if t > 0 else -1)
            self._inflight -= 1
        return rc

    def send_many(self, payloads, tags=None, timeout=1.0):
        """Publish several messages with one store fence: ``payloads`` is a
        2-D C-contiguous buffer (each row one message) or a sequence of
        buffers; ``tags`` None, an int for all, or a sequence.  All or nothing
        (at most ``nslots`` messages).  Returns the count."""
        cdef _i64 t = _timeout_ns(timeout)
        self._ready()
        cdef Py_buffer whole
        cdef Py_buffer *views = NULL
        cdef gdrpy_chan_msg_t *msgs = NULL
        cdef gdrpy_chan_msg_t stack_msgs[STACK_MSGS]
        cdef Py_buffer stack_views[STACK_MSGS]
        cdef Py_ssize_t n = 0, i, row = 0, got = 0
        cdef bint have_whole = False
        cdef int rc = 0
        cdef _u32 one_tag = 0
        cdef bint per_tag = False
        if tags is not None and not isinstance(tags, int):
            per_tag = True
        elif tags is not None:
            one_tag = <_u32>tags
        try:
            if not isinstance(payloads, (list, tuple)):
                PyObject_GetBuffer(payloads, &whole, PyBUF_ANY_CONTIGUOUS | PyBUF_ND)
                have_whole = True
                if whole.ndim != 2:
                    raise InvalidArgumentError(
                        f"send_many takes a 2-D buffer (one row per message) or a list of "
                        f"buffers, not a {whole.ndim}-D buffer", _errno.EINVAL)
                n = whole.shape[0]
                row = whole.shape[1] * whole.itemsize
            else:
                n = len(payloads)
            if per_tag and len(tags) != n:
                raise InvalidArgumentError(f"{len(tags)} tags for {n} messages", _errno.EINVAL)
            if n == 0:
                return 0
            if n <= STACK_MSGS:
                msgs = stack_msgs
                if not have_whole:
                    views = stack_views
            else:
                msgs = <gdrpy_chan_msg_t *>malloc(n * sizeof(gdrpy_chan_msg_t))
                if msgs == NULL:
                    raise MemoryError()
                if not have_whole:
                    views = <Py_buffer *>malloc(n * sizeof(Py_buffer))
                    if views == NULL:
                        raise MemoryError()
            for i in range(n):
                if have_whole:
                    msgs[i].buf = <char *>whole.buf + i * row
                    msgs[i].len = <_u32>row
                else:
                    _get_in_buffer(payloads[i], &views[i])
                    got += 1
                    msgs[i].buf = views[i].buf
                    if views[i].len > 0xFFFFFFFF:
                        raise InvalidArgumentError("message too large", _errno.EINVAL)
                    msgs[i].len = <_u32>views[i].len
                msgs[i].tag = <_u32>tags[i] if per_tag else one_tag
            self._ready()   # the exports above may have run Python code
            rc = gdrpy_chan_send_batch(self._c, msgs, <size_t>n, 0)
            if rc == _errno.EAGAIN and t != 0:
                self._enter_nogil()
                with nogil:
                    rc = gdrpy_chan_send_batch(self._c, msgs, <size_t>n, t)
                self._inflight -= 1
            _chan_check(rc)
            return n
        finally:
            if views != NULL:
                for i in range(got):
                    PyBuffer_Release(&views[i])
                if views != stack_views:
                    free(views)
            if msgs != NULL and msgs != stack_msgs:
                free(msgs)
            if have_whole:
                PyBuffer_Release(&whole)

    cdef int _recv_wait(self, void *buf, size_t cap, _i64 t) except -1:
        cdef _u32 ln = 0, tg = 0
        cdef _i64 first = SPIN_WITH_GIL_NS if (t < 0 or t > SPIN_WITH_GIL_NS) else t
        self._ready()   # callers may have run Python code since their check
        cdef int rc = gdrpy_chan_recv(self._c, buf, cap, &ln, &tg, first)
        if rc == GDRPY_ETIMEDOUT and (t < 0 or t > first):
            self._enter_nogil()
            with nogil:
                rc = gdrpy_chan_recv(self._c, buf, cap, &ln, &tg, t - first if t > 0 else -1)
            self._inflight -= 1
        if rc == 0:
            self.last_len = ln
            self.last_tag = tg
        return rc

    def recv(self, timeout=1.0):
        """The next completion's payload (bytes; ``last_tag`` gets its tag)."""
        cdef _i64 t = _timeout_ns(timeout)
        self._ready()
        cdef char tmp[256]
        cdef int rc
        cdef size_t cap = self.comp_size
        if cap <= 256:
            rc = self._recv_wait(tmp, cap, t)
            _chan_check(rc)
            return PyBytes_FromStringAndSize(tmp, min(self.last_len, cap))
        out = bytearray(cap)
        cdef char *b = out
        rc = self._recv_wait(b, cap, t)
        _chan_check(rc)
        return bytes(out[:min(self.last_len, cap)])

    def recv_into(self, out, timeout=1.0):
        """Copy the next completion's payload into ``out``; returns its length
        (``last_tag``: its tag)."""
        cdef _i64 t = _timeout_ns(timeout)
        self._ready()
        cdef Py_buffer view
        cdef _i64 first
        cdef _u32 ln = 0, tg = 0
        cdef int rc
        if PyByteArray_CheckExact(out):
            # the common case without a buffer export: the GIL is held
            # throughout (nobody can resize it); a longer wait goes on below
            first = SPIN_WITH_GIL_NS if (t < 0 or t > SPIN_WITH_GIL_NS) else t
            rc = gdrpy_chan_recv(self._c, PyByteArray_AS_STRING(out),
                                 <size_t>PyByteArray_GET_SIZE(out), &ln, &tg, first)
            if rc == 0:
                self.last_len = ln
                self.last_tag = tg
                return ln
            if not (rc == GDRPY_ETIMEDOUT and (t < 0 or t > first)):
                _chan_check(rc)
            t = t - first if t > 0 else t
        _get_out_buffer(out, &view, 0)
        try:
            _chan_check(self._recv_wait(view.buf, <size_t>view.len, t))
        finally:
            PyBuffer_Release(&view)
        return self.last_len

    def poll(self):
        """The next completion's payload if one is there, else None (no wait)."""
        self._ready()
        cdef char tmp[256]
        cdef _u32 ln = 0, tg = 0
        cdef size_t cap = self.comp_size if self.comp_size <= 256 else 256
        cdef int rc = gdrpy_chan_recv(self._c, tmp, cap, &ln, &tg, 0)
        if rc == _errno.EAGAIN:
            return None
        _chan_check(rc)
        self.last_len = ln
        self.last_tag = tg
        return PyBytes_FromStringAndSize(tmp, min(ln, cap))

    def recv_many(self, min_count=1, max_count=None, out=None, timeout=1.0, tags=None):
        """Receive between ``min_count`` and ``max_count`` (default: min_count)
        completions; payload k goes to ``out[k*comp_size:]`` (``out``: a
        writable buffer of max_count*comp_size bytes, or None to skip
        payloads), tag k to ``tags[k]`` (``tags``: a writable, 4-byte aligned
        buffer of max_count uint32 - ``numpy.empty(n, numpy.uint32)`` - or
        None).  Returns the count."""
        cdef Py_ssize_t mn = _index(min_count, "min_count")
        cdef Py_ssize_t mx = mn if max_count is None else _index(max_count, "max_count")
        cdef _i64 t = _timeout_ns(timeout)
        self._ready()
        cdef Py_buffer view, tview
        cdef void *buf = NULL
        cdef _u32 *tg = NULL
        cdef size_t got = 0
        cdef int rc
        cdef bint have = False, have_tags = False
        if mx < mn or mn < 1:
            raise InvalidArgumentError(f"need 1 <= min_count <= max_count, got {mn}, {mx}",
                                       _errno.EINVAL)
        # C takes at most comp_nslots completions a call: the buffers need
        # no more (and the sizes below cannot overflow)
        cdef Py_ssize_t cap = mx if mx <= <Py_ssize_t>self.comp_nslots else self.comp_nslots
        try:
            if out is not None:
                _get_out_buffer(out, &view, cap * <Py_ssize_t>self.comp_size)
                have = True
                buf = view.buf
            if tags is not None:
                _get_out_buffer(tags, &tview, cap * <Py_ssize_t>sizeof(_u32))
                have_tags = True
                if (<size_t>tview.buf) & (sizeof(_u32) - 1):
                    raise InvalidArgumentError("tags must be 4-byte aligned (a uint32 array)",
                                               _errno.EINVAL)
                tg = <_u32 *>tview.buf
            self._ready()   # the exports above may have run Python code
            rc = gdrpy_chan_recv_many(self._c, buf, self.comp_size, NULL, tg, <size_t>mn,
                                      <size_t>mx, 0 if t == 0 else min(t, SPIN_WITH_GIL_NS)
                                      if t > 0 else SPIN_WITH_GIL_NS, &got)
            if rc == GDRPY_ETIMEDOUT and (t < 0 or t > SPIN_WITH_GIL_NS):
                self._enter_nogil()
                with nogil:
                    rc = gdrpy_chan_recv_many(self._c, buf, self.comp_size, NULL, tg,
                                              <size_t>mn, <size_t>mx, t, &got)
                self._inflight -= 1
            _chan_check(rc)
        finally:
            if have:
                PyBuffer_Release(&view)
            if have_tags:
                PyBuffer_Release(&tview)
        return got

    def host_block(self):
        """A writable buffer over the channel's page-locked host block
        (consumed count, status, completion ring, near channels' slot table:
        gdrpy_channel.h's layout), for CPU code standing in for the kernel
        (sim) and for diagnostics.  While a view of it (memoryview, numpy
        array) lives, close() raises BusyError; after close() it exports
        nothing (ClosedError)."""
        self._ready()
        cdef gdrpy_chan_desc_t d
        gdrpy_chan_get_desc(self._c, &d)
        return (<_HostView>_ChannelHostView.__new__(_ChannelHostView))._set(
            self, <char *>gdrpy_chan_host_block(self._c),
            128 + <Py_ssize_t>d.comp_nslots * d.comp_stride
            + (4 * <Py_ssize_t>d.nslots if d.place_nslots else 0))

    @property
    def kernel_sm(self):
        """The SM the kernel attached from (gdrpy_chan_attach writes it; 0
        before a kernel attached, and for CPU stand-ins)."""
        self._ready()
        cdef const char *h = <const char *>gdrpy_chan_host_block(self._c)
        return (<const volatile _u32 *>(h + 16))[0]

    @property
    def consumed(self):
        """Messages the consumer has reported consumed (one load)."""
        self._ready()
        return gp_load_u64(gdrpy_chan_host_block(self._c))

    def wait_attached(self, timeout=5.0):
        """Wait until a kernel has attached (call after launching it, before
        sending).  ChannelTimeoutError otherwise.  Near channels: also takes
        the kernel's slot table (DriverError [EIO] if it is not valid)."""
        cdef _i64 t = _timeout_ns(timeout)
        cdef int rc
        self._enter_nogil()
        with nogil:
            rc = gdrpy_chan_wait_attached(self._c, t)
        self._inflight -= 1
        _chan_check(rc)

    def stats(self):
        """dict: sent, consumed, received, full_waits, status, shutdown,
        final_consumed, dropped."""
        self._ready()
        cdef gdrpy_chan_stats_t s
        _check(gdrpy_chan_get_stats(self._c, &s))
        return _stats_dict(&s)

    def shutdown(self, drain=True, timeout=5.0):
        """Ask the kernel to stop (drain: after consuming every message sent;
        else at once, the rest counted as ``dropped``) and wait for it.
        Returns the stats dict.  ChannelTimeoutError if the kernel does not
        report stopped in time."""
        cdef _i64 t = _timeout_ns(timeout)
        cdef bint dr = drain    # (a user __bool__ is Python code: before the check)
        self._enter_nogil()
        try:
            return self._shutdown(dr, t)
        finally:
            self._inflight -= 1

    cdef dict _shutdown(self, bint drain, _i64 t):
        cdef gdrpy_chan_stats_t s
        cdef unsigned mode = GDRPY_CHAN_DRAIN if drain else GDRPY_CHAN_ABORT
        cdef int rc
        with nogil:
            rc = gdrpy_chan_shutdown(self._c, mode, t, &s)
        _chan_check(rc)
        self._stopped = True
        return _stats_dict(&s)

    def close(self, timeout=5.0):
        """Shut down (drain) if not done yet, free the channel, unmap and
        unpin its buffer (and free it if the channel allocated it).
        Idempotent.  If the kernel does not report stopped within
        ``timeout`` the channel is freed anyway but its memory is kept (the
        GPU may still use it; a ResourceWarning says so) and the shutdown
        error is raised."""
        if self._c == NULL:
            return
        if self._fork_gen != gdrpy_fork_generation:
            self._c = NULL
            return
        # the conversion may run Python code (a user type's methods) that
        # closes the channel or takes a host_block() view: it comes before
        # the checks, and nothing but C runs between them and _closing
        cdef _i64 t = _timeout_ns(timeout)
        if self._c == NULL:
            return
        if self._closing:
            raise BusyError("the channel is being closed by another thread", _errno.EBUSY)
        if self._host_exports > 0:
            raise BusyError(f"the channel's host block has {self._host_exports} live buffer "
                            f"export(s) (views of host_block()); release them before closing",
                            _errno.EBUSY)
        err = None
        self._closing = True     # no new call from here on (see _ready)
        try:
            if not self._stopped:
                try:
                    self._shutdown(True, t)
                except Exception as e:  # still free what we can
                    err = e
            # waits in other threads end once the kernel reports stopped
            self._wait_calls()
            self._destroy()
        finally:
            self._closing = False
        if err is not None:
            raise err

    cdef _destroy(self):
        cdef gdrpy_chan_stats_t s
        cdef gdrpy_chan_t *c = self._c
        gdrpy_chan_get_stats(c, &s)
        self._c = NULL
        gdrpy_chan_destroy(c)
        if s.status == 1:       # attached and still running
            import warnings
            warnings.warn("gdrpy.Channel closed while its kernel still runs: its GPU and "
                          "host memory are kept for the life of the process",
                          ResourceWarning, stacklevel=3)
            _orphaned.append((self.buffer, self.pin, self.mapping, self._hold))
            self._hold = None
            self.mapping = None
            self.pin = None
            self.buffer = None
        else:
            self._release_memory()

    def __enter__(self):
        self._ready()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        if self._c == NULL:
            return "<gdrpy.Channel closed>"
        return (f"<gdrpy.Channel {self.nslots} x {self.slot_size} B -> "
                f"{self.comp_nslots} x {self.comp_size} B backend={self.context.backend!r}>")

    # ---- test support (sim) ---------------------------------------------
    @property
    def _calls_inside(self):
        """Calls of this channel running without the GIL now (waits)."""
        return self._inflight

    def _sim_consumer(self, check=True, complete=True, start_delay=0.0, idle_timeout=10.0,
                      echo=False):
        """Start a CPU thread standing in for the GPU kernel (any backend's
        host-visible ring; meant for sim): check payloads, answer {seq,
        checksum, len} (complete; on a comp_size 0 channel the checksum as
        the tag) or echo each message (echo).  Returns a handle for
        ``_sim_join``."""
        cdef unsigned fl = (GDRPY_CHAN_SIM_CHECK if check else 0) | \
            (GDRPY_CHAN_SIM_COMPLETE if complete else 0) | (GDRPY_CHAN_SIM_ECHO if echo else 0)
        cdef gdrpy_chan_sim_consumer_t *sc = NULL
        cdef _i64 d = _timeout_ns(start_delay)
        cdef _i64 it = _timeout_ns(idle_timeout)
        self._ready()
        _check(gdrpy_chan_sim_consumer_start(self._c, fl, d, it, &sc))
        h = <uintptr_t>sc
        self._sims.add(h)
        return h

    def _sim_join(self, handle):
        """Wait for the sim consumer to stop: (consumed, errors, first_bad).
        Each handle joins once (InvalidArgumentError after)."""
        h = _u64(handle, "handle")
        if h not in self._sims:
            raise InvalidArgumentError(f"{handle!r} is not a sim consumer of this channel "
                                       f"that is still to be joined", _errno.EINVAL)
        self._sims.discard(h)   # under the GIL: a second join, here or elsewhere, refuses
        cdef gdrpy_chan_sim_consumer_t *sc = <gdrpy_chan_sim_consumer_t *><uintptr_t>h
        cdef uint64_t a = 0, b = 0, c = 0
        cdef int rc
        with nogil:
            rc = gdrpy_chan_sim_consumer_join(sc, &a, &b, &c)
        _check(rc)
        return a, b, c


cdef class _ChannelHostView(_HostView):
    """Channel.host_block()'s buffer: its exports are counted on the channel,
    whose close() refuses while any lives (it would free the memory under
    them), and it exports nothing once the channel is closed or closing."""

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        cdef Channel ch = <Channel>self.owner
        ch._ready()
        buffer.obj = self
        _fill_u8_buffer(buffer, self.ptr, self.size, self.shape, self.strides, flags)
        ch._host_exports += 1

    def __releasebuffer__(self, Py_buffer *buffer):
        (<Channel>self.owner)._host_exports -= 1


cdef dict _stats_dict(gdrpy_chan_stats_t *s):
    return {"sent": s.sent, "consumed": s.consumed, "received": s.received,
            "full_waits": s.full_waits, "status": _ST_NAMES.get(s.status, str(s.status)),
            "shutdown": ("run", "drain", "abort")[s.shutdown] if s.shutdown < 3 else
            str(s.shutdown), "final_consumed": s.final_consumed, "dropped": s.dropped}
