/*
 * copy.h - copy kernels: the per-ISA kernel objects, the dispatcher's helpers
 * for tests, and (for the kernel files only) the small loop-free building
 * blocks they share.  Not installed; nothing here is ABI.
 *
 * Kernel contract (every gp_copy_<isa>):
 *  - to_mapping(dst, src, n): dst is write-combined (WC) memory.  Writes
 *    exactly the bytes [dst, dst+n) and reads only [src, src+n), in any
 *    alignment; overlapping stores are only ever used inside that range and
 *    always carry the same data, so their order does not matter.  Ends with
 *    an sfence when n > 0, so the WC stores are ordered before whatever the
 *    caller does next.  n == 0 touches nothing.
 *  - from_mapping(dst, src, n): src is WC memory.  Writes exactly the bytes
 *    [dst, dst+n), in any alignment.  Reads the source only as whole
 *    naturally aligned 64-byte lines, those covering
 *    [round_down(src, 64), round_up(src+n, 64)), each with streaming loads
 *    (MOVNTDQA family: 4 x 16 B, 2 x 32 B or 1 x 64 B) issued back to back,
 *    so that each line is one PCIe read into a streaming-load (line-fill)
 *    buffer: n bytes cost one read per line they touch, not one per load
 *    instruction (a plain load from WC memory is its own uncached round
 *    trip, ~1 us on BAR1, and two plain loads of one line are two round
 *    trips).  Interior lines stream straight to dst; the first and last line,
 *    when only partly wanted, go through a 64-byte aligned bounce buffer on
 *    the stack and only the wanted bytes are copied out.  n <= 64 inside one
 *    line is exactly one line read, across two lines two; the head and tail
 *    lines are issued before the interior, so that they are in flight
 *    together.  The generic kernel (portable C, plain loads only) reads the
 *    whole naturally aligned 8-byte words covering the range instead.
 *    Reading bytes outside [src, src+n) but inside those lines/words is by
 *    design and safe: an aligned 64-byte line (or 8-byte word) never crosses
 *    a 4 KiB page, let alone a mapping (mappings are page-granular; BAR1
 *    pages are 64 KiB), so it cannot fault where [src, src+n) does not, and
 *    reads of BAR1 have no side effects (plain memory behind the BAR, no
 *    registers); the extra bytes only ride along in a read that happens
 *    anyway.  Nothing beyond those lines is ever read.  n == 0 touches
 *    nothing.
 *  - Thread-safe and reentrant: no state at all.
 */
#ifndef GDRPY_COPY_H
#define GDRPY_COPY_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* ---- kernels (one file each) ------------------------------------------ */
GP_HIDDEN extern const gp_copy_kernel gp_copy_generic;   /* copy_generic.c */
GP_HIDDEN extern const gp_copy_kernel gp_copy_sse41;     /* copy_sse41.c */
GP_HIDDEN extern const gp_copy_kernel gp_copy_avx2;      /* copy_avx2.c */
GP_HIDDEN extern const gp_copy_kernel gp_copy_avx512;    /* copy_avx512.c */
GP_HIDDEN extern const gp_copy_kernel gp_copy_movdir64b; /* copy_movdir64b.c */

/* ---- dispatcher helpers (copy.c) -------------------------------------- */
/* The kernel called `name` (case-insensitive: "generic", "sse41", "avx2",
 * "avx512", "movdir64b"), whether or not this CPU can run it; NULL if the
 * name is unknown (also for "auto").  Check ->cpu_ok() before calling. */
GP_HIDDEN const gp_copy_kernel *gp_copy_kernel_by_name(const char *name);
/* All kernels, in the dispatcher's preference order; *count gets the number. */
GP_HIDDEN const gp_copy_kernel *const *gp_copy_kernel_list(size_t *count);
/* The kernel that "auto" selects on this CPU (never NULL). */
GP_HIDDEN const gp_copy_kernel *gp_copy_auto_kernel(void);

/* CPU feature probes, CPUID + XGETBV (OS-enabled register state included);
 * defined in copy.c, which is compiled without -m flags, so they are safe to
 * call on any x86-64 CPU.  Used as the kernels' cpu_ok hooks. */
GP_HIDDEN int gp_cpu_ok_sse41(void);
GP_HIDDEN int gp_cpu_ok_avx2(void);
GP_HIDDEN int gp_cpu_ok_avx512(void);    /* AVX-512F + BW, ZMM state on */
GP_HIDDEN int gp_cpu_ok_movdir64b(void); /* MOVDIR64B + AVX2 */

