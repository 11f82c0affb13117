/*
 * gdrapi.c - libgdrapi.so.2: GDRCopy 2.6's C API on top of libgdrpy.
 *
 * Objects
 *  - gdr_t points at a `struct gdr`.  These structs are never freed: a
 *    closed one goes on a free list and is reused by a later gdr_open, and
 *    every cold-path entry checks that the pointer is one of ours (a walk of
 *    an append-only list) before touching it.  A gdr owns one gdrpy context
 *    per CUDA device, opened lazily: a pin goes to the context of the device
 *    that owns the address (cuPointerGetAttribute, when libcuda is loaded),
 *    like GDRCopy's pins, which work with whatever device owns the pointer.
 *  - gdr_mh_t.h is the address of a slot in a global slot range plus the
 *    low bits of the slot's generation (see "handle slots"); slots are
 *    never unmapped, a handle is range-checked before it is dereferenced,
 *    and the generation tells it apart from the slot's current occupant.
 *
 * Locking
 *  - g->lock guards everything of one gdr (its handle list, its contexts and
 *    the cold fields of its slots); it is held across the gdrpy calls of
 *    pin/map/unmap/unpin/close.
 *  - mh_lock guards slot allocation only (the free list and chunk growth).
 *  - The copy path takes no lock and no atomic read-modify-write: it
 *    announces the slot it is about to copy through in a per-thread record
 *    (a hazard pointer: one plain store), then reads the slot's generation
 *    and state, the mapping bounds, and the generation again, copies, and
 *    clears the record.  Writers publish the bounds before storing state
 *    MAPPED (release).  An unmap (gdr_unmap, gdr_unpin_buffer, gdr_close)
 *    stores state PINNED, runs membarrier(PRIVATE_EXPEDITED) - which makes
 *    every running thread of the process execute a full memory barrier, so
 *    the copy side needs none - and then waits, bounded (GDRPY_BUSY_WAIT_MS,
 *    default 3 s), until no thread's record names the slot, before the
 *    munmap.  Either a copy sees PINNED and fails with EINVAL, or the unmap
 *    sees the copy's record and waits for it: the memory stays mapped until
 *    every copy through it has returned; if copies are still running at the
 *    limit, the unmap fails with EBUSY (logged, naming the handle) and the
 *    mapping is left as it was.  Where membarrier is unavailable the copy
 *    side issues a full fence itself (g_copy_fence).
 *  - Writes of 1..64 bytes (x86-64 with glibc's rseq) skip the record: they
 *    run as a restartable sequence (rseq_put.h) that re-reads generation,
 *    state and bounds and stores, and the unmap's membarrier is the RSEQ
 *    command, which restarts every such sequence in flight, so the restart
 *    sees PINNED.  On the GPU host any store to ordinary memory between two
 *    writes into BAR1 costs about 8 ns, which the record's two stores paid
 *    on every small write.
 *
 * Fork: a gdr is bound to the process that opened it.  Every call in a
 * forked child on the parent's gdr or handles returns EACCES (checked before
 * any lock is taken, so a lock held by another thread at fork time cannot
 * block the child), and the child never sees the parent's mappings (gdrpy
 * maps with MADV_DONTFORK).
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#include "gdrapi.h"
#include "internal.h"
#include "cudadrv.h"
#include "read_ce.h"
#include "rseq_put.h"

/* ---- ABI checks ------------------------------------------------------- */
_Static_assert(sizeof(gdr_mh_t) == 8, "gdr_mh_t is 8 bytes");
_Static_assert(sizeof(unsigned long) == 8, "LP64 only");
_Static_assert(sizeof(gdr_mapping_type_t) == 4, "enum is 4 bytes");
_Static_assert(sizeof(gdr_info_v2_t) == 48, "gdr_info_v2_t is 48 bytes");
_Static_assert(offsetof(gdr_info_v2_t, va) == 0, "va @0");
_Static_assert(offsetof(gdr_info_v2_t, mapped_size) == 8, "mapped_size @8");
_Static_assert(offsetof(gdr_info_v2_t, page_size) == 16, "page_size @16");
_Static_assert(offsetof(gdr_info_v2_t, tm_cycles) == 24, "tm_cycles @24");
_Static_assert(offsetof(gdr_info_v2_t, cycles_per_ms) == 32, "cycles_per_ms @32");
_Static_assert(offsetof(gdr_info_v2_t, mapping_type) == 40, "mapping_type @40");
_Static_assert(sizeof(gdr_info_v1_t) == 40, "gdr_info_v1 is 40 bytes");
_Static_assert(offsetof(gdr_info_v1_t, tm_cycles) == 24, "v1 tm_cycles @24");
_Static_assert(offsetof(gdr_info_v1_t, cycles_per_ms) == 32, "v1 cycles_per_ms @32");
_Static_assert(GPU_PAGE_SIZE == GDRPY_GPU_PAGE_SIZE, "GPU page size");
_Static_assert((int)GDR_MAPPING_TYPE_WC == (int)GDRPY_MAPPING_WC &&
                   (int)GDR_MAPPING_TYPE_CACHING == (int)GDRPY_MAPPING_CACHING &&
                   (int)GDR_MAPPING_TYPE_DEVICE == (int)GDRPY_MAPPING_DEVICE,
               "mapping types share values");
_Static_assert((unsigned)GDR_PIN_FLAG_FORCE_PCIE == GDRPY_PIN_FORCE_PCIE, "pin flag");

#define LOGE(...) gp_log(4, "gdrapi: " __VA_ARGS__)
#define LOGW(...) gp_log(3, "gdrapi: " __VA_ARGS__)
#define LOGD(...) gp_log(1, "gdrapi: " __VA_ARGS__)

#define GDR_MAGIC 0x67647270u /* "gdrp" */
#define GDR_DEAD 0x64656164u  /* "dead" */
#define GDR_MAX_DEV 64
#define HOST_PAGE 4096u

enum { MH_FREE = 0,
       MH_PINNED = 1,
       MH_MAPPED = 2 };

/* ---- handle slots ----------------------------------------------------- */
typedef struct mh_slot {
    /* hot: read by the copy path without a lock */
    _Atomic uint32_t gen;
    _Atomic int state;
    /* Relaxed atomics: published by the release store of `state`. */
    _Atomic unsigned fork_gen; /* gdrpy_fork_generation when mapped */
    /* 1: small writes through this mapping may be restartable sequences
     * (set when mapped; see rseq_may_use) */
    _Atomic unsigned rseq_ok;
    _Atomic(char *) lo;   /* gdrpy's mapping: [lo, lo + span) may be copied through */
    _Atomic size_t span;  /* the backed bytes (the pinned range may end in a no-access tail) */
    _Atomic size_t whole; /* the whole pinned range from lo (span + that tail) */
    /* cold: owner's g->lock */
    struct gdr *g;
    gdrpy_ctx_t ctx;
    gdrpy_pin_t pin;
    uint64_t addr, size;  /* as given to the pin call */
    uint64_t va;          /* the pinned range, as the backend pinned it (gdrpy's */
    uint64_t mapped_size; /* va, mapped_size: what gdr_map maps, never more) */
    uint64_t backed;      /* bytes from va backed by the allocation (<= mapped_size) */
    int dev;              /* CUDA device of the pin's context */
    void *map_ret;        /* pointer gdr_map returned (CPU address of va) */
    size_t map_size;      /* size given to gdr_map */
    int mapping_type;
    uint64_t tm_cycles;
    uint32_t prev, next; /* slot + 1 links: g's list, or the free list */
} mh_slot;

/* Slots live in one reserved address range, MH_STRIDE bytes apart; chunks
 * of it are made read-write as they are needed and never given back.  A
 * handle is the address of its slot plus the low MH_GEN_BITS of the slot's
 * generation, so that (a) programs that treat gdr_mh_t.h as a pointer to
 * GDRCopy's internal gdr_memh_t (GDRCopy's own sanity tests read ~104
 * bytes there) read valid memory, and (b) a stale or forged handle is
 * recognised without being dereferenced: it must fall inside the committed
 * range and carry the slot's current generation.  Freed slots are reused
 * first-in first-out, so a stale handle only matches again after its slot
 * has been recycled 2^MH_GEN_BITS times. */
