/*
 * schedule.c - how a staged copy of n bytes is cut into chunks (staging.h).
 *
 * A staged copy costs the engine's time, plus what the engine waits for at
 * the start (a write's first chunk must be copied in before its DMA), plus
 * what the CPU does after the engine is done (a read's last chunk is copied
 * out after its DMA), plus ~2-3 us per DMA (measured on an H100 host).  So a
 * write's chunks ramp up F, 2F, 4F, ... (< S, the slot size) to equal middle
 * chunks of at most S, then down again, but only to max(F, n/8): with the
 * CPU side faster than the engine (enough threads) the end of a write needs
 * no small chunks, and one that is not (few threads) still never waits for
 * more than an eighth of the message at the end.  A read is the mirror
 * image (its first DMA starts at once; its last chunk is F).  F = n/8
 * rounded up to 4 KiB, clamped to [ST_FIRST_MIN, ST_FIRST_MAX] and to S.  A
 * ramp step is taken only while the ramp so far, the step and as much again
 * fit in n; every message from 1 MiB up has at least 3 chunks.
 */
#include "staging.h"

#define ST_FIRST_MIN (32u << 10)  /* smallest first (and last) chunk of a message */
#define ST_FIRST_MAX (256u << 10) /* largest first (and last) chunk of a message */

void gp_sched_make(st_sched *s, size_t n, size_t S, int rev)
{
    size_t F = gp_round_up(n / 8, 4096);
    if (F < ST_FIRST_MIN) F = ST_FIRST_MIN;
    if (F > ST_FIRST_MAX) F = ST_FIRST_MAX;
    if (F > S) F = S;
    unsigned R = 0;
    while (R < 20 && (F << R) < S && F * (((size_t)1 << R) - 1) + 2 * (F << R) <= n) R++;
    size_t head = F * (((size_t)1 << R) - 1);
    /* ramp down (F << (R-1)) ... while the step is at least n/8 and fits */
    unsigned nt = 0;
    size_t tail = 0;
    while (nt < R) {
        size_t step = F << (R - 1 - nt);
        if (step < n / 8) break;
        if (head + tail + step > n) break;
        tail += step;
        nt++;
    }
    s->n = n;
    s->F = F;
    s->R = R;
    s->nt = nt;
    s->rev = rev;
    s->mid_off = head;
    s->mid_n = n - head - tail;
    s->m = s->mid_n ? (s->mid_n + S - 1) / S : 0;
    s->U = s->m ? gp_round_up((s->mid_n + s->m - 1) / s->m, 4096) : 0;
    if (s->U > S) s->U = S; /* cannot happen: S is a multiple of 4096 */
    s->nch = (uint64_t)R + s->m + nt;
}

void gp_sched_chunk(const st_sched *s, uint64_t j, size_t *off, size_t *len)
{
    uint64_t i = s->rev ? s->nch - 1 - j : j; /* the write order's chunk */
    size_t o, l;
    if (i < s->R) {
        o = s->F * (((size_t)1 << i) - 1);
        l = s->F << i;
    } else if (i < s->R + s->m) {
        size_t k = (size_t)(i - s->R);
        o = s->mid_off + k * s->U;
        l = s->mid_n - k * s->U < s->U ? s->mid_n - k * s->U : s->U;
    } else {
        unsigned t = (unsigned)(i - s->R - s->m);
        o = s->mid_off + s->mid_n + s->F * (((size_t)1 << s->R) - ((size_t)1 << (s->R - t)));
        l = s->F << (s->R - 1 - t);
    }
    *off = s->rev ? s->n - o - l : o;
    *len = l;
}

uint64_t gp_stage_schedule(size_t n, size_t slot, int read, uint64_t j, size_t *off,
                           size_t *len)
{
    st_sched s;
    gp_sched_make(&s, n, slot, read);
    if (j < s.nch) gp_sched_chunk(&s, j, off, len);
    return s.nch;
}
