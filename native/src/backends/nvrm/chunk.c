/*
 * chunk.c - nvrm backend: pins by GPU page over the physical chunk that
 * backs cuMemAlloc memory (route C).
 *
 * CUDA sub-allocates small cuMemAlloc/cudaMalloc allocations of one context
 * inside larger RM memory objects ("chunks", often 2 MiB), mapped at a GPU
 * virtual range of their own: allocation VA = chunk VA + offset in the RM
 * object (the IPC handle's offset word).  GDRCopy clients pin whole 64 KiB
 * GPU pages (UCX: [addr & ~0xffff, round_up(addr + len, 64 KiB))), which
 * reach past a small allocation into its neighbours or into free space of
 * the same chunk; nvidia_p2p_get_pages accepts that, and so does this
 * backend, under these proofs:
 *  - the anchor (the first allocation in the range) is the caller's, by the
 *    route C proofs (RM dup from CUDA's own client of this process, then the
 *    identity check against cuMemcpyDtoH);
 *  - the whole range lies inside the anchor's RM object (the chunk);
 *  - every other allocation met in the range names the same RM client,
 *    the same RM object, and the same chunk base (VA - offset): it is
 *    memory of the same chunk, hence of the same context.
 * Anything else is refused with the range that is allowed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <string.h>

#include "cudadrv.h"
#include "internal.h"
#include "nvrm.h"

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
    uint64_t a = *lo, b = *hi;
    if (a < clo || b > chi) {
        uint64_t ok_lo = a > clo ? a : clo, ok_hi = b < chi ? b : chi;
        return gp_err(GDRPY_EINVAL, "range [0x%llx, 0x%llx) reaches GPU memory outside the "
                                    "chunk that backs the allocation at 0x%llx: CUDA's RM memory object "
                                    "0x%x covers [0x%llx, 0x%llx) of this context, and memory past it is not "
                                    "proven to be the caller's; pin within [0x%llx, 0x%llx)",
                      (unsigned long long)a, (unsigned long long)b,
                      (unsigned long long)cp->base, W_MEM, (unsigned long long)clo,
                      (unsigned long long)chi, (unsigned long long)ok_lo,
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
