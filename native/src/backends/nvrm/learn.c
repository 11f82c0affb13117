/*
 * learn.c - nvrm backend: learns, once per process and device, where CUDA
 * names the RM memory of allocations it gives no export for (route V), on
 * scratch memory of the backend's own.
 *
 *  - VMM (cuMemCreate without a handle type): behind the address
 *    cuMemRetainAllocationHandle returns;
 *  - pools: in the pool's records, at an offset from a field holding the
 *    chunk's mapping base address (CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR).
 *
 * Learning: a random pattern is written through CUDA into scratch memory of
 * our own (the only memory this file writes); the words behind CUDA's handle
 * (or pool) are read without faulting (desc.c); a candidate RM handle counts
 * only if its duplicate in our client is video memory whose bytes, read
 * through BAR1 at the expected offset, are the pattern.  Every place the
 * proven handle was seen is then tried on further scratch allocations (VMM:
 * a second one without the RDMA flag; pools: a second allocation at an
 * offset in the same chunk and one in a second pool), and only the places
 * that named the right memory every time are kept.  Finally the per-pin rule
 * itself (desc.c: exactly one candidate may be video memory large enough)
 * must pick the right object on those allocations.  Otherwise the kind stays
 * refused, with the reason.  Costs tens of milliseconds, once, at the first
 * pin of such memory (not at open).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cudadrv.h"
#include "internal.h"
#include "nvrm.h"

enum { PAT = 64,          /* pattern bytes */
       POOL_WIN = 192,    /* bytes either side of a mapping-base field */
       MAX_TRIES = 12000, /* candidate dups per client while learning */
       MAX_CLI = 6 };

/* ---- scratch memory of our own ----------------------------------------- */

static void pattern(uint8_t *p, size_t n, uint64_t salt)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t s = ((uint64_t)ts.tv_nsec + 1) * 0x9e3779b97f4a7c15ull ^ salt ^ (uint64_t)(uintptr_t)p;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p[i] = (uint8_t)(s >> 24);
    }
}

/* Does RM object h (our dup) hold `pat` at rm_off?  Read only. */
static int holds(struct nvrm_ctx *nc, uint32_t h, uint64_t rm_off, const uint8_t *pat)
{
    const uint64_t hp = (uint64_t)nvrm_host_page();
    struct nvrm_map m;
    if ((rm_off & 7) || nvrm_map_range(nc, h, rm_off, PAT, &m)) return 0;
    uint8_t got[PAT];
    const volatile uint8_t *base = (const volatile uint8_t *)m.mm + (rm_off & (hp - 1));
    nvrm_read_mapped(base, rm_off, rm_off, PAT, got);
    nvrm_unmap_range(nc, h, &m);
    return memcmp(got, pat, PAT) == 0;
}

static void drop(struct nvrm_ctx *nc, uint32_t h)
{
    nvrm_rm_free(nc, nc->hDevice, h, "learning: freeing a candidate");
    nvrm_live_add(&nc->n_mem, -1);
}

/* Is (cli, obj) video memory holding pat at rm_off?  (Dup freed again.) */
static int names(struct nvrm_ctx *nc, uint32_t cli, uint32_t obj, uint64_t rm_off,
                 const uint8_t *pat)
{
    uint32_t h = 0;
    if (!obj || obj == cli || nvrm_dup(nc, cli, obj, &h, "learning: candidate")) return 0;
    int ok = nvrm_class_of(nc, h) == NVRM_CLASS_LOCAL_USER && holds(nc, h, rm_off, pat);
    drop(nc, h);
    return ok;
}

/* The per-pin rule picks, among `n` candidates, the one holding pat. */
static int rule_picks(struct nvrm_ctx *nc, const uint32_t *cli, const uint32_t *obj, int n,
                      uint64_t need, uint64_t rm_off, const uint8_t *pat)
{
    uint32_t h = 0;
    int alive = 0;
    if (n <= 0 || nvrm_keep_one(nc, cli, obj, n, need, &h, &alive)) return 0;
    int ok = holds(nc, h, rm_off, pat);
    drop(nc, h);
    return ok;
}

struct vscratch {
    CUdeviceptr va;
    size_t size;
    CUmemGenericAllocationHandle h;
    int mapped, reserved, created;
    uint8_t pat[PAT];
};

