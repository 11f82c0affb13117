/*
 * learn_pool.c - nvrm backend: learns where a stream-ordered pool's records
 * name the RM memory of its chunks (route V), on scratch pools of our own:
 * at an offset from a field holding the chunk's mapping base address
 * (CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR), or one or two pointers away.
 * route_v.c asks once per process, device and pool kind, and again when
 * CUDA's client changed.
 *
 * The scratch pools look like a busy one: pool 1 holds several chunks (the
 * first with its chunk-start allocation freed again, so only an allocation at
 * an offset is left in it; later chunks; an allocation larger than a chunk),
 * pool 2 one chunk.  Each live allocation holds a random pattern of ours
 * (written through CUDA: the only memory this file writes).
 *
 *  1. Raw layouts: next to every field holding a chunk's mapping base (or one
 *     pointer away), every u32 whose duplicate from CUDA's client is video
 *     memory holding that chunk's pattern at va - base; from each chunk.
 *  2. Soundness: a layout is kept only if, on EVERY live scratch allocation,
 *     no object it names is video memory large enough that does not hold
 *     that allocation's pattern (a layout that can name another chunk, in a
 *     pool of many, is dropped), and it names the right one at least once.
 *  3. The kept layouts together must pick exactly the right object (by the
 *     per-pin rule of desc.c) for every live scratch allocation.
 * Otherwise the kind stays refused, with the reason.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudadrv.h"
#include "internal.h"
#include "nvrm.h"

enum { POOL_WIN = 192,    /* bytes either side of a mapping-base field */
       PS_MAX = 8,        /* allocations per scratch pool */
       RAW_RULES = 128 }; /* raw layouts before soundness */

struct pscratch {
    void *pool;
    int device;
    int borrowed; /* the device's default pool: not destroyed */
    int nva;
    CUdeviceptr va[PS_MAX];
    int live[PS_MAX];
    uint64_t mbase[PS_MAX], msize[PS_MAX];
    uint8_t pat[PS_MAX][NVRM_SCRATCH_PAT];
};

static int pscratch_fill(int device, struct pscratch *s, const size_t *sizes, int n,
                         unsigned free_mask);

/* Allocations of sizes[0..n) in a new pool of the kind (or, for
 * NVRM_POOL_DEFAULT, in the device's default pool); then frees those
 * with free_mask set (their chunks keep the others). */
static int pscratch_alloc(int device, int fdkind, struct pscratch *s, const size_t *sizes, int n,
                          unsigned free_mask)
{
    memset(s, 0, sizeof *s);
    s->device = device;
    if (!gp_cu.MemPoolCreate || !gp_cu.MemPoolDestroy || !gp_cu.MemAllocFromPoolAsync ||
        !gp_cu.MemFreeAsync)
        return gp_err(GDRPY_ENOTSUP, "the CUDA driver lacks the memory-pool calls");
    if (fdkind == NVRM_POOL_DEFAULT) {
        /* allocations of our own in the device's default pool (returned to
         * it afterwards; the pool itself is not ours to destroy) */
        CUdevice dev = 0;
        CUresult r0 = gp_cu.DeviceGetDefaultMemPool && gp_cu.DeviceGet(&dev, device) == 0
                          ? gp_cu.DeviceGetDefaultMemPool(&s->pool, dev)
                          : CUDA_ERROR_NOT_SUPPORTED;
        if (r0) {
            s->pool = NULL;
            return gp_cuda_err(GDRPY_ENOTSUP, r0, "cuDeviceGetDefaultMemPool", "default pool");
        }
        s->borrowed = 1;
        return pscratch_fill(device, s, sizes, n, free_mask);
    }
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
    return pscratch_fill(device, s, sizes, n, free_mask);
}

/* Allocations and frees of the scratch pools run on gdrpy's own stream
 * (cudadrv.h): on the legacy stream they would be ordered after the
 * caller's kernels. */
