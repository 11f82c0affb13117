/*
 * route_c.c - nvrm backend, route C: cuMemAlloc / cudaMalloc memory.
 * RM_DUP_OBJECT of CUDA's own RM handle, found through the (undocumented)
 * cuIpcGetMemHandle words whose layout the self-test learns and proves on
 * scratch memory of its own (below), checked per pin against CUDA's
 * documented pointer attributes and RM's size of the object, and, read-only,
 * against CUDA's copy of the bytes (identity.c; docs/nvrm.md).  The
 * self-test's scratch is cuMemAlloc memory kept for the life of the process
 * (desc.c: cuMemFree would wait for the caller's kernels).
 *
 * Pins by GPU page over the physical chunk that backs cuMemAlloc memory
 * (below).  CUDA sub-allocates small cuMemAlloc/cudaMalloc allocations of one context
 * inside larger RM memory objects ("chunks", often 2 MiB), mapped at a GPU
 * virtual range of their own: allocation VA = chunk VA + offset in the RM
 * object (the IPC handle's offset word).  GDRCopy clients pin whole 64 KiB
 * GPU pages (UCX: [addr & ~0xffff, round_up(addr + len, 64 KiB))), which
 * reach past a small allocation into its neighbours or into free space of
 * the same chunk; nvidia_p2p_get_pages accepts that, and so does this
 * backend, under these proofs:
 *  - the anchor (the first allocation in the range) is the caller's, by the
 *    route C proofs (RM dup from CUDA's own client of this process, then the
 *    identity check against CUDA's copy of its bytes);
 *  - the whole range lies inside the anchor's RM object (the chunk);
 *  - every other allocation met in the range names the same RM client,
 *    the same RM object, and the same chunk base (VA - offset): it is
 *    memory of the same chunk, hence of the same context.
 * Anything else is refused with the range that is allowed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <string.h>

#include "cudadrv.h"
#include "internal.h"
#include "nvrm.h"

#ifdef GDRPY_NVRM_TESTING
/* Test builds only (tests/gpu): added to the object offset the IPC words
 * give, to prove that the checks refuse a wrong mapping. */
GP_HIDDEN uint64_t gp_nvrm_test_skew;
#endif

/* ---- per pin: IPC words -> dup ----------------------------------------- */

/* CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR of p, or 0 where CUDA has none. */
static uint64_t mapping_base(uint64_t p)
{
    uint64_t v = 0;
    if (gp_cu.PointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, p)) return 0;
    return v;
}

