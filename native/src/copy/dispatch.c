/*
 * dispatch.c - run-time selection of the copy kernel, and the public copy
 * entry points.  Architecture-neutral: the target's kernel set (its kernels
 * in preference order, its CPU probes, what "auto" picks) comes from
 * x86/cpu.c or arm/cpu.c, chosen by the Makefile from the compiler's
 * target; other architectures get the generic kernel only (below).
 * Compiled without -m flags: nothing here may use an instruction the
 * target's oldest CPU lacks (the kernels live in <arch>/<isa>.c, each
 * compiled with its own flags, and are only called after their cpu_ok()
 * said yes).
 *
 * Dispatch is filled once, by a constructor (and, should a copy run before
 * constructors have, by the first call through pthread_once).  The hot path
 * gdrpy_copy_to_mapping / gdrpy_copy_from_mapping is one relaxed load of a
 * function pointer and a tail call through it: no lock, no getenv, no
 * branch.  gdrpy_set_copy_isa() may swap the pointers while other threads
 * copy; each copy runs wholly on the old or the new kernel (both are valid).
 *
 * x86-64 auto order, and why (best of several runs on one H100 80GB HBM3
 * host: a VM, Linux 6.18, NVIDIA open kernel module 580.159.04, CUDA 13.0
 * driver API, a CPU with AVX-512 and a 2.1 GHz TSC):
 *  1. avx512 - on that H100 host AVX-512 non-temporal stores reach the same
 *     BAR1 write bandwidth as AVX2 (18.1-19.1 vs 17.8-19.0 GB/s at 1 MiB,
 *     15.8-16.9 vs 16.3 at 64 MiB: the PCIe/WC-buffer limit, not the ISA),
 *     and 64-byte streaming loads read BAR1 15-20 % faster (0.84-1.01 vs
 *     0.73-0.82 GB/s at 1 MiB, 0.69-0.72 vs 0.61 at 64 MiB).  A 64-byte
 *     store also fills a whole WC buffer in one instruction.  The usual
 *     objection to AVX-512 (GDRCopy does not dispatch it) is the frequency
 *     drop and the ZMM warm-up: our kernel's writes touch ZMM only in
 *     their bulk loops, never for messages <= 64 bytes (the write latency
 *     path, tens of ns); its reads use one 64-byte VMOVNTDQA per line at
 *     every size, because there each line costs a ~1 us PCIe round trip
 *     that dwarfs any warm-up, and one load instruction per line is one read
 *     request by construction.  We skip it on the CPUs where even "light"
 *     512-bit instructions lower the core clock (Intel Skylake-SP/X, Cascade
 *     Lake, Cooper Lake: family 6 model 0x55).  Ice Lake-SP and later Intel,
 *     and AMD Zen 4/5 take it.
 *
 * Read strategy (every kernel, details in copy.h): from_mapping reads only
 * whole naturally aligned 64-byte lines covering [src, src+n), each with
 * streaming loads issued back to back, so a read costs one PCIe round trip
 * per line it touches (1..64 bytes inside one line: one read) instead of one
 * per load instruction; partial first/last lines go through a bounce buffer
 * and only the wanted bytes reach dst.  Over-reading inside an aligned line
 * cannot fault (a line never crosses a page) and BAR1 reads have no side
 * effects.  generic, with plain loads only, reads whole aligned 8-byte
 * words instead.
 *  2. avx2 - the default elsewhere; equal to avx512 for writes.
 *  3. sse41, 4. generic - older CPUs / last resort.
 *  movdir64b is compiled, tested and selectable (GDRPY_COPY_ISA=movdir64b or
 *  gdrpy_set_copy_isa) but not chosen by auto: its BAR1 bandwidth has not
 *  been measured on that H100 host (we do not know whether its CPU has
 *  it), and a MOVDIR64B is a microcoded read-64/write-64 whose throughput
 *  varies by core.  Run
 *  `gdrpy_copylat --isa all` on the host; promote it here if it wins -
 *  for bulk only: on the H200 hosts (their CPUs have it) one MOVDIR64B
 *  flag store + SFENCE made a GPU round trip 4.5-5.5 us against 1.6-1.8
 *  for a WC store.
 *
 * aarch64 (arm/cpu.c): neon (ASIMD, HWCAP_ASIMD), then generic.  ls64
 * (LD64B/ST64B, HWCAP3_LS64) is compiled where the compiler can and is
 * selectable, never chosen by auto: those instructions fault on Normal
 * cacheable memory (the sim backend, host buffers) and are unmeasured on
 * BAR1.  Reasons for kernels that cannot run are in gdrpy_copy_isa_notes().
 */

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "copy.h"
#include "fence.h" /* GP_ARCH_NAME; stops the build on an architecture without fences */

/* ---- kernel set of architectures without their own kernels ------------ */
#if !defined(__x86_64__) && !defined(__i386__) && !defined(__aarch64__)
/* fence.h has stopped the build already where it knows no fences. */
const gp_copy_kernel *const gp_arch_kernels[] = {&gp_copy_generic};
const size_t gp_arch_nkernels = 1;
const char gp_arch_known_names[] = "auto, generic";
const gp_copy_kernel *gp_arch_auto_kernel(void) { return &gp_copy_generic; }
void gp_arch_fill_notes(void)
{
    gp_copy_note("generic: the only kernel for this architecture (" GP_ARCH_NAME ")\n");
}
#endif

/* ---- kernel table ----------------------------------------------------- */
#define GP_KNOWN_NAMES gp_arch_known_names

const gp_copy_kernel *const *gp_copy_kernel_list(size_t *count)
{
    if (count)
        *count = gp_arch_nkernels;
    return gp_arch_kernels;
}