/* ======================================================================= */
#ifdef GP_COPY_KERNEL_TU
/* Shared building blocks, compiled into each kernel file with that file's
 * -m flags (static inline: every file gets its own copy). */

#define GP_INLINE static inline __attribute__((always_inline))

/* Unaligned scalar access without UB; volatile where the access touches the
 * mapping, so that the compiler neither merges, splits nor drops it. */
typedef uint16_t gp_u16u __attribute__((aligned(1), may_alias));
typedef uint32_t gp_u32u __attribute__((aligned(1), may_alias));
typedef uint64_t gp_u64u __attribute__((aligned(1), may_alias));
typedef uint64_t gp_u64a __attribute__((may_alias));   /* 8-byte aligned */

/* 1 <= n <= 15, dst in the mapping: two overlapping stores of the largest
 * power of two <= n (one store for n == 1).  For n == 8 this is two loads
 * and two stores to the same address, no loop. */
GP_INLINE void gp_put_lt16(char *d, const char *s, size_t n)
{
    if (n >= 8) {
        uint64_t a = *(const gp_u64u *)s, b = *(const gp_u64u *)(s + n - 8);
        *(volatile gp_u64u *)d = a;
        *(volatile gp_u64u *)(d + n - 8) = b;
    } else if (n >= 4) {
        uint32_t a = *(const gp_u32u *)s, b = *(const gp_u32u *)(s + n - 4);
        *(volatile gp_u32u *)d = a;
        *(volatile gp_u32u *)(d + n - 4) = b;
    } else if (n >= 2) {
        uint16_t a = *(const gp_u16u *)s, b = *(const gp_u16u *)(s + n - 2);
        *(volatile gp_u16u *)d = a;
        *(volatile gp_u16u *)(d + n - 2) = b;
    } else {
        *(volatile uint8_t *)d = *(const uint8_t *)s;
    }
}

/* 1 <= n <= 15, neither side in the mapping (the read kernels copy the
 * wanted bytes out of a bounce buffer with it): two overlapping accesses of
 * the largest power of two <= n, loop-free.  Writes exactly [d, d+n). */
GP_INLINE void gp_mov_lt16(char *d, const char *s, size_t n)
{
    if (n >= 8) {
        uint64_t a = *(const gp_u64u *)s, b = *(const gp_u64u *)(s + n - 8);
        *(gp_u64u *)d = a;
        *(gp_u64u *)(d + n - 8) = b;
    } else if (n >= 4) {
        uint32_t a = *(const gp_u32u *)s, b = *(const gp_u32u *)(s + n - 4);
        *(gp_u32u *)d = a;
        *(gp_u32u *)(d + n - 4) = b;
    } else if (n >= 2) {
        uint16_t a = *(const gp_u16u *)s, b = *(const gp_u16u *)(s + n - 2);
        *(gp_u16u *)d = a;
        *(gp_u16u *)(d + n - 2) = b;
    } else {
        *(uint8_t *)d = *(const uint8_t *)s;
    }
}

/* One 64-byte line of the mapping, as the read kernels stage it: the first
 * and last line of a copy land here whole, and the wanted bytes are copied
 * out.  64-byte aligned, so the line is stored with aligned vector stores
 * (one cache line of the stack). */
typedef union {
    unsigned char b[64];
    uint64_t w[8];
} __attribute__((aligned(64))) gp_line64;

#ifdef __AVX2__
#include <immintrin.h>
/* 1 <= n <= 64, dst in the mapping, with XMM/YMM registers only (no ZMM
 * even in the AVX-512 kernel: small writes are the latency path, which
 * costs only some tens of ns, and the first 512-bit instruction after an
 * idle period can run at reduced throughput while the upper vector lanes
 * power up). */
GP_INLINE void gp_put_le64_avx2(char *d, const char *s, size_t n)
{
    if (n >= 16) {
        if (n >= 32) {
            __m256i a = _mm256_loadu_si256((const __m256i *)s);
            __m256i b = _mm256_loadu_si256((const __m256i *)(s + n - 32));
            _mm256_storeu_si256((__m256i *)d, a);
            _mm256_storeu_si256((__m256i *)(d + n - 32), b);
        } else {
            __m128i a = _mm_loadu_si128((const __m128i *)s);
            __m128i b = _mm_loadu_si128((const __m128i *)(s + n - 16));
            _mm_storeu_si128((__m128i *)d, a);
            _mm_storeu_si128((__m128i *)(d + n - 16), b);
        }
    } else {
        gp_put_lt16(d, s, n);
    }
}

