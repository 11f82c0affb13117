/*
 * routes.c - nvrm backend: how a CUDA allocation becomes an RM memory handle
 * in our client.
 *   route A - cuMemCreate memory: export as POSIX fd, import into our client;
 *   route C - cuMemAlloc memory: RM_DUP_OBJECT of CUDA's own RM handle, found
 *             through the (undocumented) cuIpcGetMemHandle words, verified
 *             against cuMemcpyDtoH before the pin is accepted.
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

/* Imports the (single-object) RM export fd `fd` of the memory at `addr`
 * into our client; closes fd. */
int nvrm_import_fd(gp_ctx *ctx, struct nvrm_ctx *nc, uint64_t addr, int fd, uint32_t *hOut)
{
    int rc;
    nv0000_export_info_t ei;
    memset(&ei, 0, sizeof ei);
    ei.fd = fd;
    rc = nvrm_rm_control(nc, NV0000_CTRL_CMD_OS_UNIX_GET_EXPORT_OBJECT_INFO, &ei, sizeof ei,
                    "OS_UNIX_GET_EXPORT_OBJECT_INFO on the exported fd");
    if (rc) goto out;
    if (ei.deviceInstance != nc->dev_instance) {
        rc = gp_err(GDRPY_ENODEV, "the allocation at 0x%llx lives on RM device instance %u, "
                    "but this context's GPU (CUDA device %d) is instance %u",
                    (unsigned long long)addr, ei.deviceInstance, ctx->device,
                    nc->dev_instance);
        goto out;
    }
    if (ei.maxObjects < 1) {
        rc = gp_err(GDRPY_EIO, "the exported fd of 0x%llx holds no objects",
                    (unsigned long long)addr);
        goto out;
    }
    for (int attempt = 0; attempt < 4; attempt++) {
        static nv0000_import_t zero;
        nv0000_import_t *im = malloc(sizeof *im);
        if (!im) { rc = gp_err(GDRPY_ENOMEM, "out of memory"); goto out; }
        *im = zero;
        im->fd = fd;
        im->hParent = nc->hDevice;
        im->objects[0] = nvrm_new_handle(nc);
        im->numObjects = 1;
        im->index = 0;
        nv_os54_t a;
        memset(&a, 0, sizeof a);
        a.hClient = nc->hClient;
        a.hObject = nc->hClient;
        a.cmd = NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD;
        a.params = (uint64_t)(uintptr_t)im;
        a.paramsSize = sizeof *im;
        rc = nvrm_nv_call(nc->ctl, NV_ESC_RM_CONTROL, "RM_CONTROL", &a, sizeof a, &a.status,
                     "OS_UNIX_IMPORT_OBJECTS_FROM_FD");
        uint32_t hh = im->objects[0];
        uint8_t type = im->objectTypes[0];
        free(im);
        if (rc && a.status == NV_ERR_INSERT_DUPLICATE_NAME) continue;   /* handle taken */
        if (rc) goto out;
        if (type != NV_IMPORT_OBJECT_TYPE_VIDMEM) {
            nvrm_rm_free(nc->ctl, nc->hClient, nc->hDevice, hh, "freeing a non-vidmem import");
            rc = gp_err(GDRPY_ENOTSUP, "the allocation at 0x%llx imported as object type %u, "
                        "not video memory (1)", (unsigned long long)addr, type);
            goto out;
        }
        *hOut = hh;
        nvrm_live_add(&nc->n_mem, 1);
        rc = 0;
        goto out;
    }
    rc = gp_err(GDRPY_EIO, "no free RM handle for the import after 4 attempts");
out:
    close(fd);
    return rc;
}

/* ---- route C: cuMemAlloc memory, IPC words -> dup --------------------- */

#ifdef GDRPY_NVRM_TESTING
/* Test builds only (tests/gpu): added to the object offset the IPC words
 * give, to prove that the identity check refuses a wrong mapping. */
GP_HIDDEN uint64_t gp_nvrm_test_skew;
#endif

