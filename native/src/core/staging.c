/*
 * staging.c - copy-engine copies from/to pageable host memory through a
 * per-context ring of page-locked chunks (gdrpy_host.h).
 *
 * Pipeline.  A copy of n bytes is cut into chunks of `eff` bytes (the
 * configured chunk, smaller for messages under chunk * depth so that even
 * they overlap).  Slot k of the ring is chunk i with k = (start + i) % depth.
 *   write (h2d): wait until slot k's previous DMA is done (its event), copy
 *     chunk i into it with the CPU (split over `threads` threads), enqueue the
 *     DMA slot -> device and record slot k's event.  The CPU copy of chunk
 *     i+1 runs while the engine moves chunk i.
 *   read (d2h): enqueue the DMAs of the first `depth` chunks; then for each
 *     chunk wait for its event, copy it out with the CPU and enqueue the DMA
 *     of chunk i+depth into the slot just emptied.
 * Without a stream the DMAs run on the legacy default stream of the device's
 * primary context and the call returns when everything has landed.  With a
 * stream they run on it (ordered after its earlier work); a write returns
 * once the source has been consumed (later work on the stream sees the
 * data), and slots whose DMA is still queued are waited for by the next
 * staged copy before reuse.  A stream of another CUDA context than the
 * primary one, or a driver without events, takes the direct cuMemcpy path.
 *
 * Engines.  Real backends use cuMemcpy*Async + cuEventRecord/Synchronize in
 * the primary context (retained by the ring).  On sim a copy-engine stand-in
 * thread executes queued copies in order (optionally slowed down by
 * GDRPY_SIM_CE_DELAY_US so that tests widen every race), and events are
 * sequence numbers; sim has no streams, so a sim copy always completes
 * before returning.  The pipeline code is the same for both.
 *
 * Locking: one staged copy at a time per context (`op_lock`); configuration
 * changes take the same lock.  The copy holds the context entered and the
 * pin's in-flight count (gp_copy_begin) for its whole duration.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "cudadrv.h"
#include "gdrpy_host.h"

#define ST_MAX_DEPTH 8
#define ST_MAX_THREADS 16
#define ST_MIN_CHUNK (64u << 10)
#define ST_MAX_CHUNK (64u << 20)
#define ST_SMALL_CHUNK (128u << 10) /* smallest chunk a short message is cut into */
#define ST_MIN_PART (256u << 10)    /* smallest per-thread share of a chunk */
#define ST_SPIN_S 200e-6            /* a worker spins this long before sleeping */
#define SIM_QUEUE 64

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* ---- memcpy worker pool ------------------------------------------------ */

typedef struct st_worker {
    pthread_t th;
    struct st_pool *pool;
    unsigned seq;  /* jobs posted (atomic) */
    unsigned done; /* jobs finished (atomic) */
    char *d;
    const char *s;
    size_t n;
} st_worker;

typedef struct st_pool {
    unsigned n; /* workers (threads - 1) */
    pthread_mutex_t m;
    pthread_cond_t cv;
    unsigned sleepers; /* atomic */
    int quit;          /* atomic */
    st_worker w[ST_MAX_THREADS];
} st_pool;

static void *worker_main(void *arg)
{
    st_worker *w = arg;
    st_pool *p = w->pool;
    for (;;) {
        unsigned seen = __atomic_load_n(&w->done, __ATOMIC_RELAXED);
        int got = 0;
        double t_end = now_s() + ST_SPIN_S;
        for (unsigned i = 1;; i++) {
            if (__atomic_load_n(&w->seq, __ATOMIC_ACQUIRE) != seen ||
                __atomic_load_n(&p->quit, __ATOMIC_ACQUIRE)) {
                got = 1;
                break;
            }
            cpu_relax();
            if ((i & 63) == 0 && now_s() > t_end) break;
        }
        if (!got) {
            pthread_mutex_lock(&p->m);
            __atomic_add_fetch(&p->sleepers, 1, __ATOMIC_SEQ_CST);
            while (__atomic_load_n(&w->seq, __ATOMIC_SEQ_CST) == seen &&
                   !__atomic_load_n(&p->quit, __ATOMIC_SEQ_CST))
                pthread_cond_wait(&p->cv, &p->m);
            __atomic_sub_fetch(&p->sleepers, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&p->m);
        }
        if (__atomic_load_n(&p->quit, __ATOMIC_ACQUIRE)) return NULL;
        unsigned seq = __atomic_load_n(&w->seq, __ATOMIC_ACQUIRE);
        if (w->n) memcpy(w->d, w->s, w->n);
        __atomic_store_n(&w->done, seq, __ATOMIC_RELEASE);
    }
}

