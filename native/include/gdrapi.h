/*
 * gdrapi.h - gdrpy's libgdrapi.so.2: the C API of GDRCopy 2.6, implemented on
 * top of libgdrpy (no gdrdrv kernel module needed).
 *
 * Written for gdrpy from the published ABI facts (symbol names, signatures,
 * struct layouts, constant values); binaries built against GDRCopy's own
 * header load this library unchanged, and sources written for GDRCopy 2.6
 * compile against this header.
 *
 * Contract (differences from GDRCopy are listed in docs/libgdrapi.md):
 *  - Functions return 0 or a positive errno value (EINVAL, EAGAIN, EACCES,
 *    ENOMEM, ...); gdr_open returns NULL on failure.
 *  - A gdr_t belongs to the process that opened it: after fork the child
 *    gets EACCES from every call on the parent's gdr_t and handles; it opens
 *    its own.  Mappings are not inherited by the child.
 *  - Pins cover whole 64 KiB GPU pages: info.va is the pinned address
 *    rounded down to GPU_PAGE_SIZE.  gdr_map fails with EINVAL unless the
 *    pinned address is GPU_PAGE_SIZE aligned; the pointer it returns is the
 *    CPU address of info.va.
 *  - One mapping per handle (EAGAIN on a second gdr_map).  gdr_unpin_buffer
 *    of a mapped handle unmaps it first; gdr_close unmaps and unpins
 *    everything still open.
 *  - Thread safety: every call is thread-safe (GDRCopy's library is not:
 *    callers that lock around pin/map/unmap/unpin keep working).
 *    gdr_copy_to_mapping / gdr_copy_from_mapping take no lock; the caller must
 *    not unmap a handle while copying through it.
 */
#ifndef GDRPY_GDRAPI_H
#define GDRPY_GDRAPI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GDRAPI_EXPORT __attribute__((visibility("default")))
#else
#define GDRAPI_EXPORT
#endif

/* ---- versions --------------------------------------------------------- */
#define GDR_API_MAJOR_VERSION 2
#define GDR_API_MINOR_VERSION 6
#define GDR_API_VERSION ((GDR_API_MAJOR_VERSION << 16) | GDR_API_MINOR_VERSION)

#define MINIMUM_GDRDRV_MAJOR_VERSION 2
#define MINIMUM_GDRDRV_MINOR_VERSION 0
#define MINIMUM_GDRDRV_VERSION \
    ((MINIMUM_GDRDRV_MAJOR_VERSION << 16) | MINIMUM_GDRDRV_MINOR_VERSION)

/* ---- GPU pages -------------------------------------------------------- */
#define GPU_PAGE_SHIFT 16
#define GPU_PAGE_SIZE (1UL << GPU_PAGE_SHIFT)
#define GPU_PAGE_OFFSET (GPU_PAGE_SIZE - 1)
#define GPU_PAGE_MASK (~GPU_PAGE_OFFSET)

/* ---- types ------------------------------------------------------------ */
/* Library instance; opaque. */
typedef struct gdr *gdr_t;

/* Handle of a pinned range, passed by value (8 bytes).  h == 0 is never a
 * valid handle. */
typedef struct gdr_mh_s {
    unsigned long h;
} gdr_mh_t;

typedef enum gdr_mapping_type {
    GDR_MAPPING_TYPE_NONE = 0,
    GDR_MAPPING_TYPE_WC = 1,
    GDR_MAPPING_TYPE_CACHING = 2,
    GDR_MAPPING_TYPE_DEVICE = 3
} gdr_mapping_type_t;

typedef enum gdr_pin_flags {
    GDR_PIN_FLAG_DEFAULT = 0,
    GDR_PIN_FLAG_FORCE_PCIE = 1
} gdr_pin_flags_t;

typedef enum gdr_map_flags {
    GDR_MAP_FLAG_DEFAULT = 0,
    GDR_MAP_FLAG_REQ_WC = 1,
    GDR_MAP_FLAG_REQ_CACHE = 2,
    GDR_MAP_FLAG_REQ_DEVICE = 3
} gdr_map_flags_t;

typedef enum gdr_attr {
    GDR_ATTR_USE_PERSISTENT_MAPPING = 1,
    GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE = 2,
    GDR_ATTR_USING_DMA_BUF_MMAP = 3
} gdr_attr_t;

/* Layout (x86-64, 48 bytes): va @0, mapped_size @8, page_size @16,
 * tm_cycles @24, cycles_per_ms @32, mapped/wc_mapping bits 0/1 of the
 * 32-bit word @36, mapping_type @40. */
typedef struct gdr_info_v2 {
    uint64_t va;                     /* pinned address rounded down to GPU_PAGE_SIZE */
    uint64_t mapped_size;            /* bytes from va to the end of the last GPU page */
    uint32_t page_size;              /* GPU_PAGE_SIZE */
    uint64_t tm_cycles;              /* TSC when the buffer was pinned */
    uint32_t cycles_per_ms;          /* TSC ticks per millisecond */
    unsigned mapped : 1;             /* 1 while mapped */
    unsigned wc_mapping : 1;         /* 1 while mapped write-combined */
    gdr_mapping_type_t mapping_type; /* NONE while unmapped */
} gdr_info_v2_t;