#define MH_STRIDE 1024u
#define MH_GEN_BITS 9u
#define MH_GEN_MASK ((1u << MH_GEN_BITS) - 1)
#define MH_CHUNK 256u           /* slots made read-write at a time */
#define MH_MAX_SLOTS (1u << 18) /* 256 MiB of address space reserved */
_Static_assert(sizeof(mh_slot) + MH_GEN_MASK + 128 <= MH_STRIDE, "slot stride");

static char *mh_base;                 /* reserved range, set once */
static _Atomic uint32_t mh_committed; /* slots that are read-write */
static pthread_mutex_t mh_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t mh_free_head, mh_free_tail; /* slot + 1, 0 = empty (FIFO) */
static uint32_t mh_nslots;                  /* slots ever handed out */

static inline mh_slot *slot_at(uint32_t idx)
{
    return (mh_slot *)(mh_base + (size_t)idx * MH_STRIDE);
}

static inline uint32_t slot_idx(const mh_slot *s)
{
    return (uint32_t)(((const char *)s - mh_base) / MH_STRIDE);
}

static inline unsigned long mk_mh(uint32_t idx, uint32_t gen)
{
    return (unsigned long)(uintptr_t)slot_at(idx) + (gen & MH_GEN_MASK);
}

/* The slot a handle names, or NULL.  No lock; the slot may be in any state.
 * Never dereferences memory outside the committed slot range. */
static inline mh_slot *mh_lookup(gdr_mh_t mh, uint32_t *gen_out)
{
    char *base = mh_base;
    if (__builtin_expect(!base || mh.h < (unsigned long)(uintptr_t)base, 0)) return NULL;
    unsigned long off = mh.h - (unsigned long)(uintptr_t)base;
    unsigned long idx = off / MH_STRIDE;
    if (__builtin_expect(idx >= atomic_load_explicit(&mh_committed, memory_order_acquire), 0))
        return NULL;
    uint32_t glow = (uint32_t)(off % MH_STRIDE);
    if (__builtin_expect(glow > MH_GEN_MASK, 0)) return NULL;
    mh_slot *s = slot_at((uint32_t)idx);
    uint32_t gen = atomic_load_explicit(&s->gen, memory_order_acquire);
    if (__builtin_expect((gen & MH_GEN_MASK) != glow, 0)) return NULL;
    *gen_out = gen;
    return s;
}

/* With mh_lock held: make slots [mh_committed, +MH_CHUNK) usable. */
static int mh_grow(void)
{
    if (!mh_base) {
        void *p = mmap(NULL, (size_t)MH_MAX_SLOTS * MH_STRIDE, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return -1;
        mh_base = p;
    }
    uint32_t c = atomic_load_explicit(&mh_committed, memory_order_relaxed);
    if (c + MH_CHUNK > MH_MAX_SLOTS) return -1;
    char *at = (char *)slot_at(c);
    if (mprotect(at, (size_t)MH_CHUNK * MH_STRIDE, PROT_READ | PROT_WRITE) != 0) return -1;
    for (uint32_t i = 0; i < MH_CHUNK; i++) atomic_init(&slot_at(c + i)->gen, 1);
    atomic_store_explicit(&mh_committed, c + MH_CHUNK, memory_order_release);
    return 0;
}

static mh_slot *slot_alloc(uint32_t *idx_out)
{
    pthread_mutex_lock(&mh_lock);
    uint32_t idx;
    if (mh_free_head) {
        idx = mh_free_head - 1;
        mh_free_head = slot_at(idx)->next;
        if (!mh_free_head) mh_free_tail = 0;
    } else {
        if (mh_nslots >= atomic_load_explicit(&mh_committed, memory_order_relaxed) &&
            mh_grow() != 0) {
            pthread_mutex_unlock(&mh_lock);
            return NULL;
        }
        idx = mh_nslots++;
    }
    pthread_mutex_unlock(&mh_lock);
    mh_slot *s = slot_at(idx);
    s->prev = s->next = 0;
    *idx_out = idx;
    return s;
}

/* The slot must already be unlinked from its gdr. */
static void slot_free(mh_slot *s, uint32_t idx)
{
    atomic_store_explicit(&s->state, MH_FREE, memory_order_release);
    uint32_t g = atomic_load_explicit(&s->gen, memory_order_relaxed) + 1;
    if (g == 0) g = 1;
    atomic_store_explicit(&s->gen, g, memory_order_release);
    s->g = NULL;
    s->ctx = 0;
    s->pin = 0;
    atomic_store_explicit(&s->lo, NULL, memory_order_relaxed);
    atomic_store_explicit(&s->span, 0, memory_order_relaxed);
    atomic_store_explicit(&s->whole, 0, memory_order_relaxed);
    s->map_ret = NULL;
    pthread_mutex_lock(&mh_lock);
    s->next = 0;
    if (mh_free_tail) slot_at(mh_free_tail - 1)->next = idx + 1;
    else mh_free_head = idx + 1;
    mh_free_tail = idx + 1;
    pthread_mutex_unlock(&mh_lock);
}

/* ---- per-thread copy records (hazard pointers) ----------------------------- */
#include <sys/syscall.h>
#ifndef MEMBARRIER_CMD_PRIVATE_EXPEDITED
#define MEMBARRIER_CMD_PRIVATE_EXPEDITED (1 << 3)
#define MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED (1 << 4)
#endif

typedef struct hz_rec {
    mh_slot *_Atomic slot; /* slot being copied through, or NULL */
    _Atomic int used;      /* owned by a live thread */
    struct hz_rec *next;   /* append-only list */
} hz_rec;

/* The restartable small-write path reads gen and state as one word, then
 * lo and span (rseq_put.h). */
_Static_assert(offsetof(mh_slot, gen) == 0 && offsetof(mh_slot, state) == 4,
               "gen @0, state @4");
_Static_assert(offsetof(mh_slot, lo) == GP_RSEQ_SLOT_LO, "lo");
_Static_assert(offsetof(mh_slot, span) == GP_RSEQ_SLOT_SPAN, "span");
static int g_rseq; /* GP_RSEQ_SSE2/AVX2: writes of <= GP_RSEQ_PUT_MAX bytes are restartable */

/* Whether small writes through a mapping of `ctx` may be restartable
 * sequences.  A restart happens only when the writer returns to user mode,
 * so a store inside the section must never fault: a store that faults (a
 * page not yet in the page tables) and is still being handled in the kernel
 * when the unmap's membarrier has returned and munmap removed the range
 * ends in SIGSEGV, not in a restart.  The nvrm and gdrdrv backends map BAR1
 * with io_remap_pfn_range at mmap time: every page is present until the
 * munmap, so the section never faults.  Other mappings (sim's shared memory,
 * dma-buf mmaps) may fault on first touch, or again after reclaim or
 * migration: their copies announce themselves in the records, which the
 * unmap waits for.  GDRPY_GDRAPI_RSEQ=force or sse2 (tests) use the section
 * on every backend. */
static int rseq_may_use(gdrpy_ctx_t ctx)
{
    if (!g_rseq) return 0;
    if (gp_rseq_any_backend()) return 1;
    gdrpy_ctx_info_t ci;
    if (gdrpy_ctx_get_info(ctx, &ci) != 0) return 0;
    return ci.backend == GDRPY_BACKEND_NVRM || ci.backend == GDRPY_BACKEND_GDRDRV;
}

static hz_rec *_Atomic hz_all;
static pthread_key_t hz_key;
static int g_copy_fence = 1; /* 0 once membarrier is registered */
/* Default (dynamic) TLS model: libgdrapi is dlopen'ed (NCCL), where initial-exec
 * TLS can exhaust the static TLS block; on x86-64 the Makefile compiles this file
 * with TLS descriptors (-mtls-dialect=gnu2), which make the access cheap. */
static __thread hz_rec *t_hz;

static void hz_thread_exit(void *p)
{
    hz_rec *r = p;
    t_hz = NULL; /* a later copy in this thread's exit path registers again */
    atomic_store_explicit(&r->slot, NULL, memory_order_relaxed);
    atomic_store_explicit(&r->used, 0, memory_order_release);
}

static void hz_membarrier_register(void)
{
    long rc = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0);
    g_copy_fence = rc != 0;
    if (rc) LOGD("membarrier unavailable (errno %d): copies issue their own fence", errno);
}

