/*
 * gdrpy_host.h - page-locked host memory and the copy-engine paths for
 * large messages (libgdrpy).  Include after, or instead of, gdrpy.h.
 *
 * Host-memory kinds.  A copy engine moves page-locked host memory directly
 * (DMA at PCIe speed); pageable memory must first be copied into page-locked
 * memory.  libgdrpy offers:
 *
 *  - gdrpy_host_alloc/free: page-locked memory (cuMemHostAlloc, portable).
 *    An allocation does not belong to a gdrpy context: it keeps the device's
 *    primary CUDA context retained until it is freed, and outlives the
 *    context it was allocated through.  On sim: anonymous pre-faulted pages.
 *  - gdrpy_host_register/unregister: page-locks a caller's range
 *    (cuMemHostRegister, portable) until unregistered.  The caller must keep
 *    the memory alive while it is registered (the Python binding holds a
 *    buffer export for exactly that).
 *  - gdrpy_host_kind: classifies [p, p+n): GDRPY_HOST_PINNED (allocated
 *    above), GDRPY_HOST_REGISTERED (registered above), GDRPY_HOST_LOCKED
 *    (page-locked by someone else: cudaHostAlloc, torch pin_memory, CuPy
 *    pinned memory; found with cuPointerGetAttributes at both ends of the
 *    range, same buffer id) or GDRPY_HOST_PAGEABLE.  Nothing is cached
 *    across calls, so an answer cannot go stale.  A wrong answer could only
 *    choose a slower path: cuMemcpy is correct for every kind.
 *  - gdrpy_ce_write_staged/read_staged: copy-engine copies from/to pageable
 *    memory through the context's staging ring: `depth` page-locked chunks
 *    of up to `chunk` bytes; the host memcpy of chunk i+1 (split over
 *    `threads` threads) overlaps the DMA of chunk i.  Ordering is that of
 *    gdrpy_ce_write/read: without a stream the copy is complete on return
 *    (a write on the legacy default stream, a read on gdrpy's own
 *    non-blocking stream); with a stream the DMAs are enqueued on
 *    it (a write returns once the source has been consumed: the caller may
 *    reuse it at once; a read returns once the data is in `dst`).  One staged
 *    copy runs at a time per context (others wait).  On sim the same
 *    pipeline runs against a copy-engine stand-in thread.
 *  - gdrpy_ce_write_locked/read_locked: copy-engine copies from/to memory
 *    the caller knows to be page-locked: as gdrpy_ce_write/read, minus the
 *    wait that a synchronous write from pageable memory needs.
 */
#ifndef GDRPY_HOST_H
#define GDRPY_HOST_H

#include "gdrpy.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    GDRPY_HOST_PAGEABLE = 0,
    GDRPY_HOST_PINNED = 1,     /* gdrpy_host_alloc */
    GDRPY_HOST_REGISTERED = 2, /* gdrpy_host_register */
    GDRPY_HOST_LOCKED = 3      /* page-locked by another allocator */
};

GDRPY_API int gdrpy_host_alloc(gdrpy_ctx_t ctx, size_t size, void **out);
/* EINVAL unless p is the start of a live gdrpy_host_alloc allocation. */
GDRPY_API int gdrpy_host_free(void *p);
/* EINVAL for an empty/overlapping range; EBUSY if it overlaps a registered
 * range; ENOTSUP when the driver refuses. */
GDRPY_API int gdrpy_host_register(gdrpy_ctx_t ctx, void *p, size_t size);
/* EINVAL unless p is the start of a live registration. */
GDRPY_API int gdrpy_host_unregister(void *p);
GDRPY_API int gdrpy_host_kind(gdrpy_ctx_t ctx, const void *p, size_t size, int *kind);
/* gdrpy's own table only (no driver call): PINNED, REGISTERED or PAGEABLE.
 * For memory the caller knows no other library page-locked. */
GDRPY_API int gdrpy_host_kind_known(const void *p, size_t size);
/* Live allocations + registrations (leak checks). */
GDRPY_API uint64_t gdrpy_host_live(void);

/* Staging ring parameters of a context; 0 keeps a value.  chunk: 64 KiB ..
 * 64 MiB (multiple of 4 KiB), depth 2..64, chunk x depth <= 256 MiB, threads
 * 1..16.  The ring is (re)allocated on the next staged copy. */
GDRPY_API int gdrpy_staging_set(gdrpy_ctx_t ctx, size_t chunk, unsigned depth,
                                unsigned threads);
GDRPY_API int gdrpy_staging_get(gdrpy_ctx_t ctx, size_t *chunk, unsigned *depth,
                                unsigned *threads);
/* How the CPU side of each direction touches the staging ring (kinds):
 * PLAIN memcpy into/out of a cached ring; NT streaming stores (writes: into
 * the ring; reads: into the caller's memory); WC a write-combined ring
 * (writes: streaming stores into it; reads: streaming loads out of it);
 * EVICT memcpy, then the piece's ring lines leave the CPU's private caches
 * (writes: CLDEMOTE, else CLFLUSHOPT; reads: CLFLUSHOPT); NT_EVICT reads:
 * streaming stores into the caller's memory, then CLFLUSHOPT of the ring
 * lines (writes: as NT).  Where the CPU
 * lacks the instructions a kind falls back to PLAIN.  Defaults: WC for
 * writes, NT_EVICT for reads; -1 keeps a value.  `*_used` report the kinds in
 * use by the ring as built (-1: not built yet with these settings). */
enum { GDRPY_STAGING_PLAIN = 0,
       GDRPY_STAGING_NT = 1,
       GDRPY_STAGING_WC = 2,
       GDRPY_STAGING_EVICT = 3,
       GDRPY_STAGING_NT_EVICT = 4 };
GDRPY_API int gdrpy_staging_set_kinds(gdrpy_ctx_t ctx, int write_kind, int read_kind);
GDRPY_API int gdrpy_staging_get_kinds(gdrpy_ctx_t ctx, int *write_kind, int *read_kind,
                                      int *write_used, int *read_used);
GDRPY_API int gdrpy_ce_write_staged(gdrpy_ctx_t ctx, gdrpy_pin_t pin, size_t offset,
                                    const void *src, size_t n, void *stream);
GDRPY_API int gdrpy_ce_read_staged(gdrpy_ctx_t ctx, gdrpy_pin_t pin, size_t offset,
                                   void *dst, size_t n, void *stream);
GDRPY_API int gdrpy_ce_write_locked(gdrpy_ctx_t ctx, gdrpy_pin_t pin, size_t offset,
                                    const void *src, size_t n, void *stream);
GDRPY_API int gdrpy_ce_read_locked(gdrpy_ctx_t ctx, gdrpy_pin_t pin, size_t offset,
                                   void *dst, size_t n, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* GDRPY_HOST_H */
