/*
 * copy.h - copy kernels: the kernel objects, the dispatcher's helpers for
 * tests, the per-architecture kernel set, and (for the kernel files only)
 * the small loop-free building blocks they share.  Not installed; nothing
 * here is ABI.  Architecture-specific kernels live in x86/ and arm/, each
 * with its own header (x86/x86.h, arm/arm.h), included at the end of this
 * one for the target being built; fence.h holds the ordering instructions.
 *
 * Kernel contract (every gp_copy_<isa>):
 *  - to_mapping(dst, src, n): dst is write-combined (WC) or device memory.
 *    Writes exactly the bytes [dst, dst+n) and reads only [src, src+n), in
 *    any alignment; overlapping stores are only ever used inside that range
 *    and always carry the same data, so their order does not matter.  Ends
 *    with the architecture's store fence (fence.h: SFENCE on x86, DSB ST on
 *    aarch64) when n > 0, so the stores are ordered before whatever the
 *    caller does next.  n == 0 touches nothing.  Where the mapping does not
 *    tolerate unaligned accesses (everywhere but x86: Arm Device memory
 *    faults on them, see fence.h) every access to dst is naturally aligned
 *    and no byte of the mapping is written twice.
 *  - from_mapping(dst, src, n): src is WC or device memory.  Writes exactly
 *    the bytes [dst, dst+n), in any alignment.  Reads the source only as
 *    whole naturally aligned 64-byte lines, those covering
 *    [round_down(src, 64), round_up(src+n, 64)), each with loads issued
 *    back to back (x86: streaming loads, MOVNTDQA family: 4 x 16 B,
 *    2 x 32 B or 1 x 64 B; aarch64: one 64-byte NEON LD1 or one LD64B), so
 *    that each line is one PCIe read into a streaming-load (line-fill)
 *    buffer: n bytes cost one read per line they touch, not one per load
 *    instruction (a plain load from WC memory is its own uncached round
 *    trip, ~1 us on BAR1, and two plain loads of one line are two round
 *    trips).  Interior lines stream straight to dst; the first and last line,
 *    when only partly wanted, go through a 64-byte aligned bounce buffer on
 *    the stack and only the wanted bytes are copied out.  n <= 64 inside one
 *    line is exactly one line read, across two lines two; the head and tail
 *    lines are issued before the interior, so that they are in flight
 *    together.  The generic kernel (portable C, plain loads only) reads the
 *    whole naturally aligned 8-byte words covering the range instead.
 *    Reading bytes outside [src, src+n) but inside those lines/words is by
 *    design and safe: an aligned 64-byte line (or 8-byte word) never crosses
 *    a 4 KiB page, let alone a mapping (mappings are page-granular; BAR1
 *    pages are 64 KiB), so it cannot fault where [src, src+n) does not, and
 *    reads of BAR1 have no side effects (plain memory behind the BAR, no
 *    registers); the extra bytes only ride along in a read that happens
 *    anyway.  Nothing beyond those lines is ever read.  n == 0 touches
 *    nothing.  Where the architecture needs them (fence.h), the loads are
 *    fenced against the caller's earlier loads and later loads and stores.
 *  - Thread-safe and reentrant: no state at all.
 */
#ifndef GDRPY_COPY_H
#define GDRPY_COPY_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* ---- kernels (one file each) ------------------------------------------ */
GP_HIDDEN extern const gp_copy_kernel gp_copy_generic; /* generic.c, every target */
/* The per-architecture kernels are declared in x86/x86.h and arm/arm.h. */

/* ---- dispatcher helpers (dispatch.c) ----------------------------------- */
/* The kernel called `name` (case-insensitive: "generic" and this target's
 * kernels: x86 "sse41", "avx2", "avx512", "movdir64b"; aarch64 "neon",
 * "ls64"), whether or not this CPU can run it; NULL if the name is unknown
 * (also for "auto").  Check ->cpu_ok() before calling. */
GP_HIDDEN const gp_copy_kernel *gp_copy_kernel_by_name(const char *name);
/* All kernels, in the dispatcher's preference order; *count gets the number. */
GP_HIDDEN const gp_copy_kernel *const *gp_copy_kernel_list(size_t *count);
/* The kernel that "auto" selects on this CPU (never NULL). */
GP_HIDDEN const gp_copy_kernel *gp_copy_auto_kernel(void);

/* ---- the target's kernel set (x86/cpu.c, arm/cpu.c; dispatch.c holds the
 * generic-only set of the other architectures) --------------------------- */
