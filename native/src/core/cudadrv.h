/*
 * cudadrv.h - the few CUDA driver API calls gdrpy needs, resolved at run time
 * from libcuda.so.1 with dlopen (no link-time CUDA dependency, no cuda.h).
 *
 * Contract:
 *  - gp_cuda_load() loads the library, resolves every symbol and calls
 *    cuInit(0), once per process (pthread_once); later calls return the
 *    cached result.  Every other helper calls it first, so a caller need not.
 *  - Helpers return 0 or a gdrpy_status_t and set the thread's message with
 *    gp_err(), naming the CUresult (cuGetErrorName) and what was attempted.
 *  - The raw function table `gp_cu` may be used by the backends after a
 *    successful gp_cuda_load(); entries for optional symbols may be NULL.
 *  - Thread safety: all helpers are thread-safe.  Context push/pop is per
 *    thread (the CUDA context stack is thread-local): gp_cuda_leave() must be
 *    called on the thread that called gp_cuda_enter().
 */
#ifndef GDRPY_CUDADRV_H
#define GDRPY_CUDADRV_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* ---- minimal CUDA driver API types (values as in cuda.h) -------------- */
typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef uint64_t CUmemGenericAllocationHandle;
typedef struct {
    unsigned char reserved[64];
} CUipcMemHandle;

/* CUmemAllocationProp (32 bytes on x86-64), as filled by
 * cuMemGetAllocationPropertiesFromHandle. */
typedef struct {
    int type;                 /* CUmemAllocationType: 1 pinned */
    int requestedHandleTypes; /* CUmemAllocationHandleType bitmask */
    int location_type;        /* CUmemLocationType: 1 device */
    int location_id;          /* device ordinal when location_type == 1 */
    void *win32HandleMetaData;
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
} gp_CUmemAllocationProp;
_Static_assert(sizeof(gp_CUmemAllocationProp) == 32, "CUmemAllocationProp size");

typedef struct {
    int location_type; /* CUmemLocationType: 1 device */
    int location_id;
    int flags; /* CUmemAccess_flags: 3 read-write */
} gp_CUmemAccessDesc;
_Static_assert(sizeof(gp_CUmemAccessDesc) == 12, "CUmemAccessDesc size");
/* CUmemPoolProps (88 bytes on x86-64). */
typedef struct {
    int allocType;   /* CU_MEM_ALLOCATION_TYPE_PINNED */
    int handleTypes; /* CUmemAllocationHandleType bitmask; 0 none */
    int location_type, location_id;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} gp_CUmemPoolProps;
_Static_assert(sizeof(gp_CUmemPoolProps) == 88, "CUmemPoolProps size");

#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 3
#define CU_MEM_ALLOCATION_TYPE_PINNED 1
#define CU_MEM_ALLOC_GRANULARITY_MINIMUM 0

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_DEINITIALIZED 4
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_SUPPORTED 801

#define CU_POINTER_ATTRIBUTE_CONTEXT 1
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_DEVICE_POINTER 3
#define CU_POINTER_ATTRIBUTE_HOST_POINTER 4
#define CU_POINTER_ATTRIBUTE_BUFFER_ID 7
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE 10
#define CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define CU_POINTER_ATTRIBUTE_RANGE_SIZE 12
#define CU_POINTER_ATTRIBUTE_MAPPED 13
#define CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES 14
#define CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE 15
#define CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE 17
#define CU_POINTER_ATTRIBUTE_MAPPING_SIZE 18
#define CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR 19

#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713

#define CU_MEMHOSTALLOC_PORTABLE 0x01
#define CU_MEMHOSTALLOC_DEVICEMAP 0x02
#define CU_MEMHOSTALLOC_WRITECOMBINED 0x04
#define CU_MEMHOSTREGISTER_PORTABLE 0x01
#define CU_EVENT_DISABLE_TIMING 0x02

#define CU_MEMORYTYPE_HOST 1
#define CU_MEMORYTYPE_DEVICE 2
#define CU_MEMORYTYPE_ARRAY 3
#define CU_MEMORYTYPE_UNIFIED 4

#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 1
#define CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE 1

#define CU_DEVICE_ATTRIBUTE_PCI_BUS_ID 33
#define CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID 34
#define CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID 50
#define CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES 100
#define CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102
#define CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED 103
#define CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED 116
#define CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 124

/* Special stream handles (cuda.h: CU_STREAM_LEGACY, CU_STREAM_PER_THREAD). */
#define GP_CU_STREAM_LEGACY ((CUstream)0x1)
#define GP_CU_STREAM_PER_THREAD ((CUstream)0x2)

