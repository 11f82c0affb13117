/*
 * arm/arm.h - the aarch64 kernels (neon.c, ls64.c), their CPU probes
 * (cpu.c) and, for the kernel files, the NEON building blocks they share.
 * Included by copy.h on aarch64 targets only.
 *
 * Every access these kernels make to the mapping is naturally aligned: the
 * NVIDIA driver maps BAR1 as Device-nGnRE on arm64 (fence.h), and Device
 * memory raises an alignment fault (SIGBUS) on any unaligned access, so the
 * x86 trick of overlapping unaligned head/tail stores is not available.
 * Device-nGnRE is also non-gathering: the CPU does not merge separate stores
 * into one PCIe write as x86 write-combining does, so the kernels use the
 * widest single instructions they have (64-byte LD1/ST1 of four Q registers,
 * or LD64B/ST64B, one 64-byte access each) on whole aligned lines.
 */
#ifndef GDRPY_COPY_ARM_H
#define GDRPY_COPY_ARM_H

GP_HIDDEN extern const gp_copy_kernel gp_copy_neon; /* arm/neon.c */
#ifdef GP_HAVE_LS64
GP_HIDDEN extern const gp_copy_kernel gp_copy_ls64; /* arm/ls64.c */
#endif

/* CPU probes from getauxval(AT_HWCAP / AT_HWCAP3); arm/cpu.c. */
GP_HIDDEN int gp_cpu_ok_neon(void); /* HWCAP_ASIMD */
GP_HIDDEN int gp_cpu_ok_ls64(void); /* HWCAP3_LS64 in AT_HWCAP3 (recent kernels only) */

#ifdef GP_COPY_KERNEL_TU
#include <arm_neon.h>

/* 1 <= n, dst in the mapping: naturally aligned stores only - scalar up to
 * a 16-byte boundary, then 16-byte Q stores, then scalar.  Each byte once. */
GP_INLINE void gp_arm_put_small(char *d, const char *s, size_t n)
{
    size_t head = (size_t)(-(uintptr_t)d & 15);
    if (head) {
        if (head > n)
            head = n;
        gp_put_aligned(d, s, head);
        d += head, s += head, n -= head;
    }
    for (; n >= 16; d += 16, s += 16, n -= 16) {
        GP_MAP_TRACE(d, 16);
        vst1q_u8((uint8_t *)d, vld1q_u8((const uint8_t *)s));
    }
    if (n)
        gp_put_aligned(d, s, n);
}

/* 1 <= n <= 64, neither side in the mapping (copies the wanted bytes out of
 * a gp_line64 bounce buffer): loop-free, overlapping, writes exactly
 * [d, d+n).  Ordinary memory takes unaligned accesses. */
GP_INLINE void gp_arm_mov_le64(char *d, const char *s, size_t n)
{
    if (n >= 16) {
        if (n >= 32) {
            uint8x16_t a = vld1q_u8((const uint8_t *)s);
            uint8x16_t b = vld1q_u8((const uint8_t *)s + 16);
            uint8x16_t c = vld1q_u8((const uint8_t *)s + n - 32);
            uint8x16_t e = vld1q_u8((const uint8_t *)s + n - 16);
            vst1q_u8((uint8_t *)d, a);
            vst1q_u8((uint8_t *)d + 16, b);
            vst1q_u8((uint8_t *)d + n - 32, c);
            vst1q_u8((uint8_t *)d + n - 16, e);
        } else {
            uint8x16_t a = vld1q_u8((const uint8_t *)s);
            uint8x16_t b = vld1q_u8((const uint8_t *)s + n - 16);
            vst1q_u8((uint8_t *)d, a);
            vst1q_u8((uint8_t *)d + n - 16, b);
        }
    } else {
        gp_mov_lt16(d, s, n);
    }
}

/* One aligned 64-byte line of the mapping as a single LD1 of four Q
 * registers. */
GP_INLINE uint8x16x4_t gp_arm_line_ld(const char *line)
{
    GP_MAP_TRACE(line, 64);
    return vld1q_u8_x4((const uint8_t *)line);
}

GP_INLINE void gp_arm_line_get_neon(gp_line64 *buf, const char *line)
{
    vst1q_u8_x4(buf->b, gp_arm_line_ld(line));
}

/* from_mapping over whole aligned lines, each read by `get` (one 64-byte
 * access: NEON LD1 x4 or LD64B) into a bounce buffer or straight to dst
 * through `get_to` (unaligned dst).  Same shape as the x86 kernels (copy.h
 * contract): the partial first and last lines are issued first. */
GP_INLINE void gp_arm_from_mapping(void *dst, const void *src, size_t n,
                                   void (*get)(gp_line64 *, const char *),
                                   void (*get_to)(char *, const char *))
{
    if (!n)
        return;
    char *d = dst;
    size_t off = (size_t)((uintptr_t)src & 63); /* src within its line */
    const char *p = (const char *)src - off;    /* first line */
    gp_line64 head, tail;
    gp_fence_before_loads();
    if (off + n <= 64) { /* one line */
        get(&head, p);
        gp_fence_after_loads();
        gp_arm_mov_le64(d, (const char *)head.b + off, n);
        return;
    }
    size_t tn = (size_t)(((uintptr_t)src + n) & 63); /* bytes wanted of a partial last line */
    const char *pe = (const char *)src + n - tn;     /* end of the whole lines */
    if (off)
        get(&head, p);
    if (tn)
        get(&tail, pe);
    if (off) {
        gp_arm_mov_le64(d, (const char *)head.b + off, 64 - off);
        d += 64 - off, p += 64;
    }
    for (; p != pe; p += 64, d += 64)
        get_to(d, p);
    gp_fence_after_loads();
    if (tn)
        gp_arm_mov_le64(d, (const char *)tail.b, tn);
}

/* to_mapping: scalar/Q stores up to a 64-byte boundary, whole lines with
 * `put` (one 64-byte store: NEON ST1 x4 or ST64B), scalar/Q stores after.
 * Ends with the store fence (DSB ST). */
GP_INLINE void gp_arm_to_mapping(void *dst, const void *src, size_t n,
                                 void (*put)(char *, const char *))
{
    if (!n)
        return;
    char *d = dst;
    const char *s = src;
    size_t head = (size_t)(-(uintptr_t)d & 63);
    if (head) {
        if (head > n)
            head = n;
        gp_arm_put_small(d, s, head);
        d += head, s += head, n -= head;
    }
    for (; n >= 64; n -= 64, d += 64, s += 64)
        put(d, s);
    if (n)
        gp_arm_put_small(d, s, n);
    gp_fence_after_stores();
}
#endif /* GP_COPY_KERNEL_TU */

#endif /* GDRPY_COPY_ARM_H */
