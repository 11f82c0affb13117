# Unit of gdrpy/_core.pyx: views of memory that is not a mapping - DLPack export
# (legacy unversioned DLManagedTensor in a "dltensor" capsule; the structs are in
# _cgdrpy.pxd), and writable buffers over host memory (sim buffers' numpy views,
# the channel's host block).  The capsule keeps `owner` alive until the consumer
# calls the deleter, or until the capsule dies unconsumed.

from libc.stdint cimport int64_t
from libc.stdlib cimport malloc, free
from cpython.ref cimport Py_INCREF, Py_DECREF


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
