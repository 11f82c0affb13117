/*
 * backend_nvrm.c - BAR1 mappings through the NVIDIA driver's own resource
 * manager (RM) interface: /dev/nvidiactl + /dev/nvidiaN, no extra module.
 *
 * The ioctl sequence and every layout below follow /work/shared/facts/
 * nvrm-bar1.md (measured on driver 580.159.04); the structs are our own
 * definitions, checked with _Static_assert.
 *
 * Per context: one /dev/nvidiactl fd, one RM root client, one RM device
 * object (the GPU matched to the CUDA ordinal by PCI address).
 * Per pin: one RM memory handle in our client that keeps the pages alive
 *   route A - cuMemCreate memory: export as POSIX fd, import into our client;
 *   route C - cuMemAlloc memory: RM_DUP_OBJECT of CUDA's own RM handle, found
 *             through the (undocumented) cuIpcGetMemHandle words, verified
 *             against cuMemcpyDtoH before the pin is accepted.
 * Per mapping: one /dev/nvidiaN fd carrying one RM CPU mapping, mmap'ed
 * MAP_SHARED and MADV_DONTFORK.
 *
 * Thread safety: the core holds ctx->lock around pin/unpin/map/unmap; the
 * RM handle counter has its own lock; everything else is per object.
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

#if defined(__aarch64__)
#define GP_NVRM_ARCH "aarch64"
#elif defined(__powerpc64__)
#define GP_NVRM_ARCH "ppc64le"
#elif defined(__riscv)
#define GP_NVRM_ARCH "riscv64"
#else
#define GP_NVRM_ARCH "non-x86-64"
#endif

/* ---- ioctl numbers ---------------------------------------------------- */
#define NV_IOCTL_MAGIC 'F'
#define NV_IOC(nr, size) _IOC(_IOC_READ | _IOC_WRITE, NV_IOCTL_MAGIC, (nr), (size))

#define NV_ESC_CARD_INFO 200
#define NV_ESC_CHECK_VERSION_STR 210
#define NV_ESC_RM_FREE 0x29
#define NV_ESC_RM_CONTROL 0x2A
#define NV_ESC_RM_ALLOC 0x2B
#define NV_ESC_RM_DUP_OBJECT 0x34
#define NV_ESC_RM_MAP_MEMORY 0x4E
#define NV_ESC_RM_UNMAP_MEMORY 0x4F

#define NV_RM_API_VERSION_CMD_QUERY 0x32 /* '2' */

#define NV01_ROOT_CLIENT 0x41
#define NV01_DEVICE_0 0x80

#define NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2 0x205
#define NV0000_CTRL_CMD_OS_UNIX_GET_EXPORT_OBJECT_INFO 0x3d08
#define NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD 0x3d0c
#define NV_IMPORT_OBJECT_TYPE_VIDMEM 1

/* NVOS33 flags bits 25:23: the caching type the driver chose. */
#define NVOS33_CACHING_TYPE(f) (((f) >> 23) & 7u)

/* RM status codes we act on (the full list is in status_names below). */
#define NV_OK 0x0
#define NV_ERR_INSERT_DUPLICATE_NAME 0x19
#define NV_ERR_INSUFFICIENT_PERMISSIONS 0x1B
#define NV_ERR_INVALID_DEVICE 0x26
#define NV_ERR_IN_USE 0x17
#define NV_ERR_NO_MEMORY 0x51
#define NV_ERR_NOT_SUPPORTED 0x56
#define NV_ERR_STATE_IN_USE 0x63

/* Handles we choose inside our own client (RM's generated ones start at
 * 0xcaf00000, so this range never meets them). */
#define H_DEVICE 0x5a0d0001u
#define H_MEM_FIRST 0x5a100000u
#define H_MEM_LAST 0x5affffffu

/* ---- ioctl argument layouts ------------------------------------------- */
/* Measured on x86-64 (shared/facts/nvrm-bar1.md).  The driver builds these
 * structs from NvU32/NvU64/NvHandle and 8-byte aligned NvP64 fields, whose
 * sizes and alignments are the same under the x86-64 SysV and the AArch64
 * AAPCS64 LP64 ABIs, so the layouts are the same on aarch64: the asserts
 * below hold for whichever target is built, and CI builds both (x86-64
 * natively, aarch64 with aarch64-linux-gnu-gcc in scripts/ci/70-arm64.sh). */
typedef struct {
    uint32_t hRoot, hObjectParent, hObjectOld, status;
} nv_os00_t;

typedef struct {
    uint32_t hRoot, hObjectParent, hObjectNew, hClass;
    uint64_t pAllocParms;
    uint32_t paramsSize, status;
} nv_os21_t;

typedef struct {
    uint32_t hClient, hObject, cmd, flags;
    uint64_t params;
    uint32_t paramsSize, status;
} nv_os54_t;

typedef struct {
    uint32_t hClient, hParent, hObject, hClientSrc, hObjectSrc, flags, status;
} nv_os55_t;

typedef struct {
    uint32_t hClient, hDevice, hMemory, pad0;
    uint64_t offset, length, pLinearAddress;
    uint32_t status, flags;
    int32_t fd;
    uint32_t pad1;
} nv_os33_fd_t;

typedef struct {
    uint32_t hClient, hDevice, hMemory, pad0;
    uint64_t pLinearAddress;
    uint32_t status, flags;
} nv_os34_t;

typedef struct {
    uint8_t valid;
    uint8_t pad0[3];
    uint32_t domain;
    uint8_t bus, slot, function, pad1;
    uint16_t vendor_id, device_id;
    uint32_t gpu_id;
    uint16_t interrupt_line;
    uint8_t pad2[2];
    uint64_t reg_address, reg_size, fb_address, fb_size;
    uint32_t minor_number;
    uint8_t dev_name[10];
    uint8_t pad3[2];
} nv_card_info_t;

typedef struct {
    uint32_t cmd, reply;
    char version[64];
} nv_version_t;

typedef struct {
    uint32_t deviceId, hClientShare, hTargetClient, hTargetDevice, flags, pad0;
    uint64_t vaSpaceSize, vaStartInternal, vaLimitInternal;
    uint32_t vaMode, pad1;
} nv0080_alloc_t;

typedef struct {
    uint32_t gpuId, gpuFlags, deviceInstance, subDeviceInstance;
    uint32_t sliStatus, boardId, gpuInstance;
    int32_t numaId;
} nv0000_id_info_v2_t;

typedef struct {
    int32_t fd;
    uint32_t deviceInstance, gpuInstanceId;
    uint16_t maxObjects;
    uint8_t metadata[64];
    uint8_t pad0[2];
} nv0000_export_info_t;

typedef struct {
    int32_t fd;
    uint32_t hParent;
    uint32_t objects[128];
    uint8_t objectTypes[128];
    uint16_t numObjects, index;
} nv0000_import_t;

