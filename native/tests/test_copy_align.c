/*
 * test_copy_align.c - every access the aligned-only kernels make to the
 * mapping is naturally aligned, inside the range the contract allows, and
 * (writes) touches each byte exactly once.
 *
 * Why: off x86 the mapping may fault on unaligned accesses (the NVIDIA
 * driver maps BAR1 Device-nGnRE on arm64: an unaligned access there is a
 * SIGBUS), which ordinary memory - all a test without the GPU has - never
 * shows.  So this file compiles the kernel sources itself with GP_MAP_TRACE
 * defined: each access to the mapping is reported (address, size) before it
 * is made, and checked here.  Kernels traced:
 *   - generic, forced onto its aligned write path (the one every non-x86
 *     target uses), on every architecture;
 *   - on aarch64: neon, and ls64 with LD64B/ST64B replaced by 64-byte memcpy
 *     (GP_LS64_EMULATE: the same address logic, runnable without FEAT_LS64).
 * Each is run for n = 0..320 at every dst and src misalignment 0..63 and for
 * a set of larger sizes, in both directions, and the data are checked too.
 * Prints one line per kernel and direction, then
 * "test_copy_align: N passed, M failed"; exits non-zero on any failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void trace_access(const void *p, size_t size);
#define GP_MAP_TRACE(addr, size) trace_access((const void *)(addr), (size_t)(size))

/* The kernels under their own names, so they do not clash with the
 * library's (linked for the CPU probes the kernel objects name). */
#define GP_FORCE_ALIGNED_MAPPING 1
#define gp_copy_generic traced_generic
#include "../src/copy/generic.c"
#undef gp_copy_generic
#if defined(__aarch64__)
#define gp_copy_neon traced_neon
#include "../src/copy/arm/neon.c"
#undef gp_copy_neon
#define GP_LS64_EMULATE 1
#define gp_copy_ls64 traced_ls64
#include "../src/copy/arm/ls64.c"
#undef gp_copy_ls64
#endif

#define MAXN 4200
#define AREA (MAXN + 512)

static unsigned char g_map[AREA] __attribute__((aligned(4096))); /* "the mapping" */
static unsigned char g_host[AREA] __attribute__((aligned(4096)));
static unsigned char g_hits[AREA]; /* accesses per mapping byte */
static uintptr_t g_lo, g_hi;       /* allowed range of this copy */
static unsigned long long g_pass, g_fail;
static char g_bad[200];

static void trace_access(const void *p, size_t size)
{
    uintptr_t a = (uintptr_t)p;
    uintptr_t base = (uintptr_t)g_map;
    if (g_bad[0])
        return;
    if (size == 0 || (size & (size - 1)) || a % size)
        snprintf(g_bad, sizeof g_bad, "unaligned %zu-byte access at mapping offset %ld", size,
                 (long)(a - base));
    else if (a < g_lo || a + size > g_hi)
        snprintf(g_bad, sizeof g_bad, "%zu-byte access at mapping offset %ld, outside the allowed "
                                      "[%ld, %ld)",
                 size, (long)(a - base), (long)(g_lo - base), (long)(g_hi - base));
    else
        for (size_t i = 0; i < size; i++)
            g_hits[a - base + i]++;
}

static void fail(const char *k, const char *dir, size_t n, size_t moff, size_t hoff,
                 const char *why)
{
    if (++g_fail <= 20)
        printf("FAIL %s %s n=%zu map+%zu host+%zu: %s\n", k, dir, n, moff, hoff, why);
}

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static unsigned char rnd(void)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (unsigned char)rng_state;
}

/* One copy of n bytes between g_map+moff and g_host+hoff, traced. */
static void one(const gp_copy_kernel *k, int to, size_t n, size_t moff, size_t hoff, int words8)
{
    unsigned char *m = g_map + 64 + moff, *h = g_host + 64 + hoff;
    for (size_t i = 0; i < AREA; i++)
        g_map[i] = rnd(), g_host[i] = rnd();
    unsigned char want[MAXN + 64];
    memcpy(want, to ? h : m, n);
    memset(g_hits, 0, sizeof g_hits);
    g_bad[0] = '\0';
    uintptr_t a = (uintptr_t)m;
    if (to) {
        g_lo = a, g_hi = a + n; /* exactly [dst, dst+n) */
        k->to_mapping(m, h, n);
    } else {
        uintptr_t g = words8 ? 8 : 64; /* generic: 8-byte words */
        g_lo = a & ~(g - 1), g_hi = (a + n + g - 1) & ~(g - 1);
        if (!n) g_lo = g_hi = a;
        k->from_mapping(h, m, n);
    }
    const char *dir = to ? "to_mapping" : "from_mapping";
    if (g_bad[0]) {
        fail(k->name, dir, n, moff, hoff, g_bad);
        return;
    }
    for (uintptr_t x = g_lo; x < g_hi; x++) {
        unsigned hits = g_hits[x - (uintptr_t)g_map];
        if (to ? hits != 1 : hits > 1) {
            char why[120];
            snprintf(why, sizeof why, "mapping byte at offset %ld accessed %u times",
                     (long)(x - (uintptr_t)g_map), hits);
            fail(k->name, dir, n, moff, hoff, why);
            return;
        }
    }
    if (memcmp(to ? m : h, want, n) != 0) {
        fail(k->name, dir, n, moff, hoff, "wrong data");
        return;
    }
    g_pass++;
}

static void run(const gp_copy_kernel *k, int words8)
{
    static const size_t big[] = {321, 511, 512, 513, 1000, 1023, 1024, 1025, 4095, 4096, 4097};
    for (int to = 1; to >= 0; to--) {
        unsigned long long p0 = g_pass, f0 = g_fail;
        for (size_t n = 0; n <= 320; n++)
            for (size_t mo = 0; mo < 64; mo++)
                one(k, to, n, mo, (mo * 7 + n) & 63, words8);
        for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
            for (size_t mo = 0; mo < 64; mo++)
                one(k, to, big[i], mo, (mo * 5 + 3) & 63, words8);
        printf("  %-8s %-12s %7llu passed, %llu failed\n", k->name, to ? "to_mapping" : "from_mapping",
               g_pass - p0, g_fail - f0);
    }
}

int main(void)
{
    printf("test_copy_align: every mapping access naturally aligned, in range, each byte "
           "written once\n");
    run(&traced_generic, 1);
#if defined(__aarch64__)
    run(&traced_neon, 0);
    run(&traced_ls64, 0); /* LD64B/ST64B emulated: their addresses are what is checked */
#endif
    printf("test_copy_align: %llu passed, %llu failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
