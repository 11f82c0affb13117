/*
 * copy_avx512.c - AVX-512 copy kernel ("avx512"), compiled with
 * -mavx512f -mavx512bw.
 * Stores: one 64-byte VMOVNTDQ per line: the whole line enters its WC
 * buffer in a single store, so it cannot be evicted half-filled.  Loads: one
 * 64-byte VMOVNTDQA per aligned line, small reads included: one load
 * instruction per PCIe read, whole lines only (on an H100 host, NVIDIA
 * driver 580.159.04, 64-byte loads read BAR1 15-20 % faster than 32-byte
 * ones: 0.84-1.01 against 0.73-0.82 GB/s at 1 MiB, see dispatch.c; partial
 * first and last lines go through a bounce buffer, see copy.h).
 * Writes use ZMM only in the bulk loop (>= one whole aligned line);
 * everything <= 64 bytes, and heads and tails, use XMM/YMM plain stores (see
 * copy.h).  Reads use one ZMM load per line even for a 1-byte read: there
 * the ~1 us PCIe round trip dwarfs any ZMM warm-up cost, and a single
 * 64-byte load is one read request by construction.  The wanted bytes are
 * copied out of the bounce buffer with XMM/YMM.
 */
#define GP_COPY_KERNEL_TU 1
#include <immintrin.h>

#include "copy.h"

/* n (a multiple of 64) bytes of whole lines, one 64-byte VMOVNTDQ each,
 * two per iteration. */
GP_INLINE void avx512_put_lines(char *d, const char *s, size_t n)
{
    for (; n >= 128; n -= 128, d += 128, s += 128) {
        __m512i a = _mm512_loadu_si512((const void *)s);
        __m512i b = _mm512_loadu_si512((const void *)(s + 64));
        _mm512_stream_si512((void *)d, a);
        _mm512_stream_si512((void *)(d + 64), b);
    }
    if (n)
        _mm512_stream_si512((void *)d, _mm512_loadu_si512((const void *)s));
}

GP_DEFINE_TO_MAPPING(avx512_to_mapping, gp_put_le64_avx2, avx512_put_lines)

/* One aligned line of the mapping into a bounce buffer: one VMOVNTDQA, one
 * aligned store to the stack.  The intrinsic takes a non-const pointer; it
 * only reads. */
GP_INLINE void avx512_line_get(gp_line64 *buf, const char *line)
{
    _mm512_store_si512((void *)buf->b, _mm512_stream_load_si512((void *)(uintptr_t)line));
}

/* Whole lines [p, pe) to d, two 512-bit streaming loads per iteration;
 * returns the new d. */
GP_INLINE char *avx512_get_lines(char *d, const char *p, const char *pe)
{
    for (; pe - p >= 128; p += 128, d += 128) {
        __m512i a = _mm512_stream_load_si512((void *)(uintptr_t)p);
        __m512i b = _mm512_stream_load_si512((void *)(uintptr_t)(p + 64));
        _mm512_storeu_si512((void *)d, a);
        _mm512_storeu_si512((void *)(d + 64), b);
    }
    if (p != pe) {
        _mm512_storeu_si512((void *)d, _mm512_stream_load_si512((void *)(uintptr_t)p));
        d += 64;
    }
    return d;
}

GP_DEFINE_FROM_MAPPING(static, avx512_from_mapping, avx512_line_get, gp_mov_le64_avx2,
                       avx512_get_lines)

const gp_copy_kernel gp_copy_avx512 = {
    .name = "avx512",
    .to_mapping = avx512_to_mapping,
    .from_mapping = avx512_from_mapping,
    .cpu_ok = gp_cpu_ok_avx512,
};
