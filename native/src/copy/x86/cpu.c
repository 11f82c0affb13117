/*
 * x86/cpu.c - the x86-64 kernel set: CPU probes (CPUID + XGETBV), the
 * kernels in preference order, and what "auto" picks.  Compiled without -m
 * flags: nothing here may use an instruction the oldest x86-64 CPU lacks.
 * (Moved out of dispatch.c unchanged when the aarch64 kernels came; the
 * preference order and its reasons are at the top of dispatch.c.)
 */
#include <cpuid.h>
#include <pthread.h>
#include <stdio.h>

#include "copy.h"

/* ---- CPU features ----------------------------------------------------- */
static struct {
    int sse41, avx2, avx512, movdir64b;
    int avx512_downclocks; /* 512-bit stores lower the core clock */
} g_cpu;
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void cpu_probe(void)
{
    unsigned a, b, c, d, vendor_ebx = 0;
    unsigned max_leaf = __get_cpuid_max(0, &vendor_ebx);
    if (max_leaf < 1)
        return;
    __cpuid(1, a, b, c, d);
    unsigned family = (a >> 8) & 0xf, model = (a >> 4) & 0xf;
    if (family == 6 || family == 15)
        model |= ((a >> 16) & 0xf) << 4;
    if (family == 15)
        family += (a >> 20) & 0xff;
    int sse41 = (c >> 19) & 1;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    int ymm_on = (xcr0 & 0x6) == 0x6;   /* XMM | YMM state */
    int zmm_on = (xcr0 & 0xe6) == 0xe6; /* + opmask, ZMM_Hi256, Hi16_ZMM */
    unsigned b7 = 0, c7 = 0;
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b7, c7, d);
    }
    g_cpu.sse41 = sse41;
    g_cpu.avx2 = avx && ymm_on && ((b7 >> 5) & 1);
    g_cpu.avx512 = g_cpu.avx2 && zmm_on && ((b7 >> 16) & 1) && ((b7 >> 30) & 1);
    g_cpu.movdir64b = g_cpu.avx2 && ((c7 >> 28) & 1);
    /* "GenuineIntel": ebx = "Genu" */
    g_cpu.avx512_downclocks = vendor_ebx == 0x756e6547u && family == 6 && model == 0x55;
    gp_log(1, "cpu: family %u model 0x%x sse41 %d avx2 %d avx512 %d movdir64b %d%s",
           family, model, g_cpu.sse41, g_cpu.avx2, g_cpu.avx512, g_cpu.movdir64b,
           g_cpu.avx512_downclocks ? " (avx512 lowers the clock here)" : "");
}

int gp_cpu_ok_sse41(void)
{
    pthread_once(&g_cpu_once, cpu_probe);
    return g_cpu.sse41;
}
int gp_cpu_ok_avx2(void)
{
    pthread_once(&g_cpu_once, cpu_probe);
    return g_cpu.avx2;
}
int gp_cpu_ok_avx512(void)
{
    pthread_once(&g_cpu_once, cpu_probe);
    return g_cpu.avx512;
}
int gp_cpu_ok_movdir64b(void)
{
    pthread_once(&g_cpu_once, cpu_probe);
    return g_cpu.movdir64b;
}

/* ---- kernel set ------------------------------------------------------- */
/* Preference order (see the top of dispatch.c). */
const gp_copy_kernel *const gp_arch_kernels[] = {
    &gp_copy_avx512,
    &gp_copy_avx2,
    &gp_copy_movdir64b,
    &gp_copy_sse41,
    &gp_copy_generic,
};
const size_t gp_arch_nkernels = sizeof gp_arch_kernels / sizeof gp_arch_kernels[0];

const char gp_arch_known_names[] = "auto, avx512, avx2, movdir64b, sse41, generic";


const gp_copy_kernel *gp_arch_auto_kernel(void)
{
    pthread_once(&g_cpu_once, cpu_probe);
    if (gp_copy_avx512.cpu_ok() && !g_cpu.avx512_downclocks)
        return &gp_copy_avx512;
    if (gp_copy_avx2.cpu_ok())
        return &gp_copy_avx2;
    if (gp_copy_sse41.cpu_ok())
        return &gp_copy_sse41;
    return &gp_copy_generic;
}

void gp_arch_fill_notes(void)
{
    pthread_once(&g_cpu_once, cpu_probe);
    if (!g_cpu.avx512)
        gp_copy_note("avx512: this CPU lacks AVX-512F/BW (or the OS has not enabled ZMM state)\n");
    else if (g_cpu.avx512_downclocks)
        gp_copy_note("avx512: not chosen by auto: this CPU lowers its clock for 512-bit instructions\n");
    if (!g_cpu.avx2)
        gp_copy_note("avx2: this CPU lacks AVX2 (or the OS has not enabled YMM state)\n");
    if (!g_cpu.movdir64b)
        gp_copy_note("movdir64b: this CPU lacks MOVDIR64B\n");
    else
        gp_copy_note("movdir64b: selectable, never chosen by auto (its BAR1 bandwidth is unmeasured)\n");
    if (!g_cpu.sse41)
        gp_copy_note("sse41: this CPU lacks SSE4.1\n");
}
