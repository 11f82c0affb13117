/*
 * test_nvrm_fake.c - the nvrm backend's table selection, self-test, route C
 * layout learning and read-only identity check, run against fakenv (a
 * stand-in driver: see fakenv.c), so the logic is exercised without a GPU.
 *
 *   LD_PRELOAD=build/fakenv/libcuda.so.1 LD_LIBRARY_PATH=build/fakenv \
 *       build/test_nvrm_fake MODE
 *
 * One mode per process (the self-test runs once per process); the
 * environment of each mode is set by `make check` (Makefile).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdrpy.h"
#include "../tally.h"
#include "fake_client.h"

static CUresult (*cuMemAlloc)(uint64_t *, size_t);
static CUresult (*cuMemFree)(uint64_t);
static CUresult (*cuMemcpyHtoD)(uint64_t, const void *, size_t);
static CUresult (*cuMemcpyDtoH)(void *, uint64_t, size_t);
static void (*fake_arm_skew)(int64_t);
static void (*fake_htod_reset)(void);
static uint64_t (*fake_htod_into)(uint64_t, uint64_t);
static void *(*fake_host_ptr)(uint64_t);


static char report[16384];

static int selftest(void)
{
    int rc = gdrpy_nvrm_selftest(0, report, sizeof report);
    printf("report: %s\n", report);
    return rc;
}

static uint64_t alloc_filled(size_t n, int random_fill)
{
    uint64_t d = 0;
    CUresult r = cuMemAlloc(&d, n);
    if (r) return 0;
    uint8_t *b = calloc(1, n);
    if (random_fill)
        for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(i * 131 + 7);
    cuMemcpyHtoD(d, b, n);
    free(b);
    return d;
}

/* Pins [d, d+n) route C; 0 or the code. */
static int pin_once(gdrpy_ctx_t ctx, uint64_t d, size_t n, gdrpy_pin_t *pin)
{
    return gdrpy_pin(ctx, d, n, 0, pin);
}

struct writer {
    volatile uint64_t *counter;
    volatile int stop;
    uint64_t iters;
};

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    while (!w->stop) {
        *w->counter = *w->counter + 1; /* read-modify-write, like the GPU test's kernel */
        w->iters++;
    }
    return NULL;
}

static void mode_default(void)
{
    CHECK(selftest() == 0, "%s", gdrpy_last_error());
    CHECK(strstr(report, "\"usable\": true") != NULL, "usable");
    CHECK(strstr(report, "\"A\": {\"tested\": true, \"ok\": true") != NULL, "route A");
    CHECK(strstr(report, "\"C\": {\"tested\": true, \"ok\": true") != NULL, "route C");
    CHECK(strstr(report, "known CUDA 13.0 layout confirmed") != NULL, "layout");
    CHECK(strstr(report, "\"mapping_base_checked\": true") != NULL, "mapbase");
    CHECK(strstr(report, "\"branch\": \"580\"") != NULL, "table");

    gdrpy_ctx_t ctx;
    CHECK(gdrpy_open(0, GDRPY_BACKEND_NVRM, &ctx) == 0, "%s", gdrpy_last_error());

    /* zeroed memory: the old check wrote here; now nothing may be written */
    uint64_t d = alloc_filled(65536, 0);
    CHECK(d != 0, "alloc");
    fake_htod_reset();
    gdrpy_pin_t pin;
    int rc = pin_once(ctx, d, 65536, &pin);
    CHECK(rc == 0, "pin zeroed: %s", gdrpy_last_error());
    CHECK(fake_htod_into(d, 65536) == 0, "pin wrote %llu bytes into the user's memory",
          (unsigned long long)fake_htod_into(d, 65536));
    if (!rc) {
        void *mp, *up;
        CHECK(gdrpy_map(ctx, pin, &mp, &up) == 0, "%s", gdrpy_last_error());
        uint64_t v = 0x1122334455667788ull, back = 0;
        CHECK(gdrpy_write(ctx, pin, 104, &v, 8) == 0, "%s", gdrpy_last_error());
        cuMemcpyDtoH(&back, d + 104, 8);
        CHECK(back == v, "write through the mapping landed: %llx", (unsigned long long)back);
        gdrpy_unmap(ctx, pin);
        gdrpy_unpin(ctx, pin);
    }

    /* a concurrent writer: pins succeed and no write is lost */
    struct writer w = {(volatile uint64_t *)fake_host_ptr(d), 0, 0};
    *w.counter = 0;
    pthread_t th;
    pthread_create(&th, NULL, writer_main, &w);
    int fails = 0;
    for (int i = 0; i < 300; i++) {
        if (pin_once(ctx, d, 4096, &pin) == 0) gdrpy_unpin(ctx, pin);
        else fails++;
    }
    w.stop = 1;
    pthread_join(th, NULL);
    CHECK(fails == 0, "%d of 300 pins failed under a concurrent writer: %s", fails,
          gdrpy_last_error());
    CHECK(*w.counter == w.iters, "lost writes: counter %llu, iterations %llu",
          (unsigned long long)*w.counter, (unsigned long long)w.iters);

    /* IPC words that lie about the offset: refused, zeroed or not */
    fake_arm_skew(4096);
    uint64_t z = alloc_filled(65536, 0), r = alloc_filled(65536, 1);
    fake_arm_skew(0);
    rc = pin_once(ctx, z, 65536, &pin);
    CHECK(rc == GDRPY_ENOTSUP && strstr(gdrpy_last_error(), "MAPPING_BASE_ADDR"),
          "skewed, zeroed: rc %d %s", rc, gdrpy_last_error());
    if (!rc) gdrpy_unpin(ctx, pin);
    rc = pin_once(ctx, r, 65536, &pin);
    CHECK(rc != 0, "skewed, patterned: rc %d", rc);
    if (!rc) gdrpy_unpin(ctx, pin);

    uint64_t live = 1;
    gdrpy_ctx_live_objects(ctx, &live);
    CHECK(live == 0, "%llu driver objects left", (unsigned long long)live);
    gdrpy_close(ctx);
    cuMemFree(d);
}

