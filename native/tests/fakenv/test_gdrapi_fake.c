/*
 * test_gdrapi_fake.c - libgdrapi.so.2 on the nvrm backend against fakenv, the
 * stand-in driver:
 *
 *  nowait  while a kernel "runs" on the legacy default stream
 *          (fake_legacy_busy), gdr_open, the first gdr_pin_buffer (which
 *          opens the device's context: the self-test runs there), gdr_map,
 *          the pins of further kinds and copy-engine reads
 *          (GDRPY_GDRAPI_READ_CE=4096: reads from 4 KiB on take the engine)
 *          make no call a real driver orders after that kernel (issues 44, 45).
 *  tail    cuMemAlloc allocations whose RM object ends inside a GPU page
 *          (fake_exact_objects: the size rounded to 4 KiB, as CUDA's object
 *          behind a large allocation), 68 KiB and 4 GiB + 2 B: pinned by the
 *          exact size, by the 64 KiB-rounded size (UCX) and by libfabric's
 *          rule [addr & ~64K, (end & ~64K) + 64K), gdr_get_info reports the
 *          whole GPU pages, gdr_map of them works, the last bytes of the
 *          object are written and read back, and past the object's end
 *          copies are refused (ERANGE) and a touch faults; ranges past the
 *          last GPU page, or starting in the tail, are refused (issue 44).
 *  force   pin flag FORCE_PCIE on this (non-coherent) fake GPU: ENOTSUPP (524).
 *
 *   LD_PRELOAD=build/fakenv/libcuda.so.1 LD_LIBRARY_PATH=build/fakenv build/test_gdrapi_fake
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdrapi.h"
#include "../gdrapi_tail.h"
#include "../tally.h"
#include "fake_client.h"

static void (*fake_legacy_busy)(int);
static int (*fake_waits)(char *, size_t);
static void (*fake_exact_objects)(int);
static CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);

#define KB 1024ull
#define GPU_PAGE TAIL_PAGE

static void check_waits(const char *what)
{
    char first[128];
    int w = fake_waits(first, sizeof first);
    CHECK(w == 0, "nowait: %s made %d calls that wait for the kernel, first %s", what, w, first);
    fake_legacy_busy(1);
}

/* The test's own device-to-host copy (not the library's: no kernel wait
 * is counted for it). */
static int own_dtoh(void *dst, uint64_t src, size_t n)
{
    fake_legacy_busy(0);
    int rc = cuMemcpyDtoH(dst, src, n);
    fake_legacy_busy(1);
    return rc;
}

/* The byte pattern of fill() at offset i. */
static uint8_t pat(uint64_t i, uint8_t seed) { return (uint8_t)(seed + i * 13 + (i >> 8)); }

static void tail_case(gdr_t g, const char *what, uint64_t a, uint64_t n, uint64_t obj,
                      uint64_t lo, uint64_t hi)
{
    CHECK(tail_expect(g, what, a, n, obj, lo, hi, own_dtoh) == 0, "tail %s", what);
    check_waits(what);
}

