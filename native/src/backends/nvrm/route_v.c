/*
 * route_v.c - nvrm backend, route V: VMM memory created without an
 * exportable handle type (GDRCopy's own tests allocate so), and
 * stream-ordered pool memory (cuMemAllocAsync, cuMemPoolCreate pools; the
 * allocators of CuPy's MemoryAsyncPool, PyTorch's cudaMallocAsync backend and
 * RMM's cuda_async_memory_resource sit on these).
 *
 * The physical memory behind such a mapping is an RM video-memory object in
 * CUDA's RM client of this process; CUDA hands out no export for it.  Per pin:
 *  1. VMM: cuMemRetainAllocationHandle; if cuMemExportToShareableHandle
 *     (POSIX_FD) works on the handle, the export is imported as in route A.
 *  2. Otherwise CUDA's own record of the allocation names the RM object: at
 *     the place learn_vmm.c / learn_pool.c learned and confirmed on scratch
 *     memory of their own (asked once per device; kept below): behind the
 *     allocation handle for VMM; in the pool's record of the chunk, next to
 *     its mapping base, for pools (a walk from the pool; only when no walk
 *     reaches the record, a scan of the heap).  The objects named are
 *     duplicated into our client (RM_DUP_OBJECT works only between clients
 *     of the same process) and must be video memory (class
 *     NV01_MEMORY_LOCAL_USER) of the mapping's size (exactly, where
 *     learning found RM's size equal to the mapping's; else at least).
 *  3. The offset of the first pinned byte in the object is va - mapping base
 *     (cuMemMap maps a handle from offset 0, the only offset CUDA accepts;
 *     for pools the same rule was confirmed by learn_pool.c on its scratch
 *     pools).
 *  4. The read-only identity proof (identity.c: bytes read through BAR1 ==
 *     CUDA's copy of them, at the first and last page of the pin), which
 *     also picks among several named objects.  What CUDA's record of this
 *     allocation names is proven by the record (the bytes cross-check it);
 *     what only the heap scan found must be proven by its bytes.
 * Nothing of the caller's memory is ever written (docs/memory-kinds.md).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudadrv.h"
#include "internal.h"
#include "nvrm.h"

static const char *WORKS = "what works: cuMemAlloc/cudaMalloc memory and cuMemCreate memory "
                           "with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (gdrpy.memory "
                           "allocates so)";

/* ---- what was learned, per device (learn_vmm.c, learn_pool.c learn it) -- */

static pthread_mutex_t d_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int vstate; /* 0 untried, 1 learned, -1 failed */
    struct nvrm_vmm_desc v;
    char vwhy[320];
    /* pools, [0] without and [1] with an exportable handle type: CUDA keeps
     * the two kinds' chunks differently, so each is learned on its own kind */
    int pstate[NVRM_POOL_KINDS], ptries[NVRM_POOL_KINDS];
    uint32_t pcli[NVRM_POOL_KINDS]; /* route C's client when they were learned */
    struct nvrm_pool_desc p[NVRM_POOL_KINDS];
    char pwhy[NVRM_POOL_KINDS][320];
} dstate[NVRM_MAX_DEV];

static int learned_vmm(int device, struct nvrm_ctx *nc, struct nvrm_vmm_desc *out)
{
    int slot = device >= 0 && device < NVRM_MAX_DEV ? device : 0;
    pthread_mutex_lock(&d_lock);
    if (!dstate[slot].vstate) {
        dstate[slot].vstate = -1;
        if (nvrm_learn_vmm(device, nc, &dstate[slot].v, dstate[slot].vwhy,
                           sizeof dstate[slot].vwhy) == 0)
            dstate[slot].vstate = 1;
    }
    int ok = dstate[slot].vstate == 1;
    if (ok) *out = dstate[slot].v;
    char why[320];
    snprintf(why, sizeof why, "%s", dstate[slot].vwhy);
    pthread_mutex_unlock(&d_lock);
    if (ok) return 0;
    return gp_err(GDRPY_ENOTSUP, "where CUDA names the RM memory of a VMM allocation could not "
                                 "be learned on this driver: %s",
                  why);
}