static __attribute__((noinline, cold)) hz_rec *hz_register(void)
{
    hz_rec *r;
    for (r = atomic_load_explicit(&hz_all, memory_order_acquire); r; r = r->next) {
        int z = 0;
        if (atomic_compare_exchange_strong(&r->used, &z, 1)) break;
    }
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return NULL;
        atomic_init(&r->used, 1);
        hz_rec *head = atomic_load_explicit(&hz_all, memory_order_relaxed);
        do {
            r->next = head;
        } while (!atomic_compare_exchange_weak_explicit(&hz_all, &head, r, memory_order_release,
                                                        memory_order_relaxed));
    }
    pthread_setspecific(hz_key, r);
    t_hz = r;
    return r;
}

/* Fork child: only the forking thread exists; the other threads' records
 * (one may have been inside a copy) are released. */
static void hz_fork_child(void)
{
    hz_rec *mine = t_hz;
    for (hz_rec *r = atomic_load_explicit(&hz_all, memory_order_acquire); r; r = r->next) {
        if (r == mine) continue;
        atomic_store_explicit(&r->slot, NULL, memory_order_relaxed);
        atomic_store_explicit(&r->used, 0, memory_order_relaxed);
    }
}

static int hz_count(mh_slot *s)
{
    int n = 0;
    for (hz_rec *r = atomic_load_explicit(&hz_all, memory_order_acquire); r; r = r->next)
        if (atomic_load_explicit(&r->slot, memory_order_acquire) == s) n++;
    return n;
}

/* After the caller stored a state that makes new copies of `s` fail: waits
 * (bounded) until no thread is inside a copy through `s`.  0 or EBUSY. */
static int hz_wait_clear(mh_slot *s, int *waited_ms, int *busy)
{
    *waited_ms = 0;
    if (g_rseq) {
        /* Restarts every restartable write in flight (they then see the
         * state stored) and is the barrier the records need as well. */
        if (gp_rseq_barrier() != 0) {
            *busy = -1;
            return EBUSY;
        }
    } else if (g_copy_fence) atomic_thread_fence(memory_order_seq_cst);
    else if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0) {
        /* Registered at load time, so this does not fail; if it ever did,
         * copies in flight could not be seen: refuse rather than unmap. */
        *busy = -1;
        return EBUSY;
    }
    if ((*busy = hz_count(s)) == 0) return 0;
    int limit = gp_busy_wait_limit_ms();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 0;; i++) {
        if (i < 64) {
            sched_yield();
        } else {
            struct timespec ts = {0, i < 1000 ? 20000 : 200000};
            nanosleep(&ts, NULL);
        }
        *busy = hz_count(s);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        *waited_ms = (int)((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000);
        if (*busy == 0) return 0;
        if (*waited_ms >= limit) return EBUSY;
    }
}

/* ---- gdr instances ---------------------------------------------------- */
/* Layout note: GDRCopy's own tests (sanity.cpp) look inside a gdr_t as if it
 * were GDRCopy's `struct gdr` (an int fd first, 48 bytes in all): they copy
 * sizeof that struct and send `g->fd` to another process over a unix
 * socket, expecting nothing usable to arrive.  So `fd` comes first and is a
 * real descriptor: the /dev/nvidiactl (or /dev/gdrdrv) node gdr_open checks
 * for, holding no RM client or pin (the gdrpy contexts own those); -1 for
 * the sim backend. */
struct gdr {
    int fd; /* see above; closed by gdr_close */
    uint32_t magic;
    int closed;
    pthread_mutex_t lock;
    unsigned fork_gen; /* gdrpy_fork_generation at open */
    pid_t pid;
    int req_backend;   /* asked for (AUTO unless GDRPY_BACKEND) */
    int backend;       /* of the open contexts; before the first
                                      pin, the one gdr_open expects */
    int backend_known; /* a context has been opened */
    int default_dev;
    size_t rd_policy;             /* GDRPY_GDRAPI_READ_CE at gdr_open (read_ce.h) */
    gdrpy_ctx_t ctx[GDR_MAX_DEV]; /* 0 = not opened yet */
    uint32_t head;                /* first slot + 1 of the handle list */
    uint32_t nhandles;
    struct gdr *all_next; /* append-only list of every gdr ever made */
    struct gdr *free_next;
};
_Static_assert(offsetof(struct gdr, fd) == 0 && sizeof(struct gdr) >= 48,
               "GDRCopy's struct gdr layout: int fd first, at least 48 bytes");

static struct gdr *_Atomic gdr_all;
static pthread_mutex_t gdr_free_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gdr *gdr_free_list;

static void gdrapi_atfork_child(void)
{
    /* Only the forking thread survives: make the global locks usable again
     * (the parent's gdr instances are refused before their locks are
     * touched). */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    memcpy(&mh_lock, &fresh, sizeof fresh);
    memcpy(&gdr_free_lock, &fresh, sizeof fresh);
    hz_fork_child();
    /* membarrier registration belongs to the parent's address space */
    hz_membarrier_register();
    if (g_rseq && !gp_rseq_register()) g_rseq = 0;
}

__attribute__((constructor)) static void gdrapi_init(void)
{
    pthread_key_create(&hz_key, hz_thread_exit);
    hz_membarrier_register();
    g_rseq = gp_rseq_init();
    LOGD("writes of <= %d bytes: %s", GP_RSEQ_PUT_MAX,
         g_rseq == GP_RSEQ_AVX2   ? "restartable sequences (AVX2)"
         : g_rseq == GP_RSEQ_SSE2 ? "restartable sequences (SSE2)"
                                  : "per-thread records");
    pthread_atfork(NULL, NULL, gdrapi_atfork_child);
}

static int gdr_is_known(const struct gdr *g)
{
    for (struct gdr *x = atomic_load_explicit(&gdr_all, memory_order_acquire); x; x = x->all_next)
        if (x == g) return 1;
    return 0;
}

/* Validates g and takes g->lock.  Returns 0 or an errno with nothing held. */
static int g_enter(struct gdr *g, const char *what)
{
    if (!g || !gdr_is_known(g) || g->magic != GDR_MAGIC) {
        LOGE("%s: %p is not an open gdr_t", what, (void *)g);
        return EINVAL;
    }
    if (g->fork_gen != gdrpy_fork_generation || g->pid != getpid()) {
        LOGE("%s: this gdr_t was opened by process %d; a forked child must call "
             "gdr_open itself",
             what, (int)g->pid);
        return EACCES;
    }
    pthread_mutex_lock(&g->lock);
    if (g->closed || g->magic != GDR_MAGIC) {
        pthread_mutex_unlock(&g->lock);
        LOGE("%s: gdr_t %p is closed", what, (void *)g);
        return EINVAL;
    }
    return 0;
}

static inline void g_leave(struct gdr *g) { pthread_mutex_unlock(&g->lock); }

/* With g->lock held: the slot of a handle that belongs to g, or NULL. */
static mh_slot *g_slot(struct gdr *g, gdr_mh_t mh, const char *what)
{
    uint32_t gen;
    mh_slot *s = mh_lookup(mh, &gen);
    if (!s || s->g != g || atomic_load_explicit(&s->state, memory_order_relaxed) == MH_FREE) {
        LOGE("%s: handle 0x%lx is not pinned in gdr_t %p", what, mh.h, (void *)g);
        return NULL;
    }
    return s;
}