int main(void)
{
    fake_cu_load();
    fake_legacy_busy = (void (*)(int))sym("fake_legacy_busy");
    fake_waits = (int (*)(char *, size_t))sym("fake_waits");
    fake_exact_objects = (void (*)(int))sym("fake_exact_objects");
    cuMemHostAlloc = (CUresult (*)(void **, size_t, unsigned))sym("cuMemHostAlloc");
    setenv("GDRPY_GDRAPI_READ_CE", "4096", 1); /* read by gdr_open */

    /* memory first (the test's own copies are not the library's) */
    fake_exact_objects(1);
    uint64_t a = 0, big = 0;
    const uint64_t big_n = (4ull << 30) + 2;
    CHECK(cuMemAlloc(&a, 68 * KB) == 0 && a % GPU_PAGE == 0, "cuMemAlloc 68 KiB");
    CHECK(cuMemAlloc(&big, big_n) == 0 && big % GPU_PAGE == 0, "cuMemAlloc 4 GiB + 2");
    fake_exact_objects(0);
    fill(a, 68 * KB, 5);
    uint64_t v = vmm_alloc(2u << 20, 0), f = vmm_alloc(2u << 20, 1);
    CHECK(v && f, "cuMemCreate");
    fill(v, 2u << 20, 6);
    fill(f, 2u << 20, 7);
    void *locked = NULL;
    CHECK(cuMemHostAlloc(&locked, 64 * KB, 0) == 0 && locked, "cuMemHostAlloc");

    fake_legacy_busy(1);
    gdr_t g = gdr_open();
    CHECK(g != NULL, "gdr_open");
    if (!g) return 1;
    gdr_mh_t mh;
    int rc = gdr_pin_buffer(g, a, 68 * KB, 0, 0, &mh);
    CHECK(rc == 0, "pin 68 KiB of cuMemAlloc memory: %d", rc);
    check_waits("gdr_open + the first gdr_pin_buffer (the self-test)");
    if (!rc) gdr_unpin_buffer(g, mh);

    /* tail: 68 KiB in an object of 68 KiB; 4 GiB + 2 in one of 4 GiB + 4 KiB */
    tail_case(g, "68 KiB exact", a, 68 * KB, 68 * KB, a, a + 68 * KB);
    tail_case(g, "68 KiB rounded", a, 68 * KB, 68 * KB, a, a + 128 * KB);
    const uint64_t big_obj = big_n + 4094;
    tail_case(g, "4 GiB + 2 exact", big, big_n, big_obj, big, big + big_n);
    tail_case(g, "4 GiB + 2 rounded", big, big_n, big_obj, big, big + tail_pages(big, big + big_n));
    uint64_t lf_lo = big & ~(GPU_PAGE - 1), lf_hi = ((big + big_n) & ~(GPU_PAGE - 1)) + GPU_PAGE;
    tail_case(g, "4 GiB + 2 libfabric", big, big_n, big_obj, lf_lo, lf_hi);
    CHECK(gdr_pin_buffer(g, a, 192 * KB, 0, 0, &mh) == EINVAL,
          "tail: a range past the object's last GPU page is refused");
    CHECK(gdr_pin_buffer(g, a + 100 * KB, 16, 0, 0, &mh) == EINVAL,
          "tail: a range that starts past the object's end is refused");
    check_waits("refused pins");

    /* further kinds, and copy-engine reads, still under the kernel */
    struct {
        const char *what;
        uint64_t va;
    } k[] = {{"cuMemCreate without handle types", v}, {"cuMemCreate POSIX_FD", f}};
    void *map = NULL;
    static uint8_t got[64 * KB];
    for (int i = 0; i < 2; i++) {
        rc = gdr_pin_buffer(g, k[i].va, 64 * KB, 0, 0, &mh);
        CHECK(rc == 0, "pin %s: %d", k[i].what, rc);
        if (!rc && gdr_map(g, mh, &map, 64 * KB) == 0) {
            gdr_copy_from_mapping(mh, got, (char *)map + 8, 8);
            CHECK(got[0] == (uint8_t)(6 + i + 8 * 13), "%s reads its bytes", k[i].what);
            /* pageable (the staging ring) and page-locked destinations */
            uint8_t *dst[2] = {got, locked};
            for (int d = 0; d < 2; d++) {
                memset(dst[d], 0, 64 * KB);
                CHECK(gdr_copy_from_mapping(mh, dst[d], map, 64 * KB) == 0 &&
                          dst[d][0] == pat(0, (uint8_t)(6 + i)) &&
                          dst[d][64 * KB - 1] == pat(64 * KB - 1, (uint8_t)(6 + i)),
                      "%s: an engine read of 64 KiB into %s memory", k[i].what,
                      d ? "page-locked" : "pageable");
                check_waits(d ? "an engine read into page-locked memory"
                              : "an engine read into pageable memory");
            }
            gdr_unmap(g, mh, map, 64 * KB);
        }
        if (!rc) gdr_unpin_buffer(g, mh);
        check_waits(k[i].what);
    }

    /* force: this fake GPU has no coherent link (FAKE_COHERENT unset) */
    int sup = 0;
    CHECK(gdr_get_attribute(g, GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE, &sup) == 0 && sup == 1,
          "force: the flag is understood (%d)", sup);
    rc = gdr_pin_buffer_v2(g, v, 64 * KB, GDR_PIN_FLAG_FORCE_PCIE, &mh);
    CHECK(rc == 524, "force: FORCE_PCIE on a PCIe GPU: %d, want ENOTSUPP (524)", rc);
    rc = gdr_pin_buffer_v2(g, v, 64 * KB, GDR_PIN_FLAG_DEFAULT, &mh);
    CHECK(rc == 0, "force: the same pin without the flag: %d", rc);
    if (!rc) gdr_unpin_buffer(g, mh);
    check_waits("FORCE_PCIE");
    fake_legacy_busy(0);
    CHECK(gdr_close(g) == 0, "gdr_close");
    printf("test_gdrapi_fake: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
