/*
 * copy_sse41.c - SSE4.1 copy kernel ("sse41"), compiled with -msse4.1.
 * Stores: 16-byte MOVNTDQ, four per 64-byte line.  Loads: 16-byte MOVNTDQA
 * (the SSE4.1 instruction this kernel exists for), four per aligned line,
 * issued back to back so that the line is one PCIe read into a
 * streaming-load buffer; only whole aligned lines are read (partial first
 * and last lines through a bounce buffer, see copy.h).
 */
#define GP_COPY_KERNEL_TU 1
#include <smmintrin.h>

#include "copy.h"

/* 1 <= n <= 64, loop-free: first and last 16 (n < 32) or 32 bytes; writes
 * exactly [d, d+n).  `to_map` as in gp_lt16: into the mapping (put) or out
 * of a bounce buffer (mov). */
GP_INLINE void sse41_le64(char *d, const char *s, size_t n, int to_map)
{
    if (n < 16) {
        gp_lt16(d, s, n, to_map);
    } else if (n < 32) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + n - 16));
        _mm_storeu_si128((__m128i *)d, a);
        _mm_storeu_si128((__m128i *)(d + n - 16), b);
    } else {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + n - 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + n - 16));
        _mm_storeu_si128((__m128i *)d, a);
        _mm_storeu_si128((__m128i *)(d + 16), b);
        _mm_storeu_si128((__m128i *)(d + n - 32), c);
        _mm_storeu_si128((__m128i *)(d + n - 16), e);
    }
}
#define sse41_put_le64(d, s, n) sse41_le64((d), (s), (n), 1)
#define sse41_mov_le64(d, s, n) sse41_le64((d), (s), (n), 0)

/* One aligned line of the mapping into a bounce buffer: all four MOVNTDQA
 * before any of their data is used (the first allocates the streaming-load
 * buffer, the other three are served from it: one PCIe read). */
GP_INLINE void sse41_line_get(gp_line64 *buf, const char *line)
{
    /* The intrinsic takes a non-const pointer; it only reads. */
    __m128i *p = (__m128i *)(uintptr_t)line;
    __m128i a = _mm_stream_load_si128(p);
    __m128i b = _mm_stream_load_si128(p + 1);
    __m128i c = _mm_stream_load_si128(p + 2);
    __m128i e = _mm_stream_load_si128(p + 3);
    _mm_store_si128((__m128i *)buf->b, a);
    _mm_store_si128((__m128i *)(buf->b + 16), b);
    _mm_store_si128((__m128i *)(buf->b + 32), c);
    _mm_store_si128((__m128i *)(buf->b + 48), e);
}

/* n (a multiple of 64) bytes of whole lines, four MOVNTDQ per line. */
GP_INLINE void sse41_put_lines(char *d, const char *s, size_t n)
{
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
}

GP_DEFINE_TO_MAPPING(sse41_to_mapping, sse41_put_le64, sse41_put_lines)

/* Whole lines [p, pe) to d, four MOVNTDQA per line; returns the new d. */
GP_INLINE char *sse41_get_lines(char *d, const char *p, const char *pe)
{
    for (; p != pe; p += 64, d += 64) {
        __m128i *q = (__m128i *)(uintptr_t)p;
        __m128i a = _mm_stream_load_si128(q);
        __m128i b = _mm_stream_load_si128(q + 1);
        __m128i c = _mm_stream_load_si128(q + 2);
        __m128i e = _mm_stream_load_si128(q + 3);
        _mm_storeu_si128((__m128i *)d, a);
        _mm_storeu_si128((__m128i *)(d + 16), b);
        _mm_storeu_si128((__m128i *)(d + 32), c);
        _mm_storeu_si128((__m128i *)(d + 48), e);
    }
    return d;
}

GP_DEFINE_FROM_MAPPING(static, sse41_from_mapping, sse41_line_get, sse41_mov_le64, sse41_get_lines)

const gp_copy_kernel gp_copy_sse41 = {
    .name = "sse41",
    .to_mapping = sse41_to_mapping,
    .from_mapping = sse41_from_mapping,
    .cpu_ok = gp_cpu_ok_sse41,
};