/* the words moved: found by search */
static void mode_alt(void)
{
    CHECK(selftest() == 0, "%s", gdrpy_last_error());
    CHECK(strstr(report, "found by search") != NULL, "searched");
    CHECK(strstr(report, "\"size\": 2, \"pages\": -1, \"offset\": 10, \"client\": 9, "
                         "\"memory\": 1") != NULL,
          "layout learned");
    gdrpy_ctx_t ctx;
    CHECK(gdrpy_open(0, GDRPY_BACKEND_NVRM, &ctx) == 0, "%s", gdrpy_last_error());
    uint64_t d = alloc_filled(8192, 1);
    gdrpy_pin_t pin;
    CHECK(pin_once(ctx, d, 8192, &pin) == 0, "%s", gdrpy_last_error());
    gdrpy_unpin(ctx, pin);
    gdrpy_close(ctx);
}

/* the table's RM_MAP_MEMORY size corrupted: unavailable, clearly */
static void mode_corrupt(int which)
{
    CHECK(selftest() == GDRPY_ENOTSUP, "rc");
    CHECK(strstr(report, "\"usable\": false") != NULL, "unusable");
    CHECK(strstr(report, "\"test_corrupt_abi\": ") != NULL, "flag");
    const char *want = which == 1 ? "RM_MAP_MEMORY ioctl failed" : "read through the mapping";
    CHECK(strstr(report, want) != NULL, "step: want %s", want);
    gdrpy_ctx_t ctx;
    int rc = gdrpy_open(0, GDRPY_BACKEND_NVRM, &ctx);
    CHECK(rc == GDRPY_ENOTSUP && strstr(gdrpy_last_error(), "self-test failed on every route"),
          "open: rc %d %s", rc, gdrpy_last_error());
    if (!rc) gdrpy_close(ctx);
    char why[512] = "";
    CHECK(gdrpy_backend_probe(GDRPY_BACKEND_NVRM, 0, why, sizeof why) != 0 &&
              strstr(why, "self-test"),
          "probe: %s", why);
}

/* a 535 driver: the short GET_EXPORT_OBJECT_INFO */
static void mode_v535(int match)
{
    int rc = selftest();
    CHECK(strstr(report, "\"branch\": \"535\"") != NULL, "table 535");
    if (match) {
        CHECK(rc == 0 && strstr(report, "\"A\": {\"tested\": true, \"ok\": true"), "A ok");
    } else {
        /* the driver wants the 550+ layout but says 535: route A fails, C works */
        CHECK(rc == 0, "usable through route C");
        CHECK(strstr(report, "\"A\": {\"tested\": true, \"ok\": false") &&
                  strstr(report, "NV_ERR_INVALID_PARAM_STRUCT"),
              "A disabled with RM status");
        gdrpy_ctx_t ctx;
        CHECK(gdrpy_open(0, GDRPY_BACKEND_NVRM, &ctx) == 0, "%s", gdrpy_last_error());
        gdrpy_close(ctx);
    }
}

