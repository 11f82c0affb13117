/*
 * gdrapi_testmem.h - "device" memory for the libgdrapi tests, example and
 * benchmark, without CUDA headers.
 *
 * Two modes, chosen by tm_init():
 *  - sim (GDRPY_BACKEND=sim): memory from gdrpy_sim_alloc; the device side is
 *    read and written with gdrpy_memcpy_dtoh/htod through a gdrpy context of
 *    the sim backend.  These gdrpy symbols are looked up by name in `lib`
 *    (the dlopen handle of libgdrapi, or NULL for the global scope) so that
 *    a binary linked with -lgdrapi only uses GDRCopy's API directly.
 *  - cuda (anything else): libcuda.so.1 is dlopen'ed; memory comes from
 *    cuMemAlloc (TM_CUMEMALLOC) or cuMemCreate + cuMemMap (TM_VMM), and the
 *    device side is read and written with cuMemcpyDtoH/HtoD.
 * Everything is static: include it in one translation unit.
 */
#ifndef GDRAPI_TESTMEM_H
#define GDRAPI_TESTMEM_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TM_GPU_PAGE 65536ull

#define TM_FN static __attribute__((unused))

enum { TM_CUMEMALLOC = 0,
       TM_VMM = 1,
       /* cuMemAlloc of exactly `size` bytes (large ones are 2 MiB aligned),
        * whose memory object CUDA makes `size` rounded up to 4 KiB; sim: the
        * same with GDRPY_SIM_BACKING=4k */
       TM_EXACT = 2 };

typedef struct tm_buf {
    uint64_t d; /* 64 KiB aligned device address of `size` bytes */
    size_t size;
    unsigned long long raw; /* what was allocated (freed by tm_free) */
    size_t raw_size;
    int kind;
    unsigned long long vmm; /* CUmemGenericAllocationHandle */
    void *cuctx;            /* context it was allocated in; NULL: tm's */
} tm_buf;

/* ---- CUDA driver API, declared here (no cuda.h) ------------------------ */
typedef int CUresult_t;
typedef struct {
    int type; /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
    int id;
} tm_CUmemLocation;
typedef struct {
    int type;                 /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
    int requestedHandleTypes; /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1 */
    tm_CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} tm_CUmemAllocationProp;
typedef struct {
    tm_CUmemLocation location;
    int flags; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 */
} tm_CUmemAccessDesc;
_Static_assert(sizeof(tm_CUmemAllocationProp) == 32, "CUmemAllocationProp layout");
_Static_assert(sizeof(tm_CUmemAccessDesc) == 12, "CUmemAccessDesc layout");

static struct {
    int ready;
    int sim;
    char why[256];
    /* sim (gdrpy) */
    int (*sim_alloc)(size_t, uint64_t *);
    int (*sim_free)(uint64_t);
    int (*gp_open)(int, int, uint64_t *);
    int (*gp_close)(uint64_t);
    int (*gp_htod)(uint64_t, uint64_t, const void *, size_t);
    int (*gp_dtoh)(uint64_t, void *, uint64_t, size_t);
    uint64_t gp_ctx;
    /* cuda */
    void *cuda;
    int ordinal; /* CUDA ordinal of the device in use */
    int ndevices;
    int device;
    void *cuctx;
    CUresult_t (*cuInit)(unsigned);
    CUresult_t (*cuDeviceGet)(int *, int);
    CUresult_t (*cuDeviceGetCount)(int *);
    CUresult_t (*cuDevicePrimaryCtxRetain)(void **, int);
    CUresult_t (*cuCtxSetCurrent)(void *);
    CUresult_t (*cuMemAlloc)(unsigned long long *, size_t);
    CUresult_t (*cuMemFree)(unsigned long long);
    CUresult_t (*cuMemcpyHtoD)(unsigned long long, const void *, size_t);
    CUresult_t (*cuMemcpyDtoH)(void *, unsigned long long, size_t);
    CUresult_t (*cuCtxSynchronize)(void);
    CUresult_t (*cuMemHostAlloc)(void **, size_t, unsigned);
    CUresult_t (*cuMemFreeHost)(void *);
    CUresult_t (*cuMemGetAllocationGranularity)(size_t *, const tm_CUmemAllocationProp *, int);
    CUresult_t (*cuMemCreate)(unsigned long long *, size_t, const tm_CUmemAllocationProp *,
                              unsigned long long);
    CUresult_t (*cuMemRelease)(unsigned long long);
    CUresult_t (*cuMemAddressReserve)(unsigned long long *, size_t, size_t, unsigned long long,
                                      unsigned long long);
    CUresult_t (*cuMemAddressFree)(unsigned long long, size_t);
    CUresult_t (*cuMemMap)(unsigned long long, size_t, size_t, unsigned long long,
                           unsigned long long);
    CUresult_t (*cuMemUnmap)(unsigned long long, size_t);
    CUresult_t (*cuMemSetAccess)(unsigned long long, size_t, const tm_CUmemAccessDesc *, size_t);
    CUresult_t (*cuGetErrorName)(CUresult_t, const char **);
    CUresult_t (*cuDeviceGetAttribute)(int *, int, int);
} tm;