/* The original (v1) layout, 40 bytes: v2 without mapping_type.  This is
 * what the exported symbol named "gdr_get_info" fills. */
typedef struct gdr_info_v1 {
    uint64_t va;
    uint64_t mapped_size;
    uint32_t page_size;
    uint64_t tm_cycles;
    uint32_t cycles_per_ms;
    unsigned mapped : 1;
    unsigned wc_mapping : 1;
} gdr_info_v1_t;

typedef gdr_info_v2_t gdr_info_t;

/* ---- instance --------------------------------------------------------- */
/* Backend from GDRPY_BACKEND (auto, nvrm, gdrdrv, dmabuf, sim; default
 * auto), default device from GDRPY_DEVICE (default 0).  NULL on failure. */
GDRAPI_EXPORT gdr_t gdr_open(void);
/* Unmaps and unpins whatever is still open, then frees g. */
GDRAPI_EXPORT int gdr_close(gdr_t g);

/* ---- pins ------------------------------------------------------------- */
/* p2p_token and va_space are deprecated: non-zero values give EINVAL. */
GDRAPI_EXPORT int gdr_pin_buffer(gdr_t g, unsigned long addr, size_t size,
                                 uint64_t p2p_token, uint32_t va_space,
                                 gdr_mh_t *handle);
/* flags: gdr_pin_flags_t. */
GDRAPI_EXPORT int gdr_pin_buffer_v2(gdr_t g, unsigned long addr, size_t size,
                                    uint32_t flags, gdr_mh_t *handle);
GDRAPI_EXPORT int gdr_unpin_buffer(gdr_t g, gdr_mh_t handle);
/* *flag = 1 if the memory was freed under the pin (never set with persistent
 * mappings, which keep the pages until unpin). */
GDRAPI_EXPORT int gdr_get_callback_flag(gdr_t g, gdr_mh_t handle, int *flag);

/* The symbol "gdr_get_info" takes the v1 layout (binary compatibility with
 * programs that resolve it by name, as NCCL does).  Source that calls
 * gdr_get_info(g, h, &info) gets gdr_get_info_v2 through the macro below,
 * as with GDRCopy 2.6's header; (gdr_get_info)(g, h, &v1) reaches the v1
 * symbol. */
GDRAPI_EXPORT int gdr_get_info(gdr_t g, gdr_mh_t handle, gdr_info_v1_t *info);
GDRAPI_EXPORT int gdr_get_info_v2(gdr_t g, gdr_mh_t handle, gdr_info_v2_t *info);
#define gdr_get_info(g, handle, info) gdr_get_info_v2((g), (handle), (info))

/* ---- mappings --------------------------------------------------------- */
/* Maps the pinned range into the CPU address space; *va is the CPU address
 * of info.va.  size: 1 .. info.mapped_size.  EAGAIN if already mapped,
 * EINVAL if the pinned address is not GPU_PAGE_SIZE aligned. */
GDRAPI_EXPORT int gdr_map(gdr_t g, gdr_mh_t handle, void **va, size_t size);
/* flags: gdr_map_flags_t; EINVAL if the backend cannot give that type. */
GDRAPI_EXPORT int gdr_map_v2(gdr_t g, gdr_mh_t handle, void **va, size_t size,
                             int flags);
/* va and size must be those of the mapping; EINVAL if not mapped. */
GDRAPI_EXPORT int gdr_unmap(gdr_t g, gdr_mh_t handle, void *va, size_t size);

/* ---- copies through a mapping (no lock: the latency-critical path) ---- */
/* [map_d_ptr, map_d_ptr + size) must lie inside the handle's mapping.
 * size 0 is a no-op; EINVAL if the handle is not mapped. */
GDRAPI_EXPORT int gdr_copy_to_mapping(gdr_mh_t handle, void *map_d_ptr,
                                      const void *h_ptr, size_t size);
GDRAPI_EXPORT int gdr_copy_from_mapping(gdr_mh_t handle, void *h_ptr,
                                        const void *map_d_ptr, size_t size);

/* ---- versions and attributes ------------------------------------------ */
GDRAPI_EXPORT void gdr_runtime_get_version(int *major, int *minor);
/* There is no driver: reports the API version it emulates (2.6). */
GDRAPI_EXPORT int gdr_driver_get_version(gdr_t g, int *major, int *minor);
GDRAPI_EXPORT int gdr_get_attribute(gdr_t g, gdr_attr_t attr, int *v);
/* "GDR_MAPPING_TYPE_NONE", ...; EINVAL for an unknown type. */
GDRAPI_EXPORT int gdr_get_mapping_type_string(gdr_mapping_type_t type,
                                              const char **type_str);

#ifdef __cplusplus
}
#endif
#endif /* GDRPY_GDRAPI_H */