static int vscratch_alloc(int device, int rdma, struct vscratch *s)
{
    memset(s, 0, sizeof *s);
    if (!gp_cu.MemCreate || !gp_cu.MemAddressReserve || !gp_cu.MemMap || !gp_cu.MemSetAccess ||
        !gp_cu.MemGetAllocationGranularity || !gp_cu.MemUnmap || !gp_cu.MemAddressFree)
        return gp_err(GDRPY_ENOTSUP, "the CUDA driver lacks the VMM calls");
    gp_CUmemAllocationProp pr;
    memset(&pr, 0, sizeof pr);
    pr.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    pr.location_type = CU_MEM_LOCATION_TYPE_DEVICE;
    pr.location_id = device;
    pr.gpuDirectRDMACapable = (unsigned char)rdma;
    size_t g = 0;
    CUresult r = gp_cu.MemGetAllocationGranularity(&g, &pr, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r || !g) g = 2u << 20;
    s->size = g;
    if ((r = gp_cu.MemCreate(&s->h, g, &pr, 0))) goto fail;
    s->created = 1;
    if ((r = gp_cu.MemAddressReserve(&s->va, g, 0, 0, 0))) goto fail;
    s->reserved = 1;
    if ((r = gp_cu.MemMap(s->va, g, 0, s->h, 0))) goto fail;
    s->mapped = 1;
    gp_CUmemAccessDesc ad = {CU_MEM_LOCATION_TYPE_DEVICE, device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if ((r = gp_cu.MemSetAccess(s->va, g, &ad, 1))) goto fail;
    pattern(s->pat, PAT, s->va);
    return gp_cuda_memcpy(device, 0, s->va, s->pat, PAT, NULL);
fail:
    return gp_cuda_err(GDRPY_ENOTSUP, r, "cuMemCreate/cuMemMap", "scratch VMM allocation");
}

static void vscratch_free(struct vscratch *s)
{
    if (s->mapped) gp_cu.MemUnmap(s->va, s->size);
    if (s->reserved) gp_cu.MemAddressFree(s->va, s->size);
    if (s->created) gp_cu.MemRelease(s->h);
    memset(s, 0, sizeof *s);
}

/* ---- per-device learned state ------------------------------------------- */

#define MAX_DEV 64
static pthread_mutex_t d_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int vstate; /* 0 untried, 1 learned, -1 failed */
    struct nvrm_vmm_desc v;
    char vwhy[320];
    /* pools, [0] without and [1] with an exportable handle type: CUDA keeps
     * the two kinds' chunks differently, so each is learned on its own kind */
    int pstate[2];
    struct nvrm_pool_desc p[2];
    char pwhy[2][320];
} dstate[MAX_DEV];

/* ---- VMM ----------------------------------------------------------------- */

/* Every place in the walk where u32 x sits, as paths (up to max). */
static int places_of(const struct nvrm_blk *b, int nb, uint32_t x, struct nvrm_path *out,
                     int max)
{
    int n = 0;
    for (int i = 0; i < nb && n < max; i++)
        for (uint32_t o = 0; o + 4 <= b[i].len && n < max; o += 4) {
            uint32_t v;
            memcpy(&v, b[i].d + o, 4);
            if (v == x) out[n++] = nvrm_path_of(b, i, o);
        }
    return n;
}

/* The first (client, object) behind s's handle that holds s's pattern. */
static int find_first(struct nvrm_ctx *nc, const struct vscratch *s, const struct nvrm_blk *b,
                      int nb, uint32_t ipc_cli, uint32_t *cli, uint32_t *obj)
{
    uint32_t cs[MAX_CLI];
    int ncs = 0;
    if (ipc_cli) cs[ncs++] = ipc_cli;
    for (int i = 0; i < nb; i++)
        for (uint32_t o = 0; o + 4 <= b[i].len && ncs < MAX_CLI; o += 4) {
            uint32_t x;
            memcpy(&x, b[i].d + o, 4);
            int dup = 0;
            for (int k = 0; k < ncs; k++) dup |= cs[k] == x;
            if (!dup && nvrm_is_client(x)) cs[ncs++] = x;
        }
    for (int c = 0; c < ncs; c++) {
        int tries = 0;
        for (int i = 0; i < nb && tries < MAX_TRIES; i++)
            for (uint32_t o = 0; o + 4 <= b[i].len && tries < MAX_TRIES; o += 4) {
                uint32_t x;
                memcpy(&x, b[i].d + o, 4);
                if (!x || nvrm_is_client(x)) continue;
                int earlier = 0; /* the first place of a value only */
                for (uint32_t q = 0; q < o && !earlier; q += 4) earlier = !memcmp(b[i].d + q, &x, 4);
                if (earlier) continue;
                tries++;
                if (names(nc, cs[c], x, 0, s->pat)) {
                    *cli = cs[c];
                    *obj = x;
                    return 0;
                }
            }
    }
    return -1;
}

