/*
 * wc.h - stores into write-combined (BAR1) mappings without the copy
 * kernels' trailing fence, and the fence itself.  For the channel
 * (channel.c) and gdrpy_writev (writev.c): several stores, one fence.
 */
#ifndef GDRPY_WC_H
#define GDRPY_WC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fence.h" /* src/copy/fence.h: the copy kernels' fences, per architecture */
#include "gdrpy.h"
#include "internal.h"

/* Orders every earlier store (WC included) before every later store, and
 * drains the write-combining buffers towards the device: the copy kernels'
 * store fence (x86 SFENCE as before; aarch64 DSB ST; ppc64le SYNC; riscv64
 * FENCE OW,IORW; the build stops elsewhere). */
static inline void gp_wc_fence(void)
{
    gp_fence_after_stores();
}

/* One aligned 8-byte store (never torn). */
static inline void gp_wc_store_u64(void *p, uint64_t v) { *(volatile uint64_t *)p = v; }
static inline void gp_wc_store_u32(void *p, uint32_t v) { *(volatile uint32_t *)p = v; }

/* Stores exactly [dst, dst+n) (any alignment, no fence).  memcpy only writes
 * the destination, never reads it, so it is safe on x86 WC memory; the
 * compiler barrier keeps it before the caller's fence.  Elsewhere the mapping
 * may fault on memcpy's unaligned accesses (BAR1 is Device memory on arm64):
 * the dispatched copy kernel stores with aligned accesses only (and fences). */
static inline void gp_wc_store_nofence(void *dst, const void *src, size_t n)
{
#if GP_MAPPING_UNALIGNED_OK
    memcpy(dst, src, n);
    __asm__ __volatile__("" ::: "memory");
#else
    gdrpy_copy_to_mapping(dst, src, n);
#endif
}

/* Zero-fills [dst, dst+n) of a mapping (no fence; wc.c). */
GP_HIDDEN void gp_wc_zero(void *dst, size_t n);

#endif
