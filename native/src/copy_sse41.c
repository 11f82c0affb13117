/*
 * copy_sse41.c - SSE4.1 copy kernel ("sse41"), compiled with -msse4.1.
 * Stores: 16-byte MOVNTDQ, four per 64-byte line.  Loads: 16-byte MOVNTDQA
 * (the SSE4.1 instruction this kernel exists for), four per line.
 */
#define GP_COPY_KERNEL_TU 1
#include <smmintrin.h>

#include "copy.h"

/* 1 <= n <= 64, loop-free: first and last 16 (n < 32) or 32 bytes. */
GP_INLINE void sse41_put_le64(char *d, const char *s, size_t n)
{
    if (n < 16) {
        gp_put_lt16(d, s, n);
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

GP_INLINE void sse41_get_le64(char *d, const char *s, size_t n)
{
    if (n < 16) {
        gp_get_lt16(d, s, n);
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

static void sse41_to_mapping(void *dst, const void *src, size_t n)
{
    char *d = dst;
    const char *s = src;
    if (n <= 64) {
        if (n) {
            sse41_put_le64(d, s, n);
            _mm_sfence();
        }
        return;
    }
    /* Head: plain stores up to the next 64-byte boundary of dst, so every
     * non-temporal line below is one full, aligned WC burst. */
    size_t head = (size_t)(-(uintptr_t)d & 63);
    if (head) {
        sse41_put_le64(d, s, head);
        d += head, s += head, n -= head;
    }
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
    if (n)
        sse41_put_le64(d, s, n);
    _mm_sfence();
}

static void sse41_from_mapping(void *dst, const void *src, size_t n)
{
    char *d = dst;
    const char *s = src;
    if (n <= 64) {
        if (n)
            sse41_get_le64(d, s, n);
        return;
    }
    /* Head: plain loads up to the next 64-byte boundary of src; then whole
     * lines with MOVNTDQA (16-byte aligned), four loads per line so that
     * the line is fetched once into a streaming-load buffer. */
    size_t head = (size_t)(-(uintptr_t)s & 63);
    if (head) {
        sse41_get_le64(d, s, head);
        d += head, s += head, n -= head;
    }
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        /* The intrinsic takes a non-const pointer; it only reads. */
        __m128i *p = (__m128i *)(uintptr_t)s;
        __m128i a = _mm_stream_load_si128(p);
        __m128i b = _mm_stream_load_si128(p + 1);
        __m128i c = _mm_stream_load_si128(p + 2);
        __m128i e = _mm_stream_load_si128(p + 3);
        _mm_storeu_si128((__m128i *)d, a);
        _mm_storeu_si128((__m128i *)(d + 16), b);
        _mm_storeu_si128((__m128i *)(d + 32), c);
        _mm_storeu_si128((__m128i *)(d + 48), e);
    }
    if (n)
        sse41_get_le64(d, s, n);
}

const gp_copy_kernel gp_copy_sse41 = {
    .name = "sse41",
    .to_mapping = sse41_to_mapping,
    .from_mapping = sse41_from_mapping,
    .cpu_ok = gp_cpu_ok_sse41,
};