#define CHECK_LAYOUT(t, sz) _Static_assert(sizeof(t) == (sz), #t " size")
CHECK_LAYOUT(nv_os00_t, 16);
CHECK_LAYOUT(nv_os21_t, 32);
CHECK_LAYOUT(nv_os54_t, 32);
CHECK_LAYOUT(nv_os55_t, 28);
CHECK_LAYOUT(nv_os33_fd_t, 56);
CHECK_LAYOUT(nv_os34_t, 32);
CHECK_LAYOUT(nv_card_info_t, 72);
CHECK_LAYOUT(nv_version_t, 72);
CHECK_LAYOUT(nv0080_alloc_t, 56);
CHECK_LAYOUT(nv0000_id_info_v2_t, 32);
CHECK_LAYOUT(nv0000_export_info_t, 80);
CHECK_LAYOUT(nv0000_import_t, 652);
_Static_assert(offsetof(nv_os21_t, pAllocParms) == 16, "NVOS21.pAllocParms");
_Static_assert(offsetof(nv_os21_t, status) == 28, "NVOS21.status");
_Static_assert(offsetof(nv_os54_t, params) == 16, "NVOS54.params");
_Static_assert(offsetof(nv_os54_t, status) == 28, "NVOS54.status");
_Static_assert(offsetof(nv_os55_t, status) == 24, "NVOS55.status");
_Static_assert(offsetof(nv_os33_fd_t, offset) == 16, "NVOS33.offset");
_Static_assert(offsetof(nv_os33_fd_t, pLinearAddress) == 32, "NVOS33.pLinearAddress");
_Static_assert(offsetof(nv_os33_fd_t, status) == 40, "NVOS33.status");
_Static_assert(offsetof(nv_os33_fd_t, flags) == 44, "NVOS33.flags");
_Static_assert(offsetof(nv_os33_fd_t, fd) == 48, "NVOS33.fd");
_Static_assert(offsetof(nv_os34_t, pLinearAddress) == 16, "NVOS34.pLinearAddress");
_Static_assert(offsetof(nv_os34_t, status) == 24, "NVOS34.status");
_Static_assert(offsetof(nv_card_info_t, domain) == 4, "card.domain");
_Static_assert(offsetof(nv_card_info_t, bus) == 8, "card.bus");
_Static_assert(offsetof(nv_card_info_t, vendor_id) == 12, "card.vendor");
_Static_assert(offsetof(nv_card_info_t, gpu_id) == 16, "card.gpu_id");
_Static_assert(offsetof(nv_card_info_t, reg_address) == 24, "card.reg_address");
_Static_assert(offsetof(nv_card_info_t, fb_size) == 48, "card.fb_size");
_Static_assert(offsetof(nv_card_info_t, minor_number) == 56, "card.minor");
_Static_assert(offsetof(nv_card_info_t, dev_name) == 60, "card.dev_name");
_Static_assert(offsetof(nv0080_alloc_t, vaSpaceSize) == 24, "0080.vaSpaceSize");
_Static_assert(offsetof(nv0080_alloc_t, vaMode) == 48, "0080.vaMode");
_Static_assert(offsetof(nv0000_id_info_v2_t, deviceInstance) == 8, "idinfo.deviceInstance");
_Static_assert(offsetof(nv0000_id_info_v2_t, numaId) == 28, "idinfo.numaId");
_Static_assert(offsetof(nv0000_export_info_t, maxObjects) == 12, "export.maxObjects");
_Static_assert(offsetof(nv0000_export_info_t, metadata) == 14, "export.metadata");
_Static_assert(offsetof(nv0000_import_t, objects) == 8, "import.objects");
_Static_assert(offsetof(nv0000_import_t, objectTypes) == 520, "import.objectTypes");
_Static_assert(offsetof(nv0000_import_t, numObjects) == 648, "import.numObjects");
_Static_assert(offsetof(nv0000_import_t, index) == 650, "import.index");
/* 64-bit fields 8-byte aligned (NvP64 / NvU64), as the driver's structs. */
_Static_assert(_Alignof(nv_os21_t) == 8 && _Alignof(nv_os54_t) == 8 &&
               _Alignof(nv_os33_fd_t) == 8 && _Alignof(nv_os34_t) == 8 &&
               _Alignof(nv_card_info_t) == 8 && _Alignof(nv0080_alloc_t) == 8,
               "64-bit members are 8-byte aligned");
_Static_assert(sizeof(void *) == 8 && sizeof(long) == 8, "LP64");
#if defined(__x86_64__) || defined(__aarch64__)
/* Both use the asm-generic ioctl encoding (dir 31:30, size 29:16, type
 * 15:8, nr 7:0), as the driver's own nv-ioctl numbers do on each. */
_Static_assert(NV_IOC(NV_ESC_RM_CONTROL, 32) == 0xc020462au, "ioctl encoding");
#endif