static void g_link(struct gdr *g, mh_slot *s, uint32_t idx)
{
    s->prev = 0;
    s->next = g->head;
    if (g->head) slot_at(g->head - 1)->prev = idx + 1;
    g->head = idx + 1;
    g->nhandles++;
}

static void g_unlink(struct gdr *g, mh_slot *s)
{
    if (s->prev) slot_at(s->prev - 1)->next = s->next;
    else g->head = s->next;
    if (s->next) slot_at(s->next - 1)->prev = s->prev;
    s->prev = s->next = 0;
    g->nhandles--;
}

/* ---- device of an address ----------------------------------------------- */
typedef CUresult (*cu_pointer_get_attribute_fn)(void *data, int attr, CUdeviceptr ptr);

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static cu_pointer_get_attribute_fn cu_ptr_attr;

static void cu_resolve(void)
{
    /* Only if the process already has libcuda (memory to pin comes from it):
     * libgdrapi never loads or initialises CUDA itself. */
    cu_ptr_attr = (cu_pointer_get_attribute_fn)gp_cuda_loaded_symbol("cuPointerGetAttribute");
}

/* With g->lock held. */
static int device_of(struct gdr *g, unsigned long addr)
{
    if (g->req_backend == GDRPY_BACKEND_SIM || g->backend == GDRPY_BACKEND_SIM)
        return g->default_dev;
    pthread_once(&cu_once, cu_resolve);
    if (!cu_ptr_attr) return g->default_dev;
    int dev = -1;
    CUresult rc = cu_ptr_attr(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)addr);
    if (rc != 0 || dev < 0 || dev >= GDR_MAX_DEV) {
        LOGD("cuPointerGetAttribute(DEVICE_ORDINAL, 0x%lx) gave CUresult %d; using device %d",
             addr, rc, g->default_dev);
        return g->default_dev;
    }
    return dev;
}

/* With g->lock held: the context for `dev`, opened on first use.  The first
 * context of a gdr is opened here, at its first pin, not in gdr_open: that
 * is when CUDA is first touched (GDRCopy's gdr_open leaves no CUDA state
 * either, and programs fork after gdr_open).  Later devices use the
 * backend the first one chose. */
static int ctx_for(struct gdr *g, int dev, gdrpy_ctx_t *out)
{
    if (g->ctx[dev]) {
        *out = g->ctx[dev];
        return 0;
    }
    int want = g->backend_known ? g->backend : g->req_backend;
    /* GDRCopy semantics across fork: a mapping pointer kept from before fork
     * faults in the child (its sanity suite checks that) */
    int rc = gdrpy_open(dev, want | GDRPY_OPEN_FORK_FAULTS, &g->ctx[dev]);
    if (rc) {
        g->ctx[dev] = 0;
        LOGE("opening device %d (%s backend) failed: %s", dev, gdrpy_backend_name(want),
             gdrpy_last_error());
        return rc;
    }
    if (!g->backend_known) {
        gdrpy_ctx_info_t ci;
        if (gdrpy_ctx_get_info(g->ctx[dev], &ci) == 0) {
            if (ci.backend != g->backend)
                LOGW("gdr_t %p: expected the %s backend, the driver gave %s", (void *)g,
                     gdrpy_backend_name(g->backend), ci.backend_name);
            g->backend = ci.backend;
            g->backend_known = 1;
        }
    }
    LOGD("opened device %d (%s backend) for a pin on it", dev, gdrpy_backend_name(g->backend));
    *out = g->ctx[dev];
    return 0;
}

/* ---- timestamps for gdr_info ---------------------------------------------- */
static inline uint64_t read_cycles(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return __rdtsc();
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
#endif
}

static GP_UNUSED uint64_t now_ns(void) /* used on x86 only */
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static pthread_once_t cpm_once = PTHREAD_ONCE_INIT;
static uint32_t cycles_per_ms = 1000000;

static void cpm_calibrate(void)
{
#if defined(__x86_64__) || defined(__i386__)
    uint64_t t0 = now_ns(), c0 = read_cycles(), t1, c1;
    do {
        t1 = now_ns();
        c1 = read_cycles();
    } while (t1 - t0 < 2000000); /* 2 ms, once per process */
    uint64_t v = (c1 - c0) * 1000000ull / (t1 - t0);
    if (v > 0 && v <= UINT32_MAX) cycles_per_ms = (uint32_t)v;
#endif
}

/* ---- instance --------------------------------------------------------- */
/* The backend gdr_open expects, and the descriptor of its device node,
 * found without touching CUDA.  Returns 0 or an errno. */
static int expect_backend(int req, int *backend, int *fd)
{
    *fd = -1;
    *backend = req;
    if (req == GDRPY_BACKEND_SIM) return 0;
    const char *nodes[2] = {"/dev/nvidiactl", "/dev/gdrdrv"};
    int first_err = 0;
    for (int i = 0; i < 2; i++) {
        if (i == 0 && req == GDRPY_BACKEND_GDRDRV) continue;
        int fd_ = open(nodes[i], O_RDWR | O_CLOEXEC);
        if (fd_ < 0) {
            if (!first_err) first_err = errno;
            LOGD("gdr_open: %s: %s", nodes[i], strerror(errno));
            continue;
        }
        *fd = fd_;
        if (req == GDRPY_BACKEND_AUTO)
            *backend = i == 0 ? GDRPY_BACKEND_NVRM : GDRPY_BACKEND_GDRDRV;
        if (i == 0 && req == GDRPY_BACKEND_AUTO && access("/dev/gdrdrv", F_OK) == 0)
            LOGD("gdr_open: /dev/gdrdrv present too; auto tries nvrm first");
        return 0;
    }
    /* No NVIDIA device node: nothing can map GPU memory here. */
    return first_err == EACCES || first_err == EPERM ? EACCES : ENODEV;
}

gdr_t gdr_open(void)
{
    int dev = 0;
    const char *ds = getenv("GDRPY_DEVICE");
    if (ds && *ds) {
        char *end;
        long v = strtol(ds, &end, 10);
        if (*end || v < 0 || v >= GDR_MAX_DEV) {
            LOGE("gdr_open: GDRPY_DEVICE=%s is not a device ordinal 0..%d", ds, GDR_MAX_DEV - 1);
            errno = EINVAL;
            return NULL;
        }
        dev = (int)v;
    }
    int req = GDRPY_BACKEND_AUTO;
    const char *bs = getenv("GDRPY_BACKEND");
    if (bs && *bs) {
        req = gdrpy_backend_from_name(bs);
        if (req < 0) {
            LOGE("gdr_open: GDRPY_BACKEND=%s is not one of auto, sim, nvrm, gdrdrv, dmabuf", bs);
            errno = EINVAL;
            return NULL;
        }
    }
    /* No CUDA call here: the gdrpy context is opened at the first pin. */
    int backend, fd;
    int rc = expect_backend(req, &backend, &fd);
    if (rc) {
        LOGE("gdr_open: no NVIDIA device node could be opened (/dev/nvidiactl, /dev/gdrdrv): "
             "%s; is the NVIDIA driver loaded? (GDRPY_BACKEND=sim runs without a GPU)",
             strerror(rc));
        errno = rc;
        return NULL;
    }

    struct gdr *g;
    pthread_mutex_lock(&gdr_free_lock);
    g = gdr_free_list;
    if (g) gdr_free_list = g->free_next;
    pthread_mutex_unlock(&gdr_free_lock);
    if (!g) {
        g = calloc(1, sizeof *g);
        if (!g) {
            if (fd >= 0) close(fd);
            errno = ENOMEM;
            return NULL;
        }
        pthread_mutex_init(&g->lock, NULL);
        struct gdr *head = atomic_load_explicit(&gdr_all, memory_order_relaxed);
        do {
            g->all_next = head;
        } while (!atomic_compare_exchange_weak_explicit(&gdr_all, &head, g, memory_order_release,
                                                        memory_order_relaxed));
    }
    pthread_mutex_lock(&g->lock);
    memset(g->ctx, 0, sizeof g->ctx);
    g->fd = fd;
    g->default_dev = dev;
    g->rd_policy = gp_rd_policy();
    g->req_backend = req;
    g->backend = backend;
    g->backend_known = 0;
    g->head = 0;
    g->nhandles = 0;
    g->free_next = NULL;
    g->pid = getpid();
    g->fork_gen = gdrpy_fork_generation;
    g->closed = 0;
    g->magic = GDR_MAGIC;
    pthread_mutex_unlock(&g->lock);
    LOGD("gdr_open: %p, device %d, %s backend expected (opened at the first pin)", (void *)g,
         dev, gdrpy_backend_name(backend));
    return g;
}