int nvrm_dup_legacy(gp_ctx *ctx, struct nvrm_ctx *nc, const gp_cuda_ptr *cp,
                    uint32_t *hOut, uint64_t *objoff, int *tied)
{
    *tied = 0;
    const struct nvrm_ipc_layout *L = nc->st ? &nc->st->ipc : NULL;
    if (!L || !L->valid)
        return gp_err(GDRPY_ENOTSUP, "pinning cuMemAlloc memory (route C): the self-test has "
                                     "not proven the IPC handle layout on this device");
    uint32_t w[16];
    int rc = nvrm_ipc_words(cp->base, w);
    if (rc) return rc;
    uint32_t hcli = w[L->w_client], hobj = w[L->w_mem];
    uint64_t off = L->w_off >= 0 ? w[L->w_off] : 0;
    uint64_t objsize = L->w_pages >= 0 ? (uint64_t)w[L->w_pages] * 4096 : 0;
    uint64_t mb = L->mapbase ? mapping_base(cp->base) : 0;
#ifdef GDRPY_NVRM_TESTING
    off += gp_nvrm_test_skew;
#endif
    const char *bad = NULL;
    /* The size word is 32 bits: only the size's low half is compared (an
     * allocation past 4 GiB); the pages word and RM's own size of the object
     * (below) bound the rest, in 64 bits. */
    if (w[L->w_size] != (uint32_t)cp->size) bad = "the size word is not the allocation's size";
    else if (hcli == 0 || hobj == 0 || hcli == nc->hClient) bad = "the handle words are not "
                                                                  "CUDA's";
    else if (objsize && (off > objsize || cp->size > objsize - off))
        bad = "the allocation does not fit in the RM object at the offset word";
    else if (((cp->base ^ off) & (uint64_t)(nvrm_host_page() - 1)) != 0)
        bad = "the offset word is not congruent with the address modulo the page size";
    else if (!L->off_proven && off != 0)
        bad = "the self-test could not prove the offset word, and it is non-zero here";
    else if (L->mapbase && (!mb || cp->base - mb != off))
        bad = "the offset word disagrees with CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR";
    if (bad)
        return gp_err(GDRPY_ENOTSUP, "the IPC handle of the allocation at 0x%llx (%llu bytes) "
                                     "does not check out against the layout the self-test proved (%s: size "
                                     "word 0x%x, client 0x%x, object 0x%x, offset 0x%llx, mapping base "
                                     "0x%llx): refusing to guess; allocate with cuMemCreate + POSIX_FD",
                      (unsigned long long)cp->base, (unsigned long long)cp->size, bad,
                      w[L->w_size], hcli, hobj, (unsigned long long)off,
                      (unsigned long long)mb);
    char what[128];
    snprintf(what, sizeof what, "duplicating CUDA's RM memory 0x%x (client 0x%x) of "
                                "the allocation at 0x%llx",
             hobj, hcli, (unsigned long long)cp->base);
    rc = nvrm_dup(nc, hcli, hobj, hOut, what);
    if (rc) {
        if (nvrm_last_rm_status != NV_OK)
            gp_err_prefix(nvrm_nv_status_code(nvrm_last_rm_status),
                          "CUDA device %d: the IPC handle words do not name an RM "
                          "object this client can duplicate",
                          ctx->device);
        return rc;
    }
    /* RM's own size of the object, where the self-test could read it: the
     * object named must hold the pages word's bytes and the allocation at its
     * offset (RM rounds larger objects up: 3 MiB + 4 KiB of pages sat in a
     * 4 MiB object on the H200), so words that name a smaller object are
     * refused here */
    uint64_t rmsize = L->pages_rm ? nvrm_obj_size(nc, *hOut) : 0;
    if (L->pages_rm && (rmsize < objsize || off > rmsize || cp->size > rmsize - off)) {
        nvrm_free_dups(nc, hOut, 1, "freeing a refused dup");
        return gp_err(GDRPY_ENOTSUP, "the IPC handle of the allocation at 0x%llx names RM "
                                     "memory 0x%x (client 0x%x) whose RM size is 0x%llx bytes, "
                                     "less than the handle's pages word (0x%llx) or the "
                                     "allocation at its offset (0x%llx + 0x%llx): not this "
                                     "allocation's memory; refusing to pin",
                      (unsigned long long)cp->base, hobj, hcli, (unsigned long long)rmsize,
                      (unsigned long long)objsize, (unsigned long long)off,
                      (unsigned long long)cp->size);
    }
    *objoff = off;
    /* the offset word was checked against CUDA's documented mapping base:
     * the bytes only cross-check (identity.c) */
    *tied = L->mapbase;
    return 0;
}

/* ---- pins by GPU page over the chunk ----------------------------------- */

/* cuMemAlloc's smallest alignment: allocations start on multiples of it,
 * so free space is skipped in steps of this size. */
#define NVRM_ALLOC_ALIGN 256u

/* The first CUDA allocation met walking [lo, hi), or 0. */
uint64_t nvrm_first_alloc(uint64_t lo, uint64_t hi)
{
    for (uint64_t x = lo; x < hi;) {
        CUdeviceptr b = 0;
        size_t s = 0;
        if (gp_cu.MemGetAddressRange(&b, &s, x) == CUDA_SUCCESS && s)
            return x;
        uint64_t nx = gp_round_up(x + 1, NVRM_ALLOC_ALIGN);
        if (nx <= x) break;
        x = nx;
    }
    return 0;
}