/* ---- the function table (resolved by gp_cuda_load) -------------------- */
struct gp_cuda_api {
    CUresult (*Init)(unsigned flags);
    CUresult (*DriverGetVersion)(int *v);
    CUresult (*GetErrorName)(CUresult r, const char **s);
    CUresult (*GetErrorString)(CUresult r, const char **s);
    CUresult (*DeviceGet)(CUdevice *d, int ordinal);
    CUresult (*DeviceGetCount)(int *n);
    CUresult (*DeviceGetName)(char *name, int len, CUdevice d);
    CUresult (*DeviceGetPCIBusId)(char *id, int len, CUdevice d);
    CUresult (*DeviceGetAttribute)(int *v, int attrib, CUdevice d);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *c, CUdevice d);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice d); /* _v2 */
    CUresult (*CtxGetCurrent)(CUcontext *c);
    CUresult (*CtxSetCurrent)(CUcontext c);
    CUresult (*CtxPushCurrent)(CUcontext c); /* _v2 */
    CUresult (*CtxPopCurrent)(CUcontext *c); /* _v2 */
    CUresult (*CtxGetDevice)(CUdevice *d);
    CUresult (*MemcpyHtoD)(CUdeviceptr dst, const void *src, size_t n); /* _v2 */
    CUresult (*MemcpyDtoH)(void *dst, CUdeviceptr src, size_t n);       /* _v2 */
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t n, CUstream s);
    CUresult (*MemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t n, CUstream s);
    CUresult (*StreamSynchronize)(CUstream s);
    CUresult (*StreamCreate)(CUstream *s, unsigned flags);
    CUresult (*StreamDestroy)(CUstream s);                                          /* _v2 */
    CUresult (*StreamGetCtx)(CUstream s, CUcontext *c);                             /* optional */
    CUresult (*MemGetAddressRange)(CUdeviceptr *base, size_t *size, CUdeviceptr p); /* _v2 */
    CUresult (*PointerGetAttribute)(void *data, int attr, CUdeviceptr p);
    CUresult (*PointerGetAttributes)(unsigned n, int *attrs, void **data, CUdeviceptr p);
    CUresult (*IpcGetMemHandle)(CUipcMemHandle *h, CUdeviceptr p);
    CUresult (*MemRetainAllocationHandle)(CUmemGenericAllocationHandle *h, void *addr);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle h);
    CUresult (*MemExportToShareableHandle)(void *out, CUmemGenericAllocationHandle h,
                                           int type, unsigned long long flags);
    CUresult (*MemGetAllocationPropertiesFromHandle)(gp_CUmemAllocationProp *prop,
                                                     CUmemGenericAllocationHandle h);
    CUresult (*MemGetHandleForAddressRange)(void *out, CUdeviceptr p, size_t n, int type,
                                            unsigned long long flags); /* optional */
    CUresult (*MemAlloc)(CUdeviceptr *p, size_t n);                    /* _v2, optional */
    CUresult (*MemFree)(CUdeviceptr p);                                /* _v2, optional */
    /* optional: VMM allocation (the nvrm self-test's scratch memory) */
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *h, size_t size,
                          const gp_CUmemAllocationProp *prop, unsigned long long flags);
    CUresult (*MemAddressReserve)(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                                  unsigned long long flags);
    CUresult (*MemAddressFree)(CUdeviceptr p, size_t size);
    CUresult (*MemMap)(CUdeviceptr p, size_t size, size_t offset,
                       CUmemGenericAllocationHandle h, unsigned long long flags);
    CUresult (*MemUnmap)(CUdeviceptr p, size_t size);
    CUresult (*MemSetAccess)(CUdeviceptr p, size_t size, const gp_CUmemAccessDesc *desc,
                             size_t count);
    CUresult (*MemGetAllocationGranularity)(size_t *g, const gp_CUmemAllocationProp *prop,
                                            int option);
    /* optional: stream-ordered pools (the nvrm backend learns where CUDA
     * describes a pool's chunks on a scratch pool of its own) */
    CUresult (*MemPoolCreate)(void **pool, const gp_CUmemPoolProps *props);
    CUresult (*MemPoolDestroy)(void *pool);
    CUresult (*DeviceGetDefaultMemPool)(void **pool, CUdevice dev);
    CUresult (*MemAllocFromPoolAsync)(CUdeviceptr *p, size_t n, void *pool, CUstream s);
    CUresult (*MemFreeAsync)(CUdeviceptr p, CUstream s);
    /* page-locked host memory and events (optional: src/staging/ reports
     * ENOTSUP without them, the channel ENXIO) */
    CUresult (*MemHostAlloc)(void **p, size_t n, unsigned flags);
    CUresult (*MemFreeHost)(void *p);
    CUresult (*MemHostGetDevicePointer)(CUdeviceptr *d, void *p, unsigned flags); /* _v2 */
    CUresult (*MemHostRegister)(void *p, size_t n, unsigned flags);               /* _v2 */
    CUresult (*MemHostUnregister)(void *p);
    CUresult (*EventCreate)(CUevent *e, unsigned flags);
    CUresult (*EventDestroy)(CUevent e); /* _v2 */
    CUresult (*EventRecord)(CUevent e, CUstream s);
    CUresult (*EventSynchronize)(CUevent e);
    CUresult (*EventQuery)(CUevent e);
    /* optional: staging traces only (stage_trace.c) */
    CUresult (*EventElapsedTime)(float *ms, CUevent start, CUevent end);
};

