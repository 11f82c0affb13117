/*
 * x86/x86.h - the x86-64 kernels (sse41.c, avx2.c, avx512.c, movdir64b.c),
 * their CPU probes (cpu.c) and, for the kernel files, the AVX2 building
 * blocks they share.  Included by copy.h on x86 targets only.
 */
#ifndef GDRPY_COPY_X86_H
#define GDRPY_COPY_X86_H

GP_HIDDEN extern const gp_copy_kernel gp_copy_sse41;     /* x86/sse41.c */
GP_HIDDEN extern const gp_copy_kernel gp_copy_avx2;      /* x86/avx2.c */
GP_HIDDEN extern const gp_copy_kernel gp_copy_avx512;    /* x86/avx512.c */
GP_HIDDEN extern const gp_copy_kernel gp_copy_movdir64b; /* x86/movdir64b.c */

/* CPU feature probes, CPUID + XGETBV (OS-enabled register state included);
 * defined in x86/cpu.c, which is compiled without -m flags, so they are
 * safe to call on any x86-64 CPU.  Used as the kernels' cpu_ok hooks. */
GP_HIDDEN int gp_cpu_ok_sse41(void);
GP_HIDDEN int gp_cpu_ok_avx2(void);
GP_HIDDEN int gp_cpu_ok_avx512(void);    /* AVX-512F + BW, ZMM state on */
GP_HIDDEN int gp_cpu_ok_movdir64b(void); /* MOVDIR64B + AVX2 */

#ifdef GP_COPY_KERNEL_TU
/* The body every x86 write kernel shares, as a function definition: up to
 * 64 bytes with plain stores, loop-free (PUT_LE64(d, s, n)); longer copies
 * take plain stores up to the next 64-byte boundary of dst (so every line
 * of the bulk is one full, aligned WC burst), whole lines by the kernel's
 * bulk loop (LINES(d, s, n), n a multiple of 64, lines in address order),
 * then the tail with plain stores; one SFENCE at the end orders the
 * non-temporal (or direct) stores before whatever the caller stores next. */
#define GP_DEFINE_TO_MAPPING(name, PUT_LE64, LINES)        \
    static void name(void *dst, const void *src, size_t n) \
    {                                                      \
        char *d = dst;                                     \
        const char *s = src;                               \
        if (n <= 64) {                                     \
            if (n) {                                       \
                PUT_LE64(d, s, n);                         \
                _mm_sfence();                              \
            }                                              \
            return;                                        \
        }                                                  \
        size_t head = (size_t)(-(uintptr_t)d & 63);        \
        if (head) {                                        \
            PUT_LE64(d, s, head);                          \
            d += head, s += head, n -= head;               \
        }                                                  \
        size_t body = n & ~(size_t)63;                     \
        LINES(d, s, body);                                 \
        d += body, s += body, n -= body;                   \
        if (n)                                             \
            PUT_LE64(d, s, n);                             \
        _mm_sfence();                                      \
    }

#ifdef __AVX2__
#include <immintrin.h>
/* 1 <= n <= 64 with XMM/YMM registers only, loop-free (first and last 16
 * or 32 bytes), writes exactly [d, d+n); `to_map` as in gp_lt16: a dst in
 * the mapping (put) or a copy out of a gp_line64 bounce buffer (mov).  No
 * ZMM even in the AVX-512 kernel: small writes are the latency path, which
 * costs only some tens of ns, and the first 512-bit instruction after an
 * idle period can run at reduced throughput while the upper vector lanes
 * power up. */
GP_INLINE void gp_le64_avx2(char *d, const char *s, size_t n, int to_map)
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
        gp_lt16(d, s, n, to_map);
    }
}
#define gp_put_le64_avx2(d, s, n) gp_le64_avx2((d), (s), (n), 1)
#define gp_mov_le64_avx2(d, s, n) gp_le64_avx2((d), (s), (n), 0)

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

/* Whole lines [p, pe) to d with AVX2 streaming loads, two lines per
 * iteration, each line's two loads back to back; returns the new d. */
GP_INLINE char *gp_get_lines_avx2(char *d, const char *p, const char *pe)
{
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
    return d;
}

/* from_mapping with AVX2 streaming loads (shared by the avx2 and movdir64b
 * kernels: MOVDIR64B is a store-only instruction). */
GP_DEFINE_FROM_MAPPING(GP_INLINE, gp_from_mapping_avx2, gp_line_get_avx2, gp_mov_le64_avx2,
                       gp_get_lines_avx2)
#endif /* __AVX2__ */
#endif /* GP_COPY_KERNEL_TU */

#endif /* GDRPY_COPY_X86_H */
