/*
 * hostmem.c - see hostmem.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cudadrv.h"
#include "hostmem.h"

#define CU_MEMHOSTALLOC_PORTABLE 0x01
#define CU_MEMHOSTALLOC_DEVICEMAP 0x02

static struct {
    CUresult (*HostAlloc)(void **p, size_t n, unsigned flags);
    CUresult (*HostGetDevicePointer)(CUdeviceptr *d, void *p, unsigned flags);
    CUresult (*FreeHost)(void *p);
} hm_cu;
static pthread_once_t hm_once = PTHREAD_ONCE_INIT;
static int hm_ok;

static void hm_load(void)
{
    /* gp_cuda_load() has loaded libcuda: RTLD_NOLOAD finds that copy. */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so", RTLD_NOW | RTLD_NOLOAD);
    if (!h) return;
    hm_cu.HostAlloc = (CUresult (*)(void **, size_t, unsigned))dlsym(h, "cuMemHostAlloc");
    hm_cu.HostGetDevicePointer =
        (CUresult (*)(CUdeviceptr *, void *, unsigned))dlsym(h, "cuMemHostGetDevicePointer_v2");
    hm_cu.FreeHost = (CUresult (*)(void *))dlsym(h, "cuMemFreeHost");
    hm_ok = hm_cu.HostAlloc && hm_cu.HostGetDevicePointer && hm_cu.FreeHost;
    /* keep the reference: libcuda stays loaded for the process anyway */
}

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
    pthread_once(&hm_once, hm_load);
    if (!hm_ok)
        return gp_err(GDRPY_ENXIO, "host_alloc: cuMemHostAlloc / cuMemHostGetDevicePointer_v2 / "
                                   "cuMemFreeHost not found in libcuda");
    gp_cuda_scope s;
    rc = gp_cuda_enter(device, &s);
    if (rc) return rc;
    void *p = NULL;
    CUresult r = hm_cu.HostAlloc(&p, size, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    if (r) {
        gp_cuda_leave(&s);
        return gp_cuda_err(0, r, "cuMemHostAlloc", "host_alloc of %zu bytes", size);
    }
    CUdeviceptr d = 0;
    r = hm_cu.HostGetDevicePointer(&d, p, 0);
    if (r) {
        hm_cu.FreeHost(p);
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
            CUresult r = hm_cu.FreeHost(hm->ptr);
            if (r) gp_log(3, "cuMemFreeHost failed: %s", gp_cuda_errname(r));
            gp_cuda_leave(&s);
        }
    } else {
        free(hm->ptr);
    }
    hm->ptr = NULL;
}
