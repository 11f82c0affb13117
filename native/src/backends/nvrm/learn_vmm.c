/*
 * learn_vmm.c - nvrm backend: learns where CUDA names the RM memory of a VMM
 * allocation created without an exportable handle type (route V), on scratch
 * memory of the backend's own: behind the address cuMemRetainAllocationHandle
 * returns.  route_v.c asks once per process and device, at the first pin of
 * such memory (not at open), and keeps the answer; it costs tens of
 * milliseconds.  Pools are learned by learn_pool.c.
 *
 * Learning: a random pattern is written through CUDA into scratch memory of
 * our own (the only memory this file writes); the words behind CUDA's handle
 * are read without faulting (desc.c); a candidate RM handle counts only if
 * its duplicate in our client is video memory whose bytes, read through BAR1
 * at the expected offset, are the pattern (scratch.c).  Every place the
 * proven handle was seen is then tried on a second scratch allocation
 * without the RDMA flag, and only the places that named the right memory
 * every time are kept.  Finally the per-pin rule itself (desc.c: exactly one
 * candidate may be video memory large enough) must pick the right object on
 * both.  Otherwise the kind stays refused, with the reason.
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

enum { MAX_TRIES = 12000, /* candidate dups per client while learning */
       MAX_CLI = 6 };

/* ---- scratch memory of our own ----------------------------------------- */

struct vscratch {
    CUdeviceptr va;
    size_t size;
    CUmemGenericAllocationHandle h;
    int mapped, reserved, created;
    uint8_t pat[NVRM_SCRATCH_PAT];
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
    nvrm_scratch_pattern(s->pat, NVRM_SCRATCH_PAT, s->va);
    return gp_cuda_private_copy(device, 0, s->va, s->pat, NVRM_SCRATCH_PAT);
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
                if (nvrm_scratch_names(nc, cs[c], x, 0, s->pat)) {
                    *cli = cs[c];
                    *obj = x;
                    return 0;
                }
            }
    }
    return -1;
}

/* Does the place's u32 lie inside the heap block that holds it?  The block
 * is where the path's last pointer leads; glibc keeps a chunk's size (flags
 * in the low 3 bits) in the 8 bytes before it.  Unknown sizes count as
 * inside (a preference, not a proof: the proof is the per-pin rule). */
static int place_inside(uint64_t root, const struct nvrm_path *p)
{
    uint64_t a = root;
    for (int h = 0; h < p->hops; h++) {
        uint64_t v;
        if (nvrm_safe_read(a + p->off[h], &v, 8)) return 1;
        a = v;
    }
    uint64_t sz = 0;
    if (nvrm_safe_read(a - 8, &sz, 8)) return 1;
    sz &= ~7ull;
    if (sz < 32 || sz > (1u << 20)) return 1;
    return (uint64_t)p->off[p->hops] + 4 <= sz - 8;
}

