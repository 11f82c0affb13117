/*
 * test_proof_fake.c - issue 45 against fakenv, the stand-in driver:
 *
 *  nowait  a kernel "runs" on the legacy default stream (fake_legacy_busy)
 *          from before the context is opened: the self-test, learning, the
 *          pin and map of every memory kind, and copy-engine reads without a
 *          stream (direct, staged, page-locked: issue 44) must make no call
 *          that a real driver orders after that kernel (fake_waits counts
 *          them); a read on the legacy stream, asked for, still waits.
 *  lock    pins whose proofs are slow (fake_slow_private) must not stop a
 *          second thread's gdrpy_write through an existing mapping: the pin
 *          does its backend work without the context lock.
 *  churn   the chunk's only record is found by a scan of the heap (tied to
 *          nothing) and names another object; every byte changes between
 *          reads: nothing was compared, so the pin must be refused.
 *  zeroed  the same record; the caller's memory and the object it names are
 *          both never written (identical zeroes): refused.
 *  second  the record names another object, larger than the chunk, holding
 *          the same bytes (pools and VMM): refused by its RM size.
 * Each of the last four fails on the code before issue 45 (it accepted those
 * pins, mapping the wrong object, or stalled the writer for the whole pin).
 *
 *   LD_PRELOAD=build/fakenv/libcuda.so.1 LD_LIBRARY_PATH=build/fakenv build/test_proof_fake
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gdrpy.h"
#include "gdrpy_host.h"
#include "../tally.h"
#include "fake_client.h"

static void (*fake_legacy_busy)(int);
static int (*fake_waits)(char *, size_t);
static void (*fake_slow_private)(int);
static void (*fake_arm_lie)(int);
static void (*fake_hide_records)(int);
static void (*fake_churn)(int);
static void (*fake_mirror_decoys)(int);

#define C2M (2u << 20)

static uint64_t pool_alloc(int htypes, size_t n)
{
    int props[22] = {1, htypes, 1, 0}; /* CUmemPoolProps: pinned, handle types, device 0 */
    void *pool = NULL;
    uint64_t q = 0;
    if (cuMemPoolCreate(&pool, props) || cuMemAllocFromPoolAsync(&q, n, pool, NULL)) return 0;
    return q;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- nowait ------------------------------------------------------------- */

static void nowait(gdrpy_ctx_t *ctx)
{
    struct {
        const char *what;
        uint64_t va;
        size_t n;
    } k[] = {
        {"cuMemAlloc", 0, 1u << 16},
        {"cuMemCreate POSIX_FD", 0, C2M},
        {"cuMemCreate without handle types", 0, C2M},
        {"default pool", 0, 1u << 16},
        {"pool without handle types", 0, 1u << 20},
        {"pool with POSIX_FD", 0, 1u << 20},
    };
    const int nk = (int)(sizeof k / sizeof k[0]);
    CHECK(cuMemAlloc(&k[0].va, k[0].n) == 0, "cuMemAlloc");
    k[1].va = vmm_alloc(C2M, 1);
    k[2].va = vmm_alloc(C2M, 0);
    CHECK(cuMemAllocAsync(&k[3].va, k[3].n, NULL) == 0, "cuMemAllocAsync");
    k[4].va = pool_alloc(0, k[4].n);
    k[5].va = pool_alloc(1, k[5].n);
    for (int i = 0; i < nk; i++) {
        CHECK(k[i].va != 0, "%s: allocation", k[i].what);
        if (k[i].va) fill(k[i].va, k[i].n, (uint8_t)(11 * i + 1));
    }
    char first[128];
    /* the kernel starts before the context opens: the self-test runs under it */
    fake_legacy_busy(1);
    int rc = gdrpy_open(0, GDRPY_BACKEND_NVRM, ctx);
    CHECK(rc == 0, "open: %s", gdrpy_last_error());
    int w = fake_waits(first, sizeof first);
    CHECK(w == 0, "nowait: open (self-test) made %d calls that wait for the kernel, first %s",
          w, first);
    fake_legacy_busy(1);
    for (int i = 0; i < nk && !rc; i++) {
        if (!k[i].va) continue;
        for (int rep = 0; rep < 2; rep++) { /* the first pin of a kind learns */
            gdrpy_pin_t pin = 0;
            void *mp = NULL, *up = NULL;
            int r = gdrpy_pin(*ctx, k[i].va, k[i].n, 0, &pin);
            CHECK(r == 0, "nowait: pin %s: %s", k[i].what, gdrpy_last_error());
            if (!r) {
                CHECK(gdrpy_map(*ctx, pin, &mp, &up) == 0, "nowait: map %s: %s", k[i].what,
                      gdrpy_last_error());
                uint8_t got[16];
                gdrpy_read(*ctx, pin, 0, got, sizeof got);
                CHECK(got[1] == (uint8_t)(11 * i + 1 + 13), "nowait: %s reads its bytes",
                      k[i].what);
                /* copy-engine reads without a stream, each way */
                static uint8_t ce[3][8192];
                memset(ce, 0, sizeof ce);
                CHECK(gdrpy_ce_read(*ctx, pin, 0, ce[0], 8192, NULL) == 0 &&
                          gdrpy_ce_read_staged(*ctx, pin, 0, ce[1], 8192, NULL) == 0 &&
                          gdrpy_ce_read_locked(*ctx, pin, 0, ce[2], 8192, NULL) == 0,
                      "nowait: engine reads of %s: %s", k[i].what, gdrpy_last_error());
                CHECK(ce[0][8191] == (uint8_t)(11 * i + 1 + 13 * 8191 + 31) &&
                          !memcmp(ce[0], ce[1], 8192) && !memcmp(ce[0], ce[2], 8192),
                      "nowait: engine reads of %s return its bytes", k[i].what);
                gdrpy_unmap(*ctx, pin);
                gdrpy_unpin(*ctx, pin);
            }
            w = fake_waits(first, sizeof first);
            CHECK(w == 0, "nowait: pin %d of %s made %d calls that wait for the kernel, "
                          "first %s",
                  rep + 1, k[i].what, w, first);
            fake_legacy_busy(1); /* counts from 0 again */
        }
    }
    /* asked for: a read on the legacy stream is ordered after its kernels */
    gdrpy_pin_t pin = 0;
    uint8_t got[64];
    if (!rc && gdrpy_pin(*ctx, k[0].va, k[0].n, 0, &pin) == 0) {
        CHECK(gdrpy_ce_read(*ctx, pin, 0, got, sizeof got, (void *)1) == 0 &&
                  gdrpy_stream_synchronize(*ctx, (void *)1) == 0,
              "nowait: a read on the legacy stream: %s", gdrpy_last_error());
        CHECK(fake_waits(first, sizeof first) > 0, "nowait: a read on the legacy stream waits");
        gdrpy_unpin(*ctx, pin);
    }
    fake_legacy_busy(0);
}