static int pool_start(st_pool *p, unsigned workers)
{
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->m, NULL);
    pthread_cond_init(&p->cv, NULL);
    for (unsigned i = 0; i < workers; i++) {
        p->w[i].pool = p;
        if (pthread_create(&p->w[i].th, NULL, worker_main, &p->w[i]) != 0) break;
        p->n++;
    }
    return 0; /* fewer workers than asked for only slows the copies */
}

static void pool_stop(st_pool *p)
{
    pthread_mutex_lock(&p->m);
    __atomic_store_n(&p->quit, 1, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->m);
    for (unsigned i = 0; i < p->n; i++) pthread_join(p->w[i].th, NULL);
    p->n = 0;
    pthread_mutex_destroy(&p->m);
    pthread_cond_destroy(&p->cv);
}

/* memcpy of n bytes split over up to `threads` threads (the caller is one). */
static void par_memcpy(st_pool *p, unsigned threads, void *dst, const void *src, size_t n)
{
    unsigned t = threads;
    if (t > p->n + 1) t = p->n + 1;
    if (t > n / ST_MIN_PART) t = (unsigned)(n / ST_MIN_PART);
    if (t <= 1) {
        memcpy(dst, src, n);
        return;
    }
    size_t part = gp_round_up((n + t - 1) / t, 4096);
    char *d = dst;
    const char *s = src;
    unsigned used = 0;
    for (unsigned i = 1; i < t; i++) {
        size_t off = (size_t)i * part;
        if (off >= n) break;
        st_worker *w = &p->w[i - 1];
        w->d = d + off;
        w->s = s + off;
        w->n = n - off < part ? n - off : part;
        __atomic_add_fetch(&w->seq, 1, __ATOMIC_SEQ_CST);
        used = i;
    }
    if (__atomic_load_n(&p->sleepers, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&p->m);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->m);
    }
    memcpy(d, s, n < part ? n : part);
    for (unsigned i = 1; i <= used; i++) {
        st_worker *w = &p->w[i - 1];
        unsigned want = __atomic_load_n(&w->seq, __ATOMIC_RELAXED);
        while (__atomic_load_n(&w->done, __ATOMIC_ACQUIRE) != want) cpu_relax();
    }
}

/* ---- sim copy-engine stand-in ----------------------------------------- */

typedef struct sim_op {
    int dir;
    uint64_t dptr;
    void *host;
    size_t n;
} sim_op;

typedef struct sim_ce {
    pthread_t th;
    pthread_mutex_t m;
    pthread_cond_t cv_work, cv_done;
    sim_op q[SIM_QUEUE];
    uint64_t submitted, completed; /* under m */
    int quit;
    unsigned delay_us;
} sim_ce;

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

static sim_ce *sim_ce_start(void)
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

static void sim_ce_stop(sim_ce *e)
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

static uint64_t sim_ce_submit(sim_ce *e, int dir, uint64_t dptr, void *host, size_t n)
{
    pthread_mutex_lock(&e->m);
    while (e->submitted - e->completed >= SIM_QUEUE) pthread_cond_wait(&e->cv_done, &e->m);
    e->q[e->submitted % SIM_QUEUE] = (sim_op){dir, dptr, host, n};
    uint64_t seq = ++e->submitted;
    pthread_cond_signal(&e->cv_work);
    pthread_mutex_unlock(&e->m);
    return seq;
}

static uint64_t sim_ce_mark(sim_ce *e)
{
    pthread_mutex_lock(&e->m);
    uint64_t s = e->submitted;
    pthread_mutex_unlock(&e->m);
    return s;
}

static void sim_ce_wait(sim_ce *e, uint64_t seq)
{
    pthread_mutex_lock(&e->m);
    while (e->completed < seq) pthread_cond_wait(&e->cv_done, &e->m);
    pthread_mutex_unlock(&e->m);
}

/* ---- the ring ---------------------------------------------------------- */

