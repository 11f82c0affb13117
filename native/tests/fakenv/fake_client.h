/*
 * fake_client.h - what the fake-driver tests share on the client side: sym() finds
 * a driver entry point (or one of fakenv's test hooks) in the preloaded stand-in
 * libcuda; fake_cu_load() resolves the driver calls the tests make themselves
 * (cuMemAlloc, copies, cuMemCreate + cuMemMap, pools); struct cu_mem_prop is
 * CUmemAllocationProp's layout (32 bytes); vmm_alloc() maps a cuMemCreate
 * allocation and fill() writes the tests' byte pattern through CUDA.
 */
#ifndef GDRPY_FAKE_CLIENT_H
#define GDRPY_FAKE_CLIENT_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;

struct cu_mem_prop {
    int type, htypes, loc_type, loc_id;
    void *meta;
    unsigned char c, rdma;
    unsigned short usage;
    unsigned char res[4];
};

static void *sym(const char *n)
{
    void *p = dlsym(RTLD_DEFAULT, n);
    if (!p) {
        printf("FAIL: %s not found: run with LD_PRELOAD=.../fakenv/libcuda.so.1\n", n);
        exit(2);
    }
    return p;
}

static CUresult (*cuMemAlloc)(uint64_t *, size_t);
static CUresult (*cuMemcpyHtoD)(uint64_t, const void *, size_t);
static CUresult (*cuMemcpyDtoH)(void *, uint64_t, size_t);
static CUresult (*cuMemCreate)(uint64_t *, size_t, const void *, unsigned long long);
static CUresult (*cuMemAddressReserve)(uint64_t *, size_t, size_t, uint64_t, unsigned long long);
static CUresult (*cuMemMap)(uint64_t, size_t, size_t, uint64_t, unsigned long long);
static CUresult (*cuMemAllocAsync)(uint64_t *, size_t, void *);
static CUresult (*cuMemPoolCreate)(void **, const void *);
static CUresult (*cuMemAllocFromPoolAsync)(uint64_t *, size_t, void *, void *);

/* cuInit too: a test may allocate before gdrpy initialises the driver. */
static void fake_cu_load(void)
{
    ((CUresult (*)(unsigned))sym("cuInit"))(0);
    cuMemAlloc = (CUresult (*)(uint64_t *, size_t))sym("cuMemAlloc_v2");
    cuMemcpyHtoD = (CUresult (*)(uint64_t, const void *, size_t))sym("cuMemcpyHtoD_v2");
    cuMemcpyDtoH = (CUresult (*)(void *, uint64_t, size_t))sym("cuMemcpyDtoH_v2");
    cuMemCreate = (CUresult (*)(uint64_t *, size_t, const void *, unsigned long long))sym("cuMemCreate");
    cuMemAddressReserve = (CUresult (*)(uint64_t *, size_t, size_t, uint64_t, unsigned long long))
        sym("cuMemAddressReserve");
    cuMemMap = (CUresult (*)(uint64_t, size_t, size_t, uint64_t, unsigned long long))sym("cuMemMap");
    cuMemAllocAsync = (CUresult (*)(uint64_t *, size_t, void *))sym("cuMemAllocAsync");
    cuMemPoolCreate = (CUresult (*)(void **, const void *))sym("cuMemPoolCreate");
    cuMemAllocFromPoolAsync = (CUresult (*)(uint64_t *, size_t, void *, void *))
        sym("cuMemAllocFromPoolAsync");
}

/* A cuMemCreate allocation of n bytes (handle types htypes: 0 none, 1
 * POSIX_FD) mapped at an address of its own; 0 on failure. */
static __attribute__((unused)) uint64_t vmm_alloc(size_t n, int htypes)
{
    struct cu_mem_prop pr = {1, htypes, 1, 0, NULL, 0, 1, 0, {0}};
    uint64_t va = 0, h = 0;
    if (cuMemAddressReserve(&va, n, 0, 0, 0) || cuMemCreate(&h, n, &pr, 0) ||
        cuMemMap(va, n, 0, h, 0))
        return 0;
    return va;
}

/* Writes byte i = seed + 13 i + (i >> 8) to [va, va + n) through CUDA. */
static __attribute__((unused)) void fill(uint64_t va, size_t n, uint8_t seed)
{
    uint8_t *b = malloc(n);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(seed + i * 13 + (i >> 8));
    cuMemcpyHtoD(va, b, n);
    free(b);
}

#endif
