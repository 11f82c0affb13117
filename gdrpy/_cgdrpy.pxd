# C declarations of libgdrpy (native/include/gdrpy.h) for the binding.
from libc.stdint cimport uint64_t, uint32_t, int32_t

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