int nvrm_chunk_range(gp_ctx *ctx, const gp_cuda_ptr *cp, uint64_t objoff, uint64_t *lo,
                     uint64_t *hi, uint64_t *chunk_lo, uint64_t *chunk_hi)
{
    struct nvrm_ctx *nc = ctx->bpriv;
    const struct nvrm_ipc_layout *L = nc && nc->st ? &nc->st->ipc : NULL;
    if (!L || !L->valid)
        return gp_err(GDRPY_ENOTSUP, "route C layout not proven by the self-test");
    uint32_t w[16];
    int rc = nvrm_ipc_words(cp->base, w);
    if (rc) return rc;
    const uint32_t W_CLI = w[L->w_client], W_MEM = w[L->w_mem];
    uint64_t objsize = L->w_pages >= 0 ? (uint64_t)w[L->w_pages] * 4096 : 0;
    uint64_t clo = cp->base - objoff;
    uint64_t chi = objsize ? clo + objsize : gp_round_up(cp->base + cp->size, 4096);
    if (!objsize) clo = gp_round_down(cp->base, 4096); /* size unknown: the allocation */
    *chunk_lo = clo;
    *chunk_hi = chi;
    /* The object may end inside a GPU page (a large allocation's object is
     * its size rounded to 4 KiB): GDRCopy clients pin that whole page, so
     * the rest of it is accepted, and never mapped (backend.c) */
    const uint64_t tail_hi = gp_round_up(chi, GDRPY_GPU_PAGE_SIZE);
    uint64_t a = *lo, b = *hi;
    if (a < clo || b > tail_hi) {
        uint64_t ok_lo = a > clo ? a : clo, ok_hi = b < tail_hi ? b : tail_hi;
        return gp_err(GDRPY_EINVAL, "range [0x%llx, 0x%llx) reaches GPU memory outside the "
                                    "chunk that backs the allocation at 0x%llx: CUDA's RM memory object "
                                    "0x%x covers [0x%llx, 0x%llx) of this context (its last GPU page "
                                    "ends at 0x%llx), and memory past it is not proven to be the "
                                    "caller's; pin within [0x%llx, 0x%llx)",
                      (unsigned long long)a, (unsigned long long)b,
                      (unsigned long long)cp->base, W_MEM, (unsigned long long)clo,
                      (unsigned long long)chi, (unsigned long long)tail_hi,
                      (unsigned long long)ok_lo,
                      (unsigned long long)(ok_hi > ok_lo ? ok_hi : ok_lo));
    }
    /* Every allocation in the range must live in the same chunk. */
    for (uint64_t x = a; x < b;) {
        CUdeviceptr base = 0;
        size_t sz = 0;
        if (gp_cu.MemGetAddressRange(&base, &sz, x) != CUDA_SUCCESS || !sz) {
            uint64_t nx = gp_round_up(x + 1, NVRM_ALLOC_ALIGN);
            if (nx <= x) break;
            x = nx;
            continue;
        }
        if (base != cp->base) {
            uint32_t v[16];
            rc = nvrm_ipc_words(base, v);
            if (rc)
                return gp_err_prefix(GDRPY_EINVAL, "range [0x%llx, 0x%llx) holds the "
                                                   "allocation [0x%llx, +%zu), which is not cuMemAlloc "
                                                   "memory of the chunk [0x%llx, 0x%llx); pin within one "
                                                   "kind of memory",
                                     (unsigned long long)a,
                                     (unsigned long long)b, (unsigned long long)base, sz,
                                     (unsigned long long)clo, (unsigned long long)chi);
            uint64_t voff = L->w_off >= 0 ? v[L->w_off] : 0;
            if (v[L->w_client] != W_CLI || v[L->w_mem] != W_MEM || (uint64_t)base - voff != clo)
                return gp_err(GDRPY_EINVAL, "range [0x%llx, 0x%llx) holds the allocation "
                                            "[0x%llx, +%zu) of another RM object (client 0x%x, object "
                                            "0x%x, chunk base 0x%llx) than the allocation at 0x%llx "
                                            "(client 0x%x, object 0x%x, chunk [0x%llx, 0x%llx)): a pin "
                                            "covers one chunk",
                              (unsigned long long)a, (unsigned long long)b,
                              (unsigned long long)base, sz, v[L->w_client], v[L->w_mem],
                              (unsigned long long)((uint64_t)base - voff),
                              (unsigned long long)cp->base, W_CLI, W_MEM,
                              (unsigned long long)clo, (unsigned long long)chi);
        }
        uint64_t nx = (uint64_t)base + sz;
        x = nx > x ? nx : x + NVRM_ALLOC_ALIGN;
    }
    return 0;
}

