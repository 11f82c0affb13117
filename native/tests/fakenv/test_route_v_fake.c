/*
 * test_route_v_fake.c - nvrm route V (cuMemCreate without a handle type,
 * stream-ordered pools) against fakenv, the stand-in driver: the backend
 * learns where CUDA's records name the RM memory on scratch memory of its
 * own, then pins the caller's memory read-only.  Checks: round trips through
 * the mapping, NOT ONE byte written by CUDA copies into the caller's memory
 * while pinning, and refusals when the records lie (a decoy object) or are
 * ambiguous (two records for one chunk).
 *
 *   LD_PRELOAD=build/fakenv/libcuda.so.1 LD_LIBRARY_PATH=build/fakenv build/test_route_v_fake
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdrpy.h"
#include "../tally.h"
#include "fake_client.h"

static void (*fake_htod_reset)(void);
static uint64_t (*fake_htod_into)(uint64_t, uint64_t);
static void (*fake_arm_lie)(int);
static void (*fake_arm_ambiguous)(int);
static void (*fake_deny_phys)(int);
static void (*fake_bar1_dynamic)(int);
static void (*fake_unmappable_decoys)(int);


/* Pins [va, +n), checks that the library wrote nothing into it while
 * pinning, then a round trip both ways at `off`; returns the pin rc. */
static int pin_roundtrip(gdrpy_ctx_t ctx, const char *what, uint64_t va, size_t n, size_t off)
{
    fake_htod_reset();
    gdrpy_pin_t pin;
    int rc = gdrpy_pin(ctx, va, n, 0, &pin);
    uint64_t written = fake_htod_into(va, n);
    if (rc) return rc;
    CHECK(written == 0, "%s: %llu bytes of the caller's memory written while pinning", what,
          (unsigned long long)written);
    void *mp, *up;
    CHECK(gdrpy_map(ctx, pin, &mp, &up) == 0, "%s: map: %s", what, gdrpy_last_error());
    uint8_t d[64], got[64];
    for (int i = 0; i < 64; i++) d[i] = (uint8_t)(0xC0 ^ i);
    CHECK(gdrpy_write(ctx, pin, off, d, 64) == 0, "%s: write: %s", what, gdrpy_last_error());
    CHECK(cuMemcpyDtoH(got, va + off, 64) == 0 && memcmp(got, d, 64) == 0,
          "%s: BAR write seen by cuMemcpyDtoH", what);
    for (int i = 0; i < 64; i++) d[i] = (uint8_t)(0x3D + 7 * i);
    cuMemcpyHtoD(va + off + 64, d, 64);
    CHECK(gdrpy_read(ctx, pin, off + 64, got, 64) == 0 && memcmp(got, d, 64) == 0,
          "%s: cuMemcpyHtoD seen through BAR1", what);
    CHECK(gdrpy_unmap(ctx, pin) == 0 && gdrpy_unpin(ctx, pin) == 0, "%s: teardown", what);
    return 0;
}

/* A fresh pool's 1 MiB allocation (filled with `seed` unless 0), pinned and
 * round-tripped at 4096; returns the pin rc. */
static int fresh_pool_pin(gdrpy_ctx_t ctx, const char *what, uint8_t seed)
{
    void *pool = NULL;
    uint64_t q = 0;
    cuMemPoolCreate(&pool, NULL);
    CHECK(cuMemAllocFromPoolAsync(&q, 1u << 20, pool, NULL) == 0, "pool alloc (%s)", what);
    if (!q) return -1;
    if (seed) fill(q, 1u << 20, seed);
    return pin_roundtrip(ctx, what, q, 1u << 20, 4096);
}

