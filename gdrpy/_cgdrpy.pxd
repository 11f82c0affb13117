# Every C declaration the binding (gdrpy/_core.pyx and its units) uses, in one
# place: libgdrpy's public headers (gdrpy.h, gdrpy_host.h, gdrpy_channel.h), the
# binding's small inline C helpers, the CPython API entries declared for the hot
# paths, clock_gettime, and DLPack's ABI structs.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from cpython.ref cimport PyObject

# ---- gdrpy.h: contexts, pins, mappings, copies --------------------------------
cdef extern from "gdrpy.h" nogil:
    ctypedef uint64_t gdrpy_ctx_t
    ctypedef uint64_t gdrpy_pin_t

    ctypedef struct gdrpy_pin_info_t:
        uint64_t addr
        uint64_t size
        uint64_t va
        uint64_t mapped_size
        uint32_t page_size
        uint32_t mapping_type
        int32_t mapped
        int32_t invalidated
        void *map_ptr
        void *user_ptr
        uint64_t backed_size

    ctypedef struct gdrpy_ctx_info_t:
        int32_t device
        int32_t backend
        char backend_name[16]
        char gpu_name[96]
        char pci_bus_id[32]
        char driver_version[32]

    enum:
        GDRPY_BACKEND_AUTO
        GDRPY_BACKEND_SIM
        GDRPY_BACKEND_NVRM
        GDRPY_BACKEND_GDRDRV
        GDRPY_BACKEND_DMABUF
        GDRPY_BACKEND_COUNT_
        GDRPY_GPU_PAGE_SIZE
        GDRPY_OPEN_NO_ENV

    void gdrpy_version(int *major, int *minor, int *patch)
    const char *gdrpy_last_error()
    const char *gdrpy_strerror(int code)
    const char *gdrpy_backend_name(int backend)
    int gdrpy_backend_from_name(const char *name)
    int gdrpy_backend_probe(int backend, int device, char *why, size_t whylen)
    int gdrpy_nvrm_selftest(int device, char *buf, size_t len)

    int gdrpy_open(int device, int backend, gdrpy_ctx_t *out)
    int gdrpy_close(gdrpy_ctx_t ctx)
    int gdrpy_ctx_get_info(gdrpy_ctx_t ctx, gdrpy_ctx_info_t *out)
    int gdrpy_ctx_live_objects(gdrpy_ctx_t ctx, uint64_t *out)

    int gdrpy_pin(gdrpy_ctx_t ctx, uint64_t addr, size_t size, unsigned flags, gdrpy_pin_t *out)
    int gdrpy_unpin(gdrpy_ctx_t ctx, gdrpy_pin_t pin)
    int gdrpy_pin_get_info(gdrpy_ctx_t ctx, gdrpy_pin_t pin, gdrpy_pin_info_t *out)
    int gdrpy_map(gdrpy_ctx_t ctx, gdrpy_pin_t pin, void **map_ptr, void **user_ptr)
    int gdrpy_unmap(gdrpy_ctx_t ctx, gdrpy_pin_t pin)

    int gdrpy_write(gdrpy_ctx_t ctx, gdrpy_pin_t pin, size_t offset, const void *src, size_t n)
    int gdrpy_read(gdrpy_ctx_t ctx, gdrpy_pin_t pin, size_t offset, void *dst, size_t n)
    int gdrpy_ce_write(gdrpy_ctx_t ctx, gdrpy_pin_t pin, size_t offset, const void *src,
                       size_t n, void *stream)
    int gdrpy_ce_read(gdrpy_ctx_t ctx, gdrpy_pin_t pin, size_t offset, void *dst, size_t n,
                      void *stream)
    int gdrpy_stream_synchronize(gdrpy_ctx_t ctx, void *stream)
    int gdrpy_memcpy_htod(gdrpy_ctx_t ctx, uint64_t dptr, const void *src, size_t n)
    int gdrpy_memcpy_dtoh(gdrpy_ctx_t ctx, void *dst, uint64_t dptr, size_t n)

    void gdrpy_copy_to_mapping(void *map_dst, const void *src, size_t n)
    void gdrpy_copy_from_mapping(void *dst, const void *map_src, size_t n)
    const char *gdrpy_copy_isa()
    int gdrpy_set_copy_isa(const char *name)
    const char *gdrpy_copy_isa_available()
    const char *gdrpy_copy_isa_notes()

    int gdrpy_sim_alloc(size_t size, uint64_t *dptr)
    int gdrpy_sim_free(uint64_t dptr)

    unsigned gdrpy_fork_generation