/* ---- lock --------------------------------------------------------------- */

struct writer {
    gdrpy_ctx_t ctx;
    gdrpy_pin_t pin;
    volatile int stop;
    uint64_t writes; /* atomic */
    int errors;
};

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    uint64_t v = 0;
    while (!__atomic_load_n(&w->stop, __ATOMIC_RELAXED)) {
        v++;
        if (gdrpy_write(w->ctx, w->pin, 0, &v, sizeof v)) w->errors++;
        __atomic_add_fetch(&w->writes, 1, __ATOMIC_RELAXED);
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void lock(gdrpy_ctx_t ctx)
{
    uint64_t a = 0, b = 0;
    CHECK(cuMemAlloc(&a, 1u << 16) == 0 && cuMemAlloc(&b, 1u << 16) == 0, "lock: alloc");
    fill(a, 1u << 16, 3);
    fill(b, 1u << 16, 4);
    struct writer w = {ctx, 0, 0, 0, 0};
    void *mp, *up;
    CHECK(gdrpy_pin(ctx, a, 1u << 16, 0, &w.pin) == 0 && gdrpy_map(ctx, w.pin, &mp, &up) == 0,
          "lock: the writer's pin: %s", gdrpy_last_error());
    pthread_t t;
    pthread_create(&t, NULL, writer_main, &w);
    fake_slow_private(150); /* every proof copy takes 150 ms */
    for (int i = 0; i < 3; i++) {
        uint64_t before = __atomic_load_n(&w.writes, __ATOMIC_RELAXED);
        double t0 = now_ms();
        gdrpy_pin_t pin;
        int rc = gdrpy_pin(ctx, b, 1u << 16, 0, &pin);
        double ms = now_ms() - t0;
        uint64_t during = __atomic_load_n(&w.writes, __ATOMIC_RELAXED) - before;
        CHECK(rc == 0, "lock: slow pin: %s", gdrpy_last_error());
        if (!rc) gdrpy_unpin(ctx, pin);
        /* a writer held off by the pin completes at most the write it had begun */
        CHECK(ms < 150 || during >= 3, "lock: %llu writes went through during a %.0f ms pin",
              (unsigned long long)during, ms);
    }
    fake_slow_private(0);
    __atomic_store_n(&w.stop, 1, __ATOMIC_RELAXED);
    pthread_join(t, NULL);
    CHECK(w.errors == 0, "lock: %d writes failed", w.errors);
    gdrpy_unmap(ctx, w.pin);
    gdrpy_unpin(ctx, w.pin);
}

/* ---- proofs ------------------------------------------------------------- */

/* Pins [va, +n): 0 when refused with `says` in the message; else reports
 * what happened (accepted, and which memory the mapping shows). */
static void must_refuse(gdrpy_ctx_t ctx, const char *what, uint64_t va, size_t n,
                        const char *says)
{
    gdrpy_pin_t pin;
    int rc = gdrpy_pin(ctx, va, n, 0, &pin);
    if (rc) {
        CHECK(strstr(gdrpy_last_error(), says) != NULL, "%s: refused, but not for \"%s\": %s",
              what, says, gdrpy_last_error());
        printf("  %s: refused: %.300s\n", what, gdrpy_last_error());
        return;
    }
    void *mp, *up;
    const char *shows = "?";
    if (gdrpy_map(ctx, pin, &mp, &up) == 0) {
        uint64_t mark = 0x5a5a5a5a12345678ull, got = 0;
        gdrpy_write(ctx, pin, 0, &mark, 8);
        cuMemcpyDtoH(&got, va, 8);
        shows = got == mark ? "the caller's memory, with nothing proven"
                            : "ANOTHER object than the caller's";
        gdrpy_unmap(ctx, pin);
    }
    gdrpy_unpin(ctx, pin);
    CHECK(0, "%s: accepted (the mapping shows %s)", what, shows);
}

static void proofs(gdrpy_ctx_t ctx)
{
    /* churn: the record is in the heap only and names a decoy; every byte
     * read changes (the caller's and the decoy's) */
    fake_hide_records(1);
    fake_arm_lie(1);
    uint64_t q = pool_alloc(0, 1u << 20);
    CHECK(q != 0, "churn: pool alloc");
    fill(q, 1u << 20, 21);
    fake_churn(1);
    must_refuse(ctx, "churn (every byte changes between reads)", q, 1u << 20, "stayed the same");
    fake_churn(0);

    /* zeroed: the same, never written (the decoy too) */
    q = pool_alloc(0, 1u << 20);
    CHECK(q != 0, "zeroed: pool alloc");
    must_refuse(ctx, "zeroed (identical never-written memory)", q, 1u << 20, "0x00");
    fake_arm_lie(0);
    fake_hide_records(0);

    /* second: the record the pool's walk finds names another object, twice
     * the chunk's size, holding the same bytes */
    fake_arm_lie(2);
    fake_mirror_decoys(1);
    q = pool_alloc(0, 1u << 20);
    CHECK(q != 0, "second: pool alloc");
    fill(q, 1u << 20, 23);
    must_refuse(ctx, "second record (pool), same bytes, another object", q, 1u << 20, "size");
    uint64_t v = vmm_alloc(C2M, 0);
    CHECK(v != 0, "second: vmm alloc");
    fill(v, C2M, 24);
    must_refuse(ctx, "second record (VMM), same bytes, another object", v, C2M, "size");
    fake_mirror_decoys(0);
    fake_arm_lie(0);

    /* and what is proven still pins: a record in the heap only, naming the
     * right object, whose bytes are stable and distinct */
    fake_hide_records(1);
    q = pool_alloc(0, 1u << 20);
    fill(q, 1u << 20, 25);
    gdrpy_pin_t pin;
    int rc = gdrpy_pin(ctx, q, 1u << 20, 0, &pin);
    CHECK(rc == 0, "heap record of the right object, written: %s", gdrpy_last_error());
    if (!rc) gdrpy_unpin(ctx, pin);
    fake_hide_records(0);
}

int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : "";
    fake_cu_load(); /* the test allocates before gdrpy does */
    fake_legacy_busy = (void (*)(int))sym("fake_legacy_busy");
    fake_waits = (int (*)(char *, size_t))sym("fake_waits");
    fake_slow_private = (void (*)(int))sym("fake_slow_private");
    fake_arm_lie = (void (*)(int))sym("fake_arm_lie");
    fake_hide_records = (void (*)(int))sym("fake_hide_records");
    fake_churn = (void (*)(int))sym("fake_churn");
    fake_mirror_decoys = (void (*)(int))sym("fake_mirror_decoys");

    gdrpy_ctx_t ctx = 0;
    nowait(&ctx); /* first: the self-test and learning run under the "kernel" */
    if (!ctx) {
        printf("test_proof_fake: %d passed, %d failed\n", passed, failed);
        return 1;
    }
    if (!*only || !strcmp(only, "lock")) lock(ctx);
    if (!*only || !strcmp(only, "proofs")) proofs(ctx);
    uint64_t live = 1;
    gdrpy_ctx_live_objects(ctx, &live);
    CHECK(live == 0, "%llu RM objects left", (unsigned long long)live);
    gdrpy_close(ctx);
    printf("test_proof_fake: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