static const char *tm_cuerr(CUresult_t r)
{
    const char *s = NULL;
    if (tm.cuGetErrorName && tm.cuGetErrorName(r, &s) == 0 && s) return s;
    return "CUDA_ERROR_?";
}

#define TM_SYM(lib, field, name)                                            \
    do {                                                                    \
        *(void **)(&tm.field) = dlsym((lib), (name));                       \
        if (!tm.field) {                                                    \
            snprintf(tm.why, sizeof tm.why, "symbol %s not found", (name)); \
            return -1;                                                      \
        }                                                                   \
    } while (0)

TM_FN int tm_env_is_sim(void)
{
    const char *b = getenv("GDRPY_BACKEND");
    return b && strcmp(b, "sim") == 0;
}

/* 0: ready; -1: unavailable (reason in tm.why).  lib: where the gdrpy sim
 * helpers are looked up (NULL: global scope). */
TM_FN int tm_init(void *lib)
{
    if (tm.ready) return 0;
    if (tm_env_is_sim()) {
        void *h = lib ? lib : RTLD_DEFAULT;
        tm.sim = 1;
        TM_SYM(h, sim_alloc, "gdrpy_sim_alloc");
        TM_SYM(h, sim_free, "gdrpy_sim_free");
        TM_SYM(h, gp_open, "gdrpy_open");
        TM_SYM(h, gp_close, "gdrpy_close");
        TM_SYM(h, gp_htod, "gdrpy_memcpy_htod");
        TM_SYM(h, gp_dtoh, "gdrpy_memcpy_dtoh");
        int rc = tm.gp_open(0, 1 /* GDRPY_BACKEND_SIM */, &tm.gp_ctx);
        if (rc) {
            snprintf(tm.why, sizeof tm.why, "gdrpy_open(sim) failed with %d", rc);
            return -1;
        }
        tm.ready = 1;
        return 0;
    }
    tm.cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!tm.cuda) {
        snprintf(tm.why, sizeof tm.why, "no libcuda.so.1 (%s); set GDRPY_BACKEND=sim to "
                                        "test without a GPU",
                 dlerror());
        return -1;
    }
    TM_SYM(tm.cuda, cuInit, "cuInit");
    TM_SYM(tm.cuda, cuDeviceGet, "cuDeviceGet");
    TM_SYM(tm.cuda, cuDeviceGetCount, "cuDeviceGetCount");
    TM_SYM(tm.cuda, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    TM_SYM(tm.cuda, cuCtxSetCurrent, "cuCtxSetCurrent");
    TM_SYM(tm.cuda, cuMemAlloc, "cuMemAlloc_v2");
    TM_SYM(tm.cuda, cuMemFree, "cuMemFree_v2");
    TM_SYM(tm.cuda, cuMemcpyHtoD, "cuMemcpyHtoD_v2");
    TM_SYM(tm.cuda, cuMemcpyDtoH, "cuMemcpyDtoH_v2");
    TM_SYM(tm.cuda, cuCtxSynchronize, "cuCtxSynchronize");
    TM_SYM(tm.cuda, cuMemHostAlloc, "cuMemHostAlloc");
    TM_SYM(tm.cuda, cuMemFreeHost, "cuMemFreeHost");
    TM_SYM(tm.cuda, cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    TM_SYM(tm.cuda, cuMemCreate, "cuMemCreate");
    TM_SYM(tm.cuda, cuMemRelease, "cuMemRelease");
    TM_SYM(tm.cuda, cuMemAddressReserve, "cuMemAddressReserve");
    TM_SYM(tm.cuda, cuMemAddressFree, "cuMemAddressFree");
    TM_SYM(tm.cuda, cuMemMap, "cuMemMap");
    TM_SYM(tm.cuda, cuMemUnmap, "cuMemUnmap");
    TM_SYM(tm.cuda, cuMemSetAccess, "cuMemSetAccess");
    TM_SYM(tm.cuda, cuGetErrorName, "cuGetErrorName");
    TM_SYM(tm.cuda, cuDeviceGetAttribute, "cuDeviceGetAttribute");
    CUresult_t r = tm.cuInit(0);
    if (r) {
        snprintf(tm.why, sizeof tm.why, "cuInit: %s", tm_cuerr(r));
        return -1;
    }
    const char *ds = getenv("GDRPY_DEVICE");
    int ord = ds && *ds ? atoi(ds) : 0;
    int n = 0;
    tm.cuDeviceGetCount(&n);
    tm.ordinal = ord;
    tm.ndevices = n;
    if (ord >= n) {
        snprintf(tm.why, sizeof tm.why, "device %d of %d does not exist", ord, n);
        return -1;
    }
    if ((r = tm.cuDeviceGet(&tm.device, ord)) || (r = tm.cuDevicePrimaryCtxRetain(&tm.cuctx, tm.device)) ||
        (r = tm.cuCtxSetCurrent(tm.cuctx))) {
        snprintf(tm.why, sizeof tm.why, "CUDA context for device %d: %s", ord, tm_cuerr(r));
        return -1;
    }
    tm.ready = 1;
    return 0;
}

/* Makes the CUDA context current in the calling thread (no-op on sim). */
TM_FN void tm_thread_init(void)
{
    if (!tm.sim && tm.cuctx) tm.cuCtxSetCurrent(tm.cuctx);
}

TM_FN int tm_alloc(tm_buf *b, size_t size, int kind)
{
    memset(b, 0, sizeof *b);
    b->kind = kind;
    b->size = size;
    if (tm.sim) {
        uint64_t d = 0;
        if (kind == TM_EXACT) setenv("GDRPY_SIM_BACKING", "4k", 1);
        int rc = tm.sim_alloc(size, &d);
        if (kind == TM_EXACT) unsetenv("GDRPY_SIM_BACKING");
        if (rc) return rc;
        b->raw = d;
        b->d = b->raw; /* sim allocations are 64 KiB aligned */
        b->raw_size = size;
        return 0;
    }
    CUresult_t r;
    if (kind == TM_VMM) {
        tm_CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = 1;
        prop.requestedHandleTypes = 1;
        prop.location.type = 1;
        prop.location.id = tm.device;
        prop.allocFlags.gpuDirectRDMACapable = 1;
        size_t gran = 0;
        if ((r = tm.cuMemGetAllocationGranularity(&gran, &prop, 0))) goto fail;
        size_t sz = (size + gran - 1) / gran * gran;
        if ((r = tm.cuMemCreate(&b->vmm, sz, &prop, 0))) goto fail;
        if ((r = tm.cuMemAddressReserve(&b->raw, sz, gran, 0, 0))) {
            tm.cuMemRelease(b->vmm);
            goto fail;
        }
        if ((r = tm.cuMemMap(b->raw, sz, 0, b->vmm, 0))) {
            tm.cuMemAddressFree(b->raw, sz);
            tm.cuMemRelease(b->vmm);
            goto fail;
        }
        tm_CUmemAccessDesc acc = {{1, tm.device}, 3};
        if ((r = tm.cuMemSetAccess(b->raw, sz, &acc, 1))) {
            tm.cuMemUnmap(b->raw, sz);
            tm.cuMemAddressFree(b->raw, sz);
            tm.cuMemRelease(b->vmm);
            goto fail;
        }
        b->raw_size = sz;
        b->d = b->raw;
        return 0;
    }
    if (kind == TM_EXACT) {
        b->raw_size = size;
        if ((r = tm.cuMemAlloc(&b->raw, size))) goto fail;
        b->d = b->raw;
        return 0;
    }
    b->raw_size = size + TM_GPU_PAGE;
    if ((r = tm.cuMemAlloc(&b->raw, b->raw_size))) goto fail;
    b->d = (b->raw + TM_GPU_PAGE - 1) & ~(TM_GPU_PAGE - 1);
    return 0;
fail:
    fprintf(stderr, "  tm_alloc(%zu, %s): %s\n", size, kind == TM_VMM ? "cuMemCreate" : "cuMemAlloc",
            tm_cuerr(r));
    memset(b, 0, sizeof *b);
    return -1;
}

TM_FN int tm_free(tm_buf *b)
{
    int rc = 0;
    if (!b->raw) return 0;
    if (b->cuctx) tm.cuCtxSetCurrent(b->cuctx);
    if (tm.sim) {
        rc = tm.sim_free(b->raw);
    } else if (b->kind == TM_VMM) {
        rc |= tm.cuMemUnmap(b->raw, b->raw_size);
        rc |= tm.cuMemAddressFree(b->raw, b->raw_size);
        rc |= tm.cuMemRelease(b->vmm);
    } else {
        rc = tm.cuMemFree(b->raw);
    }
    if (b->cuctx) tm.cuCtxSetCurrent(tm.cuctx);
    memset(b, 0, sizeof *b);
    return rc;
}

/* 1 if the device has a coherent CPU-GPU link
 * (CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, 100);
 * sim: GDRPY_SIM_COHERENT=1. */
TM_FN int tm_coherent(void)
{
    if (tm.sim) {
        const char *e = getenv("GDRPY_SIM_COHERENT");
        return e && !strcmp(e, "1");
    }
    int v = 0;
    return tm.cuDeviceGetAttribute(&v, 100, tm.device) == 0 && v;
}

/* cuMemAlloc memory on another GPU (CUDA ordinal), for multi-GPU cases. */
TM_FN int tm_alloc_on(tm_buf *b, size_t size, int ordinal)
{
    int dev;
    void *ctx;
    CUresult_t r;
    if (tm.sim) return -1;
    if ((r = tm.cuDeviceGet(&dev, ordinal)) || (r = tm.cuDevicePrimaryCtxRetain(&ctx, dev)) ||
        (r = tm.cuCtxSetCurrent(ctx))) {
        fprintf(stderr, "  tm_alloc_on(device %d): %s\n", ordinal, tm_cuerr(r));
        tm.cuCtxSetCurrent(tm.cuctx);
        return -1;
    }
    int saved = tm.device;
    tm.device = dev;
    int rc = tm_alloc(b, size, TM_CUMEMALLOC);
    tm.device = saved;
    tm.cuCtxSetCurrent(tm.cuctx);
    if (!rc) b->cuctx = ctx;
    return rc;
}

TM_FN int tm_htod(uint64_t d, const void *src, size_t n)
{
    if (tm.sim) return tm.gp_htod(tm.gp_ctx, d, src, n);
    /* From pageable memory cuMemcpyHtoD may return once the source is
     * staged, before the DMA lands: wait, so that a later store or load
     * through the mapping is ordered after it. */
    int r = tm.cuMemcpyHtoD(d, src, n);
    return r ? r : tm.cuCtxSynchronize();
}

TM_FN int tm_dtoh(void *dst, uint64_t d, size_t n)
{
    if (tm.sim) return tm.gp_dtoh(tm.gp_ctx, dst, d, n);
    return tm.cuMemcpyDtoH(dst, d, n);
}

TM_FN void tm_fini(void)
{
    if (tm.sim && tm.gp_ctx) tm.gp_close(tm.gp_ctx);
    tm.gp_ctx = 0;
}

#endif /* GDRAPI_TESTMEM_H */
