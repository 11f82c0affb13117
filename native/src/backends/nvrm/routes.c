/*
 * routes.c - nvrm backend: how a CUDA allocation becomes an RM memory handle
 * in our client.
 *   route A - cuMemCreate memory: export as POSIX fd, import into our client;
 *   route C - cuMemAlloc memory: RM_DUP_OBJECT of CUDA's own RM handle, found
 *             through the (undocumented) cuIpcGetMemHandle words whose layout
 *             the self-test proved on its own scratch memory, checked per pin
 *             against CUDA's documented pointer attributes and, read-only,
 *             against cuMemcpyDtoH (nvrm_verify_identity; docs/nvrm.md).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cudadrv.h"
#include "internal.h"
#include "nvrm.h"

/* ---- route A: VMM memory, export fd -> import ------------------------- */

int nvrm_import_vmm(gp_ctx *ctx, struct nvrm_ctx *nc, uint64_t addr, const gp_cuda_ptr *cp,
                    uint32_t *hOut)
{
    if (!(cp->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return gp_err(GDRPY_ENOTSUP, "0x%llx is cuMemCreate memory created without "
                                     "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in requestedHandleTypes "
                                     "(handle types 0x%x): it cannot be exported to the driver; create it "
                                     "with that handle type (gdrpy.memory does)",
                      (unsigned long long)addr, cp->handle_types);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = gp_cu.MemRetainAllocationHandle(&h, (void *)(uintptr_t)addr);
    if (r)
        return gp_cuda_err(0, r, "cuMemRetainAllocationHandle", "allocation handle of 0x%llx",
                           (unsigned long long)addr);
    int fd = -1;
    r = gp_cu.MemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    gp_cu.MemRelease(h);
    if (r)
        return gp_cuda_err(0, r, "cuMemExportToShareableHandle",
                           "exporting the allocation at 0x%llx as a POSIX fd",
                           (unsigned long long)addr);
    return nvrm_import_fd(ctx, nc, addr, fd, hOut);
}

/* ---- route C: cuMemAlloc memory, IPC words -> dup --------------------- */

#ifdef GDRPY_NVRM_TESTING
/* Test builds only (tests/gpu): added to the object offset the IPC words
 * give, to prove that the checks refuse a wrong mapping. */
GP_HIDDEN uint64_t gp_nvrm_test_skew;
#endif

int nvrm_ipc_words(uint64_t base, uint32_t w[16])
{
    CUipcMemHandle ih;
    memset(&ih, 0, sizeof ih);
    CUresult r = gp_cu.IpcGetMemHandle(&ih, base);
    if (r)
        return gp_cuda_err(0, r, "cuIpcGetMemHandle", "IPC handle of the allocation at 0x%llx",
                           (unsigned long long)base);
    memcpy(w, ih.reserved, 16 * sizeof(uint32_t));
    return 0;
}

/* CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR of p, or 0 where CUDA has none. */
static uint64_t mapping_base(uint64_t p)
{
    uint64_t v = 0;
    if (gp_cu.PointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, p)) return 0;
    return v;
}

int nvrm_dup_legacy(gp_ctx *ctx, struct nvrm_ctx *nc, const gp_cuda_ptr *cp,
                    uint32_t *hOut, uint64_t *objoff)
{
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
    *objoff = off;
    return 0;
}

/* Reads [a, a+n) of a mapping with aligned 8-byte loads (BAR1 reads cost
 * ~1 us each, so never byte by byte).  `win` maps the page-aligned window
 * starting at address `wbase`. */
void nvrm_read_mapped(const volatile uint8_t *win, uint64_t wbase, uint64_t a, size_t n,
                      uint8_t *out)
{
    uint64_t lo = gp_round_down(a, 8), hi = gp_round_up(a + n, 8);
    while (lo < hi) {
        uint8_t tmp[256];
        uint64_t chunk_hi = hi - lo > sizeof tmp ? lo + sizeof tmp : hi;
        for (uint64_t x = lo; x < chunk_hi; x += 8) {
            uint64_t v = *(const volatile uint64_t *)(win + (x - wbase));
            memcpy(tmp + (x - lo), &v, 8);
        }
        uint64_t from = a > lo ? a : lo;
        uint64_t to = a + n < chunk_hi ? a + n : chunk_hi;
        memcpy(out + (from - a), tmp + (from - lo), (size_t)(to - from));
        lo = chunk_hi;
    }
}

static int dtoh(gp_ctx *ctx, void *dst, uint64_t src, size_t n)
{
    return gp_cuda_memcpy(ctx->device, 1, src, dst, n, NULL);
}

/* One window of the read-only comparison: bytes [s, s + n) (n <= 64, inside
 * one host page) read through a BAR1 mapping of `hMem` (rm_off corresponds
 * to va) around a cuMemcpyDtoH of the same bytes, up to 3 tries: only a byte
 * that is stable across both BAR1 reads and differs from CUDA's copy counts
 * (a wrong object differs every time, a concurrent writer only now and
 * then).  0 with *bad = first differing offset or -1, *stable = bytes
 * compared; else the error of the mapping or the copy. */
static int compare_window(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t hMem, uint64_t va,
                          uint64_t rm_off, uint64_t s, uint64_t n, int *bad, size_t *stable,
                          uint8_t seen[64], uint8_t cuda[64])
{
    const uint64_t hp = (uint64_t)nvrm_host_page();
    const uint64_t page = gp_round_down(s, hp);
    const uint64_t wlo = page > va ? page : va; /* never map before va */
    struct nvrm_map m;
    int rc = nvrm_map_range(nc, hMem, rm_off + (wlo - va), page + hp - wlo, &m);
    if (rc) return rc;
    const volatile uint8_t *base =
        (const volatile uint8_t *)m.mm + ((rm_off + (wlo - va)) & (hp - 1));
    uint8_t r2[64];
    *bad = -1;
    *stable = 0;
    for (int attempt = 0; attempt < 3; attempt++) {
        nvrm_read_mapped(base, wlo, s, n, seen);
        rc = dtoh(ctx, cuda, s, n);
        if (rc) break;
        nvrm_read_mapped(base, wlo, s, n, r2);
        *bad = -1;
        *stable = 0;
        for (uint64_t k = 0; k < n; k++) {
            if (seen[k] != r2[k]) continue;
            ++*stable;
            if (cuda[k] != seen[k] && *bad < 0) *bad = (int)k;
        }
        if (*bad < 0) break;
    }
    nvrm_unmap_range(nc, hMem, &m);
    return rc;
}

/*
 * Route C identity check, read only.  Why it is enough (docs/nvrm.md has the
 * long form):
 *  - what the IPC words mean was proven by the self-test on scratch memory
 *    of its own, where it may write: a pattern written by CUDA was read
 *    through the mapping and the reverse;
 *  - the words are CUDA's own description of this allocation (what another
 *    process would import), checked above against the allocation's size, page
 *    congruence, the RM object's size and, where the self-test found CUDA
 *    reports it, the documented mapping base address;
 *  - here, bytes read through BAR1 around a cuMemcpyDtoH of the same range
 *    must agree wherever they are stable (a concurrent writer can change
 *    bytes between the reads: those are not compared).  A mismatch refuses.
 * Nothing is ever written: a kernel or thread writing the buffer at the same
 * time loses nothing.
 */
int nvrm_verify_identity(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t hMem, uint64_t va,
                         uint64_t rm_off, uint64_t addr, uint64_t size)
{
    return nvrm_identity(ctx, nc, hMem, va, rm_off, addr, size, NULL);
}

int nvrm_identity(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t hMem, uint64_t va, uint64_t rm_off,
                  uint64_t addr, uint64_t size, int *differs)
{
    if (differs) *differs = 0;
    const uint64_t hp = (uint64_t)nvrm_host_page();
    const uint64_t end = addr + size;
    enum { SAMPLE = 64 };
    uint64_t win[2] = {gp_round_down(addr, hp), gp_round_down(end - 1, hp)};
    int nwin = win[1] != win[0] ? 2 : 1;
    size_t stable_total = 0;
    for (int i = 0; i < nwin; i++) {
        uint64_t s, n;
        if (i == 0) {
            s = addr;
            n = end - s < SAMPLE ? end - s : SAMPLE;
            if (s + n > win[0] + hp) n = win[0] + hp - s;
        } else {
            n = end - win[1] < SAMPLE ? end - win[1] : SAMPLE;
            s = end - n;
        }
        uint8_t seen[SAMPLE], cuda[SAMPLE];
        int bad;
        size_t stable;
        int rc = compare_window(ctx, nc, hMem, va, rm_off, s, n, &bad, &stable, seen, cuda);
        if (rc) return gp_err_prefix(rc, "identity check of the pin");
        if (bad >= 0 && differs) *differs = 1;
        if (bad >= 0)
            return gp_err(GDRPY_EIO, "identity check failed: byte 0x%llx read through BAR1 "
                                     "is 0x%02x where cuMemcpyDtoH sees 0x%02x (stable across reads, 3 "
                                     "tries), so the RM object found for this allocation does not "
                                     "hold its bytes on this driver (%s): refusing to pin",
                          (unsigned long long)(s + (uint64_t)bad), seen[bad], cuda[bad],
                          nc->version);
        stable_total += stable;
    }
    gp_log(1, "nvrm: identity of 0x%llx+%llu: %zu stable sampled bytes agree (no writes)",
           (unsigned long long)addr,
           (unsigned long long)size, stable_total);
    return 0;
}

int nvrm_compare_spread(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t hMem, uint64_t va,
                        uint64_t rm_off, uint64_t addr, uint64_t size, int *differs)
{
    enum { SAMPLE = 64,
           MAXWIN = 256 };
    const uint64_t hp = (uint64_t)nvrm_host_page();
    *differs = 0;
    if (size == 0) return 0;
    const uint64_t pages = (gp_round_up(addr + size, hp) - gp_round_down(addr, hp)) / hp;
    const uint64_t nwin = pages < MAXWIN ? pages : MAXWIN;
    for (uint64_t i = 0; i < nwin && !*differs; i++) {
        /* window i starts at an evenly spread place, 8-aligned, inside one page */
        uint64_t s = nwin > 1 ? addr + (size - 1) * i / (nwin - 1) : addr;
        s = gp_round_down(s, 8) < addr ? addr : gp_round_down(s, 8);
        uint64_t n = addr + size - s < SAMPLE ? addr + size - s : SAMPLE;
        const uint64_t page_end = gp_round_down(s, hp) + hp;
        if (s + n > page_end) n = page_end - s;
        uint8_t seen[SAMPLE], cuda[SAMPLE];
        int bad;
        size_t stable;
        int rc = compare_window(ctx, nc, hMem, va, rm_off, s, n, &bad, &stable, seen, cuda);
        if (rc) return rc;
        *differs = bad >= 0;
    }
    return 0;
}