GP_HIDDEN extern struct gp_cuda_api gp_cu;

/* ---- loading and errors ----------------------------------------------- */
/* Loads libcuda.so.1 and calls cuInit(0) once.  0, or ENXIO (no library,
 * missing symbol, cuInit failure) with the reason in `why` (may be NULL) and
 * in the thread's message. */
GP_HIDDEN int gp_cuda_load(char *why, size_t n);
/* The address of `name` in a libcuda.so.1 that the process has already
 * loaded, or NULL: never loads the library and never calls cuInit (for
 * callers that must not bring CUDA into a process that does not use it:
 * libgdrapi asks which device owns an address only where the program uses
 * CUDA itself).  Keeps the library loaded once found.  Thread-safe. */
GP_HIDDEN void *gp_cuda_loaded_symbol(const char *name);
/* "CUDA_ERROR_INVALID_VALUE", or "CUresult 123" for unknown codes. Never NULL;
 * the returned string is static or thread-local. */
GP_HIDDEN const char *gp_cuda_errname(CUresult r);
/* The gdrpy status a CUresult maps to (EINVAL, ENOMEM, ENODEV, ENOTSUP,
 * ENXIO, else EIO). */
GP_HIDDEN int gp_cuda_status(CUresult r);
/* gp_err(code, "<what>: <cuCall> failed: <errname> (<r>)") - returns code;
 * code 0 means gp_cuda_status(r). */
GP_HIDDEN int gp_cuda_err(int code, CUresult r, const char *call, const char *fmt, ...)
    GP_PRINTF(4, 5);
/* cuDriverGetVersion (e.g. 13000), cached. */
GP_HIDDEN int gp_cuda_driver_version(int *v);

/* ---- devices ---------------------------------------------------------- */
GP_HIDDEN int gp_cuda_device_count(int *n);
/* ENODEV naming the count when `device` is not an ordinal of this host. */
GP_HIDDEN int gp_cuda_check_device(int device);
/* Name ("NVIDIA H100 80GB HBM3") and PCI bus id ("0000:41:00.0"); either
 * buffer may be NULL. */
GP_HIDDEN int gp_cuda_device_info(int device, char *name, size_t namelen,
                                  char *busid, size_t busidlen);
/* *coherent = 1 when the device reaches host memory coherently through the
 * host's page tables (CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES:
 * a cache-coherent CPU-GPU link such as Grace Hopper's C2C), else 0. */
GP_HIDDEN int gp_cuda_device_coherent(int device, int *coherent);
/* Parsed PCI address of the device. */
GP_HIDDEN int gp_cuda_device_pci(int device, unsigned *domain, unsigned *bus,
                                 unsigned *slot, unsigned *function);

/* ---- contexts --------------------------------------------------------- */
/* A holder (a backend context) declares that it will use `device`: the
 * device's primary context is then retained on first need and kept until
 * the last holder lets go (release).  Cheap: retains nothing by itself. */
GP_HIDDEN void gp_cuda_hold(int device);
GP_HIDDEN void gp_cuda_unhold(int device);

/* Makes a context of `device` current for the calling thread: the current
 * context if it already is one of that device, else the device's primary
 * context (the one cuda-python, CuPy and PyTorch use), which is pushed.
 * gp_cuda_leave() pops what enter pushed.  Scopes nest. */
typedef struct gp_cuda_scope {
    int pushed;      /* 1 if enter pushed a context */
    int temp_retain; /* 1 if enter retained a primary context it must release */
    int device;
} gp_cuda_scope;
GP_HIDDEN int gp_cuda_enter(int device, gp_cuda_scope *s);
GP_HIDDEN void gp_cuda_leave(gp_cuda_scope *s);

