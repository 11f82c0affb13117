/*
 * staging.c - copy-engine copies from/to pageable host memory through a
 * per-context ring of page-locked chunks (gdrpy_host.h).
 *
 * Pipeline.  A copy of n bytes is cut into chunks by gp_sched_make (a write
 * ramps up from a small first chunk to equal chunks of at most the slot
 * size and part of the way down; a read is the mirror image, ending with a
 * small chunk); chunk i lives
 * in slot (start + i) % depth.  Each chunk is split into pieces that the
 * pool's workers (and the caller, with fewer than 3 workers) claim in order
 * (see st_job), so the CPU copies of chunk i+1 run while chunk i is moved.
 *   write (h2d): a chunk's pieces may be copied in once its slot's previous
 *     DMA is done (event); when all are, the caller enqueues the DMA slot ->
 *     device and records the slot's event.
 *   read (d2h): the caller enqueues DMAs into free slots; a chunk's pieces
 *     may be copied out once its event has fired; when all are, the slot is
 *     free for the DMA of a later chunk.
 * Only the caller talks to the engine (events are polled, never waited on
 * while there is CPU work).  Diagnostics:
 * GDRPY_STAGING_DRY=nodma|nocopy runs one side of the pipeline alone,
 * GDRPY_STAGING_NT=in|out|both copies with streaming stores,
 * GDRPY_STAGING_PPT=N sets the pieces per thread and chunk (default 2).
 * Without a stream a write's DMAs run on the legacy default stream of the
 * device's primary context, a read's on gdrpy's own non-blocking stream
 * (cudadrv.h: it waits for none of the caller's kernels, as a read through
 * the mapping never does), and the call returns when everything has landed.  With a
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
#include <unistd.h>

#include "internal.h"
#include "copy.h"
#include "cudadrv.h"
#include "gdrpy_host.h"
#include "staging.h"

#define ST_MAX_RING (256u << 20) /* chunk x depth: the page-locked memory of one ring */
#define ST_MIN_CHUNK (64u << 10)
#define ST_MAX_CHUNK (64u << 20)
#define ST_POOL_MIN (256u << 10) /* smaller messages are copied by the caller alone */

/* ---- how the CPU side touches the ring (kinds) ------------------------- */

static void cp_plain(void *d, const void *s, size_t n)
{
    memcpy(d, s, n);
}

/* GDRPY_STAGING_NT: "in" (put: into the ring), "out" (get: into the caller's
 * memory), "both": those copies use the CPU's streaming (non-temporal) store
 * kernel, which bypasses the caches and ends with a store fence; default:
 * memcpy for both.  Bit 0: in, bit 1: out. */
static unsigned nt_mask(void)
{
    const char *e = getenv("GDRPY_STAGING_NT");
    if (!e || !*e) return 0;
    if (!strcmp(e, "in")) return 1;
    if (!strcmp(e, "out")) return 2;
    if (!strcmp(e, "both") || !strcmp(e, "1")) return 3;
    return 0;
}

static void cp_none(void *d, const void *s, size_t n)
{
    (void)d;
    (void)s;
    (void)n;
}

/* GDRPY_STAGING_DRY (diagnostics, never for real data): "nodma" runs the
 * pipeline without enqueueing any DMA (the CPU side alone), "nocopy" without
 * the CPU copies (the engine side alone, moving stale ring contents). */
static int dry_mode(void)
{
    const char *e = getenv("GDRPY_STAGING_DRY");
    if (!e || !*e) return 0;
    if (!strcmp(e, "nodma")) return 1;
    if (!strcmp(e, "nocopy")) return 2;
    return 0;
}

/* The streaming-store kernel (to_mapping), or NULL where there is none. */
static gp_copy_fn nt_copy(void)
{
    const gp_copy_kernel *k = gp_copy_auto_kernel();
    if (!k || k->device_memory_only || !strcmp(k->name, "generic")) return NULL;
    return k->to_mapping;
}

/* The streaming-load kernel (from_mapping: whole lines, MOVNTDQA), or NULL. */
static gp_copy_fn nt_load(void)
{
    const gp_copy_kernel *k = gp_copy_auto_kernel();
    if (!k || k->device_memory_only || !strcmp(k->name, "generic")) return NULL;
    return k->from_mapping;
}

