/*
 * gdrpy_apilat.c - cost of the validated API paths and of teardown/open
 * under load, for one build of libgdrpy.so.0 + libgdrapi.so.2.
 *
 * Everything it calls is resolved with dlopen/dlsym from the directory given
 * with --lib, so ONE binary measures two builds (e.g. an old commit and the
 * current tree, built side by side) with the same timing code:
 *
 *   gdrpy_apilat --lib OLD/native/build [--backend sim|auto|nvrm] ...
 *   gdrpy_apilat --lib NEW/native/build ...
 *
 * Rows (median and p99 of per-call times; a sample is the mean of a batch
 * of B back-to-back calls, timed with CLOCK_MONOTONIC_RAW; methods are
 * measured in interleaved rounds so machine drift hits all alike):
 *   gdrpy_write N B       validated copy into the mapping (libgdrpy core)
 *   gdrpy_read N B        validated copy out of the mapping
 *   copy_to_mapping N B   the bare copy kernel (no validation): reference
 *   gdr_copy_to_mapping   libgdrapi.so.2's copy (GDRCopy ABI)
 *   copy_to_mapping (gdr map)  the bare kernel on libgdrapi's mapping
 *   gdr_copy_from_mapping
 * --pinmap N: the cost of gdrpy_pin + gdrpy_map of a --pinmap-bytes (64 KiB)
 * buffer, and of gdrpy_unmap + gdrpy_unpin, N times each (rows "pin+map",
 * "unmap+unpin"; one call each per sample).
 * --bw SIZES: gdrpy_write / gdrpy_read of each size into one pinned and
 * mapped buffer (rows "bw gdrpy_write", "bw gdrpy_read": one call per
 * sample, write and read alternating, about --bw-budget seconds of each per
 * size, 5 to 200 samples).
 * And "open under load": gdrpy_open + gdrpy_close of a new context, timed
 * one by one, while --threads threads loop gdrpy_write (--load-bytes) on
 * another context; each open is given --open-timeout seconds (an open that
 * takes longer is reported as blocked, and the load is then stopped so
 * that it can finish).
 *
 * On a GPU (--backend auto/nvrm) the memory comes from cuMemAlloc; on sim
 * from gdrpy_sim_alloc of the library under test.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gdrapi_testmem.h"

typedef uint64_t h_t;
typedef struct {
    unsigned long h;
} mh_t;

static struct {
    void *so;
    int (*open)(int, int, h_t *);
    int (*close)(h_t);
    int (*pin)(h_t, uint64_t, size_t, unsigned, h_t *);
    int (*unpin)(h_t, h_t);
    int (*map)(h_t, h_t, void **, void **);
    int (*unmap)(h_t, h_t);
    int (*write)(h_t, h_t, size_t, const void *, size_t);
    int (*read)(h_t, h_t, size_t, void *, size_t);
    void (*to_mapping)(void *, const void *, size_t);
    int (*backend_from_name)(const char *);
    const char *(*last_error)(void);
    int (*sim_alloc)(size_t, uint64_t *);
    int (*sim_free)(uint64_t);
} gp;

static struct {
    void *so;
    void *(*open)(void);
    int (*close)(void *);
    int (*pin)(void *, unsigned long, size_t, uint64_t, uint32_t, mh_t *);
    int (*unpin)(void *, mh_t);
    int (*map)(void *, mh_t, void **, size_t);
    int (*unmap)(void *, mh_t, void *, size_t);
    int (*to)(mh_t, void *, const void *, size_t);
    int (*from)(mh_t, void *, const void *, size_t);
} ga;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gdrpy_apilat: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

#define SYM(lib, dst, name)                                                \
    do {                                                                   \
        *(void **)&(dst) = dlsym((lib), (name));                           \
        if (!(dst)) die("%s not found in the library under test", (name)); \
    } while (0)

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void stats(double *s, int n, double *med, double *p99, double *max)
{
    qsort(s, (size_t)n, sizeof *s, cmp_d);
    int i99 = (n * 99 + 99) / 100;
    if (i99 < 1) i99 = 1;
    if (i99 > n) i99 = n;
    *med = s[n / 2];
    *p99 = s[i99 - 1];
    *max = s[n - 1];
}

/* Device memory for the library under test: gdrpy_sim_alloc of that
 * library on sim (libgdrapi's copy of the core keeps its own), else
 * cuMemAlloc (gdrapi_testmem.h). */
