/*
 * timeline.c - `gdrpy_chanpp --timeline`: where a batch's time goes, on both
 * sides.
 *
 * Host: each batch is sent with gdrpy_chan_send_batch, then the tool spins
 * on every completion's first word in order (as recv does, one line after
 * the other) and notes when each was there, then takes them all with
 * gdrpy_chan_recv_many (they are all there by then: that call's time is the
 * cost of reading landed completions).  Every second batch spins on the
 * second completion and then jumps to the last one: how far apart they
 * land, without the reads of the ones between.
 *
 * Kernel (a build with -DGDRPY_PP_RSTAMPS): every round that found messages
 * left its SM clocks (channel_kernels.cu); the round that took the batch's
 * first message ("A") and the next one ("B") are reported in ns from A's
 * poll end, converted with a least-squares fit of the SM clock against
 * globaltimer over all entries.
 *
 * One line: {"path": "timeline", "batches": N, "kernel_batches": M,
 * "sm_ghz": ..., "<column>": [p10, median, p90], ...} with the columns
 * below (ns).
 */
#include "timeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptimer.h"

enum {
    /* host, in-order batches (from the send's start, then from completion 0) */
    TL_SEND,
    TL_COMP0,
    TL_C1,
    TL_C2,
    TL_C8,
    TL_C16,
    TL_CLAST,
    TL_RECV_ALL,
    /* host, every second batch: completion 1 -> the last one */
    TL_JUMP,
    /* kernel: round A, then B */
    TL_A_WAIT,
    TL_A_PRESTORE,
    TL_A_POSTSTORE,
    TL_A_END,
    TL_A_N,
    TL_B_POLL,
    TL_B_POLLED,
    TL_B_WAIT,
    TL_B_PRESTORE,
    TL_B_POSTSTORE,
    TL_B_END,
    TL_B_N,
    TL_ROUNDS,
    TL_LAST_END,
    TL_NCOL
};

static const char *const tl_names[TL_NCOL] = {
    "send", "comp0", "c1-c0", "c2-c0", "c8-c0", "c16-c0", "clast-c0", "recv_all",
    "jump_clast-c1",
    "A_wait", "A_prestore", "A_poststore", "A_end", "A_n",
    "B_poll", "B_polled", "B_wait", "B_prestore", "B_poststore", "B_end", "B_n",
    "rounds", "last_end"};

#define TL_NONE (-1e300)

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The kernel's columns of one batch (first message j0) from the stamps g. */
static void kernel_columns(const uint64_t *g, uint64_t j0, int batch, double ns_per_cycle,
                           double *r)
{
    const uint64_t *a = g + 8 * (j0 & (CHANPP_TL_ENTRIES - 1));
    if (!a[0] || (uint32_t)a[7] == 0) return;
    const uint64_t base = a[2]; /* A's poll end */
#define NS(clk) ((double)(int64_t)((clk) - base) * ns_per_cycle)
#define MARK(clk) ((clk) ? NS(clk) : TL_NONE)
    r[TL_A_WAIT] = MARK(a[3]);
    r[TL_A_PRESTORE] = MARK(a[4]);
    r[TL_A_POSTSTORE] = MARK(a[5]);
    r[TL_A_END] = NS(a[6]);
    r[TL_A_N] = (uint32_t)a[7];
    uint64_t h = j0 + (uint32_t)a[7];
    int rounds = 1;
    double last = r[TL_A_END];
    while (h < j0 + (uint64_t)batch && rounds < 64) {
        const uint64_t *b = g + 8 * (h & (CHANPP_TL_ENTRIES - 1));
        if (!b[0] || (uint32_t)b[7] == 0) return; /* a round without stamps: no kernel columns */
        if (rounds == 1) {
            r[TL_B_POLL] = NS(b[1]);
            r[TL_B_POLLED] = NS(b[2]);
            r[TL_B_WAIT] = MARK(b[3]);
            r[TL_B_PRESTORE] = MARK(b[4]);
            r[TL_B_POSTSTORE] = MARK(b[5]);
            r[TL_B_END] = NS(b[6]);
            r[TL_B_N] = (uint32_t)b[7];
        }
        last = NS(b[6]);
        h += (uint32_t)b[7];
        rounds++;
    }
#undef MARK
#undef NS
    r[TL_ROUNDS] = rounds;
    r[TL_LAST_END] = last;
}

/* ns per SM cycle: least squares of globaltimer against the round's end clock */
static double fit_ns_per_cycle(const uint64_t *g)
{
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    size_t n = 0;
    uint64_t c0 = 0, t0 = 0;
    for (uint32_t e = 0; e < CHANPP_TL_ENTRIES; e++) {
        const uint64_t *x = g + 8 * e;
        if (!x[0]) continue;
        if (!n) c0 = x[6], t0 = x[0];
        const double cx = (double)(int64_t)(x[6] - c0), ty = (double)(int64_t)(x[0] - t0);
        sx += cx, sy += ty, sxx += cx * cx, sxy += cx * ty, n++;
    }
    const double den = (double)n * sxx - sx * sx;
    return n > 2 && den > 0 ? ((double)n * sxy - sx * sy) / den : 0.0;
}