/* With g->lock held and s MAPPED: stops new copies through s (state PINNED)
 * and waits for those in flight.  0: none left, the caller unmaps; EBUSY:
 * still running at the limit, state restored to MAPPED. */
static int drain_copies(mh_slot *s, unsigned long h, const char *what)
{
    atomic_store(&s->state, MH_PINNED);
    int waited = 0, busy = 0;
    if (hz_wait_clear(s, &waited, &busy) == 0) return 0;
    atomic_store_explicit(&s->state, MH_MAPPED, memory_order_release);
    LOGE("%s: %d copies through handle 0x%lx (mapping %p) are still running in other "
         "threads after %d ms; nothing was released: try again once they return",
         what, busy, h, s->map_ret, waited);
    return EBUSY;
}

/* With g->lock held: unmap if mapped, unpin; the slot stays allocated and
 * linked if the unpin fails. */
static int slot_release(struct gdr *g, mh_slot *s, unsigned long h, const char *what)
{
    int rc;
    if (s->map_ret) {
        if (atomic_load_explicit(&s->state, memory_order_relaxed) == MH_MAPPED &&
            (rc = drain_copies(s, h, what)))
            return rc;
        rc = gdrpy_unmap(s->ctx, s->pin);
        if (rc) {
            atomic_store_explicit(&s->state, MH_MAPPED, memory_order_release);
            LOGE("%s: unmap failed: %s", what, gdrpy_last_error());
            return rc;
        }
        s->map_ret = NULL;
        s->mapping_type = GDR_MAPPING_TYPE_NONE;
    }
    rc = gdrpy_unpin(s->ctx, s->pin);
    if (rc) {
        LOGE("%s: unpin failed: %s", what, gdrpy_last_error());
        return rc;
    }
    return 0;
}

int gdr_close(gdr_t g)
{
    if (!g || !gdr_is_known(g) || g->magic != GDR_MAGIC) {
        LOGE("gdr_close: %p is not an open gdr_t", (void *)g);
        return EINVAL;
    }
    if (g->fork_gen != gdrpy_fork_generation || g->pid != getpid()) {
        /* A forked child letting go of its parent's instance: the parent's
         * pins are not ours to release and its mappings were never
         * inherited.  Forget it here without touching its lock. */
        g->magic = GDR_DEAD;
        g->closed = 1;
        if (g->fd >= 0) close(g->fd); /* the child's copy of the descriptor */
        g->fd = -1;
        LOGD("gdr_close: %p belongs to the parent process; dropped in the child", (void *)g);
        return 0;
    }
    pthread_mutex_lock(&g->lock);
    if (g->closed) {
        pthread_mutex_unlock(&g->lock);
        return EINVAL;
    }
    /* First stop every copy through this instance's mappings; if some are
     * still running at the limit, release nothing and stay open (EBUSY). */
    for (uint32_t i = g->head; i; i = slot_at(i - 1)->next) {
        mh_slot *s = slot_at(i - 1);
        if (atomic_load_explicit(&s->state, memory_order_relaxed) != MH_MAPPED) continue;
        if (drain_copies(s, mk_mh(i - 1, atomic_load(&s->gen)), "gdr_close")) {
            for (uint32_t k = g->head; k != i; k = slot_at(k - 1)->next)
                if (slot_at(k - 1)->map_ret)
                    atomic_store_explicit(&slot_at(k - 1)->state, MH_MAPPED,
                                          memory_order_release);
            pthread_mutex_unlock(&g->lock);
            return EBUSY;
        }
    }
    g->closed = 1;
    int first = 0;
    while (g->head) {
        uint32_t idx = g->head - 1;
        mh_slot *s = slot_at(idx);
        int rc = slot_release(g, s, mk_mh(idx, atomic_load(&s->gen)), "gdr_close");
        if (rc && !first) first = rc;
        /* gdrpy_close below releases whatever a failed unpin left. */
        g_unlink(g, s);
        slot_free(s, idx);
    }
    for (int d = 0; d < GDR_MAX_DEV; d++) {
        if (!g->ctx[d]) continue;
        int rc = gdrpy_close(g->ctx[d]);
        if (rc && !first) first = rc;
        g->ctx[d] = 0;
    }
    if (g->fd >= 0) close(g->fd);
    g->fd = -1;
    g->magic = GDR_DEAD;
    pthread_mutex_unlock(&g->lock);
    pthread_mutex_lock(&gdr_free_lock);
    g->free_next = gdr_free_list;
    gdr_free_list = g;
    pthread_mutex_unlock(&gdr_free_lock);
    if (first) LOGW("gdr_close: teardown reported %s", gdrpy_strerror(first));
    return 0;
}

/* ---- pins ------------------------------------------------------------- */
static int do_pin(struct gdr *g, unsigned long addr, size_t size, uint32_t flags,
                  gdr_mh_t *handle, const char *what)
{
    if (!handle) {
        LOGE("%s: handle pointer is NULL", what);
        return EINVAL;
    }
    handle->h = 0;
    if (size == 0 || addr == 0) {
        LOGE("%s: %s", what, size == 0 ? "size is 0" : "address is NULL");
        return EINVAL;
    }
    if (flags & ~(uint32_t)GDR_PIN_FLAG_FORCE_PCIE) {
        LOGE("%s: unknown pin flags 0x%x", what, flags);
        return EINVAL;
    }
    int rc = g_enter(g, what);
    if (rc) return rc;
    gdrpy_ctx_t ctx;
    int dev = device_of(g, addr);
    rc = ctx_for(g, dev, &ctx);
    if (rc) {
        g_leave(g);
        return rc;
    }
    gdrpy_pin_t pin;
    rc = gdrpy_pin(ctx, addr, size, flags, &pin);
    if (rc) {
        g_leave(g);
        LOGE("%s: %s", what, gdrpy_last_error());
        return rc;
    }
    /* The pinned range is the backend's: it may stop short of the GPU pages
     * around the request (an allocation's or a chunk's end), and gdr_get_info
     * and gdr_map must never promise more than gdr_map maps. */
    gdrpy_pin_info_t pi;
    rc = gdrpy_pin_get_info(ctx, pin, &pi);
    uint32_t idx;
    mh_slot *s = rc ? NULL : slot_alloc(&idx);
    if (!s) {
        gdrpy_unpin(ctx, pin);
        g_leave(g);
        LOGE("%s: %s", what, rc ? gdrpy_last_error() : "out of handles");
        return rc ? rc : ENOMEM;
    }
    s->g = g;
    s->ctx = ctx;
    s->pin = pin;
    s->addr = addr;
    s->size = size;
    s->va = pi.va;
    s->mapped_size = pi.mapped_size;
    s->backed = pi.backed_size;
    s->dev = dev;
    s->map_ret = NULL;
    s->map_size = 0;
    s->mapping_type = GDR_MAPPING_TYPE_NONE;
    atomic_store_explicit(&s->lo, NULL, memory_order_relaxed);
    atomic_store_explicit(&s->span, 0, memory_order_relaxed);
    s->tm_cycles = read_cycles();
    g_link(g, s, idx);
    atomic_store_explicit(&s->state, MH_PINNED, memory_order_release);
    handle->h = mk_mh(idx, atomic_load_explicit(&s->gen, memory_order_relaxed));
    g_leave(g);
    LOGD("%s: 0x%lx +%zu -> handle 0x%lx", what, addr, size, handle->h);
    return 0;
}