/* ---- the self-test of route C: learning the IPC words ------------------- */

struct scratch {
    uint64_t base;
    size_t size;
    uint32_t w[16];
};

/* Tries layout L on scratch s: words -> dup -> read-only data check.
 * 0 if the mapping shows the scratch memory. */
static int try_layout(int device, struct nvrm_ctx *nc, const struct nvrm_ipc_layout *L,
                      const struct scratch *s, struct nvrm_route_report *r, int *dups)
{
    const uint32_t *w = s->w;
    if (*dups >= 256) return -1; /* bounded search */
    if (w[L->w_size] != (uint32_t)s->size) return -1;
    uint32_t hcli = w[L->w_client], hobj = w[L->w_mem];
    if (!hcli || !hobj || hcli == nc->hClient) return -1;
    uint64_t off = L->w_off >= 0 ? w[L->w_off] : 0;
    if (((s->base ^ off) & 4095) != 0) return -1;
    uint32_t h;
    (*dups)++;
    if (nvrm_dup(nc, hcli, hobj, &h, "self-test: RM_DUP_OBJECT of an IPC word pair")) {
        nvrm_report_last(r, "IPC handle layout: RM_DUP_OBJECT", nc);
        return -1;
    }
    int rc = nvrm_scratch_check(device, nc, h, off, s->base, 0, r); /* -2 passes through */
    nvrm_rm_free(nc, nc->hDevice, h, "freeing a self-test dup");
    nvrm_live_add(&nc->n_mem, -1);
    return rc;
}

/* Finds the layout: the known one first, else a bounded search over word
 * pairs, each candidate proven by a data check on both scratch allocations. */
