/*
 * copy_avx512.c - AVX-512 copy kernel ("avx512"), compiled with
 * -mavx512f -mavx512bw.
 * Stores: one 64-byte VMOVNTDQ per line: the whole line enters its WC
 * buffer in a single store, so it cannot be evicted half-filled.  Loads: one
 * 64-byte VMOVNTDQA per line (one load instruction per PCIe read: on our
 * H100 host this read BAR1 15-20 % faster than 32-byte loads, see
 * shared/facts/nvrm-bar1.md).
 * ZMM registers are used only in the bulk loops (>= one whole aligned line);
 * everything <= 64 bytes, and heads and tails, use XMM/YMM (see copy.h).
 */
#define GP_COPY_KERNEL_TU 1
#include <immintrin.h>

#include "copy.h"

static void avx512_to_mapping(void *dst, const void *src, size_t n)
{
    char *d = dst;
    const char *s = src;
    if (n <= 64) {
        if (n) {
            gp_put_le64_avx2(d, s, n);
            _mm_sfence();
        }
        return;
    }
    size_t head = (size_t)(-(uintptr_t)d & 63);
    if (head) {
        gp_put_le64_avx2(d, s, head);
        d += head, s += head, n -= head;
    }
    for (; n >= 128; n -= 128, d += 128, s += 128) {
        __m512i a = _mm512_loadu_si512((const void *)s);
        __m512i b = _mm512_loadu_si512((const void *)(s + 64));
        _mm512_stream_si512((void *)d, a);
        _mm512_stream_si512((void *)(d + 64), b);
    }
    if (n >= 64) {
        _mm512_stream_si512((void *)d, _mm512_loadu_si512((const void *)s));
        n -= 64, d += 64, s += 64;
    }
    if (n)
        gp_put_le64_avx2(d, s, n);
    _mm_sfence();
}

static void avx512_from_mapping(void *dst, const void *src, size_t n)
{
    char *d = dst;
    const char *s = src;
    if (n <= 64) {
        if (n)
            gp_get_le64_avx2(d, s, n);
        return;
    }
    size_t head = (size_t)(-(uintptr_t)s & 63);
    if (head) {
        gp_get_le64_avx2(d, s, head);
        d += head, s += head, n -= head;
    }
    for (; n >= 128; n -= 128, d += 128, s += 128) {
        __m512i a = _mm512_stream_load_si512((void *)(uintptr_t)s);
        __m512i b = _mm512_stream_load_si512((void *)(uintptr_t)(s + 64));
        _mm512_storeu_si512((void *)d, a);
        _mm512_storeu_si512((void *)(d + 64), b);
    }
    if (n >= 64) {
        _mm512_storeu_si512((void *)d, _mm512_stream_load_si512((void *)(uintptr_t)s));
        n -= 64, d += 64, s += 64;
    }
    if (n)
        gp_get_le64_avx2(d, s, n);
}

const gp_copy_kernel gp_copy_avx512 = {
    .name = "avx512",
    .to_mapping = avx512_to_mapping,
    .from_mapping = avx512_from_mapping,
    .cpu_ok = gp_cpu_ok_avx512,
};