/* ---- NV status names (values from the driver's nvstatuscodes.h) ------- */
static const struct { uint32_t code; const char *name; } status_names[] = {
    {0x0, "NV_OK"}, {0xffff, "NV_ERR_GENERIC"}, {0x1, "NV_ERR_BROKEN_FB"},
    {0x2, "NV_ERR_BUFFER_TOO_SMALL"}, {0x3, "NV_ERR_BUSY_RETRY"},
    {0x4, "NV_ERR_CALLBACK_NOT_SCHEDULED"}, {0x5, "NV_ERR_CARD_NOT_PRESENT"},
    {0x6, "NV_ERR_CYCLE_DETECTED"}, {0x7, "NV_ERR_DMA_IN_USE"},
    {0x8, "NV_ERR_DMA_MEM_NOT_LOCKED"}, {0x9, "NV_ERR_DMA_MEM_NOT_UNLOCKED"},
    {0xa, "NV_ERR_DUAL_LINK_INUSE"}, {0xb, "NV_ERR_ECC_ERROR"}, {0xc, "NV_ERR_FIFO_BAD_ACCESS"},
    {0xd, "NV_ERR_FREQ_NOT_SUPPORTED"}, {0xe, "NV_ERR_GPU_DMA_NOT_INITIALIZED"},
    {0xf, "NV_ERR_GPU_IS_LOST"}, {0x10, "NV_ERR_GPU_IN_FULLCHIP_RESET"},
    {0x11, "NV_ERR_GPU_NOT_FULL_POWER"}, {0x12, "NV_ERR_GPU_UUID_NOT_FOUND"},
    {0x13, "NV_ERR_HOT_SWITCH"}, {0x14, "NV_ERR_I2C_ERROR"},
    {0x15, "NV_ERR_I2C_SPEED_TOO_HIGH"}, {0x16, "NV_ERR_ILLEGAL_ACTION"},
    {0x17, "NV_ERR_IN_USE"}, {0x18, "NV_ERR_INFLATE_COMPRESSED_DATA_FAILED"},
    {0x19, "NV_ERR_INSERT_DUPLICATE_NAME"}, {0x1a, "NV_ERR_INSUFFICIENT_RESOURCES"},
    {0x1b, "NV_ERR_INSUFFICIENT_PERMISSIONS"}, {0x1c, "NV_ERR_INSUFFICIENT_POWER"},
    {0x1d, "NV_ERR_INVALID_ACCESS_TYPE"}, {0x1e, "NV_ERR_INVALID_ADDRESS"},
    {0x1f, "NV_ERR_INVALID_ARGUMENT"}, {0x20, "NV_ERR_INVALID_BASE"},
    {0x21, "NV_ERR_INVALID_CHANNEL"}, {0x22, "NV_ERR_INVALID_CLASS"},
    {0x23, "NV_ERR_INVALID_CLIENT"}, {0x24, "NV_ERR_INVALID_COMMAND"},
    {0x25, "NV_ERR_INVALID_DATA"}, {0x26, "NV_ERR_INVALID_DEVICE"},
    {0x27, "NV_ERR_INVALID_DMA_SPECIFIER"}, {0x28, "NV_ERR_INVALID_EVENT"},
    {0x29, "NV_ERR_INVALID_FLAGS"}, {0x2a, "NV_ERR_INVALID_FUNCTION"},
    {0x2b, "NV_ERR_INVALID_HEAP"}, {0x2c, "NV_ERR_INVALID_INDEX"},
    {0x2d, "NV_ERR_INVALID_IRQ_LEVEL"}, {0x2e, "NV_ERR_INVALID_LIMIT"},
    {0x2f, "NV_ERR_INVALID_LOCK_STATE"}, {0x30, "NV_ERR_INVALID_METHOD"},
    {0x31, "NV_ERR_INVALID_OBJECT"}, {0x32, "NV_ERR_INVALID_OBJECT_BUFFER"},
    {0x33, "NV_ERR_INVALID_OBJECT_HANDLE"}, {0x34, "NV_ERR_INVALID_OBJECT_NEW"},
    {0x35, "NV_ERR_INVALID_OBJECT_OLD"}, {0x36, "NV_ERR_INVALID_OBJECT_PARENT"},
    {0x37, "NV_ERR_INVALID_OFFSET"}, {0x38, "NV_ERR_INVALID_OPERATION"},
    {0x39, "NV_ERR_INVALID_OWNER"}, {0x3a, "NV_ERR_INVALID_PARAM_STRUCT"},
    {0x3b, "NV_ERR_INVALID_PARAMETER"}, {0x3c, "NV_ERR_INVALID_PATH"},
    {0x3d, "NV_ERR_INVALID_POINTER"}, {0x3e, "NV_ERR_INVALID_REGISTRY_KEY"},
    {0x3f, "NV_ERR_INVALID_REQUEST"}, {0x40, "NV_ERR_INVALID_STATE"},
    {0x41, "NV_ERR_INVALID_STRING_LENGTH"}, {0x42, "NV_ERR_INVALID_READ"},
    {0x43, "NV_ERR_INVALID_WRITE"}, {0x44, "NV_ERR_INVALID_XLATE"},
    {0x45, "NV_ERR_IRQ_NOT_FIRING"}, {0x46, "NV_ERR_IRQ_EDGE_TRIGGERED"},
    {0x47, "NV_ERR_MEMORY_TRAINING_FAILED"}, {0x48, "NV_ERR_MISMATCHED_SLAVE"},
    {0x49, "NV_ERR_MISMATCHED_TARGET"}, {0x4a, "NV_ERR_MISSING_TABLE_ENTRY"},
    {0x4b, "NV_ERR_MODULE_LOAD_FAILED"}, {0x4c, "NV_ERR_MORE_DATA_AVAILABLE"},
    {0x4d, "NV_ERR_MORE_PROCESSING_REQUIRED"}, {0x4e, "NV_ERR_MULTIPLE_MEMORY_TYPES"},
    {0x4f, "NV_ERR_NO_FREE_FIFOS"}, {0x50, "NV_ERR_NO_INTR_PENDING"},
    {0x51, "NV_ERR_NO_MEMORY"}, {0x52, "NV_ERR_NO_SUCH_DOMAIN"}, {0x53, "NV_ERR_NO_VALID_PATH"},
    {0x54, "NV_ERR_NOT_COMPATIBLE"}, {0x55, "NV_ERR_NOT_READY"}, {0x56, "NV_ERR_NOT_SUPPORTED"},
    {0x57, "NV_ERR_OBJECT_NOT_FOUND"}, {0x58, "NV_ERR_OBJECT_TYPE_MISMATCH"},
    {0x59, "NV_ERR_OPERATING_SYSTEM"}, {0x5a, "NV_ERR_OTHER_DEVICE_FOUND"},
    {0x5b, "NV_ERR_OUT_OF_RANGE"}, {0x5c, "NV_ERR_OVERLAPPING_UVM_COMMIT"},
    {0x5d, "NV_ERR_PAGE_TABLE_NOT_AVAIL"}, {0x5e, "NV_ERR_PID_NOT_FOUND"},
    {0x5f, "NV_ERR_PROTECTION_FAULT"}, {0x60, "NV_ERR_RC_ERROR"},
    {0x61, "NV_ERR_REJECTED_VBIOS"}, {0x62, "NV_ERR_RESET_REQUIRED"},
    {0x63, "NV_ERR_STATE_IN_USE"}, {0x64, "NV_ERR_SIGNAL_PENDING"}, {0x65, "NV_ERR_TIMEOUT"},
    {0x66, "NV_ERR_TIMEOUT_RETRY"}, {0x67, "NV_ERR_TOO_MANY_PRIMARIES"},
    {0x68, "NV_ERR_UVM_ADDRESS_IN_USE"}, {0x69, "NV_ERR_MAX_SESSION_LIMIT_REACHED"},
    {0x6a, "NV_ERR_LIB_RM_VERSION_MISMATCH"}, {0x6b, "NV_ERR_PRIV_SEC_VIOLATION"},
    {0x6c, "NV_ERR_GPU_IN_DEBUG_MODE"}, {0x6d, "NV_ERR_FEATURE_NOT_ENABLED"},
    {0x6e, "NV_ERR_RESOURCE_LOST"}, {0x6f, "NV_ERR_PMU_NOT_READY"}, {0x70, "NV_ERR_FLCN_ERROR"},
    {0x71, "NV_ERR_FATAL_ERROR"}, {0x72, "NV_ERR_MEMORY_ERROR"},
    {0x73, "NV_ERR_INVALID_LICENSE"}, {0x74, "NV_ERR_NVLINK_INIT_ERROR"},
    {0x75, "NV_ERR_NVLINK_MINION_ERROR"}, {0x76, "NV_ERR_NVLINK_CLOCK_ERROR"},
    {0x77, "NV_ERR_NVLINK_TRAINING_ERROR"}, {0x78, "NV_ERR_NVLINK_CONFIGURATION_ERROR"},
    {0x79, "NV_ERR_RISCV_ERROR"}, {0x7a, "NV_ERR_FABRIC_MANAGER_NOT_PRESENT"},
    {0x7b, "NV_ERR_ALREADY_SIGNALLED"}, {0x7c, "NV_ERR_QUEUE_TASK_SLOT_NOT_AVAILABLE"},
    {0x7d, "NV_ERR_KEY_ROTATION_IN_PROGRESS"}, {0x7e, "NV_ERR_TEST_ONLY_CODE_NOT_ENABLED"},
    {0x7f, "NV_ERR_SECURE_BOOT_FAILED"}, {0x80, "NV_ERR_INSUFFICIENT_ZBC_ENTRY"},
    {0x81, "NV_ERR_NVLINK_FABRIC_NOT_READY"}, {0x82, "NV_ERR_NVLINK_FABRIC_FAILURE"},
    {0x83, "NV_ERR_GPU_MEMORY_ONLINING_FAILURE"},
    {0x84, "NV_ERR_REDUCTION_MANAGER_NOT_AVAILABLE"}, {0x85, "NV_ERR_THRESHOLD_CROSSED"},
    {0x86, "NV_ERR_RESOURCE_RETIREMENT_ERROR"}, {0x87, "NV_ERR_FABRIC_STATE_OUT_OF_SYNC"},
    {0x88, "NV_ERR_BUFFER_FULL"}, {0x89, "NV_ERR_BUFFER_EMPTY"},
    {0x8a, "NV_ERR_MC_FLA_OFFSET_TABLE_FULL"}, {0x8b, "NV_ERR_DMA_XFER_FAILED"},
    {0x10001, "NV_WARN_HOT_SWITCH"}, {0x10002, "NV_WARN_INCORRECT_PERFMON_DATA"},
    {0x10003, "NV_WARN_MISMATCHED_SLAVE"}, {0x10004, "NV_WARN_MISMATCHED_TARGET"},
    {0x10005, "NV_WARN_MORE_PROCESSING_REQUIRED"}, {0x10006, "NV_WARN_NOTHING_TO_DO"},
    {0x10007, "NV_WARN_NULL_OBJECT"}, {0x10008, "NV_WARN_OUT_OF_RANGE"},
    {0x10009, "NV_WARN_THRESHOLD_CROSSED"},
};