int gdr_pin_buffer(gdr_t g, unsigned long addr, size_t size, uint64_t p2p_token,
                   uint32_t va_space, gdr_mh_t *handle)
{
    if (p2p_token || va_space) {
        if (handle) handle->h = 0;
        LOGE("gdr_pin_buffer: p2p tokens are not supported (token 0x%llx, va_space %u)",
             (unsigned long long)p2p_token, va_space);
        return EINVAL;
    }
    return do_pin(g, addr, size, GDR_PIN_FLAG_DEFAULT, handle, "gdr_pin_buffer");
}

int gdr_pin_buffer_v2(gdr_t g, unsigned long addr, size_t size, uint32_t flags,
                      gdr_mh_t *handle)
{
    return do_pin(g, addr, size, flags, handle, "gdr_pin_buffer_v2");
}

int gdr_unpin_buffer(gdr_t g, gdr_mh_t handle)
{
    int rc = g_enter(g, "gdr_unpin_buffer");
    if (rc) return rc;
    mh_slot *s = g_slot(g, handle, "gdr_unpin_buffer");
    if (!s) {
        g_leave(g);
        return EINVAL;
    }
    rc = slot_release(g, s, handle.h, "gdr_unpin_buffer");
    if (!rc) {
        g_unlink(g, s);
        slot_free(s, slot_idx(s));
    }
    g_leave(g);
    return rc;
}

int gdr_get_callback_flag(gdr_t g, gdr_mh_t handle, int *flag)
{
    if (!flag) return EINVAL;
    int rc = g_enter(g, "gdr_get_callback_flag");
    if (rc) return rc;
    mh_slot *s = g_slot(g, handle, "gdr_get_callback_flag");
    if (!s) {
        g_leave(g);
        return EINVAL;
    }
    gdrpy_pin_info_t pi;
    rc = gdrpy_pin_get_info(s->ctx, s->pin, &pi);
    if (rc) LOGE("gdr_get_callback_flag: %s", gdrpy_last_error());
    else *flag = pi.invalidated ? 1 : 0;
    g_leave(g);
    return rc;
}

static int info_common(struct gdr *g, gdr_mh_t handle, gdr_info_v2_t *o, const char *what)
{
    if (!o) return EINVAL;
    pthread_once(&cpm_once, cpm_calibrate);
    int rc = g_enter(g, what);
    if (rc) return rc;
    mh_slot *s = g_slot(g, handle, what);
    if (!s) {
        g_leave(g);
        return EINVAL;
    }
    int mapped = atomic_load_explicit(&s->state, memory_order_relaxed) == MH_MAPPED;
    memset(o, 0, sizeof *o);
    o->va = s->va;
    o->mapped_size = s->mapped_size;
    o->page_size = (uint32_t)GPU_PAGE_SIZE;
    o->tm_cycles = s->tm_cycles;
    o->cycles_per_ms = cycles_per_ms;
    o->mapped = mapped;
    o->wc_mapping = mapped && s->mapping_type == GDR_MAPPING_TYPE_WC;
    o->mapping_type = mapped ? (gdr_mapping_type_t)s->mapping_type : GDR_MAPPING_TYPE_NONE;
    g_leave(g);
    return 0;
}

/* The exported name "gdr_get_info" takes the v1 layout (the header's macro
 * of that name is bypassed by the parentheses). */
int(gdr_get_info)(gdr_t g, gdr_mh_t handle, gdr_info_v1_t *info)
{
    if (!info) return EINVAL;
    gdr_info_v2_t v2;
    int rc = info_common(g, handle, &v2, "gdr_get_info");
    if (rc) return rc;
    memset(info, 0, sizeof *info);
    info->va = v2.va;
    info->mapped_size = v2.mapped_size;
    info->page_size = v2.page_size;
    info->tm_cycles = v2.tm_cycles;
    info->cycles_per_ms = v2.cycles_per_ms;
    info->mapped = v2.mapped;
    info->wc_mapping = v2.wc_mapping;
    return 0;
}

int gdr_get_info_v2(gdr_t g, gdr_mh_t handle, gdr_info_v2_t *info)
{
    return info_common(g, handle, info, "gdr_get_info_v2");
}

/* ---- mappings --------------------------------------------------------- */
static int map_type_ok(struct gdr *g, int flags, int type)
{
    switch (flags) {
    case GDR_MAP_FLAG_DEFAULT: return 1;
    /* The sim's host memory is cached; a WC request is accepted there so
     * that code written for GPUs runs unchanged on it. */
    case GDR_MAP_FLAG_REQ_WC:
        return type == GDR_MAPPING_TYPE_WC || g->backend == GDRPY_BACKEND_SIM;
    case GDR_MAP_FLAG_REQ_CACHE: return type == GDR_MAPPING_TYPE_CACHING;
    case GDR_MAP_FLAG_REQ_DEVICE: return type == GDR_MAPPING_TYPE_DEVICE;
    default: return 0;
    }
}

static int do_map(struct gdr *g, gdr_mh_t handle, void **va, size_t size, int flags,
                  const char *what)
{
    if (!va) {
        LOGE("%s: output pointer is NULL", what);
        return EINVAL;
    }
    /* *va is written only on success: a refused second gdr_map must not
     * clobber the caller's pointer to the first mapping. */
    if (flags < GDR_MAP_FLAG_DEFAULT || flags > GDR_MAP_FLAG_REQ_DEVICE) {
        LOGE("%s: unknown map flags %d", what, flags);
        return EINVAL;
    }
    int rc = g_enter(g, what);
    if (rc) return rc;
    mh_slot *s = g_slot(g, handle, what);
    if (!s) {
        rc = EINVAL;
        goto out;
    }
    if (atomic_load_explicit(&s->state, memory_order_relaxed) == MH_MAPPED) {
        LOGE("%s: handle 0x%lx is already mapped", what, handle.h);
        rc = EAGAIN;
        goto out;
    }
    if (s->addr & GPU_PAGE_OFFSET) {
        LOGE("%s: the pinned address 0x%llx is not %lu-byte aligned; pin from a GPU page "
             "boundary to map",
             what, (unsigned long long)s->addr, GPU_PAGE_SIZE);
        rc = EINVAL;
        goto out;
    }
    if (size == 0 || size > s->mapped_size) {
        LOGE("%s: size %zu is outside 1..%llu (the pinned GPU pages)", what, size,
             (unsigned long long)s->mapped_size);
        rc = EINVAL;
        goto out;
    }
    void *map_ptr, *user_ptr;
    rc = gdrpy_map(s->ctx, s->pin, &map_ptr, &user_ptr);
    if (rc) {
        LOGE("%s: %s", what, gdrpy_last_error());
        goto out;
    }
    gdrpy_pin_info_t pi;
    rc = gdrpy_pin_get_info(s->ctx, s->pin, &pi);
    if (rc) {
        LOGE("%s: %s", what, gdrpy_last_error());
        gdrpy_unmap(s->ctx, s->pin);
        goto out;
    }
    if (!map_type_ok(g, flags, (int)pi.mapping_type)) {
        const char *got = "?";
        gdr_get_mapping_type_string((gdr_mapping_type_t)pi.mapping_type, &got);
        LOGE("%s: map flag %d cannot be honoured: the backend maps this memory as %s", what,
             flags, got);
        gdrpy_unmap(s->ctx, s->pin);
        rc = EINVAL;
        goto out;
    }
    atomic_store_explicit(&s->lo, (char *)pi.map_ptr, memory_order_relaxed);
    atomic_store_explicit(&s->span, (size_t)pi.backed_size, memory_order_relaxed);
    atomic_store_explicit(&s->whole, (size_t)pi.mapped_size, memory_order_relaxed);
    s->map_ret = (char *)user_ptr - (s->addr - s->va);
    s->map_size = size;
    s->mapping_type = (int)pi.mapping_type;
    atomic_store_explicit(&s->fork_gen, gdrpy_fork_generation, memory_order_relaxed);
    atomic_store_explicit(&s->rseq_ok, (unsigned)rseq_may_use(s->ctx), memory_order_relaxed);
    atomic_store_explicit(&s->state, MH_MAPPED, memory_order_release);
    *va = s->map_ret;
    LOGD("%s: handle 0x%lx mapped at %p (%zu bytes, type %d)", what, handle.h, s->map_ret, size,
         s->mapping_type);
out:
    g_leave(g);
    return rc;
}

