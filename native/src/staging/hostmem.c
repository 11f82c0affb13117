/*
 * hostmem.c - page-locked host memory: allocations, registrations of a
 * caller's ranges, and classification of host ranges (gdrpy_host.h).
 *
 * One process-wide table (`h_list`, guarded by `h_lock`) holds every live
 * allocation and registration, so that free/unregister accept only what was
 * handed out (a double free is EINVAL, never a crash) and so that
 * classification knows gdrpy's own ranges without asking the driver.  An
 * entry leaves the table in the same critical section that frees or
 * unregisters it: nothing about a range outlives it.
 *
 * On a real backend each entry keeps its device's primary CUDA context
 * retained (cuMemHostAlloc memory belongs to the context that allocated it),
 * so an allocation stays valid after the gdrpy context is closed.  On sim,
 * "page-locked" memory is anonymous pre-faulted memory and a registration
 * only records the range: the pipeline and lifetime logic are the same.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"
#include "cudadrv.h"
#include "gdrpy_host.h"

#define H_MAX_BYTES (1ull << 40)

typedef struct hrange {
    struct hrange *next;
    uintptr_t base;
    size_t size;   /* requested bytes */
    size_t maplen; /* sim allocations: bytes mmap'ed */
    int kind;      /* GDRPY_HOST_PINNED or GDRPY_HOST_REGISTERED */
    int sim;
    int device;
} hrange;

static pthread_mutex_t h_lock = PTHREAD_MUTEX_INITIALIZER;
static hrange *h_list;
static uint64_t h_count;

static void h_atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    memcpy(&h_lock, &fresh, sizeof fresh);
}

__attribute__((constructor)) static void h_init(void)
{
    pthread_atfork(NULL, NULL, h_atfork_child);
}

/* Device and realness of a context (validates the handle). */
static int ctx_target(gdrpy_ctx_t ctx, const char *what, int *device, int *sim)
{
    gdrpy_ctx_info_t info;
    int rc = gdrpy_ctx_get_info(ctx, &info);
    if (rc) return gp_err_prefix(rc, "%s", what);
    *device = info.device;
    *sim = info.backend == GDRPY_BACKEND_SIM;
    return 0;
}

/* Retains the primary context of `device` and makes it current; on success
 * the caller pops it with CtxPopCurrent and keeps (or releases) the retain. */
static int primary_push(int device, const char *what)
{
    int rc = gp_cuda_load(NULL, 0);
    if (rc) return gp_err_prefix(rc, "%s", what);
    rc = gp_cuda_check_device(device);
    if (rc) return gp_err_prefix(rc, "%s", what);
    CUdevice d;
    CUcontext pc = NULL;
    CUresult r = gp_cu.DeviceGet(&d, device);
    if (!r) r = gp_cu.DevicePrimaryCtxRetain(&pc, d);
    if (r) return gp_cuda_err(0, r, "cuDevicePrimaryCtxRetain", "%s on device %d", what, device);
    r = gp_cu.CtxPushCurrent(pc);
    if (r) {
        gp_cu.DevicePrimaryCtxRelease(d);
        return gp_cuda_err(0, r, "cuCtxPushCurrent", "%s on device %d", what, device);
    }
    return 0;
}

static void primary_pop(void)
{
    CUcontext c;
    gp_cu.CtxPopCurrent(&c);
}

static void primary_release(int device)
{
    CUdevice d;
    if (gp_cu.DeviceGet(&d, device) == CUDA_SUCCESS) gp_cu.DevicePrimaryCtxRelease(d);
}

/* With h_lock held: the entry overlapping [p, p+n), if any. */
static hrange *h_overlap_locked(uintptr_t p, size_t n)
{
    for (hrange *e = h_list; e; e = e->next)
        if (p < e->base + e->size && e->base < p + n) return e;
    return NULL;
}

static void h_insert_locked(hrange *e)
{
    e->next = h_list;
    h_list = e;
    h_count++;
}

/* With h_lock held: unlinks and returns the entry starting at p of `kind`. */
static hrange *h_take_locked(uintptr_t p, int kind)
{
    for (hrange **pp = &h_list; *pp; pp = &(*pp)->next) {
        hrange *e = *pp;
        if (e->base == p && e->kind == kind) {
            *pp = e->next;
            h_count--;
            return e;
        }
    }
    return NULL;
}

uint64_t gdrpy_host_live(void)
{
    pthread_mutex_lock(&h_lock);
    uint64_t n = h_count;
    pthread_mutex_unlock(&h_lock);
    return n;
}

/* ---- allocations ------------------------------------------------------ */

