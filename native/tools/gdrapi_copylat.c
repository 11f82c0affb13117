/*
 * gdrapi_copylat.c - copy latency through libgdrapi (gdrpy's GDRCopy drop-in)
 * next to cuMemcpyHtoD/DtoH, measured in the same run.
 *
 * Our path uses only GDRCopy's API (gdr_open, gdr_pin_buffer, gdr_map,
 * gdr_copy_to_mapping, gdr_copy_from_mapping).  from_map is the read as
 * libgdrapi does it (large reads through the copy engine from the crossover
 * it measures, GDRPY_GDRAPI_READ_CE); bar1 the same read through a second
 * gdr_t opened with GDRPY_GDRAPI_READ_CE=off (BAR1 only), on the same
 * memory, in the same run.  The copy-engine columns use
 * cuMemcpyHtoD_v2/DtoH_v2 from a cuMemHostAlloc'ed buffer (libcuda
 * dlopen'ed).  Each sample times one call with CLOCK_MONOTONIC_RAW; the
 * timer's own cost is printed so that it can be told apart at small sizes.
 * With GDRPY_BACKEND=sim only the mapping columns run (host memory: not GPU
 * numbers), and the output says so.
 *
 *   gdrapi_copylat [--min BYTES] [--max BYTES] [--iters N] [--warmup N]
 *                  [--quick] [--csv]
 * Defaults: 1 B .. 16 MiB in powers of 2, up to 1000 samples per size
 * (fewer for large sizes, at least 20).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gdrapi.h"
#include "gdrapi_testmem.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    double med_us, p99_us;
} stat_t;

static stat_t stats(uint64_t *s, size_t n)
{
    qsort(s, n, sizeof *s, cmp_u64);
    size_t i99 = (n * 99 + 99) / 100;
    if (i99 == 0) i99 = 1;
    if (i99 > n) i99 = n;
    stat_t r = {s[n / 2] / 1000.0, s[i99 - 1] / 1000.0};
    return r;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "gdrapi_copylat: %s failed: %d (%s)\n", what, rc, rc > 0 ? strerror(rc) : "?");
    exit(2);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: gdrapi_copylat [--min BYTES] [--max BYTES] [--iters N] [--warmup N] "
               "[--quick] [--csv]\n"
               "gdr_copy_to/from_mapping through libgdrapi.so.2 (reads also BAR1 only) against\n"
               "cuMemcpy, sizes from --min to --max (default 1..16 MiB) in powers of two;\n"
               "-h, --help: this text\n");
}

int main(int argc, char **argv)
{
    size_t min = 1, max = 16u << 20;
    int iters = 1000, warmup = 10, quick = 0, csv = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--min") && v) {
            min = strtoull(v, NULL, 0);
            i++;
        } else if (!strcmp(a, "--max") && v) {
            max = strtoull(v, NULL, 0);
            i++;
        } else if (!strcmp(a, "--iters") && v) {
            iters = atoi(v);
            i++;
        } else if (!strcmp(a, "--warmup") && v) {
            warmup = atoi(v);
            i++;
        } else if (!strcmp(a, "--quick")) quick = 1;
        else if (!strcmp(a, "--csv")) csv = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (quick) {
        if (max > 65536) max = 65536;
        iters = 50;
        warmup = 3;
    }
    if (min == 0 || max < min || iters < 1) {
        usage(stderr);
        return 2;
    }

    if (tm_init(NULL)) {
        fprintf(stderr, "gdrapi_copylat: no device memory: %s\n", tm.why);
        return 2;
    }
    int ce = !tm.sim;

    gdr_t g = gdr_open();
    if (!g) die("gdr_open", errno);
    /* the BAR1-only reader: GDRPY_GDRAPI_READ_CE is read by gdr_open */
    const char *rce = getenv("GDRPY_GDRAPI_READ_CE");
    char *saved = rce ? strdup(rce) : NULL;
    setenv("GDRPY_GDRAPI_READ_CE", "off", 1);
    gdr_t g_bar1 = gdr_open();
    if (saved) setenv("GDRPY_GDRAPI_READ_CE", saved, 1);
    else unsetenv("GDRPY_GDRAPI_READ_CE");
    free(saved);
    if (!g_bar1) die("gdr_open", errno);
    size_t bufsize = (max + GPU_PAGE_SIZE - 1) & GPU_PAGE_MASK;
    tm_buf dbuf;
    if (tm_alloc(&dbuf, bufsize, TM_CUMEMALLOC)) die("device allocation", -1);
    gdr_mh_t mh;
    int rc = gdr_pin_buffer(g, dbuf.d, bufsize, 0, 0, &mh);
    if (rc) die("gdr_pin_buffer", rc);
    void *map = NULL;
    if ((rc = gdr_map(g, mh, &map, bufsize))) die("gdr_map", rc);
    gdr_mh_t mh_bar1;
    if ((rc = gdr_pin_buffer(g_bar1, dbuf.d, bufsize, 0, 0, &mh_bar1))) die("gdr_pin_buffer", rc);
    void *map_bar1 = NULL;
    if ((rc = gdr_map(g_bar1, mh_bar1, &map_bar1, bufsize))) die("gdr_map", rc);
    gdr_info_t info;
    if ((rc = gdr_get_info(g, mh, &info))) die("gdr_get_info", rc);
    const char *mtype = "?";
    gdr_get_mapping_type_string(info.mapping_type, &mtype);

    void *hbuf = NULL; /* for the gdr copies */
    if (posix_memalign(&hbuf, 4096, bufsize)) die("posix_memalign", ENOMEM);
    memset(hbuf, 0x5c, bufsize);
    void *pinned = NULL; /* for cuMemcpy */
    if (ce) {
        if ((rc = tm.cuMemHostAlloc(&pinned, bufsize, 0))) die("cuMemHostAlloc", rc);
        memset(pinned, 0x5c, bufsize);
    }

    /* timer cost */
    uint64_t tsamp[1001];
    for (int i = 0; i < 1001; i++) {
        uint64_t t0 = now_ns();
        tsamp[i] = now_ns() - t0;
    }
    stat_t tcost = stats(tsamp, 1001);

    int major, minor;
    gdr_runtime_get_version(&major, &minor);
    printf("# gdrapi_copylat: libgdrapi %d.%d, %s, mapping %s, timer cost %.3f us (median)\n", major,
           minor, tm.sim ? "sim backend (host memory: NOT GPU numbers)" : "GPU", mtype,
           tcost.med_us);
    if (!ce) printf("# sim: mapping columns only; cuMemcpy columns need a GPU\n");
    printf("# latency per call in us: median and p99; sizes %zu .. %zu B\n", min, max);
    if (csv) {
        printf("size,to_map_med,to_map_p99,from_map_med,from_map_p99,bar1_med,bar1_p99%s\n",
               ce ? ",htod_med,htod_p99,dtoh_med,dtoh_p99" : "");
    } else {
        printf("%10s %11s %11s %11s %11s %11s %11s", "size", "to_map", "p99", "from_map", "p99",
               "bar1", "p99");
        if (ce) printf(" %11s %11s %11s %11s", "HtoD", "p99", "DtoH", "p99");
        printf("\n");
    }

    uint64_t *s = malloc(sizeof(uint64_t) * (size_t)iters);
    if (!s) die("malloc", ENOMEM);
    for (size_t size = min; size <= max; size *= 2) {
        /* up to `iters` samples, about 256 MiB of traffic per column, >= 20 */
        size_t n = (size_t)iters;
        size_t cap = (256u << 20) / size;
        if (n > cap) n = cap < 20 ? 20 : cap;
        if (n > (size_t)iters) n = (size_t)iters;
        stat_t st[5];
        for (int col = 0; col < (ce ? 5 : 3); col++) {
            for (size_t i = 0; i < (size_t)warmup + n; i++) {
                uint64_t t0 = now_ns();
                switch (col) {
                case 0: rc = gdr_copy_to_mapping(mh, map, hbuf, size); break;
                case 1: rc = gdr_copy_from_mapping(mh, hbuf, map, size); break;
                case 2: rc = gdr_copy_from_mapping(mh_bar1, hbuf, map_bar1, size); break;
                case 3: rc = tm.cuMemcpyHtoD(dbuf.d, pinned, size); break;
                default: rc = tm.cuMemcpyDtoH(pinned, dbuf.d, size); break;
                }
                uint64_t t1 = now_ns();
                if (rc) die(col < 3 ? "gdr copy" : "cuMemcpy", rc);
                if (i >= (size_t)warmup) s[i - warmup] = t1 - t0;
            }
            st[col] = stats(s, n);
        }
        if (csv) printf("%zu", size);
        else printf("%10zu", size);
        for (int col = 0; col < (ce ? 5 : 3); col++)
            printf(csv ? ",%.3f,%.3f" : " %11.3f %11.3f", st[col].med_us, st[col].p99_us);
        printf("\n");
        fflush(stdout);
        if (size > max / 2) break; /* no overflow past max */
    }

    /* The data really went through: write a pattern, read it back both ways. */
    size_t vn = max < (1u << 20) ? max : (1u << 20); /* large enough for the engine path */
    unsigned char *pat = malloc(vn), *back = malloc(vn);
    for (size_t i = 0; i < vn; i++) pat[i] = (unsigned char)(i * 13 + 1);
    int ok = gdr_copy_to_mapping(mh, map, pat, vn) == 0 && tm_dtoh(back, dbuf.d, vn) == 0 &&
             memcmp(pat, back, vn) == 0;
    for (int k = 0; k < 2 && ok; k++) { /* both readers see it */
        memset(back, 0, vn);
        ok = gdr_copy_from_mapping(k ? mh_bar1 : mh, back, k ? map_bar1 : map, vn) == 0 &&
             memcmp(pat, back, vn) == 0;
    }
    printf("# verify: %s\n", ok ? "ok" : "MISMATCH");

    free(pat);
    free(back);
    free(s);
    gdr_unmap(g, mh, map, bufsize);
    gdr_unpin_buffer(g, mh);
    gdr_close(g);
    gdr_unmap(g_bar1, mh_bar1, map_bar1, bufsize);
    gdr_unpin_buffer(g_bar1, mh_bar1);
    gdr_close(g_bar1);
    tm_free(&dbuf);
    if (pinned) tm.cuMemFreeHost(pinned);
    free(hbuf);
    tm_fini();
    return ok ? 0 : 1;
}