int gdr_map(gdr_t g, gdr_mh_t handle, void **va, size_t size)
{
    return do_map(g, handle, va, size, GDR_MAP_FLAG_DEFAULT, "gdr_map");
}

int gdr_map_v2(gdr_t g, gdr_mh_t handle, void **va, size_t size, int flags)
{
    return do_map(g, handle, va, size, flags, "gdr_map_v2");
}

int gdr_unmap(gdr_t g, gdr_mh_t handle, void *va, size_t size)
{
    int rc = g_enter(g, "gdr_unmap");
    if (rc) return rc;
    mh_slot *s = g_slot(g, handle, "gdr_unmap");
    if (!s) {
        rc = EINVAL;
    } else if (atomic_load_explicit(&s->state, memory_order_relaxed) != MH_MAPPED) {
        LOGE("gdr_unmap: handle 0x%lx is not mapped", handle.h);
        rc = EINVAL;
    } else if (va != s->map_ret ||
               gp_round_up(size, HOST_PAGE) != gp_round_up(s->map_size, HOST_PAGE)) {
        LOGE("gdr_unmap: (%p, %zu) is not the mapping of handle 0x%lx (%p, %zu)", va, size,
             handle.h, s->map_ret, s->map_size);
        rc = EINVAL;
    } else if (!(rc = drain_copies(s, handle.h, "gdr_unmap"))) {
        rc = gdrpy_unmap(s->ctx, s->pin);
        if (rc) {
            atomic_store_explicit(&s->state, MH_MAPPED, memory_order_release);
            LOGE("gdr_unmap: %s", gdrpy_last_error());
        } else {
            s->map_ret = NULL;
            s->map_size = 0;
            s->mapping_type = GDR_MAPPING_TYPE_NONE;
        }
    }
    g_leave(g);
    return rc;
}

/* ---- copies (hot path: no lock, no allocation) ------------------------ */
static __attribute__((noinline, cold)) int copy_fail(gdr_mh_t handle, const void *p, size_t n,
                                                     int why, const char *what)
{
    switch (why) {
    case EACCES:
        LOGE("%s: handle 0x%lx was mapped by the parent process; mappings are not "
             "inherited across fork",
             what, handle.h);
        break;
    case ERANGE: {
        /* Into the no-access tail of a pinned range (past the end of the
         * allocation's memory, inside its last GPU page): ERANGE, as gdrpy's
         * validated copies; anywhere else outside the mapping: EINVAL. */
        uint32_t gen;
        mh_slot *s = mh_lookup(handle, &gen);
        const char *lo = s ? atomic_load_explicit(&s->lo, memory_order_relaxed) : NULL;
        size_t span = s ? atomic_load_explicit(&s->span, memory_order_relaxed) : 0;
        size_t whole = s ? atomic_load_explicit(&s->whole, memory_order_relaxed) : 0;
        const char *c = p;
        if (lo && c >= lo && (size_t)(c - lo) <= whole && n <= whole - (size_t)(c - lo) &&
            (size_t)(c - lo) + n > span) {
            LOGE("%s: [%p, +%zu) reaches past byte %zu of the mapping of handle 0x%lx, where "
                 "the allocation's memory ends: the rest of its last GPU page is no one's and "
                 "is never touched",
                 what, p, n, span, handle.h);
            return ERANGE;
        }
        LOGE("%s: [%p, +%zu) is outside the mapping of handle 0x%lx", what, p, n, handle.h);
        return EINVAL;
    }
    default:
        LOGE("%s: handle 0x%lx is not mapped", what, handle.h);
    }
    return why;
}

/* 0 if [p, p+n) may be copied through the mapping of `handle`, else the
 * reason (EINVAL, EACCES, ERANGE, ENOMEM).  On 0 this thread's record *rout
 * names the slot until copy_done(). */
static inline __attribute__((always_inline)) int copy_check(gdr_mh_t handle, const void *p,
                                                            size_t n, hz_rec **rout)
{
    uint32_t gen;
    mh_slot *s = mh_lookup(handle, &gen);
    if (__builtin_expect(!s, 0)) return EINVAL;
    hz_rec *r = t_hz;
    if (__builtin_expect(!r, 0) && !(r = hz_register())) return ENOMEM;
    /* Announce the copy, then check the state: an unmap stores the state,
     * then (membarrier) scans the records; this thread's store and load are
     * ordered by that barrier, or by our own fence without membarrier. */
    atomic_store_explicit(&r->slot, s, memory_order_relaxed);
    if (__builtin_expect(g_copy_fence, 0)) atomic_thread_fence(memory_order_seq_cst);
    else atomic_signal_fence(memory_order_seq_cst);
    int why = 0;
    if (__builtin_expect(atomic_load_explicit(&s->state, memory_order_acquire) != MH_MAPPED, 0)) {
        why = EINVAL;
    } else if (__builtin_expect(atomic_load_explicit(&s->fork_gen, memory_order_relaxed) !=
                                    gdrpy_fork_generation,
                                0)) {
        why = EACCES;
    } else {
        const char *lo = atomic_load_explicit(&s->lo, memory_order_relaxed);
        size_t span = atomic_load_explicit(&s->span, memory_order_relaxed);
        /* Re-read the generation: the slot was not recycled while we read it. */
        atomic_thread_fence(memory_order_acquire);
        const char *c = (const char *)p;
        if (__builtin_expect(atomic_load_explicit(&s->gen, memory_order_relaxed) != gen, 0))
            why = EINVAL;
        else if (__builtin_expect(c < lo || (size_t)(c - lo) > span ||
                                      n > span - (size_t)(c - lo),
                                  0))
            why = n ? ERANGE : 0;
    }
    if (__builtin_expect(why != 0, 0)) {
        atomic_store_explicit(&r->slot, NULL, memory_order_release);
        return why;
    }
    *rout = r;
    return 0;
}

static inline void copy_done(hz_rec *r)
{
    atomic_store_explicit(&r->slot, NULL, memory_order_release);
}

/* The cold exit of both copies: a refused check (rc != 0, nothing announced),
 * or a NULL host pointer (the record r still names the slot).  A zero-length
 * copy with a NULL host pointer succeeds, as in GDRCopy. */
static __attribute__((noinline, cold)) int copy_refuse(gdr_mh_t handle, const void *map_p,
                                                       size_t n, int rc, hz_rec *r,
                                                       const char *what)
{
    if (rc) return copy_fail(handle, map_p, n, rc, what);
    copy_done(r);
    if (n == 0) return 0;
    LOGE("%s: host pointer is NULL", what);
    return EINVAL;
}

/* The record path: every check, every refusal reported. */
static __attribute__((noinline)) int copy_to_mapping_checked(gdr_mh_t handle, void *map_d_ptr,
                                                             const void *h_ptr, size_t size)
{
    hz_rec *r = NULL;
    int rc = copy_check(handle, map_d_ptr, size, &r);
    if (__builtin_expect(rc != 0 || !h_ptr, 0))
        return copy_refuse(handle, map_d_ptr, size, rc, r, "gdr_copy_to_mapping");
    if (__builtin_expect(size != 0, 1)) gdrpy_copy_to_mapping(map_d_ptr, h_ptr, size);
    copy_done(r);
    return 0;
}

