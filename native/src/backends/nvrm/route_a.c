/*
 * route_a.c - nvrm backend, route A: cuMemCreate memory created with
 * CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.  CUDA exports it as a POSIX fd
 * (an RM export fd on /dev/nvidiactl), which is imported into our client
 * (rm.c: OS_UNIX_IMPORT_OBJECTS_FROM_FD).  The self-test proves it on a
 * scratch allocation of its own.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <string.h>

#include "cudadrv.h"
#include "internal.h"
#include "nvrm.h"

/* ---- per pin: export fd -> import -------------------------------------- */

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

/* ---- the self-test of route A ------------------------------------------ */

/* A 2 MiB (the granularity) cuMemCreate(POSIX_FD) scratch allocation ->
 * the real pin path (export + import) -> the data check (scratch.c). */
void nvrm_route_a_selftest(int device, struct nvrm_ctx *nc, struct nvrm_dev_state *st)
{
    struct nvrm_route_report *r = &st->route_a;
    r->tested = 1;
    if (!gp_cu.MemCreate || !gp_cu.MemAddressReserve || !gp_cu.MemMap || !gp_cu.MemSetAccess ||
        !gp_cu.MemUnmap || !gp_cu.MemAddressFree || !gp_cu.MemGetAllocationGranularity) {
        nvrm_report_fail(r, "scratch allocation", "libcuda lacks the VMM API (cuMemCreate...)");
        return;
    }
    gp_CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location_type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location_id = device;
    prop.gpuDirectRDMACapable = 1;
    size_t gran = 0;
    CUresult cr = gp_cu.MemGetAllocationGranularity(&gran, &prop,
                                                    CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (cr || !gran) gran = 2u << 20;
    size_t size = gran;
    CUmemGenericAllocationHandle h = 0;
    cr = gp_cu.MemCreate(&h, size, &prop, 0);
    if (cr) { /* a GPU without GPUDirect RDMA: the plain kind */
        prop.gpuDirectRDMACapable = 0;
        cr = gp_cu.MemCreate(&h, size, &prop, 0);
    }
    if (cr) {
        gp_cuda_err(0, cr, "cuMemCreate", "self-test scratch (%zu bytes, POSIX_FD)", size);
        nvrm_report_last(r, "scratch allocation (cuMemCreate)", nc);
        return;
    }
    uint64_t va = 0;
    int mapped = 0;
    cr = gp_cu.MemAddressReserve(&va, size, 0, 0, 0);
    if (!cr) {
        cr = gp_cu.MemMap(va, size, 0, h, 0);
        mapped = cr == 0;
    }
    if (!cr) {
        gp_CUmemAccessDesc d = {CU_MEM_LOCATION_TYPE_DEVICE, device,
                                CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        cr = gp_cu.MemSetAccess(va, size, &d, 1);
    }
    if (cr) {
        gp_cuda_err(0, cr, "cuMemAddressReserve/cuMemMap/cuMemSetAccess", "self-test scratch");
        nvrm_report_last(r, "scratch allocation (cuMemMap)", nc);
        goto out;
    }
    {
        /* The real pin path: classify, export + import. */
        const uint64_t at = va + 4096 + 64; /* not page aligned on purpose */
        gp_cuda_ptr cp;
        uint32_t hMem = 0;
        gp_ctx fake;
        memset(&fake, 0, sizeof fake);
        fake.device = device;
        fake.bpriv = nc;
        if (gp_cuda_classify(at, NVRM_CHECK_BYTES, device, &cp)) {
            nvrm_report_last(r, "classify the scratch pointer", nc);
            goto out;
        }
        if (nvrm_import_vmm(&fake, nc, at, &cp, &hMem)) {
            nvrm_report_last(r, "pin (export POSIX fd + OS_UNIX_IMPORT_OBJECTS_FROM_FD)", nc);
            goto out;
        }
        if (nvrm_scratch_check(device, nc, hMem, at - cp.base, at, 1, r) == 0) r->ok = 1;
        nvrm_rm_free(nc, nc->hDevice, hMem, "freeing the self-test import");
        nvrm_live_add(&nc->n_mem, -1);
    }
out:
    if (mapped) gp_cu.MemUnmap(va, size);
    if (va) gp_cu.MemAddressFree(va, size);
    gp_cu.MemRelease(h);
}