static const char *nv_status_name(uint32_t st)
{
    static __thread char buf[32];
    for (size_t i = 0; i < sizeof status_names / sizeof status_names[0]; i++)
        if (status_names[i].code == st) return status_names[i].name;
    snprintf(buf, sizeof buf, "NV status 0x%x", st);
    return buf;
}

static int nv_status_code(uint32_t st)
{
    switch (st) {
    case NV_ERR_NO_MEMORY: return GDRPY_ENOMEM;
    case NV_ERR_NOT_SUPPORTED: return GDRPY_ENOTSUP;
    case NV_ERR_INSUFFICIENT_PERMISSIONS: return GDRPY_EACCES;
    case NV_ERR_INVALID_DEVICE: return GDRPY_ENODEV;
    case NV_ERR_IN_USE:
    case NV_ERR_STATE_IN_USE: return GDRPY_EBUSY;
    default: return GDRPY_EIO;
    }
}

/* ---- state ------------------------------------------------------------ */
struct nvrm_ctx {
    int ctl;                    /* /dev/nvidiactl */
    uint32_t hClient, hDevice;
    uint32_t gpu_id, dev_instance, minor;
    char devpath[32];           /* /dev/nvidiaN */
    char version[64];           /* kernel driver version string */
    int known_driver;           /* 580.x: the measured ABI */
    int route_c_ok;             /* route C allowed (known driver or forced) */
    int force;                  /* GDRPY_NVRM_FORCE=1 */
    pthread_mutex_t hlock;      /* guards next_handle */
    uint32_t next_handle;
    /* live driver objects, for leak checks (atomic: read without the lock) */
    uint64_t n_mem;             /* imported / duplicated RM memory handles */
    uint64_t n_map;             /* RM CPU mappings (each an RM mapping + a mmap) */
};

static void live_add(uint64_t *c, int d)
{
    __atomic_add_fetch(c, (uint64_t)(int64_t)d, __ATOMIC_RELAXED);
}

struct nvrm_map {
    int devfd;                  /* open only while a mapping is being made */
    void *mm;                   /* mmap result */
    size_t mm_len;
    uint64_t plinear;           /* RM's linear address (needed to unmap) */
    uint32_t flags;             /* NVOS33 flags returned by the driver */
};

struct nvrm_pin {
    char route;                 /* 'A' (import) or 'C' (dup) */
    uint32_t hMemory;
    uint64_t rm_off;            /* offset of pin->va inside the RM object */
    struct nvrm_map map;
};

static long host_page(void)
{
    static long pg;
    if (!pg) {
        long v = sysconf(_SC_PAGESIZE);
        pg = v > 0 ? v : 4096;
    }
    return pg;
}

static int env_force(void)
{
    const char *s = getenv("GDRPY_NVRM_FORCE");
    return s && atoi(s) == 1;
}

/* The backend has run on x86-64 GPU hosts only.  Elsewhere the ioctl
 * layouts are the same (asserted above), but what the driver does with the
 * mappings is not verified: on arm64 it maps BAR1 Device-nGnRE (kernel-open
 * nv-pgprot.h), kernels often use 64 KiB pages, and Grace systems take the
 * coherent C2C paths of RM_MAP_MEMORY.  Refuse there unless forced, rather
 * than guess. */
static int arch_gate(void)
{
#if defined(__x86_64__)
    return 0;
#else
    if (env_force())
        return 0;
    return gp_err(GDRPY_ENOTSUP, "validated on x86-64 only; on %s the ioctl layouts match at "
                  "compile time but BAR1 mapping is untested on its hardware "
                  "(GDRPY_NVRM_FORCE=1 tries it)", GP_NVRM_ARCH);
#endif
}

/* ---- ioctl wrappers --------------------------------------------------- */
/* Returns 0 when the ioctl succeeded and *status (if given) is NV_OK;
 * otherwise sets the message "<what>: <escape> ..." and returns a code. */
static int nv_call(int fd, unsigned nr, const char *esc, void *arg, size_t size,
                   const uint32_t *status, const char *what)
{
    int r;
    do {
        r = ioctl(fd, NV_IOC(nr, size), arg);
    } while (r < 0 && errno == EINTR);
    if (r < 0) {
        int e = errno;
        if (status && *status != NV_OK)
            return gp_err(nv_status_code(*status), "%s: %s ioctl failed: errno %d (%s), RM "
                          "status %s (0x%x)", what, esc, e, strerror(e),
                          nv_status_name(*status), *status);
        return gp_err(e == ENOMEM ? GDRPY_ENOMEM : GDRPY_EIO,
                      "%s: %s ioctl failed: errno %d (%s)", what, esc, e, strerror(e));
    }
    if (status && *status != NV_OK)
        return gp_err(nv_status_code(*status), "%s: %s returned RM status %s (0x%x)", what,
                      esc, nv_status_name(*status), *status);
    return 0;
}

