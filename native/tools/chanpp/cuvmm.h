/*
 * cuvmm.h - device memory the way GDRCopy's pplat allocates it in its
 * cuMemCreate mode (tests/common.cpp gpu_vmm_alloc): cuMemCreate of PINNED
 * device memory with gpuDirectRDMACapable, reserved and mapped at the
 * recommended granularity, read-write for the device.  For the channel's
 * C tool gdrpy_chanpp, which loads libcuda with dlopen and so declares the
 * few driver types it needs here (layouts of CUDA 12/13's cuda.h).
 * Header-only; no handle is exported (no POSIX fd).
 */
#ifndef GDRPY_TOOLS_CUVMM_H
#define GDRPY_TOOLS_CUVMM_H

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int type; /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
    int requested_handle_types;
    int loc_type; /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
    int loc_id;
    void *win32_meta;
    unsigned char compression_type;
    unsigned char gpu_direct_rdma_capable;
    unsigned short usage;
    unsigned char reserved[4];
} cuvmm_prop_t;

typedef struct {
    int loc_type;
    int loc_id;
    int flags; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 */
} cuvmm_access_t;

/* 0 and *ptr (the device address, `size` rounded up to the granularity
 * mapped there), or a CUresult / -1 (libcuda lacks the VMM calls).  The
 * caller's context must be current.  Freed at process exit (the tools
 * never free it earlier). */
static inline int cuvmm_alloc(int device, size_t size, uint64_t *ptr)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return -1;
    int (*gran)(size_t *, const cuvmm_prop_t *, int) =
        (int (*)(size_t *, const cuvmm_prop_t *, int))dlsym(h, "cuMemGetAllocationGranularity");
    int (*reserve)(uint64_t *, size_t, size_t, uint64_t, unsigned long long) =
        (int (*)(uint64_t *, size_t, size_t, uint64_t, unsigned long long))dlsym(
            h, "cuMemAddressReserve");
    int (*create)(unsigned long long *, size_t, const cuvmm_prop_t *, unsigned long long) =
        (int (*)(unsigned long long *, size_t, const cuvmm_prop_t *, unsigned long long))dlsym(
            h, "cuMemCreate");
    int (*map)(uint64_t, size_t, size_t, unsigned long long, unsigned long long) =
        (int (*)(uint64_t, size_t, size_t, unsigned long long, unsigned long long))dlsym(
            h, "cuMemMap");
    int (*access)(uint64_t, size_t, const cuvmm_access_t *, size_t) =
        (int (*)(uint64_t, size_t, const cuvmm_access_t *, size_t))dlsym(h, "cuMemSetAccess");
    if (!gran || !reserve || !create || !map || !access) return -1;
    cuvmm_prop_t prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;
    prop.loc_type = 1;
    prop.loc_id = device;
    prop.gpu_direct_rdma_capable = 1;
    size_t g = 0;
    int r = gran(&g, &prop, 1 /* RECOMMENDED */);
    if (r) return r;
    if (g < 65536) g = 65536;
    size_t n = (size + g - 1) / g * g;
    uint64_t va = 0;
    unsigned long long mh = 0;
    if ((r = reserve(&va, n, g, 0, 0)) != 0) return r;
    if ((r = create(&mh, n, &prop, 0)) != 0) return r;
    if ((r = map(va, n, 0, mh, 0)) != 0) return r;
    cuvmm_access_t a = {1, device, 3};
    if ((r = access(va, n, &a, 1)) != 0) return r;
    *ptr = va;
    return 0;
}

#endif
