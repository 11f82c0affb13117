/*
 * read_ce.c - libgdrapi's large reads through the copy engine (read_ce.h).
 *
 * A CPU read through BAR1 costs ~1.4 us per KiB (H200: 64 KiB in 68 us),
 * while the copy engine moves 64 KiB into page-locked memory in ~8 us after
 * a fixed ~7 us.  So from a crossover size on, gdr_copy_from_mapping reads
 * through the engine: straight into the caller's buffer when it is
 * page-locked (gdrpy_host_kind), else through the context's staging ring
 * (page-locked chunks, copied out while the engine moves the next one).
 * Both run on gdrpy's own non-blocking stream (cudadrv.h), never ordered
 * after the caller's kernels, as a BAR1 read never is.
 *
 * GDRCopy's semantics hold: the call returns when the bytes are in dst, and
 * the read sees the caller's earlier gdr_copy_to_mapping stores: before the
 * engine starts, gdrpy's read paths flush them with a store fence and one
 * load through the mapping, which PCIe orders after the posted writes
 * (gp_pin_flush in core.c).
 *
 * The crossover is measured once per device, at the first read that could
 * take the engine, on the pinned memory itself and with reads only: the two
 * paths timed at two sizes (16 and 64 KiB where the pin has them), a line
 * fitted through each, and their intersection taken.  GDRPY_GDRAPI_READ_CE
 * (read by gdr_open) replaces it with a size, or "off".  On sim the engine
 * is the staging ring's stand-in thread: auto means BAR1 only there, and a
 * size given in the environment makes the path testable.
 *
 * Threads: the ring takes one staged copy at a time per context (others
 * wait: a small pool with a lock), the stream is per device, the threshold
 * one atomic per device, measured by one thread while the others read
 * through BAR1.  Everything lives in the gdrpy context, so gdr_close (or
 * nothing, at process exit) frees it; no thread owns CUDA state.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gdrpy_host.h"
#include "read_ce.h"

#define RD_PROBE_MIN ((size_t)4096) /* never faster below this: ~7 us fixed vs 5 us */
#define RD_MAX_DEV 64
#define RD_REPS 5

_Atomic size_t gp_rd_floor = RD_PROBE_MIN;

static _Atomic size_t rd_at[RD_MAX_DEV]; /* 0: not measured yet; GP_RD_OFF: never */
static _Atomic int rd_busy[RD_MAX_DEV];  /* a thread is measuring */
static _Atomic int rd_warned;

size_t gp_rd_policy(void)
{
    const char *e = getenv("GDRPY_GDRAPI_READ_CE");
    if (!e || !*e || !strcmp(e, "auto")) return GP_RD_AUTO;
    if (!strcmp(e, "off")) return GP_RD_OFF;
    char *end;
    unsigned long long v = strtoull(e, &end, 10);
    unsigned shift = 0;
    if (*end == 'k' || *end == 'K') shift = 10;
    else if (*end == 'm' || *end == 'M') shift = 20;
    if (shift) end++;
    if (end == e || *end || v == 0 || v > (1ull << 40) >> shift) {
        gp_log(GP_LOG_CONFIG, "GDRPY_GDRAPI_READ_CE=%s is not a size in bytes (a number, K or "
                              "M suffix), \"auto\" or \"off\"; using auto",
               e);
        return GP_RD_AUTO;
    }
    size_t at = (size_t)(v << shift);
    if (at < 64) at = 64; /* smaller reads always take the mapping */
    size_t f = atomic_load(&gp_rd_floor);
    while (at < f && !atomic_compare_exchange_weak(&gp_rd_floor, &f, at)) {
    }
    return at;
}

