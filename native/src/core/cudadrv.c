/*
 * cudadrv.c - libcuda.so.1 loaded with dlopen; see cudadrv.h for the contract.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudadrv.h"

struct gp_cuda_api gp_cu;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_rc = GDRPY_ENXIO;
static char load_why[384];
static int drv_version;

/* ---- loading ---------------------------------------------------------- */

struct sym {
    const char *name;
    void **slot;
    int optional;
};

#define SYM(field, name) {name, (void **)&gp_cu.field, 0}
#define OPT(field, name) {name, (void **)&gp_cu.field, 1}

static const char *const cuda_libs[] = {"libcuda.so.1", "libcuda.so"};
#define N_CUDA_LIBS (sizeof cuda_libs / sizeof cuda_libs[0])

static void do_load(void)
{
    void *h = NULL;
    const char *dlerr = "";
    char first_err[200] = "";
    for (size_t i = 0; i < N_CUDA_LIBS && !h; i++) {
        h = dlopen(cuda_libs[i], RTLD_NOW | RTLD_LOCAL);
        if (!h && !first_err[0]) {
            dlerr = dlerror();
            snprintf(first_err, sizeof first_err, "%s", dlerr ? dlerr : "?");
        }
    }
    if (!h) {
        snprintf(load_why, sizeof load_why,
                 "cannot load the CUDA driver library (%s): is the NVIDIA driver installed?",
                 first_err);
        return;
    }
    const struct sym syms[] = {
        SYM(Init, "cuInit"),
        SYM(DriverGetVersion, "cuDriverGetVersion"),
        SYM(GetErrorName, "cuGetErrorName"),
        OPT(GetErrorString, "cuGetErrorString"),
        SYM(DeviceGet, "cuDeviceGet"),
        SYM(DeviceGetCount, "cuDeviceGetCount"),
        SYM(DeviceGetName, "cuDeviceGetName"),
        SYM(DeviceGetPCIBusId, "cuDeviceGetPCIBusId"),
        SYM(DeviceGetAttribute, "cuDeviceGetAttribute"),
        SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
        SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
        SYM(CtxGetCurrent, "cuCtxGetCurrent"),
        SYM(CtxSetCurrent, "cuCtxSetCurrent"),
        SYM(CtxPushCurrent, "cuCtxPushCurrent_v2"),
        SYM(CtxPopCurrent, "cuCtxPopCurrent_v2"),
        SYM(CtxGetDevice, "cuCtxGetDevice"),
        SYM(MemcpyHtoD, "cuMemcpyHtoD_v2"),
        SYM(MemcpyDtoH, "cuMemcpyDtoH_v2"),
        SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
        SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
        SYM(StreamSynchronize, "cuStreamSynchronize"),
        SYM(StreamCreate, "cuStreamCreate"),
        SYM(StreamDestroy, "cuStreamDestroy_v2"),
        OPT(StreamGetCtx, "cuStreamGetCtx"),
        SYM(MemGetAddressRange, "cuMemGetAddressRange_v2"),
        SYM(PointerGetAttribute, "cuPointerGetAttribute"),
        SYM(PointerGetAttributes, "cuPointerGetAttributes"),
        SYM(IpcGetMemHandle, "cuIpcGetMemHandle"),
        SYM(MemRetainAllocationHandle, "cuMemRetainAllocationHandle"),
        SYM(MemRelease, "cuMemRelease"),
        SYM(MemExportToShareableHandle, "cuMemExportToShareableHandle"),
        SYM(MemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle"),
        OPT(MemGetHandleForAddressRange, "cuMemGetHandleForAddressRange"),
        OPT(MemAlloc, "cuMemAlloc_v2"),
        OPT(MemFree, "cuMemFree_v2"),
        /* the nvrm self-test's scratch memory (route A) */
        OPT(MemCreate, "cuMemCreate"),
        OPT(MemAddressReserve, "cuMemAddressReserve"),
        OPT(MemAddressFree, "cuMemAddressFree"),
        OPT(MemMap, "cuMemMap"),
        OPT(MemUnmap, "cuMemUnmap"),
        OPT(MemSetAccess, "cuMemSetAccess"),
        OPT(MemGetAllocationGranularity, "cuMemGetAllocationGranularity"),
        /* stream-ordered pools (the nvrm backend) */
        OPT(MemPoolCreate, "cuMemPoolCreate"),
        OPT(MemPoolDestroy, "cuMemPoolDestroy"),
        OPT(DeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool"),
        OPT(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync"),
        OPT(MemFreeAsync, "cuMemFreeAsync"),
        /* page-locked host memory and events (src/staging/, src/channel/) */
        OPT(MemHostAlloc, "cuMemHostAlloc"),
        OPT(MemFreeHost, "cuMemFreeHost"),
        OPT(MemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2"),
        OPT(MemHostRegister, "cuMemHostRegister_v2"),
        OPT(MemHostUnregister, "cuMemHostUnregister"),
        OPT(EventCreate, "cuEventCreate"),
        OPT(EventDestroy, "cuEventDestroy_v2"),
        OPT(EventRecord, "cuEventRecord"),
        OPT(EventSynchronize, "cuEventSynchronize"),
        OPT(EventQuery, "cuEventQuery"),
        OPT(EventElapsedTime, "cuEventElapsedTime_v2"),
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(h, syms[i].name);
        if (!*syms[i].slot && !syms[i].optional) {
            snprintf(load_why, sizeof load_why,
                     "libcuda.so.1 lacks %s: the CUDA driver is too old (CUDA 11.x or "
                     "newer needed)",
                     syms[i].name);
            memset(&gp_cu, 0, sizeof gp_cu);
            return; /* the handle stays loaded: harmless, and never dlclose'd */
        }
    }
    if (!gp_cu.EventElapsedTime) /* drivers before CUDA 12.8 */
        *(void **)&gp_cu.EventElapsedTime = dlsym(h, "cuEventElapsedTime");
    CUresult r = gp_cu.Init(0);
    if (r != CUDA_SUCCESS) {
        const char *n = NULL;
        gp_cu.GetErrorName(r, &n);
        snprintf(load_why, sizeof load_why,
                 "cuInit(0) failed: %s (%d)%s", n ? n : "unknown CUresult", r,
                 r == CUDA_ERROR_NO_DEVICE ? ": no CUDA-capable device is visible "
                                             "(check CUDA_VISIBLE_DEVICES and /dev/nvidia*)"
                                           : "");
        return;
    }
    if (gp_cu.DriverGetVersion(&drv_version) != CUDA_SUCCESS) drv_version = 0;
    load_rc = 0;
}

int gp_cuda_load(char *why, size_t n)
{
    pthread_once(&load_once, do_load);
    if (load_rc) {
        if (why && n) snprintf(why, n, "%s", load_why);
        return gp_err(load_rc, "%s", load_why);
    }
    return 0;
}

void *gp_cuda_loaded_symbol(const char *name)
{
    for (size_t i = 0; i < N_CUDA_LIBS; i++) {
        /* RTLD_NOLOAD: a handle only if it is loaded already; the reference
         * taken is kept, so the symbol stays valid */
        void *h = dlopen(cuda_libs[i], RTLD_NOW | RTLD_NOLOAD);
        if (h) return dlsym(h, name);
    }
    return NULL;
}

int gp_cuda_driver_version(int *v)
{
    int rc = gp_cuda_load(NULL, 0);
    if (rc) return rc;
    *v = drv_version;
    return 0;
}

/* ---- errors ----------------------------------------------------------- */

const char *gp_cuda_errname(CUresult r)
{
    static __thread char buf[32];
    const char *s = NULL;
    if (gp_cu.GetErrorName && gp_cu.GetErrorName(r, &s) == CUDA_SUCCESS && s) return s;
    snprintf(buf, sizeof buf, "CUresult %d", r);
    return buf;
}

int gp_cuda_status(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS: return GDRPY_OK;
    case CUDA_ERROR_INVALID_VALUE: return GDRPY_EINVAL;
    case CUDA_ERROR_OUT_OF_MEMORY: return GDRPY_ENOMEM;
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED: return GDRPY_ENXIO;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE: return GDRPY_ENODEV;
    case CUDA_ERROR_NOT_SUPPORTED: return GDRPY_ENOTSUP;
    default: return GDRPY_EIO;
    }
}

int gp_cuda_err(int code, CUresult r, const char *call, const char *fmt, ...)
{
    char what[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (!code) code = gp_cuda_status(r);
    if (!code) code = GDRPY_EIO;
    return gp_err(code, "%s: %s failed: %s (%d)", what, call, gp_cuda_errname(r), r);
}

/* ---- devices ---------------------------------------------------------- */

int gp_cuda_device_count(int *n)
{
    int rc = gp_cuda_load(NULL, 0);
    if (rc) return rc;
    CUresult r = gp_cu.DeviceGetCount(n);
    if (r) return gp_cuda_err(0, r, "cuDeviceGetCount", "counting CUDA devices");
    return 0;
}

int gp_cuda_check_device(int device)
{
    int n = 0;
    int rc = gp_cuda_device_count(&n);
    if (rc) return rc;
    if (device < 0 || device >= n)
        return gp_err(GDRPY_ENODEV, "no CUDA device %d: this process sees %d device%s "
                                    "(ordinals 0..%d; CUDA_VISIBLE_DEVICES=%s)",
                      device, n,
                      n == 1 ? "" : "s", n - 1,
                      getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
    return 0;
}

static int get_dev(int device, CUdevice *d)
{
    int rc = gp_cuda_check_device(device);
    if (rc) return rc;
    CUresult r = gp_cu.DeviceGet(d, device);
    if (r) return gp_cuda_err(0, r, "cuDeviceGet", "looking up CUDA device %d", device);
    return 0;
}

int gp_cuda_device_info(int device, char *name, size_t namelen, char *busid, size_t busidlen)
{
    CUdevice d;
    int rc = get_dev(device, &d);
    if (rc) return rc;
    CUresult r;
    if (name && namelen) {
        name[0] = '\0';
        r = gp_cu.DeviceGetName(name, (int)namelen, d);
        if (r) return gp_cuda_err(0, r, "cuDeviceGetName", "naming CUDA device %d", device);
    }
    if (busid && busidlen) {
        busid[0] = '\0';
        r = gp_cu.DeviceGetPCIBusId(busid, (int)busidlen, d);
        if (r)
            return gp_cuda_err(0, r, "cuDeviceGetPCIBusId", "PCI address of CUDA device %d",
                               device);
    }
    return 0;
}

int gp_cuda_device_coherent(int device, int *coherent)
{
    *coherent = 0;
    CUdevice d;
    int rc = get_dev(device, &d);
    if (rc) return rc;
    int v = 0;
    CUresult r = gp_cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, d);
    if (r)
        return gp_cuda_err(0, r, "cuDeviceGetAttribute",
                           "PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES of CUDA device %d", device);
    *coherent = v != 0;
    return 0;
}

int gp_cuda_device_pci(int device, unsigned *domain, unsigned *bus, unsigned *slot,
                       unsigned *function)
{
    char id[64];
    int rc = gp_cuda_device_info(device, NULL, 0, id, sizeof id);
    if (rc) return rc;
    unsigned a, b, c, f;
    if (sscanf(id, "%x:%x:%x.%x", &a, &b, &c, &f) != 4)
        return gp_err(GDRPY_EIO, "cannot parse the PCI bus id \"%s\" of CUDA device %d", id,
                      device);
    *domain = a;
    *bus = b;
    *slot = c;
    *function = f;
    return 0;
}

/* ---- contexts --------------------------------------------------------- */

#define GP_CUDA_MAX_DEV 256

static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int holders;
    CUcontext primary; /* retained while holders > 0 and non-NULL */
    CUstream priv;     /* gdrpy's own stream in `primary` (gp_cuda_private_*) */
} holds[GP_CUDA_MAX_DEV];

void gp_cuda_hold(int device)
{
    if (device < 0 || device >= GP_CUDA_MAX_DEV) return;
    pthread_mutex_lock(&hold_lock);
    holds[device].holders++;
    pthread_mutex_unlock(&hold_lock);
}

void gp_cuda_unhold(int device)
{
    if (device < 0 || device >= GP_CUDA_MAX_DEV) return;
    CUcontext rel = NULL;
    CUstream st = NULL;
    pthread_mutex_lock(&hold_lock);
    if (holds[device].holders > 0 && --holds[device].holders == 0) {
        rel = holds[device].primary;
        holds[device].primary = NULL;
        st = holds[device].priv;
        holds[device].priv = NULL;
    }
    pthread_mutex_unlock(&hold_lock);
    if (st && rel && gp_cu.CtxPushCurrent(rel) == CUDA_SUCCESS) {
        gp_cu.StreamDestroy(st); /* returns at once; nothing of the caller's waits */
        CUcontext popped;
        gp_cu.CtxPopCurrent(&popped);
    }
    if (rel) {
        CUdevice d;
        if (gp_cu.DeviceGet(&d, device) == CUDA_SUCCESS) gp_cu.DevicePrimaryCtxRelease(d);
    }
}

/* With hold_lock held and holders > 0: the device's primary context,
 * retained on first need. */
static int held_primary_locked(int device, CUdevice d, CUcontext *out)
{
    if (!holds[device].primary) {
        CUresult r = gp_cu.DevicePrimaryCtxRetain(&holds[device].primary, d);
        if (r) {
            holds[device].primary = NULL;
            return gp_cuda_err(0, r, "cuDevicePrimaryCtxRetain",
                               "activating the primary context of CUDA device %d", device);
        }
    }
    *out = holds[device].primary;
    return 0;
}

int gp_cuda_enter(int device, gp_cuda_scope *s)
{
    s->pushed = 0;
    s->temp_retain = 0;
    s->device = device;
    int rc = gp_cuda_load(NULL, 0);
    if (rc) return rc;
    CUcontext cur = NULL;
    CUresult r = gp_cu.CtxGetCurrent(&cur);
    if (r == CUDA_SUCCESS && cur) {
        CUdevice cd;
        CUdevice want;
        if (gp_cu.CtxGetDevice(&cd) == CUDA_SUCCESS &&
            gp_cu.DeviceGet(&want, device) == CUDA_SUCCESS && cd == want)
            return 0; /* a context of this device is already current: use it */
    }
    CUdevice d;
    rc = get_dev(device, &d);
    if (rc) return rc;
    CUcontext ctx = NULL;
    if (device < GP_CUDA_MAX_DEV) {
        pthread_mutex_lock(&hold_lock);
        rc = holds[device].holders > 0 ? held_primary_locked(device, d, &ctx) : 0;
        pthread_mutex_unlock(&hold_lock);
        if (rc) return rc;
    }
    if (!ctx) {
        r = gp_cu.DevicePrimaryCtxRetain(&ctx, d);
        if (r)
            return gp_cuda_err(0, r, "cuDevicePrimaryCtxRetain",
                               "activating the primary context of CUDA device %d", device);
        s->temp_retain = 1;
    }
    r = gp_cu.CtxPushCurrent(ctx);
    if (r) {
        if (s->temp_retain) gp_cu.DevicePrimaryCtxRelease(d);
        s->temp_retain = 0;
        return gp_cuda_err(0, r, "cuCtxPushCurrent",
                           "making the primary context of CUDA device %d current", device);
    }
    s->pushed = 1;
    return 0;
}

void gp_cuda_leave(gp_cuda_scope *s)
{
    if (s->pushed) {
        CUcontext c;
        gp_cu.CtxPopCurrent(&c);
        s->pushed = 0;
    }
    if (s->temp_retain) {
        CUdevice d;
        if (gp_cu.DeviceGet(&d, s->device) == CUDA_SUCCESS) gp_cu.DevicePrimaryCtxRelease(d);
        s->temp_retain = 0;
    }
}

/* ---- gdrpy's own copies (cudadrv.h) ------------------------------------ */

int gp_cuda_private_begin(int device, CUstream *stream)
{
    *stream = NULL;
    int rc = gp_cuda_load(NULL, 0);
    if (rc) return rc;
    if (device < 0 || device >= GP_CUDA_MAX_DEV)
        return gp_err(GDRPY_ENODEV, "CUDA device %d is beyond the %d gdrpy tracks", device,
                      GP_CUDA_MAX_DEV);
    CUdevice d;
    rc = get_dev(device, &d);
    if (rc) return rc;
    gp_cuda_hold(device);
    CUcontext pc = NULL;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&hold_lock);
    rc = held_primary_locked(device, d, &pc);
    if (!rc && !holds[device].priv) {
        r = gp_cu.CtxPushCurrent(pc);
        if (!r) {
            r = gp_cu.StreamCreate(&holds[device].priv, CU_STREAM_NON_BLOCKING);
            if (r) holds[device].priv = NULL;
            CUcontext popped;
            gp_cu.CtxPopCurrent(&popped);
        }
        if (r)
            rc = gp_cuda_err(0, r, "cuStreamCreate", "gdrpy's own stream on CUDA device %d",
                             device);
    }
    CUstream st = holds[device].priv;
    pthread_mutex_unlock(&hold_lock);
    if (!rc) {
        r = gp_cu.CtxPushCurrent(pc);
        if (r)
            rc = gp_cuda_err(0, r, "cuCtxPushCurrent",
                             "making the primary context of CUDA device %d current", device);
    }
    if (rc) {
        gp_cuda_unhold(device);
        return rc;
    }
    *stream = st;
    return 0;
}

void gp_cuda_private_end(int device)
{
    CUcontext popped;
    gp_cu.CtxPopCurrent(&popped);
    gp_cuda_unhold(device);
}

int gp_cuda_private_copy(int device, int dir, uint64_t dptr, void *host, size_t n)
{
    if (n == 0) return 0;
    if (dir != 0 && dir != 1) return gp_err(GDRPY_EINVAL, "memcpy: bad direction %d", dir);
    CUstream st;
    int rc = gp_cuda_private_begin(device, &st);
    if (rc) return rc;
    CUresult r = dir == 0 ? gp_cu.MemcpyHtoDAsync(dptr, host, n, st)
                          : gp_cu.MemcpyDtoHAsync(host, dptr, n, st);
    const char *call = dir == 0 ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync";
    if (!r) {
        call = "cuStreamSynchronize";
        r = gp_cu.StreamSynchronize(st);
    }
    gp_cuda_private_end(device);
    if (r)
        return gp_cuda_err(0, r, call, "gdrpy's own copy of %zu bytes %s device 0x%llx "
                                       "(device %d)",
                           n, dir == 0 ? "to" : "from", (unsigned long long)dptr, device);
    return 0;
}

/* ---- copies ----------------------------------------------------------- */

static CUresult do_copy(int dir, uint64_t dptr, void *host, size_t n, CUstream st)
{
    if (!st)
        return dir == 0 ? gp_cu.MemcpyHtoD(dptr, host, n) : gp_cu.MemcpyDtoH(host, dptr, n);
    return dir == 0 ? gp_cu.MemcpyHtoDAsync(dptr, host, n, st)
                    : gp_cu.MemcpyDtoHAsync(host, dptr, n, st);
}

static int memcpy_impl(int device, int dir, uint64_t dptr, void *host, size_t n, void *stream,
                       int locked);

int gp_cuda_memcpy(int device, int dir, uint64_t dptr, void *host, size_t n, void *stream)
{
    return memcpy_impl(device, dir, dptr, host, n, stream, 0);
}

int gp_cuda_memcpy_locked(int device, int dir, uint64_t dptr, void *host, size_t n,
                          void *stream)
{
    return memcpy_impl(device, dir, dptr, host, n, stream, 1);
}

static int memcpy_impl(int device, int dir, uint64_t dptr, void *host, size_t n, void *stream,
                       int locked)
{
    if (n == 0) return 0;
    if (dir != 0 && dir != 1) return gp_err(GDRPY_EINVAL, "memcpy: bad direction %d", dir);
    CUstream st = (CUstream)stream;
    const char *call = st ? (dir == 0 ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync")
                          : (dir == 0 ? "cuMemcpyHtoD" : "cuMemcpyDtoH");
    int rc = gp_cuda_load(NULL, 0);
    if (rc) return rc;
    CUresult r;
    /* A real stream runs in its own context: make that one current. */
    if (st && st != GP_CU_STREAM_LEGACY && st != GP_CU_STREAM_PER_THREAD && gp_cu.StreamGetCtx) {
        CUcontext sc = NULL, cur = NULL;
        if (gp_cu.StreamGetCtx(st, &sc) == CUDA_SUCCESS && sc) {
            gp_cu.CtxGetCurrent(&cur);
            if (cur == sc) {
                r = do_copy(dir, dptr, host, n, st);
            } else {
                r = gp_cu.CtxPushCurrent(sc);
                if (r)
                    return gp_cuda_err(0, r, "cuCtxPushCurrent",
                                       "making the context of stream %p current", stream);
                r = do_copy(dir, dptr, host, n, st);
                CUcontext popped;
                gp_cu.CtxPopCurrent(&popped);
            }
            goto done;
        }
    }
    gp_cuda_scope sc;
    rc = gp_cuda_enter(device, &sc);
    if (rc) return gp_err_prefix(rc, "%s of %zu bytes", call, n);
    r = do_copy(dir, dptr, host, n, st);
    /* A synchronous cuMemcpyHtoD from pageable memory may return once the
     * source is staged, before the DMA lands.  Callers of the synchronous
     * path (put, ce_write) are promised the data is in GPU memory, so that
     * a read through the mapping right after sees it: wait for the copy. */
    if (r == CUDA_SUCCESS && !st && dir == 0 && !locked) {
        call = "cuStreamSynchronize";
        r = gp_cu.StreamSynchronize(NULL);
    }
    gp_cuda_leave(&sc);
done:
    if (r) {
        if (dir == 0)
            return gp_cuda_err(0, r, call, "copying %zu bytes from host %p to device 0x%llx "
                                           "(device %d, stream %p)",
                               n, host, (unsigned long long)dptr,
                               device, stream);
        return gp_cuda_err(0, r, call, "copying %zu bytes from device 0x%llx to host %p "
                                       "(device %d, stream %p)",
                           n, (unsigned long long)dptr, host,
                           device, stream);
    }
    return 0;
}

/* ---- pointer classification ------------------------------------------- */

const char *gp_cuda_kind_name(int kind)
{
    switch (kind) {
    case GP_CUMEM_DEVICE: return "device memory (cuMemAlloc/cudaMalloc)";
    case GP_CUMEM_VMM: return "device memory (cuMemCreate/cuMemMap)";
    case GP_CUMEM_POOL: return "stream-ordered pool memory (cuMemAllocAsync/cudaMallocAsync)";
    case GP_CUMEM_MANAGED: return "managed memory (cuMemAllocManaged/cudaMallocManaged)";
    case GP_CUMEM_HOST: return "host memory (cuMemHostAlloc/cudaHostAlloc/registered)";
    case GP_CUMEM_OTHER: return "device memory of an unsupported kind";
    default: return "memory unknown to CUDA";
    }
}

int gp_cuda_classify(uint64_t addr, uint64_t size, int want_device, gp_cuda_ptr *out)
{
    memset(out, 0, sizeof *out);
    out->device = -1;
    int rc = gp_cuda_load(NULL, 0);
    if (rc) return rc;
    gp_cuda_scope sc = {0, 0, 0};
    int entered = 0;
    if (want_device >= 0) {
        rc = gp_cuda_enter(want_device, &sc);
        if (rc) return rc;
        entered = 1;
    }
    /* Every slot is 8 zeroed bytes, whatever the attribute's width: the
     * driver writes 4 (unsigned int / int / bool) or 8 (pointer, size). */
    int attrs[] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE,                /* 0 */
        CU_POINTER_ATTRIBUTE_IS_MANAGED,                 /* 1 */
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,             /* 2 */
        CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, /* 3 */
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,           /* 4 */
        CU_POINTER_ATTRIBUTE_RANGE_SIZE,                 /* 5 */
        CU_POINTER_ATTRIBUTE_MAPPED,                     /* 6 */
        CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,       /* 7 */
        CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, /* 8 */
        CU_POINTER_ATTRIBUTE_BUFFER_ID,                  /* 9 */
    };
    enum { NA = sizeof attrs / sizeof attrs[0] };
    uint64_t val[NA];
    void *data[NA];
    memset(val, 0, sizeof val);
    for (int i = 0; i < NA; i++) data[i] = &val[i];
    CUresult r = gp_cu.PointerGetAttributes(NA, attrs, data, addr);
    if (r) {
        rc = gp_cuda_err(0, r, "cuPointerGetAttributes", "classifying address 0x%llx",
                         (unsigned long long)addr);
        goto out;
    }
    /* Newer attributes in a separate call: an older driver refusing them
     * must not hide the others. */
    int attrs2[] = {CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                    CU_POINTER_ATTRIBUTE_MAPPING_SIZE};
    uint64_t val2[3] = {0, 0, 0};
    void *data2[3] = {&val2[0], &val2[1], &val2[2]};
    if (gp_cu.PointerGetAttributes(3, attrs2, data2, addr) != CUDA_SUCCESS)
        memset(val2, 0, sizeof val2);

    unsigned memtype = (unsigned)val[0];
    int managed = (uint32_t)val[1] != 0;
    int ordinal = (int)(int32_t)(uint32_t)val[2];
    out->ipc_capable = (uint32_t)val[3] != 0;
    out->handle_types = (unsigned)val[7];
    out->rdma_capable = (uint32_t)val[8] != 0;
    out->buffer_id = val[9];
    out->pool = val2[0];

    if (managed) {
        out->kind = GP_CUMEM_MANAGED;
        rc = gp_err(GDRPY_ENOTSUP, "0x%llx is %s: its pages migrate between host and GPU and "
                                   "cannot be mapped through BAR1; use cuMemAlloc or cuMemCreate memory",
                    (unsigned long long)addr, gp_cuda_kind_name(out->kind));
        goto out;
    }
    if (memtype == 0) {
        out->kind = GP_CUMEM_UNKNOWN;
        rc = gp_err(GDRPY_EINVAL, "0x%llx is not CUDA device memory of this process (never "
                                  "allocated, already freed, or a plain host pointer)",
                    (unsigned long long)addr);
        goto out;
    }
    if (memtype == CU_MEMORYTYPE_HOST) {
        out->kind = GP_CUMEM_HOST;
        rc = gp_err(GDRPY_ENOTSUP, "0x%llx is %s: the CPU can already access it directly; "
                                   "only GPU memory is pinned",
                    (unsigned long long)addr,
                    gp_cuda_kind_name(out->kind));
        goto out;
    }
    if (memtype != CU_MEMORYTYPE_DEVICE) {
        out->kind = GP_CUMEM_OTHER;
        rc = gp_err(GDRPY_ENOTSUP, "0x%llx has CUDA memory type %u, not device memory",
                    (unsigned long long)addr, memtype);
        goto out;
    }

    /* Order: pool memory is refused; a cuMemCreate allocation exportable as
     * a POSIX fd is VMM; otherwise legacy-IPC-capable memory is cuMemAlloc
     * memory (even if a driver implements it over VMM internally); otherwise
     * VMM without an exportable handle type, or something else. */
    if (val2[0]) {
        out->kind = GP_CUMEM_POOL;
        out->device = ordinal;
        rc = gp_err(GDRPY_ENOTSUP, "0x%llx is %s: not supported; allocate with cuMemAlloc, or "
                                   "with cuMemCreate and CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR "
                                   "(gdrpy.memory does)",
                    (unsigned long long)addr,
                    gp_cuda_kind_name(out->kind));
        goto out;
    }
    CUmemGenericAllocationHandle h = 0;
    gp_CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    r = gp_cu.MemRetainAllocationHandle(&h, (void *)(uintptr_t)addr);
    if (r == CUDA_SUCCESS) {
        CUresult r2 = gp_cu.MemGetAllocationPropertiesFromHandle(&prop, h);
        gp_cu.MemRelease(h);
        if (r2) {
            rc = gp_cuda_err(0, r2, "cuMemGetAllocationPropertiesFromHandle",
                             "properties of the VMM allocation at 0x%llx",
                             (unsigned long long)addr);
            goto out;
        }
    }
    int vmm = r == CUDA_SUCCESS;
    int vmm_fd = vmm && ((out->handle_types | (unsigned)prop.requestedHandleTypes) &
                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (vmm && (vmm_fd || !out->ipc_capable)) {
        out->kind = GP_CUMEM_VMM;
        out->handle_types |= (unsigned)prop.requestedHandleTypes;
        if (prop.location_type != CU_MEM_LOCATION_TYPE_DEVICE) {
            out->kind = GP_CUMEM_HOST;
            rc = gp_err(GDRPY_ENOTSUP, "0x%llx is a cuMemCreate allocation located on the "
                                       "host (location type %d), not GPU memory",
                        (unsigned long long)addr,
                        prop.location_type);
            goto out;
        }
        out->device = prop.location_id;
        if (val2[1] && val2[2]) {
            out->base = val2[1];
            out->size = val2[2];
        }
    } else if (out->ipc_capable) {
        out->kind = GP_CUMEM_DEVICE;
        out->device = ordinal;
    } else {
        out->kind = GP_CUMEM_OTHER;
        out->device = ordinal;
        rc = gp_err(GDRPY_ENOTSUP, "0x%llx is device memory that is neither a cuMemAlloc "
                                   "allocation (legacy-IPC capable) nor a cuMemCreate one "
                                   "(cuMemRetainAllocationHandle: %s)",
                    (unsigned long long)addr,
                    gp_cuda_errname(r));
        goto out;
    }

    if (want_device >= 0 && out->device != want_device) {
        rc = gp_err(GDRPY_ENODEV, "0x%llx is memory of CUDA device %d, but this context "
                                  "is on device %d: open a context on device %d to pin it",
                    (unsigned long long)addr, out->device, want_device, out->device);
        goto out;
    }

    if (!out->base) {
        CUdeviceptr b = 0;
        size_t s = 0;
        r = gp_cu.MemGetAddressRange(&b, &s, addr);
        if (r) {
            rc = gp_cuda_err(0, r, "cuMemGetAddressRange", "allocation range of 0x%llx",
                             (unsigned long long)addr);
            goto out;
        }
        out->base = b;
        out->size = s;
    }
    if (addr < out->base || addr - out->base > out->size ||
        size > out->size - (addr - out->base)) {
        rc = gp_err(GDRPY_EINVAL, "range 0x%llx+%llu is not inside one allocation: the "
                                  "allocation at 0x%llx is [0x%llx, 0x%llx)",
                    (unsigned long long)addr,
                    (unsigned long long)size, (unsigned long long)addr,
                    (unsigned long long)out->base,
                    (unsigned long long)(out->base + out->size));
        goto out;
    }
    rc = 0;
out:
    if (entered) gp_cuda_leave(&sc);
    return rc;
}
