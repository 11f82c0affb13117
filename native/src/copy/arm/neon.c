/*
 * arm/neon.c - AArch64 NEON (ASIMD) copy kernel ("neon"), the counterpart of
 * the x86 SSE/AVX ones.  No extra compiler flags: ASIMD is part of the
 * AArch64 base ISA as compilers target it; the run-time check is
 * HWCAP_ASIMD.
 * Stores: whole aligned 64-byte lines as one ST1 of four Q registers (one
 * 64-byte store instruction), heads and tails as naturally aligned scalar
 * and 16-byte stores (arm.h: the mapping is Device memory on arm64, where an
 * unaligned access faults).  Then DSB ST (fence.h).
 * Loads: whole aligned 64-byte lines as one LD1 of four Q registers, the
 * partial first and last lines through a bounce buffer (copy.h contract),
 * between DMB OSHLD barriers (fence.h).
 */
#define GP_COPY_KERNEL_TU 1
#include "copy.h"

static inline __attribute__((always_inline)) void neon_line_put(char *d, const char *s)
{
    uint8x16x4_t v = vld1q_u8_x4((const uint8_t *)s);
    GP_MAP_TRACE(d, 64);
    vst1q_u8_x4((uint8_t *)d, v);
}

static inline __attribute__((always_inline)) void neon_line_get_to(char *d, const char *line)
{
    vst1q_u8_x4((uint8_t *)d, gp_arm_line_ld(line));
}

static void neon_to_mapping(void *dst, const void *src, size_t n)
{
    gp_arm_to_mapping(dst, src, n, neon_line_put);
}

static void neon_from_mapping(void *dst, const void *src, size_t n)
{
    gp_arm_from_mapping(dst, src, n, gp_arm_line_get_neon, neon_line_get_to);
}

const gp_copy_kernel gp_copy_neon = {
    .name = "neon",
    .to_mapping = neon_to_mapping,
    .from_mapping = neon_from_mapping,
    .cpu_ok = gp_cpu_ok_neon,
};
