/*
 * core.c - contexts, pins and mappings in handle tables; argument
 * validation; lifetimes; fork detection; backend selection.
 *
 * Locking: `g_lock` (rwlock) guards the context table.  Every public call
 * holds it for reading for its whole duration, so a context cannot be freed
 * under a caller; gdrpy_close() takes it for writing after marking the
 * context closed.  `ctx->lock` guards the pin table and pin state.  Validated
 * copies (gdrpy_write/read/ce_*) raise pin->inflight under ctx->lock, copy
 * without it, and drop it; unmap/unpin refuse (EBUSY) while copies are in
 * flight.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "cudadrv.h"
#include "gdrpy_channel.h"

volatile unsigned gdrpy_fork_generation = 0;

#define CTX_MAX 1024u

static pthread_rwlock_t g_lock = PTHREAD_RWLOCK_INITIALIZER;
static gp_ctx *g_ctx[CTX_MAX];
static uint32_t g_ctx_gen[CTX_MAX];

static void on_fork_child(void)
{
    gdrpy_fork_generation++;
    /* The child inherits the lock states of the forking thread only; the
     * table is never used from the child (every call fails with EACCES),
     * but reinitialise the lock so that the check itself cannot block. */
    pthread_rwlock_t fresh = PTHREAD_RWLOCK_INITIALIZER;
    memcpy(&g_lock, &fresh, sizeof fresh);
}

