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
