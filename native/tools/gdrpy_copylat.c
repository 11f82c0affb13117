/*
 * gdrpy_copylat.c - latency and bandwidth of the BAR1 copy paths, in the
 * spirit of GDRCopy's copylat/copybw, using only the public API (gdrpy.h).
 *
 * For every size it measures, each iteration timed on its own with RDTSCP
 * (TSC calibrated against CLOCK_MONOTONIC_RAW), median / p99 / min:
 *   to_mapping [isa]       gdrpy_copy_to_mapping (stores + sfence)
 *   to_mapping+rb [isa]    the same followed by an 8-byte read of the mapping
 *                          (the read cannot pass the posted writes: arrival)
 *   from_mapping [isa]     gdrpy_copy_from_mapping (read latency / bandwidth)
 *   raw NT store avx2/512  a plain non-temporal store loop compiled in this
 *                          file: the hardware limit, measured in the same run
 *   raw NT load avx2/512   a plain streaming-load loop (read limit)
 *   memcpy+sfence (glibc)  glibc memcpy into the mapping, for reference
 *   cuMemcpyHtoD/DtoH      copy engine from/to a cuMemHostAlloc'ed buffer
 *                          (real GPU; sim: gdrpy_memcpy_htod/dtoh)
 * and reports our kernel's bandwidth as a percentage of the best raw loop
 * (target: >= 95 % at 1 MiB and 64 MiB).  The raw loops and our kernel(s)
 * are measured in interleaved rounds (5; --quick: 1), so that drift of the
 * machine during the run does not favour either side.
 *
 * Real GPU: libcuda.so.1 is dlopen'ed here (own typedefs, no cuda.h), the
 * memory comes from cuMemAlloc in the device's primary context (the one
 * gdrpy uses).  sim: gdrpy_sim_alloc.
 *
 *   gdrpy_copylat [--backend auto|nvrm|gdrdrv|dmabuf|sim] [--device N]
 *                 [--sizes 8,64,4K,64K,1M,64M] [--iters N] [--isa NAME|all|A,B]
 *                 [--json FILE] [--quick] [--cpu N|-1] [--no-ce]
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <x86intrin.h>
#define TOOL_X86 1
/* glibc memcpy into the mapping as a reference row: x86 WC memory takes
 * any access; Arm Device memory faults on memcpy's unaligned accesses. */
#define TOOL_MEMCPY_ROW 1
#else
#include "fence.h" /* src/copy/fence.h: the target's store fence */
#define TOOL_X86 0
#define TOOL_MEMCPY_ROW 0
#endif

#include "gdrpy.h"

/* ---- tiny CUDA driver API, resolved from libcuda.so.1 ------------------ */
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static struct {
    void *lib;
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned);
    CUresult (*MemFreeHost)(void *);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*GetErrorName)(CUresult, const char **);
    CUdevice dev;
    CUcontext ctx;
} cu;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gdrpy_copylat: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static const char *cu_name(CUresult r)
{
    const char *s = NULL;
    if (cu.GetErrorName && cu.GetErrorName(r, &s) == 0 && s)
        return s;
    return "CUresult ?";
}

#define CU_CHECK(call)                                         \
    do {                                                       \
        CUresult r_ = (call);                                  \
        if (r_ != 0)                                           \
            die("%s failed: %s (%d)", #call, cu_name(r_), r_); \
    } while (0)

static void *cu_sym(const char *a, const char *b)
{
    void *p = dlsym(cu.lib, a);
    if (!p && b)
        p = dlsym(cu.lib, b);
    if (!p)
        die("libcuda.so.1 lacks %s", a);
    return p;
}

static void cuda_setup(int device)
{
    cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu.lib)
        die("cannot dlopen libcuda.so.1: %s (use --backend sim on a machine without a GPU)",
            dlerror());
    *(void **)&cu.Init = cu_sym("cuInit", NULL);
    *(void **)&cu.DeviceGet = cu_sym("cuDeviceGet", NULL);
    *(void **)&cu.DevicePrimaryCtxRetain = cu_sym("cuDevicePrimaryCtxRetain", NULL);
    *(void **)&cu.DevicePrimaryCtxRelease =
        cu_sym("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease");
    *(void **)&cu.CtxSetCurrent = cu_sym("cuCtxSetCurrent", NULL);
    *(void **)&cu.MemAlloc = cu_sym("cuMemAlloc_v2", "cuMemAlloc");
    *(void **)&cu.MemFree = cu_sym("cuMemFree_v2", "cuMemFree");
    *(void **)&cu.MemHostAlloc = cu_sym("cuMemHostAlloc", NULL);
    *(void **)&cu.MemFreeHost = cu_sym("cuMemFreeHost", NULL);
    *(void **)&cu.MemcpyHtoD = cu_sym("cuMemcpyHtoD_v2", "cuMemcpyHtoD");
    *(void **)&cu.MemcpyDtoH = cu_sym("cuMemcpyDtoH_v2", "cuMemcpyDtoH");
    *(void **)&cu.GetErrorName = cu_sym("cuGetErrorName", NULL);
    CU_CHECK(cu.Init(0));
    CU_CHECK(cu.DeviceGet(&cu.dev, device));
    CU_CHECK(cu.DevicePrimaryCtxRetain(&cu.ctx, cu.dev));
    CU_CHECK(cu.CtxSetCurrent(cu.ctx));
}

