/*
 * staging.h - internal interface of src/staging/ (page-locked host memory and
 * the staging ring; the public one is include/gdrpy_host.h).  The files here
 * use the core only through internal.h and cudadrv.h; the core knows nothing
 * of them (the ring is torn down through the context's teardown hook).
 *
 *   staging.c     the ring, its copy engines, the pipelines, the public calls
 *   schedule.c    how a copy is cut into chunks
 *   pool.c        the CPU side: pieces, copied by the caller and a worker pool
 *   sim_ce.c      the sim backend's copy-engine stand-in
 *   stage_trace.c timelines of staged copies (diagnostics)
 *   hostmem.c     page-locked allocations and registrations (gdrpy_host_*)
 */
#ifndef GDRPY_STAGING_H
#define GDRPY_STAGING_H

#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"
#include "stage_trace.h"

#define ST_MAX_DEPTH 64
#define ST_MAX_THREADS 16

/* A waiting loop's step: pause, and after a while give the CPU away (more
 * threads than CPUs must not starve the thread that is being waited for). */
static inline void relax_step(unsigned *i)
{
    if (++*i > 256) sched_yield();
    else gp_cpu_relax();
}

/* ---- the schedule (schedule.c) ---------------------------------------- */

/* Chunks of a message: ramp-up steps F << i, R of them, then equal middle
 * chunks of at most U, then nt ramp-down steps (schedule.c says why). */
typedef struct st_sched {
    size_t n, F, mid_off, mid_n, U;
    unsigned R, nt; /* ramp-up steps; ramp-down steps (F << (R-1)) ... (F << (R-nt)) */
    int rev;        /* read: the mirror image */
    uint64_t m, nch;
} st_sched;

GP_HIDDEN void gp_sched_make(st_sched *s, size_t n, size_t S, int rev);
/* Offset and length of chunk j (j < nch) in ascending order of offsets; every
 * length is in [1, S]. */
GP_HIDDEN void gp_sched_chunk(const st_sched *s, uint64_t j, size_t *off, size_t *len);
/* How a staged write (read = 0) or read (1) of n bytes through slots of
 * `slot` bytes is cut: returns the number of chunks and, for j below it,
 * chunk j's offset and length (for tests). */
GP_HIDDEN uint64_t gp_stage_schedule(size_t n, size_t slot, int read, uint64_t j,
                                     size_t *off, size_t *len);

/* ---- one staged copy as a stream of pieces (pool.c) -------------------- */

/* Chunk j lives in ring slot (start + j) % depth and is split into `ppc`
 * pieces; piece g is piece g % ppc of chunk g / ppc.  The CPU side of a copy
 * is the pieces, claimed in order by the caller and the pool's workers:
 * a thread copies piece g once g < avail (its slot is free for a write, its
 * DMA has landed for a read) and counts it in slotdone[slot].  The caller
 * alone talks to the engine: it raises avail as slots free up or DMAs land,
 * enqueues the DMA of a chunk whose pieces are all counted (write) and
 * refills a slot whose pieces are all copied out (read), and copies pieces
 * itself when it has nothing else to do.  No thread waits for another at a
 * chunk boundary, so the copies of chunk i+1 run while chunk i's DMA is
 * enqueued and moving. */
typedef struct st_job {
    int dir; /* 0: host -> ring (write), 1: ring -> host (read) */
    char *host;
    char *ring;
    size_t slot_bytes;
    unsigned depth, start, ppc;
    int pooled;                    /* the pool's workers take part */
    int caller_copies;             /* the caller copies pieces whenever it is idle */
    unsigned *active;              /* workers inside the copy (the pool's counter) */
    gp_copy_fn cp;                 /* the CPU copy of a piece */
    void (*evict)(void *, size_t); /* then applied to the piece's ring bytes, or NULL */
    uint64_t total;                /* pieces */
    st_sched sc;
    gp_strace *tr; /* GDRPY_STAGING_TRACE (diagnostics), else NULL */
    char pad0[64];
    uint64_t next; /* next piece to claim (atomic) */
    char pad1[64];
    uint64_t avail; /* pieces < avail may be copied (atomic) */
    char pad2[64];
    int abort; /* atomic */
    char pad3[64];
    unsigned slotdone[ST_MAX_DEPTH]; /* atomic */
    char pad4[64];
} st_job;

static inline unsigned job_slot(const st_job *j, uint64_t ci)
{
    return (unsigned)((j->start + ci) % j->depth);
}

/* Caller: copies one piece if one is free to copy now; never waits. */
GP_HIDDEN int gp_job_try_piece(st_job *j);

/* Workers spin for `spin_s` after a copy (a copy that follows soon finds
 * them awake: a futex wake-up costs tens of microseconds in a VM), then
 * sleep on a condition variable.  The caller never waits for a worker to
 * wake: it starts on the pieces itself and the workers join as they come. */
typedef struct st_pool {
    unsigned n; /* workers (threads - 1) */
    pthread_t th[ST_MAX_THREADS];
    pthread_mutex_t m;
    pthread_cond_t cv;
    double spin_s;
    unsigned sleepers; /* atomic */
    int quit;          /* atomic */
    unsigned gen;      /* copies started (atomic) */
    int open;          /* a copy is running: workers may join (atomic) */
    unsigned active;   /* workers inside the copy (atomic) */
    st_job *job;
} st_pool;

GP_HIDDEN void gp_pool_start(st_pool *p, unsigned workers, st_job *job);
GP_HIDDEN void gp_pool_stop(st_pool *p);
/* Opens the copy described by p->job (fields set) to the workers. */
GP_HIDDEN void gp_pool_open(st_pool *p);
/* Closes the copy: no worker touches the job (or the caller's memory)
 * after this returns. */
GP_HIDDEN void gp_pool_close(st_pool *p);

/* ---- sim copy-engine stand-in (sim_ce.c) ------------------------------ */

typedef struct sim_ce sim_ce;
/* NULL when out of memory or threads. */
GP_HIDDEN sim_ce *gp_sim_ce_start(void);
/* Drains the queue, then stops the thread and frees e. */
GP_HIDDEN void gp_sim_ce_stop(sim_ce *e);
/* Queues a copy (dir 0: host -> "device", 1: back); returns its sequence
 * number. */
GP_HIDDEN uint64_t gp_sim_ce_submit(sim_ce *e, int dir, uint64_t dptr, void *host, size_t n);
/* An event: the sequence number of the last copy queued. */
GP_HIDDEN uint64_t gp_sim_ce_mark(sim_ce *e);
GP_HIDDEN int gp_sim_ce_done(sim_ce *e, uint64_t seq);
GP_HIDDEN void gp_sim_ce_wait(sim_ce *e, uint64_t seq);

#endif /* GDRPY_STAGING_H */