static void dev_alloc(size_t n, int is_sim, uint64_t *d, tm_buf *tb)
{
    memset(tb, 0, sizeof *tb);
    if (is_sim) {
        if (gp.sim_alloc(n, d)) die("gdrpy_sim_alloc(%zu): %s", n, gp.last_error());
        return;
    }
    if (tm_alloc(tb, n, TM_CUMEMALLOC)) die("cuMemAlloc(%zu) failed", n);
    *d = tb->d;
}

static void dev_free(uint64_t d, int is_sim, tm_buf *tb)
{
    if (is_sim) gp.sim_free(d);
    else tm_free(tb);
}

static void row(const char *name, size_t n, int batch, double *s, int count)
{
    double med, p99, mx;
    stats(s, count, &med, &p99, &mx);
    printf("%-28s %8zu %6d %10.1f %10.1f\n", name, n, batch, med, p99);
}

/* ---- latency rows ------------------------------------------------------ */
enum { M_WRITE,
       M_READ,
       M_KERNEL,
       M_GDR_TO,
       M_GDR_KERNEL,
       M_GDR_FROM,
       M_COUNT };
/* M_GDR_KERNEL: the bare kernel on libgdrapi's mapping, so that
 * gdr_copy_to_mapping minus it is libgdrapi's own cost on the same
 * destination (two mappings of different buffers may differ on a GPU). */
static const char *m_name[M_COUNT] = {"gdrpy_write", "gdrpy_read",
                                      "copy_to_mapping (kernel)",
                                      "gdr_copy_to_mapping", "copy_to_mapping (gdr map)",
                                      "gdr_copy_from_mapping"};

static h_t g_ctx, g_pin;
static char *g_user; /* CPU address of the pinned address (gdrpy) */
static mh_t g_mh;
static char *g_gmap; /* gdr_map pointer */
static char g_host[1 << 16] __attribute__((aligned(64)));

static inline int run_one(int m, size_t n)
{
    switch (m) {
    case M_WRITE: return gp.write(g_ctx, g_pin, 0, g_host, n);
    case M_READ: return gp.read(g_ctx, g_pin, 0, g_host, n);
    case M_KERNEL: gp.to_mapping(g_user, g_host, n); return 0;
    case M_GDR_TO: return ga.to(g_mh, g_gmap, g_host, n);
    case M_GDR_KERNEL: gp.to_mapping(g_gmap, g_host, n); return 0;
    case M_GDR_FROM: return ga.from(g_mh, g_host, g_gmap, n);
    }
    return -1;
}

static double sample(int m, size_t n, int batch)
{
    double t0 = now_ns();
    for (int i = 0; i < batch; i++)
        if (run_one(m, n)) die("%s failed: %s", m_name[m], gp.last_error());
    return (now_ns() - t0) / batch;
}

static void latency(const size_t *sizes, int nsizes, int samples, int have_gdr, int is_sim)
{
    int rounds = 5;
    printf("# latency: ns per call, median / p99 of %d samples; a sample is the mean of a "
           "batch of B calls; %d interleaved rounds\n",
           samples, rounds);
    printf("%-28s %8s %6s %10s %10s\n", "method", "bytes", "B", "median_ns", "p99_ns");
    double *s = malloc(sizeof(double) * (size_t)samples * M_COUNT);
    for (int si = 0; si < nsizes; si++) {
        size_t n = sizes[si];
        int batch[M_COUNT];
        for (int m = 0; m < M_COUNT; m++) {
            if (!have_gdr && (m == M_GDR_TO || m == M_GDR_KERNEL || m == M_GDR_FROM)) continue;
            for (int w = 0; w < 200; w++) run_one(m, n);
            double est = sample(m, n, 16);
            int b = est > 0 ? (int)(2000.0 / est) : 256; /* ~2 us per sample */
            if (b < 1) b = 1;
            if (b > 256) b = 256;
            if (!is_sim && (m == M_READ || m == M_GDR_FROM)) b = b < 4 ? b : 4;
            batch[m] = b;
        }
        int per = samples / rounds;
        for (int r = 0; r < rounds; r++)
            for (int m = 0; m < M_COUNT; m++) {
                if (!have_gdr && (m == M_GDR_TO || m == M_GDR_KERNEL || m == M_GDR_FROM)) continue;
                for (int w = 0; w < 20; w++) run_one(m, n);
                for (int k = 0; k < per; k++)
                    s[m * samples + r * per + k] = sample(m, n, batch[m]);
            }
        for (int m = 0; m < M_COUNT; m++) {
            if (!have_gdr && (m == M_GDR_TO || m == M_GDR_KERNEL || m == M_GDR_FROM)) continue;
            row(m_name[m], n, batch[m], s + m * samples, per * rounds);
        }
    }
    free(s);
}

