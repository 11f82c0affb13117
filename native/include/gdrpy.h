/*
 * gdrpy.h - public C API of libgdrpy.
 *
 * Contract:
 *  - Every function returns 0 (GDRPY_OK) or a positive errno-style code from
 *    gdrpy_status_t.  On failure, gdrpy_last_error() returns a message for the
 *    calling thread naming what was attempted and why it failed (NV status or
 *    CUresult names included when a driver call failed).
 *  - Contexts and pins are 64-bit handles (index + generation), never pointers:
 *    a stale or closed handle is reported as GDRPY_EBADF, never dereferenced.
 *  - Object order: context > pin > mapping.  A pin has at most one mapping.
 *    gdrpy_close() unmaps and unpins whatever is still open.
 *  - A context belongs to the process that opened it: every call from a
 *    forked child returns GDRPY_EACCES.  Mappings are not inherited by
 *    children (MADV_DONTFORK).
 *  - Thread safety: all calls are thread-safe.  The raw copy kernels
 *    (gdrpy_copy_to_mapping / gdrpy_copy_from_mapping) take no lock and check
 *    nothing: the caller guarantees that the range is mapped.
 */
#ifndef GDRPY_H
#define GDRPY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GDRPY_VERSION_MAJOR 0
#define GDRPY_VERSION_MINOR 1
#define GDRPY_VERSION_PATCH 0

#define GDRPY_GPU_PAGE_SHIFT 16
#define GDRPY_GPU_PAGE_SIZE (1UL << GDRPY_GPU_PAGE_SHIFT)

#if defined(__GNUC__)
#define GDRPY_API __attribute__((visibility("default")))
#else
#define GDRPY_API
#endif

/* Status codes: the Linux errno values, so that they pass through the
 * libgdrapi layer unchanged. */
typedef enum {
    GDRPY_OK = 0,
    GDRPY_ENOENT = 2,    /* no such object (e.g. device node missing) */
    GDRPY_EIO = 5,       /* a driver call failed (message names the status) */
    GDRPY_ENXIO = 6,     /* backend unavailable on this host */
    GDRPY_EBADF = 9,     /* closed, stale or unknown handle */
    GDRPY_EAGAIN = 11,   /* already mapped */
    GDRPY_ENOMEM = 12,   /* out of memory / handles */
    GDRPY_EACCES = 13,   /* object belongs to another process (fork) */
    GDRPY_EBUSY = 16,    /* object in use (pin still mapped, ...) */
    GDRPY_ENODEV = 19,   /* no such GPU */
    GDRPY_EINVAL = 22,   /* bad argument */
    GDRPY_ERANGE = 34,   /* offset/size outside the pinned range */
    GDRPY_ENOTSUP = 95,  /* memory kind / driver version not supported */
    GDRPY_ENOTSUPP = 524 /* the kernel's ENOTSUPP, as GDRCopy returns it: pin flag
                          * FORCE_PCIE on a GPU without a coherent CPU-GPU link */
} gdrpy_status_t;

typedef enum {
    GDRPY_BACKEND_AUTO = 0,
    GDRPY_BACKEND_SIM = 1,
    GDRPY_BACKEND_NVRM = 2,
    GDRPY_BACKEND_GDRDRV = 3,
    GDRPY_BACKEND_DMABUF = 4,
    GDRPY_BACKEND_COUNT_ = 5
} gdrpy_backend_t;

/* Same values as GDRCopy's gdr_mapping_type_t. */
typedef enum {
    GDRPY_MAPPING_NONE = 0,
    GDRPY_MAPPING_WC = 1,
    GDRPY_MAPPING_CACHING = 2,
    GDRPY_MAPPING_DEVICE = 3
} gdrpy_mapping_type_t;

/* Pin flags (same values as GDRCopy's gdr_pin_flags_t).  FORCE_PCIE asks for
 * a mapping through PCIe BAR1 even where a coherent CPU-GPU link (C2C) could
 * serve it; as with GDRCopy it is refused (GDRPY_ENOTSUPP) on a GPU without
 * such a link, and accepted where there is one. */
#define GDRPY_PIN_DEFAULT 0u
#define GDRPY_PIN_FORCE_PCIE 1u

typedef uint64_t gdrpy_ctx_t; /* 0 is never a valid handle */
typedef uint64_t gdrpy_pin_t; /* 0 is never a valid handle */