static int learned_pool(int device, struct nvrm_ctx *nc, int fdkind, struct nvrm_pool_desc *out)
{
    int slot = device >= 0 && device < NVRM_MAX_DEV ? device : 0;
    if (fdkind < 0 || fdkind >= NVRM_POOL_KINDS) fdkind = NVRM_POOL_PLAIN;
    /* The layouts name CUDA's client as route C sees it; if that changed
     * (CUDA's context was destroyed and made anew), what was learned is
     * stale: learn again.  A failed learning is retried a few times (at
     * later pins), not at every pin. */
    uint32_t cli = nvrm_cuda_client(device);
    pthread_mutex_lock(&d_lock);
    int st = dstate[slot].pstate[fdkind];
    if (st && cli && dstate[slot].pcli[fdkind] != cli && dstate[slot].ptries[fdkind] < 8) {
        gp_log(1, "nvrm: pool records (%s) were learned with CUDA's client 0x%x, now 0x%x: "
                  "learning again",
               nvrm_pool_kind_name(fdkind), dstate[slot].pcli[fdkind], cli);
        st = 0;
    } else if (st < 0 && dstate[slot].ptries[fdkind] < 3) {
        st = 0;
    }
    if (!st) {
        dstate[slot].ptries[fdkind]++;
        dstate[slot].pcli[fdkind] = cli;
        dstate[slot].pstate[fdkind] =
            nvrm_learn_pool(device, nc, fdkind, &dstate[slot].p[fdkind], dstate[slot].pwhy[fdkind],
                            sizeof dstate[slot].pwhy[fdkind]) == 0
                ? 1
                : -1;
    }
    int ok = dstate[slot].pstate[fdkind] == 1;
    if (ok) *out = dstate[slot].p[fdkind];
    char why[320];
    snprintf(why, sizeof why, "%s", dstate[slot].pwhy[fdkind]);
    pthread_mutex_unlock(&d_lock);
    if (ok) return 0;
    return gp_err(GDRPY_ENOTSUP, "where CUDA names the RM memory of the chunks of %s could not be "
                                 "learned on this driver: %s",
                  nvrm_pool_kind_name(fdkind), why);
}

/* ---- per pin ------------------------------------------------------------ */

/* Why no named object was kept (nvrm_dup_alive), for refusals. */
static void none_fit(char *out, size_t n, uint64_t need, int exact)
{
    if (exact)
        snprintf(out, n, "none of them video memory of this process whose RM size is the "
                         "mapping's size, 0x%llx bytes (learning found RM's size equal to the "
                         "mapping's on every scratch allocation)",
                 (unsigned long long)need);
    else
        snprintf(out, n, "none of them video memory of this process of at least the mapping's "
                         "size, 0x%llx bytes",
                 (unsigned long long)need);
}

/* VMM: export (route A's door: one object) or the learned record (the live
 * video-memory objects it names, for nvrm_route_v's proof). */
static int vmm_object(gp_ctx *ctx, struct nvrm_ctx *nc, uint64_t anchor, uint64_t need,
                      uint32_t *cand, int *ncand, int *tied, char *how, size_t howlen)
{
    *tied = 1; /* the export, or CUDA's record of this very allocation */
    const char *kind = gp_cuda_kind_name(GP_CUMEM_VMM);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = gp_cu.MemRetainAllocationHandle(&h, (void *)(uintptr_t)anchor);
    if (r)
        return gp_cuda_err(GDRPY_ENOTSUP, r, "cuMemRetainAllocationHandle",
                           "0x%llx is %s, but CUDA gives no allocation handle for it; %s",
                           (unsigned long long)anchor, kind, WORKS);
    int fd = -1;
    CUresult er = gp_cu.MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                   0);
    if (er == CUDA_SUCCESS && fd >= 0) {
        gp_cu.MemRelease(h);
        snprintf(how, howlen, "export");
        *ncand = 1;
        return nvrm_import_fd(ctx, nc, anchor, fd, &cand[0]);
    }
    struct nvrm_vmm_desc d;
    int rc = learned_vmm(ctx->device, nc, &d);
    if (rc) {
        gp_cu.MemRelease(h);
        return gp_err_prefix(GDRPY_ENOTSUP, "0x%llx is %s created without an exportable handle "
                                            "type (cuMemExportToShareableHandle: %s); %s",
                             (unsigned long long)anchor, kind, gp_cuda_errname(er), WORKS);
    }
    uint32_t cc[NVRM_MAX_CAND], oo[NVRM_MAX_CAND];
    int n = nvrm_desc_vmm_candidates(&d, (uint64_t)h, cc, oo, NVRM_MAX_CAND);
    gp_cu.MemRelease(h);
    int kept = n > 0 ? nvrm_dup_alive(nc, cc, oo, n, need, d.size_exact, cand) : -1;
    if (kept <= 0) {
        nvrm_cand_log(nc, "vmm lookup", cc, oo, n, need);
        char ps[96], none[256];
        nvrm_path_str(&d.obj[0], ps, sizeof ps);
        none_fit(none, sizeof none, need, d.size_exact);
        return gp_err(GDRPY_ENOTSUP, "0x%llx is %s created without an exportable handle type; "
                                     "CUDA's record of it (RM handle at %s and %d other places) "
                                     "names %d RM objects (first: client 0x%x, object 0x%x), %s: "
                                     "exactly one must be proven to hold its bytes, so it is "
                                     "refused; %s",
                      (unsigned long long)anchor, kind, ps, d.nobj - 1, n > 0 ? n : 0,
                      n > 0 ? cc[0] : 0, n > 0 ? oo[0] : 0,
                      kept < 0 && n > 0 ? "too many to weigh" : none, WORKS);
    }
    *ncand = kept;
    snprintf(how, howlen, "record");
    return 0;
}