static int rm_free(int ctl, uint32_t hClient, uint32_t hParent, uint32_t h, const char *what)
{
    nv_os00_t a = {hClient, hParent, h, 0};
    return nv_call(ctl, NV_ESC_RM_FREE, "RM_FREE", &a, sizeof a, &a.status, what);
}

static int rm_control(struct nvrm_ctx *nc, uint32_t cmd, void *params, uint32_t size,
                      const char *what)
{
    nv_os54_t a;
    memset(&a, 0, sizeof a);
    a.hClient = nc->hClient;
    a.hObject = nc->hClient;
    a.cmd = cmd;
    a.params = (uint64_t)(uintptr_t)params;
    a.paramsSize = size;
    return nv_call(nc->ctl, NV_ESC_RM_CONTROL, "RM_CONTROL", &a, sizeof a, &a.status, what);
}

static uint32_t new_handle(struct nvrm_ctx *nc)
{
    pthread_mutex_lock(&nc->hlock);
    uint32_t h = nc->next_handle++;
    if (nc->next_handle > H_MEM_LAST) nc->next_handle = H_MEM_FIRST;
    pthread_mutex_unlock(&nc->hlock);
    return h;
}

/* ---- session: ctl fd, version gate, GPU match, client, device ---------- */

static void session_close(struct nvrm_ctx *nc)
{
    if (nc->ctl < 0) return;
    if (nc->hClient) rm_free(nc->ctl, nc->hClient, 0, nc->hClient, "freeing the RM client");
    close(nc->ctl);   /* also frees whatever the client still owns */
    nc->ctl = -1;
    nc->hClient = 0;
}

static int open_node(const char *path, int *fd)
{
    *fd = open(path, O_RDWR | O_CLOEXEC);
    if (*fd >= 0) return 0;
    int e = errno;
    if (e == ENOENT)
        return gp_err(GDRPY_ENXIO, "%s not present: the NVIDIA kernel driver is not loaded "
                      "(or the device nodes are not visible in this container)", path);
    if (e == EACCES || e == EPERM)
        return gp_err(GDRPY_EACCES, "cannot open %s: %s (device nodes need read-write "
                      "access for this user)", path, strerror(e));
    return gp_err(GDRPY_EIO, "cannot open %s: errno %d (%s)", path, e, strerror(e));
}

static int session_open(int device, struct nvrm_ctx *nc)
{
    memset(nc, 0, sizeof *nc);
    nc->ctl = -1;
    nc->next_handle = H_MEM_FIRST;
    nc->force = env_force();
    int rc;

    /* CUDA side: the device and its PCI address. */
    unsigned dom, bus, slot, fn;
    rc = gp_cuda_device_pci(device, &dom, &bus, &slot, &fn);
    if (rc) return rc;

    rc = open_node("/dev/nvidiactl", &nc->ctl);
    if (rc) return rc;

    /* Driver version: the ABI gate. */
    nv_version_t ver;
    memset(&ver, 0, sizeof ver);
    ver.cmd = NV_RM_API_VERSION_CMD_QUERY;
    rc = nv_call(nc->ctl, NV_ESC_CHECK_VERSION_STR, "CHECK_VERSION_STR", &ver, sizeof ver,
                 NULL, "querying the NVIDIA driver version");
    if (rc) goto fail;
    ver.version[sizeof ver.version - 1] = '\0';
    snprintf(nc->version, sizeof nc->version, "%s", ver.version);
    int major = atoi(nc->version);
    nc->known_driver = (major == 580);
    if (!nc->known_driver && !nc->force) {
        rc = gp_err(GDRPY_ENOTSUP, "NVIDIA driver %s is not one the nvrm backend was "
                    "validated on (580.x): its RM interface is undocumented, so it is "
                    "refused; set GDRPY_NVRM_FORCE=1 to try it anyway, or use the gdrdrv "
                    "backend", nc->version[0] ? nc->version : "(unknown)");
        goto fail;
    }
    int cuv = 0;
    gp_cuda_driver_version(&cuv);
    nc->route_c_ok = nc->force || (nc->known_driver && cuv / 10 == 1300);

    /* Which RM GPU is the CUDA device? Match by PCI address. */
    enum { NCARDS = 32 };
    nv_card_info_t cards[NCARDS];
    memset(cards, 0, sizeof cards);
    rc = nv_call(nc->ctl, NV_ESC_CARD_INFO, "CARD_INFO", cards, sizeof cards, NULL,
                 "listing GPUs");
    if (rc) goto fail;
    int found = -1;
    char seen[256] = "";
    size_t used = 0;
    for (int i = 0; i < NCARDS; i++) {
        if (!cards[i].valid) continue;
        if (used < sizeof seen)
            used += (size_t)snprintf(seen + used, sizeof seen - used, "%s%04x:%02x:%02x.%x",
                                     used ? ", " : "", cards[i].domain, cards[i].bus,
                                     cards[i].slot, cards[i].function);
        if (cards[i].domain == dom && cards[i].bus == bus && cards[i].slot == slot &&
            cards[i].function == fn && found < 0)
            found = i;
    }
    if (found < 0) {
        rc = gp_err(GDRPY_ENODEV, "CUDA device %d (PCI %04x:%02x:%02x.%x) is not among the "
                    "GPUs /dev/nvidiactl lists (%s)", device, dom, bus, slot, fn,
                    seen[0] ? seen : "none");
        goto fail;
    }
    nc->gpu_id = cards[found].gpu_id;
    nc->minor = cards[found].minor_number;
    snprintf(nc->devpath, sizeof nc->devpath, "/dev/nvidia%u", nc->minor);
    {
        int dfd;
        rc = open_node(nc->devpath, &dfd);
        if (rc) goto fail;
        close(dfd);
    }

    /* Root client. */
    nv_os21_t a;
    memset(&a, 0, sizeof a);
    a.hClass = NV01_ROOT_CLIENT;
    rc = nv_call(nc->ctl, NV_ESC_RM_ALLOC, "RM_ALLOC", &a, sizeof a, &a.status,
                 "allocating an RM client (class NV01_ROOT_CLIENT)");
    if (rc) goto fail;
    nc->hClient = a.hObjectNew;
    if (!nc->hClient) {
        rc = gp_err(GDRPY_EIO, "allocating an RM client: the driver returned handle 0");
        goto fail;
    }

    /* deviceInstance of our GPU, then the device object. */
    nv0000_id_info_v2_t id;
    memset(&id, 0, sizeof id);
    id.gpuId = nc->gpu_id;
    rc = rm_control(nc, NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2, &id, sizeof id,
                    "GPU_GET_ID_INFO_V2 for the GPU");
    if (rc) goto fail;
    nc->dev_instance = id.deviceInstance;

    nv0080_alloc_t dp;
    memset(&dp, 0, sizeof dp);
    dp.deviceId = nc->dev_instance;
    dp.hClientShare = nc->hClient;
    memset(&a, 0, sizeof a);
    a.hRoot = nc->hClient;
    a.hObjectParent = nc->hClient;
    a.hObjectNew = H_DEVICE;
    a.hClass = NV01_DEVICE_0;
    a.pAllocParms = (uint64_t)(uintptr_t)&dp;
    a.paramsSize = sizeof dp;
    rc = nv_call(nc->ctl, NV_ESC_RM_ALLOC, "RM_ALLOC", &a, sizeof a, &a.status,
                 "allocating the RM device object (class NV01_DEVICE_0)");
    if (rc) goto fail;
    nc->hDevice = H_DEVICE;
    pthread_mutex_init(&nc->hlock, NULL);
    gp_log(2, "nvrm: device %d = %s (PCI %04x:%02x:%02x.%x, gpu_id 0x%x, instance %u), "
           "driver %s%s", device, nc->devpath, dom, bus, slot, fn, nc->gpu_id,
           nc->dev_instance, nc->version, nc->known_driver ? "" : " (forced)");
    return 0;
fail:
    gp_err_prefix(rc, "nvrm on CUDA device %d", device);
    session_close(nc);
    return rc;
}