int main(void)
{
    fake_cu_load();
    fake_htod_reset = (void (*)(void))sym("fake_htod_reset");
    fake_htod_into = (uint64_t (*)(uint64_t, uint64_t))sym("fake_htod_into");
    fake_arm_lie = (void (*)(int))sym("fake_arm_lie");
    fake_arm_ambiguous = (void (*)(int))sym("fake_arm_ambiguous");
    fake_deny_phys = (void (*)(int))sym("fake_deny_phys");
    fake_bar1_dynamic = (void (*)(int))sym("fake_bar1_dynamic");
    fake_unmappable_decoys = (void (*)(int))sym("fake_unmappable_decoys");
    gdrpy_ctx_t ctx;
    if (gdrpy_open(0, GDRPY_BACKEND_NVRM, &ctx)) {
        printf("FAIL open: %s\n", gdrpy_last_error());
        return 1;
    }
    const size_t C = 2u << 20;

    /* VMM without a handle type: learned at the first pin */
    uint64_t v1 = vmm_alloc(C, 0), v2 = vmm_alloc(C, 0);
    CHECK(v1 && v2, "vmm alloc");
    fill(v1, C, 1);
    fill(v2, C, 2);
    int rc = pin_roundtrip(ctx, "vmm", v1, C, 4096);
    CHECK(rc == 0, "vmm pin: %s", gdrpy_last_error());
    rc = pin_roundtrip(ctx, "vmm sub-range", v2 + 0x30000, 0x20000, 100);
    CHECK(rc == 0, "vmm sub-range pin: %s", gdrpy_last_error());

    /* default pool: first pin learns; a second allocation at an offset in
     * the same chunk checks the offset rule */
    uint64_t p1 = 0, p2 = 0;
    CHECK(cuMemAllocAsync(&p1, 1u << 20, NULL) == 0 && cuMemAllocAsync(&p2, 64u << 10, NULL) == 0,
          "pool alloc");
    fill(p1, 1u << 20, 3);
    fill(p2, 64u << 10, 4);
    rc = pin_roundtrip(ctx, "default pool", p1, 1u << 20, 8192);
    CHECK(rc == 0, "default pool pin: %s", gdrpy_last_error());
    rc = pin_roundtrip(ctx, "default pool, 2nd allocation", p2, 64u << 10, 256);
    CHECK(rc == 0, "default pool 2nd pin: %s", gdrpy_last_error());

    /* a pool of its own (as RMM's cuda_async_memory_resource makes) */
    void *pool = NULL;
    uint64_t q = 0;
    CHECK(cuMemPoolCreate(&pool, NULL) == 0 &&
              cuMemAllocFromPoolAsync(&q, 3u << 20, pool, NULL) == 0,
          "custom pool alloc");
    fill(q, 3u << 20, 5);
    rc = pin_roundtrip(ctx, "custom pool", q, 3u << 20, (2u << 20) + 8);
    CHECK(rc == 0, "custom pool pin: %s", gdrpy_last_error());

    /* a pool with a POSIX_FD handle type: learned on its own kind */
    {
        int props[22] = {1, 1, 1, 0}; /* CUmemPoolProps: pinned, POSIX_FD, device 0 */
        void *fpool = NULL;
        uint64_t fq = 0;
        CHECK(cuMemPoolCreate(&fpool, props) == 0 &&
                  cuMemAllocFromPoolAsync(&fq, 1u << 20, fpool, NULL) == 0,
              "POSIX_FD pool alloc");
        fill(fq, 1u << 20, 9);
        rc = pin_roundtrip(ctx, "POSIX_FD pool", fq, 1u << 20, 512);
        CHECK(rc == 0, "POSIX_FD pool pin: %s", gdrpy_last_error());
    }

    /* a busy pool: several chunks, allocations and frees; every live
     * allocation, in the first chunk or a later one, pins (issue 13: layouts
     * learned on one-chunk pools named the first chunk for later ones) */
    {
        void *bp = NULL;
        uint64_t a[8] = {0};
        const size_t sz[8] = {1u << 20, 3u << 20, 64u << 10, 3u << 20,
                              5u << 20, 3u << 20, 128u << 10, 3u << 20};
        CHECK(cuMemPoolCreate(&bp, NULL) == 0, "busy pool");
        for (int i = 0; i < 8; i++) {
            CHECK(cuMemAllocFromPoolAsync(&a[i], sz[i], bp, NULL) == 0, "busy pool alloc %d", i);
            fill(a[i], sz[i], (uint8_t)(20 + i));
        }
        for (int i = 0; i < 8; i++) {
            char what[64];
            snprintf(what, sizeof what, "busy pool allocation %d", i);
            rc = pin_roundtrip(ctx, what, a[i], sz[i], sz[i] > 4096 ? sz[i] - 256 : 0);
            CHECK(rc == 0, "%s: %s", what, gdrpy_last_error());
        }
        uint64_t d[6] = {0};
        for (int i = 0; i < 6; i++) {
            CHECK(cuMemAllocAsync(&d[i], 3u << 20, NULL) == 0, "default pool alloc %d", i);
            fill(d[i], 3u << 20, (uint8_t)(40 + i));
        }
        for (int i = 0; i < 6; i += 5) {
            rc = pin_roundtrip(ctx, "busy default pool", d[i], 3u << 20, 4096);
            CHECK(rc == 0, "busy default pool allocation %d: %s", i, gdrpy_last_error());
        }
    }

    /* a pool of many chunks: the last one's record may lie deeper than any
     * walk from the pool reaches (FAKE_POOL_LAYOUT=list: 14 pointers) */
    {
        void *lp = NULL;
        uint64_t a[14] = {0};
        CHECK(cuMemPoolCreate(&lp, NULL) == 0, "long pool");
        for (int i = 0; i < 14; i++)
            CHECK(cuMemAllocFromPoolAsync(&a[i], 3u << 20, lp, NULL) == 0, "long pool alloc %d", i);
        fill(a[13], 3u << 20, 77);
        fill(a[6], 3u << 20, 66);
        rc = pin_roundtrip(ctx, "long pool, last chunk", a[13], 3u << 20, 8192);
        CHECK(rc == 0, "long pool, last chunk: %s", gdrpy_last_error());
        rc = pin_roundtrip(ctx, "long pool, 7th chunk", a[6], 3u << 20, 64);
        CHECK(rc == 0, "long pool, 7th chunk: %s", gdrpy_last_error());
    }

    /* records that name a decoy object: refused (by the read-only identity
     * check, or, where the one place kept names nothing, by the per-pin rule) */
    fake_arm_lie(1);
    uint64_t vl = vmm_alloc(C, 0);
    fill(vl, C, 6);
    rc = pin_roundtrip(ctx, "vmm, lying record", vl, C, 0);
    CHECK(rc == GDRPY_ENOTSUP &&
              (strstr(gdrpy_last_error(), "identity") || strstr(gdrpy_last_error(), "exactly one")),
          "lying VMM record: rc %d: %s", rc, gdrpy_last_error());
    void *pool2 = NULL;
    uint64_t ql = 0;
    cuMemPoolCreate(&pool2, NULL);
    CHECK(cuMemAllocFromPoolAsync(&ql, 1u << 20, pool2, NULL) == 0, "pool alloc (lie)");
    fill(ql, 1u << 20, 7);
    rc = pin_roundtrip(ctx, "pool, lying record", ql, 1u << 20, 0);
    CHECK(rc == GDRPY_ENOTSUP && strstr(gdrpy_last_error(), "identity"),
          "lying pool record: rc %d: %s", rc, gdrpy_last_error());
    fake_arm_lie(0);

    /* two records for one chunk, both naming live video memory of the right
     * size (a busy process, issue 13): the read-only proof must leave exactly
     * one, or the pin is refused */
    struct {
        int mode, deny_phys, dynamic, filled, want_rc;
        const char *what, *says;
    } amb[] = {
        {1, 0, 0, 1, 0, "other memory, the caller's bytes differ", NULL},
        {1, 1, 1, 1, 0, "other memory, bytes differ, no physical addresses", NULL},
        {2, 0, 0, 1, 0, "a second handle of the same memory", NULL},
        {2, 1, 0, 0, 0, "a second handle, never written, BAR1 addresses agree", NULL},
        {2, 0, 1, 0, 0, "a second handle, never written, physical addresses agree", NULL},
        {2, 1, 1, 1, GDRPY_ENOTSUP, "a second handle, no address to compare", "CAP_SYS_ADMIN"},
        {1, 0, 0, 0, GDRPY_ENOTSUP, "other memory, both never written", "different physical memory"},
        {1, 1, 0, 0, GDRPY_ENOTSUP, "other memory, never written, BAR1 addresses differ",
         "CAP_SYS_ADMIN"},
    };
    for (size_t t = 0; t < sizeof amb / sizeof amb[0]; t++) {
        fake_arm_ambiguous(amb[t].mode);
        fake_deny_phys(amb[t].deny_phys);
        fake_bar1_dynamic(amb[t].dynamic);
        char what[96];
        snprintf(what, sizeof what, "pool, two records: %s", amb[t].what);
        rc = fresh_pool_pin(ctx, what, amb[t].filled ? (uint8_t)(8 + t) : 0);
        CHECK(rc == amb[t].want_rc &&
                  (!amb[t].says || (strstr(gdrpy_last_error(), amb[t].says) &&
                                    strstr(gdrpy_last_error(), "exactly one"))),
              "%s: rc %d (want %d): %s", what, rc, amb[t].want_rc, gdrpy_last_error());
    }
    fake_bar1_dynamic(0);
    /* a candidate that cannot be compared is not ruled out: no other one
     * can be proven the only one */
    {
        fake_arm_ambiguous(1);
        fake_deny_phys(0);
        fake_unmappable_decoys(1);
        rc = fresh_pool_pin(ctx, "pool, two records, one not mappable", 99);
        CHECK(rc != 0 && strstr(gdrpy_last_error(), "could not be compared"),
              "one candidate not comparable: rc %d: %s", rc, gdrpy_last_error());
        fake_unmappable_decoys(0);
    }
    fake_arm_ambiguous(0);
    fake_deny_phys(0);

    uint64_t live = 1;
    gdrpy_ctx_live_objects(ctx, &live);
    CHECK(live == 0, "%llu RM objects left", (unsigned long long)live);
    gdrpy_close(ctx);
    printf("test_route_v_fake: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
