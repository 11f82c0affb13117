/*
 * hostmem.c - see hostmem.h.
 */
#include <stdlib.h>
#include <string.h>

#include "cudadrv.h"
#include "hostmem.h"

int gp_hostmem_alloc(int device, int is_real, size_t size, gp_hostmem *out)
{
    memset(out, 0, sizeof *out);
    if (size == 0) return gp_err(GDRPY_EINVAL, "host_alloc: size is 0");
    size = (size_t)gp_round_up(size, 4096);
    out->device = device;
    if (!is_real) {
        void *p = aligned_alloc(4096, size);
        if (!p) return gp_err(GDRPY_ENOMEM, "host_alloc: out of memory (%zu bytes)", size);
        memset(p, 0, size);
        out->ptr = p;
        out->dptr = (uint64_t)(uintptr_t)p;
        out->size = size;
        return 0;
    }
    int rc = gp_cuda_load(NULL, 0);
    if (rc) return rc;
    if (!gp_cu.MemHostAlloc || !gp_cu.MemHostGetDevicePointer || !gp_cu.MemFreeHost)
        return gp_err(GDRPY_ENXIO, "host_alloc: cuMemHostAlloc / cuMemHostGetDevicePointer_v2 / "
                                   "cuMemFreeHost not found in libcuda");
    gp_cuda_scope s;
    rc = gp_cuda_enter(device, &s);
    if (rc) return rc;
    void *p = NULL;
    CUresult r = gp_cu.MemHostAlloc(&p, size, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    if (r) {
        gp_cuda_leave(&s);
        return gp_cuda_err(0, r, "cuMemHostAlloc", "host_alloc of %zu bytes", size);
    }
    CUdeviceptr d = 0;
    r = gp_cu.MemHostGetDevicePointer(&d, p, 0);
    if (r) {
        gp_cu.MemFreeHost(p);
        gp_cuda_leave(&s);
        return gp_cuda_err(0, r, "cuMemHostGetDevicePointer", "host_alloc");
    }
    gp_cuda_leave(&s);
    memset(p, 0, size);
    out->ptr = p;
    out->dptr = d;
    out->size = size;
    out->cuda = 1;
    return 0;
}

void gp_hostmem_free(gp_hostmem *hm)
{
    if (!hm->ptr) return;
    if (hm->cuda) {
        gp_cuda_scope s;
        if (gp_cuda_enter(hm->device, &s) == 0) {
            CUresult r = gp_cu.MemFreeHost(hm->ptr);
            if (r) gp_log(3, "cuMemFreeHost failed: %s", gp_cuda_errname(r));
            gp_cuda_leave(&s);
        }
    } else {
        free(hm->ptr);
    }
    hm->ptr = NULL;
}