/* ---- pin + map, bandwidth ---------------------------------------------- */
static void pin_map_cost(size_t bytes, int samples, int is_sim)
{
    uint64_t d;
    tm_buf tb;
    dev_alloc(bytes, is_sim, &d, &tb);
    double *a = malloc(sizeof(double) * 2 * (size_t)samples), *b = a + samples;
    if (!a) die("out of memory");
    printf("# pin+map: ns per gdrpy_pin + gdrpy_map of %zu B, and per gdrpy_unmap + "
           "gdrpy_unpin; median / p99 of %d (one call each per sample)\n",
           bytes, samples);
    for (int i = -3; i < samples; i++) { /* 3 untimed first */
        h_t pin;
        void *mp, *up;
        double t0 = now_ns();
        if (gp.pin(g_ctx, d, bytes, 0, &pin)) die("gdrpy_pin: %s", gp.last_error());
        if (gp.map(g_ctx, pin, &mp, &up)) die("gdrpy_map: %s", gp.last_error());
        double t1 = now_ns();
        if (gp.unmap(g_ctx, pin)) die("gdrpy_unmap: %s", gp.last_error());
        if (gp.unpin(g_ctx, pin)) die("gdrpy_unpin: %s", gp.last_error());
        double t2 = now_ns();
        if (i >= 0) {
            a[i] = t1 - t0;
            b[i] = t2 - t1;
        }
    }
    row("pin+map", bytes, 1, a, samples);
    row("unmap+unpin", bytes, 1, b, samples);
    free(a);
    dev_free(d, is_sim, &tb);
}

static double timed_copy(int write, h_t pin, char *host, size_t n)
{
    double t0 = now_ns();
    int rc = write ? gp.write(g_ctx, pin, 0, host, n) : gp.read(g_ctx, pin, 0, host, n);
    if (rc) die("%s(%zu): %s", write ? "gdrpy_write" : "gdrpy_read", n, gp.last_error());
    return now_ns() - t0;
}

static void bandwidth(const size_t *sizes, int nsizes, double budget_s, int is_sim)
{
    size_t max = 0;
    for (int i = 0; i < nsizes; i++) max = sizes[i] > max ? sizes[i] : max;
    uint64_t d;
    tm_buf tb;
    dev_alloc(max, is_sim, &d, &tb);
    h_t pin;
    void *mp, *up;
    if (gp.pin(g_ctx, d, max, 0, &pin)) die("gdrpy_pin(%zu): %s", max, gp.last_error());
    if (gp.map(g_ctx, pin, &mp, &up)) die("gdrpy_map: %s", gp.last_error());
    char *host = aligned_alloc(4096, (max + 4095) & ~(size_t)4095);
    if (!host) die("out of memory");
    memset(host, 0x5a, max);
    enum { MAXS = 200 };
    double w[MAXS], r[MAXS];
    printf("# bandwidth: ns per gdrpy_write / gdrpy_read (one call per sample, the two "
           "alternating; GB/s = bytes / ns)\n");
    for (int si = 0; si < nsizes; si++) {
        size_t n = sizes[si];
        timed_copy(1, pin, host, n);
        timed_copy(0, pin, host, n);
        double est = timed_copy(1, pin, host, n) + timed_copy(0, pin, host, n);
        int count = est > 0 ? (int)(2 * budget_s * 1e9 / est) : MAXS;
        if (count < 5) count = 5;
        if (count > MAXS) count = MAXS;
        for (int k = 0; k < count; k++) {
            w[k] = timed_copy(1, pin, host, n);
            r[k] = timed_copy(0, pin, host, n);
        }
        row("bw gdrpy_write", n, 1, w, count);
        row("bw gdrpy_read", n, 1, r, count);
    }
    free(host);
    gp.unmap(g_ctx, pin);
    gp.unpin(g_ctx, pin);
    dev_free(d, is_sim, &tb);
}