static void learn_vmm(int device, struct nvrm_ctx *nc, int slot)
{
    char *why = dstate[slot].vwhy;
    const size_t wl = sizeof dstate[slot].vwhy;
    struct vscratch s1, s2;
    memset(&s1, 0, sizeof s1);
    memset(&s2, 0, sizeof s2);
    struct nvrm_blk *b = malloc(NVRM_WALK_VMM_B * sizeof *b);
    if (!b || vscratch_alloc(device, 1, &s1)) {
        snprintf(why, wl, "scratch allocation: %s", b ? gdrpy_last_error() : "out of memory");
        free(b);
        vscratch_free(&s1);
        return;
    }
    uint32_t ipc_cli = nvrm_cuda_client(), cli = 0, obj = 0;
    enum { MAXP = 32 };
    struct nvrm_path P[MAXP], Q[MAXP]; /* places of the object and of the client */
    int np = 0, nq = 0;
    struct nvrm_vmm_desc d;
    memset(&d, 0, sizeof d);
    CUmemGenericAllocationHandle h1 = 0, h2 = 0;
    int nb = 0;
    if (!gp_cu.MemRetainAllocationHandle(&h1, (void *)(uintptr_t)s1.va)) {
        nb = nvrm_walk((uint64_t)h1, b, NVRM_WALK_VMM_B, NVRM_WALK_VMM_L);
        if (find_first(nc, &s1, b, nb, ipc_cli, &cli, &obj)) nb = -nb - 1;
    }
    if (nb <= 0) {
        snprintf(why, wl, "no RM handle behind the allocation handle of a scratch cuMemCreate "
                          "allocation (%d blocks read) holds its pattern",
                 nb < 0 ? -nb - 1 : 0);
        goto out;
    }
    np = places_of(b, nb, obj, P, MAXP);
    if (cli == ipc_cli) d.cli_fixed = cli;
    else nq = places_of(b, nb, cli, Q, MAXP);
    /* confirm each place on a second allocation (no RDMA flag) */
    if (vscratch_alloc(device, 0, &s2) ||
        gp_cu.MemRetainAllocationHandle(&h2, (void *)(uintptr_t)s2.va)) {
        snprintf(why, wl, "second scratch allocation: %s", gdrpy_last_error());
        goto out;
    }
    for (int j = 0; j < nq && d.ncli < NVRM_DESC_RULES; j++) {
        uint32_t c2 = 0;
        if (nvrm_path_read((uint64_t)h2, &Q[j], &c2, 4) || !nvrm_is_client(c2)) continue;
        int good = 0;
        for (int i = 0; i < np && !good; i++) {
            uint32_t o2 = 0;
            good = nvrm_path_read((uint64_t)h2, &P[i], &o2, 4) == 0 && o2 != obj &&
                   names(nc, c2, o2, 0, s2.pat);
        }
        if (good) d.cli[d.ncli++] = Q[j];
    }
    for (int i = 0; i < np && d.nobj < NVRM_DESC_RULES; i++) {
        struct nvrm_vmm_desc one = d;
        one.nobj = 1;
        one.obj[0] = P[i];
        uint32_t cc[NVRM_MAX_CAND], oo[NVRM_MAX_CAND];
        int n = nvrm_desc_vmm_candidates(&one, (uint64_t)h2, cc, oo, NVRM_MAX_CAND);
        int good = 0;
        for (int k = 0; k < n && !good; k++) good = oo[k] != obj && names(nc, cc[k], oo[k], 0, s2.pat);
        if (good) d.obj[d.nobj++] = P[i];
    }
    /* the per-pin rule must pick the right object on both allocations */
    uint32_t cc[NVRM_MAX_CAND], oo[NVRM_MAX_CAND];
    int ok = d.nobj > 0 && (d.cli_fixed || d.ncli > 0);
    ok = ok && rule_picks(nc, cc, oo, nvrm_desc_vmm_candidates(&d, (uint64_t)h1, cc, oo, NVRM_MAX_CAND),
                          s1.size, 0, s1.pat);
    ok = ok && rule_picks(nc, cc, oo, nvrm_desc_vmm_candidates(&d, (uint64_t)h2, cc, oo, NVRM_MAX_CAND),
                          s2.size, 0, s2.pat);
    if (!ok) {
        snprintf(why, wl, "the %d places that named the memory of one scratch allocation did "
                          "not name exactly the memory of a second one (%d kept)",
                 np, d.nobj);
        goto out;
    }
    dstate[slot].v = d;
    dstate[slot].vstate = 1;
    char ps[96], cs[96] = "route C's client";
    nvrm_path_str(&d.obj[0], ps, sizeof ps);
    if (!d.cli_fixed) nvrm_path_str(&d.cli[0], cs, sizeof cs);
    gp_log(1, "nvrm: route V learned: RM memory handle at %s (%d places), client %s "
              "(confirmed on two scratch allocations)",
           ps, d.nobj, cs);
out:
    if (h1) gp_cu.MemRelease(h1);
    if (h2) gp_cu.MemRelease(h2);
    vscratch_free(&s2);
    vscratch_free(&s1);
    free(b);
}