/* ---- timing ------------------------------------------------------------ */
static double g_tsc_per_ns;
static double g_timer_overhead_ns;

#if TOOL_X86
static inline uint64_t tsc_begin(void)
{
    unsigned aux;
    uint64_t t = __rdtscp(&aux);
    _mm_lfence(); /* the timed code starts after the read */
    return t;
}

static inline uint64_t tsc_end(void)
{
    unsigned aux;
    uint64_t t = __rdtscp(&aux); /* waits for the timed code to execute */
    _mm_lfence();
    return t;
}
#elif defined(__aarch64__)
/* The generic timer's virtual count (CNTVCT_EL0), readable from user space
 * on Linux; ISB keeps the read from moving across the timed code.  Its rate
 * (often 25 MHz to 1 GHz) is calibrated below like the TSC's. */
static inline uint64_t tsc_begin(void)
{
    uint64_t t;
    __asm__ __volatile__("isb\n\tmrs %0, cntvct_el0\n\tisb" : "=r"(t) : : "memory");
    return t;
}
static inline uint64_t tsc_end(void) { return tsc_begin(); }
#else
/* Elsewhere: CLOCK_MONOTONIC_RAW in ns (coarser; overhead is measured). */
static inline uint64_t tsc_begin(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static inline uint64_t tsc_end(void) { return tsc_begin(); }
#endif

static double mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void calibrate_tsc(int quick)
{
    double ms = quick ? 20 : 200;
    double t0 = mono_ns();
    uint64_t c0 = tsc_begin();
    while (mono_ns() - t0 < ms * 1e6);
    uint64_t c1 = tsc_end();
    double t1 = mono_ns();
    g_tsc_per_ns = (double)(c1 - c0) / (t1 - t0);
    uint64_t s[1001];
    for (int i = 0; i < 1001; i++) {
        uint64_t a = tsc_begin();
        uint64_t b = tsc_end();
        s[i] = b - a;
    }
    qsort(s, 1001, sizeof s[0], cmp_u64);
    g_timer_overhead_ns = s[500] / g_tsc_per_ns;
}

/* ---- benchmark state --------------------------------------------------- */
static struct {
    gdrpy_ctx_t ctx;
    gdrpy_pin_t pin;
    int sim;
    uint64_t dptr; /* device memory */
    size_t dsize;
    char *map;    /* CPU address of dptr through the mapping, 64-B aligned */
    char *host;   /* pageable host memory, the source/target of our copies */
    char *pinned; /* cuMemHostAlloc'ed (sim: malloc) for the copy engine */
    int have_avx2, have_avx512;
    int quick;
    long base_iters;
    int iters_given;
    FILE *json;
    int json_first;
} B;

typedef struct {
    double med, p99, min, mean; /* ns */
    long iters;
} stats_t;

typedef void (*op_fn)(size_t n);

/* One measurement: its samples accumulate over one or more rounds. */
typedef struct {
    const char *op;
    const char *tag; /* shown in brackets: the kernel or the raw loop's ISA */
    int set_isa;     /* 1: tag is a gdrpy kernel, selected before each round */
    op_fn fn;
    size_t bytes; /* bytes one iteration moves */
    long iters;   /* total */
    long done;
    uint64_t *s; /* iters samples (TSC ticks) */
    double sum;
} meas_t;

static void meas_init(meas_t *m, const char *op, const char *tag, int set_isa, op_fn fn,
                      size_t bytes, long iters)
{
    memset(m, 0, sizeof *m);
    m->op = op, m->tag = tag, m->set_isa = set_isa, m->fn = fn, m->bytes = bytes;
    m->iters = iters;
    m->s = malloc(sizeof(uint64_t) * (size_t)iters);
    if (!m->s)
        die("out of memory");
}

/* Times `count` more iterations of m (after a short untimed warm-up). */
static void meas_round(meas_t *m, long count)
{
    if (m->set_isa)
        gdrpy_set_copy_isa(m->tag);
    if (count > m->iters - m->done)
        count = m->iters - m->done;
    long warm = count / 10 < 10 ? count / 10 + 1 : 10;
    for (long i = 0; i < warm; i++)
        m->fn(m->bytes);
    for (long i = 0; i < count; i++) {
        uint64_t t0 = tsc_begin();
        m->fn(m->bytes);
        uint64_t t1 = tsc_end();
        m->s[m->done++] = t1 - t0;
        m->sum += (double)(t1 - t0);
    }
}

static stats_t meas_stats(meas_t *m)
{
    stats_t st = {0};
    long n = m->done;
    if (n <= 0)
        return st;
    qsort(m->s, (size_t)n, sizeof(uint64_t), cmp_u64);
    long i99 = (long)ceil(0.99 * (double)n) - 1;
    if (i99 < 0)
        i99 = 0;
    st.med = (n & 1 ? (double)m->s[n / 2] : 0.5 * ((double)m->s[n / 2 - 1] + (double)m->s[n / 2])) /
             g_tsc_per_ns;
    st.p99 = (double)m->s[i99] / g_tsc_per_ns;
    st.min = (double)m->s[0] / g_tsc_per_ns;
    st.mean = m->sum / (double)n / g_tsc_per_ns;
    st.iters = n;
    return st;
}

/* Measures a group in interleaved rounds (A B C A B C ...), so that a drift
 * of the machine (clocks, PCIe, another tenant) hits every member alike:
 * the comparison of our kernel with the raw loops stays fair. */
static void meas_group(meas_t *g, int ng, int rounds)
{
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < ng; i++) {
            long left = g[i].iters - g[i].done;
            long per = left / (rounds - r);
            if (per < 1 && left > 0)
                per = 1;
            if (per > 0)
                meas_round(&g[i], per);
        }
    gdrpy_set_copy_isa(NULL);
}

