/*
 * test_staging.c - the staging ring and page-locked host memory (gdrpy_host.h)
 * on the sim backend: exact copies at every size across chunk boundaries and
 * offsets for several ring shapes, a slow copy-engine stand-in, several
 * threads staging through one context at once, and the host table's
 * alloc/free/register/unregister rules.  Run it under ASan/TSan builds too
 * (make BUILD=build-asan CFLAGS=... check).
 *
 *   test_staging: N passed, M failed
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdrpy_host.h"
#include "staging.h" /* gp_stage_schedule, linked from libgdrpy.a */

#include "check.h"

#define KIB 1024u
#define MIB (1024u * 1024u)
#define DEV_BYTES (12u * MIB)

static void fill(unsigned char *p, size_t n, unsigned salt)
{
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((i * 2654435761u + salt) >> 7);
}

struct dev {
    gdrpy_ctx_t c;
    uint64_t d;
    gdrpy_pin_t pin;
    unsigned char *map; /* the device side through a mapping */
};

static int dev_open(struct dev *v)
{
    memset(v, 0, sizeof *v);
    if (gdrpy_open(0, GDRPY_BACKEND_SIM, &v->c)) return 1;
    if (gdrpy_sim_alloc(DEV_BYTES, &v->d)) return 1;
    if (gdrpy_pin(v->c, v->d, DEV_BYTES, 0, &v->pin)) return 1;
    void *mp, *up;
    if (gdrpy_map(v->c, v->pin, &mp, &up)) return 1;
    v->map = up;
    return 0;
}

static void dev_close(struct dev *v)
{
    gdrpy_close(v->c);
    gdrpy_sim_free(v->d);
}

static const size_t sizes[] = {1, 63, 4095, 64 * KIB - 1, 64 * KIB, 64 * KIB + 1,
                               200 * KIB + 3, MIB - 1, MIB + 4097, 3 * MIB + 11,
                               9 * MIB + 5};

static int one_shape(struct dev *v, size_t chunk, unsigned depth, unsigned threads)
{
    CHECK(gdrpy_staging_set(v->c, chunk, depth, threads) == 0);
    size_t ck;
    unsigned dp, th;
    CHECK(gdrpy_staging_get(v->c, &ck, &dp, &th) == 0);
    CHECK(ck == chunk && dp == depth && th == threads);
    unsigned char *src = malloc(10 * MIB), *dst = malloc(10 * MIB + 2);
    CHECK(src && dst);
    unsigned salt = 1;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (size_t off = 0; off < 3; off++) {
            size_t n = sizes[i], o = off * 4097;
            fill(src, n, salt++);
            CHECK(gdrpy_ce_write_staged(v->c, v->pin, o, src, n, NULL) == 0);
            CHECK(memcmp(v->map + o, src, n) == 0);
            fill(v->map + o, n, salt++);
            memset(dst, 0xA5, n + 2);
            CHECK(gdrpy_ce_read_staged(v->c, v->pin, o, dst + 1, n, NULL) == 0);
            CHECK(memcmp(dst + 1, v->map + o, n) == 0);
            CHECK(dst[0] == 0xA5 && dst[n + 1] == 0xA5); /* nothing written outside */
        }
    }
    free(src);
    free(dst);
    return 0;
}

/* The chunk schedule covers every message exactly, for writes and reads:
 * contiguous chunks of 1..slot bytes in ascending order; from 1 MiB up at
 * least 3 chunks, a write's first chunk (the pipeline's fill) and a read's
 * last chunk (its drain) of at most 256 KiB, and a read's chunks are a
 * write's in reverse order. */