static gp_copy_fn wc_load_kernel; /* nt_load(), set before a WC read ring is used */

/* A read's copy out of the write-combined ring.  x86 streaming loads from
 * WC memory are weakly ordered and may be served from a streaming-load
 * buffer filled earlier: MFENCE first, so that every line is read after the
 * piece became available (the acquire of `avail`), i.e. after its DMA. */
static void cp_wc_load(void *d, const void *s, size_t n)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__ __volatile__("mfence" ::: "memory");
#endif
    wc_load_kernel(d, s, n);
}

/* Ring kinds (gdrpy_host.h, GDRPY_STAGING_*): how the CPU side of each
 * direction touches the ring.  Measured on an H100 host (scripts/
 * staging_trace.py): with plain memcpy the engine moves a 1 MiB chunk at
 * ~27 GB/s while the workers copy other slots, against ~45 GB/s alone - its
 * reads (put) snoop lines that are dirty in the workers' caches and its
 * writes (get) must invalidate lines the workers have read.  A
 * write-combined ring filled with streaming stores lifted the engine to
 * ~36 GB/s for put. */
static const char *const kind_names[] = {"plain", "nt", "wc", "evict", "ntevict"};

static int kind_parse(const char *e)
{
    if (!e || !*e) return -1;
    for (int i = 0; i < 5; i++)
        if (!strcmp(e, kind_names[i])) return i;
    return -1;
}

/* GDRPY_STAGING_WKIND / RKIND name a kind for the writes / reads
 * (diagnostics; they override gdrpy_staging_set_kinds); the older
 * GDRPY_STAGING_NT (in/out/both) and GDRPY_STAGING_WC=1|0 (writes) too. */
static void kinds_env(int *wk, int *rk)
{
    unsigned nt = nt_mask();
    if (nt & 1) *wk = GDRPY_STAGING_NT;
    if (nt & 2) *rk = GDRPY_STAGING_NT;
    const char *e = getenv("GDRPY_STAGING_WC");
    if (e && !strcmp(e, "1")) *wk = GDRPY_STAGING_WC;
    if (e && !strcmp(e, "0") && *wk == GDRPY_STAGING_WC) *wk = GDRPY_STAGING_PLAIN;
    int k = kind_parse(getenv("GDRPY_STAGING_WKIND"));
    if (k >= 0) *wk = k;
    k = kind_parse(getenv("GDRPY_STAGING_RKIND"));
    if (k >= 0) *rk = k;
}
/* ---- evicting ring lines from the CPU's caches ------------------------ */

#if defined(__x86_64__)
#include <cpuid.h>
static int cpu_clflushopt = -1, cpu_cldemote = -1;

static void evict_probe(void)
{
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        cpu_clflushopt = (b >> 23) & 1;
        cpu_cldemote = (c >> 25) & 1;
    } else {
        cpu_clflushopt = cpu_cldemote = 0;
    }
}

/* read: the lines the CPU has read leave its caches (the engine's next
 * write into the slot then invalidates nothing) */
static void evict_flush(void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)63, e = (uintptr_t)p + n;
    if (cpu_clflushopt > 0) {
        for (; a < e; a += 64) __asm__ __volatile__("clflushopt %0" ::"m"(*(volatile char *)a));
    } else {
        for (; a < e; a += 64) __builtin_ia32_clflush((const void *)a);
    }
    __asm__ __volatile__("sfence" ::: "memory");
}

/* write: the lines the CPU has written move to the shared cache (CLDEMOTE),
 * else are written back and dropped (CLFLUSHOPT): the engine's reads then
 * snoop no core */
static void evict_demote(void *p, size_t n)
{
    if (cpu_cldemote <= 0) {
        evict_flush(p, n);
        return;
    }
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)63, e = (uintptr_t)p + n;
    for (; a < e; a += 64) __asm__ __volatile__(".byte 0x0f, 0x1c, 0x00" ::"a"(a) : "memory");
}
#define HAVE_EVICT 1
#else
#define HAVE_EVICT 0
#endif
/* ---- the ring ---------------------------------------------------------- */

