/*
 * rseq_put.c - restartable small writes for libgdrapi (see rseq_put.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "rseq_put.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "copy.h" /* gp_cpu_ok_avx2 */
#include "internal.h"


#ifndef MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ
#define MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ (1 << 7)
#define MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ (1 << 8)
#endif

#if defined(__x86_64__)
/* glibc >= 2.35 exports where its per-thread struct rseq lives (thread
 * pointer + __rseq_offset) and how large it is (__rseq_size, 0 when not
 * registered).  Looked up at run time, not linked: a versioned reference
 * would make the library require glibc 2.35 (RHEL 9 has 2.34). */
__attribute__((visibility("hidden"))) ptrdiff_t gp_rseq_off;

/*
 * The critical section, a C function (System V ABI).  Arguments: rdi slot,
 * rsi want, rdx dst, rcx src, r8 n, unchanged throughout, so that a refusal
 * can jump to gp_rseq_refused with them; r9 = this thread's struct rseq
 * (cpu_id at +4, rseq_cs at +8), r11 = the section's descriptor; r10, rax
 * and xmm0-3 (ymm0-1) are scratch.  It stores nothing to ordinary memory.
 * [start, post) is the section; the abort label is preceded by glibc's x86
 * signature 0x53053053, as the kernel requires.  Stores cover [dst, dst+n)
 * exactly: a size class's first and last piece (2, 4, 8 or 16 bytes,
 * overlapping), or one byte; 33..64 bytes is BIG33: four 16-byte stores
 * (SSE2) or two 32-byte ones (AVX2, as the copy kernels write that class).
 * S names the variant in its labels.
 */
#define GP_RSEQ_SECTION(NAME, S, BIG33)                                                                                   \
    __asm__("    .text\n"                                                                                                 \
            "    .p2align 5\n"                                                                                            \
            "    .globl " #NAME "\n"                                                                                      \
            "    .hidden " #NAME "\n"                                                                                     \
            "    .type " #NAME ", @function\n" #NAME ":\n"                                                                \
            "    .cfi_startproc\n"                                                                                        \
            "    movq gp_rseq_off(%rip), %r9\n"                                                                           \
            "    addq %fs:0, %r9\n"                                                                                       \
            "    leaq .Lcs_" S "(%rip), %r11\n"                                                                           \
            ".Lstart_" S ":\n"                                                                                            \
            "    cmpq %r11, 8(%r9)\n"                                                                                     \
            "    jne .Larm_" S "\n"                                                                                       \
            "    cmpq %rsi, (%rdi)\n"                                                                                     \
            "    jne .Lrefused_" S "\n"                                                                                   \
            "    movq %rdx, %r10\n"                                                                                       \
            "    subq 16(%rdi), %r10\n" /* r10 = dst - lo */                                                              \
            "    jb .Lrefused_" S "\n"                                                                                    \
            "    movq 24(%rdi), %rax\n" /* span */                                                                        \
            "    subq %r10, %rax\n"                                                                                       \
            "    jb .Lrefused_" S "\n"                                                                                    \
            "    cmpq %r8, %rax\n"                                                                                        \
            "    jb .Lrefused_" S "\n"                                                                                    \
            "    cmpq $32, %r8\n"                                                                                         \
            "    ja .Lbig_" S "\n"                                                                                        \
            "    cmpq $16, %r8\n"                                                                                         \
            "    jbe .Lle16_" S "\n"                                                                                      \
            "    movdqu (%rcx), %xmm0\n"                                                                                  \
            "    movdqu -16(%rcx,%r8), %xmm1\n"                                                                           \
            "    movdqu %xmm0, (%rdx)\n"                                                                                  \
            "    movdqu %xmm1, -16(%rdx,%r8)\n"                                                                           \
            "    jmp .Lfence_" S "\n"                                                                                     \
            ".Lle16_" S ":\n"                                                                                             \
            "    cmpq $8, %r8\n"                                                                                          \
            "    jb .Llt8_" S "\n"                                                                                        \
            "    movq (%rcx), %rax\n"                                                                                     \
            "    movq -8(%rcx,%r8), %r10\n"                                                                               \
            "    movq %rax, (%rdx)\n"                                                                                     \
            "    movq %r10, -8(%rdx,%r8)\n"                                                                               \
            "    jmp .Lfence_" S "\n"                                                                                     \
            ".Llt8_" S ":\n"                                                                                              \
            "    cmpq $4, %r8\n"                                                                                          \
            "    jb .Llt4_" S "\n"                                                                                        \
            "    movl (%rcx), %eax\n"                                                                                     \
            "    movl -4(%rcx,%r8), %r10d\n"                                                                              \
            "    movl %eax, (%rdx)\n"                                                                                     \
            "    movl %r10d, -4(%rdx,%r8)\n"                                                                              \
            "    jmp .Lfence_" S "\n"                                                                                     \
            ".Llt4_" S ":\n"                                                                                              \
            "    cmpq $2, %r8\n"                                                                                          \
            "    jb .Lone_" S "\n"                                                                                        \
            "    movzwl (%rcx), %eax\n"                                                                                   \
            "    movzwl -2(%rcx,%r8), %r10d\n"                                                                            \
            "    movw %ax, (%rdx)\n"                                                                                      \
            "    movw %r10w, -2(%rdx,%r8)\n"                                                                              \
            "    jmp .Lfence_" S "\n"                                                                                     \
            ".Lone_" S ":\n"                                                                                              \
            "    movzbl (%rcx), %eax\n"                                                                                   \
            "    movb %al, (%rdx)\n"                                                                                      \
            "    jmp .Lfence_" S "\n"                                                                                     \
            ".Lbig_" S ":\n" BIG33 ".Lfence_" S ":\n"                                                                     \
            "    sfence\n"                                                                                                \
            ".Lpost_" S ":\n"                                                                                             \
            "    xorl %eax, %eax\n"                                                                                       \
            "    ret\n"                                                                                                   \
            ".Lrefused_" S ":\n"                                                                                          \
            "    jmp gp_rseq_refused\n" /* Outside the section: (re)arm it.  A preemption between this                  \
             * store and the jump clears rseq_cs again (the IP is outside),                 \
             * which the compare at the start sees. */ \
            ".Larm_" S ":\n"                                                                                              \
            "    cmpl $0, 4(%r9)\n" /* cpu_id < 0: no rseq for this thread */                                             \
            "    jl .Lrefused_" S "\n"                                                                                    \
            "    movq %r11, 8(%r9)\n"                                                                                     \
            "    jmp .Lstart_" S "\n" /* Restarted (preempted, signalled or migrated inside the                       \
             * section; the kernel cleared rseq_cs): run it again. */   \
            "    .long 0x53053053\n"                                                                                      \
            ".Labort_" S ":\n"                                                                                            \
            "    jmp .Lstart_" S "\n"                                                                                     \
            "    .cfi_endproc\n"                                                                                          \
            "    .size " #NAME ", .-" #NAME "\n"                                                                          \
            "    .section .data.rel.ro.gp_rseq_cs, \"aw\"\n"                                                              \
            "    .balign 32\n"                                                                                            \
            ".Lcs_" S ":\n"                                                                                               \
            "    .long 0, 0\n" /* version, flags */                                                                       \
            "    .quad .Lstart_" S ", .Lpost_" S " - .Lstart_" S ", .Labort_" S "\n"                                      \
            "    .text\n")

