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
 *  - from_mapping(dst, src, n): src is WC memory.  Same range rules; bulk of
 *    the source is read with streaming loads (MOVNTDQA family) on aligned
 *    addresses, head and tail with plain loads.
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

/* 1 <= n <= 15, src in the mapping.  Both loads are issued before either
 * store, so they travel over PCIe concurrently. */
GP_INLINE void gp_get_lt16(char *d, const char *s, size_t n)
{
    if (n >= 8) {
        uint64_t a = *(const volatile gp_u64u *)s;
        uint64_t b = *(const volatile gp_u64u *)(s + n - 8);
        *(gp_u64u *)d = a;
        *(gp_u64u *)(d + n - 8) = b;
    } else if (n >= 4) {
        uint32_t a = *(const volatile gp_u32u *)s;
        uint32_t b = *(const volatile gp_u32u *)(s + n - 4);
        *(gp_u32u *)d = a;
        *(gp_u32u *)(d + n - 4) = b;
    } else if (n >= 2) {
        uint16_t a = *(const volatile gp_u16u *)s;
        uint16_t b = *(const volatile gp_u16u *)(s + n - 2);
        *(gp_u16u *)d = a;
        *(gp_u16u *)(d + n - 2) = b;
    } else {
        *(uint8_t *)d = *(const volatile uint8_t *)s;
    }
}

#ifdef __AVX2__
#include <immintrin.h>
/* 1 <= n <= 64 with XMM/YMM registers only (no ZMM even in the AVX-512
 * kernel: small messages are the latency path, and the first 512-bit
 * instruction after an idle period can run at reduced throughput while the
 * upper vector lanes power up). */
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

GP_INLINE void gp_get_le64_avx2(char *d, const char *s, size_t n)
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
        gp_get_lt16(d, s, n);
    }
}

/* from_mapping with AVX2 streaming loads (shared by the avx2 and movdir64b
 * kernels: MOVDIR64B is a store-only instruction). */
GP_INLINE void gp_from_mapping_avx2(void *dst, const void *src, size_t n)
{
    char *d = dst;
    const char *s = src;
    if (n <= 64) {
        if (n)
            gp_get_le64_avx2(d, s, n);
        return;
    }
    /* Head: plain loads up to the next 64-byte boundary of the source
     * (VMOVNTDQA needs 32-byte alignment; a whole line per iteration keeps
     * each line's two loads in one streaming-load buffer). */
    size_t head = (size_t)(-(uintptr_t)s & 63);
    if (head) {
        gp_get_le64_avx2(d, s, head);
        d += head, s += head, n -= head;
    }
    for (; n >= 128; n -= 128, s += 128, d += 128) {
        __m256i a = _mm256_stream_load_si256((const __m256i *)s);
        __m256i b = _mm256_stream_load_si256((const __m256i *)(s + 32));
        __m256i c = _mm256_stream_load_si256((const __m256i *)(s + 64));
        __m256i e = _mm256_stream_load_si256((const __m256i *)(s + 96));
        _mm256_storeu_si256((__m256i *)d, a);
        _mm256_storeu_si256((__m256i *)(d + 32), b);
        _mm256_storeu_si256((__m256i *)(d + 64), c);
        _mm256_storeu_si256((__m256i *)(d + 96), e);
    }
    if (n >= 64) {
        __m256i a = _mm256_stream_load_si256((const __m256i *)s);
        __m256i b = _mm256_stream_load_si256((const __m256i *)(s + 32));
        _mm256_storeu_si256((__m256i *)d, a);
        _mm256_storeu_si256((__m256i *)(d + 32), b);
        n -= 64, s += 64, d += 64;
    }
    if (n)
        gp_get_le64_avx2(d, s, n);
}
#endif /* __AVX2__ */

#endif /* GP_COPY_KERNEL_TU */
#endif /* GDRPY_COPY_H */