static stats_t run_timed(op_fn fn, size_t n, long iters)
{
    meas_t m;
    meas_init(&m, "", NULL, 0, fn, n, iters);
    meas_round(&m, iters);
    stats_t st = meas_stats(&m);
    free(m.s);
    return st;
}

/* Iterations for one measurement: at most base_iters, at most about
 * `budget` bytes moved, at least a few. */
static long iters_for(size_t n, double budget_bytes)
{
    long it = B.base_iters;
    long cap = (long)(budget_bytes / (double)n);
    if (cap < it)
        it = cap;
    long lo = B.quick ? 2 : 5;
    return it < lo ? lo : it;
}
#define BUDGET_WRITE (B.quick ? 256.0e6 : 4.0e9) /* ~16 GB/s paths */
#define BUDGET_READ (B.quick ? 16.0e6 : 256.0e6) /* BAR1 reads: ~1 GB/s */

/* ---- the operations ---------------------------------------------------- */
static void op_to(size_t n) { gdrpy_copy_to_mapping(B.map, B.host, n); }
static void op_from(size_t n) { gdrpy_copy_from_mapping(B.host, B.map, n); }
static void op_to_rb(size_t n)
{
    gdrpy_copy_to_mapping(B.map, B.host, n);
    size_t at = n >= 8 ? (n - 8) & ~(size_t)7 : 0;
    if (n >= 8)
        (void)*(volatile uint64_t *)(void *)(B.map + at);
    else
        (void)*(volatile uint8_t *)(B.map);
}

static void op_ce_htod(size_t n)
{
    if (B.sim) {
        int rc = gdrpy_memcpy_htod(B.ctx, B.dptr, B.pinned, n);
        if (rc)
            die("gdrpy_memcpy_htod: %s", gdrpy_last_error());
    } else {
        CU_CHECK(cu.MemcpyHtoD(B.dptr, B.pinned, n));
    }
}

static void op_ce_dtoh(size_t n)
{
    if (B.sim) {
        int rc = gdrpy_memcpy_dtoh(B.ctx, B.pinned, B.dptr, n);
        if (rc)
            die("gdrpy_memcpy_dtoh: %s", gdrpy_last_error());
    } else {
        CU_CHECK(cu.MemcpyDtoH(B.pinned, B.dptr, n));
    }
}

/* glibc memcpy into the mapping: a reference row, not part of "raw best". */
static void op_memcpy_to(size_t n)
{
    memcpy(B.map, B.host, n);
#if TOOL_X86
    _mm_sfence();
#else
    gp_fence_after_stores();
#endif
}

#if TOOL_X86
/* The "raw best" loops: whole 64-byte lines to/from the 64-byte aligned
 * mapping, nothing else (sizes that are not a multiple of 64 are rounded
 * down: those rows say so). */
__attribute__((target("avx2"))) static void raw_nt_store_avx2(size_t n)
{
    char *d = B.map;
    const char *s = B.host;
    for (size_t i = 0; i + 64 <= n; i += 64) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        _mm256_stream_si256((__m256i *)(d + i), a);
        _mm256_stream_si256((__m256i *)(d + i + 32), b);
    }
    _mm_sfence();
}