/* ---- open under load --------------------------------------------------- */
static atomic_int g_stop;
static atomic_long g_loaded_ops;
static size_t g_load_bytes = 64;
static int g_device, g_backend;

static void *loader(void *arg)
{
    size_t off = (size_t)(uintptr_t)arg;
    char buf[4096];
    memset(buf, 0xa5, sizeof buf);
    long ops = 0;
    tm_thread_init();
    while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
        if (gp.write(g_ctx, g_pin, off, buf, g_load_bytes)) die("load write: %s", gp.last_error());
        ops++;
    }
    atomic_fetch_add(&g_loaded_ops, ops);
    return NULL;
}

struct open_job {
    h_t h;
    int rc;
    double ns;
    atomic_int done;
    int op;
};

static void *opener(void *arg)
{
    struct open_job *j = arg;
    double t0 = now_ns();
    if (j->op == 0) j->rc = gp.open(g_device, g_backend, &j->h);
    else j->rc = gp.close(j->h);
    j->ns = now_ns() - t0;
    atomic_store(&j->done, 1);
    return NULL;
}

/* Runs one open (op 0) or close (op 1) with a deadline; returns its time in
 * ns or -1 if it did not finish in time (then the load is stopped and the
 * call is waited for). */
static double timed_call(int op, h_t *h, double timeout_s, int *blocked)
{
    struct open_job j = {.h = h ? *h : 0, .op = op};
    atomic_init(&j.done, 0);
    pthread_t t;
    pthread_create(&t, NULL, opener, &j);
    double t0 = now_ns();
    while (!atomic_load(&j.done) && now_ns() - t0 < timeout_s * 1e9) usleep(100);
    if (!atomic_load(&j.done)) {
        *blocked = 1;
        atomic_store(&g_stop, 1);
    }
    pthread_join(t, NULL);
    if (j.rc) die("%s failed: %s", op ? "gdrpy_close" : "gdrpy_open", gp.last_error());
    if (op == 0 && h) *h = j.h;
    return *blocked ? -1 : j.ns;
}

static int open_under_load(int threads, int opens, double timeout_s, double limit_ms)
{
    pthread_t th[64];
    atomic_store(&g_stop, 0);
    atomic_store(&g_loaded_ops, 0);
    for (int i = 0; i < threads; i++)
        pthread_create(&th[i], NULL, loader, (void *)(uintptr_t)(i * 4096));
    usleep(100000); /* let the load settle */
    double *so = malloc(sizeof(double) * (size_t)opens), *sc = malloc(sizeof(double) * (size_t)opens);
    int n = 0, blocked = 0;
    double t0 = now_ns();
    for (int i = 0; i < opens && !blocked; i++) {
        h_t h = 0;
        double o = timed_call(0, &h, timeout_s, &blocked);
        if (blocked) {
            if (h) gp.close(h);
            break;
        }
        double c = timed_call(1, &h, timeout_s, &blocked);
        if (blocked) break;
        so[n] = o / 1e6;
        sc[n] = c / 1e6;
        n++;
        usleep(2000);
    }
    double el = (now_ns() - t0) / 1e9;
    atomic_store(&g_stop, 1);
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    long ops = atomic_load(&g_loaded_ops);
    int ok = !blocked;
    if (blocked) {
        printf("open_under_load threads=%d load=gdrpy_write %zuB: BLOCKED: an open or close did "
               "not return within %.1f s while the threads copied (%d calls completed before)\n",
               threads, g_load_bytes, timeout_s, n);
    } else {
        double om, op, ox, cm, cp, cx;
        stats(so, n, &om, &op, &ox);
        stats(sc, n, &cm, &cp, &cx);
        ok = ox <= limit_ms;
        printf("open_under_load threads=%d load=gdrpy_write %zuB (%.1f M copies/s): gdrpy_open "
               "median %.3f ms p99 %.3f ms max %.3f ms; gdrpy_close median %.3f ms max %.3f ms "
               "(%d opens; limit %.0f ms: %s)\n",
               threads, g_load_bytes, ops / el / 1e6, om, op,
               ox, cm, cx, n, limit_ms, ok ? "ok" : "OVER");
    }
    free(so);
    free(sc);
    return ok;
}

static size_t parse_size(const char *s)
{
    char *e;
    unsigned long long v = strtoull(s, &e, 10);
    if (*e == 'K' || *e == 'k') v <<= 10;
    else if (*e == 'M' || *e == 'm') v <<= 20;
    return (size_t)v;
}