# ---- gdrpy_host.h: page-locked host memory, the staging ring ------------------
cdef extern from "gdrpy_host.h" nogil:
    enum:
        GDRPY_HOST_PAGEABLE
        GDRPY_HOST_PINNED
        GDRPY_HOST_REGISTERED
        GDRPY_HOST_LOCKED
    int gdrpy_host_alloc(gdrpy_ctx_t ctx, size_t size, void **out)
    int gdrpy_host_free(void *p)
    int gdrpy_host_register(gdrpy_ctx_t ctx, void *p, size_t size)
    int gdrpy_host_unregister(void *p)
    int gdrpy_host_kind(gdrpy_ctx_t ctx, const void *p, size_t size, int *kind)
    int gdrpy_host_kind_known(const void *p, size_t size)
    uint64_t gdrpy_host_live()
    int gdrpy_staging_set(gdrpy_ctx_t ctx, size_t chunk, unsigned depth, unsigned threads)
    int gdrpy_staging_get(gdrpy_ctx_t ctx, size_t *chunk, unsigned *depth, unsigned *threads)
    int gdrpy_staging_set_kinds(gdrpy_ctx_t ctx, int write_kind, int read_kind)
    int gdrpy_staging_get_kinds(gdrpy_ctx_t ctx, int *write_kind, int *read_kind,
                                int *write_used, int *read_used)
    int gdrpy_ce_write_staged(gdrpy_ctx_t ctx, gdrpy_pin_t pin, size_t offset,
                              const void *src, size_t n, void *stream)
    int gdrpy_ce_read_staged(gdrpy_ctx_t ctx, gdrpy_pin_t pin, size_t offset,
                             void *dst, size_t n, void *stream)
    int gdrpy_ce_write_locked(gdrpy_ctx_t ctx, gdrpy_pin_t pin, size_t offset,
                              const void *src, size_t n, void *stream)
    int gdrpy_ce_read_locked(gdrpy_ctx_t ctx, gdrpy_pin_t pin, size_t offset,
                             void *dst, size_t n, void *stream)

