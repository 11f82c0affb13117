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

static void movdir64b_to_mapping(void *dst, const void *src, size_t n)
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
    /* MOVDIR64B reads its 64-byte source with no alignment requirement and
     * writes the aligned destination line. */
    for (; n >= 128; n -= 128, d += 128, s += 128) {
        _movdir64b(d, s);
        _movdir64b(d + 64, s + 64);
    }
    if (n >= 64) {
        _movdir64b(d, s);
        n -= 64, d += 64, s += 64;
    }
    if (n)
        gp_put_le64_avx2(d, s, n);
    /* Direct stores are weakly ordered like WC stores: SFENCE orders them. */
    _mm_sfence();
}

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
