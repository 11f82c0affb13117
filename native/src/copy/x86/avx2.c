/*
 * copy_avx2.c - AVX2 copy kernel ("avx2"), compiled with -mavx2.
 * Stores: 32-byte VMOVNTDQ, two per 64-byte line.  Small writes (<= 64 B)
 * use XMM/YMM plain stores, loop-free.  Loads: 32-byte VMOVNTDQA, two per
 * aligned line, back to back (one PCIe read per line), whole aligned lines
 * only, small reads included (gp_from_mapping_avx2 in copy.h).
 */
#define GP_COPY_KERNEL_TU 1
#include <immintrin.h>

#include "copy.h"

/* n (a multiple of 64) bytes of whole lines: two per iteration, each
 * line's two halves stored back to back, lines in address order. */
GP_INLINE void avx2_put_lines(char *d, const char *s, size_t n)
{
    for (; n >= 128; n -= 128, d += 128, s += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)s);
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + 96));
        _mm256_stream_si256((__m256i *)d, a);
        _mm256_stream_si256((__m256i *)(d + 32), b);
        _mm256_stream_si256((__m256i *)(d + 64), c);
        _mm256_stream_si256((__m256i *)(d + 96), e);
    }
    if (n) {
        __m256i a = _mm256_loadu_si256((const __m256i *)s);
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + 32));
        _mm256_stream_si256((__m256i *)d, a);
        _mm256_stream_si256((__m256i *)(d + 32), b);
    }
}

GP_DEFINE_TO_MAPPING(avx2_to_mapping, gp_put_le64_avx2, avx2_put_lines)

static void avx2_from_mapping(void *dst, const void *src, size_t n)
{
    gp_from_mapping_avx2(dst, src, n);
}

const gp_copy_kernel gp_copy_avx2 = {
    .name = "avx2",
    .to_mapping = avx2_to_mapping,
    .from_mapping = avx2_from_mapping,
    .cpu_ok = gp_cpu_ok_avx2,
};
