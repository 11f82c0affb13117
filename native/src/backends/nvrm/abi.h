/*
 * abi.h - our own definitions of the NVIDIA RM ioctl interface the nvrm
 * backend uses: escape numbers, argument layouts, classes, controls and
 * their parameter layouts (x86-64).  Values follow the driver's public
 * headers (facts/nvrm-bar1.md); the structs are written here, not copied.
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

/* ---- ioctl argument layouts (x86-64) ---------------------------------- */
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

#endif /* GDRPY_NVRM_ABI_H */