/* ---- backend hooks: probe / open / close ------------------------------ */

static int nvrm_probe(int device, char *why, size_t whylen)
{
    int rc = arch_gate();
    if (rc) {
        if (why && whylen) snprintf(why, whylen, "%s", gdrpy_last_error());
        return rc;
    }
    rc = gp_cuda_load(why, whylen);
    if (rc) return rc;
    rc = gp_cuda_check_device(device);
    if (!rc) {
        struct nvrm_ctx nc;
        rc = session_open(device, &nc);
        if (!rc) {
            session_close(&nc);
            pthread_mutex_destroy(&nc.hlock);
        }
    }
    if (rc && why && whylen) snprintf(why, whylen, "%s", gdrpy_last_error());
    return rc;
}

static int nvrm_open(gp_ctx *ctx)
{
    int rc = arch_gate();
    if (rc) return rc;
    rc = gp_cuda_load(NULL, 0);
    if (rc) return rc;
    struct nvrm_ctx *nc = calloc(1, sizeof *nc);
    if (!nc) return gp_err(GDRPY_ENOMEM, "nvrm open: out of memory");
    rc = session_open(ctx->device, nc);
    if (rc) {
        free(nc);
        return rc;
    }
    gp_cuda_device_info(ctx->device, ctx->info.gpu_name, sizeof ctx->info.gpu_name,
                        ctx->info.pci_bus_id, sizeof ctx->info.pci_bus_id);
    snprintf(ctx->info.driver_version, sizeof ctx->info.driver_version, "%.*s",
             (int)sizeof ctx->info.driver_version - 1, nc->version);
    gp_cuda_hold(ctx->device);
    ctx->bpriv = nc;
    return 0;
}

static void nvrm_close(gp_ctx *ctx)
{
    struct nvrm_ctx *nc = ctx->bpriv;
    if (!nc) return;
    session_close(nc);
    pthread_mutex_destroy(&nc->hlock);
    gp_cuda_unhold(ctx->device);
    free(nc);
    ctx->bpriv = NULL;
}

/* ---- CPU mappings of an RM memory object ------------------------------ */

static int map_range(struct nvrm_ctx *nc, uint32_t hMem, uint64_t off, uint64_t len,
                     struct nvrm_map *m)
{
    m->devfd = -1;
    m->mm = NULL;
    int rc = open_node(nc->devpath, &m->devfd);
    if (rc) return rc;
    nv_os33_fd_t a;
    memset(&a, 0, sizeof a);
    a.hClient = nc->hClient;
    a.hDevice = nc->hDevice;
    a.hMemory = hMem;
    a.offset = off;
    a.length = len;
    a.flags = 0;
    a.fd = m->devfd;
    char what[96];
    snprintf(what, sizeof what, "mapping 0x%llx bytes at offset 0x%llx of RM memory 0x%x",
             (unsigned long long)len, (unsigned long long)off, hMem);
    rc = nv_call(nc->ctl, NV_ESC_RM_MAP_MEMORY, "RM_MAP_MEMORY", &a, sizeof a, &a.status, what);
    if (rc) {
        close(m->devfd);
        m->devfd = -1;
        return rc;
    }
    m->plinear = a.pLinearAddress;
    m->flags = a.flags;
    /* The driver aligns the mapping to its own (the kernel's) page size:
     * 4 KiB on x86-64, often 64 KiB on arm64. */
    const uint64_t hp = (uint64_t)host_page();
    m->mm_len = gp_round_up((off & (hp - 1)) + len, hp);
    void *p = mmap(NULL, m->mm_len, PROT_READ | PROT_WRITE, MAP_SHARED, m->devfd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        nv_os34_t u = {nc->hClient, nc->hDevice, hMem, 0, m->plinear, 0, 0};
        nv_call(nc->ctl, NV_ESC_RM_UNMAP_MEMORY, "RM_UNMAP_MEMORY", &u, sizeof u, &u.status,
                "undoing a failed mapping");
        close(m->devfd);
        m->devfd = -1;
        return gp_err(e == ENOMEM ? GDRPY_ENOMEM : GDRPY_EIO,
                      "%s: mmap of %zu bytes on %s failed: errno %d (%s)", what, m->mm_len,
                      nc->devpath, e, strerror(e));
    }
    if (madvise(p, m->mm_len, MADV_DONTFORK) != 0) {
        int e = errno;
        munmap(p, m->mm_len);
        nv_os34_t u = {nc->hClient, nc->hDevice, hMem, 0, m->plinear, 0, 0};
        nv_call(nc->ctl, NV_ESC_RM_UNMAP_MEMORY, "RM_UNMAP_MEMORY", &u, sizeof u, &u.status,
                "undoing a failed mapping");
        close(m->devfd);
        m->devfd = -1;
        return gp_err(GDRPY_EIO, "%s: madvise(MADV_DONTFORK) failed: errno %d (%s); a "
                      "mapping a forked child could inherit is refused", what, e, strerror(e));
    }
    /* The VMA holds its own reference to the device file, so the fd is not
     * needed any more.  Closing it now means no descriptor of this process
     * can be passed to another process (SCM_RIGHTS) and mmap'ed there to
     * reach this memory, and a mapping costs no fd. */
    close(m->devfd);
    m->devfd = -1;
    m->mm = p;
    live_add(&nc->n_map, 1);
    return 0;
}