int nvrm_desc_vmm(int device, struct nvrm_ctx *nc, struct nvrm_vmm_desc *out)
{
    int slot = device >= 0 && device < MAX_DEV ? device : 0;
    pthread_mutex_lock(&d_lock);
    if (!dstate[slot].vstate) {
        dstate[slot].vstate = -1;
        learn_vmm(device, nc, slot);
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

/* ---- pools --------------------------------------------------------------- */

struct pscratch {
    void *pool;
    int nva;
    CUdeviceptr va[2];
    uint64_t mbase[2], msize[2];
    uint8_t pat[2][PAT];
};

static int pscratch_alloc(int device, int fdkind, struct pscratch *s, size_t n0, size_t n1)
{
    memset(s, 0, sizeof *s);
    if (!gp_cu.MemPoolCreate || !gp_cu.MemPoolDestroy || !gp_cu.MemAllocFromPoolAsync ||
        !gp_cu.MemFreeAsync)
        return gp_err(GDRPY_ENOTSUP, "the CUDA driver lacks the memory-pool calls");
    gp_CUmemPoolProps pp;
    memset(&pp, 0, sizeof pp);
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pp.location_type = CU_MEM_LOCATION_TYPE_DEVICE;
    pp.location_id = device;
    pp.handleTypes = fdkind ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
    CUresult r = gp_cu.MemPoolCreate(&s->pool, &pp);
    if (r) {
        s->pool = NULL;
        return gp_cuda_err(GDRPY_ENOTSUP, r, "cuMemPoolCreate", "scratch pool");
    }
    size_t sz[2] = {n0, n1};
    for (int i = 0; i < 2 && sz[i]; i++) {
        r = gp_cu.MemAllocFromPoolAsync(&s->va[i], sz[i], s->pool, GP_CU_STREAM_LEGACY);
        if (!r) r = gp_cu.StreamSynchronize(GP_CU_STREAM_LEGACY);
        if (r) return gp_cuda_err(GDRPY_ENOTSUP, r, "cuMemAllocFromPoolAsync", "scratch pool");
        s->nva++;
        if (gp_cu.PointerGetAttribute(&s->mbase[i], CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                                      s->va[i]) ||
            gp_cu.PointerGetAttribute(&s->msize[i], CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
                                      s->va[i]) ||
            !s->mbase[i] || s->va[i] < s->mbase[i])
            return gp_err(GDRPY_ENOTSUP, "CUDA gives no mapping base/size for pool memory");
        pattern(s->pat[i], PAT, s->va[i] + (uint64_t)i);
        if (gp_cuda_memcpy(device, 0, s->va[i], s->pat[i], PAT, NULL)) return GDRPY_EIO;
    }
    return 0;
}

static void pscratch_free(struct pscratch *s)
{
    for (int i = 0; i < s->nva; i++) gp_cu.MemFreeAsync(s->va[i], GP_CU_STREAM_LEGACY);
    if (s->nva) gp_cu.StreamSynchronize(GP_CU_STREAM_LEGACY);
    if (s->pool) gp_cu.MemPoolDestroy(s->pool);
    memset(s, 0, sizeof *s);
}

/* A set of values already tried (open addressing; cap a power of two). */
struct seen {
    uint32_t *t;
    uint32_t cap;
};
static int seen_add(struct seen *s, uint32_t x)
{
    uint32_t i = (x * 2654435761u) & (s->cap - 1);
    while (s->t[i]) {
        if (s->t[i] == x) return 0;
        i = (i + 1) & (s->cap - 1);
    }
    s->t[i] = x;
    return 1;
}

/* The mapping size next to the base field at o, if the record holds it. */
static void size_field(const uint8_t *blk, int lo, int hi, int o, uint64_t msize,
                       struct nvrm_pool_rule *u)
{
    for (int z = lo - lo % 8; z + 8 <= hi; z += 8) {
        uint64_t sz;
        memcpy(&sz, blk + z, 8);
        if (z != o && sz == msize) {
            u->has_size = 1;
            u->ds = z - o;
            return;
        }
    }
}

/* Raw rules found on the first allocation (more than a descriptor keeps:
 * places that only name the memory by accident are weeded out later). */
enum { RAW_RULES = 32 };
struct raw_rules {
    int n;
    struct nvrm_pool_rule r[RAW_RULES];
};

static void add_rule(struct raw_rules *d, const struct nvrm_pool_rule *u)
{
    for (int k = 0; k < d->n; k++)
        if (!memcmp(&d->r[k], u, sizeof *u)) return;
    if (d->n < RAW_RULES) d->r[d->n++] = *u;
}

/* Rules from allocation 0 of s: every handle next to a mapping-base field
 * (or in a block a pointer there points to) that holds the pattern. */
static int pool_rules(struct nvrm_ctx *nc, const struct pscratch *s, uint32_t ipc_cli,
                      struct raw_rules *d, int *nplaces)
{
    struct nvrm_blk *b = malloc(NVRM_WALK_POOL_B * sizeof *b);
    if (!b) return -1;
    int nb = nvrm_walk((uint64_t)(uintptr_t)s->pool, b, NVRM_WALK_POOL_B, NVRM_WALK_POOL_L);
    const uint64_t off0 = s->va[0] - s->mbase[0];
    struct seen sn = {calloc(16384, 4), 16384};
    *nplaces = 0;
    d->n = 0;
    for (int i = 0; i < nb && d->n < RAW_RULES; i++)
        for (uint32_t o = 0; o + 8 <= b[i].len && d->n < RAW_RULES; o += 8) {
            uint64_t v;
            memcpy(&v, b[i].d + o, 8);
            if (v != s->mbase[0]) continue;
            (*nplaces)++;
            int lo = (int)o - POOL_WIN < 0 ? 0 : (int)o - POOL_WIN;
            int hi = (int)o + POOL_WIN > b[i].len ? b[i].len : (int)o + POOL_WIN;
            for (int q = lo; q + 4 <= hi && d->n < RAW_RULES; q += 4) {
                if (q >= (int)o && q < (int)o + 8) continue;
                uint32_t x;
                memcpy(&x, b[i].d + q, 4);
                if (!x || nvrm_is_client(x)) continue;
                /* the client: route C's, else one in the record */
                int qc = -1;
                uint32_t c = ipc_cli;
                if (!c || !names(nc, c, x, off0, s->pat[0])) {
                    c = 0;
                    for (int z = lo; z + 4 <= hi && !c; z += 4) {
                        uint32_t y;
                        memcpy(&y, b[i].d + z, 4);
                        if (nvrm_is_client(y) && y != ipc_cli && names(nc, y, x, off0, s->pat[0])) {
                            c = y;
                            qc = z;
                        }
                    }
                    if (!c) continue;
                }
                struct nvrm_pool_rule u = {.dh = q - (int)o,
                                           .dc = qc < 0 ? 0 : qc - (int)o,
                                           .cli_fixed = qc < 0 ? c : 0};
                size_field(b[i].d, lo, hi, (int)o, s->msize[0], &u);
                add_rule(d, &u);
            }
            /* one pointer away: a block a pointer next to the base points to */
            if (!ipc_cli || !sn.t) continue;
            memset(sn.t, 0, sn.cap * 4);
            for (int q = lo - lo % 8; q + 8 <= hi && d->n < RAW_RULES; q += 8) {
                uint64_t p;
                memcpy(&p, b[i].d + q, 8);
                uint8_t blk[NVRM_WALK_BLK];
                if (q == (int)o || p < 0x10000 || p >= (1ull << 47) || (p & 7) ||
                    nvrm_safe_read(p, blk, sizeof blk))
                    continue;
                for (int r = 0; r + 4 <= (int)sizeof blk && d->n < RAW_RULES; r += 4) {
                    uint32_t x;
                    memcpy(&x, blk + r, 4);
                    if (!x || nvrm_is_client(x) || !seen_add(&sn, x)) continue;
                    if (!names(nc, ipc_cli, x, off0, s->pat[0])) continue;
                    struct nvrm_pool_rule u = {
                        .hop = 1, .dp = q - (int)o, .dh = r, .cli_fixed = ipc_cli};
                    size_field(b[i].d, lo, hi, (int)o, s->msize[0], &u);
                    add_rule(d, &u);
                }
            }
        }
    free(sn.t);
    free(b);
    return d->n ? 0 : -1;
}

/* Does rule set d name, among its candidates, the memory of allocation i of s? */
static int pool_names(struct nvrm_ctx *nc, const struct nvrm_pool_desc *d,
                      const struct pscratch *s, int i)
{
    uint32_t cc[NVRM_MAX_CAND], oo[NVRM_MAX_CAND];
    int n = nvrm_desc_pool_candidates(d, (uint64_t)(uintptr_t)s->pool, s->mbase[i], s->msize[i],
                                      cc, oo, NVRM_MAX_CAND);
    for (int k = 0; k < n; k++)
        if (names(nc, cc[k], oo[k], s->va[i] - s->mbase[i], s->pat[i])) return 1;
    return 0;
}

static int pool_rule_picks(struct nvrm_ctx *nc, const struct nvrm_pool_desc *d,
                           const struct pscratch *s, int i)
{
    uint32_t cc[NVRM_MAX_CAND], oo[NVRM_MAX_CAND];
    int n = nvrm_desc_pool_candidates(d, (uint64_t)(uintptr_t)s->pool, s->mbase[i], s->msize[i],
                                      cc, oo, NVRM_MAX_CAND);
    return rule_picks(nc, cc, oo, n, s->msize[i], s->va[i] - s->mbase[i], s->pat[i]);
}

static void learn_pool(int device, struct nvrm_ctx *nc, int slot, int fdkind)
{
    char *why = dstate[slot].pwhy[fdkind];
    const size_t wl = sizeof dstate[slot].pwhy[fdkind];
    struct pscratch s1, s2;
    memset(&s2, 0, sizeof s2);
    struct raw_rules cand;
    struct nvrm_pool_desc d;
    memset(&d, 0, sizeof d);
    int np = 0;
    /* pool 1: two allocations (the second usually in the same chunk, at an
     * offset); pool 2: one */
    if (pscratch_alloc(device, fdkind, &s1, 1u << 20, 64u << 10) ||
        pscratch_alloc(device, fdkind, &s2, 1u << 20, 0)) {
        snprintf(why, wl, "scratch pools: %s", gdrpy_last_error());
        goto out;
    }
    uint32_t ipc_cli = nvrm_cuda_client();
    if (pool_rules(nc, &s1, ipc_cli, &cand, &np)) {
        snprintf(why, wl, "no RM handle within %d bytes of the chunk's mapping base in the "
                          "scratch pool's records holds its pattern (the base was found at %d "
                          "places)",
                 POOL_WIN, np);
        nvrm_pool_diag("scratch chunk, no layout", (uint64_t)(uintptr_t)s1.pool, s1.mbase[0],
                       s1.msize[0]);
        goto out;
    }
    gp_log(1, "nvrm: pool learn (%s handle types): scratch chunks 0x%llx+0x%llx (allocations at "
              "+0x%llx, +0x%llx) and 0x%llx+0x%llx; base at %d places, %d raw layouts; route C's "
              "client 0x%x",
           fdkind ? "fd" : "no", (unsigned long long)s1.mbase[0], (unsigned long long)s1.msize[0],
           (unsigned long long)(s1.va[0] - s1.mbase[0]), (unsigned long long)(s1.va[1] - s1.mbase[1]),
           (unsigned long long)s2.mbase[0], (unsigned long long)s2.msize[0], np, cand.n, ipc_cli);
    for (int k = 0; k < cand.n; k++) {
        struct nvrm_pool_desc one = {1, {cand.r[k]}};
        const struct nvrm_pool_rule *u = &cand.r[k];
        int a = pool_names(nc, &one, &s1, 1), c = pool_names(nc, &one, &s2, 0);
        gp_log(1, "nvrm: pool learn raw layout %d: hop %d dp %+d dh %+d dc %+d client %s size %s%+d: "
                  "names 2nd allocation %s, 2nd pool %s",
               k, u->hop, u->dp, u->dh, u->dc, u->cli_fixed ? "fixed" : "in record",
               u->has_size ? "at " : "none ", u->ds, a ? "yes" : "NO", c ? "yes" : "NO");
        if (a && c && d.n < NVRM_DESC_RULES) d.r[d.n++] = cand.r[k];
    }
    if (!d.n || !pool_rule_picks(nc, &d, &s1, 0) || !pool_rule_picks(nc, &d, &s1, 1) ||
        !pool_rule_picks(nc, &d, &s2, 0)) {
        snprintf(why, wl, "of %d record layouts that named the memory of one scratch "
                          "allocation, %d named the others, and they did not pick exactly the "
                          "right object on all three",
                 cand.n, d.n);
        nvrm_pool_diag("scratch chunk, not learned", (uint64_t)(uintptr_t)s1.pool, s1.mbase[0],
                       s1.msize[0]);
        goto out;
    }
    nvrm_pool_diag(fdkind ? "scratch chunk (fd)" : "scratch chunk", (uint64_t)(uintptr_t)s1.pool,
                   s1.mbase[0], s1.msize[0]);
    dstate[slot].p[fdkind] = d;
    dstate[slot].pstate[fdkind] = 1;
    char rs[256];
    size_t u = 0;
    for (int k = 0; k < d.n && u < sizeof rs; k++)
        u += (size_t)(d.r[k].hop ? snprintf(rs + u, sizeof rs - u, " [%+d]->+0x%x", d.r[k].dp, d.r[k].dh)
                                 : snprintf(rs + u, sizeof rs - u, " %+d", d.r[k].dh));
    gp_log(1, "nvrm: pool records learned (pools %s handle types): RM handle relative to a "
              "mapping-base field at%s; "
              "client %s, size %s (confirmed on three scratch allocations in two pools)",
           fdkind ? "with" : "without", rs, d.r[0].cli_fixed ? "route C's" : "in the record",
           d.r[0].has_size ? "checked" : "not in the record");
out:
    pscratch_free(&s2);
    pscratch_free(&s1);
}

int nvrm_desc_pool(int device, struct nvrm_ctx *nc, int fdkind, struct nvrm_pool_desc *out)
{
    int slot = device >= 0 && device < MAX_DEV ? device : 0;
    fdkind = fdkind != 0;
    pthread_mutex_lock(&d_lock);
    if (!dstate[slot].pstate[fdkind]) {
        dstate[slot].pstate[fdkind] = -1;
        learn_pool(device, nc, slot, fdkind);
    }
    int ok = dstate[slot].pstate[fdkind] == 1;
    if (ok) *out = dstate[slot].p[fdkind];
    char why[320];
    snprintf(why, sizeof why, "%s", dstate[slot].pwhy[fdkind]);
    pthread_mutex_unlock(&d_lock);
    if (ok) return 0;
    return gp_err(GDRPY_ENOTSUP, "where CUDA names the RM memory of the chunks of a pool %s could "
                                 "not be learned on this driver: %s",
                  fdkind ? "with an exportable handle type" : "without handle types", why);
}