__attribute__((constructor)) static void gp_core_init(void)
{
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
    if (!why || whylen == 0) { why = dummy; whylen = sizeof dummy; }
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

/* Read-locks g_lock and returns the context; on error nothing is held. */
static int ctx_enter(gdrpy_ctx_t h, gp_ctx **out, const char *what)
{
    uint32_t idx, gen;
    if (h == 0 || split_handle(h, CTX_MAX, &idx, &gen))
        return gp_err(GDRPY_EBADF, "%s: invalid context handle 0x%llx", what,
                      (unsigned long long)h);
    pthread_rwlock_rdlock(&g_lock);
    gp_ctx *c = g_ctx[idx];
    if (!c || g_ctx_gen[idx] != gen || c->handle != h) {
        pthread_rwlock_unlock(&g_lock);
        return gp_err(GDRPY_EBADF, "%s: context 0x%llx is closed or unknown", what,
                      (unsigned long long)h);
    }
    if (c->fork_gen != gdrpy_fork_generation || c->pid != getpid()) {
        pthread_rwlock_unlock(&g_lock);
        return gp_err(GDRPY_EACCES,
                      "%s: the context was opened by process %d; this process (%d) "
                      "cannot use it (contexts, pins and mappings are not inherited "
                      "across fork: open a new context in the child)",
                      what, (int)c->pid, (int)getpid());
    }
    *out = c;
    return 0;
}

static inline void ctx_leave(void) { pthread_rwlock_unlock(&g_lock); }

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
    if (backend == GDRPY_BACKEND_AUTO) {
        const char *env = getenv("GDRPY_BACKEND");
        if (env && *env) {
            int b = gdrpy_backend_from_name(env);
            if (b < 0)
                return gp_err(GDRPY_EINVAL,
                              "open: GDRPY_BACKEND=%s is not one of auto, sim, nvrm, "
                              "gdrdrv, dmabuf", env);
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
                if (prc == 0) { rc = 0; break; }
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

    pthread_rwlock_wrlock(&g_lock);
    uint32_t idx = CTX_MAX;
    for (uint32_t i = 0; i < CTX_MAX; i++)
        if (!g_ctx[i]) { idx = i; break; }
    if (idx == CTX_MAX) {
        pthread_rwlock_unlock(&g_lock);
        c->be->close(c);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return gp_err(GDRPY_ENOMEM, "open: too many open contexts (%u)", CTX_MAX);
    }
    g_ctx_gen[idx]++;
    if (g_ctx_gen[idx] == 0) g_ctx_gen[idx] = 1;
    c->handle = mk_handle(idx, g_ctx_gen[idx]);
    g_ctx[idx] = c;
    pthread_rwlock_unlock(&g_lock);
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
    gp_ctx *c;
    int rc = ctx_enter(h, &c, "close");
    if (rc) return rc;
    ctx_leave();
    /* Take the table for writing: no call is inside this context now. */
    pthread_rwlock_wrlock(&g_lock);
    uint32_t idx, gen;
    split_handle(h, CTX_MAX, &idx, &gen);
    if (g_ctx[idx] != c || c->handle != h) {
        pthread_rwlock_unlock(&g_lock);
        return gp_err(GDRPY_EBADF, "close: context 0x%llx was closed concurrently",
                      (unsigned long long)h);
    }
    g_ctx[idx] = NULL;
    pthread_rwlock_unlock(&g_lock);

    int first = 0;
    pthread_mutex_lock(&c->lock);
    for (uint32_t i = 0; i < c->npins_cap; i++) {
        gp_pin *p = c->pins[i];
        if (!p) continue;
        int r = pin_teardown(c, p, i);
        if (r && !first) first = r;
    }
    pthread_mutex_unlock(&c->lock);
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
    ctx_leave();
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
    ctx_leave();
    return 0;
}

/* ---- pins ------------------------------------------------------------- */

static int pin_slot(gp_ctx *c, uint32_t *idx)
{
    for (uint32_t i = 0; i < c->npins_cap; i++)
        if (!c->pins[i]) { *idx = i; return 0; }
    uint32_t ncap = c->npins_cap ? c->npins_cap * 2 : 16;
    if (ncap > (1u << 24)) return gp_err(GDRPY_ENOMEM, "pin: too many pins in one context");
    gp_pin **np = realloc(c->pins, ncap * sizeof *np);
    if (!np) return gp_err(GDRPY_ENOMEM, "pin: out of memory");
    c->pins = np;
    uint32_t *ng = realloc(c->pin_gen, ncap * sizeof *ng);
    if (!ng) return gp_err(GDRPY_ENOMEM, "pin: out of memory");
    c->pin_gen = ng;
    for (uint32_t i = c->npins_cap; i < ncap; i++) { np[i] = NULL; ng[i] = 0; }
    *idx = c->npins_cap;
    c->npins_cap = ncap;
    return 0;
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
    gp_pin *p = calloc(1, sizeof *p);
    if (!p) { ctx_leave(); return gp_err(GDRPY_ENOMEM, "pin: out of memory"); }
    p->addr = addr;
    p->size = size;
    p->flags = flags;
    pthread_mutex_lock(&c->lock);
    uint32_t idx = 0;
    rc = pin_slot(c, &idx);
    if (!rc) {
        rc = c->be->pin(c, p);
        if (rc) {
            gp_err_prefix(rc, "pin of 0x%llx (+%zu bytes) on %s", (unsigned long long)addr, size,
                          c->be->name);
        } else if (p->va > addr || p->va + p->len < addr + size || p->len == 0) {
            c->be->unpin(c, p);
            rc = gp_err(GDRPY_EIO, "pin: backend %s returned range 0x%llx+%llu not covering "
                        "0x%llx+%zu (bug)", c->be->name, (unsigned long long)p->va,
                        (unsigned long long)p->len, (unsigned long long)addr, size);
        }
    }
    if (rc) {
        pthread_mutex_unlock(&c->lock);
        ctx_leave();
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
    ctx_leave();
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
    if (!rc && p->inflight)
        rc = gp_err(GDRPY_EBUSY, "unpin: %d copies through pin 0x%llx are in flight",
                    p->inflight, (unsigned long long)ph);
    if (!rc) {
        uint32_t idx = (uint32_t)ph - 1;
        rc = pin_teardown(c, p, idx);
        if (rc) gp_err_prefix(rc, "unpin");
    }
    pthread_mutex_unlock(&c->lock);
    ctx_leave();
    return rc;
}

static void fill_info(gp_ctx *c, gp_pin *p, gdrpy_pin_info_t *o)
{
    memset(o, 0, sizeof *o);
    o->addr = p->addr;
    o->size = p->size;
    o->va = p->va;
    o->mapped_size = p->len;
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
    ctx_leave();
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
    ctx_leave();
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
    if (!rc && p->inflight)
        rc = gp_err(GDRPY_EBUSY, "unmap: %d copies through pin 0x%llx are in flight",
                    p->inflight, (unsigned long long)ph);
    if (!rc) {
        rc = c->be->unmap(c, p);
        p->map_base = NULL;
        p->map_len = 0;
        p->mapping_type = GDRPY_MAPPING_NONE;
        if (rc) gp_err_prefix(rc, "unmap");
    }
    pthread_mutex_unlock(&c->lock);
    ctx_leave();
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
    int rc = ctx_enter(h, &c, what);
    if (rc) return rc;
    pthread_mutex_lock(&c->lock);
    rc = pin_lookup(c, ph, &p, what);
    if (!rc && need_map && !p->map_base)
        rc = gp_err(GDRPY_EINVAL, "%s: pin 0x%llx is not mapped", what, (unsigned long long)ph);
    if (!rc && (offset > p->size || n > p->size - offset))
        rc = gp_err(GDRPY_ERANGE, "%s: [%zu, %zu+%zu) is outside the pinned %llu bytes", what,
                    offset, offset, n, (unsigned long long)p->size);
    if (!rc) p->inflight++;
    pthread_mutex_unlock(&c->lock);
    if (rc) { ctx_leave(); return rc; }
    *cout = c;
    *pout = p;
    return 0;
}

static void copy_end(gp_ctx *c, gp_pin *p)
{
    pthread_mutex_lock(&c->lock);
    p->inflight--;
    pthread_mutex_unlock(&c->lock);
    ctx_leave();
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
    if (n) rc = c->be->dev_memcpy(c, 1, p->addr + offset, dst, n, stream);
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
    ctx_leave();
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
    ctx_leave();
    return rc;
}

/* ---- for the channel (src/channel/) ----------------------------------- */

/* hold > 0: checks that `ph` is a mapped pin of `h`, raises its in-flight
 * count (unmap/unpin then fail with EBUSY) and fills *info, *device and
 * *is_real.  hold <= 0: drops that count again (if the pin still exists). */
GP_HIDDEN int gp_chan_pin_hold(gdrpy_ctx_t h, gdrpy_pin_t ph, int hold, gdrpy_pin_info_t *info,
                               int *device, int *is_real);
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
        if (!rc) {
            p->inflight++;
            fill_info(c, p, info);
            *device = c->device;
            *is_real = c->be->is_real;
        }
    } else if (!rc && p->inflight > 0) {
        p->inflight--;
    }
    pthread_mutex_unlock(&c->lock);
    ctx_leave();
    return rc;
}

/* src/channel/wc.c */
GP_HIDDEN void gp_wc_store_nofence(void *dst, const void *src, size_t n);
GP_HIDDEN void gp_wc_fence(void);

int gdrpy_writev(gdrpy_ctx_t h, gdrpy_pin_t ph, const gdrpy_iov_t *iov, size_t n)
{
    if (n && !iov) return gp_err(GDRPY_EINVAL, "writev: iov is NULL");
    for (size_t i = 0; i < n; i++)
        if (iov[i].len && !iov[i].buf)
            return gp_err(GDRPY_EINVAL, "writev: iov[%zu].buf is NULL", i);
    gp_ctx *c;
    gp_pin *p;
    int rc = ctx_enter(h, &c, "writev");
    if (rc) return rc;
    pthread_mutex_lock(&c->lock);
    rc = pin_lookup(c, ph, &p, "writev");
    if (!rc && !p->map_base)
        rc = gp_err(GDRPY_EINVAL, "writev: pin 0x%llx is not mapped", (unsigned long long)ph);
    for (size_t i = 0; !rc && i < n; i++)
        if (iov[i].offset > p->size || iov[i].len > p->size - iov[i].offset)
            rc = gp_err(GDRPY_ERANGE, "writev: iov[%zu] [%zu, %zu+%zu) is outside the pinned "
                        "%llu bytes; nothing was written", i, iov[i].offset, iov[i].offset,
                        iov[i].len, (unsigned long long)p->size);
    if (!rc) p->inflight++;
    pthread_mutex_unlock(&c->lock);
    if (rc) { ctx_leave(); return rc; }
    char *base = (char *)p->map_base + (p->addr - p->va);
    for (size_t i = 0; i < n; i++)
        if (iov[i].len) gp_wc_store_nofence(base + iov[i].offset, iov[i].buf, iov[i].len);
    gp_wc_fence();   /* the one store fence */
    copy_end(c, p);
    return 0;
}