int gdrpy_host_alloc(gdrpy_ctx_t ctx, size_t size, void **out)
{
    if (!out) return gp_err(GDRPY_EINVAL, "host_alloc: output pointer is NULL");
    *out = NULL;
    if (size == 0) return gp_err(GDRPY_EINVAL, "host_alloc: size is 0");
    if (size > H_MAX_BYTES)
        return gp_err(GDRPY_EINVAL, "host_alloc: size %zu is larger than 1 TiB", size);
    int device = 0, sim = 0;
    int rc = ctx_target(ctx, "host_alloc", &device, &sim);
    if (rc) return rc;
    hrange *e = calloc(1, sizeof *e);
    if (!e) return gp_err(GDRPY_ENOMEM, "host_alloc: out of memory");
    e->size = size;
    e->kind = GDRPY_HOST_PINNED;
    e->sim = sim;
    e->device = device;
    void *p = NULL;
    if (sim) {
        size_t pg = (size_t)sysconf(_SC_PAGESIZE);
        e->maplen = gp_round_up(size, pg);
        p = mmap(NULL, e->maplen, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            free(e);
            return gp_err(GDRPY_ENOMEM, "host_alloc: mmap of %zu bytes failed: %s", size,
                          strerror(err));
        }
    } else {
        rc = primary_push(device, "host_alloc");
        if (rc) {
            free(e);
            return rc;
        }
        if (!gp_cu.MemHostAlloc || !gp_cu.MemFreeHost) {
            primary_pop();
            primary_release(device);
            free(e);
            return gp_err(GDRPY_ENOTSUP, "host_alloc: libcuda lacks cuMemHostAlloc");
        }
        CUresult r = gp_cu.MemHostAlloc(&p, size, CU_MEMHOSTALLOC_PORTABLE);
        primary_pop();
        if (r) {
            primary_release(device);
            free(e);
            return gp_cuda_err(0, r, "cuMemHostAlloc", "host_alloc of %zu bytes on device %d",
                               size, device);
        }
        /* the retain stays with the allocation */
    }
    e->base = (uintptr_t)p;
    pthread_mutex_lock(&h_lock);
    h_insert_locked(e);
    pthread_mutex_unlock(&h_lock);
    *out = p;
    return 0;
}

int gdrpy_host_free(void *p)
{
    if (!p) return gp_err(GDRPY_EINVAL, "host_free: pointer is NULL");
    pthread_mutex_lock(&h_lock);
    hrange *e = h_take_locked((uintptr_t)p, GDRPY_HOST_PINNED);
    pthread_mutex_unlock(&h_lock);
    if (!e)
        return gp_err(GDRPY_EINVAL, "host_free: %p is not the start of a live gdrpy host "
                                    "allocation (freed twice?)",
                      p);
    int rc = 0;
    if (e->sim) {
        munmap(p, e->maplen);
    } else {
        rc = primary_push(e->device, "host_free");
        if (!rc) {
            CUresult r = gp_cu.MemFreeHost(p);
            primary_pop();
            primary_release(e->device); /* the push's retain */
            if (r) rc = gp_cuda_err(0, r, "cuMemFreeHost", "host_free of %p", p);
        }
        if (!rc) primary_release(e->device); /* the allocation's */
        else gp_log(3, "host_free: %s (the primary context stays retained)", gdrpy_last_error());
    }
    free(e);
    return rc;
}

/* ---- registrations ---------------------------------------------------- */

int gdrpy_host_register(gdrpy_ctx_t ctx, void *p, size_t size)
{
    if (!p) return gp_err(GDRPY_EINVAL, "host_register: pointer is NULL");
    if (size == 0) return gp_err(GDRPY_EINVAL, "host_register: size is 0");
    if ((uintptr_t)p + size < (uintptr_t)p)
        return gp_err(GDRPY_EINVAL, "host_register: range %p + %zu wraps around", p, size);
    int device = 0, sim = 0;
    int rc = ctx_target(ctx, "host_register", &device, &sim);
    if (rc) return rc;
    hrange *e = calloc(1, sizeof *e);
    if (!e) return gp_err(GDRPY_ENOMEM, "host_register: out of memory");
    e->base = (uintptr_t)p;
    e->size = size;
    e->kind = GDRPY_HOST_REGISTERED;
    e->sim = sim;
    e->device = device;
    /* The table lock is held across the driver call so that two threads
     * cannot register overlapping ranges at once. */
    pthread_mutex_lock(&h_lock);
    hrange *o = h_overlap_locked(e->base, size);
    if (o) {
        pthread_mutex_unlock(&h_lock);
        free(e);
        return gp_err(GDRPY_EBUSY, "host_register: [%p, +%zu) overlaps a live gdrpy %s at "
                                   "[0x%llx, +%zu)",
                      p, size,
                      o->kind == GDRPY_HOST_PINNED ? "host allocation" : "registration",
                      (unsigned long long)o->base, o->size);
    }
    if (!sim) {
        rc = primary_push(device, "host_register");
        if (!rc && !gp_cu.MemHostRegister) {
            primary_pop();
            primary_release(device);
            rc = gp_err(GDRPY_ENOTSUP, "host_register: libcuda lacks cuMemHostRegister");
        } else if (!rc) {
            CUresult r = gp_cu.MemHostRegister(p, size, CU_MEMHOSTREGISTER_PORTABLE);
            primary_pop();
            if (r) {
                primary_release(device);
                rc = gp_cuda_err(r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED ? GDRPY_EBUSY
                                 : r == CUDA_ERROR_NOT_SUPPORTED                ? GDRPY_ENOTSUP
                                                                                : 0,
                                 r, "cuMemHostRegister", "host_register of [%p, +%zu) on "
                                                         "device %d%s",
                                 p, size, device,
                                 r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED ? " (part of it is page-locked already)" : "");
            }
        }
    }
    if (!rc) h_insert_locked(e);
    pthread_mutex_unlock(&h_lock);
    if (rc) free(e);
    return rc;
}

