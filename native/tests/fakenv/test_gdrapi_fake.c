/*
 * test_gdrapi_fake.c - libgdrapi.so.2 on the nvrm backend against fakenv, the
 * stand-in driver (issue 45):
 *
 *  nowait  while a kernel "runs" on the legacy default stream
 *          (fake_legacy_busy), gdr_open, the first gdr_pin_buffer (which
 *          opens the device's context: the self-test runs there), gdr_map
 *          and the pins of further kinds make no call a real driver orders
 *          after that kernel.
 *  sizes   a cuMemAlloc allocation whose RM object ends inside a GPU page
 *          (68 KiB, fake_exact_objects): gdr_get_info reports the 68 KiB the
 *          backend pins and maps, not the 128 KiB of the GPU pages around
 *          the request; gdr_map of more is refused, of 68 KiB works, and
 *          copies past it are refused.
 *
 *   LD_PRELOAD=build/fakenv/libcuda.so.1 LD_LIBRARY_PATH=build/fakenv build/test_gdrapi_fake
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdrapi.h"
#include "../tally.h"
#include "fake_client.h"

static void (*fake_legacy_busy)(int);
static int (*fake_waits)(char *, size_t);
static void (*fake_exact_objects)(int);

#define KB 1024u

static void check_waits(const char *what)
{
    char first[128];
    int w = fake_waits(first, sizeof first);
    CHECK(w == 0, "nowait: %s made %d calls that wait for the kernel, first %s", what, w, first);
    fake_legacy_busy(1);
}

int main(void)
{
    fake_cu_load();
    fake_legacy_busy = (void (*)(int))sym("fake_legacy_busy");
    fake_waits = (int (*)(char *, size_t))sym("fake_waits");
    fake_exact_objects = (void (*)(int))sym("fake_exact_objects");

    /* memory first (the test's own copies are not the library's) */
    fake_exact_objects(1);
    uint64_t a = 0;
    CHECK(cuMemAlloc(&a, 68 * KB) == 0 && a % (64 * KB) == 0, "cuMemAlloc 68 KiB");
    fake_exact_objects(0);
    fill(a, 68 * KB, 5);
    uint64_t v = vmm_alloc(2u << 20, 0), f = vmm_alloc(2u << 20, 1);
    CHECK(v && f, "cuMemCreate");
    fill(v, 2u << 20, 6);
    fill(f, 2u << 20, 7);

    fake_legacy_busy(1);
    gdr_t g = gdr_open();
    CHECK(g != NULL, "gdr_open");
    if (!g) return 1;
    gdr_mh_t mh;
    int rc = gdr_pin_buffer(g, a, 68 * KB, 0, 0, &mh);
    CHECK(rc == 0, "pin 68 KiB of cuMemAlloc memory: %d", rc);
    check_waits("gdr_open + the first gdr_pin_buffer (the self-test)");

    /* sizes: what the backend maps, never the GPU pages beyond it */
    gdr_info_v2_t info;
    memset(&info, 0, sizeof info);
    CHECK(gdr_get_info_v2(g, mh, &info) == 0, "gdr_get_info_v2");
    CHECK(info.va == a && info.mapped_size == 68 * KB,
          "sizes: info says [0x%llx, +0x%llx), the backend pinned [0x%llx, +0x%x)",
          (unsigned long long)info.va, (unsigned long long)info.mapped_size,
          (unsigned long long)a, 68 * KB);
    void *map = NULL;
    CHECK(gdr_map(g, mh, &map, 128 * KB) == EINVAL && map == NULL,
          "sizes: gdr_map of the 128 KiB of GPU pages is refused");
    CHECK(gdr_map(g, mh, &map, 68 * KB) == 0 && map != NULL, "sizes: gdr_map of 68 KiB");
    check_waits("gdr_map");
    if (map) {
        uint8_t buf[256], got[256];
        for (int i = 0; i < 256; i++) buf[i] = (uint8_t)(i ^ 0x5c);
        char *end = (char *)map + 68 * KB;
        CHECK(gdr_copy_to_mapping(mh, end - 256, buf, 256) == 0, "sizes: copy to the last bytes");
        fake_legacy_busy(0); /* the test's own copy */
        CHECK(cuMemcpyDtoH(got, a + 68 * KB - 256, 256) == 0 && memcmp(got, buf, 256) == 0,
              "sizes: the last bytes arrive");
        fake_legacy_busy(1);
        CHECK(gdr_copy_to_mapping(mh, end - 128, buf, 256) != 0, "sizes: a copy past the end");
        CHECK(gdr_copy_from_mapping(mh, got, end, 8) != 0, "sizes: a read past the end");
        memset(&info, 0, sizeof info);
        CHECK(gdr_get_info_v2(g, mh, &info) == 0 && info.mapped && info.mapped_size == 68 * KB,
              "sizes: mapped info");
        CHECK(gdr_unmap(g, mh, map, 68 * KB) == 0, "gdr_unmap");
    }
    CHECK(gdr_unpin_buffer(g, mh) == 0, "gdr_unpin_buffer");

    /* further kinds through libgdrapi, still under the kernel */
    struct {
        const char *what;
        uint64_t va;
    } k[] = {{"cuMemCreate without handle types", v}, {"cuMemCreate POSIX_FD", f}};
    for (int i = 0; i < 2; i++) {
        rc = gdr_pin_buffer(g, k[i].va, 64 * KB, 0, 0, &mh);
        CHECK(rc == 0, "pin %s: %d", k[i].what, rc);
        if (!rc && gdr_map(g, mh, &map, 64 * KB) == 0) {
            uint8_t got[8];
            gdr_copy_from_mapping(mh, got, (char *)map + 8, 8);
            CHECK(got[0] == (uint8_t)(6 + i + 8 * 13), "%s reads its bytes", k[i].what);
            gdr_unmap(g, mh, map, 64 * KB);
        }
        if (!rc) gdr_unpin_buffer(g, mh);
        check_waits(k[i].what);
    }
    fake_legacy_busy(0);
    CHECK(gdr_close(g) == 0, "gdr_close");
    printf("test_gdrapi_fake: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