/* both scratch allocations at offset 0: a third one proves the offset word */
static void mode_fresh_chunks(void)
{
    CHECK(selftest() == 0, "%s", gdrpy_last_error());
    CHECK(strstr(report, "\"offset_proven\": true") != NULL, "offset proven");
    CHECK(strstr(report, "\"mapping_base_checked\": true") != NULL, "mapbase");
    gdrpy_ctx_t ctx;
    CHECK(gdrpy_open(0, GDRPY_BACKEND_NVRM, &ctx) == 0, "%s", gdrpy_last_error());
    uint64_t a = alloc_filled(4096, 1), b = alloc_filled(4096, 1); /* b at offset != 0 */
    gdrpy_pin_t pin;
    CHECK(pin_once(ctx, b, 4096, &pin) == 0, "%s", gdrpy_last_error());
    gdrpy_unpin(ctx, pin);
    cuMemFree(a);
    cuMemFree(b);
    gdrpy_close(ctx);
}

static void mode_newer(void)
{
    CHECK(selftest() == 0, "%s", gdrpy_last_error());
    CHECK(strstr(report, "\"branch\": \"595\"") && strstr(report, "\"driver_newer_than_tables\": true"),
          "newest table");
}

static void mode_old(void)
{
    CHECK(selftest() != 0, "refused");
    char why[512] = "";
    CHECK(gdrpy_backend_probe(GDRPY_BACKEND_NVRM, 0, why, sizeof why) == GDRPY_ENOTSUP &&
              strstr(why, "older than every ABI table"),
          "%s", why);
}

/* MAPPING_BASE_ADDR is the allocation's own base: not usable as a check, so
 * nothing but the bytes proves the offset word: patterned memory at a wrong
 * offset is refused by content, and zeroed memory (identical at every
 * offset) is refused because its bytes prove nothing (issue 45: it was
 * accepted, mapping the wrong place). */
static void mode_mapbase_alloc(void)
{
    CHECK(selftest() == 0, "%s", gdrpy_last_error());
    CHECK(strstr(report, "\"mapping_base_checked\": false") != NULL, "no mapbase");
    gdrpy_ctx_t ctx;
    CHECK(gdrpy_open(0, GDRPY_BACKEND_NVRM, &ctx) == 0, "%s", gdrpy_last_error());
    fake_arm_skew(4096);
    uint64_t r = alloc_filled(65536, 1), z = alloc_filled(65536, 0);
    fake_arm_skew(0);
    gdrpy_pin_t pin;
    fake_htod_reset();
    int rc = pin_once(ctx, r, 65536, &pin);
    CHECK(rc == GDRPY_EIO && strstr(gdrpy_last_error(), "identity check failed"),
          "patterned skew refused by content: %d %s", rc, gdrpy_last_error());
    if (!rc) gdrpy_unpin(ctx, pin);
    rc = pin_once(ctx, z, 65536, &pin);
    CHECK(rc == GDRPY_ENOTSUP && strstr(gdrpy_last_error(), "0x00"),
          "zeroed memory, skewed words, no mapping-base check: rc %d %s", rc,
          gdrpy_last_error());
    if (!rc) gdrpy_unpin(ctx, pin);
    CHECK(fake_htod_into(r, 65536) == 0 && fake_htod_into(z, 65536) == 0, "no writes");
    gdrpy_close(ctx);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "default";
    cuMemAlloc = sym("cuMemAlloc_v2");
    cuMemFree = sym("cuMemFree_v2");
    cuMemcpyHtoD = sym("cuMemcpyHtoD_v2");
    cuMemcpyDtoH = sym("cuMemcpyDtoH_v2");
    fake_arm_skew = sym("fake_arm_skew");
    fake_htod_reset = sym("fake_htod_reset");
    fake_htod_into = sym("fake_htod_into");
    fake_host_ptr = sym("fake_host_ptr");
    int (*cuInit)(unsigned) = sym("cuInit");
    cuInit(0);
    if (!strcmp(mode, "default")) mode_default();
    else if (!strcmp(mode, "alt")) mode_alt();
    else if (!strcmp(mode, "corrupt1")) mode_corrupt(1);
    else if (!strcmp(mode, "corrupt2")) mode_corrupt(2);
    else if (!strcmp(mode, "v535")) mode_v535(1);
    else if (!strcmp(mode, "v535-wrong")) mode_v535(0);
    else if (!strcmp(mode, "newer")) mode_newer();
    else if (!strcmp(mode, "fresh-chunks")) mode_fresh_chunks();
    else if (!strcmp(mode, "old")) mode_old();
    else if (!strcmp(mode, "mapbase-alloc")) mode_mapbase_alloc();
    else {
        printf("unknown mode %s\n", mode);
        return 2;
    }
    printf("test_nvrm_fake %s: %d passed, %d failed\n", mode, passed, failed);
    return failed ? 1 : 0;
}