int gdrpy_host_unregister(void *p)
{
    if (!p) return gp_err(GDRPY_EINVAL, "host_unregister: pointer is NULL");
    pthread_mutex_lock(&h_lock);
    hrange *e = h_take_locked((uintptr_t)p, GDRPY_HOST_REGISTERED);
    pthread_mutex_unlock(&h_lock);
    if (!e)
        return gp_err(GDRPY_EINVAL, "host_unregister: %p is not the start of a live gdrpy "
                                    "registration (unregistered twice?)",
                      p);
    int rc = 0;
    if (!e->sim) {
        rc = primary_push(e->device, "host_unregister");
        if (!rc) {
            CUresult r = gp_cu.MemHostUnregister(p);
            primary_pop();
            if (r) rc = gp_cuda_err(0, r, "cuMemHostUnregister", "host_unregister of %p", p);
            primary_release(e->device);
        }
        if (!rc) primary_release(e->device);
    }
    free(e);
    return rc;
}

/* ---- classification --------------------------------------------------- */

static int driver_locked(int device, uintptr_t p, size_t n, int *locked)
{
    *locked = 0;
    gp_cuda_scope sc;
    int rc = gp_cuda_enter(device, &sc);
    if (rc) return rc;
    int attrs[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_BUFFER_ID};
    unsigned type[2] = {0, 0};
    unsigned long long id[2] = {0, 0};
    uintptr_t at[2] = {p, p + n - 1};
    unsigned nattr = 2;
    for (int i = 0; i < 2; i++) {
        void *data[2] = {&type[i], &id[i]};
        /* Unknown (pageable) addresses give CUDA_SUCCESS and zeroed values. */
        CUresult r = gp_cu.PointerGetAttributes(nattr, attrs, data, (CUdeviceptr)at[i]);
        if (r && nattr == 2) {
            /* a driver that cannot report the buffer id of host memory:
             * compare the memory types only */
            nattr = 1;
            id[0] = id[1] = 0;
            i = -1;
            continue;
        }
        if (r) {
            type[i] = 0;
            break;
        }
        if (type[i] != CU_MEMORYTYPE_HOST) break;
    }
    gp_cuda_leave(&sc);
    *locked = type[0] == CU_MEMORYTYPE_HOST && type[1] == CU_MEMORYTYPE_HOST && id[0] == id[1];
    return 0;
}

static int table_kind(uintptr_t a, size_t size)
{
    int found = -1;
    pthread_mutex_lock(&h_lock);
    for (hrange *e = h_list; e; e = e->next)
        if (a >= e->base && a - e->base < e->size && size <= e->size - (a - e->base)) {
            found = e->kind;
            break;
        }
    pthread_mutex_unlock(&h_lock);
    return found;
}

int gdrpy_host_kind_known(const void *p, size_t size)
{
    uintptr_t a = (uintptr_t)p;
    if (!p || size == 0 || a + size < a) return GDRPY_HOST_PAGEABLE;
    int k = table_kind(a, size);
    return k < 0 ? GDRPY_HOST_PAGEABLE : k;
}

int gdrpy_host_kind(gdrpy_ctx_t ctx, const void *p, size_t size, int *kind)
{
    if (!kind) return gp_err(GDRPY_EINVAL, "host_kind: output pointer is NULL");
    *kind = GDRPY_HOST_PAGEABLE;
    if (!p || size == 0) return 0;
    uintptr_t a = (uintptr_t)p;
    if (a + size < a) return gp_err(GDRPY_EINVAL, "host_kind: range wraps around");
    int found = table_kind(a, size);
    if (found >= 0) {
        *kind = found;
        return 0;
    }
    int device = 0, sim = 0;
    int rc = ctx_target(ctx, "host_kind", &device, &sim);
    if (rc) return rc;
    if (sim) return 0;
    int locked = 0;
    rc = driver_locked(device, a, size, &locked);
    if (rc) return gp_err_prefix(rc, "host_kind");
    if (locked) *kind = GDRPY_HOST_LOCKED;
    return 0;
}