typedef struct gdrpy_pin_info {
    uint64_t addr;         /* device address given to gdrpy_pin */
    uint64_t size;         /* size given to gdrpy_pin */
    uint64_t va;           /* start of the pinned (mappable) range, <= addr */
    uint64_t mapped_size;  /* length of the pinned range, covers addr+size */
    uint32_t page_size;    /* GPU page size (65536) */
    uint32_t mapping_type; /* gdrpy_mapping_type_t; NONE while unmapped */
    int32_t mapped;        /* 1 while mapped */
    int32_t invalidated;   /* 1 if the memory was freed under the pin */
    void *map_ptr;         /* CPU address of `va` while mapped, else NULL */
    void *user_ptr;        /* CPU address of `addr` while mapped, else NULL */
    /* Bytes from `va` backed by the allocation's memory: mapped_size, or less
     * where the pinned GPU pages run past the end of the memory object behind
     * a large cuMemAlloc allocation (its last 64 KiB page).  The rest of the
     * mapping is reserved with no access: a touch faults, and validated
     * copies refuse it (ERANGE). */
    uint64_t backed_size;
} gdrpy_pin_info_t;

typedef struct gdrpy_ctx_info {
    int32_t device;  /* CUDA device ordinal */
    int32_t backend; /* gdrpy_backend_t actually in use */
    char backend_name[16];
    char gpu_name[96];       /* "" for sim */
    char pci_bus_id[32];     /* "" for sim */
    char driver_version[32]; /* "" for sim */
} gdrpy_ctx_info_t;

/* ---- library ---------------------------------------------------------- */
GDRPY_API void gdrpy_version(int *major, int *minor, int *patch);
GDRPY_API const char *gdrpy_last_error(void);          /* thread-local, never NULL */
GDRPY_API const char *gdrpy_strerror(int code);        /* "EINVAL", ... */
GDRPY_API const char *gdrpy_backend_name(int backend); /* NULL if unknown */
/* Parses "auto", "sim", "nvrm", "gdrdrv", "dmabuf"; -1 if unknown. */
GDRPY_API int gdrpy_backend_from_name(const char *name);
/* 0 if `backend` could be opened on `device`; else a code and, in `why`, the
 * reason.  Does not keep anything open. */
GDRPY_API int gdrpy_backend_probe(int backend, int device, char *why, size_t whylen);
/* The nvrm backend's self-test on `device` (run once per process, at the
 * first open, or here if none happened yet) as JSON in buf: driver version,
 * ABI table (branch, tag), cost in ms, per route ok/disabled with the step
 * and reason (docs/nvrm.md).  0 if the backend is usable, else a code; the
 * report is written whenever the self-test ran. */
GDRPY_API int gdrpy_nvrm_selftest(int device, char *buf, size_t len);

/* ---- context ---------------------------------------------------------- */
/* backend AUTO tries nvrm, gdrdrv, dmabuf in that order, never sim; AUTO
 * honours $GDRPY_BACKEND unless GDRPY_OPEN_NO_ENV is or'ed into `backend`
 * (an explicit choice of the caller that the environment must not override).
 * A concrete backend is never overridden. */
#define GDRPY_OPEN_NO_ENV 0x100
/* Or'ed into `backend`: in a forked child, this context's mappings are left as
 * the kernel leaves them (not inherited: a pointer kept from before fork
 * faults), as GDRCopy's are; libgdrapi.so.2 opens its contexts so.  Without
 * it the child finds private zero-filled memory there (docs/misuse.md). */
#define GDRPY_OPEN_FORK_FAULTS 0x200
GDRPY_API int gdrpy_open(int device, int backend, gdrpy_ctx_t *out);
GDRPY_API int gdrpy_close(gdrpy_ctx_t ctx);
GDRPY_API int gdrpy_ctx_get_info(gdrpy_ctx_t ctx, gdrpy_ctx_info_t *out);
/* Driver-level objects the context holds now (RM handles, mappings, fds on
 * nvrm; memfd references and mappings on sim): for leak checks. */
GDRPY_API int gdrpy_ctx_live_objects(gdrpy_ctx_t ctx, uint64_t *out);

/* ---- pins and mappings ------------------------------------------------ */
GDRPY_API int gdrpy_pin(gdrpy_ctx_t ctx, uint64_t addr, size_t size,
                        unsigned flags, gdrpy_pin_t *out);
/* GDRPY_EBUSY while mapped: unmap first. */
GDRPY_API int gdrpy_unpin(gdrpy_ctx_t ctx, gdrpy_pin_t pin);
GDRPY_API int gdrpy_pin_get_info(gdrpy_ctx_t ctx, gdrpy_pin_t pin, gdrpy_pin_info_t *out);
/* Maps the pinned range; *map_ptr is the CPU address of info.va and
 * *user_ptr that of the pinned address.  GDRPY_EAGAIN if already mapped. */