/* What CUDA itself answers for pool memory: the statuses of the calls that
 * would give an RM handle (named in refusals). */
static void pool_statuses(uint64_t anchor, char *out, size_t n)
{
    CUmemGenericAllocationHandle h = 0;
    CUresult r1 = gp_cu.MemRetainAllocationHandle(&h, (void *)(uintptr_t)anchor);
    if (r1 == CUDA_SUCCESS) gp_cu.MemRelease(h);
    CUipcMemHandle ih;
    CUresult r2 = gp_cu.IpcGetMemHandle(&ih, anchor);
    snprintf(out, n, "cuMemRetainAllocationHandle: %s, cuIpcGetMemHandle: %s",
             gp_cuda_errname(r1), gp_cuda_errname(r2));
}

/* What one pool lookup found (for the refusal). */
struct pool_try_out {
    int learned, ncand, nalive;
    int exact; /* the layouts' size_exact */
    int tied;  /* the candidates came from a walk of the pool, not the heap scan */
    uint32_t cli0, obj0;
};

/* The layouts of pool kind `pk` applied to the chunk at mbase: the usual
 * walk, then the wider one, then the heap scan, while nothing named is live
 * memory.  0 with the live video-memory objects named in cand[0..*nk) (for
 * nvrm_route_v's proof), else -1 (o says why). */
static int pool_try(gp_ctx *ctx, struct nvrm_ctx *nc, uint64_t anchor, const gp_cuda_ptr *cp,
                    uint64_t mbase, int pk, uint32_t *cand, int *nk, struct pool_try_out *o)
{
    memset(o, 0, sizeof *o);
    struct nvrm_pool_desc d;
    if (learned_pool(ctx->device, nc, pk, &d)) return -1;
    o->learned = 1;
    o->exact = d.size_exact;
    o->tied = 1;
    uint32_t cc[NVRM_MAX_CAND], oo[NVRM_MAX_CAND];
    struct nvrm_pool_look lk;
    int ncand = nvrm_desc_pool_lookup(&d, cp->pool, mbase, cp->size, cc, oo, NVRM_MAX_CAND, &lk);
    char ls[256];
    nvrm_look_str(&lk, ls, sizeof ls);
    gp_log(1, "nvrm: pool lookup 0x%llx (pool 0x%llx, chunk 0x%llx+0x%llx, layouts of %s): %s; "
              "%d candidates; client in the layout 0x%x",
           (unsigned long long)anchor, (unsigned long long)cp->pool, (unsigned long long)mbase,
           (unsigned long long)cp->size, nvrm_pool_kind_name(pk), ls, ncand, d.r[0].cli_fixed);
    const uint64_t need = cp->base + cp->size - mbase;
    int kept = ncand > 0 ? nvrm_dup_alive(nc, cc, oo, ncand, need, d.size_exact, cand) : -1;
    if (kept <= 0 && !lk.wide) {
        /* nothing named is live memory: in a busy process the pool's
         * records of this chunk may lie beyond the usual walk */
        ncand = nvrm_desc_pool_lookup_w(&d, cp->pool, mbase, cp->size, cc, oo, NVRM_MAX_CAND, &lk,
                                        1);
        nvrm_look_str(&lk, ls, sizeof ls);
        gp_log(1, "nvrm: pool lookup 0x%llx, wider walk: %s; %d candidates",
               (unsigned long long)anchor, ls, ncand);
        kept = ncand > 0 ? nvrm_dup_alive(nc, cc, oo, ncand, need, d.size_exact, cand) : -1;
    }
    if (kept <= 0) {
        /* the record lies deeper than any walk reaches (a long list of
         * chunks): every field holding the base in CUDA's heaps.  A record
         * found so is tied to the pool by nothing: the bytes must decide. */
        o->tied = 0;
        ncand = nvrm_desc_pool_lookup_heap(&d, mbase, cp->size, cc, oo, NVRM_MAX_CAND, &lk);
        nvrm_look_str(&lk, ls, sizeof ls);
        gp_log(1, "nvrm: pool lookup 0x%llx, heap: %s; %d candidates", (unsigned long long)anchor,
               ls, ncand);
        kept = ncand > 0 ? nvrm_dup_alive(nc, cc, oo, ncand, need, d.size_exact, cand) : -1;
    }
    o->ncand = ncand < 0 ? 0 : ncand;
    o->nalive = kept < 0 ? 0 : kept;
    o->cli0 = ncand > 0 ? cc[0] : 0;
    o->obj0 = ncand > 0 ? oo[0] : 0;
    if (kept <= 0) {
        nvrm_cand_log(nc, "pool lookup", cc, oo, ncand, need);
        nvrm_pool_diag("user chunk", cp->pool, mbase, cp->size);
        return -1;
    }
    if (kept > 1) nvrm_cand_log(nc, "pool lookup (several live)", cc, oo, ncand, need);
    *nk = kept;
    return 0;
}