__attribute__((target("avx512f"))) static void raw_nt_store_avx512(size_t n)
{
    char *d = B.map;
    const char *s = B.host;
    for (size_t i = 0; i + 64 <= n; i += 64)
        _mm512_stream_si512((void *)(d + i), _mm512_loadu_si512((const void *)(s + i)));
    _mm_sfence();
}

__attribute__((target("avx2"))) static void raw_nt_load_avx2(size_t n)
{
    const char *s = B.map;
    char *d = B.host;
    for (size_t i = 0; i + 64 <= n; i += 64) {
        __m256i a = _mm256_stream_load_si256((const __m256i *)(s + i));
        __m256i b = _mm256_stream_load_si256((const __m256i *)(s + i + 32));
        _mm256_storeu_si256((__m256i *)(d + i), a);
        _mm256_storeu_si256((__m256i *)(d + i + 32), b);
    }
}

__attribute__((target("avx512f"))) static void raw_nt_load_avx512(size_t n)
{
    const char *s = B.map;
    char *d = B.host;
    for (size_t i = 0; i + 64 <= n; i += 64)
        _mm512_storeu_si512((void *)(d + i), _mm512_stream_load_si512((void *)(uintptr_t)(s + i)));
}
#else
/* No raw x86 loops on this architecture (B.have_avx2/avx512 stay 0). */
static void raw_unavailable(size_t n) { (void)n; }
#define raw_nt_store_avx2 raw_unavailable
#define raw_nt_store_avx512 raw_unavailable
#define raw_nt_load_avx2 raw_unavailable
#define raw_nt_load_avx512 raw_unavailable
#endif