/* The engine's read of [off, off+n) of the pin into dst. */
static int engine_read(const gp_rd_src *s, void *dst, size_t off, size_t n)
{
    int kind = GDRPY_HOST_PAGEABLE;
    if (gdrpy_host_kind(s->ctx, dst, n, &kind) != 0) kind = GDRPY_HOST_PAGEABLE;
    if (kind != GDRPY_HOST_PAGEABLE)
        return gdrpy_ce_read_locked(s->ctx, s->pin, off, dst, n, NULL);
    return gdrpy_ce_read_staged(s->ctx, s->pin, off, dst, n, NULL);
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median time of RD_REPS reads of n bytes at the pinned address into buf:
 * through the mapping (engine 0) or the engine (1).  < 0 on an error. */
static double time_read(const gp_rd_src *s, void *buf, size_t n, int engine)
{
    double t[RD_REPS];
    for (int i = 0; i < RD_REPS; i++) {
        double t0 = now_us();
        if (engine) {
            if (engine_read(s, buf, 0, n)) return -1;
        } else {
            gdrpy_copy_from_mapping(buf, s->user, n);
        }
        t[i] = now_us() - t0;
    }
    qsort(t, RD_REPS, sizeof t[0], cmp_d);
    return t[RD_REPS / 2];
}

/* The crossover on this device, measured on the pin: 0 when the pin has too
 * few bytes to measure on (ask again later), GP_RD_OFF when the engine never
 * wins (or fails). */
static size_t measure(const gp_rd_src *s)
{
    size_t n2 = s->avail < 65536 ? gp_round_down(s->avail, 4096) : 65536;
    if (n2 < 16384) return 0;
    size_t n1 = n2 / 4;
    void *buf = malloc(n2);
    if (!buf) return 0;
    memset(buf, 0, n2);
    double b1 = -1, b2 = -1, e1 = -1, e2 = -1;
    /* warm-up: the first engine read builds the ring and the stream */
    if (engine_read(s, buf, 0, n2) == 0) {
        e1 = time_read(s, buf, n1, 1);
        e2 = time_read(s, buf, n2, 1);
        b1 = time_read(s, buf, n1, 0);
        b2 = time_read(s, buf, n2, 0);
    }
    free(buf);
    if (e1 < 0 || e2 < 0) {
        gp_log(3, "gdrapi: device %d: a copy-engine read failed (%s); reads go through the "
                  "mapping",
               s->device, gdrpy_last_error());
        return GP_RD_OFF;
    }
    /* t = a + k n for each path; they cross at (a_e - a_b) / (k_b - k_e) */
    double kb = (b2 - b1) / (double)(n2 - n1), ke = (e2 - e1) / (double)(n2 - n1);
    double ab = b1 - kb * (double)n1, ae = e1 - ke * (double)n1;
    size_t at;
    if (kb <= ke) at = e1 < b1 ? RD_PROBE_MIN : GP_RD_OFF;
    else {
        double x = (ae - ab) / (kb - ke);
        at = x <= (double)RD_PROBE_MIN   ? RD_PROBE_MIN
             : x >= (double)(1ull << 40) ? GP_RD_OFF
                                         : gp_round_up((size_t)x, 4096);
    }
    gp_log(2, "gdrapi: device %d: reads of %zu/%zu B take %.1f/%.1f us through the mapping, "
              "%.1f/%.1f us through the copy engine: the engine from %s%zu B",
           s->device, n1, n2, b1, b2, e1, e2, at == GP_RD_OFF ? "(never) " : "",
           at == GP_RD_OFF ? (size_t)0 : at);
    return at;
}

int gp_rd_large(const gp_rd_src *s, void *dst, const void *map_src, size_t n)
{
    size_t at = s->policy;
    if (at == GP_RD_AUTO) {
        if (s->sim || s->device < 0 || s->device >= RD_MAX_DEV) return 1;
        at = atomic_load_explicit(&rd_at[s->device], memory_order_acquire);
        if (at == 0) {
            int z = 0;
            if (!atomic_compare_exchange_strong(&rd_busy[s->device], &z, 1)) return 1;
            at = measure(s);
            if (at) atomic_store_explicit(&rd_at[s->device], at, memory_order_release);
            atomic_store(&rd_busy[s->device], 0);
            if (!at) return 1;
        }
    }
    const char *p = map_src;
    if (n < at || p < s->user || (size_t)(p - s->user) > s->avail ||
        n > s->avail - (size_t)(p - s->user))
        return 1; /* not the pinned request's backed bytes: the mapping reads them */
    if (engine_read(s, dst, (size_t)(p - s->user), n) == 0) return 0;
    int w = 0;
    if (atomic_compare_exchange_strong(&rd_warned, &w, 1))
        gp_log(3, "gdrapi: a copy-engine read of %zu bytes failed (%s); it and later failures "
                  "read through the mapping",
               n, gdrpy_last_error());
    return 1;
}