/* Per device: the default pool's chunks were named only by its own layouts. */
static int dflt_own[NVRM_MAX_DEV];

static int is_default_pool(int device, uint64_t pool)
{
    CUdevice dev = 0;
    void *dp = NULL;
    return gp_cu.DeviceGetDefaultMemPool && gp_cu.DeviceGet(&dev, device) == CUDA_SUCCESS &&
           gp_cu.DeviceGetDefaultMemPool(&dp, dev) == CUDA_SUCCESS &&
           (uint64_t)(uintptr_t)dp == pool;
}

static int pool_object(gp_ctx *ctx, struct nvrm_ctx *nc, uint64_t anchor, const gp_cuda_ptr *cp,
                       uint64_t mbase, uint32_t *cand, int *nk, int *tied, char *how,
                       size_t howlen)
{
    const char *kind = gp_cuda_kind_name(GP_CUMEM_POOL);
    if (!cp->pool)
        return gp_err(GDRPY_ENOTSUP, "0x%llx is %s, but CUDA names no pool for it "
                                     "(CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE); %s",
                      (unsigned long long)anchor, kind, WORKS);
    char st[160];
    pool_statuses(anchor, st, sizeof st);
    const int pk = (cp->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ? NVRM_POOL_FD
                                                                                 : NVRM_POOL_PLAIN;
    struct pool_try_out o;
    const int dslot = ctx->device >= 0 && ctx->device < NVRM_MAX_DEV ? ctx->device : 0;
    const int dflt = pk == NVRM_POOL_PLAIN && is_default_pool(ctx->device, cp->pool);
    if (dflt && __atomic_load_n(&dflt_own[dslot], __ATOMIC_RELAXED)) {
        /* this default pool already needed its own layouts: those first */
        if (pool_try(ctx, nc, anchor, cp, mbase, NVRM_POOL_DEFAULT, cand, nk, &o) == 0) {
            *tied = o.tied;
            snprintf(how, howlen, o.tied ? "default pool record" : "heap scan");
            return 0;
        }
    }
    int rc = pool_try(ctx, nc, anchor, cp, mbase, pk, cand, nk, &o);
    if (rc && dflt) {
        /* the device's default pool may keep its chunks otherwise than
         * created pools: its own layouts, learned on allocations of ours
         * in it */
        gp_log(1, "nvrm: 0x%llx: the layouts of created pools name no live chunk of the "
                  "default pool; trying the default pool's own",
               (unsigned long long)anchor);
        rc = pool_try(ctx, nc, anchor, cp, mbase, NVRM_POOL_DEFAULT, cand, nk, &o);
        if (!rc) {
            __atomic_store_n(&dflt_own[dslot], 1, __ATOMIC_RELAXED);
            *tied = o.tied;
            snprintf(how, howlen, o.tied ? "default pool record" : "heap scan");
            return 0;
        }
    }
    if (rc && !o.learned)
        return gp_err_prefix(GDRPY_ENOTSUP, "0x%llx is %s; CUDA exports no handle for it (%s); %s",
                             (unsigned long long)anchor, kind, st, WORKS);
    char none[256];
    none_fit(none, sizeof none, cp->base + cp->size - mbase, o.exact);
    if (rc)
        return gp_err(GDRPY_ENOTSUP, "0x%llx is %s; CUDA exports no handle for it (%s), and the "
                                     "pool's records name %d candidate RM objects for its chunk "
                                     "[0x%llx, +0x%llx) (first: client 0x%x, object 0x%x), %s: "
                                     "exactly one must be proven to hold its bytes, so it is "
                                     "refused; %s",
                      (unsigned long long)anchor, kind, st, o.ncand, (unsigned long long)mbase,
                      (unsigned long long)cp->size, o.cli0, o.obj0,
                      o.ncand >= NVRM_MAX_CAND ? "too many to weigh" : none, WORKS);
    *tied = o.tied;
    snprintf(how, howlen, o.tied ? "pool record" : "heap scan");
    return 0;
}

int nvrm_route_v(gp_ctx *ctx, struct nvrm_ctx *nc, gp_pin *p, uint64_t anchor,
                 const gp_cuda_ptr *cp, uint64_t mbase, uint64_t va, uint32_t *hOut,
                 uint64_t *rm_off, char *how, size_t howlen)
{
    snprintf(how, howlen, "?");
    if (va < mbase)
        return gp_err(GDRPY_EINVAL, "route V: pin start 0x%llx lies before its mapping at 0x%llx",
                      (unsigned long long)va, (unsigned long long)mbase);
    /* The allocation the identity check reads: its part of the pinned GPU
     * pages (the same object and offset rule as the request; more bytes to
     * compare where the bytes must decide). */
    uint64_t ab = cp->base, as = cp->size;
    CUdeviceptr rb = 0;
    size_t rs = 0;
    if (gp_cu.MemGetAddressRange(&rb, &rs, anchor) == CUDA_SUCCESS && rs) {
        ab = rb;
        as = rs;
    }
    const uint64_t pend = gp_round_up(p->addr + p->size, GDRPY_GPU_PAGE_SIZE);
    uint64_t ilo = va > ab ? va : ab;
    uint64_t ihi = pend < ab + as ? pend : ab + as;
    if (ihi <= ilo)
        return gp_err(GDRPY_EINVAL, "route V: the request does not meet the allocation at 0x%llx",
                      (unsigned long long)anchor);
    uint32_t cand[NVRM_MAX_CAND];
    int nk = 0, tied = 0;
    int rc = cp->kind == GP_CUMEM_POOL
                 ? pool_object(ctx, nc, anchor, cp, mbase, cand, &nk, &tied, how, howlen)
                 : vmm_object(ctx, nc, anchor, cp->base + cp->size - mbase, cand, &nk, &tied,
                              how, howlen);
    if (rc) return rc;
    *rm_off = va - mbase;
    char proof[160];
    rc = nvrm_identity_pick(ctx, nc, cand, nk, va, *rm_off, ilo, ihi - ilo, tied, hOut, proof,
                            sizeof proof);
    if (rc)
        return gp_err_prefix(GDRPY_ENOTSUP, "route V (%s): refusing 0x%llx (%s)", how,
                             (unsigned long long)p->addr, WORKS);
    gp_log(1, "nvrm: route V (%s): 0x%llx+%llu is RM memory 0x%x at offset 0x%llx (read only: %s)",
           how, (unsigned long long)p->addr, (unsigned long long)p->size, *hOut,
           (unsigned long long)*rm_off, proof);
    return 0;
}

int nvrm_pool_range(gp_ctx *ctx, gp_pin *p, uint64_t anchor, gp_cuda_ptr *cp)
{
    if (cp->device >= 0 && cp->device != ctx->device)
        return gp_err(GDRPY_ENODEV, "0x%llx is memory of CUDA device %d, but this context is "
                                    "on device %d",
                      (unsigned long long)p->addr, cp->device, ctx->device);
    uint64_t mb = 0, ms = 0;
    CUresult r1 = gp_cu.PointerGetAttribute(&mb, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, anchor);
    CUresult r2 = gp_cu.PointerGetAttribute(&ms, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, anchor);
    if (r1 || r2 || !mb || !ms) {
        CUdeviceptr b = 0;
        size_t s = 0;
        CUresult r = gp_cu.MemGetAddressRange(&b, &s, anchor);
        if (r)
            return gp_cuda_err(0, r, "cuMemGetAddressRange", "range of the pool allocation at "
                                                             "0x%llx",
                               (unsigned long long)anchor);
        mb = b;
        ms = s;
    }
    cp->base = mb;
    cp->size = ms;
    if (p->addr < mb || p->addr + p->size > mb + ms)
        return gp_err(GDRPY_EINVAL, "range 0x%llx+%llu leaves the pool mapping [0x%llx, "
                                    "0x%llx) that holds its first byte; pin within it",
                      (unsigned long long)p->addr, (unsigned long long)p->size,
                      (unsigned long long)mb, (unsigned long long)(mb + ms));
    gp_log(1, "nvrm: pool memory 0x%llx in mapping [0x%llx, +0x%llx)",
           (unsigned long long)p->addr, (unsigned long long)mb, (unsigned long long)ms);
    return 0;
}
