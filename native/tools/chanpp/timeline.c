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
 * below (ns).  The kernel's columns come from the batches whose every round
 * left its entry (kernel_batches of them); an entry names its round's first
 * message, so one left by a round 4096 messages earlier is not taken.
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

/* Entry of the round whose first message is h, or NULL when that round
 * left none (or an entry 4096 messages older is there). */
static const uint64_t *round_entry(const uint64_t *g, uint64_t h)
{
    const uint64_t *e = g + 8 * (h & (CHANPP_TL_ENTRIES - 1));
    if (!e[0] || (uint32_t)e[7] == 0 || (uint32_t)(e[7] >> 32) != (uint32_t)h) return NULL;
    return e;
}

/* The kernel's columns of one batch (first message j0) from the stamps g,
 * into r; 1 when every round of the batch left its entry (else r is left
 * as it was). */
static int kernel_columns(const uint64_t *g, uint64_t j0, int batch, double ns_per_cycle,
                          double *r)
{
    const uint64_t *a = round_entry(g, j0), *b = NULL;
    if (!a) return 0;
    const uint64_t base = a[2]; /* A's poll end */
    uint64_t h = j0 + (uint32_t)a[7];
    const uint64_t *last = a;
    int rounds = 1;
    while (h < j0 + (uint64_t)batch) {
        const uint64_t *e = round_entry(g, h);
        if (!e || rounds >= 64) return 0;
        if (!b) b = e;
        last = e;
        h += (uint32_t)e[7];
        rounds++;
    }
#define NS(clk) ((double)(int64_t)((clk) - base) * ns_per_cycle)
#define MARK(clk) ((clk) ? NS(clk) : TL_NONE)
    r[TL_A_WAIT] = MARK(a[3]);
    r[TL_A_PRESTORE] = MARK(a[4]);
    r[TL_A_POSTSTORE] = MARK(a[5]);
    r[TL_A_END] = NS(a[6]);
    r[TL_A_N] = (uint32_t)a[7];
    if (b) {
        r[TL_B_POLL] = NS(b[1]);
        r[TL_B_POLLED] = NS(b[2]);
        r[TL_B_WAIT] = MARK(b[3]);
        r[TL_B_PRESTORE] = MARK(b[4]);
        r[TL_B_POSTSTORE] = MARK(b[5]);
        r[TL_B_END] = NS(b[6]);
        r[TL_B_N] = (uint32_t)b[7];
    }
    r[TL_ROUNDS] = rounds;
    r[TL_LAST_END] = NS(last[6]);
#undef MARK
#undef NS
    return 1;
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

struct chanpp_timeline {
    int batch, nbatches;
    size_t size;
    void *stamps;
    double *v;       /* nbatches x TL_NCOL */
    uint64_t *first; /* each batch's first message */
};

static void timeline_free(chanpp_timeline_t *t)
{
    if (!t) return;
    free(t->v);
    free(t->first);
    free(t);
}

chanpp_timeline_t *chanpp_timeline_run(gdrpy_chan_t *ch, const gdrpy_chan_msg_t *bm, int batch,
                                       size_t size, int64_t timeout_ns, uint64_t *seq,
                                       void *stamps, chanpp_check_fn check)
{
    if (batch < 2) {
        fprintf(stderr, "gdrpy_chanpp: timeline: needs a batch of 2 or more\n");
        return NULL;
    }
    pt_init(); /* this file's copy of the timer (ptimer.h is header-only) */
    /* every batch's rounds must keep their entries until the report */
    int nb = (int)(CHANPP_TL_ENTRIES / (unsigned)batch);
    if (nb > 100) nb = 100;
    if (nb < 1) nb = 1;
    gdrpy_chan_desc_t d;
    gdrpy_chan_get_desc(ch, &d);
    /* the completion slots follow the host block in one allocation */
    const char *comp = (const char *)gdrpy_chan_host_block(ch) + (d.comp - d.host_ctrl);
    const uint64_t spin_ns = timeout_ns > 0 ? (uint64_t)timeout_ns : 10000000000ull;
    chanpp_timeline_t *t = calloc(1, sizeof *t);
    uint64_t *th = malloc(sizeof(uint64_t) * (size_t)batch);
    unsigned char (*ans)[16] = malloc((size_t)batch * 16);
    uint32_t *lens = malloc(sizeof(uint32_t) * (size_t)batch);
    uint32_t *tags = malloc(sizeof(uint32_t) * (size_t)batch);
    void *zero = calloc(1, CHANPP_TL_BYTES);
    if (t) {
        t->v = malloc(sizeof(double) * (size_t)nb * TL_NCOL);
        t->first = calloc((size_t)nb, sizeof(uint64_t));
    }
    int rc = !t || !t->v || !t->first || !th || !ans || !lens || !tags || !zero;
    if (rc) fprintf(stderr, "gdrpy_chanpp: timeline: out of memory\n");
    if (!rc) {
        t->batch = batch;
        t->nbatches = nb;
        t->size = size;
        t->stamps = stamps;
        for (int i = 0; i < nb * TL_NCOL; i++) t->v[i] = TL_NONE;
        /* only this run's rounds count: the kernel writes an entry at a
         * round's end, and no round runs while the host sends nothing */
        if (stamps) gdrpy_copy_to_mapping(stamps, zero, CHANPP_TL_BYTES);
    }
    for (int i = -20; i < nb && !rc; i++) {
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
        double *r = t->v + (size_t)i * TL_NCOL;
        t->first[i] = j0;
        r[TL_SEND] = (double)pt_ns(ts - t0);
        r[TL_COMP0] = (double)pt_ns(th[0] - t0);
        if (jump) {
            r[TL_JUMP] = (double)pt_ns(th[batch - 1] - th[1]);
            continue;
        }
        /* completion k's column only where the batch has one */
        static const int ks[] = {1, 2, 8, 16};
        for (int q = 0; q < 4; q++)
            if (ks[q] < batch) r[TL_C1 + q] = (double)pt_ns(th[ks[q]] - th[0]);
        r[TL_CLAST] = (double)pt_ns(th[batch - 1] - th[0]);
        r[TL_RECV_ALL] = (double)pt_ns(te - th[batch - 1]);
    }
    free(th), free(ans), free(lens), free(tags), free(zero);
    if (rc) {
        timeline_free(t);
        return NULL;
    }
    return t;
}

/* The line for host columns v (and kernel columns from stamps g, when
 * given) of nb batches whose first messages are first[]. */
static void timeline_print(double *v, const uint64_t *first, int nb, int batch, size_t size,
                           const uint64_t *g)
{
    const double npc = g ? fit_ns_per_cycle(g) : 0.0;
    int kernel_batches = 0;
    for (int i = 0; i < nb && npc > 0; i++)
        kernel_batches += kernel_columns(g, first[i], batch, npc, v + (size_t)i * TL_NCOL);
    printf("{\"path\": \"timeline\", \"size\": %zu, \"batch\": %d, \"batches\": %d, "
           "\"kernel_batches\": %d, \"sm_ghz\": %.4f",
           size, batch, nb, kernel_batches, npc > 0 ? 1.0 / npc : 0.0);
    double *col = malloc(sizeof(double) * (size_t)nb);
    for (int c = 0; c < TL_NCOL && col; c++) {
        int m = 0;
        for (int i = 0; i < nb; i++)
            if (v[(size_t)i * TL_NCOL + c] != TL_NONE) col[m++] = v[(size_t)i * TL_NCOL + c];
        if (!m) continue;
        qsort(col, (size_t)m, sizeof *col, cmp_double);
        printf(", \"%s\": [%.1f, %.1f, %.1f]", tl_names[c], col[m / 10], col[m / 2],
               col[m * 9 / 10]);
    }
    printf("}\n");
    free(col);
}

void chanpp_timeline_report(chanpp_timeline_t *t)
{
    if (!t) return;
    uint64_t *g = NULL;
    if (t->stamps && (g = malloc(CHANPP_TL_BYTES)) != NULL)
        gdrpy_copy_from_mapping(g, t->stamps, CHANPP_TL_BYTES);
    timeline_print(t->v, t->first, t->nbatches, t->batch, t->size, g);
    free(g);
    timeline_free(t);
}

/* ---- self-test ---------------------------------------------------------- */

/* A made-up round: first message h, n messages, clocks from c (SM cycles),
 * globaltimer 2 ns per cycle. */
static void fake_round(uint64_t *g, uint64_t h, uint32_t n, uint64_t c)
{
    uint64_t *e = g + 8 * (h & (CHANPP_TL_ENTRIES - 1));
    e[0] = 2 * (c + 200) + 1000; /* globaltimer at the end */
    e[1] = c;                    /* poll start */
    e[2] = c + 100;              /* poll end */
    e[3] = c + 110, e[4] = c + 120, e[5] = c + 130;
    e[6] = c + 200; /* end */
    e[7] = n | ((uint64_t)(uint32_t)h << 32);
}

static int expect(const char *what, double got, double want)
{
    if (got > want - 0.01 && got < want + 0.01) return 0;
    fprintf(stderr, "gdrpy_chanpp: timeline selftest: %s %.2f, want %.2f\n", what, got, want);
    return 1;
}

int chanpp_timeline_selftest(void)
{
    const int batch = 32, nb = 10;
    uint64_t *g = calloc(CHANPP_TL_ENTRIES, 64);
    double r[TL_NCOL];
    int bad = !g;
    /* batch i (messages 32i..32i+31): round A takes 1, B 20, C 11; clocks
     * 1000 cycles apart per batch, rounds 300 apart */
    for (int i = 0; i < nb && g; i++) {
        const uint64_t j0 = 32u * (uint64_t)i, c = 100000u + 1000u * (uint64_t)i;
        fake_round(g, j0, 1, c);
        fake_round(g, j0 + 1, 20, c + 300);
        fake_round(g, j0 + 21, 11, c + 600);
    }
    const double npc = g ? fit_ns_per_cycle(g) : 0;
    bad |= expect("ns per cycle", npc, 2.0);
    for (int q = 0; q < TL_NCOL; q++) r[q] = TL_NONE;
    if (!bad && !kernel_columns(g, 64, batch, npc, r)) bad = 1, fprintf(stderr, "batch 2 not found\n");
    if (!bad) {
        /* from A's poll end (c + 100), 2 ns per cycle */
        bad |= expect("A_wait", r[TL_A_WAIT], 20);
        bad |= expect("A_end", r[TL_A_END], 200);
        bad |= expect("A_n", r[TL_A_N], 1);
        bad |= expect("B_poll", r[TL_B_POLL], 400);
        bad |= expect("B_polled", r[TL_B_POLLED], 600);
        bad |= expect("B_poststore", r[TL_B_POSTSTORE], 660);
        bad |= expect("B_end", r[TL_B_END], 800);
        bad |= expect("B_n", r[TL_B_N], 20);
        bad |= expect("rounds", r[TL_ROUNDS], 3);
        bad |= expect("last_end", r[TL_LAST_END], 1400);
    }
    /* a round whose entry is missing, and one overwritten by a round 4096
     * messages later: no kernel columns for those batches */
    if (!bad) {
        memset(g + 8 * (3u * 32u + 21u), 0, 64);
        if (kernel_columns(g, 3u * 32u, batch, npc, r)) bad = 1, fprintf(stderr, "missing round taken\n");
        fake_round(g, 4096u + 5u * 32u + 1u, 20, 7);
        if (kernel_columns(g, 5u * 32u, batch, npc, r)) bad = 1, fprintf(stderr, "older entry taken\n");
        if (!kernel_columns(g, 4u * 32u, batch, npc, r)) bad = 1, fprintf(stderr, "batch 4 lost\n");
    }
    free(g);
    if (!bad) printf("timeline selftest: ok\n");
    return bad;
}