#if defined(__x86_64__)
/* A restartable write refused (or no rseq in this thread): the record path,
 * for the same handle (rseq_put.h). */
int gp_rseq_refused(const void *slot, uint64_t want,
                    void *map_d_ptr, const void *h_ptr,
                    size_t size)
{
    gdr_mh_t handle = {(unsigned long)(uintptr_t)slot + ((uint32_t)want & MH_GEN_MASK)};
    return copy_to_mapping_checked(handle, map_d_ptr, h_ptr, size);
}
#endif

int gdr_copy_to_mapping(gdr_mh_t handle, void *map_d_ptr, const void *h_ptr, size_t size)
{
#if defined(__x86_64__)
    /* 1..GP_RSEQ_PUT_MAX bytes as a restartable sequence (rseq_put.h): no
     * store announces the copy.  Anything it refuses takes the record path
     * (gp_rseq_refused), which reports it precisely. */
    if (__builtin_expect(g_rseq, 1) && size - 1 < GP_RSEQ_PUT_MAX && h_ptr) {
        uint32_t gen;
        mh_slot *s = mh_lookup(handle, &gen);
        /* rseq_ok belongs to the slot's generation: the section re-checks
         * the generation, so a value read from an older mapping of another
         * pin is never acted on */
        if (__builtin_expect(s != NULL, 1) &&
            __builtin_expect(atomic_load_explicit(&s->fork_gen, memory_order_relaxed) ==
                                 gdrpy_fork_generation,
                             1) &&
            __builtin_expect(atomic_load_explicit(&s->rseq_ok, memory_order_relaxed), 1))
            return g_rseq == GP_RSEQ_AVX2
                       ? gp_rseq_put_avx2(s, gen | (uint64_t)MH_MAPPED << 32, map_d_ptr, h_ptr,
                                          size)
                       : gp_rseq_put(s, gen | (uint64_t)MH_MAPPED << 32, map_d_ptr, h_ptr, size);
    }
#endif
    return copy_to_mapping_checked(handle, map_d_ptr, h_ptr, size);
}

/* A read of at least gp_rd_floor bytes, checked and announced (r): through
 * the copy engine where that is faster (read_ce.c), else through the
 * mapping. */
static __attribute__((noinline)) int copy_from_mapping_large(gdr_mh_t handle, void *h_ptr,
                                                             const void *map_d_ptr, size_t size,
                                                             hz_rec *r)
{
    uint32_t gen;
    mh_slot *s = mh_lookup(handle, &gen); /* announced: it stays this mapping */
    int done = 1;
    if (s) {
        const char *lo = atomic_load_explicit(&s->lo, memory_order_relaxed);
        size_t span = atomic_load_explicit(&s->span, memory_order_relaxed);
        size_t head = (size_t)(s->addr - s->va);
        gp_rd_src src = {
            .ctx = s->ctx,
            .pin = s->pin,
            .device = s->dev,
            .sim = s->g->backend == GDRPY_BACKEND_SIM,
            .policy = s->g->rd_policy,
            .user = lo + head,
            .avail = span > head ? span - head : 0,
        };
        if (src.avail > s->size) src.avail = (size_t)s->size;
        done = gp_rd_large(&src, h_ptr, map_d_ptr, size);
    }
    if (done) gdrpy_copy_from_mapping(h_ptr, map_d_ptr, size);
    copy_done(r);
    return 0;
}

int gdr_copy_from_mapping(gdr_mh_t handle, void *h_ptr, const void *map_d_ptr, size_t size)
{
    hz_rec *r = NULL;
    int rc = copy_check(handle, map_d_ptr, size, &r);
    if (__builtin_expect(rc != 0 || !h_ptr, 0))
        return copy_refuse(handle, map_d_ptr, size, rc, r, "gdr_copy_from_mapping");
    /* the one check the small path pays (read_ce.h) */
    if (__builtin_expect(size >= atomic_load_explicit(&gp_rd_floor, memory_order_relaxed), 0))
        return copy_from_mapping_large(handle, h_ptr, map_d_ptr, size, r);
    if (__builtin_expect(size != 0, 1)) gdrpy_copy_from_mapping(h_ptr, map_d_ptr, size);
    copy_done(r);
    return 0;
}

/* ---- versions and attributes ------------------------------------------ */
void gdr_runtime_get_version(int *major, int *minor)
{
    if (major) *major = GDR_API_MAJOR_VERSION;
    if (minor) *minor = GDR_API_MINOR_VERSION;
}

int gdr_driver_get_version(gdr_t g, int *major, int *minor)
{
    if (!major || !minor) return EINVAL;
    int rc = g_enter(g, "gdr_driver_get_version");
    if (rc) return rc;
    g_leave(g);
    /* No gdrdrv: report the API level this library implements, which
     * satisfies the minimum-driver checks of GDRCopy users (NCCL: >= 2.1). */
    *major = GDR_API_MAJOR_VERSION;
    *minor = GDR_API_MINOR_VERSION;
    return 0;
}

int gdr_get_attribute(gdr_t g, gdr_attr_t attr, int *v)
{
    if (!v) return EINVAL;
    *v = 0; /* as GDRCopy: 0 on every failure */
    int rc = g_enter(g, "gdr_get_attribute");
    if (rc) return rc;
    int backend = g->backend;
    g_leave(g);
    /* gdrdrv backend: the module's own answer, as GDRCopy asks it (0 when
     * the module is too old to say). */
    if (backend == GDRPY_BACKEND_GDRDRV &&
        (attr == GDR_ATTR_USE_PERSISTENT_MAPPING || attr == GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE)) {
        int fd = open("/dev/gdrdrv", O_RDWR | O_CLOEXEC);
        struct {
            uint32_t attr, val;
        } a = {(uint32_t)attr, 0};
        *v = fd >= 0 && ioctl(fd, 0xC008DA06u /* GDRDRV_IOC_GET_ATTR */, &a) == 0 ? (int)a.val : 0;
        if (fd >= 0) close(fd);
        return 0;
    }
    switch ((int)attr) {
    case GDR_ATTR_USE_PERSISTENT_MAPPING:
        /* nvrm, dmabuf, sim: the pin's RM handle / dma-buf / memfd keeps the
         * pages; a freed allocation never invalidates the mapping. */
        *v = 1;
        return 0;
    case GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE:
        /* As gdrdrv >= 2.5 reports it: the flag is understood.  Whether the
         * platform honours it is the pin's answer: refused with ENOTSUPP
         * (524) on a GPU without a coherent CPU-GPU link, as GDRCopy's
         * driver refuses it (core.c, force_pcie_ok). */
        *v = 1;
        return 0;
    case GDR_ATTR_USING_DMA_BUF_MMAP:
        *v = backend == GDRPY_BACKEND_DMABUF;
        return 0;
    default:
        LOGE("gdr_get_attribute: unknown attribute %d", (int)attr);
        return EINVAL;
    }
}

int gdr_get_mapping_type_string(gdr_mapping_type_t type, const char **type_str)
{
    if (!type_str) return EINVAL;
    switch (type) {
    case GDR_MAPPING_TYPE_NONE: *type_str = "GDR_MAPPING_TYPE_NONE"; return 0;
    case GDR_MAPPING_TYPE_WC: *type_str = "GDR_MAPPING_TYPE_WC"; return 0;
    case GDR_MAPPING_TYPE_CACHING: *type_str = "GDR_MAPPING_TYPE_CACHING"; return 0;
    case GDR_MAPPING_TYPE_DEVICE: *type_str = "GDR_MAPPING_TYPE_DEVICE"; return 0;
    default: return EINVAL;
    }
}