/* 1 <= n <= 64, neither side in the mapping (copies the wanted bytes out of
 * a gp_line64 bounce buffer): XMM/YMM, loop-free, writes exactly [d, d+n). */
GP_INLINE void gp_mov_le64_avx2(char *d, const char *s, size_t n)
{
    if (n >= 16) {
        if (n >= 32) {
            __m256i a = _mm256_loadu_si256((const __m256i *)s);
            __m256i b = _mm256_loadu_si256((const __m256i *)(s + n - 32));
            _mm256_storeu_si256((__m256i *)d, a);
            _mm256_storeu_si256((__m256i *)(d + n - 32), b);
        } else {
            __m128i a = _mm_loadu_si128((const __m128i *)s);
            __m128i b = _mm_loadu_si128((const __m128i *)(s + n - 16));
            _mm_storeu_si128((__m128i *)d, a);
            _mm_storeu_si128((__m128i *)(d + n - 16), b);
        }
    } else {
        gp_mov_lt16(d, s, n);
    }
}

/* One aligned line of the mapping into a bounce buffer: two VMOVNTDQA back
 * to back (the second is served by the streaming-load buffer the first
 * allocated: one PCIe read), then two aligned stores to the stack.  The
 * intrinsic takes a non-const pointer; it only reads. */
GP_INLINE void gp_line_get_avx2(gp_line64 *buf, const char *line)
{
    __m256i a = _mm256_stream_load_si256((__m256i *)(uintptr_t)line);
    __m256i b = _mm256_stream_load_si256((__m256i *)(uintptr_t)(line + 32));
    _mm256_store_si256((__m256i *)buf->b, a);
    _mm256_store_si256((__m256i *)(buf->b + 32), b);
}

/* from_mapping with AVX2 streaming loads (shared by the avx2 and movdir64b
 * kernels: MOVDIR64B is a store-only instruction).  Reads only the aligned
 * lines covering [src, src+n), each once (see the contract at the top). */
GP_INLINE void gp_from_mapping_avx2(void *dst, const void *src, size_t n)
{
    if (!n)
        return;
    char *d = dst;
    size_t off = (size_t)((uintptr_t)src & 63);          /* src within its line */
    const char *p = (const char *)src - off;             /* first line */
    gp_line64 head, tail;
    if (off + n <= 64) {                                 /* one line */
        gp_line_get_avx2(&head, p);
        gp_mov_le64_avx2(d, (const char *)head.b + off, n);
        return;
    }
    size_t tn = (size_t)(((uintptr_t)src + n) & 63);    /* bytes wanted of a partial last line */
    const char *pe = (const char *)src + n - tn;         /* end of the whole lines */
    /* The partial first and last lines first, so that their reads are in
     * flight together (and with the interior's). */
    if (off)
        gp_line_get_avx2(&head, p);
    if (tn)
        gp_line_get_avx2(&tail, pe);
    if (off) {
        gp_mov_le64_avx2(d, (const char *)head.b + off, 64 - off);
        d += 64 - off, p += 64;
    }
    /* Whole lines straight to dst, two per iteration; each line's two
     * loads back to back. */
    for (; pe - p >= 128; p += 128, d += 128) {
        __m256i a = _mm256_stream_load_si256((__m256i *)(uintptr_t)p);
        __m256i b = _mm256_stream_load_si256((__m256i *)(uintptr_t)(p + 32));
        __m256i c = _mm256_stream_load_si256((__m256i *)(uintptr_t)(p + 64));
        __m256i e = _mm256_stream_load_si256((__m256i *)(uintptr_t)(p + 96));
        _mm256_storeu_si256((__m256i *)d, a);
        _mm256_storeu_si256((__m256i *)(d + 32), b);
        _mm256_storeu_si256((__m256i *)(d + 64), c);
        _mm256_storeu_si256((__m256i *)(d + 96), e);
    }
    if (p != pe) {
        __m256i a = _mm256_stream_load_si256((__m256i *)(uintptr_t)p);
        __m256i b = _mm256_stream_load_si256((__m256i *)(uintptr_t)(p + 32));
        _mm256_storeu_si256((__m256i *)d, a);
        _mm256_storeu_si256((__m256i *)(d + 32), b);
        d += 64;
    }
    if (tn)
        gp_mov_le64_avx2(d, (const char *)tail.b, tn);
}
#endif /* __AVX2__ */

#endif /* GP_COPY_KERNEL_TU */
#endif /* GDRPY_COPY_H */
