/*
 * copy_movdir64b.c - MOVDIR64B copy kernel ("movdir64b"), compiled with
 * -mmovdir64b -mavx2.
 * Stores: one MOVDIR64B per 64-byte line: a 64-byte direct store, issued as
 * a single write of the whole line whatever the WC buffers do (the
 * destination must be 64-byte aligned: the head brings it there).  Small
 * sizes, heads and tails use the AVX2 plain-store paths.  MOVDIR64B has no
 * load counterpart: from_mapping is the AVX2 streaming-load path (whole
 * aligned lines, two VMOVNTDQA each, see copy.h).
 */
#define GP_COPY_KERNEL_TU 1
#include <immintrin.h>

#include "copy.h"

/* n (a multiple of 64) bytes of whole lines, one MOVDIR64B each (it reads
 * its 64-byte source with no alignment requirement and writes the aligned
 * destination line); direct stores are weakly ordered like WC stores, so
 * the SFENCE at the end orders them. */
GP_INLINE void movdir64b_put_lines(char *d, const char *s, size_t n)
{
    for (; n >= 128; n -= 128, d += 128, s += 128) {
        _movdir64b(d, s);
        _movdir64b(d + 64, s + 64);
    }
    if (n)
        _movdir64b(d, s);
}

GP_DEFINE_TO_MAPPING(movdir64b_to_mapping, gp_put_le64_avx2, movdir64b_put_lines)

static void movdir64b_from_mapping(void *dst, const void *src, size_t n)
{
    gp_from_mapping_avx2(dst, src, n);
}

const gp_copy_kernel gp_copy_movdir64b = {
    .name = "movdir64b",
    .to_mapping = movdir64b_to_mapping,
    .from_mapping = movdir64b_from_mapping,
    .cpu_ok = gp_cpu_ok_movdir64b,
};
