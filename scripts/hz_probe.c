/*
 * hz_probe.c - what a copy's bookkeeping costs next to an 8-byte store into
 * the mapping, on this machine (diagnostic for the before/after of issue 17).
 *
 *   cc -O2 -Inative/include -Inative/tests scripts/hz_probe.c native/build/libgdrpy.a \
 *      -ldl -pthread -o /tmp/hz_probe && /tmp/hz_probe [sim|auto]
 *
 * Rows (ns per call, median of 9 interleaved rounds of batched means), each an
 * 8-byte gdrpy_copy_to_mapping (stores + sfence) with around it:
 *   kernel      nothing
 *   record      libgdrapi's per-thread record as with membarrier: a plain store
 *               of the slot, a compiler barrier, two loads, the copy, a
 *               release store of NULL (the record in initial-exec TLS here)
 *   record+lock the same with the full fence libgdrapi issues where membarrier
 *               is unavailable (lock or on the stack)
 *   record+mfence  the same with MFENCE
 *   xadd after  one atomic add + one atomic sub after the copy (gdrpy core's
 *               in-flight count)
 * and whether membarrier(PRIVATE_EXPEDITED) can be registered here.
 */
#define _GNU_SOURCE
#include <gnu/libc-version.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "gdrapi_testmem.h"
#include "gdrpy.h"

typedef struct {
    void *_Atomic slot;
} rec_t;
static __thread rec_t t_rec;
static _Atomic int g_state = 2;
static _Atomic long g_inflight;
static char *g_dst;
static char g_src[64] __attribute__((aligned(64)));

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

enum { V_KERNEL,
       V_REC,
       V_REC_LOCK,
       V_REC_MFENCE,
       V_XADD,
       V_COUNT };
static const char *v_name[V_COUNT] = {"kernel", "record", "record+lock", "record+mfence",
                                      "xadd after"};

static inline void one(int v)
{
    rec_t *r = &t_rec;
    switch (v) {
    case V_KERNEL: gdrpy_copy_to_mapping(g_dst, g_src, 8); break;
    case V_XADD:
        gdrpy_copy_to_mapping(g_dst, g_src, 8);
        atomic_fetch_add_explicit(&g_inflight, 1, memory_order_relaxed);
        atomic_fetch_sub_explicit(&g_inflight, 1, memory_order_release);
        break;
    default:
        atomic_store_explicit(&r->slot, (void *)&g_state, memory_order_relaxed);
        if (v == V_REC_LOCK) atomic_thread_fence(memory_order_seq_cst);
        else if (v == V_REC_MFENCE) __asm__ __volatile__("mfence" ::: "memory");
        else atomic_signal_fence(memory_order_seq_cst);
        if (atomic_load_explicit(&g_state, memory_order_acquire) != 2) abort();
        gdrpy_copy_to_mapping(g_dst, g_src, 8);
        atomic_store_explicit(&r->slot, NULL, memory_order_release);
    }
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *backend = argc > 1 ? argv[1] : "auto";
    int sim = !strcmp(backend, "sim");
    long mq = syscall(SYS_membarrier, 0 /* QUERY */, 0, 0);
    long mr = syscall(SYS_membarrier, 1 << 4 /* REGISTER_PRIVATE_EXPEDITED */, 0, 0);
    printf("# glibc %s; membarrier QUERY -> %ld, REGISTER_PRIVATE_EXPEDITED -> %ld\n",
           gnu_get_libc_version(), mq, mr);
    uint64_t d = 0;
    tm_buf tb = {0};
    if (sim) {
        setenv("GDRPY_BACKEND", "sim", 1);
        if (gdrpy_sim_alloc(1 << 16, &d)) return 1;
    } else {
        if (tm_init(NULL) || tm_alloc(&tb, 1 << 16, TM_CUMEMALLOC)) {
            fprintf(stderr, "no device memory: %s\n", tm.why);
            return 1;
        }
        d = tb.d;
    }
    gdrpy_ctx_t ctx;
    gdrpy_pin_t pin;
    void *mp, *up;
    if (gdrpy_open(0, gdrpy_backend_from_name(backend), &ctx) || gdrpy_pin(ctx, d, 1 << 16, 0, &pin) ||
        gdrpy_map(ctx, pin, &mp, &up)) {
        fprintf(stderr, "gdrpy: %s\n", gdrpy_last_error());
        return 1;
    }
    g_dst = up;
    enum { ROUNDS = 9,
           SAMPLES = 200,
           BATCH = 32 };
    static double s[V_COUNT][ROUNDS * SAMPLES];
    for (int v = 0; v < V_COUNT; v++)
        for (int i = 0; i < 2000; i++) one(v);
    for (int r = 0; r < ROUNDS; r++)
        for (int v = 0; v < V_COUNT; v++) {
            for (int i = 0; i < 100; i++) one(v);
            for (int k = 0; k < SAMPLES; k++) {
                double t0 = now_ns();
                for (int i = 0; i < BATCH; i++) one(v);
                s[v][r * SAMPLES + k] = (now_ns() - t0) / BATCH;
            }
        }
    printf("# hz_probe (%s, backend %s): ns per 8-byte copy, median / p90 of %d batched means\n",
           sim ? "sim" : "GPU", backend, ROUNDS * SAMPLES);
    for (int v = 0; v < V_COUNT; v++) {
        qsort(s[v], ROUNDS * SAMPLES, sizeof(double), cmp);
        printf("hz_probe %-14s %8.1f %8.1f\n", v_name[v], s[v][ROUNDS * SAMPLES / 2],
               s[v][ROUNDS * SAMPLES * 9 / 10]);
    }
    gdrpy_unmap(ctx, pin);
    gdrpy_unpin(ctx, pin);
    gdrpy_close(ctx);
    if (sim) gdrpy_sim_free(d);
    else tm_free(&tb);
    return 0;
}