/* ---- copies ----------------------------------------------------------- */
/* dir 0: host -> device (cuMemcpyHtoD), 1: device -> host (cuMemcpyDtoH).
 * stream NULL: synchronous copy; otherwise the Async variant on `stream`
 * (enqueued only).  Runs in a context of `device` (see gp_cuda_enter), or in
 * the stream's own context when a stream is given. */
GP_HIDDEN int gp_cuda_memcpy(int device, int dir, uint64_t dptr, void *host, size_t n,
                             void *stream);

/* The same for host memory known to be page-locked: a synchronous
 * cuMemcpyHtoD from page-locked memory returns after the DMA, so the extra
 * wait that pageable sources need is left out. */
GP_HIDDEN int gp_cuda_memcpy_locked(int device, int dir, uint64_t dptr, void *host, size_t n,
                                    void *stream);

/* ---- gdrpy's own copies: never ordered after the caller's work ---------- */
/* Copies gdrpy makes for itself (the nvrm backend's proofs, its learning and
 * its self-test) run on a stream of gdrpy's own: one per device, created
 * CU_STREAM_NON_BLOCKING in the device's primary context on first use and
 * destroyed when the device's last holder lets go (gp_cuda_unhold).  A
 * synchronous cuMemcpy runs on the legacy default stream, which waits for
 * every kernel running on a blocking stream (the legacy and per-thread
 * default streams included): a kernel that never ends would hang the call.
 * The private stream is ordered after nothing but gdrpy's own work.
 *
 * gp_cuda_private_begin() holds the device, makes its primary context
 * current (pushed) and gives the stream; gp_cuda_private_end() undoes it, on
 * the same thread.  Work queued on the stream must be waited for with
 * cuStreamSynchronize(stream) before _end.  Thread-safe: threads share the
 * stream (a synchronize then also waits for the other threads' copies, which
 * are gdrpy's own and short). */
#define CU_STREAM_NON_BLOCKING 0x1
GP_HIDDEN int gp_cuda_private_begin(int device, CUstream *stream);
GP_HIDDEN void gp_cuda_private_end(int device);
/* dir 0: host -> device, 1: device -> host, on the private stream, waited
 * for (that copy only: never the caller's kernels). */
GP_HIDDEN int gp_cuda_private_copy(int device, int dir, uint64_t dptr, void *host, size_t n);

/* ---- pointer classification ------------------------------------------- */
enum {
    GP_CUMEM_UNKNOWN = 0, /* not an address CUDA knows */
    GP_CUMEM_DEVICE = 1,  /* cuMemAlloc / cudaMalloc (legacy IPC capable) */
    GP_CUMEM_VMM = 2,     /* cuMemCreate + cuMemMap */
    GP_CUMEM_POOL = 3,    /* cuMemAllocAsync / memory pools */
    GP_CUMEM_MANAGED = 4, /* cuMemAllocManaged */
    GP_CUMEM_HOST = 5,    /* cuMemHostAlloc / cuMemHostRegister / host VMM */
    GP_CUMEM_OTHER = 6    /* device memory of another kind */
};

typedef struct gp_cuda_ptr {
    int kind;      /* GP_CUMEM_* */
    int device;    /* ordinal the memory lives on; -1 if unknown */
    uint64_t base; /* the allocation (VMM: the mapped chunk) */
    uint64_t size;
    unsigned handle_types; /* VMM: requested/allowed CUmemAllocationHandleType mask */
    int ipc_capable;       /* legacy cuIpcGetMemHandle works */
    int rdma_capable;      /* CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE */
    uint64_t buffer_id;    /* CU_POINTER_ATTRIBUTE_BUFFER_ID */
    uint64_t pool;         /* CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE (pool memory) */
} gp_cuda_ptr;

/* Classifies [addr, addr+size).  Fails with:
 *   EINVAL   unknown address, or the range runs past the end of the allocation;
 *   ENOTSUP  managed memory, host memory, memory pools, other kinds
 *            (the message names the kind);
 *   ENODEV   memory of another device than `want_device` (>= 0; -1 = any),
 *            naming both ordinals.
 * Call it inside gp_cuda_enter(want_device) (it enters itself otherwise). */
GP_HIDDEN int gp_cuda_classify(uint64_t addr, uint64_t size, int want_device,
                               gp_cuda_ptr *out);
GP_HIDDEN const char *gp_cuda_kind_name(int kind);

#endif /* GDRPY_CUDADRV_H */