GP_RSEQ_SECTION(gp_rseq_put, "sse2",
                "    movdqu (%rcx), %xmm0\n"
                "    movdqu 16(%rcx), %xmm1\n"
                "    movdqu -32(%rcx,%r8), %xmm2\n"
                "    movdqu -16(%rcx,%r8), %xmm3\n"
                "    movdqu %xmm0, (%rdx)\n"
                "    movdqu %xmm1, 16(%rdx)\n"
                "    movdqu %xmm2, -32(%rdx,%r8)\n"
                "    movdqu %xmm3, -16(%rdx,%r8)\n");

GP_RSEQ_SECTION(gp_rseq_put_avx2, "avx2",
                "    vmovdqu (%rcx), %ymm0\n"
                "    vmovdqu -32(%rcx,%r8), %ymm1\n"
                "    vmovdqu %ymm0, (%rdx)\n"
                "    vmovdqu %ymm1, -32(%rdx,%r8)\n"
                "    vzeroupper\n");

static int rseq_any_backend;

/* GDRPY_GDRAPI_RSEQ: unset or 1 = use restartable writes where possible,
 * 0 = never; for tests: force = also on mappings that can fault, sse2 = the
 * same with only the SSE2 section (to test it on an AVX2 CPU). */
static int rseq_wanted(void)
{
    const char *e = getenv("GDRPY_GDRAPI_RSEQ");
    if (!e || !*e || !strcmp(e, "1")) return GP_RSEQ_AVX2;
    if (!strcmp(e, "0")) return 0;
    if (!strcmp(e, "force")) {
        rseq_any_backend = 1;
        return GP_RSEQ_AVX2;
    }
    if (!strcmp(e, "sse2")) {
        rseq_any_backend = 1;
        return GP_RSEQ_SSE2;
    }
    gp_log(GP_LOG_CONFIG, "GDRPY_GDRAPI_RSEQ=%s is not 0, 1, force or sse2; using 1", e);
    return GP_RSEQ_AVX2;
}

int gp_rseq_any_backend(void)
{
    return rseq_any_backend;
}

int gp_rseq_init(void)
{
    int want = rseq_wanted();
    if (!want) return 0;
    const ptrdiff_t *off = dlsym(RTLD_DEFAULT, "__rseq_offset");
    const unsigned int *size = dlsym(RTLD_DEFAULT, "__rseq_size");
    /* __rseq_size counts the registered area's active fields: 20 in glibc
     * 2.35-2.39, 32 and more later, 0 when registration failed.  The section
     * uses cpu_id (+4) and rseq_cs (+8). */
    if (!off || !size || *size < 16) {
        gp_log(1, "gdrapi: rseq: glibc registered no rseq area; copies use per-thread records");
        return 0;
    }
    gp_rseq_off = *off;
    if (!gp_rseq_register()) return 0;
    return want == GP_RSEQ_AVX2 && gp_cpu_ok_avx2() ? GP_RSEQ_AVX2 : GP_RSEQ_SSE2;
}

int gp_rseq_register(void)
{
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ, 0, 0) != 0) {
        gp_log(1, "gdrapi: rseq: membarrier RSEQ registration failed (errno %d); copies use "
                  "per-thread records",
               errno);
        return 0;
    }
    return 1;
}

int gp_rseq_barrier(void)
{
    return (int)syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, 0, 0);
}

#else /* no restartable writes on this architecture yet */

int gp_rseq_any_backend(void)
{
    return 0;
}

int gp_rseq_init(void)
{
    return 0;
}

int gp_rseq_register(void)
{
    return 0;
}

int gp_rseq_barrier(void)
{
    errno = ENOSYS;
    return -1;
}

#endif