int nvrm_learn_vmm(int device, struct nvrm_ctx *nc, struct nvrm_vmm_desc *out, char *why,
                   size_t wl)
{
    int rc = -1;
    enum { VMM_EXTRA = 3 };
    struct vscratch s1, s2, sx[VMM_EXTRA];
    CUmemGenericAllocationHandle hx[VMM_EXTRA] = {0};
    memset(&s1, 0, sizeof s1);
    memset(&s2, 0, sizeof s2);
    memset(sx, 0, sizeof sx);
    struct nvrm_blk *b = malloc(NVRM_WALK_VMM_B * sizeof *b);
    if (!b || vscratch_alloc(device, 1, &s1)) {
        snprintf(why, wl, "scratch allocation: %s", b ? gdrpy_last_error() : "out of memory");
        free(b);
        vscratch_free(&s1);
        return rc;
    }
    uint32_t ipc_cli = nvrm_cuda_client(device), cli = 0, obj = 0;
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
                   nvrm_scratch_names(nc, c2, o2, 0, s2.pat);
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
        for (int k = 0; k < n && !good; k++) good = oo[k] != obj && nvrm_scratch_names(nc, cc[k], oo[k], 0, s2.pat);
        if (good) d.obj[d.nobj++] = P[i];
    }
    /* soundness, as a busy process needs it: with more allocations alive, a
     * place that names another allocation's object (a neighbour in CUDA's
     * lists) is dropped; kept are the places right on every allocation and
     * never naming a wrong live object */
    const struct vscratch *all[2 + VMM_EXTRA] = {&s1, &s2};
    CUmemGenericAllocationHandle ha[2 + VMM_EXTRA] = {h1, h2};
    int nall = 2;
    for (int k = 0; k < VMM_EXTRA; k++) {
        if (vscratch_alloc(device, k != 1, &sx[k]) ||
            gp_cu.MemRetainAllocationHandle(&hx[k], (void *)(uintptr_t)sx[k].va)) {
            snprintf(why, wl, "scratch allocation %d: %s", 3 + k, gdrpy_last_error());
            goto out;
        }
        all[nall] = &sx[k];
        ha[nall++] = hx[k];
    }
    struct nvrm_vmm_desc kept = d;
    kept.nobj = 0;
    for (int i = 0; i < d.nobj; i++) {
        struct nvrm_vmm_desc one = d;
        one.nobj = 1;
        one.obj[0] = d.obj[i];
        int right = 0, wrong = 0;
        for (int a = 0; a < nall; a++) {
            uint32_t cc[NVRM_MAX_CAND], oo[NVRM_MAX_CAND];
            int n = nvrm_desc_vmm_candidates(&one, (uint64_t)ha[a], cc, oo, NVRM_MAX_CAND), r = 0;
            for (int k = 0; k < n; k++) {
                uint32_t h = 0;
                if (nvrm_dup(nc, cc[k], oo[k], &h, "learning: judging a candidate")) continue;
                uint64_t sz = 0;
                if (nvrm_class_of(nc, h) == NVRM_CLASS_LOCAL_USER &&
                    ((sz = nvrm_obj_size(nc, h)) == 0 || sz >= all[a]->size)) {
                    if (nvrm_scratch_holds(nc, h, 0, all[a]->pat)) r = 1;
                    else wrong++;
                }
                nvrm_free_dups(nc, &h, 1, "learning: freeing a candidate");
            }
            right += r;
        }
        char ps[96];
        nvrm_path_str(&d.obj[i], ps, sizeof ps);
        gp_log(1, "nvrm: route V learning: place %s right on %d of %d scratch allocations, wrong "
                  "objects %d",
               ps, right, nall, wrong);
        if (!wrong && right == nall) kept.obj[kept.nobj++] = d.obj[i];
    }
    d = kept;
    /* fewest places: one that alone picks every allocation is kept alone
     * (on the round-5 GPU machine a second place, right on every scratch allocation, named
     * a pool chunk for an allocation of a busy process: the pin was refused
     * as ambiguous) */
    for (int pass = 0, done = 0; pass < 2 && !done && d.nobj > 1; pass++)
        for (int i = 0; i < d.nobj && !done; i++) {
            /* first the places inside the heap block that holds them (glibc's
         * chunk size before the block): one past its end is a neighbour's */
            if (pass == 0 && !place_inside((uint64_t)h1, &d.obj[i])) continue;
            struct nvrm_vmm_desc one = d;
            one.nobj = 1;
            one.obj[0] = d.obj[i];
            int all_ok = one.cli_fixed || one.ncli > 0;
            for (int a = 0; a < nall && all_ok; a++) {
                uint32_t cc[NVRM_MAX_CAND], oo[NVRM_MAX_CAND];
                all_ok = nvrm_scratch_rule_picks(
                    nc, cc, oo, nvrm_desc_vmm_candidates(&one, (uint64_t)ha[a], cc, oo, NVRM_MAX_CAND),
                    all[a]->size, 0, 0, all[a]->pat);
            }
            if (all_ok) {
                d = one;
                done = 1;
            }
        }
    /* the per-pin rule must pick the right object on every allocation */
    int ok = d.nobj > 0 && (d.cli_fixed || d.ncli > 0);
    d.size_exact = ok;
    for (int a = 0; a < nall && ok; a++) {
        uint32_t cc[NVRM_MAX_CAND], oo[NVRM_MAX_CAND];
        int n = nvrm_desc_vmm_candidates(&d, (uint64_t)ha[a], cc, oo, NVRM_MAX_CAND);
        ok = nvrm_scratch_rule_picks(nc, cc, oo, n, all[a]->size, 0, 0, all[a]->pat);
        /* does RM's size of the object equal the mapping's?  then a record
         * naming an object of another size is refused at every pin */
        if (ok && d.size_exact)
            d.size_exact = nvrm_scratch_rule_picks(nc, cc, oo, n, all[a]->size, 1, 0, all[a]->pat);
    }
    if (!ok) {
        snprintf(why, wl, "the %d places that named the memory of one scratch allocation did "
                          "not name exactly the memory of %d others (%d kept)",
                 np, nall - 1, d.nobj);
        goto out;
    }
    *out = d;
    rc = 0;
    char ps[96], cs[96] = "route C's client";
    nvrm_path_str(&d.obj[0], ps, sizeof ps);
    if (!d.cli_fixed) nvrm_path_str(&d.cli[0], cs, sizeof cs);
    gp_log(1, "nvrm: route V learned: RM memory handle at %s (%d places), client %s "
              "(confirmed on %d scratch allocations; RM size %s the mapping's)",
           ps, d.nobj, cs, nall, d.size_exact ? "equals" : "does not always equal");
out:
    for (int k = 0; k < VMM_EXTRA; k++) {
        if (hx[k]) gp_cu.MemRelease(hx[k]);
        vscratch_free(&sx[k]);
    }
    if (h1) gp_cu.MemRelease(h1);
    if (h2) gp_cu.MemRelease(h2);
    vscratch_free(&s2);
    vscratch_free(&s1);
    free(b);
    return rc;
}
