/*
 * arm/ls64.c - AArch64 LS64 copy kernel ("ls64"), compiled with
 * -march=armv8.7-a+ls64 (only where the compiler supports it: the Makefile
 * checks, and defines GP_HAVE_LS64).
 * Stores: whole aligned 64-byte lines with ST64B, a single-copy-atomic
 * 64-byte store: one 64-byte PCIe write per line even on non-gathering
 * Device memory.  Loads: whole aligned lines with LD64B (one 64-byte read).
 * Heads, tails and partial lines use the NEON paths (arm.h); fences as in
 * fence.h.
 * FEAT_LS64 instructions are only defined on Device and Normal
 * non-cacheable memory: on ordinary (cacheable) memory they fault, so this
 * kernel is never chosen by auto (the sim backend maps host memory) and
 * test_copy does not run it on host memory; GDRPY_COPY_ISA=ls64 or
 * gdrpy_set_copy_isa("ls64") selects it for BAR1 mappings on CPUs whose
 * kernel reports HWCAP3_LS64.  Unmeasured: no LS64 CPU with a GPU here.
 */
#define GP_COPY_KERNEL_TU 1
#include <string.h>

#include "copy.h"

#ifndef GP_LS64_EMULATE
#include <arm_acle.h>
#else
/* tests/test_copy_align.c: the same address logic on a CPU without LS64. */
typedef struct {
    uint64_t val[8];
} data512_t;
static inline data512_t __arm_ld64b(const void *p)
{
    data512_t v;
    memcpy(&v, p, 64);
    return v;
}
static inline void __arm_st64b(void *p, data512_t v) { memcpy(p, &v, 64); }
#endif

static inline __attribute__((always_inline)) void ls64_line_put(char *d, const char *s)
{
    data512_t v;
    memcpy(&v, s, 64);
    GP_MAP_TRACE(d, 64);
    __arm_st64b(d, v);
}

static inline __attribute__((always_inline)) void ls64_line_get(gp_line64 *buf, const char *line)
{
    GP_MAP_TRACE(line, 64);
    data512_t v = __arm_ld64b(line);
    memcpy(buf->b, &v, 64);
}

static inline __attribute__((always_inline)) void ls64_line_get_to(char *d, const char *line)
{
    GP_MAP_TRACE(line, 64);
    data512_t v = __arm_ld64b(line);
    memcpy(d, &v, 64);
}

static void ls64_to_mapping(void *dst, const void *src, size_t n)
{
    gp_arm_to_mapping(dst, src, n, ls64_line_put);
}

static void ls64_from_mapping(void *dst, const void *src, size_t n)
{
    gp_arm_from_mapping(dst, src, n, ls64_line_get, ls64_line_get_to);
}

const gp_copy_kernel gp_copy_ls64 = {
    .name = "ls64",
    .to_mapping = ls64_to_mapping,
    .from_mapping = ls64_from_mapping,
    .cpu_ok = gp_cpu_ok_ls64,
    .device_memory_only = 1,
};