static int pscratch_fill(int device, struct pscratch *s, const size_t *sizes, int n,
                         unsigned free_mask)
{
    CUresult r;
    CUstream st;
    for (int i = 0; i < n && i < PS_MAX; i++) {
        /* sizes below 64: quarters of the first allocation's chunk */
        size_t want = sizes[i] >= 64 || !s->msize[0] ? sizes[i] : sizes[i] * (s->msize[0] / 4);
        if (gp_cuda_private_begin(device, &st)) return GDRPY_EIO;
        r = gp_cu.MemAllocFromPoolAsync(&s->va[i], want, s->pool, st);
        if (!r) r = gp_cu.StreamSynchronize(st);
        gp_cuda_private_end(device);
        if (r) return gp_cuda_err(GDRPY_ENOTSUP, r, "cuMemAllocFromPoolAsync", "scratch pool");
        s->nva++;
        s->live[i] = 1;
        if (gp_cu.PointerGetAttribute(&s->mbase[i], CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                                      s->va[i]) ||
            gp_cu.PointerGetAttribute(&s->msize[i], CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
                                      s->va[i]) ||
            !s->mbase[i] || s->va[i] < s->mbase[i])
            return gp_err(GDRPY_ENOTSUP, "CUDA gives no mapping base/size for pool memory");
        nvrm_scratch_pattern(s->pat[i], NVRM_SCRATCH_PAT, s->va[i] + (uint64_t)i);
        if (gp_cuda_private_copy(device, 0, s->va[i], s->pat[i], NVRM_SCRATCH_PAT))
            return GDRPY_EIO;
    }
    if (free_mask && !gp_cuda_private_begin(device, &st)) {
        for (int i = 0; i < s->nva; i++)
            if ((free_mask >> i) & 1) {
                gp_cu.MemFreeAsync(s->va[i], st);
                s->live[i] = 0;
            }
        gp_cu.StreamSynchronize(st);
        gp_cuda_private_end(s->device);
    }
    return 0;
}