typedef struct gp_stage {
    pthread_mutex_t op_lock;
    /* configuration (under op_lock) */
    size_t chunk;
    unsigned depth, threads;
    /* the ring as built (ready = 1) */
    int ready;
    int sim;
    int device;
    char *ring;
    size_t ring_bytes;
    size_t ring_chunk;
    unsigned ring_depth;
    unsigned ring_threads;
    unsigned next;             /* slot the next copy starts at */
    int pending[ST_MAX_DEPTH]; /* a DMA of the slot may be in flight */
    CUcontext pctx;            /* real: retained primary context */
    CUevent ev[ST_MAX_DEPTH];
    sim_ce *sce; /* sim */
    uint64_t sim_ev[ST_MAX_DEPTH];
    st_pool pool;
    int pool_on;
    int warned;
} gp_stage;

static pthread_mutex_t st_create_lock = PTHREAD_MUTEX_INITIALIZER;

static void st_atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    memcpy(&st_create_lock, &fresh, sizeof fresh);
}

__attribute__((constructor)) static void st_init(void)
{
    pthread_atfork(NULL, NULL, st_atfork_child);
}

static unsigned default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned t = n >= 16 ? 4 : n >= 8 ? 2
                                      : 1;
    return t;
}

static gp_stage *stage_of(gp_ctx *c)
{
    pthread_mutex_lock(&st_create_lock);
    gp_stage *st = c->stage;
    if (!st) {
        st = calloc(1, sizeof *st);
        if (st) {
            pthread_mutex_init(&st->op_lock, NULL);
            st->chunk = 4u << 20;
            st->depth = 4;
            st->threads = default_threads();
            c->stage = st;
        }
    }
    pthread_mutex_unlock(&st_create_lock);
    return st;
}

/* With op_lock held (real): make the ring's context current. */
static int st_push(gp_stage *st)
{
    CUresult r = gp_cu.CtxPushCurrent(st->pctx);
    if (r) return gp_cuda_err(0, r, "cuCtxPushCurrent", "staging on device %d", st->device);
    return 0;
}

static void st_pop(void)
{
    CUcontext c;
    gp_cu.CtxPopCurrent(&c);
}

static void eng_wait(gp_stage *st, unsigned k);

/* With op_lock held: tears the ring down (waits for its DMAs first). */
static void ring_free(gp_stage *st)
{
    if (!st->ready) return;
    if (st->sim) {
        if (st->sce) sim_ce_stop(st->sce); /* drains the queue first */
        st->sce = NULL;
        if (st->ring) munmap(st->ring, st->ring_bytes);
    } else {
        if (st_push(st) == 0) {
            for (unsigned k = 0; k < st->ring_depth; k++) {
                if (st->ev[k]) {
                    if (st->pending[k]) gp_cu.EventSynchronize(st->ev[k]);
                    gp_cu.EventDestroy(st->ev[k]);
                }
                st->ev[k] = NULL;
            }
            if (st->ring) gp_cu.MemFreeHost(st->ring);
            st_pop();
        }
        CUdevice d;
        if (gp_cu.DeviceGet(&d, st->device) == CUDA_SUCCESS) gp_cu.DevicePrimaryCtxRelease(d);
        st->pctx = NULL;
    }
    if (st->pool_on) pool_stop(&st->pool);
    st->pool_on = 0;
    st->ring = NULL;
    st->ring_bytes = 0;
    memset(st->pending, 0, sizeof st->pending);
    st->ready = 0;
}

/* With op_lock held: builds the ring for the current configuration.
 * ENOTSUP means "use the direct path" (no events in this driver). */