/* A comma-separated list of sizes (K/M suffixes) into out[16]; their count. */
static int parse_sizes(const char *text, size_t out[16])
{
    int n = 0;
    char *dup = strdup(text), *save = NULL;
    if (!dup) die("out of memory");
    for (char *t = strtok_r(dup, ",", &save); t && n < 16; t = strtok_r(NULL, ",", &save))
        out[n++] = parse_size(t);
    free(dup);
    return n;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: gdrpy_apilat --lib DIR [--backend sim|auto|nvrm] [--device N] "
               "[--sizes 8,64] [--samples N] [--threads 8] [--opens 50] "
               "[--open-timeout S] [--load-bytes 64] [--no-latency] [--no-open]\n"
               "       [--pinmap N] [--pinmap-bytes 64K] [--bw 64K,1M,16M,64M] [--bw-budget S]\n"
               "Latency of the validated copies of the libgdrpy.so.0 / libgdrapi.so.2 in DIR\n"
               "(loaded with dlopen), and gdrpy_open while threads copy; --pinmap N: N pin+map\n"
               "and unmap+unpin of --pinmap-bytes; --bw: gdrpy_write/read of each size\n"
               "(about --bw-budget s, default 0.3, of each per size); -h, --help: this text\n");
}

int main(int argc, char **argv)
{
    const char *lib = NULL, *backend = "sim";
    size_t sizes[16] = {8, 64};
    int nsizes = 2, samples = 2000, threads = 8, opens = 50, do_lat = 1, do_open = 1;
    int pinmap = 0, nbw = 0;
    size_t pinmap_bytes = 1 << 16, bw[16];
    double timeout_s = 3.0, limit_ms = 10.0, bw_budget = 0.3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--lib") && v) {
            lib = v;
            i++;
        } else if (!strcmp(a, "--backend") && v) {
            backend = v;
            i++;
        } else if (!strcmp(a, "--device") && v) {
            g_device = atoi(v);
            i++;
        } else if (!strcmp(a, "--samples") && v) {
            samples = atoi(v);
            i++;
        } else if (!strcmp(a, "--threads") && v) {
            threads = atoi(v);
            i++;
        } else if (!strcmp(a, "--opens") && v) {
            opens = atoi(v);
            i++;
        } else if (!strcmp(a, "--open-timeout") && v) {
            timeout_s = atof(v);
            i++;
        } else if (!strcmp(a, "--load-bytes") && v) {
            g_load_bytes = parse_size(v);
            i++;
        } else if (!strcmp(a, "--pinmap") && v) {
            pinmap = atoi(v);
            i++;
        } else if (!strcmp(a, "--pinmap-bytes") && v) {
            pinmap_bytes = parse_size(v);
            i++;
        } else if (!strcmp(a, "--bw-budget") && v) {
            bw_budget = atof(v);
            i++;
        } else if (!strcmp(a, "--bw") && v) {
            nbw = parse_sizes(v, bw);
            i++;
        } else if (!strcmp(a, "--no-latency")) do_lat = 0;
        else if (!strcmp(a, "--no-open")) do_open = 0;
        else if (!strcmp(a, "--sizes") && v) {
            nsizes = parse_sizes(v, sizes);
            i++;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!lib) die("--lib DIR (holding libgdrpy.so.0 and libgdrapi.so.2) is required");
    if (threads < 0 || threads > 64) die("--threads must be 0..64");
    if (samples < 10) samples = 10;
    if (g_load_bytes == 0 || g_load_bytes > 4096) die("--load-bytes must be 1..4096");
    if (pinmap < 0 || pinmap > 1000000) die("--pinmap must be 0..1000000");
    if (pinmap && (pinmap_bytes == 0 || pinmap_bytes % 65536)) die("--pinmap-bytes must be a multiple of 64 KiB");
    for (int k = 0; k < nbw; k++)
        if (bw[k] == 0 || bw[k] > ((size_t)1 << 32)) die("--bw sizes must be 1 B..4 GiB");
    if (!(bw_budget > 0 && bw_budget <= 60)) die("--bw-budget must be in (0, 60] seconds");
    char path[4096];
    snprintf(path, sizeof path, "%s/libgdrpy.so.0", lib);
    gp.so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!gp.so) die("dlopen %s: %s", path, dlerror());
    SYM(gp.so, gp.open, "gdrpy_open");
    SYM(gp.so, gp.close, "gdrpy_close");
    SYM(gp.so, gp.pin, "gdrpy_pin");
    SYM(gp.so, gp.unpin, "gdrpy_unpin");
    SYM(gp.so, gp.map, "gdrpy_map");
    SYM(gp.so, gp.unmap, "gdrpy_unmap");
    SYM(gp.so, gp.write, "gdrpy_write");
    SYM(gp.so, gp.read, "gdrpy_read");
    SYM(gp.so, gp.to_mapping, "gdrpy_copy_to_mapping");
    SYM(gp.so, gp.backend_from_name, "gdrpy_backend_from_name");
    SYM(gp.so, gp.last_error, "gdrpy_last_error");
    SYM(gp.so, gp.sim_alloc, "gdrpy_sim_alloc");
    SYM(gp.so, gp.sim_free, "gdrpy_sim_free");
    g_backend = gp.backend_from_name(backend);
    if (g_backend < 0) die("unknown backend %s", backend);
    int is_sim = !strcmp(backend, "sim");
    if (is_sim) setenv("GDRPY_BACKEND", "sim", 1); /* libgdrapi + test memory */
    else unsetenv("GDRPY_BACKEND");

    snprintf(path, sizeof path, "%s/libgdrapi.so.2", lib);
    ga.so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!ga.so) die("dlopen %s: %s", path, dlerror());
    SYM(ga.so, ga.open, "gdr_open");
    SYM(ga.so, ga.close, "gdr_close");
    SYM(ga.so, ga.pin, "gdr_pin_buffer");
    SYM(ga.so, ga.unpin, "gdr_unpin_buffer");
    SYM(ga.so, ga.map, "gdr_map");
    SYM(ga.so, ga.unmap, "gdr_unmap");
    SYM(ga.so, ga.to, "gdr_copy_to_mapping");
    SYM(ga.so, ga.from, "gdr_copy_from_mapping");
    if (tm_init(ga.so)) die("no device memory: %s", tm.why);

    const size_t bytes = 1 << 16;
    /* gdrpy side */
    uint64_t d = 0;
    tm_buf tb;
    dev_alloc(bytes, is_sim, &d, &tb);
    if (gp.open(g_device, g_backend, &g_ctx)) die("gdrpy_open: %s", gp.last_error());
    if (gp.pin(g_ctx, d, bytes, 0, &g_pin)) die("gdrpy_pin: %s", gp.last_error());
    void *mp, *up;
    if (gp.map(g_ctx, g_pin, &mp, &up)) die("gdrpy_map: %s", gp.last_error());
    g_user = up;
    /* libgdrapi side (its own copy of the core; its own memory) */
    tm_buf gb;
    if (tm_alloc(&gb, bytes, TM_CUMEMALLOC)) die("device memory for libgdrapi");
    void *g = ga.open();
    if (!g) die("gdr_open failed");
    if (ga.pin(g, gb.d, bytes, 0, 0, &g_mh)) die("gdr_pin_buffer failed");
    void *gm;
    if (ga.map(g, g_mh, &gm, bytes)) die("gdr_map failed");
    g_gmap = gm;

    printf("# gdrpy_apilat: lib %s, backend %s%s\n", lib, backend,
           is_sim ? " (host memory standing in for a GPU: not GPU numbers)" : "");
    int rc = 0;
    if (do_lat) latency(sizes, nsizes, samples, 1, is_sim);
    if (pinmap) pin_map_cost(pinmap_bytes, pinmap, is_sim);
    if (nbw) bandwidth(bw, nbw, bw_budget, is_sim);
    if (do_open) {
        printf("# open under load: gdrpy_open+gdrpy_close of a new context, %d times, while "
               "%d threads loop gdrpy_write of %zu B on another context\n",
               opens, threads,
               g_load_bytes);
        open_under_load(0, opens < 20 ? opens : 20, timeout_s, limit_ms);
        if (threads) rc |= !open_under_load(threads, opens, timeout_s, limit_ms);
    }
    ga.unmap(g, g_mh, gm, bytes);
    ga.unpin(g, g_mh);
    ga.close(g);
    tm_free(&gb);
    gp.unmap(g_ctx, g_pin);
    gp.unpin(g_ctx, g_pin);
    gp.close(g_ctx);
    dev_free(d, is_sim, &tb);
    tm_fini();
    return rc;
}