/* This target's kernels in preference order, generic last. */
GP_HIDDEN extern const gp_copy_kernel *const gp_arch_kernels[];
GP_HIDDEN extern const size_t gp_arch_nkernels;
/* What "auto" picks on this CPU (never NULL; only kernels whose cpu_ok()
 * says yes). */
GP_HIDDEN const gp_copy_kernel *gp_arch_auto_kernel(void);
/* "auto, <name>, ..." for messages. */
GP_HIDDEN extern const char gp_arch_known_names[];
/* Says, with gp_copy_note(), one line per kernel this target knows of that
 * cannot run here, was not compiled, or that auto never picks, with the
 * reason ("ls64: ...\n"); nothing when there is nothing to say.  Called
 * once, by gdrpy_copy_isa_notes(). */
GP_HIDDEN void gp_arch_fill_notes(void);
/* Appends one printf-formatted note to gdrpy_copy_isa_notes()'s text
 * (dispatch.c; truncated at 512 bytes). */
GP_HIDDEN void gp_copy_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ======================================================================= */
#ifdef GP_COPY_KERNEL_TU
/* Shared building blocks, compiled into each kernel file with that file's
 * -m flags (static inline: every file gets its own copy). */

#define GP_INLINE static inline __attribute__((always_inline))

#include "fence.h"

/* Test hook: tests/test_copy_align.c compiles the kernel sources with
 * GP_MAP_TRACE defined to record every access the non-x86 kernels make to
 * the mapping (address, size), and checks that each is naturally aligned
 * and inside the range the contract allows.  Nothing in normal builds. */
#ifndef GP_MAP_TRACE
#define GP_MAP_TRACE(addr, size) ((void)0)
#endif

/* Unaligned scalar access without UB; volatile where the access touches the
 * mapping, so that the compiler neither merges, splits nor drops it. */
typedef uint16_t gp_u16u __attribute__((aligned(1), may_alias));
typedef uint32_t gp_u32u __attribute__((aligned(1), may_alias));
typedef uint64_t gp_u64u __attribute__((aligned(1), may_alias));
typedef uint64_t gp_u64a __attribute__((may_alias)); /* 8-byte aligned */

/* 1 <= n <= 15: two overlapping accesses of the largest power of two <= n
 * (one for n == 1), loop-free; for n == 8 two loads and two stores to the
 * same address.  Writes exactly [d, d+n).  `to_map` (a constant at every
 * call) makes the stores volatile, for a dst in the mapping; unaligned, so
 * only for mappings that allow it (GP_MAPPING_UNALIGNED_OK, x86 WC memory).
 * Plain (to_map 0), the read kernels copy the wanted bytes out of a bounce
 * buffer with it. */
#define GP_ST(T, p, v, to_map) \
    ((to_map) ? (void)(*(volatile T *)(p) = (v)) : (void)(*(T *)(p) = (v)))
GP_INLINE void gp_lt16(char *d, const char *s, size_t n, int to_map)
{
    if (n >= 8) {
        uint64_t a = *(const gp_u64u *)s, b = *(const gp_u64u *)(s + n - 8);
        GP_ST(gp_u64u, d, a, to_map);
        GP_ST(gp_u64u, d + n - 8, b, to_map);
    } else if (n >= 4) {
        uint32_t a = *(const gp_u32u *)s, b = *(const gp_u32u *)(s + n - 4);
        GP_ST(gp_u32u, d, a, to_map);
        GP_ST(gp_u32u, d + n - 4, b, to_map);
    } else if (n >= 2) {
        uint16_t a = *(const gp_u16u *)s, b = *(const gp_u16u *)(s + n - 2);
        GP_ST(gp_u16u, d, a, to_map);
        GP_ST(gp_u16u, d + n - 2, b, to_map);
    } else {
        GP_ST(uint8_t, d, *(const uint8_t *)s, to_map);
    }
}
#undef GP_ST
#define gp_put_lt16(d, s, n) gp_lt16((d), (s), (n), 1)
#define gp_mov_lt16(d, s, n) gp_lt16((d), (s), (n), 0)

/* n >= 0 bytes to the mapping with naturally aligned scalar stores only
 * (1, 2, 4 and 8 bytes), each byte written once, in address order: up to
 * three stores bring dst to an 8-byte boundary, whole words follow, up to
 * three stores finish.  For mappings that fault on unaligned accesses (Arm
 * Device memory, POWER cache-inhibited storage, RISC-V I/O regions).  The
 * source side may be unaligned (ordinary memory). */