const gp_copy_kernel *gp_copy_kernel_by_name(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < gp_arch_nkernels; i++)
        if (strcasecmp(name, gp_arch_kernels[i]->name) == 0)
            return gp_arch_kernels[i];
    return NULL;
}

const gp_copy_kernel *gp_copy_auto_kernel(void)
{
    return gp_arch_auto_kernel();
}

/* ---- dispatch state --------------------------------------------------- */
static void to_first_call(void *dst, const void *src, size_t n);
static void from_first_call(void *dst, const void *src, size_t n);

/* Read with relaxed atomic loads on the hot path (a plain load: mov on
 * x86, ldr on aarch64). */
static gp_copy_fn g_to = to_first_call;
static gp_copy_fn g_from = from_first_call;
static const gp_copy_kernel *g_active;
static const gp_copy_kernel *g_auto;
static char g_available[64];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_set_lock = PTHREAD_MUTEX_INITIALIZER;

static void activate(const gp_copy_kernel *k)
{
    __atomic_store_n(&g_to, k->to_mapping, __ATOMIC_RELAXED);
    __atomic_store_n(&g_from, k->from_mapping, __ATOMIC_RELAXED);
    __atomic_store_n(&g_active, k, __ATOMIC_RELEASE);
}

static void copy_init(void)
{
    size_t len = 0;
    g_available[0] = '\0';
    for (size_t i = 0; i < gp_arch_nkernels; i++) {
        const gp_copy_kernel *ki = gp_arch_kernels[i];
        if (!ki->cpu_ok())
            continue;
        int w = snprintf(g_available + len, sizeof g_available - len, "%s%s",
                         len ? "," : "", ki->name);
        if (w > 0 && (size_t)w < sizeof g_available - len)
            len += (size_t)w;
    }
    g_auto = gp_copy_auto_kernel();

    const gp_copy_kernel *k = g_auto;
    const char *env = getenv("GDRPY_COPY_ISA");
    if (env && *env && strcasecmp(env, "auto") != 0) {
        const gp_copy_kernel *e = gp_copy_kernel_by_name(env);
        if (!e)
            gp_log(GP_LOG_CONFIG, "GDRPY_COPY_ISA=%.40s: unknown copy kernel (known: %s); using auto (%s)",
                   env, GP_KNOWN_NAMES, g_auto->name);
        else if (!e->cpu_ok())
            gp_log(GP_LOG_CONFIG, "GDRPY_COPY_ISA=%s: this CPU cannot run it (available: %s); using auto (%s)",
                   e->name, g_available, g_auto->name);
        else
            k = e;
    }
    activate(k);
    gp_log(2, "copy kernel: %s (%s; available: %s)", k->name,
           k == g_auto ? "auto" : "GDRPY_COPY_ISA", g_available);
}

__attribute__((constructor)) static void copy_ctor(void)
{
    pthread_once(&g_once, copy_init);
}

/* Only reached if a copy runs before our constructor (e.g. from another
 * library's constructor in a static link). */
static void to_first_call(void *dst, const void *src, size_t n)
{
    pthread_once(&g_once, copy_init);
    __atomic_load_n(&g_to, __ATOMIC_RELAXED)(dst, src, n);
}

static void from_first_call(void *dst, const void *src, size_t n)
{
    pthread_once(&g_once, copy_init);
    __atomic_load_n(&g_from, __ATOMIC_RELAXED)(dst, src, n);
}

/* ---- public API ------------------------------------------------------- */
void gdrpy_copy_to_mapping(void *map_dst, const void *src, size_t n)
{
    __atomic_load_n(&g_to, __ATOMIC_RELAXED)(map_dst, src, n);
}

void gdrpy_copy_from_mapping(void *dst, const void *map_src, size_t n)
{
    __atomic_load_n(&g_from, __ATOMIC_RELAXED)(dst, map_src, n);
}

const char *gdrpy_copy_isa(void)
{
    pthread_once(&g_once, copy_init);
    return __atomic_load_n(&g_active, __ATOMIC_ACQUIRE)->name;
}

const char *gdrpy_copy_isa_available(void)
{
    pthread_once(&g_once, copy_init);
    return g_available;
}

/* ---- notes: why a kernel is not available or not picked ----------------- */
static char g_notes[512];
static size_t g_notes_len;
static pthread_once_t g_notes_once = PTHREAD_ONCE_INIT;

void gp_copy_note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(g_notes + g_notes_len, sizeof g_notes - g_notes_len, fmt, ap);
    va_end(ap);
    if (w > 0 && (size_t)w < sizeof g_notes - g_notes_len)
        g_notes_len += (size_t)w;
}

const char *gdrpy_copy_isa_notes(void)
{
    pthread_once(&g_notes_once, gp_arch_fill_notes);
    return g_notes;
}

int gdrpy_set_copy_isa(const char *name)
{
    pthread_once(&g_once, copy_init);
    const gp_copy_kernel *k;
    if (!name || strcasecmp(name, "auto") == 0) {
        k = g_auto;
    } else {
        k = gp_copy_kernel_by_name(name);
        if (!k)
            return gp_err(GDRPY_EINVAL, "gdrpy_set_copy_isa: unknown copy kernel \"%.40s\" (known: %s)",
                          name, GP_KNOWN_NAMES);
        if (!k->cpu_ok())
            return gp_err(GDRPY_ENOTSUP,
                          "gdrpy_set_copy_isa: this CPU cannot run the \"%s\" copy kernel (available: %s)",
                          k->name, g_available);
    }
    pthread_mutex_lock(&g_set_lock);
    activate(k);
    pthread_mutex_unlock(&g_set_lock);
    gp_log(2, "copy kernel: %s (set by gdrpy_set_copy_isa)", k->name);
    return GDRPY_OK;
}