static void pscratch_free(struct pscratch *s)
{
    CUstream st;
    if (s->nva && !gp_cuda_private_begin(s->device, &st)) {
        for (int i = 0; i < s->nva; i++)
            if (s->live[i]) gp_cu.MemFreeAsync(s->va[i], st);
        gp_cu.StreamSynchronize(st);
        gp_cuda_private_end(s->device);
    }
    if (s->pool && !s->borrowed) gp_cu.MemPoolDestroy(s->pool);
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

/* Two pointers away from a record: for a first pointer p, every u32 of the
 * handle family of CUDA's client in a block a pointer in p's block points
 * to (r1: that pointer's offset in p's block; r2: the u32's offset in its
 * block).  Cached per p: records of one chunk share their pointers. */
enum { HOP2_MAX = 48,
       HOP2_CACHE = 512 };
struct hop2 {
    uint64_t p;
    int n;
    uint32_t x[HOP2_MAX];
    uint16_t r1[HOP2_MAX], r2[HOP2_MAX];
};
struct hop2_cache {
    int n;
    struct hop2 e[HOP2_CACHE];
};

static int ptr_ok(uint64_t v) { return v >= 0x10000 && v < (1ull << 47) && !(v & 7); }

static const struct hop2 *hop2_of(struct hop2_cache *c, uint64_t p, uint32_t fam)
{
    if (!c || !fam || !ptr_ok(p)) return NULL;
    for (int k = 0; k < c->n; k++)
        if (c->e[k].p == p) return &c->e[k];
    if (c->n == HOP2_CACHE) return NULL;
    struct hop2 *e = &c->e[c->n];
    memset(e, 0, sizeof *e);
    e->p = p;
    uint8_t b1[NVRM_WALK_BLK], b2[NVRM_WALK_BLK];
    if (nvrm_safe_read(p, b1, sizeof b1) == 0) {
        for (int r1 = 0; r1 + 8 <= (int)sizeof b1 && e->n < HOP2_MAX; r1 += 8) {
            uint64_t p2;
            memcpy(&p2, b1 + r1, 8);
            if (!ptr_ok(p2) || p2 == p) continue;
            int len = nvrm_safe_read(p2, b2, sizeof b2) == 0 ? (int)sizeof b2
                      : nvrm_safe_read(p2, b2, 128) == 0     ? 128
                                                             : 0;
            for (int r2 = 0; r2 + 4 <= len && e->n < HOP2_MAX; r2 += 4) {
                uint32_t x;
                memcpy(&x, b2 + r2, 4);
                if (!x || (x & 0xfff00000u) != (fam & 0xfff00000u)) continue;
                e->x[e->n] = x;
                e->r1[e->n] = (uint16_t)r1;
                e->r2[e->n++] = (uint16_t)r2;
            }
        }
    }
    c->n++;
    return e;
}

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

/* Raw layouts from live allocation i of s: every handle next to a field
 * holding its mapping base (or in a block a pointer there points to) whose
 * object holds the allocation's pattern.  Returns the places of the base. */
static int pool_rules(struct nvrm_ctx *nc, const struct pscratch *s, int i, uint32_t ipc_cli,
                      uint32_t fam, struct hop2_cache *c2, struct raw_rules *d)
{
    uint32_t tx[2048]; /* handle values tried two pointers away, and whether they named it */
    int tg[2048], nt = 0;
    struct nvrm_blk *b = malloc(NVRM_WALK_POOL_B * sizeof *b);
    if (!b) return 0;
    int nb = nvrm_walk((uint64_t)(uintptr_t)s->pool, b, NVRM_WALK_POOL_B, NVRM_WALK_POOL_L);
    const uint64_t off0 = s->va[i] - s->mbase[i];
    const uint8_t *pat = s->pat[i];
    struct seen sn = {calloc(16384, 4), 16384};
    int places = 0;
    for (int j = 0; j < nb && d->n < RAW_RULES; j++)
        for (uint32_t o = 0; o + 8 <= b[j].len && d->n < RAW_RULES; o += 8) {
            uint64_t v;
            memcpy(&v, b[j].d + o, 8);
            if (v != s->mbase[i]) continue;
            places++;
            int lo = (int)o - POOL_WIN < 0 ? 0 : (int)o - POOL_WIN;
            int hi = (int)o + POOL_WIN > b[j].len ? b[j].len : (int)o + POOL_WIN;
            for (int q = lo; q + 4 <= hi && d->n < RAW_RULES; q += 4) {
                if (q >= (int)o && q < (int)o + 8) continue;
                uint32_t x;
                memcpy(&x, b[j].d + q, 4);
                if (!x || nvrm_is_client(x)) continue;
                /* the client: route C's, else one in the record */
                int qc = -1;
                uint32_t c = ipc_cli;
                if (!c || !nvrm_scratch_names(nc, c, x, off0, pat)) {
                    c = 0;
                    for (int z = lo; z + 4 <= hi && !c; z += 4) {
                        uint32_t y;
                        memcpy(&y, b[j].d + z, 4);
                        if (nvrm_is_client(y) && y != ipc_cli && nvrm_scratch_names(nc, y, x, off0, pat)) {
                            c = y;
                            qc = z;
                        }
                    }
                    if (!c) continue;
                }
                struct nvrm_pool_rule u = {.dh = q - (int)o,
                                           .dc = qc < 0 ? 0 : qc - (int)o,
                                           .cli_fixed = qc < 0 ? c : 0};
                size_field(b[j].d, lo, hi, (int)o, s->msize[i], &u);
                add_rule(d, &u);
            }
            /* one pointer away: a block a pointer next to the base points to */
            if (!ipc_cli || !sn.t) continue;
            memset(sn.t, 0, sn.cap * 4);
            for (int q = lo - lo % 8; q + 8 <= hi && d->n < RAW_RULES; q += 8) {
                uint64_t p;
                memcpy(&p, b[j].d + q, 8);
                uint8_t blk[NVRM_WALK_BLK];
                if (q == (int)o || p < 0x10000 || p >= (1ull << 47) || (p & 7) ||
                    nvrm_safe_read(p, blk, sizeof blk))
                    continue;
                for (int r = 0; r + 4 <= (int)sizeof blk && d->n < RAW_RULES; r += 4) {
                    uint32_t x;
                    memcpy(&x, blk + r, 4);
                    if (!x || nvrm_is_client(x) || !seen_add(&sn, x)) continue;
                    if (!nvrm_scratch_names(nc, ipc_cli, x, off0, pat)) continue;
                    struct nvrm_pool_rule u = {
                        .hop = 1, .dp = q - (int)o, .dh = r, .cli_fixed = ipc_cli};
                    size_field(b[j].d, lo, hi, (int)o, s->msize[i], &u);
                    add_rule(d, &u);
                }
            }
            /* two pointers away (a pool may keep a chunk as an allocation
             * record of its own, whose inner block holds the handle) */
            for (int q = lo - lo % 8; q + 8 <= hi && d->n < RAW_RULES; q += 8) {
                uint64_t p;
                memcpy(&p, b[j].d + q, 8);
                if (q == (int)o) continue;
                const struct hop2 *h2 = hop2_of(c2, p, fam);
                for (int k = 0; h2 && k < h2->n && d->n < RAW_RULES; k++) {
                    uint32_t x = h2->x[k];
                    int t = 0;
                    while (t < nt && tx[t] != x) t++;
                    if (t == nt) {
                        if (nt == (int)(sizeof tx / sizeof tx[0])) continue;
                        tx[nt] = x;
                        tg[nt++] = nvrm_scratch_names(nc, ipc_cli, x, off0, pat);
                    }
                    if (!tg[t]) continue;
                    struct nvrm_pool_rule u = {.hop = 2,
                                               .dp = q - (int)o,
                                               .dp2 = h2->r1[k],
                                               .dh = h2->r2[k],
                                               .cli_fixed = ipc_cli};
                    size_field(b[j].d, lo, hi, (int)o, s->msize[i], &u);
                    add_rule(d, &u);
                }
            }
        }
    free(sn.t);
    free(b);
    return places;
}

/* The same two pointers away without the handle-family filter, for when the
 * filtered search found nothing (CUDA's handles of another kind): every u32
 * tried once, at most `budget` duplications. */
static void pool_rules_hop2_any(struct nvrm_ctx *nc, const struct pscratch *s, int i,
                                uint32_t ipc_cli, struct raw_rules *d, int budget)
{
    struct nvrm_blk *b = malloc(NVRM_WALK_POOL_B * sizeof *b);
    struct seen sn = {calloc(1u << 17, 4), 1u << 17};
    if (!b || !sn.t || !ipc_cli) {
        free(b);
        free(sn.t);
        return;
    }
    int nb = nvrm_walk((uint64_t)(uintptr_t)s->pool, b, NVRM_WALK_POOL_B, NVRM_WALK_POOL_L);
    const uint64_t off0 = s->va[i] - s->mbase[i];
    uint8_t b1[NVRM_WALK_BLK], b2[NVRM_WALK_BLK];
    for (int j = 0; j < nb && d->n < RAW_RULES && budget > 0; j++)
        for (uint32_t o = 0; o + 8 <= b[j].len && d->n < RAW_RULES && budget > 0; o += 8) {
            uint64_t v;
            memcpy(&v, b[j].d + o, 8);
            if (v != s->mbase[i]) continue;
            int lo = (int)o - POOL_WIN < 0 ? 0 : (int)o - POOL_WIN;
            int hi = (int)o + POOL_WIN > b[j].len ? b[j].len : (int)o + POOL_WIN;
            for (int q = lo - lo % 8; q + 8 <= hi && budget > 0; q += 8) {
                uint64_t p;
                memcpy(&p, b[j].d + q, 8);
                if (q == (int)o || !ptr_ok(p) || nvrm_safe_read(p, b1, sizeof b1)) continue;
                for (int r1 = 0; r1 + 8 <= (int)sizeof b1 && budget > 0; r1 += 8) {
                    uint64_t p2;
                    memcpy(&p2, b1 + r1, 8);
                    if (!ptr_ok(p2) || p2 == p || nvrm_safe_read(p2, b2, sizeof b2)) continue;
                    for (int r2 = 0; r2 + 4 <= (int)sizeof b2 && budget > 0; r2 += 4) {
                        uint32_t x;
                        memcpy(&x, b2 + r2, 4);
                        if (!x || nvrm_is_client(x) || !seen_add(&sn, x)) continue;
                        budget--;
                        if (!nvrm_scratch_names(nc, ipc_cli, x, off0, s->pat[i])) continue;
                        struct nvrm_pool_rule u = {.hop = 2,
                                                   .dp = q - (int)o,
                                                   .dp2 = r1,
                                                   .dh = r2,
                                                   .cli_fixed = ipc_cli};
                        size_field(b[j].d, lo, hi, (int)o, s->msize[i], &u);
                        add_rule(d, &u);
                    }
                }
            }
        }
    free(sn.t);
    free(b);
}

/* Per raw layout: allocations it names rightly, and whether it ever named
 * a wrong object (video memory large enough, without the pattern). */
struct verdict {
    int right, wrong;
    uint32_t rmask; /* the allocations (bit = index over both pools) it named */
};

/* Judges every raw layout on live allocation i of s (one walk of the pool). */
static void judge(struct nvrm_ctx *nc, const struct raw_rules *raw, const struct pscratch *s, int i,
                  int bit, struct verdict *v)
{
    struct nvrm_blk *b = malloc(NVRM_WALK_POOL_B * sizeof *b);
    if (!b) return;
    int nb = nvrm_walk((uint64_t)(uintptr_t)s->pool, b, NVRM_WALK_POOL_B, NVRM_WALK_POOL_L);
    const uint64_t off = s->va[i] - s->mbase[i];
    for (int k = 0; k < raw->n; k++) {
        struct nvrm_pool_desc one = {1, {raw->r[k]}, 0};
        uint32_t cc[NVRM_MAX_CAND], oo[NVRM_MAX_CAND];
        int n = nvrm_pool_scan(&one, b, nb, s->mbase[i], s->msize[i], cc, oo, NVRM_MAX_CAND, NULL);
        if (n >= NVRM_MAX_CAND) {
            v[k].wrong++; /* a lookup that fills its list is refused anyway */
            continue;
        }
        int right = 0;
        for (int c = 0; c < n; c++) {
            uint32_t h = 0;
            if (!oo[c] || oo[c] == cc[c] ||
                nvrm_dup(nc, cc[c], oo[c], &h, "learning: judging a candidate"))
                continue;
            uint64_t sz = 0;
            int big = nvrm_class_of(nc, h) == NVRM_CLASS_LOCAL_USER &&
                      ((sz = nvrm_obj_size(nc, h)) == 0 || sz >= s->msize[i]);
            if (big) {
                if (nvrm_scratch_holds(nc, h, off, s->pat[i])) right = 1;
                else v[k].wrong++;
            }
            nvrm_rm_free(nc, nc->hDevice, h, "learning: freeing a candidate");
            nvrm_live_add(&nc->n_mem, -1);
        }
        v[k].right += right;
        if (right) v[k].rmask |= 1u << bit;
    }
    free(b);
}

static int pool_rule_picks(struct nvrm_ctx *nc, const struct nvrm_pool_desc *d,
                           const struct pscratch *s, int i, int exact)
{
    uint32_t cc[NVRM_MAX_CAND], oo[NVRM_MAX_CAND];
    int n = nvrm_desc_pool_candidates(d, (uint64_t)(uintptr_t)s->pool, s->mbase[i], s->msize[i],
                                      cc, oo, NVRM_MAX_CAND);
    return nvrm_scratch_rule_picks(nc, cc, oo, n, s->msize[i], exact, s->va[i] - s->mbase[i],
                                   s->pat[i]);
}

static int distinct_chunks(const struct pscratch *s)
{
    int n = 0;
    for (int i = 0; i < s->nva; i++) {
        if (!s->live[i]) continue;
        int dup = 0;
        for (int j = 0; j < i; j++) dup |= s->live[j] && s->mbase[j] == s->mbase[i];
        n += !dup;
    }
    return n;
}

int nvrm_learn_pool(int device, struct nvrm_ctx *nc, int fdkind, struct nvrm_pool_desc *out,
                    char *why, size_t wl)
{
    struct pscratch s[2];
    memset(s, 0, sizeof s);
    struct raw_rules raw;
    memset(&raw, 0, sizeof raw);
    struct nvrm_pool_desc d;
    memset(&d, 0, sizeof d);
    int rc = -1, places = 0;
    /* pool 1: a chunk-start allocation (freed again below), one at an offset
     * behind it, then two of 3/4 of a chunk (the second cannot share a chunk
     * with the first) and one of 5/4 of a chunk; pool 2: one allocation */
    static const size_t sz1[] = {1u << 20, 64u << 10, 3, 3, 5};
    static const size_t sz2[] = {1u << 20};
    /* GDRPY_NVRM_POOL_LEARN_ONE_CHUNK=1 (diagnostics only): the earlier
     * learner's scratch (1 MiB + 64 KiB in one chunk), to compare with */
    const char *one = getenv("GDRPY_NVRM_POOL_LEARN_ONE_CHUNK");
    const int n1 = one && *one == '1' ? 2 : 5;
    const unsigned fm1 = n1 == 5 ? 1u : 0u;
    if (pscratch_alloc(device, fdkind, &s[0], sz1, n1, fm1) ||
        (fdkind != NVRM_POOL_DEFAULT && pscratch_alloc(device, fdkind, &s[1], sz2, 1, 0))) {
        snprintf(why, wl, "scratch pools: %s", gdrpy_last_error());
        goto out;
    }
    uint32_t ipc_cli = nvrm_cuda_client(device), fam = nvrm_cuda_handle(device);
    struct hop2_cache *c2 = calloc(1, sizeof *c2);
    /* raw layouts from one allocation of each chunk */
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < s[p].nva; i++) {
            int first = s[p].live[i];
            for (int j = 0; j < i && first; j++) first = !(s[p].live[j] && s[p].mbase[j] == s[p].mbase[i]);
            if (first) places += pool_rules(nc, &s[p], i, ipc_cli, ipc_cli ? fam : 0, c2, &raw);
        }
    gp_log(1, "nvrm: pool learn (%s): %d + %d scratch chunks, base at %d places, %d "
              "raw layouts; route C's client 0x%x, a handle of it 0x%x",
           nvrm_pool_kind_name(fdkind), distinct_chunks(&s[0]), distinct_chunks(&s[1]), places, raw.n,
           ipc_cli, fam);
    free(c2);
    c2 = NULL;
    if (!raw.n) {
        /* the family filter may have hidden it: once more without, on the
         * first chunk's allocation, within a budget of duplications */
        int i0 = 0;
        while (i0 < s[0].nva && !s[0].live[i0]) i0++;
        if (i0 < s[0].nva) pool_rules_hop2_any(nc, &s[0], i0, ipc_cli, &raw, 60000);
        gp_log(1, "nvrm: pool learn: unfiltered search two pointers away: %d raw layouts", raw.n);
    }
    if (!raw.n) {
        snprintf(why, wl, "no RM handle within %d bytes of a chunk's mapping base in the scratch "
                          "pools' records, nor one or two pointers away, holds its pattern (the "
                          "bases were found at %d places)",
                 POOL_WIN, places);
        nvrm_pool_diag("scratch chunk, no layout", (uint64_t)(uintptr_t)s[0].pool, s[0].mbase[1],
                       s[0].msize[1]);
        goto out;
    }
    struct verdict v[RAW_RULES];
    memset(v, 0, sizeof v);
    int nlive = 0;
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < s[p].nva; i++)
            if (s[p].live[i]) {
                judge(nc, &raw, &s[p], i, nlive, v);
                nlive++;
            }
    for (int k = 0; k < raw.n; k++) {
        const struct nvrm_pool_rule *u = &raw.r[k];
        gp_log(1, "nvrm: pool learn raw layout %d: hop %d dp %+d dp2 +%d dh %+d dc %+d client %s "
                  "size %s%+d: right on %d of %d allocations, wrong objects %d",
               k, u->hop, u->dp, u->dp2, u->dh, u->dc, u->cli_fixed ? "fixed" : "in record",
               u->has_size ? "at " : "none ", u->ds, v[k].right, nlive, v[k].wrong);
    }
    /* the fewest, most general sound layouts that pick every allocation:
     * those right on all first (as many as fit), else a greedy cover of the
     * allocations by sound layouts, then down to those right on fewer */
    int ok = 0, bad_i = -1, bad_p = 0, nsound = 0;
    const uint32_t all = nlive >= 32 ? ~0u : (1u << nlive) - 1;
    for (int k = 0; k < raw.n; k++) nsound += !v[k].wrong && v[k].right > 0;
    for (int t = nlive + 1; t > 0 && !ok; t--) {
        memset(&d, 0, sizeof d);
        if (t == nlive) {
            /* greedy cover: the layout naming most of what is left, each time */
            uint32_t cov = 0;
            int used[RAW_RULES] = {0};
            while (cov != all && d.n < NVRM_DESC_RULES) {
                int best = -1, bn = 0;
                for (int k = 0; k < raw.n; k++) {
                    if (used[k] || v[k].wrong) continue;
                    int nn = __builtin_popcount(v[k].rmask & ~cov);
                    if (nn > bn) {
                        bn = nn;
                        best = k;
                    }
                }
                if (best < 0) break;
                used[best] = 1;
                cov |= v[best].rmask;
                d.r[d.n++] = raw.r[best];
            }
        } else {
            const int t2 = t > nlive ? nlive : t;
            for (int want = nlive; want >= t2; want--)
                for (int k = 0; k < raw.n && d.n < NVRM_DESC_RULES; k++)
                    if (!v[k].wrong && v[k].right == want) d.r[d.n++] = raw.r[k];
        }
        if (!d.n) continue;
        ok = 1;
        for (int p = 0; p < 2 && ok; p++)
            for (int i = 0; i < s[p].nva && ok; i++)
                if (s[p].live[i] && !pool_rule_picks(nc, &d, &s[p], i, 0)) {
                    ok = 0;
                    bad_p = p;
                    bad_i = i;
                }
        gp_log(1, "nvrm: pool learn: %d layouts (%s, %d allocations): %s", d.n,
               t > nlive ? "right on all" : t == nlive ? "greedy cover"
                                                       : "right on fewer",
               nlive,
               ok ? "pick every allocation" : "miss one");
    }
    if (!ok) {
        snprintf(why, wl, "of %d record layouts that named the memory of a scratch allocation, "
                          "%d never named a wrong object, and no set of them picked exactly the right "
                          "object for every one of %d scratch allocations in %d chunks (first "
                          "miss: pool %d allocation %d)",
                 raw.n, nsound, nlive, distinct_chunks(&s[0]) + distinct_chunks(&s[1]), bad_p + 1,
                 bad_i);
        if (bad_i >= 0)
            nvrm_pool_diag("scratch chunk, not learned", (uint64_t)(uintptr_t)s[bad_p].pool,
                           s[bad_p].mbase[bad_i], s[bad_p].msize[bad_i]);
        goto out;
    }
    nvrm_pool_diag(fdkind ? "scratch chunk (fd)" : "scratch chunk", (uint64_t)(uintptr_t)s[0].pool,
                   s[0].mbase[1], s[0].msize[1]);
    /* does RM's size of a chunk's object equal the chunk's mapping?  then a
     * record naming an object of another size is refused at every pin */
    d.size_exact = 1;
    for (int p = 0; p < 2 && d.size_exact; p++)
        for (int i = 0; i < s[p].nva && d.size_exact; i++)
            if (s[p].live[i]) d.size_exact = pool_rule_picks(nc, &d, &s[p], i, 1);
    *out = d;
    rc = 0;
    char rs[256];
    size_t u = 0;
    for (int k = 0; k < d.n && u < sizeof rs; k++)
        u += (size_t)(d.r[k].hop == 2 ? snprintf(rs + u, sizeof rs - u, " [%+d]->[+0x%x]->+0x%x",
                                                 d.r[k].dp, d.r[k].dp2, d.r[k].dh)
                      : d.r[k].hop    ? snprintf(rs + u, sizeof rs - u, " [%+d]->+0x%x", d.r[k].dp, d.r[k].dh)
                                      : snprintf(rs + u, sizeof rs - u, " %+d", d.r[k].dh));
    gp_log(1, "nvrm: pool records learned (%s): RM handle relative to a "
              "mapping-base field at%s; client %s, size %s (confirmed on %d scratch allocations "
              "in %d chunks)",
           nvrm_pool_kind_name(fdkind), rs, d.r[0].cli_fixed ? "route C's" : "in the record",
           d.r[0].has_size ? "checked" : "not in the record", nlive,
           distinct_chunks(&s[0]) + distinct_chunks(&s[1]));
    gp_log(1, "nvrm: pool records (%s): RM's size of a chunk %s its mapping's",
           nvrm_pool_kind_name(fdkind), d.size_exact ? "equals" : "does not always equal");
out:
    pscratch_free(&s[1]);
    pscratch_free(&s[0]);
    return rc;
}