GP_INLINE void gp_put_aligned(char *d, const char *s, size_t n)
{
    if (((uintptr_t)d & 1) && n >= 1) {
        GP_MAP_TRACE(d, 1);
        *(volatile uint8_t *)d = *(const uint8_t *)s;
        d += 1, s += 1, n -= 1;
    }
    if (((uintptr_t)d & 2) && n >= 2) {
        GP_MAP_TRACE(d, 2);
        *(volatile uint16_t *)(void *)d = *(const gp_u16u *)s;
        d += 2, s += 2, n -= 2;
    }
    if (((uintptr_t)d & 4) && n >= 4) {
        GP_MAP_TRACE(d, 4);
        *(volatile uint32_t *)(void *)d = *(const gp_u32u *)s;
        d += 4, s += 4, n -= 4;
    }
    /* Either d is 8-byte aligned now, or a step was skipped because fewer
     * bytes than its size were left; then every step below is no larger
     * than the alignment d already has. */
    for (; n >= 8; d += 8, s += 8, n -= 8) {
        GP_MAP_TRACE(d, 8);
        *(volatile uint64_t *)(void *)d = *(const gp_u64u *)s;
    }
    if (n >= 4) {
        GP_MAP_TRACE(d, 4);
        *(volatile uint32_t *)(void *)d = *(const gp_u32u *)s;
        d += 4, s += 4, n -= 4;
    }
    if (n >= 2) {
        GP_MAP_TRACE(d, 2);
        *(volatile uint16_t *)(void *)d = *(const gp_u16u *)s;
        d += 2, s += 2, n -= 2;
    }
    if (n) {
        GP_MAP_TRACE(d, 1);
        *(volatile uint8_t *)d = *(const uint8_t *)s;
    }
}

/* One 64-byte line of the mapping, as the read kernels stage it: the first
 * and last line of a copy land here whole, and the wanted bytes are copied
 * out.  64-byte aligned, so the line is stored with aligned vector stores
 * (one cache line of the stack). */
typedef union {
    unsigned char b[64];
    uint64_t w[8];
} __attribute__((aligned(64))) gp_line64;

/* The body every vector read kernel shares, as a function definition
 * (QUAL: static, or GP_INLINE for a body more than one kernel calls).  Only
 * the aligned 64-byte lines covering [src, src+n) are read, each once: a
 * partial first or last line lands whole in a gp_line64 (LINE_GET(buf,
 * line)) and its wanted bytes are copied out (MOV_LE64(d, s, n), 1 <= n <=
 * 64); both partial lines are read first, so that their reads are in flight
 * together (and with the interior's); whole lines go straight to dst
 * (LINES(d, p, pe) copies [p, pe), a multiple of 64 bytes, and returns the
 * new d). */
#define GP_DEFINE_FROM_MAPPING(QUAL, name, LINE_GET, MOV_LE64, LINES)                   \
    QUAL void name(void *dst, const void *src, size_t n)                                \
    {                                                                                   \
        if (!n)                                                                         \
            return;                                                                     \
        char *d = dst;                                                                  \
        size_t off = (size_t)((uintptr_t)src & 63); /* src within its line */           \
        const char *p = (const char *)src - off;    /* first line */                    \
        gp_line64 head, tail;                                                           \
        if (off + n <= 64) { /* one line */                                             \
            LINE_GET(&head, p);                                                         \
            MOV_LE64(d, (const char *)head.b + off, n);                                 \
            return;                                                                     \
        }                                                                               \
        size_t tn = (size_t)(((uintptr_t)src + n) & 63); /* wanted of a partial last */ \
        const char *pe = (const char *)src + n - tn;     /* end of the whole lines */   \
        if (off)                                                                        \
            LINE_GET(&head, p);                                                         \
        if (tn)                                                                         \
            LINE_GET(&tail, pe);                                                        \
        if (off) {                                                                      \
            MOV_LE64(d, (const char *)head.b + off, 64 - off);                          \
            d += 64 - off, p += 64;                                                     \
        }                                                                               \
        d = LINES(d, p, pe);                                                            \
        if (tn)                                                                         \
            MOV_LE64(d, (const char *)tail.b, tn);                                      \
    }


#endif /* GP_COPY_KERNEL_TU */

/* The target's kernels, their CPU probes and (in kernel files) their
 * building blocks. */
#if defined(__x86_64__) || defined(__i386__)
#include "x86/x86.h"
#elif defined(__aarch64__)
#include "arm/arm.h"
#endif

#endif /* GDRPY_COPY_H */
