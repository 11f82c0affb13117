/*
 * abi.h - our own definitions of the NVIDIA RM ioctl interface the nvrm
 * backend uses: escape numbers, argument layouts, classes, controls and
 * their parameter layouts (LP64: x86-64, aarch64).  Values follow the
 * driver's public headers; the structs are written here, not copied.
 *
 * Every item is checked against each production branch's headers by
 * tests/test_nvrm_abi.py (records in abi/<branch>.json, made by
 * scripts/nvrm_abi_extract.py).  Where a branch differs, a variant is
 * defined here (suffix _v<branch>) and struct nvrm_abi (below) says which
 * one the running driver takes; abi_tables.h holds one nvrm_abi per branch.
 */
#ifndef GDRPY_NVRM_ABI_H
#define GDRPY_NVRM_ABI_H

#include <stddef.h>
#include <stdint.h>
#include <sys/ioctl.h>

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
#define NVOS33_CACHING_TYPE_LO 23
#define NVOS33_CACHING_TYPE_HI 25
#define NVOS33_CACHING_TYPE(f) \
    (((f) >> NVOS33_CACHING_TYPE_LO) & ((1u << (NVOS33_CACHING_TYPE_HI - NVOS33_CACHING_TYPE_LO + 1)) - 1))
#define NVOS33_CT_CACHED 0
#define NVOS33_CT_UNCACHED 1
#define NVOS33_CT_WRITECOMBINED 2
#define NVOS33_CT_WRITEBACK 5
#define NVOS33_CT_UNCACHED_WEAK 7

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
/* The layouts of the driver's public headers (NVIDIA/open-gpu-kernel-modules),
 * written here and checked against every branch's records (abi/<branch>.json,
 * tests/test_nvrm_abi.py) and at run time against the branch tables
 * (table.c); first measured on x86-64 with driver 580.159.04.  The driver builds them from NvU32/NvU64/
 * NvHandle and 8-byte aligned NvP64 fields, which the x86-64 SysV and the
 * AArch64 AAPCS64 LP64 ABIs lay out alike: the compile-time checks in table.c
 * hold for whichever target is built, and CI builds x86-64 and aarch64
 * (scripts/ci/90-arm64.sh; docs/arm.md).  (Not here: tests/test_nvrm_abi.py
 * compiles deliberately drifted copies of this file.) */
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

/* The same control's parameters on branch 535 (no gpuInstanceId: 76 bytes). */
typedef struct {
    int32_t fd;
    uint32_t deviceInstance;
    uint16_t maxObjects;
    uint8_t metadata[64];
    uint8_t pad0[2];
} nv0000_export_info_v535_t;

typedef struct {
    int32_t fd;
    uint32_t hParent;
    uint32_t objects[128];
    uint8_t objectTypes[128];
    uint16_t numObjects, index;
} nv0000_import_t;

/* ---- per-branch table ------------------------------------------------- */
/* One escape: its number and the argument size the driver checks exactly. */
struct nvrm_esc {
    uint32_t nr, size;
};

/* Everything the backend passes to the driver that a branch could change.
 * The tables (abi_tables.h) are generated from abi/<branch>.json. */
struct nvrm_abi {
    const char *branch; /* "580" */
    const char *tag;    /* the tag the records came from */
    struct nvrm_esc card_info, check_version, rm_free, rm_control, rm_alloc, rm_dup,
        rm_map, rm_unmap;
    uint32_t version_cmd_query;
    uint32_t cls_root_client, cls_device;
    uint32_t ctrl_gpu_id_info_v2, ctrl_export_info, ctrl_import_from_fd;
    uint32_t size_device_alloc, size_id_info_v2, size_export_info, size_import_from_fd;
    /* OS_UNIX_GET_EXPORT_OBJECT_INFO: where deviceInstance / maxObjects sit
     * (535: 4 / 8, later: 4 / 12 with gpuInstanceId at 8). */
    uint32_t export_off_device_instance, export_off_max_objects;
    uint32_t import_type_vidmem;
    uint32_t caching_lo, caching_hi;
};

#endif /* GDRPY_NVRM_ABI_H */