/* ---- output ------------------------------------------------------------ */
static void human_size(size_t n, char *buf, size_t len)
{
    if (n >= (1u << 20) && n % (1u << 20) == 0)
        snprintf(buf, len, "%zuM", n >> 20);
    else if (n >= 1024 && n % 1024 == 0)
        snprintf(buf, len, "%zuK", n >> 10);
    else
        snprintf(buf, len, "%zu", n);
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* One result row: table + JSON.  bytes: the bytes one iteration moves.
 * ref_gbps > 0: also print the percentage of that reference. */
static void emit(const char *op, const char *isa, size_t n, size_t bytes, stats_t st,
                 double ref_gbps, const char *ref_name)
{
    char hs[32], label[64];
    human_size(n, hs, sizeof hs);
    snprintf(label, sizeof label, isa ? "%s [%s]" : "%s", op, isa);
    /* A median or minimum of 0 ticks (a coarse counter: aarch64's CNTVCT
     * runs at 25 MHz - 1 GHz) has no bandwidth: 0, never inf in the JSON. */
    double gmed = st.med > 0 ? bytes / st.med : 0, gbest = st.min > 0 ? bytes / st.min : 0;
    printf("%8s  %-28s %7ld %11.1f %11.1f %11.1f %9.3f %9.3f", hs, label, st.iters, st.med,
           st.p99, st.min, gmed, gbest);
    if (ref_gbps > 0)
        printf("  %5.1f%% of %s", 100.0 * gmed / ref_gbps, ref_name);
    if (bytes != n)
        printf("  (%zu B: whole lines)", bytes);
    printf("\n");
    fflush(stdout);
    if (B.json) {
        fprintf(B.json, "%s\n    {\"op\": ", B.json_first ? "" : ",");
        B.json_first = 0;
        json_str(B.json, op);
        fprintf(B.json, ", \"isa\": ");
        if (isa)
            json_str(B.json, isa);
        else
            fprintf(B.json, "null");
        fprintf(B.json,
                ", \"size\": %zu, \"bytes\": %zu, \"iters\": %ld, \"median_ns\": %.2f, "
                "\"p99_ns\": %.2f, \"min_ns\": %.2f, \"mean_ns\": %.2f, \"gbps_median\": %.4f, "
                "\"gbps_best\": %.4f",
                n, bytes, st.iters, st.med, st.p99, st.min, st.mean, gmed, gbest);
        if (ref_gbps > 0) {
            fprintf(B.json, ", \"pct_of_raw\": %.2f, \"raw_ref\": ", 100.0 * gmed / ref_gbps);
            json_str(B.json, ref_name);
        }
        fprintf(B.json, "}");
    }
}

typedef struct {
    size_t n;
    char isa[16];
    double w_pct, r_pct; /* our median GB/s as % of the best raw loop; -1: none */
} summ_t;

/* Measures group g (interleaved rounds) and prints it.  Rows [raw0, raw1)
 * are raw loops; rows from `ours` on are our kernel, printed with their
 * percentage of the best raw loop when `fair` (the raw loops moved the same
 * bytes).  Records those percentages in summ (is_read: read side). */
static void emit_group(meas_t *g, int ng, int rounds, int raw0, int raw1, int ours, int fair,
                       size_t n, summ_t *summ, int *nsumm, int is_read)
{
    stats_t st[16];
    double best = 0;
    char ref[32] = "raw";
    meas_group(g, ng, rounds);
    for (int i = 0; i < ng; i++)
        st[i] = meas_stats(&g[i]);
    for (int i = raw0; i < raw1; i++)
        if (g[i].bytes / st[i].med > best) {
            best = g[i].bytes / st[i].med;
            snprintf(ref, sizeof ref, "raw %s", g[i].tag);
        }
    if (!fair)
        best = 0;
    for (int i = 0; i < ng; i++) {
        int mine = i >= ours;
        emit(g[i].op, g[i].tag, n, g[i].bytes, st[i], mine ? best : 0, ref);
        if (mine && summ && best > 0) {
            int j;
            for (j = 0; j < *nsumm; j++)
                if (summ[j].n == n && strcmp(summ[j].isa, g[i].tag) == 0)
                    break;
            if (j == *nsumm) {
                if (j >= 64 * 8)
                    continue;
                summ[j].n = n;
                snprintf(summ[j].isa, sizeof summ[j].isa, "%.15s", g[i].tag);
                summ[j].w_pct = summ[j].r_pct = -1;
                (*nsumm)++;
            }
            double pct = 100.0 * (g[i].bytes / st[i].med) / best;
            if (is_read)
                summ[j].r_pct = pct;
            else
                summ[j].w_pct = pct;
        }
        free(g[i].s);
    }
}

/* ---- options ----------------------------------------------------------- */
static size_t parse_size(const char *s)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        die("bad size \"%s\"", s);
    switch (*end) {
    case 'k':
    case 'K': v <<= 10, end++; break;
    case 'm':
    case 'M': v <<= 20, end++; break;
    case 'g':
    case 'G': v <<= 30, end++; break;
    default: break;
    }
    if ((*end == 'i' || *end == 'I') && (end[1] == 'B' || end[1] == 'b'))
        end += 2;
    else if (*end == 'B' || *end == 'b')
        end++;
    if (*end || v == 0)
        die("bad size \"%s\" (use e.g. 8, 4K, 1M, 64MiB; > 0)", s);
    return (size_t)v;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: gdrpy_copylat [options]\n"
            "  --backend NAME   auto (default; or $GDRPY_BACKEND), nvrm, gdrdrv, dmabuf, sim\n"
            "  --device N       CUDA device ordinal (default 0)\n"
            "  --sizes LIST     comma-separated, K/M/G suffixes (default 8,64,4K,64K,1M,64M)\n"
            "  --iters N        iterations per measurement, at most (default 10000; large\n"
            "                   sizes use fewer: about 4 GB moved per write measurement,\n"
            "                   256 MB per BAR1 read measurement, at least 5)\n"
            "  --isa NAME|all|A,B  copy kernel(s) to measure (gdrpy_set_copy_isa);\n"
            "                   default: the one dispatch picks; all: every kernel this CPU runs\n"
            "  --json FILE      also write the results as JSON\n"
            "  --quick          tiny iteration counts (CI smoke test)\n"
            "  --cpu N          pin to CPU N (default: the CPU it starts on; -1: do not pin)\n"
            "  --no-ce          skip the copy-engine (cuMemcpy) rows\n"
            "  -h, --help       this text\n");
}

