/*
 * sim_ce.c - the sim backend's copy-engine stand-in for the staging ring
 * (staging.h): a thread that executes queued copies in order, optionally
 * slowed down by GDRPY_SIM_CE_DELAY_US so that tests widen every race;
 * events are sequence numbers.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "staging.h"

#define SIM_QUEUE 64

typedef struct sim_op {
    int dir;
    uint64_t dptr;
    void *host;
    size_t n;
} sim_op;

struct sim_ce {
    pthread_t th;
    pthread_mutex_t m;
    pthread_cond_t cv_work, cv_done;
    sim_op q[SIM_QUEUE];
    uint64_t submitted, completed; /* under m */
    int quit;
    unsigned delay_us;
};

static void *sim_ce_main(void *arg)
{
    sim_ce *e = arg;
    pthread_mutex_lock(&e->m);
    for (;;) {
        while (e->completed == e->submitted && !e->quit) pthread_cond_wait(&e->cv_work, &e->m);
        if (e->completed == e->submitted && e->quit) break;
        sim_op op = e->q[e->completed % SIM_QUEUE];
        pthread_mutex_unlock(&e->m);
        if (e->delay_us) usleep(e->delay_us);
        if (op.dir == 0) memcpy((void *)(uintptr_t)op.dptr, op.host, op.n);
        else memcpy(op.host, (void *)(uintptr_t)op.dptr, op.n);
        pthread_mutex_lock(&e->m);
        e->completed++;
        pthread_cond_broadcast(&e->cv_done);
    }
    pthread_mutex_unlock(&e->m);
    return NULL;
}

sim_ce *gp_sim_ce_start(void)
{
    sim_ce *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    pthread_mutex_init(&e->m, NULL);
    pthread_cond_init(&e->cv_work, NULL);
    pthread_cond_init(&e->cv_done, NULL);
    const char *d = getenv("GDRPY_SIM_CE_DELAY_US");
    if (d && *d) e->delay_us = (unsigned)strtoul(d, NULL, 10);
    if (e->delay_us > 100000) e->delay_us = 100000;
    if (pthread_create(&e->th, NULL, sim_ce_main, e) != 0) {
        free(e);
        return NULL;
    }
    return e;
}

void gp_sim_ce_stop(sim_ce *e)
{
    pthread_mutex_lock(&e->m);
    e->quit = 1;
    pthread_cond_broadcast(&e->cv_work);
    pthread_mutex_unlock(&e->m);
    pthread_join(e->th, NULL);
    pthread_mutex_destroy(&e->m);
    pthread_cond_destroy(&e->cv_work);
    pthread_cond_destroy(&e->cv_done);
    free(e);
}

uint64_t gp_sim_ce_submit(sim_ce *e, int dir, uint64_t dptr, void *host, size_t n)
{
    pthread_mutex_lock(&e->m);
    while (e->submitted - e->completed >= SIM_QUEUE) pthread_cond_wait(&e->cv_done, &e->m);
    e->q[e->submitted % SIM_QUEUE] = (sim_op){dir, dptr, host, n};
    uint64_t seq = ++e->submitted;
    pthread_cond_signal(&e->cv_work);
    pthread_mutex_unlock(&e->m);
    return seq;
}

uint64_t gp_sim_ce_mark(sim_ce *e)
{
    pthread_mutex_lock(&e->m);
    uint64_t s = e->submitted;
    pthread_mutex_unlock(&e->m);
    return s;
}

int gp_sim_ce_done(sim_ce *e, uint64_t seq)
{
    pthread_mutex_lock(&e->m);
    int done = e->completed >= seq;
    pthread_mutex_unlock(&e->m);
    return done;
}

void gp_sim_ce_wait(sim_ce *e, uint64_t seq)
{
    pthread_mutex_lock(&e->m);
    while (e->completed < seq) pthread_cond_wait(&e->cv_done, &e->m);
    pthread_mutex_unlock(&e->m);
}
