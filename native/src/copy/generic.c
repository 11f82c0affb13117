/*
 * generic.c - portable C copy kernel ("generic"): the fallback that
 * runs on every CPU.  No intrinsics and no -m flags; every access to the
 * mapping is a volatile scalar access (at most 8 bytes), so the compiler can
 * neither turn the loops into a memcpy call (which might read or write the
 * mapping with whatever width and order it likes) nor merge, split or drop
 * accesses.
 * Reads: only the naturally aligned 8-byte words covering [src, src+n),
 * each with one aligned 8-byte load (no byte or unaligned loads: each plain
 * load from WC memory is its own uncached round trip, and an unaligned one
 * may be split in two); the partial first and last word go through a bounce
 * buffer (see the contract in copy.h for why reading the rest of an aligned
 * word is safe).
 * Writes: on x86 (WC memory takes any alignment) heads and tails are
 * overlapping unaligned stores; everywhere else every store to the mapping
 * is naturally aligned (gp_put_aligned), since Arm Device memory, POWER
 * cache-inhibited storage and RISC-V I/O regions fault (or trap to slow
 * emulation) on unaligned accesses.
 * Fences: fence.h, the architecture's own (this kernel used to issue its
 * store fence on x86 only, leaving other targets unordered).
 */
#define GP_COPY_KERNEL_TU 1
#include "copy.h"

/* Tests may force the aligned write path on x86 (tests/test_copy_align.c). */
#if defined(GP_FORCE_ALIGNED_MAPPING)
#undef GP_MAPPING_UNALIGNED_OK
#define GP_MAPPING_UNALIGNED_OK 0
#endif

/* Orders the stores to the mapping before what follows (fence.h: x86
 * SFENCE, as before; aarch64 DSB ST; ppc64le SYNC; riscv64 FENCE OW,IORW). */
static inline void generic_wc_fence(void)
{
    gp_fence_after_stores();
}

#if GP_MAPPING_UNALIGNED_OK
/* 8-byte words: volatile on the mapping side only. */
static inline void put8x2(char *d, const char *s)
{
    uint64_t a = *(const gp_u64u *)s, b = *(const gp_u64u *)(s + 8);
    *(volatile gp_u64u *)d = a;
    *(volatile gp_u64u *)(d + 8) = b;
}

/* 1 <= n <= 64, loop-free: the first and the last 16 or 32 bytes, as
 * overlapping 8-byte stores (n < 16: two overlapping scalar stores). */
static inline void generic_put_le64(char *d, const char *s, size_t n)
{
    if (n < 16) {
        gp_put_lt16(d, s, n);
    } else if (n <= 32) {
        put8x2(d, s);
        put8x2(d + n - 16, s + n - 16);
    } else {
        put8x2(d, s);
        put8x2(d + 16, s + 16);
        put8x2(d + n - 32, s + n - 32);
        put8x2(d + n - 16, s + n - 16);
    }
}
#else
/* 1 <= n <= 64 (or any n): naturally aligned stores only. */
static inline void generic_put_le64(char *d, const char *s, size_t n)
{
    gp_put_aligned(d, s, n);
}
#endif

static void generic_to_mapping(void *dst, const void *src, size_t n)
{
    char *d = dst;
    const char *s = src;
    if (n <= 64) {
        if (n) {
            generic_put_le64(d, s, n);
            generic_wc_fence();
        }
        return;
    }
    /* Head: up to the next 64-byte boundary of dst (a partial line). */
    size_t head = (size_t)(-(uintptr_t)d & 63);
    if (head) {
        generic_put_le64(d, s, head);
        d += head, s += head, n -= head;
    }
    /* Whole lines, eight aligned 8-byte stores each, in address order so
     * that the line leaves the WC buffer as one burst. */
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        volatile gp_u64a *q = (volatile gp_u64a *)(void *)d;
        const gp_u64u *p = (const gp_u64u *)s;
        uint64_t a = p[0], b = p[1], c = p[2], e = p[3];
        uint64_t f = p[4], g = p[5], h = p[6], i = p[7];
        for (int t_ = 0; t_ < 8; t_++)
            GP_MAP_TRACE(q + t_, 8);
        q[0] = a;
        q[1] = b;
        q[2] = c;
        q[3] = e;
        q[4] = f;
        q[5] = g;
        q[6] = h;
        q[7] = i;
    }
    if (n)
        generic_put_le64(d, s, n);
    generic_wc_fence();
}

/* Reads only the aligned 8-byte words covering [src, src+n), each once: the
 * first and the last word before the interior ones. */
static void generic_from_mapping(void *dst, const void *src, size_t n)
{
    if (!n)
        return;
    char *d = dst;
    size_t off = (size_t)((uintptr_t)src & 7); /* src within its word */
    const volatile gp_u64a *p =
        (const volatile gp_u64a *)(const void *)((const char *)src - off);
    size_t nw = (off + n + 7) / 8; /* words covering, >= 1 */
    uint64_t buf[2];               /* bounce: first, last word */
    gp_fence_before_loads();
    if (nw == 1) {
        GP_MAP_TRACE(p, 8);
        buf[0] = p[0];
        gp_fence_after_loads();
        gp_mov_lt16(d, (const char *)buf + off, n);
        return;
    }
    GP_MAP_TRACE(p, 8);
    GP_MAP_TRACE(p + nw - 1, 8);
    buf[0] = p[0];
    buf[1] = p[nw - 1];
    gp_mov_lt16(d, (const char *)buf + off, 8 - off);
    d += 8 - off;
    const volatile gp_u64a *q = p + 1, *qe = p + nw - 1;
    for (; qe - q >= 8; q += 8, d += 64) {
        for (int t_ = 0; t_ < 8; t_++)
            GP_MAP_TRACE(q + t_, 8);
        uint64_t a = q[0], b = q[1], c = q[2], e = q[3];
        uint64_t f = q[4], g = q[5], h = q[6], i = q[7];
        gp_u64u *o = (gp_u64u *)d;
        o[0] = a;
        o[1] = b;
        o[2] = c;
        o[3] = e;
        o[4] = f;
        o[5] = g;
        o[6] = h;
        o[7] = i;
    }
    for (; q != qe; q++, d += 8) {
        GP_MAP_TRACE(q, 8);
        *(gp_u64u *)d = *q;
    }
    gp_fence_after_loads();
    gp_mov_lt16(d, (const char *)&buf[1], off + n - 8 * (nw - 1));
}

static int generic_cpu_ok(void) { return 1; }

const gp_copy_kernel gp_copy_generic = {
    .name = "generic",
    .to_mapping = generic_to_mapping,
    .from_mapping = generic_from_mapping,
    .cpu_ok = generic_cpu_ok,
};
