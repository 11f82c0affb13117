/*
 * core.c - contexts, pins and mappings in handle tables; argument
 * validation; lifetimes; fork detection; backend selection.
 *
 * Locking (no lock is held across a copy by anything but its own context):
 *  - The context table is an array of slots that are never freed.  A call
 *    enters a context by raising the slot's `users` count and then checking
 *    the generation and the `closing` flag (sequentially consistent, so
 *    either the call sees `closing` or gdrpy_close sees the call); it leaves
 *    by dropping the count.  `g_tab_lock` guards slot allocation and the
 *    start and end of a close only: opening or closing one context never
 *    waits on another context's calls.
 *  - gdrpy_close sets `closing` (new calls get EBADF), waits for the calls
 *    already inside to leave (bounded: gp_wait_idle; EBUSY naming the
 *    context if they do not), then tears down and frees the context.
 *    `closing` stays set until gdrpy_open reuses the slot (after storing the
 *    new generation), and calls check it before the generation, so a call
 *    that raced the close never dereferences the freed context.
 *  - `ctx->lock` guards the pin table and pin state.  A backend's pin runs
 *    without it (it may take milliseconds: proofs, driver calls) and the new
 *    pin is published in the table under it afterwards.  Validated copies
 *    (gdrpy_write/read/ce_*) raise pin->inflight under ctx->lock and drop it
 *    (atomically) without it; unmap/unpin mark the pin `tearing` (new copies
 *    get EBUSY), wait (bounded) for the copies in flight, then unmap: the
 *    mapping stays mapped until every copy through it has returned.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <sys/mman.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "cudadrv.h"
#include "fence.h"

volatile unsigned gdrpy_fork_generation = 0;

#define CTX_MAX 1024u

struct gp_ctx_slot {
    _Atomic uint32_t gen; /* generation of the handle now valid */
    _Atomic int users;    /* calls inside the context */
    _Atomic int closing;  /* set by gdrpy_close; cleared when gdrpy_open reuses the slot */
    gp_ctx *_Atomic ctx;  /* NULL: free */
};

static pthread_mutex_t g_tab_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gp_ctx_slot g_slots[CTX_MAX];

static void map_placeholders(void);

static void on_fork_child(void)
{
    gdrpy_fork_generation++;
    /* Only the forking thread survives: the table lock may have been held
     * by another thread.  The child never uses the parent's contexts (every
     * call fails with EACCES before any lock is taken). */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    memcpy(&g_tab_lock, &fresh, sizeof fresh);
    map_placeholders();
}

/* In a forked child: every mapping of the parent's contexts is replaced by
 * private zero-filled memory at the same address (MAP_FIXED: whether the
 * backend's MADV_DONTFORK left a hole or the mapping was inherited), and its
 * no-access tail, if any, by no-access memory.  A raw
 * view taken before fork then reads zeros and writes into memory of the
 * child's own: it never sees or changes the parent's device memory, never
 * faults, and the range can never be reused for an unrelated allocation of
 * the child.  Runs single-threaded right after fork; reads the inherited
 * table without locks. */
static size_t g_host_page = 4096;