static int schedule_covers_every_size_in_small_ends(void)
{
    static const size_t slots[] = {64 * KIB, 128 * KIB, 256 * KIB, MIB, 2 * MIB, 4 * MIB,
                                   64 * MIB};
    size_t sizes_[512];
    size_t ns = 0;
    for (size_t b = 1; b <= 512 * MIB; b *= 2) {
        sizes_[ns++] = b - 1 ? b - 1 : 1;
        sizes_[ns++] = b;
        sizes_[ns++] = b + 1;
        sizes_[ns++] = b * 3 + 4095;
    }
    /* ramp boundaries F(3 * 2^R - 1) (and the old 2F(2^R - 1)), F = 32K..256K */
    for (size_t F = 32 * KIB; F <= 256 * KIB; F *= 2)
        for (unsigned R = 1; R < 12; R++) {
            size_t xs[2] = {F * (3 * ((size_t)1 << R) - 1), 2 * F * (((size_t)1 << R) - 1)};
            for (int q = 0; q < 2; q++) {
                sizes_[ns++] = xs[q] - 1;
                sizes_[ns++] = xs[q];
                sizes_[ns++] = xs[q] + 1;
            }
        }
    for (size_t si = 0; si < sizeof slots / sizeof slots[0]; si++) {
        for (size_t i = 0; i < ns; i++) {
            for (int rd = 0; rd < 2; rd++) {
                size_t n = sizes_[i], S = slots[si], off = 0, len = 0, pos = 0;
                uint64_t nch = gp_stage_schedule(n, S, rd, 0, &off, &len);
                CHECK(nch >= 1);
                CHECK(gp_stage_schedule(n, S, !rd, 0, &off, &len) == nch);
                for (uint64_t j = 0; j < nch; j++) {
                    CHECK(gp_stage_schedule(n, S, rd, j, &off, &len) == nch);
                    if (off != pos || len < 1 || len > S) {
                        fprintf(stderr,
                                "n %zu slot %zu %s chunk %llu/%llu: off %zu len %zu pos %zu\n",
                                n, S, rd ? "read" : "write", (unsigned long long)j,
                                (unsigned long long)nch, off, len, pos);
                        CHECK(0);
                    }
                    size_t o2, l2; /* the other direction's mirror chunk */
                    gp_stage_schedule(n, S, !rd, nch - 1 - j, &o2, &l2);
                    CHECK(l2 == len);
                    if (n >= MIB && j == (rd ? nch - 1 : 0)) CHECK(len <= 256 * KIB);
                    pos += len;
                }
                CHECK(pos == n);
                if (n >= MIB) CHECK(nch >= 3);
            }
        }
    }
    return 0;
}

static int staged_copies_are_exact_for_every_ring_shape(void)
{
    struct dev v;
    CHECK(dev_open(&v) == 0);
    CHECK(one_shape(&v, 64 * KIB, 2, 1) == 0);
    CHECK(one_shape(&v, 128 * KIB, 3, 2) == 0);
    CHECK(one_shape(&v, MIB, 4, 4) == 0);
    CHECK(one_shape(&v, 4 * MIB, 8, 3) == 0);
    dev_close(&v);
    return 0;
}

static int staged_copies_are_exact_with_a_slow_copy_engine(void)
{
    setenv("GDRPY_SIM_CE_DELAY_US", "300", 1);
    struct dev v;
    CHECK(dev_open(&v) == 0);
    CHECK(one_shape(&v, 64 * KIB, 2, 2) == 0);
    dev_close(&v);
    unsetenv("GDRPY_SIM_CE_DELAY_US");
    return 0;
}

struct worker_arg {
    struct dev *v;
    unsigned idx;
    int rc;
};

static void *stage_worker(void *p)
{
    struct worker_arg *a = p;
    size_t n = MIB + 333 * a->idx, off = (size_t)a->idx * 2 * MIB;
    unsigned char *src = malloc(n), *dst = malloc(n);
    if (!src || !dst) {
        a->rc = 1;
        return NULL;
    }
    for (unsigned it = 0; it < 20 && !a->rc; it++) {
        fill(src, n, a->idx * 100 + it);
        if (gdrpy_ce_write_staged(a->v->c, a->v->pin, off, src, n, NULL) ||
            gdrpy_ce_read_staged(a->v->c, a->v->pin, off, dst, n, NULL) ||
            memcmp(src, dst, n))
            a->rc = 1;
    }
    free(src);
    free(dst);
    return NULL;
}

