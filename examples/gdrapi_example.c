/*
 * gdrapi_example.c - a program written against GDRCopy's C API, run on
 * gdrpy's libgdrapi.so.2 unchanged.
 *
 * It allocates GPU memory, pins and maps it, writes a message with CPU
 * stores (gdr_copy_to_mapping), reads it back through the GPU's copy engine
 * (cuMemcpyDtoH) and through the mapping, then tears everything down.
 *
 * Build (from the repository root, after `make -C native lib`):
 *   cc -Inative/include examples/gdrapi_example.c -Lnative/build -lgdrapi -ldl \
 *      -Wl,-rpath,"$PWD/native/build" -o gdrapi_example
 * Run on a GPU:            ./gdrapi_example
 * Run without a GPU:       GDRPY_BACKEND=sim ./gdrapi_example
 *   (the sim backend stands in host memory for GPU memory; the example then
 *    allocates with gdrpy_sim_alloc, which libgdrapi.so.2 also exports)
 *
 * CUDA is dlopen'ed so that the example builds without the CUDA toolkit; a
 * real application would include <cuda.h> and link -lcuda instead.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gdrapi.h>

/* The few CUDA driver calls used, declared here (CUresult is an int). */
typedef int (*cuInit_t)(unsigned);
typedef int (*cuDeviceGet_t)(int *, int);
typedef int (*cuPrimaryCtxRetain_t)(void **, int);
typedef int (*cuCtxSetCurrent_t)(void *);
typedef int (*cuMemAlloc_t)(unsigned long long *, size_t);
typedef int (*cuMemFree_t)(unsigned long long);
typedef int (*cuMemcpyDtoH_t)(void *, unsigned long long, size_t);

static int check(int rc, const char *what)
{
    if (rc) {
        fprintf(stderr, "%s failed: %d (%s)\n", what, rc, strerror(rc));
        exit(1);
    }
    return rc;
}

int main(void)
{
    const size_t size = 2 * GPU_PAGE_SIZE;
    const char *be = getenv("GDRPY_BACKEND");
    int sim = be && strcmp(be, "sim") == 0;

    /* ---- GPU memory: cuMemAlloc (or a sim allocation) ---------------- */
    unsigned long long raw = 0, dptr;
    void *cuda = NULL;
    cuMemFree_t cuMemFree = NULL;
    cuMemcpyDtoH_t cuMemcpyDtoH = NULL;
    int (*sim_alloc)(size_t, uint64_t *) = NULL;
    int (*sim_free)(uint64_t) = NULL;
    if (sim) {
        *(void **)&sim_alloc = dlsym(RTLD_DEFAULT, "gdrpy_sim_alloc");
        *(void **)&sim_free = dlsym(RTLD_DEFAULT, "gdrpy_sim_free");
        uint64_t d = 0;
        if (!sim_alloc || !sim_free || sim_alloc(size, &d)) {
            fprintf(stderr, "sim allocation failed\n");
            return 1;
        }
        raw = d;
    } else {
        cuda = dlopen("libcuda.so.1", RTLD_NOW);
        if (!cuda) {
            fprintf(stderr, "no libcuda.so.1 (%s); try GDRPY_BACKEND=sim\n", dlerror());
            return 1;
        }
        cuInit_t cuInit = (cuInit_t)dlsym(cuda, "cuInit");
        cuDeviceGet_t cuDeviceGet = (cuDeviceGet_t)dlsym(cuda, "cuDeviceGet");
        cuPrimaryCtxRetain_t cuPrimaryCtxRetain =
            (cuPrimaryCtxRetain_t)dlsym(cuda, "cuDevicePrimaryCtxRetain");
        cuCtxSetCurrent_t cuCtxSetCurrent = (cuCtxSetCurrent_t)dlsym(cuda, "cuCtxSetCurrent");
        cuMemAlloc_t cuMemAlloc = (cuMemAlloc_t)dlsym(cuda, "cuMemAlloc_v2");
        cuMemFree = (cuMemFree_t)dlsym(cuda, "cuMemFree_v2");
        cuMemcpyDtoH = (cuMemcpyDtoH_t)dlsym(cuda, "cuMemcpyDtoH_v2");
        if (!cuInit || !cuDeviceGet || !cuPrimaryCtxRetain || !cuCtxSetCurrent || !cuMemAlloc ||
            !cuMemFree || !cuMemcpyDtoH) {
            fprintf(stderr, "libcuda.so.1 lacks a driver API symbol\n");
            return 1;
        }
        int dev;
        void *ctx;
        if (cuInit(0) || cuDeviceGet(&dev, 0) || cuPrimaryCtxRetain(&ctx, dev) ||
            cuCtxSetCurrent(ctx) || cuMemAlloc(&raw, size + GPU_PAGE_SIZE)) {
            fprintf(stderr, "CUDA setup failed\n");
            return 1;
        }
    }
    /* gdr_map wants a GPU-page-aligned start: align inside the allocation. */
    dptr = (raw + GPU_PAGE_OFFSET) & GPU_PAGE_MASK;

    /* ---- the GDRCopy part --------------------------------------------- */
    gdr_t g = gdr_open();
    if (!g) {
        fprintf(stderr, "gdr_open failed (set GDRCOPY_ENABLE_LOGGING=1 to see why)\n");
        return 1;
    }
    int major, minor;
    gdr_runtime_get_version(&major, &minor);
    printf("libgdrapi %d.%d\n", major, minor);

    gdr_mh_t mh;
    check(gdr_pin_buffer(g, dptr, size, 0, 0, &mh), "gdr_pin_buffer");
    void *bar = NULL;
    check(gdr_map(g, mh, &bar, size), "gdr_map");

    gdr_info_t info;
    check(gdr_get_info(g, mh, &info), "gdr_get_info");
    const char *type = "?";
    gdr_get_mapping_type_string(info.mapping_type, &type);
    printf("pinned 0x%llx: va 0x%llx, %llu bytes, mapped as %s\n", dptr,
           (unsigned long long)info.va, (unsigned long long)info.mapped_size, type);

    /* The CPU address of dptr inside the mapping. */
    char *buf = (char *)bar + (dptr - info.va);

    const char msg[] = "hello from the CPU, through BAR1";
    check(gdr_copy_to_mapping(mh, buf + 100, msg, sizeof msg), "gdr_copy_to_mapping");

    char back[sizeof msg] = {0};
    if (sim) {
        /* sim: read back through the mapping only */
        check(gdr_copy_from_mapping(mh, back, buf + 100, sizeof back), "gdr_copy_from_mapping");
        printf("mapping reads: %s\n", back);
    } else {
        if (cuMemcpyDtoH(back, dptr + 100, sizeof back)) {
            fprintf(stderr, "cuMemcpyDtoH failed\n");
            return 1;
        }
        printf("GPU holds:     %s\n", back);
        memset(back, 0, sizeof back);
        check(gdr_copy_from_mapping(mh, back, buf + 100, sizeof back), "gdr_copy_from_mapping");
        printf("mapping reads: %s\n", back);
    }
    int ok = strcmp(back, msg) == 0;

    check(gdr_unmap(g, mh, bar, size), "gdr_unmap");
    check(gdr_unpin_buffer(g, mh), "gdr_unpin_buffer");
    check(gdr_close(g), "gdr_close");
    if (sim) sim_free(raw);
    else cuMemFree(raw);
    printf("%s\n", ok ? "ok" : "MISMATCH");
    return ok ? 0 : 1;
}