static int learn_layout(int device, struct nvrm_ctx *nc, struct scratch s[2],
                        struct nvrm_ipc_layout *out, struct nvrm_route_report *r)
{
    /* Seen with CUDA 13.0 and driver 580.159.04 (H100): w4 the allocation's
     * size, w6 the RM object's size in 4 KiB pages, w7 the allocation's
     * offset in it, w12 CUDA's RM client, w13 the RM memory handle. */
    struct nvrm_ipc_layout L = {.w_size = 4, .w_pages = 6, .w_off = 7, .w_client = 12, .w_mem = 13};
    int dups = 0;
    int t1 = try_layout(device, nc, &L, &s[1], r, &dups);
    int t0 = t1 == 0 ? try_layout(device, nc, &L, &s[0], r, &dups) : t1;
    if (t1 == -2 || t0 == -2) {
        /* Mapping or copying itself fails: no word layout would help. */
        return -1;
    }
    if (t1 == 0 && t0 == 0) {
        *out = L;
        out->searched = 0;
    } else {
        int found = 0;
        /* Candidates: the size word holds both sizes; the client word is the
         * same in both handles; a (client, memory) pair must be one RM_DUP
         * accepts; the offset word (or none: offset 0) must make the mapping
         * show the scratch pattern.  One dup per pair, bounded. */
        for (int i = 0; i < 16 && !found; i++) {
            if (s[0].w[i] != (uint32_t)s[0].size || s[1].w[i] != (uint32_t)s[1].size) continue;
            for (int c = 0; c < 16 && !found; c++) {
                if (c == i || !s[0].w[c] || s[0].w[c] != s[1].w[c]) continue;
                for (int m = 0; m < 16 && !found && dups < 256; m++) {
                    if (m == c || m == i || !s[1].w[m] || s[1].w[m] == s[1].w[c]) continue;
                    uint32_t h;
                    dups++;
                    if (nvrm_dup(nc, s[1].w[c], s[1].w[m], &h, "self-test: RM_DUP_OBJECT of "
                                                               "an IPC word pair"))
                        continue;
                    for (int o = -1; o < 16 && !found; o++) {
                        if (o == i || o == c || o == m) continue;
                        uint64_t off = o >= 0 ? s[1].w[o] : 0;
                        if (off >= (1u << 30) || ((s[1].base ^ off) & 4095)) continue;
                        if (nvrm_scratch_check(device, nc, h, off, s[1].base, 0, r) != 0) continue;
                        struct nvrm_ipc_layout t = {.w_size = i, .w_pages = -1, .w_off = o, .w_client = c, .w_mem = m};
                        if (try_layout(device, nc, &t, &s[0], r, &dups) == 0) {
                            *out = t;
                            out->searched = 1;
                            found = 1;
                        }
                    }
                    nvrm_rm_free(nc, nc->hDevice, h, "freeing a self-test dup");
                    nvrm_live_add(&nc->n_mem, -1);
                }
            }
        }
        if (!found) {
            char words[200];
            size_t u = 0;
            for (int k = 0; k < 16; k++)
                u += (size_t)snprintf(words + u, sizeof words - u, "%s%x", k ? " " : "",
                                      s[1].w[k]);
            char last[sizeof r->step + 160];
            snprintf(last, sizeof last, "%s: %.150s", r->step[0] ? r->step : "-",
                     r->detail[0] ? r->detail : "-");
            nvrm_report_fail(r, "IPC handle layout", "no layout of the cuIpcGetMemHandle words maps "
                                                     "the scratch allocation (%zu bytes at 0x%llx; words %s; %d duplications "
                                                     "tried; last failure: %s) [driver %s, CUDA %d]",
                             s[1].size,
                             (unsigned long long)s[1].base, words, dups, last, nc->version,
                             nc->cuda_version);
            return -1;
        }
    }
    /* Facts about the words that per-pin checks can rely on. */
    out->valid = 1;
    out->off_proven = 0;
    out->mapbase = 1;
    for (int k = 0; k < 2; k++) {
        uint64_t off = out->w_off >= 0 ? s[k].w[out->w_off] : 0;
        if (off) out->off_proven = 1;
        if (out->w_pages >= 0 && (uint64_t)s[k].w[out->w_pages] * 4096 < off + s[k].size)
            out->w_pages = -1; /* not the object size after all */
        uint64_t mb = 0;
        if (gp_cu.PointerGetAttribute(&mb, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, s[k].base) ||
            !mb || s[k].base - mb != off)
            out->mapbase = 0;
    }
    /* RM's own size of the object named: can it be read, and does it equal the
     * pages word on both (small allocations; larger objects are rounded up)? */
    out->pages_rm = out->w_pages >= 0;
    for (int k = 0; k < 2 && out->pages_rm; k++) {
        uint32_t h = 0;
        out->pages_rm = !nvrm_dup(nc, s[k].w[out->w_client], s[k].w[out->w_mem], &h,
                                  "self-test: the RM size of the object the words name");
        if (out->pages_rm)
            out->pages_rm = nvrm_obj_size(nc, h) == (uint64_t)s[k].w[out->w_pages] * 4096;
        nvrm_free_dups(nc, &h, 1, "freeing a self-test dup");
    }
    return 0;
}

/* The self-test's scratch is cuMemAlloc memory kept for the life of the
 * process (desc.c: cuMemFree would wait for the caller's kernels), slots
 * 0..2 of nvrm_kept_alloc. */