GDRPY_API int gdrpy_map(gdrpy_ctx_t ctx, gdrpy_pin_t pin, void **map_ptr, void **user_ptr);
GDRPY_API int gdrpy_unmap(gdrpy_ctx_t ctx, gdrpy_pin_t pin);

/* ---- validated copies through the mapping ----------------------------- */
/* `offset` is relative to the pinned address; [offset, offset+n) must lie in
 * [0, size) of the pin, else GDRPY_ERANGE and nothing is touched. */
GDRPY_API int gdrpy_write(gdrpy_ctx_t ctx, gdrpy_pin_t pin, size_t offset,
                          const void *src, size_t n);
GDRPY_API int gdrpy_read(gdrpy_ctx_t ctx, gdrpy_pin_t pin, size_t offset,
                         void *dst, size_t n);

/* ---- copy-engine path (cuMemcpy; sim: memcpy) ------------------------- */
/* stream: a CUstream.  NULL: synchronous; a write on the legacy default
 * stream (ordered after the caller's earlier work there), a read on gdrpy's
 * own non-blocking stream (it waits for none of the caller's kernels, as a
 * read through the mapping never does).  With a stream the copy is only
 * enqueued; the host buffer must stay valid until the stream reaches it. */
GDRPY_API int gdrpy_ce_write(gdrpy_ctx_t ctx, gdrpy_pin_t pin, size_t offset,
                             const void *src, size_t n, void *stream);
GDRPY_API int gdrpy_ce_read(gdrpy_ctx_t ctx, gdrpy_pin_t pin, size_t offset,
                            void *dst, size_t n, void *stream);
/* Waits until `stream` (a CUstream; NULL: the legacy default stream) has
 * finished its work.  No-op on sim. */
GDRPY_API int gdrpy_stream_synchronize(gdrpy_ctx_t ctx, void *stream);
/* Unvalidated device copies against any device address of the context's
 * GPU (sim: any sim allocation). */
GDRPY_API int gdrpy_memcpy_htod(gdrpy_ctx_t ctx, uint64_t dptr, const void *src, size_t n);
GDRPY_API int gdrpy_memcpy_dtoh(gdrpy_ctx_t ctx, void *dst, uint64_t dptr, size_t n);

/* ---- raw copy kernels (no lock, no check: hot path) ------------------- */
/* Copy into write-combined (or device) memory, then the architecture's
 * store fence (x86 SFENCE, aarch64 DSB ST). */
GDRPY_API void gdrpy_copy_to_mapping(void *map_dst, const void *src, size_t n);
/* Copy out of a mapping with streaming loads (whole aligned 64-byte lines). */
GDRPY_API void gdrpy_copy_from_mapping(void *dst, const void *map_src, size_t n);
/* The kernel in use: x86 "avx512", "avx2", "sse41", "movdir64b"; aarch64
 * "neon", "ls64"; "generic" everywhere. */
GDRPY_API const char *gdrpy_copy_isa(void);
/* Forces a kernel by name (as GDRPY_COPY_ISA does); EINVAL if unknown,
 * ENOTSUP if this CPU cannot run it.  NULL or "auto" restores dispatch. */
GDRPY_API int gdrpy_set_copy_isa(const char *name);
/* Comma-separated list of kernels this CPU can run. */
GDRPY_API const char *gdrpy_copy_isa_available(void);
/* Why the other kernels this build knows of cannot run here, were not
 * compiled in, or are never chosen by auto: one "name: reason" line each
 * ("" when none).  Static storage. */
GDRPY_API const char *gdrpy_copy_isa_notes(void);

/* ---- sim "device" memory (host memory standing in for a GPU) ---------- */
/* Allocations are 64 KiB aligned, zero-filled, backed by a memfd so that a
 * mapping aliases them like a BAR1 mapping aliases GPU memory.  Freeing
 * while pinned keeps the pages alive for the pin (as RM handles do). */
GDRPY_API int gdrpy_sim_alloc(size_t size, uint64_t *dptr);
GDRPY_API int gdrpy_sim_free(uint64_t dptr);

/* Incremented in every child after fork() (pthread_atfork); a cheap fork
 * check.  In the child every mapping of the parent is replaced by private
 * zero-filled memory at the same address: a raw pointer into a parent
 * mapping reads zeros and writes to the child's own memory; it never sees
 * or changes the parent's device memory and never faults. */
GDRPY_API extern volatile unsigned gdrpy_fork_generation;

#ifdef __cplusplus
}
#endif
#endif /* GDRPY_H */