static int ring_build(gp_stage *st, gp_ctx *c)
{
    if (st->ready && st->ring_chunk == st->chunk && st->ring_depth == st->depth &&
        st->ring_threads == st->threads)
        return 0;
    ring_free(st);
    st->sim = !c->be->is_real;
    st->device = c->device;
    st->ring_chunk = st->chunk;
    st->ring_depth = st->depth;
    st->ring_threads = st->threads;
    st->ring_bytes = st->chunk * st->depth;
    st->next = 0;
    if (st->sim) {
        void *p = mmap(NULL, st->ring_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (p == MAP_FAILED)
            return gp_err(GDRPY_ENOMEM, "staging: mmap of a %zu-byte ring failed: %s",
                          st->ring_bytes, strerror(errno));
        st->ring = p;
        st->sce = sim_ce_start();
        if (!st->sce) {
            munmap(p, st->ring_bytes);
            st->ring = NULL;
            return gp_err(GDRPY_ENOMEM, "staging: cannot start the sim copy engine");
        }
    } else {
        int rc = gp_cuda_load(NULL, 0);
        if (rc) return rc;
        if (!gp_cu.MemHostAlloc || !gp_cu.MemFreeHost || !gp_cu.EventCreate ||
            !gp_cu.EventDestroy || !gp_cu.EventRecord || !gp_cu.EventSynchronize)
            return gp_err(GDRPY_ENOTSUP, "staging: libcuda lacks host allocation or events");
        CUdevice d;
        CUresult r = gp_cu.DeviceGet(&d, c->device);
        if (!r) r = gp_cu.DevicePrimaryCtxRetain(&st->pctx, d);
        if (r) return gp_cuda_err(0, r, "cuDevicePrimaryCtxRetain", "staging ring");
        st->ready = 1; /* from here ring_free undoes what was done */
        rc = st_push(st);
        if (rc) {
            ring_free(st);
            return rc;
        }
        void *p = NULL;
        r = gp_cu.MemHostAlloc(&p, st->ring_bytes, CU_MEMHOSTALLOC_PORTABLE);
        if (r) {
            st_pop();
            ring_free(st);
            return gp_cuda_err(0, r, "cuMemHostAlloc", "staging ring of %zu bytes",
                               st->ring_bytes);
        }
        st->ring = p;
        for (unsigned k = 0; k < st->ring_depth && !r; k++)
            r = gp_cu.EventCreate(&st->ev[k], CU_EVENT_DISABLE_TIMING);
        st_pop();
        if (r) {
            ring_free(st);
            return gp_cuda_err(0, r, "cuEventCreate", "staging ring");
        }
    }
    if (st->threads > 1) {
        pool_start(&st->pool, st->threads - 1);
        st->pool_on = 1;
    }
    st->ready = 1;
    return 0;
}

void gp_stage_destroy(gp_ctx *c)
{
    gp_stage *st = c->stage;
    if (!st) return;
    c->stage = NULL;
    pthread_mutex_lock(&st->op_lock);
    ring_free(st);
    pthread_mutex_unlock(&st->op_lock);
    pthread_mutex_destroy(&st->op_lock);
    free(st);
}

/* ---- engine operations (inside st_push on real backends) -------------- */

static int eng_copy(gp_stage *st, int dir, uint64_t dptr, void *host, size_t n, CUstream s)
{
    if (st->sim) {
        sim_ce_submit(st->sce, dir, dptr, host, n);
        return 0;
    }
    CUresult r = dir == 0 ? gp_cu.MemcpyHtoDAsync(dptr, host, n, s)
                          : gp_cu.MemcpyDtoHAsync(host, dptr, n, s);
    if (r)
        return gp_cuda_err(0, r, dir == 0 ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync",
                           "staged copy of %zu bytes %s device 0x%llx", n,
                           dir == 0 ? "to" : "from", (unsigned long long)dptr);
    return 0;
}

static int eng_record(gp_stage *st, unsigned k, CUstream s)
{
    st->pending[k] = 1;
    if (st->sim) {
        st->sim_ev[k] = sim_ce_mark(st->sce);
        return 0;
    }
    CUresult r = gp_cu.EventRecord(st->ev[k], s);
    if (r) return gp_cuda_err(0, r, "cuEventRecord", "staged copy");
    return 0;
}

static void eng_wait(gp_stage *st, unsigned k)
{
    if (!st->pending[k]) return;
    if (st->sim) sim_ce_wait(st->sce, st->sim_ev[k]);
    else gp_cu.EventSynchronize(st->ev[k]);
    st->pending[k] = 0;
}

static int eng_wait_checked(gp_stage *st, unsigned k)
{
    if (!st->pending[k]) return 0;
    st->pending[k] = 0;
    if (st->sim) {
        sim_ce_wait(st->sce, st->sim_ev[k]);
        return 0;
    }
    CUresult r = gp_cu.EventSynchronize(st->ev[k]);
    if (r) return gp_cuda_err(0, r, "cuEventSynchronize", "staged copy");
    return 0;
}

static void wait_all(gp_stage *st)
{
    for (unsigned k = 0; k < st->ring_depth; k++) eng_wait(st, k);
}

/* ---- the pipelines ----------------------------------------------------- */

static size_t eff_chunk(const gp_stage *st, size_t n)
{
    size_t c = st->ring_chunk;
    if (n >= c * st->ring_depth) return c;
    size_t e = gp_round_up((n + st->ring_depth - 1) / st->ring_depth, 64u << 10);
    if (e < ST_SMALL_CHUNK) e = ST_SMALL_CHUNK;
    return e < c ? e : c;
}

static int pipe_write(gp_stage *st, uint64_t dptr, const char *src, size_t n, CUstream s,
                      int async)
{
    size_t eff = eff_chunk(st, n);
    size_t nch = (n + eff - 1) / eff;
    unsigned depth = st->ring_depth;
    int rc = 0;
    for (size_t i = 0; i < nch && !rc; i++) {
        unsigned k = (unsigned)((st->next + i) % depth);
        rc = eng_wait_checked(st, k);
        if (rc) break;
        size_t off = i * eff;
        size_t len = n - off < eff ? n - off : eff;
        char *slot = st->ring + (size_t)k * st->ring_chunk;
        par_memcpy(&st->pool, st->threads, slot, src + off, len);
        rc = eng_copy(st, 0, dptr + off, slot, len, s);
        if (!rc) rc = eng_record(st, k, s);
    }
    st->next = (unsigned)((st->next + nch) % depth);
    if (rc || !async || st->sim) wait_all(st);
    return rc;
}

static int pipe_read(gp_stage *st, uint64_t dptr, char *dst, size_t n, CUstream s)
{
    size_t eff = eff_chunk(st, n);
    size_t nch = (n + eff - 1) / eff;
    unsigned depth = st->ring_depth;
    int rc = 0;
    size_t issued = 0;
    /* prime: the first `depth` chunks */
    for (; issued < nch && issued < depth && !rc; issued++) {
        unsigned k = (unsigned)((st->next + issued) % depth);
        rc = eng_wait_checked(st, k);
        if (rc) break;
        size_t off = issued * eff;
        size_t len = n - off < eff ? n - off : eff;
        rc = eng_copy(st, 1, dptr + off, st->ring + (size_t)k * st->ring_chunk, len, s);
        if (!rc) rc = eng_record(st, k, s);
    }
    for (size_t i = 0; i < nch && !rc; i++) {
        unsigned k = (unsigned)((st->next + i) % depth);
        rc = eng_wait_checked(st, k);
        if (rc) break;
        size_t off = i * eff;
        size_t len = n - off < eff ? n - off : eff;
        char *slot = st->ring + (size_t)k * st->ring_chunk;
        par_memcpy(&st->pool, st->threads, dst + off, slot, len);
        if (issued < nch) {
            size_t off2 = issued * eff;
            size_t len2 = n - off2 < eff ? n - off2 : eff;
            rc = eng_copy(st, 1, dptr + off2, slot, len2, s);
            if (!rc) rc = eng_record(st, k, s);
            issued++;
        }
    }
    st->next = (unsigned)((st->next + nch) % depth);
    wait_all(st);
    return rc;
}

/* A stream usable with the ring's events: none, the special handles, or a
 * stream of the primary context. */
static int stream_ok(gp_stage *st, CUstream s)
{
    if (st->sim || !s || s == GP_CU_STREAM_LEGACY || s == GP_CU_STREAM_PER_THREAD) return 1;
    if (!gp_cu.StreamGetCtx) return 0;
    CUcontext sc = NULL;
    if (gp_cu.StreamGetCtx(s, &sc) != CUDA_SUCCESS) return 0;
    return sc == st->pctx;
}

static int staged(gdrpy_ctx_t h, gdrpy_pin_t ph, size_t offset, void *host, size_t n,
                  void *stream, int dir)
{
    const char *what = dir == 0 ? "ce_write_staged" : "ce_read_staged";
    gp_ctx *c;
    gp_pin *p;
    int rc = gp_copy_begin(h, ph, offset, n, host, what, &c, &p);
    if (rc) return rc;
    if (!n) {
        gp_copy_end(c, p);
        return 0;
    }
    uint64_t dptr = p->addr + offset;
    gp_stage *st = stage_of(c);
    int direct = st == NULL;
    if (st) {
        pthread_mutex_lock(&st->op_lock);
        rc = ring_build(st, c);
        if (rc) {
            /* no ring (no events in this driver, no page-locked memory left):
             * the direct copy is correct, only slower */
            if (!st->warned) {
                gp_log(3, "staging ring unavailable, copying directly: %s", gdrpy_last_error());
                st->warned = 1;
            }
            direct = 1;
            rc = 0;
        }
        if (!rc && !direct && !stream_ok(st, (CUstream)stream)) direct = 1;
        if (!rc && !direct) {
            int pushed = 0;
            if (!st->sim) {
                rc = st_push(st);
                pushed = !rc;
            }
            if (!rc) {
                CUstream s = (CUstream)stream;
                rc = dir == 0 ? pipe_write(st, dptr, host, n, s, stream != NULL)
                              : pipe_read(st, dptr, host, n, s);
            }
            if (pushed) st_pop();
        }
        pthread_mutex_unlock(&st->op_lock);
    }
    if (!rc && direct) rc = c->be->dev_memcpy(c, dir, dptr, host, n, stream);
    gp_copy_end(c, p);
    if (rc) return gp_err_prefix(rc, "%s of %zu bytes at offset %zu", what, n, offset);
    return 0;
}

int gdrpy_ce_write_staged(gdrpy_ctx_t h, gdrpy_pin_t ph, size_t offset, const void *src,
                          size_t n, void *stream)
{
    return staged(h, ph, offset, (void *)src, n, stream, 0);
}

int gdrpy_ce_read_staged(gdrpy_ctx_t h, gdrpy_pin_t ph, size_t offset, void *dst, size_t n,
                         void *stream)
{
    return staged(h, ph, offset, dst, n, stream, 1);
}

static int locked(gdrpy_ctx_t h, gdrpy_pin_t ph, size_t offset, void *host, size_t n,
                  void *stream, int dir)
{
    const char *what = dir == 0 ? "ce_write_locked" : "ce_read_locked";
    gp_ctx *c;
    gp_pin *p;
    int rc = gp_copy_begin(h, ph, offset, n, host, what, &c, &p);
    if (rc) return rc;
    if (n) {
        uint64_t dptr = p->addr + offset;
        if (c->be->is_real) rc = gp_cuda_memcpy_locked(c->device, dir, dptr, host, n, stream);
        else rc = c->be->dev_memcpy(c, dir, dptr, host, n, stream);
    }
    gp_copy_end(c, p);
    return rc;
}

int gdrpy_ce_write_locked(gdrpy_ctx_t h, gdrpy_pin_t ph, size_t offset, const void *src,
                          size_t n, void *stream)
{
    return locked(h, ph, offset, (void *)src, n, stream, 0);
}

int gdrpy_ce_read_locked(gdrpy_ctx_t h, gdrpy_pin_t ph, size_t offset, void *dst, size_t n,
                         void *stream)
{
    return locked(h, ph, offset, dst, n, stream, 1);
}

/* ---- configuration ----------------------------------------------------- */

int gdrpy_staging_set(gdrpy_ctx_t h, size_t chunk, unsigned depth, unsigned threads)
{
    if (chunk && (chunk < ST_MIN_CHUNK || chunk > ST_MAX_CHUNK || chunk % 4096))
        return gp_err(GDRPY_EINVAL, "staging_set: chunk %zu must be a multiple of 4096 in "
                                    "[%u, %u]",
                      chunk, ST_MIN_CHUNK, ST_MAX_CHUNK);
    if (depth && (depth < 2 || depth > ST_MAX_DEPTH))
        return gp_err(GDRPY_EINVAL, "staging_set: depth %u must be in [2, %d]", depth,
                      ST_MAX_DEPTH);
    if (threads > ST_MAX_THREADS)
        return gp_err(GDRPY_EINVAL, "staging_set: threads %u must be in [1, %d]", threads,
                      ST_MAX_THREADS);
    gp_ctx *c;
    int rc = gp_ctx_enter(h, &c, "staging_set");
    if (rc) return rc;
    gp_stage *st = stage_of(c);
    if (!st) {
        gp_ctx_leave(c);
        return gp_err(GDRPY_ENOMEM, "staging_set: out of memory");
    }
    pthread_mutex_lock(&st->op_lock);
    if (chunk) st->chunk = chunk;
    if (depth) st->depth = depth;
    if (threads) st->threads = threads;
    pthread_mutex_unlock(&st->op_lock);
    gp_ctx_leave(c);
    return 0;
}

int gdrpy_staging_get(gdrpy_ctx_t h, size_t *chunk, unsigned *depth, unsigned *threads)
{
    gp_ctx *c;
    int rc = gp_ctx_enter(h, &c, "staging_get");
    if (rc) return rc;
    gp_stage *st = stage_of(c);
    if (!st) {
        gp_ctx_leave(c);
        return gp_err(GDRPY_ENOMEM, "staging_get: out of memory");
    }
    pthread_mutex_lock(&st->op_lock);
    if (chunk) *chunk = st->chunk;
    if (depth) *depth = st->depth;
    if (threads) *threads = st->threads;
    pthread_mutex_unlock(&st->op_lock);
    gp_ctx_leave(c);
    return 0;
}