int nvrm_dup_legacy(gp_ctx *ctx, struct nvrm_ctx *nc, const gp_cuda_ptr *cp,
                      uint32_t *hOut, uint64_t *objoff)
{
    if (!nc->route_c_ok) {
        int cuv = 0;
        gp_cuda_driver_version(&cuv);
        return gp_err(GDRPY_ENOTSUP, "pinning cuMemAlloc memory relies on an undocumented "
                      "IPC handle layout validated only with driver 580.x / CUDA 13.0 (this "
                      "is driver %s, CUDA %d.%d): refused; allocate with cuMemCreate and "
                      "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (gdrpy.memory does), or set "
                      "GDRPY_NVRM_FORCE=1", nc->version, cuv / 1000, (cuv % 1000) / 10);
    }
    CUipcMemHandle ih;
    memset(&ih, 0, sizeof ih);
    CUresult r = gp_cu.IpcGetMemHandle(&ih, cp->base);
    if (r)
        return gp_cuda_err(0, r, "cuIpcGetMemHandle", "IPC handle of the allocation at 0x%llx",
                           (unsigned long long)cp->base);
    uint32_t w[16];
    memcpy(w, ih.reserved, sizeof w);
    /* Words seen on 580.159 / CUDA 13.0: w[4] allocation size (low 32 bits),
     * w[6] size of the RM object in 4 KiB units, w[7] offset of the
     * allocation in it, w[12] CUDA's RM client, w[13] the RM memory handle. */
    uint32_t hcli = w[12], hobj = w[13];
    uint64_t off = w[7];
    uint64_t objsize = (uint64_t)w[6] * 4096;
#ifdef GDRPY_NVRM_TESTING
    off += gp_nvrm_test_skew;
#endif
    if (w[4] != (uint32_t)cp->size || hcli == 0 || hobj == 0 || hcli == nc->hClient ||
        (w[6] != 0 && (off > objsize || cp->size > objsize - off)) ||
        ((cp->base ^ off) & (uint64_t)(nvrm_host_page() - 1)) != 0) {
        return gp_err(GDRPY_ENOTSUP, "the IPC handle of the allocation at 0x%llx (%llu bytes) "
                      "does not have the layout this backend knows (size word 0x%x, object "
                      "pages 0x%x, client 0x%x, object 0x%x, offset 0x%llx): refusing to "
                      "guess; allocate with cuMemCreate + POSIX_FD instead",
                      (unsigned long long)cp->base, (unsigned long long)cp->size, w[4], w[6],
                      hcli, hobj, (unsigned long long)off);
    }
    int rc = GDRPY_EIO;
    for (int attempt = 0; attempt < 4; attempt++) {
        nv_os55_t a;
        memset(&a, 0, sizeof a);
        a.hClient = nc->hClient;
        a.hParent = nc->hDevice;
        a.hObject = nvrm_new_handle(nc);
        a.hClientSrc = hcli;
        a.hObjectSrc = hobj;
        a.flags = 0;
        char what[128];
        snprintf(what, sizeof what, "duplicating CUDA's RM memory 0x%x (client 0x%x) of "
                 "the allocation at 0x%llx", hobj, hcli, (unsigned long long)cp->base);
        rc = nvrm_nv_call(nc->ctl, NV_ESC_RM_DUP_OBJECT, "RM_DUP_OBJECT", &a, sizeof a, &a.status,
                     what);
        if (rc && a.status == NV_ERR_INSERT_DUPLICATE_NAME) continue;
        if (rc) {
            if (a.status != NV_OK)
                gp_err_prefix(nvrm_nv_status_code(a.status),
                              "CUDA device %d: the IPC handle words do not name an RM "
                              "object this client can duplicate", ctx->device);
            return rc;
        }
        *hOut = a.hObject;
        *objoff = off;
        nvrm_live_add(&nc->n_mem, 1);
        return 0;
    }
    return rc;
}

/* Reads [a, a+n) of a mapping with aligned 8-byte loads (BAR1 reads cost
 * ~1 us each, so never byte by byte).  `m` maps the page-aligned window
 * starting at bus address offset `wbase` of the pin's address space. */
static void nvrm_read_mapped(const volatile uint8_t *win, uint64_t wbase, uint64_t a, size_t n,
                        uint8_t *out)
{
    uint64_t lo = gp_round_down(a, 8), hi = gp_round_up(a + n, 8);
    uint8_t tmp[80];
    for (uint64_t x = lo; x < hi; x += 8) {
        uint64_t v = *(const volatile uint64_t *)(win + (x - wbase));
        memcpy(tmp + (x - lo), &v, 8);
    }
    memcpy(out, tmp + (a - lo), n);
}

static int nvrm_dtoh(gp_ctx *ctx, void *dst, uint64_t src, size_t n)
{
    return gp_cuda_memcpy(ctx->device, 1, src, dst, n, NULL);
}

static int nvrm_htod_sync(gp_ctx *ctx, uint64_t dst, const void *src, size_t n)
{
    int rc = gp_cuda_memcpy(ctx->device, 0, dst, (void *)src, n, NULL);
    if (rc) return rc;
    /* A "synchronous" copy from pageable memory may return before the DMA
     * lands: wait for the legacy stream. */
    CUresult r = gp_cu.StreamSynchronize(NULL);
    if (r) return gp_cuda_err(0, r, "cuStreamSynchronize", "waiting for a verification write");
    return 0;
}

/* Route C identity check: bytes seen through BAR1 must be the bytes CUDA
 * sees at the user's address.  `rm_of(x)` = rm_va_off + (x - va). */