static int threads_staging_through_one_context_do_not_mix_bytes(void)
{
    struct dev v;
    CHECK(dev_open(&v) == 0);
    CHECK(gdrpy_staging_set(v.c, 128 * KIB, 3, 2) == 0);
    pthread_t th[4];
    struct worker_arg args[4];
    for (unsigned i = 0; i < 4; i++) {
        args[i] = (struct worker_arg){&v, i, 0};
        CHECK(pthread_create(&th[i], NULL, stage_worker, &args[i]) == 0);
    }
    for (unsigned i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (unsigned i = 0; i < 4; i++) CHECK(args[i].rc == 0);
    dev_close(&v);
    return 0;
}

static int staged_copies_refuse_out_of_range_and_bad_handles(void)
{
    struct dev v;
    CHECK(dev_open(&v) == 0);
    char b[16];
    CHECK(gdrpy_ce_write_staged(v.c, v.pin, DEV_BYTES - 8, b, 16, NULL) == GDRPY_ERANGE);
    CHECK(gdrpy_ce_read_staged(v.c, v.pin, DEV_BYTES + 1, b, 1, NULL) == GDRPY_ERANGE);
    CHECK(gdrpy_ce_write_staged(v.c, v.pin + (1ull << 32), 0, b, 1, NULL) == GDRPY_EBADF);
    CHECK(gdrpy_ce_write_staged(v.c, v.pin, 0, NULL, 1, NULL) == GDRPY_EINVAL);
    CHECK(gdrpy_ce_write_locked(v.c, v.pin, DEV_BYTES, b, 1, NULL) == GDRPY_ERANGE);
    CHECK(gdrpy_staging_set(v.c, 1000, 0, 0) == GDRPY_EINVAL);
    CHECK(gdrpy_staging_set(v.c, 0, 1, 0) == GDRPY_EINVAL);
    CHECK(gdrpy_staging_set(v.c, 0, 0, 99) == GDRPY_EINVAL);
    dev_close(&v);
    CHECK(gdrpy_ce_write_staged(v.c, v.pin, 0, b, 1, NULL) == GDRPY_EBADF);
    return 0;
}

static int host_table_accepts_only_what_it_handed_out(void)
{
    gdrpy_ctx_t c;
    CHECK(gdrpy_open(0, GDRPY_BACKEND_SIM, &c) == 0);
    uint64_t base = gdrpy_host_live();
    void *p = NULL;
    CHECK(gdrpy_host_alloc(c, 3 * MIB + 1, &p) == 0 && p);
    CHECK(gdrpy_host_live() == base + 1);
    int k = -1;
    CHECK(gdrpy_host_kind(c, (char *)p + 10, 100, &k) == 0 && k == GDRPY_HOST_PINNED);
    CHECK(gdrpy_host_kind(c, p, 3 * MIB + 2, &k) == 0 && k == GDRPY_HOST_PAGEABLE);
    CHECK(gdrpy_host_kind_known(p, 5) == GDRPY_HOST_PINNED);
    CHECK(gdrpy_host_register(c, (char *)p + 4096, 100) == GDRPY_EBUSY); /* overlaps */
    CHECK(gdrpy_host_free((char *)p + 1) == GDRPY_EINVAL);
    CHECK(gdrpy_close(c) == 0); /* the allocation outlives the context */
    memset(p, 1, 3 * MIB + 1);
    CHECK(gdrpy_host_free(p) == 0);
    CHECK(gdrpy_host_free(p) == GDRPY_EINVAL); /* double free: refused */
    CHECK(gdrpy_host_live() == base);

    CHECK(gdrpy_open(0, GDRPY_BACKEND_SIM, &c) == 0);
    char *buf = malloc(MIB);
    CHECK(buf);
    CHECK(gdrpy_host_register(c, buf, MIB) == 0);
    CHECK(gdrpy_host_kind(c, buf + MIB - 1, 1, &k) == 0 && k == GDRPY_HOST_REGISTERED);
    CHECK(gdrpy_host_register(c, buf + 10, 10) == GDRPY_EBUSY);
    CHECK(gdrpy_host_unregister(buf + 1) == GDRPY_EINVAL);
    CHECK(gdrpy_host_unregister(buf) == 0);
    CHECK(gdrpy_host_unregister(buf) == GDRPY_EINVAL);
    CHECK(gdrpy_host_kind(c, buf, MIB, &k) == 0 && k == GDRPY_HOST_PAGEABLE);
    CHECK(gdrpy_host_register(c, NULL, 1) == GDRPY_EINVAL);
    CHECK(gdrpy_host_register(c, buf, 0) == GDRPY_EINVAL);
    void *q = NULL;
    CHECK(gdrpy_host_alloc(c, 0, &q) == GDRPY_EINVAL && q == NULL);
    free(buf);
    CHECK(gdrpy_host_live() == base);
    gdrpy_close(c);
    CHECK(gdrpy_host_alloc(c, 10, &p) == GDRPY_EBADF); /* closed context */
    return 0;
}

int main(void)
{
    RUN(schedule_covers_every_size_in_small_ends);
    RUN(staged_copies_are_exact_for_every_ring_shape);
    RUN(staged_copies_are_exact_with_a_slow_copy_engine);
    RUN(threads_staging_through_one_context_do_not_mix_bytes);
    RUN(staged_copies_refuse_out_of_range_and_bad_handles);
    RUN(host_table_accepts_only_what_it_handed_out);
    printf("test_staging: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