static int unmap_range(struct nvrm_ctx *nc, uint32_t hMem, struct nvrm_map *m)
{
    if (!m->mm) return 0;
    int rc = 0;
    if (munmap(m->mm, m->mm_len) != 0)
        rc = gp_err(GDRPY_EIO, "munmap of the BAR1 mapping failed: %s", strerror(errno));
    m->mm = NULL;
    nv_os34_t u = {nc->hClient, nc->hDevice, hMem, 0, m->plinear, 0, 0};
    int rc2 = nv_call(nc->ctl, NV_ESC_RM_UNMAP_MEMORY, "RM_UNMAP_MEMORY", &u, sizeof u,
                      &u.status, "unmapping RM memory");
    live_add(&nc->n_map, -1);
    return rc ? rc : rc2;
}

static int map_type_of(uint32_t flags)
{
    switch (NVOS33_CACHING_TYPE(flags)) {
    case 0: /* cached */
    case 5: /* write-back */
        return GDRPY_MAPPING_CACHING;
    case 1: /* uncached */
    case 7: /* uncached weak */
        return GDRPY_MAPPING_DEVICE;
    default: /* 2: write-combined (what the driver picks for video memory) */
        return GDRPY_MAPPING_WC;
    }
}

/* ---- route A: VMM memory, export fd -> import ------------------------- */