typedef struct gp_stage {
    pthread_mutex_t op_lock;
    /* configuration (under op_lock) */
    size_t chunk;
    unsigned depth, threads;
    int kind[2]; /* GDRPY_STAGING_*: writes, reads */
    /* the ring as built (ready = 1) */
    int ready;
    int sim;
    int device;
    char *ring;
    char *ring_wc; /* write-combined ring (a direction of kind WC), else NULL */
    size_t ring_bytes;
    size_t ring_chunk;
    unsigned ring_depth;
    unsigned ring_threads;
    int ring_kind[2];          /* as configured when built */
    int eff_kind[2];           /* in use (environment overrides, fallbacks) */
    unsigned next;             /* slot the next copy starts at */
    int pending[ST_MAX_DEPTH]; /* a DMA of the slot may be in flight */
    CUcontext pctx;            /* real: retained primary context */
    CUevent ev[ST_MAX_DEPTH];
    sim_ce *sce; /* sim */
    uint64_t sim_ev[ST_MAX_DEPTH];
    st_pool pool;
    int pool_on;
    st_job job; /* the copy in progress (under op_lock) */
    gp_copy_fn cp_in, cp_out;
    void (*ev_in)(void *, size_t), (*ev_out)(void *, size_t);
    int dry_dma;   /* GDRPY_STAGING_DRY=nodma: no DMA at all (diagnostics only) */
    unsigned ppt;  /* pieces per thread and chunk (GDRPY_STAGING_PPT, default 2) */
    gp_strace *tr; /* GDRPY_STAGING_TRACE (diagnostics) */
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

static void stage_destroy(void *arg);

/* The context's ring state, created on first use and attached to the
 * context (gdrpy_close tears it down through stage_destroy). */
static gp_stage *stage_of(gp_ctx *c)
{
    pthread_mutex_lock(&st_create_lock);
    gp_stage *st = gp_ctx_attached(c, stage_destroy);
    if (!st) {
        st = calloc(1, sizeof *st);
        if (st) {
            pthread_mutex_init(&st->op_lock, NULL);
            st->chunk = 4u << 20;
            st->depth = 4;
            st->kind[0] = GDRPY_STAGING_WC;
            st->kind[1] = GDRPY_STAGING_NT_EVICT;
            st->threads = default_threads();
            if (gp_ctx_attach(c, stage_destroy, st)) {
                pthread_mutex_destroy(&st->op_lock);
                free(st);
                st = NULL;
            }
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
static int eng_query(gp_stage *st, unsigned k);
static int wait_all_spin(gp_stage *st, int rc);

/* With op_lock held: tears the ring down (waits for its DMAs first). */
static void ring_free(gp_stage *st)
{
    if (!st->ready) return;
    if (st->sim) {
        if (st->sce) gp_sim_ce_stop(st->sce); /* drains the queue first */
        st->sce = NULL;
        if (st->ring) munmap(st->ring, st->ring_bytes);
        if (st->ring_wc) munmap(st->ring_wc, st->ring_bytes);
        gp_strace_free(st->tr);
        st->tr = NULL;
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
            if (st->ring_wc) gp_cu.MemFreeHost(st->ring_wc);
            gp_strace_free(st->tr);
            st->tr = NULL;
            st_pop();
        }
        CUdevice d;
        if (gp_cu.DeviceGet(&d, st->device) == CUDA_SUCCESS) gp_cu.DevicePrimaryCtxRelease(d);
        st->pctx = NULL;
    }
    if (st->pool_on) gp_pool_stop(&st->pool);
    st->pool_on = 0;
    st->ring = NULL;
    st->ring_wc = NULL;
    st->ring_bytes = 0;
    memset(st->pending, 0, sizeof st->pending);
    st->ready = 0;
}

/* With op_lock held: builds the ring for the current configuration.
 * ENOTSUP means "use the direct path" (no events in this driver). */
static int ring_build(gp_stage *st, gp_ctx *c)
{
    if (st->ready && st->ring_chunk == st->chunk && st->ring_depth == st->depth &&
        st->ring_threads == st->threads && st->ring_kind[0] == st->kind[0] &&
        st->ring_kind[1] == st->kind[1])
        return 0;
    ring_free(st);
    st->sim = !c->be->is_real;
    st->device = c->device;
    st->ring_chunk = st->chunk;
    st->ring_depth = st->depth;
    st->ring_threads = st->threads;
    st->ring_kind[0] = st->kind[0];
    st->ring_kind[1] = st->kind[1];
    int wk = st->kind[0], rk = st->kind[1];
    kinds_env(&wk, &rk);
    /* writes: streaming stores already leave no ring line in the CPU's caches */
    if (wk == GDRPY_STAGING_NT_EVICT) wk = GDRPY_STAGING_NT;
    if (!HAVE_EVICT) {
        if (wk == GDRPY_STAGING_EVICT) wk = GDRPY_STAGING_PLAIN;
        if (rk == GDRPY_STAGING_EVICT) rk = GDRPY_STAGING_PLAIN;
        if (rk == GDRPY_STAGING_NT_EVICT) rk = GDRPY_STAGING_NT;
    }
    if (!nt_copy()) { /* no streaming stores/loads on this CPU */
        if (wk == GDRPY_STAGING_NT || wk == GDRPY_STAGING_WC) wk = GDRPY_STAGING_PLAIN;
        if (rk == GDRPY_STAGING_NT || rk == GDRPY_STAGING_WC) rk = GDRPY_STAGING_PLAIN;
        if (rk == GDRPY_STAGING_NT_EVICT) rk = GDRPY_STAGING_EVICT;
    }
    if (!nt_load() && rk == GDRPY_STAGING_WC) rk = GDRPY_STAGING_PLAIN;
    st->eff_kind[0] = wk;
    st->eff_kind[1] = rk;
    st->ring_bytes = st->chunk * st->depth;
    st->next = 0;
    if (st->sim) {
        void *p = mmap(NULL, st->ring_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (p == MAP_FAILED)
            return gp_err(GDRPY_ENOMEM, "staging: mmap of a %zu-byte ring failed: %s",
                          st->ring_bytes, strerror(errno));
        st->ring = p;
        st->sce = gp_sim_ce_start();
        if (!st->sce) {
            munmap(p, st->ring_bytes);
            st->ring = NULL;
            return gp_err(GDRPY_ENOMEM, "staging: cannot start the sim copy engine");
        }
    } else {
        int rc = gp_cuda_load(NULL, 0);
        if (rc) return rc;
        if (!gp_cu.MemHostAlloc || !gp_cu.MemFreeHost || !gp_cu.EventCreate ||
            !gp_cu.EventDestroy || !gp_cu.EventRecord || !gp_cu.EventSynchronize ||
            !gp_cu.EventQuery)
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
        if (wk == GDRPY_STAGING_WC || rk == GDRPY_STAGING_WC) {
            /* write-combined: the CPU's streaming stores go to memory
             * without filling the caches, streaming loads read it without
             * caching it, and the engine's accesses snoop nothing */
            p = NULL;
            r = gp_cu.MemHostAlloc(&p, st->ring_bytes,
                                   CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_WRITECOMBINED);
            if (r) {
                st_pop();
                ring_free(st);
                return gp_cuda_err(0, r, "cuMemHostAlloc", "write-combined staging ring of "
                                                           "%zu bytes",
                                   st->ring_bytes);
            }
            st->ring_wc = p;
        }
        for (unsigned k = 0; k < st->ring_depth && !r; k++)
            r = gp_cu.EventCreate(&st->ev[k], CU_EVENT_DISABLE_TIMING);
        st_pop();
        if (r) {
            ring_free(st);
            return gp_cuda_err(0, r, "cuEventCreate", "staging ring");
        }
    }
    st->tr = gp_strace_new(!st->sim);
    if (st->sim && (wk == GDRPY_STAGING_WC || rk == GDRPY_STAGING_WC)) {
        /* sim: the "write-combined" ring is ordinary memory (same kernels) */
        void *p = mmap(NULL, st->ring_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (p == MAP_FAILED) {
            ring_free(st);
            return gp_err(GDRPY_ENOMEM, "staging: mmap of a %zu-byte ring failed: %s",
                          st->ring_bytes, strerror(errno));
        }
        st->ring_wc = p;
    }
    st->cp_in = wk == GDRPY_STAGING_NT || wk == GDRPY_STAGING_WC ? nt_copy() : cp_plain;
    if (rk == GDRPY_STAGING_WC) wc_load_kernel = nt_load();
    st->cp_out = rk == GDRPY_STAGING_NT || rk == GDRPY_STAGING_NT_EVICT ? nt_copy()
                 : rk == GDRPY_STAGING_WC                               ? cp_wc_load
                                                                        : cp_plain;
    st->ev_in = st->ev_out = NULL;
#if HAVE_EVICT
    if (wk == GDRPY_STAGING_EVICT || rk == GDRPY_STAGING_EVICT ||
        rk == GDRPY_STAGING_NT_EVICT) {
        if (cpu_clflushopt < 0) evict_probe();
        if (wk == GDRPY_STAGING_EVICT) st->ev_in = evict_demote;
        if (rk == GDRPY_STAGING_EVICT || rk == GDRPY_STAGING_NT_EVICT) st->ev_out = evict_flush;
    }
#endif
    const char *e = getenv("GDRPY_STAGING_PPT");
    st->ppt = e && *e ? (unsigned)strtoul(e, NULL, 10) : 2;
    if (st->ppt < 1 || st->ppt > 16) st->ppt = 2;
    int dry = dry_mode();
    st->dry_dma = dry == 1;
    if (dry == 2) {
        st->cp_in = st->cp_out = cp_none;
        st->ev_in = st->ev_out = NULL;
    }
    if (st->threads > 1) {
        gp_pool_start(&st->pool, st->threads - 1, &st->job);
        st->pool_on = 1;
    }
    st->ready = 1;
    return 0;
}

/* gdrpy_close's teardown hook: frees the ring (nothing in flight). */
static void stage_destroy(void *arg)
{
    gp_stage *st = arg;
    pthread_mutex_lock(&st->op_lock);
    ring_free(st);
    pthread_mutex_unlock(&st->op_lock);
    pthread_mutex_destroy(&st->op_lock);
    free(st);
}

/* ---- engine operations (inside st_push on real backends) -------------- */

static int eng_copy(gp_stage *st, int dir, uint64_t dptr, void *host, size_t n, CUstream s)
{
    if (st->dry_dma) return 0;
    if (st->sim) {
        gp_sim_ce_submit(st->sce, dir, dptr, host, n);
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
    if (st->dry_dma) return 0;
    st->pending[k] = 1;
    if (st->sim) {
        st->sim_ev[k] = gp_sim_ce_mark(st->sce);
        return 0;
    }
    CUresult r = gp_cu.EventRecord(st->ev[k], s);
    if (r) return gp_cuda_err(0, r, "cuEventRecord", "staged copy");
    return 0;
}

static void eng_wait(gp_stage *st, unsigned k)
{
    if (!st->pending[k]) return;
    if (st->sim) gp_sim_ce_wait(st->sce, st->sim_ev[k]);
    else gp_cu.EventSynchronize(st->ev[k]);
    st->pending[k] = 0;
}

static void wait_all(gp_stage *st)
{
    for (unsigned k = 0; k < st->ring_depth; k++) eng_wait(st, k);
}

/* 1: slot k has no DMA in flight; 0: it has; -code on an error (the slot is
 * then treated as idle). */
static int eng_query(gp_stage *st, unsigned k)
{
    if (!st->pending[k]) return 1;
    if (st->sim) {
        if (!gp_sim_ce_done(st->sce, st->sim_ev[k])) return 0;
    } else {
        CUresult r = gp_cu.EventQuery(st->ev[k]);
        if (r == CUDA_ERROR_NOT_READY) return 0;
        if (r) {
            st->pending[k] = 0;
            return -gp_cuda_err(0, r, "cuEventQuery", "staged copy");
        }
    }
    st->pending[k] = 0;
    return 1;
}

/* Waits for every slot by polling (the end of a pipelined copy is a few
 * microseconds away; a blocking wait could sleep past it).  Returns rc, or
 * the first error seen when rc is 0; on an error it still waits for all. */
static int wait_all_spin(gp_stage *st, int rc)
{
    for (unsigned k = 0; k < st->ring_depth; k++) {
        int q;
        unsigned spins = 0;
        while ((q = eng_query(st, k)) == 0) relax_step(&spins);
        if (q < 0) {
            if (!rc) rc = -q;
            wait_all(st);
        }
    }
    return rc;
}

/* ---- the pipelines ----------------------------------------------------- */

static void job_setup(gp_stage *st, int dir, char *host, size_t n, CUstream s)
{
    st_job *j = &st->job;
    j->dir = dir;
    j->cp = dir == 0 ? st->cp_in : st->cp_out;
    j->host = host;
    j->ring = st->eff_kind[dir] == GDRPY_STAGING_WC ? st->ring_wc : st->ring;
    j->evict = dir == 0 ? st->ev_in : st->ev_out;
    j->tr = st->tr;
    j->slot_bytes = st->ring_chunk;
    j->depth = st->ring_depth;
    j->start = st->next;
    /* a short message is copied by the caller alone: waking workers would
     * cost more than they save */
    j->pooled = st->pool_on && n >= ST_POOL_MIN;
    unsigned workers = j->pooled ? st->pool.n : 0;
    /* with 3 workers or more the caller only drives the engine (a DMA
     * enqueued late costs more than the caller's share of the copying), and
     * copies only until the first worker has joined */
    j->caller_copies = workers < 3;
    unsigned t = workers + (j->caller_copies ? 1 : 0);
    j->ppc = t > 1 ? st->ppt * t : 1;
    gp_sched_make(&j->sc, n, st->ring_chunk, dir);
    j->total = j->sc.nch * j->ppc;
    __atomic_store_n(&j->next, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&j->avail, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&j->abort, 0, __ATOMIC_RELAXED);
    for (unsigned k = 0; k < ST_MAX_DEPTH; k++)
        __atomic_store_n(&j->slotdone[k], 0, __ATOMIC_RELAXED);
    j->active = &st->pool.active;
    gp_strace_begin(j->tr, dir, n, j->sc.nch, j->ppc, workers, s);
    if (j->pooled) gp_pool_open(&st->pool);
}

static void job_end(gp_stage *st, int rc)
{
    st_job *j = &st->job;
    if (rc) __atomic_store_n(&j->abort, 1, __ATOMIC_SEQ_CST);
    if (j->pooled) gp_pool_close(&st->pool);
    st->next = (unsigned)((st->next + j->sc.nch) % st->ring_depth);
}

/* Opens chunk `ci` to the copying threads (its slot is free / filled). */
static void job_avail(st_job *j, uint64_t ci)
{
    __atomic_store_n(&j->slotdone[job_slot(j, ci)], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&j->avail, (ci + 1) * j->ppc, __ATOMIC_RELEASE);
}

static int job_chunk_done(const st_job *j, uint64_t ci)
{
    return __atomic_load_n(&j->slotdone[job_slot(j, ci)], __ATOMIC_ACQUIRE) == j->ppc;
}

static int pipe_write(gp_stage *st, uint64_t dptr, const char *src, size_t n, CUstream s,
                      int async)
{
    job_setup(st, 0, (char *)src, n, s);
    st_job *j = &st->job;
    uint64_t nch = j->sc.nch, opened = 0, submitted = 0;
    unsigned spins = 0;
    int rc = 0;
    while (submitted < nch && !rc) {
        int progress = 0;
        /* open chunks whose slot's previous DMA has finished */
        while (opened < nch && opened - submitted < j->depth) {
            int q = eng_query(st, job_slot(j, opened));
            if (q < 0) rc = -q;
            if (q <= 0) break;
            if (j->tr) {
                size_t o_, l_;
                gp_sched_chunk(&j->sc, opened, &o_, &l_);
                gp_strace_mark(j->tr, opened, TR_OPEN, l_);
            }
            job_avail(j, opened++);
            progress = 1;
        }
        /* enqueue the DMA of every chunk copied in, in order */
        while (!rc && submitted < opened && job_chunk_done(j, submitted)) {
            unsigned k = job_slot(j, submitted);
            size_t off, len;
            gp_sched_chunk(&j->sc, submitted, &off, &len);
            if (j->tr) {
                gp_strace_mark(j->tr, submitted, TR_COPIED, 0);
                gp_strace_gpu(j->tr, submitted, 0, s);
                gp_strace_mark(j->tr, submitted, TR_ENQ0, 0);
            }
            rc = eng_copy(st, 0, dptr + off, j->ring + (size_t)k * st->ring_chunk, len, s);
            if (j->tr) {
                gp_strace_mark(j->tr, submitted, TR_ENQ1, 0);
                gp_strace_gpu(j->tr, submitted, 1, s);
            }
            if (!rc) rc = eng_record(st, k, s);
            submitted++;
            progress = 1;
        }
        if (progress) spins = 0;
        else if (!rc && !gp_job_try_piece(j)) relax_step(&spins);
    }
    job_end(st, rc);
    if (rc || !async || st->sim) rc = wait_all_spin(st, rc);
    gp_strace_end(j->tr, rc);
    return rc;
}

static int pipe_read(gp_stage *st, uint64_t dptr, char *dst, size_t n, CUstream s)
{
    job_setup(st, 1, dst, n, s);
    st_job *j = &st->job;
    uint64_t nch = j->sc.nch, issued = 0, ready = 0, freed = 0;
    unsigned spins = 0;
    int rc = 0;
    while (freed < nch && !rc) {
        int progress = 0;
        /* enqueue DMAs into free slots (a slot may still be busy with an
         * earlier asynchronous write) */
        while (issued < nch && issued - freed < j->depth) {
            unsigned k = job_slot(j, issued);
            int q = eng_query(st, k);
            if (q < 0) rc = -q;
            if (q <= 0) break;
            size_t off, len;
            gp_sched_chunk(&j->sc, issued, &off, &len);
            if (j->tr) {
                gp_strace_gpu(j->tr, issued, 0, s);
                gp_strace_mark(j->tr, issued, TR_ENQ0, len);
            }
            rc = eng_copy(st, 1, dptr + off, j->ring + (size_t)k * st->ring_chunk, len, s);
            if (j->tr) {
                gp_strace_mark(j->tr, issued, TR_ENQ1, 0);
                gp_strace_gpu(j->tr, issued, 1, s);
            }
            if (!rc) rc = eng_record(st, k, s);
            issued++;
            progress = 1;
            if (rc) break;
        }
        /* chunks whose DMA has landed may be copied out */
        while (!rc && ready < issued) {
            int q = eng_query(st, job_slot(j, ready));
            if (q < 0) rc = -q;
            if (q <= 0) break;
            if (j->tr) gp_strace_mark(j->tr, ready, TR_OPEN, 0);
            job_avail(j, ready++);
            progress = 1;
        }
        /* chunks copied out free their slot */
        while (!rc && freed < ready && job_chunk_done(j, freed)) {
            if (j->tr) gp_strace_mark(j->tr, freed, TR_COPIED, 0);
            freed++;
            progress = 1;
        }
        if (progress) spins = 0;
        else if (!rc && !gp_job_try_piece(j)) relax_step(&spins);
    }
    job_end(st, rc);
    rc = wait_all_spin(st, rc);
    gp_strace_end(j->tr, rc);
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
    int rc = gp_copy_begin(h, ph, offset, n, host, 0, what, &c, &p);
    if (rc) return rc;
    if (!n) {
        gp_copy_end(c, p);
        return 0;
    }
    uint64_t dptr = p->addr + offset;
    if (dir == 1) gp_pin_flush(p);
    gp_stage *st = stage_of(c);
    int direct = st == NULL;
    /* A read without a stream runs on gdrpy's own non-blocking stream: it
     * waits for nothing of the caller's (gp_ce_read_dev). */
    CUstream priv = NULL;
    if (st && dir == 1 && !stream && c->be->is_real) {
        rc = gp_cuda_private_begin(c->device, &priv);
        if (rc) {
            gp_copy_end(c, p);
            return gp_err_prefix(rc, "%s of %zu bytes at offset %zu", what, n, offset);
        }
    }
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
                CUstream s = priv ? priv : (CUstream)stream;
                rc = dir == 0 ? pipe_write(st, dptr, host, n, s, stream != NULL)
                              : pipe_read(st, dptr, host, n, s);
            }
            if (pushed) st_pop();
        }
        pthread_mutex_unlock(&st->op_lock);
    }
    if (priv) gp_cuda_private_end(c->device);
    if (!rc && direct)
        rc = dir == 0 ? c->be->dev_memcpy(c, 0, dptr, host, n, stream)
                      : gp_ce_read_dev(c, dptr, host, n, stream);
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
    int rc = gp_copy_begin(h, ph, offset, n, host, 0, what, &c, &p);
    if (rc) return rc;
    if (n) {
        uint64_t dptr = p->addr + offset;
        if (dir == 1) gp_pin_flush(p);
        if (dir == 1 && !stream) rc = gp_ce_read_dev(c, dptr, host, n, NULL);
        else if (c->be->is_real) rc = gp_cuda_memcpy_locked(c->device, dir, dptr, host, n, stream);
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

/* The configuration calls' prologue: the context entered, its ring state
 * (created on first use) and the ring's op_lock held; undone by
 * stage_config_unlock. */
static int stage_config_lock(gdrpy_ctx_t h, const char *what, gp_ctx **cp, gp_stage **stp)
{
    int rc = gp_ctx_enter(h, cp, what);
    if (rc) return rc;
    *stp = stage_of(*cp);
    if (!*stp) {
        gp_ctx_leave(*cp);
        return gp_err(GDRPY_ENOMEM, "%s: out of memory", what);
    }
    pthread_mutex_lock(&(*stp)->op_lock);
    return 0;
}

static void stage_config_unlock(gp_ctx *c, gp_stage *st)
{
    pthread_mutex_unlock(&st->op_lock);
    gp_ctx_leave(c);
}

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
    gp_stage *st;
    int rc = stage_config_lock(h, "staging_set", &c, &st);
    if (rc) return rc;
    size_t nc = chunk ? chunk : st->chunk;
    unsigned nd = depth ? depth : st->depth;
    if ((uint64_t)nc * nd > ST_MAX_RING) {
        stage_config_unlock(c, st);
        return gp_err(GDRPY_EINVAL, "staging_set: a ring of %u slots of %zu bytes exceeds %u MiB",
                      nd, nc, ST_MAX_RING >> 20);
    }
    st->chunk = nc;
    st->depth = nd;
    if (threads) st->threads = threads;
    stage_config_unlock(c, st);
    return 0;
}

int gdrpy_staging_get(gdrpy_ctx_t h, size_t *chunk, unsigned *depth, unsigned *threads)
{
    gp_ctx *c;
    gp_stage *st;
    int rc = stage_config_lock(h, "staging_get", &c, &st);
    if (rc) return rc;
    if (chunk) *chunk = st->chunk;
    if (depth) *depth = st->depth;
    if (threads) *threads = st->threads;
    stage_config_unlock(c, st);
    return 0;
}

int gdrpy_staging_set_kinds(gdrpy_ctx_t h, int write_kind, int read_kind)
{
    if (write_kind < -1 || write_kind > GDRPY_STAGING_NT_EVICT || read_kind < -1 ||
        read_kind > GDRPY_STAGING_NT_EVICT)
        return gp_err(GDRPY_EINVAL, "staging_set_kinds: kinds %d/%d must be -1 (keep) or "
                                    "GDRPY_STAGING_PLAIN..GDRPY_STAGING_NT_EVICT (0..4)",
                      write_kind, read_kind);
    gp_ctx *c;
    gp_stage *st;
    int rc = stage_config_lock(h, "staging_set_kinds", &c, &st);
    if (rc) return rc;
    if (write_kind >= 0) st->kind[0] = write_kind;
    if (read_kind >= 0) st->kind[1] = read_kind;
    stage_config_unlock(c, st);
    return 0;
}

int gdrpy_staging_get_kinds(gdrpy_ctx_t h, int *write_kind, int *read_kind, int *write_used,
                            int *read_used)
{
    gp_ctx *c;
    gp_stage *st;
    int rc = stage_config_lock(h, "staging_get_kinds", &c, &st);
    if (rc) return rc;
    if (write_kind) *write_kind = st->kind[0];
    if (read_kind) *read_kind = st->kind[1];
    int built = st->ready && st->ring_kind[0] == st->kind[0] && st->ring_kind[1] == st->kind[1];
    if (write_used) *write_used = built ? st->eff_kind[0] : -1;
    if (read_used) *read_used = built ? st->eff_kind[1] : -1;
    stage_config_unlock(c, st);
    return 0;
}