int nvrm_verify_identity(gp_ctx *ctx, struct nvrm_ctx *nc, gp_pin *p, struct nvrm_pin *np,
                           const gp_cuda_ptr *cp)
{
    const uint64_t hp = (uint64_t)nvrm_host_page();
    const uint64_t end = p->addr + p->size;
    enum { SAMPLE = 64 };
    /* Up to two windows: the host page of the first byte and of the last. */
    uint64_t win[2] = {gp_round_down(p->addr, hp), gp_round_down(end - 1, hp)};
    int nwin = win[1] != win[0] ? 2 : 1;
    uint8_t seen_vals[256];
    memset(seen_vals, 0, sizeof seen_vals);
    size_t total = 0;
    int distinct = 0;
    for (int i = 0; i < nwin; i++) {
        uint64_t s, n;
        if (i == 0) {
            s = p->addr;
            n = end - s < SAMPLE ? end - s : SAMPLE;
            if (s + n > win[0] + hp) n = win[0] + hp - s;
        } else {
            n = end - win[1] < SAMPLE ? end - win[1] : SAMPLE;
            s = end - n;
        }
        uint8_t via_cuda[SAMPLE], via_bar[SAMPLE];
        struct nvrm_map m;
        int rc = nvrm_map_range(nc, np->hMemory, np->rm_off + (win[i] - p->va), hp, &m);
        if (rc) return gp_err_prefix(rc, "identity check of the pin");
        /* Up to 3 tries: GPU work still writing the range could make one
         * comparison differ; a wrong mapping differs every time. */
        int same = 0;
        for (int attempt = 0; attempt < 3 && !same; attempt++) {
            rc = nvrm_dtoh(ctx, via_cuda, s, n);
            if (rc) break;
            nvrm_read_mapped((const volatile uint8_t *)m.mm, win[i], s, n, via_bar);
            same = memcmp(via_cuda, via_bar, n) == 0;
        }
        nvrm_unmap_range(nc, np->hMemory, &m);
        if (rc) return gp_err_prefix(rc, "identity check of the pin");
        if (!same)
            return gp_err(GDRPY_EIO, "identity check failed: %llu bytes at 0x%llx read "
                          "through BAR1 differ from cuMemcpyDtoH of the same range, so the "
                          "IPC handle words do not describe this allocation on this driver "
                          "(%s): refusing to pin", (unsigned long long)n,
                          (unsigned long long)s, nc->version);
        for (uint64_t k = 0; k < n; k++) {
            if (!seen_vals[via_cuda[k]]) distinct++;
            seen_vals[via_cuda[k]] = 1;
        }
        total += n;
    }
    if (total >= 32 && distinct >= 8 && !np->strict) {
        gp_log(1, "nvrm: identity of 0x%llx proven by content (%zu bytes, %d values)",
               (unsigned long long)p->addr, total, distinct);
        return 0;
    }
    /* The content cannot tell places apart (e.g. all zeros): change one
     * word through CUDA, see the change through BAR1, restore it.  The
     * write goes to the user's own address (via cuMemcpyHtoD), never
     * through the mapping under test. */
    uint64_t t = p->addr;
    uint64_t w0 = gp_round_down(t, hp);
    size_t n = (size_t)((cp->base + cp->size) - t);   /* stay in the allocation */
    if (n > 8) n = 8;
    if (t + n > w0 + hp) n = (size_t)(w0 + hp - t);   /* and in the mapped window */
    uint8_t save[8], pat[8], got[8];
    int rc = nvrm_dtoh(ctx, save, t, n);
    if (rc) return gp_err_prefix(rc, "identity check of the pin");
    for (size_t k = 0; k < n; k++) pat[k] = (uint8_t)~save[k];
    struct nvrm_map m;
    rc = nvrm_map_range(nc, np->hMemory, np->rm_off + (w0 - p->va), hp, &m);
    if (rc) return gp_err_prefix(rc, "identity check of the pin");
    int wrc = nvrm_htod_sync(ctx, t, pat, n);
    int match = 0;
    if (!wrc) {
        nvrm_read_mapped((const volatile uint8_t *)m.mm, w0, t, n, got);
        match = memcmp(got, pat, n) == 0;
    }
    /* Restore, whatever happened above. */
    int rrc = nvrm_htod_sync(ctx, t, save, n);
    if (!rrc && match) {
        nvrm_read_mapped((const volatile uint8_t *)m.mm, w0, t, n, got);
        match = memcmp(got, save, n) == 0;
    }
    nvrm_unmap_range(nc, np->hMemory, &m);
    if (rrc)
        return gp_err(GDRPY_EIO, "identity check: could not restore the %zu original bytes "
                      "at 0x%llx after the test write (%s); the pin is refused",
                      n, (unsigned long long)t, gdrpy_last_error());
    if (wrc) return gp_err_prefix(wrc, "identity check write");
    if (!match)
        return gp_err(GDRPY_EIO, "identity check failed: a test write of %zu bytes at 0x%llx "
                      "through CUDA was not seen through BAR1 (the IPC handle words do not "
                      "describe this allocation on driver %s): refusing to pin (the bytes "
                      "were restored)", n, (unsigned long long)t, nc->version);
    gp_log(1, "nvrm: identity of 0x%llx proven by a test write", (unsigned long long)t);
    return 0;
}