int main(int argc, char **argv)
{
    const char *backend_name = getenv("GDRPY_BACKEND");
    const char *sizes_arg = "8,64,4K,64K,1M,64M";
    const char *isa_arg = NULL, *json_path = NULL;
    int device = 0, cpu = -2, no_ce = 0;
    B.base_iters = 10000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV()                         \
    do {                                \
        if (!v)                         \
            die("%s needs a value", a); \
        i++;                            \
    } while (0)
        if (!strcmp(a, "--backend")) {
            NEEDV();
            backend_name = v;
        } else if (!strcmp(a, "--device")) {
            NEEDV();
            device = atoi(v);
        } else if (!strcmp(a, "--sizes")) {
            NEEDV();
            sizes_arg = v;
        } else if (!strcmp(a, "--iters")) {
            NEEDV();
            B.base_iters = atol(v);
            B.iters_given = 1;
            if (B.base_iters < 1)
                die("--iters must be >= 1");
        } else if (!strcmp(a, "--isa")) {
            NEEDV();
            isa_arg = v;
        } else if (!strcmp(a, "--json")) {
            NEEDV();
            json_path = v;
        } else if (!strcmp(a, "--cpu")) {
            NEEDV();
            cpu = atoi(v);
        } else if (!strcmp(a, "--quick")) B.quick = 1;
        else if (!strcmp(a, "--no-ce")) no_ce = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            die("unknown option %s", a);
        }
    }
    if (B.quick && !B.iters_given)
        B.base_iters = 20;

    /* sizes */
    size_t sizes[64], nsizes = 0, maxsize = 0;
    {
        char *dup = strdup(sizes_arg), *save = NULL;
        for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (nsizes == 64)
                die("at most 64 sizes");
            sizes[nsizes] = parse_size(t);
            if (sizes[nsizes] > maxsize)
                maxsize = sizes[nsizes];
            nsizes++;
        }
        free(dup);
        if (!nsizes)
            die("no sizes");
    }

    /* kernels */
    const char *avail = gdrpy_copy_isa_available();
    char isas[8][16];
    int nisas = 0;
    {
        const char *list = !isa_arg ? gdrpy_copy_isa() : !strcmp(isa_arg, "all") ? avail
                                                                                 : isa_arg;
        char *dup = strdup(list), *save = NULL;
        for (char *t = strtok_r(dup, ",", &save); t && nisas < 8; t = strtok_r(NULL, ",", &save)) {
            if (gdrpy_set_copy_isa(t) != 0)
                die("--isa %s: %s", t, gdrpy_last_error());
            snprintf(isas[nisas++], sizeof isas[0], "%s", gdrpy_copy_isa());
        }
        free(dup);
        gdrpy_set_copy_isa(NULL);
    }
    B.have_avx2 = strstr(avail, "avx2") != NULL;
    B.have_avx512 = strstr(avail, "avx512") != NULL;

    if (cpu == -2)
        cpu = sched_getcpu();
    if (cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0)
            fprintf(stderr, "gdrpy_copylat: cannot pin to CPU %d: %s\n", cpu, strerror(errno));
    }

    /* context, memory, pin, map */
    int backend = gdrpy_backend_from_name(backend_name ? backend_name : "auto");
    if (backend < 0)
        die("unknown backend \"%s\" (auto, nvrm, gdrdrv, dmabuf, sim)", backend_name);
    B.sim = backend == GDRPY_BACKEND_SIM;
    if (!B.sim)
        cuda_setup(device);
    int rc = gdrpy_open(device, backend, &B.ctx);
    if (rc)
        die("gdrpy_open(device %d, backend %s): %s", device,
            backend_name ? backend_name : "auto", gdrpy_last_error());
    gdrpy_ctx_info_t ci;
    memset(&ci, 0, sizeof ci);
    gdrpy_ctx_get_info(B.ctx, &ci);

    B.dsize = (maxsize + 64 + GDRPY_GPU_PAGE_SIZE - 1) & ~(GDRPY_GPU_PAGE_SIZE - 1);
    if (B.sim) {
        if ((rc = gdrpy_sim_alloc(B.dsize, &B.dptr)))
            die("gdrpy_sim_alloc(%zu): %s", B.dsize, gdrpy_last_error());
        B.pinned = aligned_alloc(4096, B.dsize);
        if (!B.pinned)
            die("out of memory");
    } else {
        CUdeviceptr d;
        CU_CHECK(cu.MemAlloc(&d, B.dsize));
        B.dptr = d;
        CU_CHECK(cu.MemHostAlloc((void **)&B.pinned, B.dsize, 0));
    }
    if ((rc = gdrpy_pin(B.ctx, B.dptr, B.dsize, GDRPY_PIN_DEFAULT, &B.pin)))
        die("gdrpy_pin(0x%llx, %zu): %s", (unsigned long long)B.dptr, B.dsize, gdrpy_last_error());
    void *map_ptr = NULL, *user_ptr = NULL;
    if ((rc = gdrpy_map(B.ctx, B.pin, &map_ptr, &user_ptr)))
        die("gdrpy_map: %s", gdrpy_last_error());
    size_t adj = (size_t)(-(uintptr_t)user_ptr & 63);
    B.map = (char *)user_ptr + adj;
    B.dptr += adj;
    B.host = aligned_alloc(4096, B.dsize);
    if (!B.host)
        die("out of memory");
    for (size_t i = 0; i < B.dsize; i++)
        B.host[i] = (char)(i * 131 + 7);
    memcpy(B.pinned, B.host, B.dsize);

    calibrate_tsc(B.quick);

    /* header */
    printf("gdrpy_copylat: backend %s, device %d%s%s%s%s%s\n", ci.backend_name, device,
           ci.gpu_name[0] ? ", " : "", ci.gpu_name, ci.pci_bus_id[0] ? " (" : "", ci.pci_bus_id,
           ci.pci_bus_id[0] ? ")" : "");
    if (ci.driver_version[0])
        printf("driver %s\n", ci.driver_version);
    printf("copy kernels: auto %s, available %s, measuring", gdrpy_copy_isa(), avail);
    for (int k = 0; k < nisas; k++)
        printf(" %s", isas[k]);
    printf("\nTSC %.3f GHz (calibrated), timer overhead %.1f ns (included below), CPU %d%s\n",
           g_tsc_per_ns, g_timer_overhead_ns, cpu, B.quick ? ", QUICK (smoke test numbers)" : "");
    if (B.sim)
        printf("NOTE: sim backend - the \"GPU\" is host memory; numbers are not BAR1 numbers\n");

    if (json_path) {
        B.json = fopen(json_path, "w");
        if (!B.json)
            die("cannot write %s: %s", json_path, strerror(errno));
        fprintf(B.json, "{\n  \"tool\": \"gdrpy_copylat\",\n  \"backend\": ");
        json_str(B.json, ci.backend_name);
        fprintf(B.json, ",\n  \"device\": %d,\n  \"gpu\": ", device);
        json_str(B.json, ci.gpu_name);
        fprintf(B.json, ",\n  \"pci_bus_id\": ");
        json_str(B.json, ci.pci_bus_id);
        fprintf(B.json, ",\n  \"driver_version\": ");
        json_str(B.json, ci.driver_version);
        fprintf(B.json, ",\n  \"auto_isa\": ");
        json_str(B.json, gdrpy_copy_isa());
        fprintf(B.json, ",\n  \"available_isas\": ");
        json_str(B.json, avail);
        fprintf(B.json,
                ",\n  \"tsc_ghz\": %.4f,\n  \"timer_overhead_ns\": %.2f,\n  \"cpu\": %d,\n"
                "  \"quick\": %s,\n  \"results\": [",
                g_tsc_per_ns, g_timer_overhead_ns, cpu, B.quick ? "true" : "false");
        B.json_first = 1;
    }

    printf("\n%8s  %-28s %7s %11s %11s %11s %9s %9s\n", "size", "operation", "iters",
           "median ns", "p99 ns", "min ns", "GB/s med", "GB/s best");

    /* summary: ours vs raw at each size, per isa */
    summ_t summ[64 * 8];
    int nsumm = 0;

    for (size_t si = 0; si < nsizes; si++) {
        size_t n = sizes[si];
        size_t lines = n & ~(size_t)63;
        int rounds = B.quick ? 1 : 5;
        meas_t g[16];
        int ng = 0;

        /* writes: raw loops, glibc memcpy and our kernel(s), interleaved */
        int w_raw0 = ng;
        if (lines >= 64 && B.have_avx2)
            meas_init(&g[ng++], "raw NT store", "avx2", 0, raw_nt_store_avx2, lines,
                      iters_for(lines, BUDGET_WRITE));
        if (lines >= 64 && B.have_avx512)
            meas_init(&g[ng++], "raw NT store", "avx512", 0, raw_nt_store_avx512, lines,
                      iters_for(lines, BUDGET_WRITE));
        int w_raw1 = ng;
        if (lines >= 64 && TOOL_MEMCPY_ROW)
            meas_init(&g[ng++], "memcpy+sfence (glibc)", NULL, 0, op_memcpy_to, n,
                      iters_for(n, BUDGET_WRITE));
        int w_ours = ng;
        for (int k = 0; k < nisas; k++)
            meas_init(&g[ng++], "to_mapping", isas[k], 1, op_to, n, iters_for(n, BUDGET_WRITE));
        emit_group(g, ng, rounds, w_raw0, w_raw1, w_ours, lines == n, n, summ, &nsumm, 0);

        if (n <= 65536) {
            ng = 0;
            for (int k = 0; k < nisas; k++)
                meas_init(&g[ng++], "to_mapping+rb", isas[k], 1, op_to_rb, n,
                          iters_for(n, BUDGET_READ));
            emit_group(g, ng, rounds, 0, 0, 0, 0, n, NULL, NULL, 0);
        }

        /* reads: raw streaming-load loops and our kernel(s), interleaved */
        ng = 0;
        if (lines >= 64 && B.have_avx2)
            meas_init(&g[ng++], "raw NT load", "avx2", 0, raw_nt_load_avx2, lines,
                      iters_for(lines, BUDGET_READ));
        if (lines >= 64 && B.have_avx512)
            meas_init(&g[ng++], "raw NT load", "avx512", 0, raw_nt_load_avx512, lines,
                      iters_for(lines, BUDGET_READ));
        int r_raw1 = ng;
        for (int k = 0; k < nisas; k++)
            meas_init(&g[ng++], "from_mapping", isas[k], 1, op_from, n, iters_for(n, BUDGET_READ));
        emit_group(g, ng, rounds, 0, r_raw1, r_raw1, lines == n, n, summ, &nsumm, 1);

        gdrpy_set_copy_isa(NULL);
        if (!no_ce) {
            long it = iters_for(n, BUDGET_WRITE);
            if (it > 2000 && !B.iters_given)
                it = 2000; /* ~7 us each: plenty for a median and a p99 */
            stats_t h = run_timed(op_ce_htod, n, it);
            emit(B.sim ? "gdrpy_memcpy_htod (sim)" : "cuMemcpyHtoD (pinned)", NULL, n, n, h, 0, NULL);
            stats_t d = run_timed(op_ce_dtoh, n, it);
            emit(B.sim ? "gdrpy_memcpy_dtoh (sim)" : "cuMemcpyDtoH (pinned)", NULL, n, n, d, 0, NULL);
        }
        printf("\n");
    }

    /* correctness of what was measured: write through the mapping, read it
     * back through the copy engine and through the mapping */
    int verify_ok = 1;
    {
        size_t n = maxsize;
        for (size_t i = 0; i < n; i++)
            B.host[i] = (char)(i * 7 + 3 + (i >> 12));
        gdrpy_copy_to_mapping(B.map, B.host, n);
        memset(B.pinned, 0, n);
        if (B.sim) {
            if (gdrpy_memcpy_dtoh(B.ctx, B.pinned, B.dptr, n))
                verify_ok = 0;
        } else {
            CU_CHECK(cu.MemcpyDtoH(B.pinned, B.dptr, n));
        }
        if (memcmp(B.pinned, B.host, n) != 0)
            verify_ok = 0;
        char *back = malloc(n);
        if (back) {
            gdrpy_copy_from_mapping(back, B.map, n);
            if (memcmp(back, B.host, n) != 0)
                verify_ok = 0;
            free(back);
        }
        printf("verify (%zu B written through the mapping, read back by %s and through the "
               "mapping): %s\n",
               n, B.sim ? "gdrpy_memcpy_dtoh" : "cuMemcpyDtoH", verify_ok ? "OK" : "FAILED");
    }

    /* summary */
    int below = 0;
    printf("\nour kernel vs the raw loop in this run (median GB/s; target >= 95%% at 1M and 64M):\n");
    for (int i = 0; i < nsumm; i++) {
        char hs[32];
        human_size(summ[i].n, hs, sizeof hs);
        if (summ[i].w_pct < 0)
            continue;
        int target = summ[i].n == (1u << 20) || summ[i].n == (64u << 20);
        int miss = target && summ[i].w_pct < 95.0;
        below |= miss;
        char rd[16] = "  n/a";
        if (summ[i].r_pct >= 0)
            snprintf(rd, sizeof rd, "%5.1f%%", summ[i].r_pct);
        printf("  %8s [%-9s] write %6.1f%%  read %s%s\n", hs, summ[i].isa, summ[i].w_pct, rd,
               miss ? "   <-- write below the 95% target" : "");
    }

    if (B.json) {
        fprintf(B.json, "\n  ],\n  \"vs_raw\": [");
        for (int i = 0; i < nsumm; i++) {
            fprintf(B.json, "%s\n    {\"size\": %zu, \"isa\": ", i ? "," : "", summ[i].n);
            json_str(B.json, summ[i].isa);
            fprintf(B.json, ", \"write_pct_of_raw\": ");
            if (summ[i].w_pct >= 0)
                fprintf(B.json, "%.2f", summ[i].w_pct);
            else
                fprintf(B.json, "null");
            fprintf(B.json, ", \"read_pct_of_raw\": ");
            if (summ[i].r_pct >= 0)
                fprintf(B.json, "%.2f}", summ[i].r_pct);
            else
                fprintf(B.json, "null}");
        }
        fprintf(B.json, "\n  ],\n  \"verify_ok\": %s,\n  \"write_target_met\": %s\n}\n",
                verify_ok ? "true" : "false", below ? "false" : "true");
        fclose(B.json);
        printf("JSON written to %s\n", json_path);
    }

    gdrpy_unmap(B.ctx, B.pin);
    gdrpy_unpin(B.ctx, B.pin);
    gdrpy_close(B.ctx);
    if (B.sim) {
        gdrpy_sim_free(B.dptr - adj);
        free(B.pinned);
    } else {
        cu.MemFree(B.dptr - adj);
        cu.MemFreeHost(B.pinned);
        cu.DevicePrimaryCtxRelease(cu.dev);
    }
    free(B.host);
    return verify_ok ? 0 : 1;
}