void nvrm_route_c_selftest(int device, struct nvrm_ctx *nc, struct nvrm_dev_state *st)
{
    struct nvrm_route_report *r = &st->route_c;
    r->tested = 1;
    if (!gp_cu.MemAlloc) {
        nvrm_report_fail(r, "scratch allocation", "libcuda lacks cuMemAlloc");
        return;
    }
    /* Two sizes no other word is likely to hold; the second usually sits
     * at a non-zero offset of the same RM object, which proves the offset
     * word. */
    struct scratch s[2];
    memset(s, 0, sizeof s);
    s[0].size = NVRM_KEPT0_SIZE;
    s[1].size = 0xa000;
    for (int k = 0; k < 2; k++) {
        s[k].base = nvrm_kept_alloc(device, k, s[k].size);
        if (!s[k].base) {
            gp_err(GDRPY_ENOMEM, "cuMemAlloc of the self-test scratch (%zu bytes) failed",
                   s[k].size);
            nvrm_report_last(r, "scratch allocation (cuMemAlloc)", nc);
            return;
        }
        if (nvrm_ipc_words(s[k].base, s[k].w)) {
            nvrm_report_last(r, "cuIpcGetMemHandle of the scratch allocation", nc);
            return;
        }
    }
    struct nvrm_ipc_layout L;
    memset(&L, 0, sizeof L);
    if (learn_layout(device, nc, s, &L, r)) return;
    /* Both at offset 0 of their RM objects: the offset word is unproven.
     * One more small allocation usually lands behind another one. */
    struct scratch extra;
    memset(&extra, 0, sizeof extra);
    if (!L.off_proven && L.w_off >= 0) {
        extra.size = 0x3000;
        extra.base = nvrm_kept_alloc(device, 2, extra.size);
        int dups = 0;
        if (extra.base && nvrm_ipc_words(extra.base, extra.w) == 0 && extra.w[L.w_off] != 0 &&
            try_layout(device, nc, &L, &extra, r, &dups) == 0)
            L.off_proven = 1;
        r->step[0] = r->detail[0] = '\0';
        if (L.mapbase) { /* the relation must hold here too */
            uint64_t mb = 0;
            if (!extra.base ||
                gp_cu.PointerGetAttribute(&mb, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                                          extra.base) ||
                extra.base - mb != extra.w[L.w_off])
                L.mapbase = 0;
        }
    }
    /* The real pin path on the second allocation: words + dup + identity. */
    st->ipc = L; /* what nvrm_dup_legacy reads */
    {
        gp_ctx fake;
        memset(&fake, 0, sizeof fake);
        fake.device = device;
        fake.bpriv = nc;
        gp_cuda_ptr cp;
        uint32_t hMem = 0;
        uint64_t objoff = 0;
        const uint64_t at = s[1].base + 4096 + 64;
        r->ok = 0;
        int tied = 0;
        if (gp_cuda_classify(at, NVRM_CHECK_BYTES, device, &cp)) {
            nvrm_report_last(r, "classify the scratch pointer", nc);
        } else if (nvrm_dup_legacy(&fake, nc, &cp, &hMem, &objoff, &tied)) {
            nvrm_report_last(r, "pin (IPC words + RM_DUP_OBJECT)", nc);
        } else {
            uint64_t rm_at = objoff + (at - cp.base);
            /* the data check leaves a random pattern there: the identity
             * check must then prove the object by its bytes alone */
            if (nvrm_scratch_check(device, nc, hMem, rm_at, at, 1, r) == 0) {
                if (nvrm_verify_identity(&fake, nc, hMem, at, rm_at, at, NVRM_CHECK_BYTES, 0))
                    nvrm_report_last(r, "identity check", nc);
                else
                    r->ok = 1;
            }
            nvrm_rm_free(nc, nc->hDevice, hMem, "freeing the self-test dup");
            nvrm_live_add(&nc->n_mem, -1);
        }
    }
    if (!r->ok) memset(&st->ipc, 0, sizeof st->ipc);
}
