# Unit of gdrpy/_core.pyx: the library as a whole - its version, the backends
# (names, probes, the nvrm self-test), the copy kernels, the sim allocator and
# the fork count.

from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING


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
