/*
 * pool.c - the CPU side of a staged copy (staging.h): its pieces, copied by
 * the caller and a pool of memcpy workers.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "staging.h"

#define ST_SPIN_S 500e-6 /* a worker spins this long before sleeping */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void piece_do(st_job *j, uint64_t g)
{
    uint64_t ci = g / j->ppc;
    size_t p = (size_t)(g % j->ppc);
    size_t off, len;
    gp_sched_chunk(&j->sc, ci, &off, &len);
    size_t part = gp_round_up((len + j->ppc - 1) / j->ppc, 64);
    size_t po = p * part;
    unsigned k = job_slot(j, ci);
    if (po < len) {
        size_t pl = len - po < part ? len - po : part;
        char *slot = j->ring + (size_t)k * j->slot_bytes + po;
        char *h = j->host + off + po;
        double t0 = j->tr ? gp_strace_now() : 0;
        if (j->dir == 0) j->cp(slot, h, pl);
        else j->cp(h, slot, pl);
        if (j->evict) j->evict(slot, pl);
        if (j->tr) gp_strace_piece(j->tr, g, t0, gp_strace_now(), pl);
    }
    __atomic_add_fetch(&j->slotdone[k], 1, __ATOMIC_RELEASE);
}

/* Worker: claims pieces until none are left (or the copy is aborted). */
static void job_work(st_job *j)
{
    for (;;) {
        uint64_t g = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (g >= j->total) return;
        unsigned spins = 0;
        while (g >= __atomic_load_n(&j->avail, __ATOMIC_ACQUIRE)) {
            if (__atomic_load_n(&j->abort, __ATOMIC_ACQUIRE)) return;
            relax_step(&spins);
        }
        piece_do(j, g);
    }
}

int gp_job_try_piece(st_job *j)
{
    if (!j->caller_copies && (!j->pooled || __atomic_load_n(j->active, __ATOMIC_ACQUIRE)))
        return 0;
    uint64_t g = __atomic_load_n(&j->next, __ATOMIC_RELAXED);
    if (g >= j->total || g >= __atomic_load_n(&j->avail, __ATOMIC_ACQUIRE)) return 0;
    if (!__atomic_compare_exchange_n(&j->next, &g, g + 1, 0, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED))
        return 1; /* another thread took it: look again */
    piece_do(j, g);
    return 1;
}
static void *worker_main(void *arg)
{
    st_pool *p = arg;
    unsigned seen = 0;
    for (;;) {
        int got = 0;
        double t_end = now_s() + p->spin_s;
        for (unsigned i = 1;; i++) {
            if (__atomic_load_n(&p->gen, __ATOMIC_ACQUIRE) != seen ||
                __atomic_load_n(&p->quit, __ATOMIC_ACQUIRE)) {
                got = 1;
                break;
            }
            if (i > 256) sched_yield();
            else gp_cpu_relax();
            if ((i & 63) == 0 && now_s() > t_end) break;
        }
        if (!got) {
            pthread_mutex_lock(&p->m);
            __atomic_add_fetch(&p->sleepers, 1, __ATOMIC_SEQ_CST);
            while (__atomic_load_n(&p->gen, __ATOMIC_SEQ_CST) == seen &&
                   !__atomic_load_n(&p->quit, __ATOMIC_SEQ_CST))
                pthread_cond_wait(&p->cv, &p->m);
            __atomic_sub_fetch(&p->sleepers, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&p->m);
        }
        if (__atomic_load_n(&p->quit, __ATOMIC_ACQUIRE)) return NULL;
        seen = __atomic_load_n(&p->gen, __ATOMIC_SEQ_CST);
        /* join only while the copy is open; the caller closes it and then
         * waits for `active` to drop to 0 (both sides sequentially consistent) */
        __atomic_add_fetch(&p->active, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&p->open, __ATOMIC_SEQ_CST)) job_work(p->job);
        __atomic_sub_fetch(&p->active, 1, __ATOMIC_SEQ_CST);
    }
}

void gp_pool_start(st_pool *p, unsigned workers, st_job *job)
{
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->m, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->job = job;
    p->spin_s = ST_SPIN_S;
    const char *e = getenv("GDRPY_STAGING_SPIN_US");
    if (e && *e) {
        double us = strtod(e, NULL);
        if (us >= 0 && us <= 1e6) p->spin_s = us * 1e-6;
    }
    for (unsigned i = 0; i < workers && i < ST_MAX_THREADS; i++) {
        if (pthread_create(&p->th[i], NULL, worker_main, p) != 0) break;
        p->n++;
    }
    /* fewer workers than asked for only slows the copies */
}

void gp_pool_stop(st_pool *p)
{
    pthread_mutex_lock(&p->m);
    __atomic_store_n(&p->quit, 1, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->m);
    for (unsigned i = 0; i < p->n; i++) pthread_join(p->th[i], NULL);
    p->n = 0;
    pthread_mutex_destroy(&p->m);
    pthread_cond_destroy(&p->cv);
}

void gp_pool_open(st_pool *p)
{
    __atomic_store_n(&p->open, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&p->gen, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&p->sleepers, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&p->m);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->m);
    }
}

void gp_pool_close(st_pool *p)
{
    __atomic_store_n(&p->open, 0, __ATOMIC_SEQ_CST);
    unsigned spins = 0;
    while (__atomic_load_n(&p->active, __ATOMIC_SEQ_CST)) relax_step(&spins);
}