static int import_vmm(gp_ctx *ctx, struct nvrm_ctx *nc, uint64_t addr, const gp_cuda_ptr *cp,
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
    int rc;
    nv0000_export_info_t ei;
    memset(&ei, 0, sizeof ei);
    ei.fd = fd;
    rc = rm_control(nc, NV0000_CTRL_CMD_OS_UNIX_GET_EXPORT_OBJECT_INFO, &ei, sizeof ei,
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
        im->objects[0] = new_handle(nc);
        im->numObjects = 1;
        im->index = 0;
        nv_os54_t a;
        memset(&a, 0, sizeof a);
        a.hClient = nc->hClient;
        a.hObject = nc->hClient;
        a.cmd = NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD;
        a.params = (uint64_t)(uintptr_t)im;
        a.paramsSize = sizeof *im;
        rc = nv_call(nc->ctl, NV_ESC_RM_CONTROL, "RM_CONTROL", &a, sizeof a, &a.status,
                     "OS_UNIX_IMPORT_OBJECTS_FROM_FD");
        uint32_t hh = im->objects[0];
        uint8_t type = im->objectTypes[0];
        free(im);
        if (rc && a.status == NV_ERR_INSERT_DUPLICATE_NAME) continue;   /* handle taken */
        if (rc) goto out;
        if (type != NV_IMPORT_OBJECT_TYPE_VIDMEM) {
            rm_free(nc->ctl, nc->hClient, nc->hDevice, hh, "freeing a non-vidmem import");
            rc = gp_err(GDRPY_ENOTSUP, "the allocation at 0x%llx imported as object type %u, "
                        "not video memory (1)", (unsigned long long)addr, type);
            goto out;
        }
        *hOut = hh;
        live_add(&nc->n_mem, 1);
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

static int dup_legacy(gp_ctx *ctx, struct nvrm_ctx *nc, const gp_cuda_ptr *cp,
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
        ((cp->base ^ off) & (uint64_t)(host_page() - 1)) != 0) {
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
        a.hObject = new_handle(nc);
        a.hClientSrc = hcli;
        a.hObjectSrc = hobj;
        a.flags = 0;
        char what[128];
        snprintf(what, sizeof what, "duplicating CUDA's RM memory 0x%x (client 0x%x) of "
                 "the allocation at 0x%llx", hobj, hcli, (unsigned long long)cp->base);
        rc = nv_call(nc->ctl, NV_ESC_RM_DUP_OBJECT, "RM_DUP_OBJECT", &a, sizeof a, &a.status,
                     what);
        if (rc && a.status == NV_ERR_INSERT_DUPLICATE_NAME) continue;
        if (rc) {
            if (a.status != NV_OK)
                gp_err_prefix(nv_status_code(a.status),
                              "CUDA device %d: the IPC handle words do not name an RM "
                              "object this client can duplicate", ctx->device);
            return rc;
        }
        *hOut = a.hObject;
        *objoff = off;
        live_add(&nc->n_mem, 1);
        return 0;
    }
    return rc;
}

/* Reads [a, a+n) of a mapping with aligned 8-byte loads (BAR1 reads cost
 * ~1 us each, so never byte by byte).  `m` maps the page-aligned window
 * starting at bus address offset `wbase` of the pin's address space. */
static void read_mapped(const volatile uint8_t *win, uint64_t wbase, uint64_t a, size_t n,
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

static int dtoh(gp_ctx *ctx, void *dst, uint64_t src, size_t n)
{
    return gp_cuda_memcpy(ctx->device, 1, src, dst, n, NULL);
}

static int htod_sync(gp_ctx *ctx, uint64_t dst, const void *src, size_t n)
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
static int verify_identity(gp_ctx *ctx, struct nvrm_ctx *nc, gp_pin *p, struct nvrm_pin *np,
                           const gp_cuda_ptr *cp)
{
    const uint64_t hp = (uint64_t)host_page();
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
        int rc = map_range(nc, np->hMemory, np->rm_off + (win[i] - p->va), hp, &m);
        if (rc) return gp_err_prefix(rc, "identity check of the pin");
        /* Up to 3 tries: GPU work still writing the range could make one
         * comparison differ; a wrong mapping differs every time. */
        int same = 0;
        for (int attempt = 0; attempt < 3 && !same; attempt++) {
            rc = dtoh(ctx, via_cuda, s, n);
            if (rc) break;
            read_mapped((const volatile uint8_t *)m.mm, win[i], s, n, via_bar);
            same = memcmp(via_cuda, via_bar, n) == 0;
        }
        unmap_range(nc, np->hMemory, &m);
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
    if (total >= 32 && distinct >= 8) {
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
    int rc = dtoh(ctx, save, t, n);
    if (rc) return gp_err_prefix(rc, "identity check of the pin");
    for (size_t k = 0; k < n; k++) pat[k] = (uint8_t)~save[k];
    struct nvrm_map m;
    rc = map_range(nc, np->hMemory, np->rm_off + (w0 - p->va), hp, &m);
    if (rc) return gp_err_prefix(rc, "identity check of the pin");
    int wrc = htod_sync(ctx, t, pat, n);
    int match = 0;
    if (!wrc) {
        read_mapped((const volatile uint8_t *)m.mm, w0, t, n, got);
        match = memcmp(got, pat, n) == 0;
    }
    /* Restore, whatever happened above. */
    int rrc = htod_sync(ctx, t, save, n);
    if (!rrc && match) {
        read_mapped((const volatile uint8_t *)m.mm, w0, t, n, got);
        match = memcmp(got, save, n) == 0;
    }
    unmap_range(nc, np->hMemory, &m);
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

/* ---- backend hooks: pin / unpin --------------------------------------- */

static int nvrm_pin(gp_ctx *ctx, gp_pin *p)
{
    struct nvrm_ctx *nc = ctx->bpriv;
    gp_cuda_scope sc;
    int rc = gp_cuda_enter(ctx->device, &sc);
    if (rc) return rc;
    gp_cuda_ptr cp;
    rc = gp_cuda_classify(p->addr, p->size, ctx->device, &cp);
    if (rc) goto out;

    /* The pinned range: the 64 KiB GPU pages around the request, clamped to
     * the allocation rounded out to host pages (a pin never maps more of its
     * neighbours than the host page that it shares with them). */
    const uint64_t hp = (uint64_t)host_page();
    uint64_t a_lo = gp_round_down(cp.base, hp);
    uint64_t a_hi = gp_round_up(cp.base + cp.size, hp);
    uint64_t va = gp_round_down(p->addr, GDRPY_GPU_PAGE_SIZE);
    uint64_t hi = gp_round_up(p->addr + p->size, GDRPY_GPU_PAGE_SIZE);
    if (va < a_lo) va = a_lo;
    if (hi > a_hi) hi = a_hi;

    struct nvrm_pin *np = calloc(1, sizeof *np);
    if (!np) { rc = gp_err(GDRPY_ENOMEM, "out of memory"); goto out; }
    np->map.devfd = -1;
    if (cp.kind == GP_CUMEM_VMM) {
        np->route = 'A';
        rc = import_vmm(ctx, nc, p->addr, &cp, &np->hMemory);
        if (rc) { free(np); goto out; }
        /* cuMemMap maps a handle from its offset 0 at the mapping base. */
        if (va < cp.base) va = cp.base;   /* never before the handle's first byte */
        np->rm_off = va - cp.base;
    } else {
        np->route = 'C';
        uint64_t objoff = 0;
        rc = dup_legacy(ctx, nc, &cp, &np->hMemory, &objoff);
        if (rc) { free(np); goto out; }
        /* stay inside the RM object */
        if (va < cp.base && cp.base - va > objoff) va = cp.base - objoff;
        np->rm_off = objoff + va - cp.base;
    }
    p->va = va;
    p->len = hi - va;
    p->page_size = (uint32_t)GDRPY_GPU_PAGE_SIZE;
    if (np->route == 'C') {
        rc = verify_identity(ctx, nc, p, np, &cp);
        if (rc) {
            rm_free(nc->ctl, nc->hClient, nc->hDevice, np->hMemory, "freeing a refused dup");
            live_add(&nc->n_mem, -1);
            free(np);
            goto out;
        }
    }
    p->bpriv = np;
    gp_log(1, "nvrm: pinned 0x%llx+%llu as [0x%llx, +0x%llx) route %c, RM memory 0x%x "
           "offset 0x%llx", (unsigned long long)p->addr, (unsigned long long)p->size,
           (unsigned long long)p->va, (unsigned long long)p->len, np->route, np->hMemory,
           (unsigned long long)np->rm_off);
out:
    gp_cuda_leave(&sc);
    return rc;
}

static int nvrm_unpin(gp_ctx *ctx, gp_pin *p)
{
    struct nvrm_ctx *nc = ctx->bpriv;
    struct nvrm_pin *np = p->bpriv;
    if (!np) return 0;
    int rc = 0;
    if (np->map.mm) {   /* the core unmaps first; be safe anyway */
        rc = unmap_range(nc, np->hMemory, &np->map);
        p->map_base = NULL;
        p->map_len = 0;
    }
    int rc2 = rm_free(nc->ctl, nc->hClient, nc->hDevice, np->hMemory,
                      "releasing the pinned RM memory");
    live_add(&nc->n_mem, -1);
    free(np);
    p->bpriv = NULL;
    return rc ? rc : rc2;
}

/* ---- backend hooks: map / unmap --------------------------------------- */

static int nvrm_map(gp_ctx *ctx, gp_pin *p)
{
    struct nvrm_ctx *nc = ctx->bpriv;
    struct nvrm_pin *np = p->bpriv;
    if (!np) return gp_err(GDRPY_EINVAL, "map: pin has no RM memory (bug)");
    if (np->map.mm) return gp_err(GDRPY_EAGAIN, "map: already mapped");
    int rc = map_range(nc, np->hMemory, np->rm_off, p->len, &np->map);
    if (rc) return rc;
    const uint64_t pgmask = (uint64_t)host_page() - 1;
    p->map_base = (uint8_t *)np->map.mm + (np->rm_off & pgmask);
    p->map_len = np->map.mm_len - (np->rm_off & pgmask);
    p->mapping_type = map_type_of(np->map.flags);
    return 0;
}

static int nvrm_unmap(gp_ctx *ctx, gp_pin *p)
{
    struct nvrm_ctx *nc = ctx->bpriv;
    struct nvrm_pin *np = p->bpriv;
    if (!np || !np->map.mm) return gp_err(GDRPY_EINVAL, "unmap: not mapped");
    int rc = unmap_range(nc, np->hMemory, &np->map);
    p->map_base = NULL;
    p->map_len = 0;
    p->mapping_type = GDRPY_MAPPING_NONE;
    return rc;
}

static int nvrm_get_invalidated(gp_ctx *ctx, gp_pin *p, int *flag)
{
    /* Persistent semantics: the RM handle keeps the pages alive. */
    *flag = 0;
    return 0;
}

/* RM memory handles + CPU mappings + their /dev/nvidiaN fds (the context's
 * own client, device object and /dev/nvidiactl fd are not counted). */
static uint64_t nvrm_live_objects(gp_ctx *ctx)
{
    struct nvrm_ctx *nc = ctx->bpriv;
    if (!nc) return 0;
    return __atomic_load_n(&nc->n_mem, __ATOMIC_RELAXED) +
           2 * __atomic_load_n(&nc->n_map, __ATOMIC_RELAXED);
}

static int nvrm_dev_memcpy(gp_ctx *ctx, int dir, uint64_t dptr, void *host, size_t n,
                           void *stream)
{
    return gp_cuda_memcpy(ctx->device, dir, dptr, host, n, stream);
}

const struct gp_backend gp_backend_nvrm = {
    .name = "nvrm",
    .id = GDRPY_BACKEND_NVRM,
    .is_real = 1,
    .probe = nvrm_probe,
    .open = nvrm_open,
    .close = nvrm_close,
    .pin = nvrm_pin,
    .unpin = nvrm_unpin,
    .map = nvrm_map,
    .unmap = nvrm_unmap,
    .get_invalidated = nvrm_get_invalidated,
    .dev_memcpy = nvrm_dev_memcpy,
    .live_objects = nvrm_live_objects,
};
