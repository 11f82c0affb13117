/*
 * stage_trace.c - timeline of staged copies (see stage_trace.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "stage_trace.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TR_MAX_CH 512
#define TR_MAX_P 16384

typedef struct tr_piece {
    double t0, t1;
    size_t bytes;
    int cpu;
} tr_piece;

struct gp_strace {
    char *path;
    int real, events_ok;
    CUevent ev0, evs[TR_MAX_CH], eve[TR_MAX_CH];
    unsigned char gpu_rec[TR_MAX_CH]; /* bit 0: start recorded, bit 1: end */
    /* the copy in progress */
    int dir, caller_cpu;
    size_t n;
    uint64_t nch;
    unsigned ppc, workers;
    double t_begin;
    double mark[TR_MAX_CH][TR_NMARK];
    size_t len[TR_MAX_CH];
    tr_piece *pc; /* TR_MAX_P */
};

double gp_strace_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

gp_strace *gp_strace_new(int real)
{
    const char *e = getenv("GDRPY_STAGING_TRACE");
    if (!e || !*e) return NULL;
    gp_strace *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->path = strdup(e);
    t->pc = calloc(TR_MAX_P, sizeof *t->pc);
    if (!t->path || !t->pc) {
        free(t->path);
        free(t->pc);
        free(t);
        return NULL;
    }
    t->real = real;
    return t;
}

static void destroy_events(gp_strace *t)
{
    if (!t->events_ok) return;
    gp_cu.EventDestroy(t->ev0);
    for (unsigned i = 0; i < TR_MAX_CH; i++) {
        gp_cu.EventDestroy(t->evs[i]);
        gp_cu.EventDestroy(t->eve[i]);
    }
    t->events_ok = 0;
}

void gp_strace_free(gp_strace *t)
{
    if (!t) return;
    destroy_events(t);
    free(t->path);
    free(t->pc);
    free(t);
}

static void make_events(gp_strace *t)
{
    if (t->events_ok || !t->real || !gp_cu.EventElapsedTime) return;
    if (gp_cu.EventCreate(&t->ev0, 0)) return;
    unsigned i = 0;
    for (; i < TR_MAX_CH; i++) {
        if (gp_cu.EventCreate(&t->evs[i], 0)) break;
        if (gp_cu.EventCreate(&t->eve[i], 0)) {
            gp_cu.EventDestroy(t->evs[i]);
            break;
        }
    }
    if (i < TR_MAX_CH) {
        while (i--) {
            gp_cu.EventDestroy(t->evs[i]);
            gp_cu.EventDestroy(t->eve[i]);
        }
        gp_cu.EventDestroy(t->ev0);
        return;
    }
    t->events_ok = 1;
}

void gp_strace_begin(gp_strace *t, int dir, size_t n, uint64_t nch, unsigned ppc,
                     unsigned workers, CUstream s)
{
    if (!t) return;
    make_events(t);
    t->dir = dir;
    t->n = n;
    t->nch = nch;
    t->ppc = ppc;
    t->workers = workers;
    t->caller_cpu = sched_getcpu();
    memset(t->mark, 0, sizeof t->mark);
    memset(t->len, 0, sizeof t->len);
    memset(t->gpu_rec, 0, sizeof t->gpu_rec);
    memset(t->pc, 0, TR_MAX_P * sizeof *t->pc);
    t->t_begin = gp_strace_now();
    if (t->events_ok) gp_cu.EventRecord(t->ev0, s);
}

void gp_strace_mark(gp_strace *t, uint64_t ci, int what, size_t len)
{
    if (!t || ci >= TR_MAX_CH || what < 0 || what >= TR_NMARK) return;
    t->mark[ci][what] = gp_strace_now() - t->t_begin;
    if (len) t->len[ci] = len;
}

void gp_strace_gpu(gp_strace *t, uint64_t ci, int end, CUstream s)
{
    if (!t || !t->events_ok || ci >= TR_MAX_CH) return;
    if (gp_cu.EventRecord(end ? t->eve[ci] : t->evs[ci], s) == CUDA_SUCCESS)
        t->gpu_rec[ci] |= (unsigned char)(end ? 2 : 1);
}

void gp_strace_piece(gp_strace *t, uint64_t g, double t0, double t1, size_t bytes)
{
    if (!t || g >= TR_MAX_P) return;
    tr_piece *p = &t->pc[g];
    p->t0 = t0 - t->t_begin;
    p->t1 = t1 - t->t_begin;
    p->bytes = bytes;
    p->cpu = sched_getcpu();
}

static double gpu_us(gp_strace *t, CUevent e)
{
    float ms = -1.0f;
    if (gp_cu.EventSynchronize(e) != CUDA_SUCCESS) return -1.0;
    if (gp_cu.EventElapsedTime(&ms, t->ev0, e) != CUDA_SUCCESS) return -1.0;
    return (double)ms * 1e3;
}

void gp_strace_end(gp_strace *t, int rc)
{
    if (!t) return;
    double total = gp_strace_now() - t->t_begin;
    FILE *f = fopen(t->path, "a");
    if (!f) return;
    fprintf(f, "C dir=%d n=%zu nch=%llu ppc=%u workers=%u caller_cpu=%d rc=%d total_us=%.2f\n",
            t->dir, t->n, (unsigned long long)t->nch, t->ppc, t->workers, t->caller_cpu, rc,
            total * 1e6);
    uint64_t nc = t->nch < TR_MAX_CH ? t->nch : TR_MAX_CH;
    for (uint64_t i = 0; i < nc; i++) {
        double gs = -1, ge = -1;
        if (t->events_ok && (t->gpu_rec[i] & 3) == 3) {
            gs = gpu_us(t, t->evs[i]);
            ge = gpu_us(t, t->eve[i]);
        }
        fprintf(f, "K %llu %zu %.2f %.2f %.2f %.2f %.2f %.2f\n", (unsigned long long)i,
                t->len[i], t->mark[i][TR_OPEN] * 1e6, t->mark[i][TR_COPIED] * 1e6,
                t->mark[i][TR_ENQ0] * 1e6, t->mark[i][TR_ENQ1] * 1e6, gs, ge);
    }
    uint64_t np = t->nch * t->ppc;
    if (np > TR_MAX_P) np = TR_MAX_P;
    for (uint64_t g = 0; g < np; g++) {
        const tr_piece *p = &t->pc[g];
        fprintf(f, "P %llu %d %.2f %.2f %zu\n", (unsigned long long)g, p->cpu, p->t0 * 1e6,
                p->t1 * 1e6, p->bytes);
    }
    fprintf(f, "E\n");
    fclose(f);
}
