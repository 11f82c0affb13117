/*
 * arm/cpu.c - the aarch64 kernel set: CPU probes from the ELF auxiliary
 * vector (getauxval: what the kernel says this CPU can do; user space cannot
 * read the ID registers portably), the kernels in preference order, what
 * "auto" picks, and why the others are not used.
 *
 * Auto: neon where the CPU reports ASIMD (every AArch64 server CPU does),
 * else generic.  ls64 is never auto (arm/ls64.c says why).
 */
#include <pthread.h>
#include <stdio.h>
#include <sys/auxv.h>

#include "copy.h"

/* The Linux arm64 uapi values (asm/hwcap.h), defined here in case the
 * build's headers predate them. */
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1UL << 1)
#endif
#ifndef AT_HWCAP3
#define AT_HWCAP3 29
#endif
#ifndef HWCAP3_LS64
#define HWCAP3_LS64 (1UL << 3)
#endif

static struct {
    int asimd, ls64;
} g_cpu;
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

static void cpu_probe(void)
{
    unsigned long hw = getauxval(AT_HWCAP);
    /* getauxval returns 0 for a type the kernel does not supply (older
     * kernels have no AT_HWCAP3): then LS64 is not reported. */
    unsigned long hw3 = getauxval(AT_HWCAP3);
    g_cpu.asimd = (hw & HWCAP_ASIMD) != 0;
    g_cpu.ls64 = (hw3 & HWCAP3_LS64) != 0;
    gp_log(1, "cpu: aarch64 hwcap 0x%lx hwcap3 0x%lx asimd %d ls64 %d", hw, hw3, g_cpu.asimd,
           g_cpu.ls64);
}

int gp_cpu_ok_neon(void)
{
    pthread_once(&g_cpu_once, cpu_probe);
    return g_cpu.asimd;
}
int gp_cpu_ok_ls64(void)
{
    pthread_once(&g_cpu_once, cpu_probe);
    return g_cpu.ls64;
}

/* ---- kernel set ------------------------------------------------------- */
const gp_copy_kernel *const gp_arch_kernels[] = {
    &gp_copy_neon,
#ifdef GP_HAVE_LS64
    &gp_copy_ls64,
#endif
    &gp_copy_generic,
};
const size_t gp_arch_nkernels = sizeof gp_arch_kernels / sizeof gp_arch_kernels[0];

#ifdef GP_HAVE_LS64
const char gp_arch_known_names[] = "auto, neon, ls64, generic";
#else
const char gp_arch_known_names[] = "auto, neon, generic";
#endif


const gp_copy_kernel *gp_arch_auto_kernel(void)
{
    if (gp_copy_neon.cpu_ok())
        return &gp_copy_neon;
    return &gp_copy_generic;
}

void gp_arch_fill_notes(void)
{
    pthread_once(&g_cpu_once, cpu_probe);
    if (!g_cpu.asimd)
        gp_copy_note("neon: the CPU does not report ASIMD (HWCAP_ASIMD in AT_HWCAP)\n");
#ifdef GP_HAVE_LS64
    if (!g_cpu.ls64)
        gp_copy_note("ls64: compiled in, but the kernel does not report LS64 for this CPU "
                     "(HWCAP3_LS64 in AT_HWCAP3: a CPU without FEAT_LS64, or a kernel too old "
                     "to report it)\n");
    else
        gp_copy_note("ls64: selectable (GDRPY_COPY_ISA=ls64), never chosen by auto: LD64B/ST64B "
                     "fault on ordinary cacheable memory (sim backend, host buffers); BAR1 "
                     "mappings only, unmeasured\n");
#else
    gp_copy_note("ls64: not compiled in: the compiler could not build LD64B/ST64B "
                 "(-march=armv8.7-a+ls64 with arm_acle.h's __arm_ld64b/__arm_st64b; GCC >= 12 "
                 "or a recent Clang can)\n");
#endif
}
