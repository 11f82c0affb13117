/*
 * test_kinds_fake.c - pins by GPU page (UCX's and GDRCopy clients' ranges)
 * over the chunk behind small cuMemAlloc allocations (nvrm route C,
 * backends/nvrm/route_c.c), run against fakenv, the stand-in driver, so the
 * logic is exercised without a GPU (fakenv packs cuMemAlloc allocations at
 * 4 KiB granularity into 2 MiB RM objects, as the real driver does).
 *
 *   LD_PRELOAD=build/fakenv/libcuda.so.1 LD_LIBRARY_PATH=build/fakenv build/test_kinds_fake
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdrpy.h"
#include "../tally.h"
#include "fake_client.h"

#define PAGE 65536ull
int main(void)
{
    fake_cu_load();
    gdrpy_ctx_t ctx;
    if (gdrpy_open(0, GDRPY_BACKEND_NVRM, &ctx)) {
        printf("FAIL open: %s\n", gdrpy_last_error());
        return 1;
    }
    enum { N = 6 };
    uint64_t p[N];
    for (int i = 0; i < N; i++) {
        CHECK(cuMemAlloc(&p[i], 16) == 0, "alloc");
        uint8_t f[16];
        memset(f, 0x40 + i, 16);
        cuMemcpyHtoD(p[i], f, 16);
    }
    /* UCX's range around each small allocation */
    for (int t = 0; t < N; t++) {
        uint64_t lo = p[t] & ~(PAGE - 1), hi = (p[t] + 16 + PAGE - 1) & ~(PAGE - 1);
        gdrpy_pin_t pin;
        int rc = gdrpy_pin(ctx, lo, hi - lo, 0, &pin);
        CHECK(rc == 0, "page pin around allocation %d: %s", t, gdrpy_last_error());
        if (rc) continue;
        gdrpy_pin_info_t pi;
        gdrpy_pin_get_info(ctx, pin, &pi);
        CHECK(pi.va == lo && pi.mapped_size == hi - lo, "pinned extent 0x%llx+0x%llx",
              (unsigned long long)pi.va, (unsigned long long)pi.mapped_size);
        void *mp, *up;
        CHECK(gdrpy_map(ctx, pin, &mp, &up) == 0, "%s", gdrpy_last_error());
        uint8_t d[16];
        memset(d, 0xA0 + t, 16);
        CHECK(gdrpy_write(ctx, pin, p[t] - lo, d, 16) == 0, "%s", gdrpy_last_error());
        CHECK(gdrpy_write(ctx, pin, hi - lo, d, 1) == GDRPY_ERANGE, "write past the pin");
        gdrpy_unmap(ctx, pin);
        gdrpy_unpin(ctx, pin);
        for (int j = 0; j < N; j++) {
            uint8_t got[16], want[16];
            cuMemcpyDtoH(got, p[j], 16);
            memset(want, j == t ? 0xA0 + t : 0x40 + j, 16);
            CHECK(memcmp(got, want, 16) == 0, "allocation %d after writing %d", j, t);
        }
        memset(d, 0x40 + t, 16);
        cuMemcpyHtoD(p[t], d, 16);
    }
    /* one pin over all of them (one chunk) */
    {
        uint64_t lo = p[0] & ~(PAGE - 1), hi = (p[N - 1] + 16 + PAGE - 1) & ~(PAGE - 1);
        gdrpy_pin_t pin;
        int rc = gdrpy_pin(ctx, lo, hi - lo, 0, &pin);
        CHECK(rc == 0, "one pin over %d allocations: %s", N, gdrpy_last_error());
        if (!rc) gdrpy_unpin(ctx, pin);
    }
    /* a range starting in free space of the chunk, after the last allocation */
    {
        uint64_t start = (p[N - 1] + 4096 + PAGE - 1) & ~(PAGE - 1);
        gdrpy_pin_t pin;
        int rc = gdrpy_pin(ctx, start, PAGE, 0, &pin);
        CHECK(rc == GDRPY_EINVAL && strstr(gdrpy_last_error(), "no CUDA allocation"),
              "free space only: rc %d: %s", rc, gdrpy_last_error());
    }
    /* past the chunk of a large allocation: refused naming the allowed range */
    {
        uint64_t big;
        CHECK(cuMemAlloc(&big, 4u << 20) == 0, "alloc big");
        gdrpy_pin_t pin;
        int rc = gdrpy_pin(ctx, big, (4u << 20) + PAGE, 0, &pin);
        CHECK(rc == GDRPY_EINVAL && strstr(gdrpy_last_error(), "pin within [0x"),
              "past the chunk: rc %d: %s", rc, gdrpy_last_error());
        if (!rc) gdrpy_unpin(ctx, pin);
    }
    /* two cuMemCreate chunks mapped side by side: one pin across the seam */
    {
        const size_t C = 2u << 20;
        struct cu_mem_prop pr = {1, 1, 1, 0, NULL, 0, 1, 0, {0}};
        uint64_t va = 0, h0 = 0, h1 = 0;
        CHECK(cuMemAddressReserve(&va, 2 * C, 0, 0, 0) == 0, "reserve");
        CHECK(cuMemCreate(&h0, C, &pr, 0) == 0 && cuMemCreate(&h1, C, &pr, 0) == 0, "create");
        CHECK(cuMemMap(va, C, 0, h0, 0) == 0 && cuMemMap(va + C, C, 0, h1, 0) == 0, "map");
        uint64_t lo = va + C - PAGE, n = 2 * PAGE;
        gdrpy_pin_t pin;
        int rc = gdrpy_pin(ctx, lo, n, 0, &pin);
        CHECK(rc == 0, "pin across two chunks: %s", gdrpy_last_error());
        if (!rc) {
            void *mp, *up;
            CHECK(gdrpy_map(ctx, pin, &mp, &up) == 0, "%s", gdrpy_last_error());
            uint8_t d[64], got[64];
            for (int i = 0; i < 64; i++) d[i] = (uint8_t)(i * 7 + 1);
            CHECK(gdrpy_write(ctx, pin, PAGE - 32, d, 64) == 0, "%s", gdrpy_last_error());
            /* checked per chunk (a device copy stays in one allocation) */
            CHECK(cuMemcpyDtoH(got, va + C - 32, 32) == 0 &&
                      cuMemcpyDtoH(got + 32, va + C, 32) == 0,
                  "dtoh");
            CHECK(memcmp(got, d, 64) == 0, "a write across the seam lands in both chunks");
            uint8_t back[64];
            CHECK(gdrpy_read(ctx, pin, PAGE - 32, back, 64) == 0 && memcmp(back, d, 64) == 0,
                  "read back across the seam");
            CHECK(gdrpy_unmap(ctx, pin) == 0, "%s", gdrpy_last_error());
            CHECK(gdrpy_unpin(ctx, pin) == 0, "%s", gdrpy_last_error());
        }
        /* past the second chunk: refused naming the allowed range */
        rc = gdrpy_pin(ctx, va + C, C + PAGE, 0, &pin);
        CHECK(rc == GDRPY_EINVAL && strstr(gdrpy_last_error(), "pin within"),
              "past the mapped chunks: rc %d: %s", rc, gdrpy_last_error());
        if (!rc) gdrpy_unpin(ctx, pin);
    }
    uint64_t live = 1;
    gdrpy_ctx_live_objects(ctx, &live);
    CHECK(live == 0, "%llu RM objects left", (unsigned long long)live);
    gdrpy_close(ctx);
    printf("test_kinds_fake: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