# ---- gdrpy_channel.h: the message channel, vectored writes --------------------
cdef extern from "gdrpy_channel.h" nogil:
    ctypedef struct gdrpy_chan_t:
        pass
    ctypedef struct gdrpy_chan_config_t:
        uint32_t nslots
        uint32_t slot_size
        uint32_t comp_nslots
        uint32_t comp_size
        uint32_t flags
        uint32_t reserved
    ctypedef struct gdrpy_chan_desc_t:
        uint64_t dev_ctrl
        uint64_t ring
        uint64_t host_ctrl
        uint64_t comp
        uint32_t nslots, slot_stride, slot_size
        uint32_t comp_nslots, comp_stride, comp_size
        uint32_t flags
        uint32_t place_nslots
    ctypedef struct gdrpy_chan_msg_t:
        const void *buf
        uint32_t len
        uint32_t tag
    ctypedef struct gdrpy_chan_stats_t:
        uint64_t sent
        uint64_t consumed
        uint64_t received
        uint64_t full_waits
        uint32_t status
        uint32_t shutdown
        uint64_t final_consumed
        uint64_t dropped
    ctypedef struct gdrpy_iov_t:
        size_t offset
        const void *buf
        size_t len
    enum:
        GDRPY_ETIMEDOUT
        GDRPY_EPIPE
        GDRPY_CHAN_DRAIN
        GDRPY_CHAN_ABORT
        GDRPY_CHAN_PLAIN
        GDRPY_CHAN_NEAR
    int gdrpy_chan_device_bytes(const gdrpy_chan_config_t *cfg, size_t *out)
    int gdrpy_chan_create(gdrpy_ctx_t ctx, gdrpy_pin_t pin, const gdrpy_chan_config_t *cfg,
                          gdrpy_chan_t **out)
    int gdrpy_chan_destroy(gdrpy_chan_t *chan)
    int gdrpy_chan_get_desc(const gdrpy_chan_t *chan, gdrpy_chan_desc_t *out)
    void *gdrpy_chan_device_block(const gdrpy_chan_t *chan)
    void *gdrpy_chan_host_block(const gdrpy_chan_t *chan)
    int gdrpy_chan_send(gdrpy_chan_t *chan, const void *buf, size_t len, uint32_t tag,
                        int64_t timeout_ns)
    int gdrpy_chan_send_batch(gdrpy_chan_t *chan, const gdrpy_chan_msg_t *msgs, size_t n,
                              int64_t timeout_ns)
    int gdrpy_chan_recv(gdrpy_chan_t *chan, void *buf, size_t cap, uint32_t *len_out,
                        uint32_t *tag_out, int64_t timeout_ns)
    int gdrpy_chan_recv_many(gdrpy_chan_t *chan, void *buf, size_t stride, uint32_t *lens,
                             uint32_t *tags, size_t mn, size_t mx, int64_t timeout_ns,
                             size_t *got)
    int gdrpy_chan_shutdown(gdrpy_chan_t *chan, unsigned mode, int64_t timeout_ns,
                            gdrpy_chan_stats_t *st)
    int gdrpy_chan_get_stats(gdrpy_chan_t *chan, gdrpy_chan_stats_t *out)
    int gdrpy_chan_wait_attached(gdrpy_chan_t *chan, int64_t timeout_ns)
    int gdrpy_chan_slot_offset(const gdrpy_chan_t *chan, uint64_t i, size_t *out)
    int gdrpy_writev(gdrpy_ctx_t ctx, gdrpy_pin_t pin, const gdrpy_iov_t *iov, size_t n)

    ctypedef struct gdrpy_chan_sim_consumer_t:
        pass
    enum:
        GDRPY_CHAN_SIM_CHECK
        GDRPY_CHAN_SIM_COMPLETE
        GDRPY_CHAN_SIM_ECHO
    int gdrpy_chan_sim_consumer_start(gdrpy_chan_t *chan, unsigned flags,
                                      int64_t start_delay_ns, int64_t idle_timeout_ns,
                                      gdrpy_chan_sim_consumer_t **out)
    int gdrpy_chan_sim_consumer_join(gdrpy_chan_sim_consumer_t *c, uint64_t *consumed,
                                     uint64_t *errors, uint64_t *first_bad)

# ---- the binding's inline C helpers -------------------------------------------
cdef extern from *:
    """
    /* One aligned 8-byte store, then a store fence: a flag is never seen torn. */
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

# ---- CPython API without Cython's exception checks ----------------------------
# The same functions as cpython.*'s, for the hot paths, which test the result
# themselves and leave every error to the checked slow path; and the capsule
# calls of the DLPack export, on borrowed pointers.
cdef extern from "Python.h":
    Py_ssize_t gp_as_ssize_t "PyLong_AsSsize_t"(object v)
    int gp_getbuffer "PyObject_GetBuffer"(object obj, Py_buffer *view, int flags)
    void gp_err_clear "PyErr_Clear"()
    int gp_capsule_is_valid "PyCapsule_IsValid"(PyObject *o, const char *name)
    void *gp_capsule_get_pointer "PyCapsule_GetPointer"(PyObject *o, const char *name)
    object gp_capsule_new "PyCapsule_New"(void *p, const char *name,
                                          void (*destructor)(PyObject *) noexcept)

# ---- the monotonic clock (timed transfers) ------------------------------------
cdef extern from "time.h" nogil:
    ctypedef long time_t
    cdef struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk, timespec *ts)
    int CLOCK_MONOTONIC

# ---- DLPack's ABI (legacy unversioned DLManagedTensor) ------------------------
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