static void map_placeholders(void)
{
    for (uint32_t i = 0; i < CTX_MAX; i++) {
        gp_ctx *c = atomic_load_explicit(&g_slots[i].ctx, memory_order_relaxed);
        if (!c || !c->pins || c->fork_faults) continue;
        for (uint32_t k = 0; k < c->npins_cap; k++) {
            gp_pin *p = c->pins[k];
            if (!p || !p->map_base || !p->map_len) continue;
            /* map_base need not be page aligned (nvrm: the BAR1 offset's low
             * bits); cover the whole pages the backend mapped */
            uintptr_t lo = gp_round_down((uintptr_t)p->map_base, g_host_page);
            uintptr_t hi = gp_round_up((uintptr_t)p->map_base + p->map_len, g_host_page);
            /* a no-access tail (p->backed) stays so: a touch faults there */
            uintptr_t mid = gp_round_up((uintptr_t)p->map_base + p->backed, g_host_page);
            if (mid > hi) mid = hi;
            mmap((void *)lo, mid - lo, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
            if (hi > mid)
                mmap((void *)mid, hi - mid, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        }
    }
}

/* ---- bounded waits ------------------------------------------------------ */
int gp_busy_wait_limit_ms(void)
{
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v >= 0) return v;
    v = 3000;
    const char *e = getenv("GDRPY_BUSY_WAIT_MS");
    if (e && *e) {
        char *end;
        long x = strtol(e, &end, 10);
        if (*end || x < 0 || x > 600000)
            gp_log(GP_LOG_CONFIG, "GDRPY_BUSY_WAIT_MS=%s is not a number of milliseconds 0..600000; "
                                  "using %d",
                   e, v);
        else
            v = (int)x;
    }
    atomic_store_explicit(&cached, v, memory_order_relaxed);
    return v;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int gp_wait_idle(_Atomic int *count, int *waited_ms)
{
    *waited_ms = 0;
    if (atomic_load(count) == 0) return 0;
    int limit = gp_busy_wait_limit_ms();
    uint64_t t0 = mono_ms();
    for (unsigned i = 0;; i++) {
        if (atomic_load(count) == 0) {
            *waited_ms = (int)(mono_ms() - t0);
            return 0;
        }
        uint64_t el = mono_ms() - t0;
        if (el >= (uint64_t)limit) {
            *waited_ms = (int)el;
            return GDRPY_EBUSY;
        }
        if (i < 64) {
            sched_yield();
        } else {
            struct timespec ts = {0, i < 1000 ? 20000 : 200000};
            nanosleep(&ts, NULL);
        }
    }
}

__attribute__((constructor)) static void gp_core_init(void)
{
    long pg = sysconf(_SC_PAGESIZE);
    if (pg > 0) g_host_page = (size_t)pg;
    pthread_atfork(NULL, NULL, on_fork_child);
}

static const struct gp_backend *backend_by_id(int id)
{
    switch (id) {
    case GDRPY_BACKEND_SIM: return &gp_backend_sim;
    case GDRPY_BACKEND_NVRM: return &gp_backend_nvrm;
    case GDRPY_BACKEND_GDRDRV: return &gp_backend_gdrdrv;
    case GDRPY_BACKEND_DMABUF: return &gp_backend_dmabuf;
    default: return NULL;
    }
}

static const char *const backend_names[GDRPY_BACKEND_COUNT_] = {
    "auto", "sim", "nvrm", "gdrdrv", "dmabuf"};

void gdrpy_version(int *major, int *minor, int *patch)
{
    if (major) *major = GDRPY_VERSION_MAJOR;
    if (minor) *minor = GDRPY_VERSION_MINOR;
    if (patch) *patch = GDRPY_VERSION_PATCH;
}

const char *gdrpy_backend_name(int backend)
{
    if (backend < 0 || backend >= GDRPY_BACKEND_COUNT_) return NULL;
    return backend_names[backend];
}

int gdrpy_backend_from_name(const char *name)
{
    if (!name) return -1;
    for (int i = 0; i < GDRPY_BACKEND_COUNT_; i++)
        if (strcmp(name, backend_names[i]) == 0) return i;
    return -1;
}

int gdrpy_backend_probe(int backend, int device, char *why, size_t whylen)
{
    char dummy[8];
    if (!why || whylen == 0) {
        why = dummy;
        whylen = sizeof dummy;
    }
    why[0] = '\0';
    const struct gp_backend *be = backend_by_id(backend);
    if (!be) {
        snprintf(why, whylen, "unknown backend %d", backend);
        return gp_err(GDRPY_EINVAL, "probe: unknown backend %d", backend);
    }
    if (device < 0) {
        snprintf(why, whylen, "device %d is negative", device);
        return gp_err(GDRPY_EINVAL, "probe: device %d is negative", device);
    }
    int rc = be->probe(device, why, whylen);
    if (rc && !why[0]) snprintf(why, whylen, "%s", gdrpy_last_error());
    return rc;
}

/* ---- handle helpers --------------------------------------------------- */

static inline uint64_t mk_handle(uint32_t idx, uint32_t gen)
{
    return ((uint64_t)gen << 32) | (uint64_t)(idx + 1);
}

static inline int split_handle(uint64_t h, uint32_t cap, uint32_t *idx, uint32_t *gen)
{
    uint32_t lo = (uint32_t)h;
    *idx = 0;
    *gen = 0;
    if (lo == 0 || lo > cap) return -1;
    *idx = lo - 1;
    *gen = (uint32_t)(h >> 32);
    return 0;
}

/* Enters the context (raises its slot's `users`); on error nothing is held.
 * Leave with ctx_leave(). */
static int ctx_enter_(gdrpy_ctx_t h, gp_ctx **out, const char *what, int hot);

static int ctx_enter(gdrpy_ctx_t h, gp_ctx **out, const char *what)
{
    return ctx_enter_(h, out, what, 0);
}

/* hot: the copy paths skip the getpid() system call; the fork generation
 * (bumped by the pthread_atfork child handler) is checked by every call. */
static int ctx_enter_(gdrpy_ctx_t h, gp_ctx **out, const char *what, int hot)
{
    uint32_t idx, gen;
    if (h == 0 || split_handle(h, CTX_MAX, &idx, &gen))
        return gp_err(GDRPY_EBADF, "%s: invalid context handle 0x%llx", what,
                      (unsigned long long)h);
    struct gp_ctx_slot *s = &g_slots[idx];
    atomic_fetch_add(&s->users, 1);
    gp_ctx *c = atomic_load(&s->ctx);
    /* `closing` before the generation: a context closed and its slot reused
     * in between shows either `closing` still set or the new generation */
    if (!c || atomic_load(&s->closing) || atomic_load(&s->gen) != gen) {
        int closing = c && atomic_load(&s->gen) == gen;
        atomic_fetch_sub_explicit(&s->users, 1, memory_order_release);
        return gp_err(GDRPY_EBADF, "%s: context 0x%llx is %s", what, (unsigned long long)h,
                      closing ? "being closed by another thread" : "closed or unknown");
    }
    if (c->fork_gen != gdrpy_fork_generation || (!hot && c->pid != getpid())) {
        pid_t opener = c->pid;
        atomic_fetch_sub_explicit(&s->users, 1, memory_order_release);
        return gp_err(GDRPY_EACCES,
                      "%s: the context was opened by process %d; this process (%d) "
                      "cannot use it (contexts, pins and mappings are not inherited "
                      "across fork: open a new context in the child)",
                      what, (int)opener, (int)getpid());
    }
    *out = c;
    return 0;
}

static inline void ctx_leave(gp_ctx *c)
{
    atomic_fetch_sub_explicit(&c->slot->users, 1, memory_order_release);
}

/* With ctx->lock held. */
static int pin_lookup(gp_ctx *c, gdrpy_pin_t h, gp_pin **out, const char *what)
{
    uint32_t idx, gen;
    if (h == 0 || split_handle(h, c->npins_cap, &idx, &gen) ||
        !c->pins[idx] || c->pin_gen[idx] != gen)
        return gp_err(GDRPY_EBADF, "%s: pin handle 0x%llx is unpinned or unknown", what,
                      (unsigned long long)h);
    *out = c->pins[idx];
    return 0;
}

/* ---- context ---------------------------------------------------------- */

static int open_with(const struct gp_backend *be, int device, gp_ctx **out)
{
    gp_ctx *c = calloc(1, sizeof *c);
    if (!c) return gp_err(GDRPY_ENOMEM, "out of memory");
    c->device = device;
    c->be = be;
    c->pid = getpid();
    c->fork_gen = gdrpy_fork_generation;
    pthread_mutex_init(&c->lock, NULL);
    c->coherent = -1;
    c->info.device = device;
    c->info.backend = be->id;
    snprintf(c->info.backend_name, sizeof c->info.backend_name, "%s", be->name);
    int rc = be->open(c);
    if (rc) {
        pthread_mutex_destroy(&c->lock);
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int gdrpy_open(int device, int backend, gdrpy_ctx_t *out)
{
    if (!out) return gp_err(GDRPY_EINVAL, "open: output pointer is NULL");
    *out = 0;
    if (device < 0) return gp_err(GDRPY_EINVAL, "open: device %d is negative", device);
    int noenv = backend >= 0 && (backend & GDRPY_OPEN_NO_ENV);
    if (noenv) backend &= ~GDRPY_OPEN_NO_ENV;
    int fork_faults = backend >= 0 && (backend & GDRPY_OPEN_FORK_FAULTS);
    if (fork_faults) backend &= ~GDRPY_OPEN_FORK_FAULTS;
    if (backend == GDRPY_BACKEND_AUTO && !noenv) {
        const char *env = getenv("GDRPY_BACKEND");
        if (env && *env) {
            int b = gdrpy_backend_from_name(env);
            if (b < 0)
                return gp_err(GDRPY_EINVAL,
                              "open: GDRPY_BACKEND=%s is not one of auto, sim, nvrm, "
                              "gdrdrv, dmabuf",
                              env);
            if (b != GDRPY_BACKEND_AUTO)
                gp_log(2, "GDRPY_BACKEND=%s selects the %s backend", env, env);
            backend = b;
        }
    }
    if (backend < 0 || backend >= GDRPY_BACKEND_COUNT_)
        return gp_err(GDRPY_EINVAL, "open: unknown backend %d", backend);

    gp_ctx *c = NULL;
    int rc;
    if (backend == GDRPY_BACKEND_AUTO) {
        static const int order[] = {GDRPY_BACKEND_NVRM, GDRPY_BACKEND_GDRDRV,
                                    GDRPY_BACKEND_DMABUF};
        char reasons[1024] = "";
        size_t used = 0;
        rc = GDRPY_ENXIO;
        for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
            const struct gp_backend *be = backend_by_id(order[i]);
            char why[256] = "";
            int prc = be->probe(device, why, sizeof why);
            if (prc == 0) {
                prc = open_with(be, device, &c);
                if (prc == 0) {
                    rc = 0;
                    break;
                }
                snprintf(why, sizeof why, "%s", gdrpy_last_error());
            }
            if (prc == GDRPY_ENODEV) rc = GDRPY_ENODEV;
            used += (size_t)snprintf(reasons + used, used < sizeof reasons ? sizeof reasons - used : 0,
                                     "%s%s: %s", used ? "; " : "", be->name, why);
            if (used >= sizeof reasons) used = sizeof reasons - 1;
        }
        if (rc) {
            return gp_err(rc, "open: no GPU backend works on device %d (%s). The sim "
                              "backend (host memory standing in for a GPU) is available "
                              "only when asked for: backend=sim or GDRPY_BACKEND=sim",
                          device, reasons);
        }
        gp_log(2, "auto selected the %s backend for device %d", c->be->name, device);
    } else {
        const struct gp_backend *be = backend_by_id(backend);
        char why[256] = "";
        rc = be->probe(device, why, sizeof why);
        if (rc)
            return gp_err(rc, "open: backend %s is unavailable on device %d: %s", be->name,
                          device, why[0] ? why : gdrpy_last_error());
        rc = open_with(be, device, &c);
        if (rc) return gp_err_prefix(rc, "open: backend %s on device %d", be->name, device);
    }

    pthread_mutex_lock(&g_tab_lock);
    uint32_t idx = CTX_MAX;
    for (uint32_t i = 0; i < CTX_MAX; i++)
        if (!atomic_load_explicit(&g_slots[i].ctx, memory_order_relaxed)) {
            idx = i;
            break;
        }
    if (idx == CTX_MAX) {
        pthread_mutex_unlock(&g_tab_lock);
        c->be->close(c);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return gp_err(GDRPY_ENOMEM, "open: too many open contexts (%u)", CTX_MAX);
    }
    struct gp_ctx_slot *s = &g_slots[idx];
    uint32_t gen = atomic_load(&s->gen) + 1;
    if (gen == 0) gen = 1;
    c->handle = mk_handle(idx, gen);
    c->slot = s;
    c->fork_faults = fork_faults;
    atomic_store(&s->gen, gen);
    atomic_store(&s->closing, 0);
    atomic_store(&s->ctx, c);
    pthread_mutex_unlock(&g_tab_lock);
    *out = c->handle;
    return 0;
}

/* With ctx->lock held: unmap (if mapped) and unpin, then free the slot. */
static int pin_teardown(gp_ctx *c, gp_pin *p, uint32_t idx)
{
    int rc = 0;
    if (p->map_base) {
        rc = c->be->unmap(c, p);
        p->map_base = NULL;
        p->map_len = 0;
    }
    int rc2 = c->be->unpin(c, p);
    if (!rc) rc = rc2;
    c->pins[idx] = NULL;
    c->npins--;
    free(p);
    return rc;
}

int gdrpy_close(gdrpy_ctx_t h)
{
    uint32_t idx, gen;
    if (h == 0 || split_handle(h, CTX_MAX, &idx, &gen))
        return gp_err(GDRPY_EBADF, "close: invalid context handle 0x%llx", (unsigned long long)h);
    struct gp_ctx_slot *s = &g_slots[idx];
    pthread_mutex_lock(&g_tab_lock);
    gp_ctx *c = atomic_load(&s->ctx);
    if (!c || atomic_load(&s->gen) != gen) {
        pthread_mutex_unlock(&g_tab_lock);
        return gp_err(GDRPY_EBADF, "close: context 0x%llx is closed or unknown",
                      (unsigned long long)h);
    }
    if (atomic_load(&s->closing)) {
        pthread_mutex_unlock(&g_tab_lock);
        return gp_err(GDRPY_EBADF, "close: context 0x%llx is being closed by another thread",
                      (unsigned long long)h);
    }
    if (c->fork_gen != gdrpy_fork_generation || c->pid != getpid()) {
        pthread_mutex_unlock(&g_tab_lock);
        return gp_err(GDRPY_EACCES, "close: the context was opened by process %d; this "
                                    "process (%d) cannot close it (not inherited across fork)",
                      (int)c->pid, (int)getpid());
    }
    atomic_store(&s->closing, 1);
    pthread_mutex_unlock(&g_tab_lock);
    /* New calls now fail; wait for those already inside. */
    int waited = 0;
    if (gp_wait_idle(&s->users, &waited)) {
        int n = atomic_load(&s->users);
        atomic_store(&s->closing, 0);
        return gp_err(GDRPY_EBUSY, "close: context 0x%llx (device %d, %s backend) still has %d "
                                   "call(s) in flight in other threads after %d ms (copies or "
                                   "stream waits); it stays open: close it again once they return",
                      (unsigned long long)h, c->device, c->be->name, n, waited);
    }
    pthread_mutex_lock(&g_tab_lock);
    /* `closing` stays set until the slot is reused (gdrpy_open clears it
     * after the new generation): a call that loaded the context pointer just
     * before it was cleared still sees `closing` and never touches the
     * context freed below */
    atomic_store(&s->ctx, NULL);
    pthread_mutex_unlock(&g_tab_lock);

    int first = 0;
    pthread_mutex_lock(&c->lock);
    for (uint32_t i = 0; i < c->npins_cap; i++) {
        gp_pin *p = c->pins[i];
        if (!p) continue;
        int r = pin_teardown(c, p, i);
        if (r && !first) first = r;
    }
    pthread_mutex_unlock(&c->lock);
    /* the state the layers above attached (gp_ctx_attach), newest first */
    while (c->nhooks) {
        struct gp_ctx_hook k = c->hooks[--c->nhooks];
        k.fn(k.arg);
    }
    c->be->close(c);
    pthread_mutex_destroy(&c->lock);
    free(c->pins);
    free(c->pin_gen);
    free(c);
    if (first) gp_log(3, "close: teardown reported %s: %s", gdrpy_strerror(first),
                      gdrpy_last_error());
    return 0;
}

int gdrpy_ctx_get_info(gdrpy_ctx_t h, gdrpy_ctx_info_t *out)
{
    if (!out) return gp_err(GDRPY_EINVAL, "ctx_get_info: output pointer is NULL");
    gp_ctx *c;
    int rc = ctx_enter(h, &c, "ctx_get_info");
    if (rc) return rc;
    *out = c->info;
    ctx_leave(c);
    return 0;
}

int gdrpy_ctx_live_objects(gdrpy_ctx_t h, uint64_t *out)
{
    if (!out) return gp_err(GDRPY_EINVAL, "ctx_live_objects: output pointer is NULL");
    gp_ctx *c;
    int rc = ctx_enter(h, &c, "ctx_live_objects");
    if (rc) return rc;
    pthread_mutex_lock(&c->lock);
    if (c->be->live_objects) {
        *out = c->be->live_objects(c);
    } else {
        uint64_t n = 0;
        for (uint32_t i = 0; i < c->npins_cap; i++)
            if (c->pins[i]) n += 1 + (c->pins[i]->map_base != NULL);
        *out = n;
    }
    pthread_mutex_unlock(&c->lock);
    ctx_leave(c);
    return 0;
}

static int pin_drain(gp_ctx *c, gp_pin *p, gdrpy_pin_t ph, const char *what);

/* ---- pins ------------------------------------------------------------- */

static int pin_slot(gp_ctx *c, uint32_t *idx)
{
    for (uint32_t i = 0; i < c->npins_cap; i++)
        if (!c->pins[i]) {
            *idx = i;
            return 0;
        }
    uint32_t ncap = c->npins_cap ? c->npins_cap * 2 : 16;
    if (ncap > (1u << 24)) return gp_err(GDRPY_ENOMEM, "pin: too many pins in one context");
    gp_pin **np = realloc(c->pins, ncap * sizeof *np);
    if (!np) return gp_err(GDRPY_ENOMEM, "pin: out of memory");
    c->pins = np;
    uint32_t *ng = realloc(c->pin_gen, ncap * sizeof *ng);
    if (!ng) return gp_err(GDRPY_ENOMEM, "pin: out of memory");
    c->pin_gen = ng;
    for (uint32_t i = c->npins_cap; i < ncap; i++) {
        np[i] = NULL;
        ng[i] = 0;
    }
    *idx = c->npins_cap;
    c->npins_cap = ncap;
    return 0;
}

/* Pin flag FORCE_PCIE, with GDRCopy's semantics: it asks for a mapping over
 * PCIe BAR1 where a coherent CPU-GPU link (C2C) could serve it, and GDRCopy's
 * driver refuses it on a GPU without such a link (the NVIDIA driver answers
 * its forced BAR1 request with -ENOTSUPP, which gdr_pin_buffer_v2 returns).
 * Where there is one it is accepted: every mapping gdrpy makes is a BAR1 one.
 * Coherence is asked once per context (the backend's hook, else CUDA's
 * PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, the attribute GDRCopy's own
 * tests take for "coherent"). */
static int force_pcie_ok(gp_ctx *c)
{
    int coh = atomic_load(&c->coherent);
    if (coh < 0) {
        int rc = c->be->coherent ? c->be->coherent(c, &coh)
                                 : gp_cuda_device_coherent(c->device, &coh);
        if (rc) return gp_err_prefix(rc, "pin flag FORCE_PCIE: is the GPU coherent?");
        atomic_store(&c->coherent, coh);
    }
    if (coh) return 0;
    return gp_err(GDRPY_ENOTSUPP, "pin flag FORCE_PCIE: device %d (%s) has no coherent CPU-GPU "
                                  "link, so there is no other path than PCIe to force; GDRCopy's "
                                  "driver refuses the flag here too (ENOTSUPP, 524): pin without it",
                  c->device, c->info.gpu_name);
}

int gdrpy_pin(gdrpy_ctx_t h, uint64_t addr, size_t size, unsigned flags, gdrpy_pin_t *out)
{
    if (!out) return gp_err(GDRPY_EINVAL, "pin: output pointer is NULL");
    *out = 0;
    if (addr == 0) return gp_err(GDRPY_EINVAL, "pin: address is NULL");
    if (size == 0) return gp_err(GDRPY_EINVAL, "pin: size is 0");
    if (addr + size < addr)
        return gp_err(GDRPY_EINVAL, "pin: range 0x%llx + %zu wraps around", (unsigned long long)addr, size);
    if (flags & ~GDRPY_PIN_FORCE_PCIE)
        return gp_err(GDRPY_EINVAL, "pin: unknown flags 0x%x", flags);
    gp_ctx *c;
    int rc = ctx_enter(h, &c, "pin");
    if (rc) return rc;
    if (flags & GDRPY_PIN_FORCE_PCIE) {
        rc = force_pcie_ok(c);
        if (rc) {
            ctx_leave(c);
            return rc;
        }
    }
    gp_pin *p = calloc(1, sizeof *p);
    if (!p) {
        ctx_leave(c);
        return gp_err(GDRPY_ENOMEM, "pin: out of memory");
    }
    p->addr = addr;
    p->size = size;
    p->flags = flags;
    /* The backend's pin runs without ctx->lock: its proofs and driver calls
     * may take milliseconds, and the copy paths (gdrpy_write, ...) look
     * their pin up under that lock.  The context stays alive meanwhile (this
     * call is inside it: gdrpy_close waits), and the pin is published in
     * the table only once it is complete. */
    rc = c->be->pin(c, p);
    if (!rc && !p->backed) p->backed = p->len;
    if (rc) {
        gp_err_prefix(rc, "pin of 0x%llx (+%zu bytes) on %s", (unsigned long long)addr, size,
                      c->be->name);
    } else if (p->va > addr || p->va + p->len < addr + size || p->len == 0 ||
               p->backed > p->len || addr >= p->va + p->backed ||
               gp_round_up(p->va + p->backed, GDRPY_GPU_PAGE_SIZE) < p->va + p->len) {
        /* the unbacked tail, if any, is the rest of the GPU page in which the
         * backed memory ends, and the request starts in backed memory */
        rc = gp_err(GDRPY_EIO, "pin: backend %s returned range 0x%llx+%llu (%llu bytes "
                               "backed) not covering 0x%llx+%zu as pins must (bug)",
                    c->be->name, (unsigned long long)p->va, (unsigned long long)p->len,
                    (unsigned long long)p->backed, (unsigned long long)addr, size);
        pthread_mutex_lock(&c->lock);
        c->be->unpin(c, p);
        pthread_mutex_unlock(&c->lock);
    }
    if (rc) {
        ctx_leave(c);
        free(p);
        return rc;
    }
    pthread_mutex_lock(&c->lock);
    uint32_t idx = 0;
    rc = pin_slot(c, &idx);
    if (rc) {
        c->be->unpin(c, p);
        pthread_mutex_unlock(&c->lock);
        ctx_leave(c);
        free(p);
        return rc;
    }
    if (!p->page_size) p->page_size = GDRPY_GPU_PAGE_SIZE;
    c->pin_gen[idx]++;
    if (c->pin_gen[idx] == 0) c->pin_gen[idx] = 1;
    p->handle = mk_handle(idx, c->pin_gen[idx]);
    c->pins[idx] = p;
    c->npins++;
    *out = p->handle;
    pthread_mutex_unlock(&c->lock);
    ctx_leave(c);
    return 0;
}

int gdrpy_unpin(gdrpy_ctx_t h, gdrpy_pin_t ph)
{
    gp_ctx *c;
    gp_pin *p;
    int rc = ctx_enter(h, &c, "unpin");
    if (rc) return rc;
    pthread_mutex_lock(&c->lock);
    rc = pin_lookup(c, ph, &p, "unpin");
    if (!rc && p->map_base)
        rc = gp_err(GDRPY_EBUSY, "unpin: pin 0x%llx is still mapped; unmap it first",
                    (unsigned long long)ph);
    if (!rc) rc = pin_drain(c, p, ph, "unpin");
    if (!rc) {
        uint32_t idx = (uint32_t)ph - 1;
        rc = pin_teardown(c, p, idx);
        if (rc) gp_err_prefix(rc, "unpin");
    }
    pthread_mutex_unlock(&c->lock);
    ctx_leave(c);
    return rc;
}

static void fill_info(gp_ctx *c, gp_pin *p, gdrpy_pin_info_t *o)
{
    memset(o, 0, sizeof *o);
    o->addr = p->addr;
    o->size = p->size;
    o->va = p->va;
    o->mapped_size = p->len;
    o->backed_size = p->backed;
    o->page_size = p->page_size;
    o->mapped = p->map_base != NULL;
    o->mapping_type = p->map_base ? (uint32_t)p->mapping_type : GDRPY_MAPPING_NONE;
    o->map_ptr = p->map_base;
    o->user_ptr = p->map_base ? (char *)p->map_base + (p->addr - p->va) : NULL;
    int flag = 0;
    if (c->be->get_invalidated && c->be->get_invalidated(c, p, &flag) == 0)
        o->invalidated = flag;
}

int gdrpy_pin_get_info(gdrpy_ctx_t h, gdrpy_pin_t ph, gdrpy_pin_info_t *out)
{
    if (!out) return gp_err(GDRPY_EINVAL, "pin_get_info: output pointer is NULL");
    gp_ctx *c;
    gp_pin *p;
    int rc = ctx_enter(h, &c, "pin_get_info");
    if (rc) return rc;
    pthread_mutex_lock(&c->lock);
    rc = pin_lookup(c, ph, &p, "pin_get_info");
    if (!rc) fill_info(c, p, out);
    pthread_mutex_unlock(&c->lock);
    ctx_leave(c);
    return rc;
}

int gdrpy_map(gdrpy_ctx_t h, gdrpy_pin_t ph, void **map_ptr, void **user_ptr)
{
    if (map_ptr) *map_ptr = NULL;
    if (user_ptr) *user_ptr = NULL;
    gp_ctx *c;
    gp_pin *p;
    int rc = ctx_enter(h, &c, "map");
    if (rc) return rc;
    pthread_mutex_lock(&c->lock);
    rc = pin_lookup(c, ph, &p, "map");
    if (!rc && p->map_base)
        rc = gp_err(GDRPY_EAGAIN, "map: pin 0x%llx is already mapped (one mapping per pin)",
                    (unsigned long long)ph);
    if (!rc && p->tearing)
        rc = gp_err(GDRPY_EBUSY, "map: pin 0x%llx is being unpinned by another thread",
                    (unsigned long long)ph);
    if (!rc) {
        rc = c->be->map(c, p);
        if (rc) {
            gp_err_prefix(rc, "map of pin 0x%llx (%llu bytes at 0x%llx) on %s",
                          (unsigned long long)ph, (unsigned long long)p->len,
                          (unsigned long long)p->va, c->be->name);
            p->map_base = NULL;
        } else if (!p->map_base || p->map_len < p->len) {
            if (p->map_base) c->be->unmap(c, p);
            p->map_base = NULL;
            rc = gp_err(GDRPY_EIO, "map: backend %s returned a short mapping (bug)", c->be->name);
        }
    }
    if (!rc) {
        if (map_ptr) *map_ptr = p->map_base;
        if (user_ptr) *user_ptr = (char *)p->map_base + (p->addr - p->va);
    }
    pthread_mutex_unlock(&c->lock);
    ctx_leave(c);
    return rc;
}

int gdrpy_unmap(gdrpy_ctx_t h, gdrpy_pin_t ph)
{
    gp_ctx *c;
    gp_pin *p;
    int rc = ctx_enter(h, &c, "unmap");
    if (rc) return rc;
    pthread_mutex_lock(&c->lock);
    rc = pin_lookup(c, ph, &p, "unmap");
    if (!rc && !p->map_base)
        rc = gp_err(GDRPY_EINVAL, "unmap: pin 0x%llx is not mapped", (unsigned long long)ph);
    if (!rc) rc = pin_drain(c, p, ph, "unmap");
    if (!rc) {
        p->tearing = 0;
        rc = c->be->unmap(c, p);
        p->map_base = NULL;
        p->map_len = 0;
        p->mapping_type = GDRPY_MAPPING_NONE;
        if (rc) gp_err_prefix(rc, "unmap");
    }
    pthread_mutex_unlock(&c->lock);
    ctx_leave(c);
    return rc;
}

/* ---- validated copies ------------------------------------------------- */

/* Enters ctx, finds pin, checks range, raises inflight. On success the
 * caller must call copy_end(). */
static int copy_begin(gdrpy_ctx_t h, gdrpy_pin_t ph, size_t offset, size_t n,
                      const void *buf, int need_map, const char *what,
                      gp_ctx **cout, gp_pin **pout)
{
    if (n && !buf) return gp_err(GDRPY_EINVAL, "%s: buffer pointer is NULL", what);
    gp_ctx *c;
    gp_pin *p;
    int rc = ctx_enter_(h, &c, what, 1);
    if (rc) return rc;
    pthread_mutex_lock(&c->lock);
    rc = pin_lookup(c, ph, &p, what);
    if (!rc && need_map && !p->map_base)
        rc = gp_err(GDRPY_EINVAL, "%s: pin 0x%llx is not mapped", what, (unsigned long long)ph);
    if (!rc && (offset > p->size || n > p->size - offset))
        rc = gp_err(GDRPY_ERANGE, "%s: [%zu, %zu+%zu) is outside the pinned %llu bytes", what,
                    offset, offset, n, (unsigned long long)p->size);
    if (!rc && p->addr + offset + n > p->va + p->backed)
        rc = gp_err(GDRPY_ERANGE, "%s: [%zu, %zu+%zu) reaches past byte %llu of the pin, where "
                                  "the memory behind the allocation ends (the rest of its last "
                                  "GPU page is not the allocation's: never touched)",
                    what, offset, offset, n,
                    (unsigned long long)(p->va + p->backed - p->addr));
    if (!rc && p->tearing)
        rc = gp_err(GDRPY_EBUSY, "%s: pin 0x%llx is being unmapped or unpinned by another "
                                 "thread",
                    what, (unsigned long long)ph);
    if (!rc) atomic_fetch_add_explicit(&p->inflight, 1, memory_order_relaxed);
    pthread_mutex_unlock(&c->lock);
    if (rc) {
        ctx_leave(c);
        return rc;
    }
    *cout = c;
    *pout = p;
    return 0;
}

static void copy_end(gp_ctx *c, gp_pin *p)
{
    atomic_fetch_sub_explicit(&p->inflight, 1, memory_order_release);
    ctx_leave(c);
}

/* With ctx->lock held and p looked up: marks p `tearing` and waits (lock
 * released meanwhile, bounded) until no copy through it is in flight.
 * 0: the caller proceeds with the lock held and must clear `tearing`;
 * else EBUSY/... with the lock held and `tearing` cleared. */
static int pin_drain(gp_ctx *c, gp_pin *p, gdrpy_pin_t ph, const char *what)
{
    if (p->tearing)
        return gp_err(GDRPY_EBUSY, "%s: pin 0x%llx is being unmapped or unpinned by another "
                                   "thread",
                      what, (unsigned long long)ph);
    if (atomic_load_explicit(&p->inflight, memory_order_acquire) == 0) return 0;
    p->tearing = 1;
    pthread_mutex_unlock(&c->lock);
    int waited = 0;
    int rc = gp_wait_idle(&p->inflight, &waited);
    pthread_mutex_lock(&c->lock);
    if (rc) {
        p->tearing = 0;
        return gp_err(GDRPY_EBUSY, "%s: %d copies through pin 0x%llx (0x%llx, %llu bytes) are "
                                   "still in flight in other threads after %d ms; nothing was changed",
                      what, atomic_load(&p->inflight), (unsigned long long)ph,
                      (unsigned long long)p->addr, (unsigned long long)p->size, waited);
    }
    return 0;
}

int gdrpy_write(gdrpy_ctx_t h, gdrpy_pin_t ph, size_t offset, const void *src, size_t n)
{
    gp_ctx *c;
    gp_pin *p;
    int rc = copy_begin(h, ph, offset, n, src, 1, "write", &c, &p);
    if (rc) return rc;
    if (n) gdrpy_copy_to_mapping((char *)p->map_base + (p->addr - p->va) + offset, src, n);
    copy_end(c, p);
    return 0;
}

int gdrpy_read(gdrpy_ctx_t h, gdrpy_pin_t ph, size_t offset, void *dst, size_t n)
{
    gp_ctx *c;
    gp_pin *p;
    int rc = copy_begin(h, ph, offset, n, dst, 1, "read", &c, &p);
    if (rc) return rc;
    if (n) gdrpy_copy_from_mapping(dst, (char *)p->map_base + (p->addr - p->va) + offset, n);
    copy_end(c, p);
    return 0;
}

int gdrpy_ce_write(gdrpy_ctx_t h, gdrpy_pin_t ph, size_t offset, const void *src, size_t n,
                   void *stream)
{
    gp_ctx *c;
    gp_pin *p;
    int rc = copy_begin(h, ph, offset, n, src, 0, "ce_write", &c, &p);
    if (rc) return rc;
    if (n) rc = c->be->dev_memcpy(c, 0, p->addr + offset, (void *)src, n, stream);
    copy_end(c, p);
    return rc;
}

int gdrpy_ce_read(gdrpy_ctx_t h, gdrpy_pin_t ph, size_t offset, void *dst, size_t n,
                  void *stream)
{
    gp_ctx *c;
    gp_pin *p;
    int rc = copy_begin(h, ph, offset, n, dst, 0, "ce_read", &c, &p);
    if (rc) return rc;
    if (n) {
        gp_pin_flush(p);
        rc = gp_ce_read_dev(c, p->addr + offset, dst, n, stream);
    }
    copy_end(c, p);
    return rc;
}

static int raw_memcpy(gdrpy_ctx_t h, int dir, uint64_t dptr, void *host, size_t n,
                      const char *what)
{
    if (n && (!host || !dptr)) return gp_err(GDRPY_EINVAL, "%s: NULL pointer", what);
    if (dptr + n < dptr) return gp_err(GDRPY_EINVAL, "%s: range wraps around", what);
    gp_ctx *c;
    int rc = ctx_enter(h, &c, what);
    if (rc) return rc;
    if (n) rc = c->be->dev_memcpy(c, dir, dptr, host, n, NULL);
    ctx_leave(c);
    return rc;
}

int gdrpy_memcpy_htod(gdrpy_ctx_t h, uint64_t dptr, const void *src, size_t n)
{
    return raw_memcpy(h, 0, dptr, (void *)src, n, "memcpy_htod");
}

int gdrpy_memcpy_dtoh(gdrpy_ctx_t h, void *dst, uint64_t dptr, size_t n)
{
    return raw_memcpy(h, 1, dptr, dst, n, "memcpy_dtoh");
}

int gdrpy_stream_synchronize(gdrpy_ctx_t h, void *stream)
{
    gp_ctx *c;
    int rc = ctx_enter(h, &c, "stream_synchronize");
    if (rc) return rc;
    if (c->be->is_real) {
        gp_cuda_scope s;
        rc = gp_cuda_enter(c->device, &s);
        if (!rc) {
            CUresult r = gp_cu.StreamSynchronize((CUstream)stream);
            gp_cuda_leave(&s);
            if (r) rc = gp_cuda_err(0, r, "cuStreamSynchronize", "stream_synchronize");
        }
    }
    ctx_leave(c);
    return rc;
}

/* ---- for the layers above (internal.h) --------------------------------- */

/* Before the copy engine reads GPU memory: stores made through the pin's
 * mapping (a put, gdr_copy_to_mapping) are posted PCIe writes that may still
 * be on their way to GPU memory when the engine's read starts, and nothing
 * orders the engine after them.  So: the store fence (the CPU's
 * write-combining buffers drain onto the bus), then one load through the
 * mapping.  A PCIe read request may not pass posted writes in the same
 * direction, so when its completion has returned, every earlier write
 * through the mapping has reached GPU memory, and the engine's read sees
 * it.  One BAR1 read (~1 us) on a path that costs >= 7 us. */
void gp_pin_flush(gp_pin *p)
{
    if (!p->map_base) return;
    gp_fence_after_stores();
    (void)*(const volatile uint64_t *)gp_round_up((uintptr_t)p->map_base, 8);
    gp_fence_after_loads();
}

int gp_ce_read_dev(gp_ctx *c, uint64_t dptr, void *dst, size_t n, void *stream)
{
    if (stream || !c->be->is_real) return c->be->dev_memcpy(c, 1, dptr, dst, n, stream);
    return gp_cuda_private_copy(c->device, 1, dptr, dst, n);
}

int gp_copy_begin(gdrpy_ctx_t h, gdrpy_pin_t ph, size_t offset, size_t n, const void *buf,
                  int need_map, const char *what, gp_ctx **c, gp_pin **p)
{
    return copy_begin(h, ph, offset, n, buf, need_map, what, c, p);
}

void gp_copy_end(gp_ctx *c, gp_pin *p) { copy_end(c, p); }

int gp_ctx_enter(gdrpy_ctx_t h, gp_ctx **c, const char *what) { return ctx_enter(h, c, what); }

void gp_ctx_leave(gp_ctx *c) { ctx_leave(c); }

int gp_ctx_attach(gp_ctx *c, void (*fn)(void *arg), void *arg)
{
    int rc = 0;
    pthread_mutex_lock(&c->lock);
    if (c->nhooks == GP_CTX_HOOKS)
        rc = gp_err(GDRPY_ENOMEM, "context 0x%llx already has %d teardown hooks",
                    (unsigned long long)c->handle, GP_CTX_HOOKS);
    else
        c->hooks[c->nhooks++] = (struct gp_ctx_hook){fn, arg};
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void *gp_ctx_attached(gp_ctx *c, void (*fn)(void *arg))
{
    void *arg = NULL;
    pthread_mutex_lock(&c->lock);
    for (unsigned i = 0; i < c->nhooks && !arg; i++)
        if (c->hooks[i].fn == fn) arg = c->hooks[i].arg;
    pthread_mutex_unlock(&c->lock);
    return arg;
}


int gp_chan_pin_hold(gdrpy_ctx_t h, gdrpy_pin_t ph, int hold, gdrpy_pin_info_t *info,
                     int *device, int *is_real)
{
    gp_ctx *c;
    gp_pin *p;
    int rc = ctx_enter(h, &c, hold > 0 ? "chan_create" : "chan_destroy");
    if (rc) return rc;
    pthread_mutex_lock(&c->lock);
    rc = pin_lookup(c, ph, &p, hold > 0 ? "chan_create" : "chan_destroy");
    if (!rc && hold > 0) {
        if (!p->map_base)
            rc = gp_err(GDRPY_EINVAL, "chan_create: pin 0x%llx is not mapped",
                        (unsigned long long)ph);
        else if (p->tearing)
            rc = gp_err(GDRPY_EBUSY, "chan_create: pin 0x%llx is being unmapped or unpinned "
                                     "by another thread",
                        (unsigned long long)ph);
        if (!rc) {
            atomic_fetch_add_explicit(&p->inflight, 1, memory_order_relaxed);
            fill_info(c, p, info);
            *device = c->device;
            *is_real = c->be->is_real;
        }
        if (!rc) p->chan_holds++;
    } else if (!rc && p->chan_holds > 0) {
        p->chan_holds--;
        atomic_fetch_sub_explicit(&p->inflight, 1, memory_order_release);
    } else if (!rc) {
        /* a hold never raised: dropping one would let an unmap race a copy */
        rc = gp_err(GDRPY_EINVAL, "chan_destroy: pin 0x%llx holds no channel: nothing to "
                                  "release",
                    (unsigned long long)ph);
    }
    pthread_mutex_unlock(&c->lock);
    ctx_leave(c);
    return rc;
}