int chanpp_timeline(gdrpy_chan_t *ch, const gdrpy_chan_msg_t *bm, int batch, size_t size,
                    int64_t timeout_ns, uint64_t *seq, void *stamps, int nbatches,
                    chanpp_check_fn check)
{
    if (nbatches > 100) nbatches = 100;
    if (batch < 2 || nbatches < 1) {
        fprintf(stderr, "gdrpy_chanpp: timeline: needs a batch of 2 or more\n");
        return 1;
    }
    pt_init(); /* this file's copy of the timer (ptimer.h is header-only) */
    gdrpy_chan_desc_t d;
    gdrpy_chan_get_desc(ch, &d);
    /* the completion slots follow the host block in one allocation */
    const char *comp = (const char *)gdrpy_chan_host_block(ch) + (d.comp - d.host_ctrl);
    const uint64_t spin_ns = timeout_ns > 0 ? (uint64_t)timeout_ns : 10000000000ull;
    double *v = malloc(sizeof(double) * (size_t)nbatches * TL_NCOL);
    uint64_t *first = malloc(sizeof(uint64_t) * (size_t)nbatches);
    uint64_t *th = malloc(sizeof(uint64_t) * (size_t)batch);
    unsigned char (*ans)[16] = malloc((size_t)batch * 16);
    uint32_t *lens = malloc(sizeof(uint32_t) * (size_t)batch);
    uint32_t *tags = malloc(sizeof(uint32_t) * (size_t)batch);
    uint64_t *g = calloc(CHANPP_TL_ENTRIES, 64);
    double *col = malloc(sizeof(double) * (size_t)nbatches);
    int rc = !v || !first || !th || !ans || !lens || !tags || !g || !col;
    if (rc) fprintf(stderr, "gdrpy_chanpp: timeline: out of memory\n");
    /* only this run's rounds count: the kernel writes an entry at a round's
     * end, and no round runs while the host sends nothing */
    if (!rc && stamps) gdrpy_copy_to_mapping(stamps, g, CHANPP_TL_BYTES);
    for (int i = 0; i < nbatches * TL_NCOL && v; i++) v[i] = TL_NONE;
    for (int i = -20; i < nbatches && !rc; i++) {
        const uint64_t j0 = *seq;
        const int jump = i & 1;
        uint64_t t0 = pt_now();
        rc = gdrpy_chan_send_batch(ch, bm, (size_t)batch, timeout_ns);
        uint64_t ts = pt_now();
        for (int k = 0; k < batch && !rc; k++) {
            if (jump && k >= 2 && k < batch - 1) continue;
            const volatile uint64_t *w = (const volatile uint64_t *)(comp + ((j0 + (uint64_t)k) & (d.comp_nslots - 1)) * (uint64_t)d.comp_stride);
            const uint32_t want = (uint32_t)(j0 + (uint64_t)k + 1);
            while ((uint32_t)*w != want) {
                if ((uint64_t)pt_ns(pt_now() - ts) > spin_ns) {
                    fprintf(stderr, "gdrpy_chanpp: timeline: completion %d of a batch did not come\n", k);
                    rc = 1;
                    break;
                }
            }
            th[k] = pt_now();
        }
        size_t got = 0;
        if (!rc)
            rc = gdrpy_chan_recv_many(ch, ans, sizeof ans[0], lens, tags, (size_t)batch,
                                      (size_t)batch, timeout_ns, &got);
        uint64_t te = pt_now();
        if (rc) {
            fprintf(stderr, "gdrpy_chanpp: timeline: %s\n", gdrpy_last_error());
            break;
        }
        rc = check(ans, lens, tags, bm, batch, j0, size);
        *seq += (uint64_t)batch;
        if (rc || i < 0) continue;
        double *r = v + (size_t)i * TL_NCOL;
        first[i] = j0;
        r[TL_SEND] = (double)pt_ns(ts - t0);
        r[TL_COMP0] = (double)pt_ns(th[0] - t0);
        if (jump) {
            r[TL_JUMP] = (double)pt_ns(th[batch - 1] - th[1]);
            continue;
        }
        r[TL_C1] = (double)pt_ns(th[1] - th[0]);
        r[TL_C2] = (double)pt_ns(th[batch > 2 ? 2 : batch - 1] - th[0]);
        r[TL_C8] = (double)pt_ns(th[batch > 8 ? 8 : batch - 1] - th[0]);
        r[TL_C16] = (double)pt_ns(th[batch > 16 ? 16 : batch - 1] - th[0]);
        r[TL_CLAST] = (double)pt_ns(th[batch - 1] - th[0]);
        r[TL_RECV_ALL] = (double)pt_ns(te - th[batch - 1]);
    }
    if (!rc) {
        int kernel_batches = 0;
        double npc = 0;
        if (stamps) {
            gdrpy_copy_from_mapping(g, stamps, CHANPP_TL_BYTES);
            npc = fit_ns_per_cycle(g);
        }
        for (int i = 0; i < nbatches && npc > 0; i++) {
            double *r = v + (size_t)i * TL_NCOL;
            kernel_columns(g, first[i], batch, npc, r);
            kernel_batches += r[TL_A_END] != TL_NONE;
        }
        printf("{\"path\": \"timeline\", \"size\": %zu, \"batch\": %d, \"batches\": %d, "
               "\"kernel_batches\": %d, \"sm_ghz\": %.4f",
               size, batch, nbatches, kernel_batches, npc > 0 ? 1.0 / npc : 0.0);
        for (int c = 0; c < TL_NCOL; c++) {
            int m = 0;
            for (int i = 0; i < nbatches; i++)
                if (v[(size_t)i * TL_NCOL + c] != TL_NONE) col[m++] = v[(size_t)i * TL_NCOL + c];
            if (!m) continue;
            qsort(col, (size_t)m, sizeof *col, cmp_double);
            printf(", \"%s\": [%.1f, %.1f, %.1f]", tl_names[c], col[m / 10], col[m / 2],
                   col[m * 9 / 10]);
        }
        printf("}\n");
    }
    free(v), free(first), free(th), free(ans), free(lens), free(tags), free(g), free(col);
    return rc;
}
