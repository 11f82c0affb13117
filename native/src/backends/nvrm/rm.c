/*
 * rm.c - nvrm backend: the RM primitives.  ioctl wrappers, RM status names,
 * handle allocation; RM objects in our client (duplicated from CUDA's client,
 * imported from an export fd, freed; their class, size and physical
 * address); the per-context session (ctl fd, driver version, GPU match,
 * client, device) and CPU mappings of RM memory objects.
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
#include "nvrm.h"

/* ---- NV status names (values from the driver's nvstatuscodes.h) ------- */
static const struct {
    uint32_t code;
    const char *name;
} status_names[] = {
    {0x0, "NV_OK"},
    {0xffff, "NV_ERR_GENERIC"},
    {0x1, "NV_ERR_BROKEN_FB"},
    {0x2, "NV_ERR_BUFFER_TOO_SMALL"},
    {0x3, "NV_ERR_BUSY_RETRY"},
    {0x4, "NV_ERR_CALLBACK_NOT_SCHEDULED"},
    {0x5, "NV_ERR_CARD_NOT_PRESENT"},
    {0x6, "NV_ERR_CYCLE_DETECTED"},
    {0x7, "NV_ERR_DMA_IN_USE"},
    {0x8, "NV_ERR_DMA_MEM_NOT_LOCKED"},
    {0x9, "NV_ERR_DMA_MEM_NOT_UNLOCKED"},
    {0xa, "NV_ERR_DUAL_LINK_INUSE"},
    {0xb, "NV_ERR_ECC_ERROR"},
    {0xc, "NV_ERR_FIFO_BAD_ACCESS"},
    {0xd, "NV_ERR_FREQ_NOT_SUPPORTED"},
    {0xe, "NV_ERR_GPU_DMA_NOT_INITIALIZED"},
    {0xf, "NV_ERR_GPU_IS_LOST"},
    {0x10, "NV_ERR_GPU_IN_FULLCHIP_RESET"},
    {0x11, "NV_ERR_GPU_NOT_FULL_POWER"},
    {0x12, "NV_ERR_GPU_UUID_NOT_FOUND"},
    {0x13, "NV_ERR_HOT_SWITCH"},
    {0x14, "NV_ERR_I2C_ERROR"},
    {0x15, "NV_ERR_I2C_SPEED_TOO_HIGH"},
    {0x16, "NV_ERR_ILLEGAL_ACTION"},
    {0x17, "NV_ERR_IN_USE"},
    {0x18, "NV_ERR_INFLATE_COMPRESSED_DATA_FAILED"},
    {0x19, "NV_ERR_INSERT_DUPLICATE_NAME"},
    {0x1a, "NV_ERR_INSUFFICIENT_RESOURCES"},
    {0x1b, "NV_ERR_INSUFFICIENT_PERMISSIONS"},
    {0x1c, "NV_ERR_INSUFFICIENT_POWER"},
    {0x1d, "NV_ERR_INVALID_ACCESS_TYPE"},
    {0x1e, "NV_ERR_INVALID_ADDRESS"},
    {0x1f, "NV_ERR_INVALID_ARGUMENT"},
    {0x20, "NV_ERR_INVALID_BASE"},
    {0x21, "NV_ERR_INVALID_CHANNEL"},
    {0x22, "NV_ERR_INVALID_CLASS"},
    {0x23, "NV_ERR_INVALID_CLIENT"},
    {0x24, "NV_ERR_INVALID_COMMAND"},
    {0x25, "NV_ERR_INVALID_DATA"},
    {0x26, "NV_ERR_INVALID_DEVICE"},
    {0x27, "NV_ERR_INVALID_DMA_SPECIFIER"},
    {0x28, "NV_ERR_INVALID_EVENT"},
    {0x29, "NV_ERR_INVALID_FLAGS"},
    {0x2a, "NV_ERR_INVALID_FUNCTION"},
    {0x2b, "NV_ERR_INVALID_HEAP"},
    {0x2c, "NV_ERR_INVALID_INDEX"},
    {0x2d, "NV_ERR_INVALID_IRQ_LEVEL"},
    {0x2e, "NV_ERR_INVALID_LIMIT"},
    {0x2f, "NV_ERR_INVALID_LOCK_STATE"},
    {0x30, "NV_ERR_INVALID_METHOD"},
    {0x31, "NV_ERR_INVALID_OBJECT"},
    {0x32, "NV_ERR_INVALID_OBJECT_BUFFER"},
    {0x33, "NV_ERR_INVALID_OBJECT_HANDLE"},
    {0x34, "NV_ERR_INVALID_OBJECT_NEW"},
    {0x35, "NV_ERR_INVALID_OBJECT_OLD"},
    {0x36, "NV_ERR_INVALID_OBJECT_PARENT"},
    {0x37, "NV_ERR_INVALID_OFFSET"},
    {0x38, "NV_ERR_INVALID_OPERATION"},
    {0x39, "NV_ERR_INVALID_OWNER"},
    {0x3a, "NV_ERR_INVALID_PARAM_STRUCT"},
    {0x3b, "NV_ERR_INVALID_PARAMETER"},
    {0x3c, "NV_ERR_INVALID_PATH"},
    {0x3d, "NV_ERR_INVALID_POINTER"},
    {0x3e, "NV_ERR_INVALID_REGISTRY_KEY"},
    {0x3f, "NV_ERR_INVALID_REQUEST"},
    {0x40, "NV_ERR_INVALID_STATE"},
    {0x41, "NV_ERR_INVALID_STRING_LENGTH"},
    {0x42, "NV_ERR_INVALID_READ"},
    {0x43, "NV_ERR_INVALID_WRITE"},
    {0x44, "NV_ERR_INVALID_XLATE"},
    {0x45, "NV_ERR_IRQ_NOT_FIRING"},
    {0x46, "NV_ERR_IRQ_EDGE_TRIGGERED"},
    {0x47, "NV_ERR_MEMORY_TRAINING_FAILED"},
    {0x48, "NV_ERR_MISMATCHED_SLAVE"},
    {0x49, "NV_ERR_MISMATCHED_TARGET"},
    {0x4a, "NV_ERR_MISSING_TABLE_ENTRY"},
    {0x4b, "NV_ERR_MODULE_LOAD_FAILED"},
    {0x4c, "NV_ERR_MORE_DATA_AVAILABLE"},
    {0x4d, "NV_ERR_MORE_PROCESSING_REQUIRED"},
    {0x4e, "NV_ERR_MULTIPLE_MEMORY_TYPES"},
    {0x4f, "NV_ERR_NO_FREE_FIFOS"},
    {0x50, "NV_ERR_NO_INTR_PENDING"},
    {0x51, "NV_ERR_NO_MEMORY"},
    {0x52, "NV_ERR_NO_SUCH_DOMAIN"},
    {0x53, "NV_ERR_NO_VALID_PATH"},
    {0x54, "NV_ERR_NOT_COMPATIBLE"},
    {0x55, "NV_ERR_NOT_READY"},
    {0x56, "NV_ERR_NOT_SUPPORTED"},
    {0x57, "NV_ERR_OBJECT_NOT_FOUND"},
    {0x58, "NV_ERR_OBJECT_TYPE_MISMATCH"},
    {0x59, "NV_ERR_OPERATING_SYSTEM"},
    {0x5a, "NV_ERR_OTHER_DEVICE_FOUND"},
    {0x5b, "NV_ERR_OUT_OF_RANGE"},
    {0x5c, "NV_ERR_OVERLAPPING_UVM_COMMIT"},
    {0x5d, "NV_ERR_PAGE_TABLE_NOT_AVAIL"},
    {0x5e, "NV_ERR_PID_NOT_FOUND"},
    {0x5f, "NV_ERR_PROTECTION_FAULT"},
    {0x60, "NV_ERR_RC_ERROR"},
    {0x61, "NV_ERR_REJECTED_VBIOS"},
    {0x62, "NV_ERR_RESET_REQUIRED"},
    {0x63, "NV_ERR_STATE_IN_USE"},
    {0x64, "NV_ERR_SIGNAL_PENDING"},
    {0x65, "NV_ERR_TIMEOUT"},
    {0x66, "NV_ERR_TIMEOUT_RETRY"},
    {0x67, "NV_ERR_TOO_MANY_PRIMARIES"},
    {0x68, "NV_ERR_UVM_ADDRESS_IN_USE"},
    {0x69, "NV_ERR_MAX_SESSION_LIMIT_REACHED"},
    {0x6a, "NV_ERR_LIB_RM_VERSION_MISMATCH"},
    {0x6b, "NV_ERR_PRIV_SEC_VIOLATION"},
    {0x6c, "NV_ERR_GPU_IN_DEBUG_MODE"},
    {0x6d, "NV_ERR_FEATURE_NOT_ENABLED"},
    {0x6e, "NV_ERR_RESOURCE_LOST"},
    {0x6f, "NV_ERR_PMU_NOT_READY"},
    {0x70, "NV_ERR_FLCN_ERROR"},
    {0x71, "NV_ERR_FATAL_ERROR"},
    {0x72, "NV_ERR_MEMORY_ERROR"},
    {0x73, "NV_ERR_INVALID_LICENSE"},
    {0x74, "NV_ERR_NVLINK_INIT_ERROR"},
    {0x75, "NV_ERR_NVLINK_MINION_ERROR"},
    {0x76, "NV_ERR_NVLINK_CLOCK_ERROR"},
    {0x77, "NV_ERR_NVLINK_TRAINING_ERROR"},
    {0x78, "NV_ERR_NVLINK_CONFIGURATION_ERROR"},
    {0x79, "NV_ERR_RISCV_ERROR"},
    {0x7a, "NV_ERR_FABRIC_MANAGER_NOT_PRESENT"},
    {0x7b, "NV_ERR_ALREADY_SIGNALLED"},
    {0x7c, "NV_ERR_QUEUE_TASK_SLOT_NOT_AVAILABLE"},
    {0x7d, "NV_ERR_KEY_ROTATION_IN_PROGRESS"},
    {0x7e, "NV_ERR_TEST_ONLY_CODE_NOT_ENABLED"},
    {0x7f, "NV_ERR_SECURE_BOOT_FAILED"},
    {0x80, "NV_ERR_INSUFFICIENT_ZBC_ENTRY"},
    {0x81, "NV_ERR_NVLINK_FABRIC_NOT_READY"},
    {0x82, "NV_ERR_NVLINK_FABRIC_FAILURE"},
    {0x83, "NV_ERR_GPU_MEMORY_ONLINING_FAILURE"},
    {0x84, "NV_ERR_REDUCTION_MANAGER_NOT_AVAILABLE"},
    {0x85, "NV_ERR_THRESHOLD_CROSSED"},
    {0x86, "NV_ERR_RESOURCE_RETIREMENT_ERROR"},
    {0x87, "NV_ERR_FABRIC_STATE_OUT_OF_SYNC"},
    {0x88, "NV_ERR_BUFFER_FULL"},
    {0x89, "NV_ERR_BUFFER_EMPTY"},
    {0x8a, "NV_ERR_MC_FLA_OFFSET_TABLE_FULL"},
    {0x8b, "NV_ERR_DMA_XFER_FAILED"},
    {0x10001, "NV_WARN_HOT_SWITCH"},
    {0x10002, "NV_WARN_INCORRECT_PERFMON_DATA"},
    {0x10003, "NV_WARN_MISMATCHED_SLAVE"},
    {0x10004, "NV_WARN_MISMATCHED_TARGET"},
    {0x10005, "NV_WARN_MORE_PROCESSING_REQUIRED"},
    {0x10006, "NV_WARN_NOTHING_TO_DO"},
    {0x10007, "NV_WARN_NULL_OBJECT"},
    {0x10008, "NV_WARN_OUT_OF_RANGE"},
    {0x10009, "NV_WARN_THRESHOLD_CROSSED"},
};

const char *nvrm_nv_status_name(uint32_t st)
{
    static __thread char buf[32];
    for (size_t i = 0; i < sizeof status_names / sizeof status_names[0]; i++)
        if (status_names[i].code == st) return status_names[i].name;
    snprintf(buf, sizeof buf, "NV status 0x%x", st);
    return buf;
}

int nvrm_nv_status_code(uint32_t st)
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

long nvrm_host_page(void)
{
    static long pg;
    if (!pg) {
        long v = sysconf(_SC_PAGESIZE);
        pg = v > 0 ? v : 4096;
    }
    return pg;
}

__thread uint32_t nvrm_last_rm_status;
__thread int nvrm_last_errno;

/* ---- ioctl wrappers --------------------------------------------------- */
/* Returns 0 when the ioctl succeeded and *status (if given) is NV_OK;
 * otherwise sets the message "<what>: <escape> ..." and returns a code. */
int nvrm_nv_call(int fd, unsigned nr, const char *esc, void *arg, size_t size,
                 const uint32_t *status, const char *what)
{
    int r;
    do {
        r = ioctl(fd, NV_IOC(nr, size), arg);
    } while (r < 0 && errno == EINTR);
    nvrm_last_errno = r < 0 ? errno : 0;
    nvrm_last_rm_status = status ? *status : 0;
    if (r < 0) {
        int e = errno;
        if (status && *status != NV_OK)
            return gp_err(nvrm_nv_status_code(*status), "%s: %s ioctl failed: errno %d (%s), RM "
                                                        "status %s (0x%x)",
                          what, esc, e, strerror(e),
                          nvrm_nv_status_name(*status), *status);
        return gp_err(e == ENOMEM ? GDRPY_ENOMEM : GDRPY_EIO,
                      "%s: %s ioctl failed: errno %d (%s)", what, esc, e, strerror(e));
    }
    if (status && *status != NV_OK)
        return gp_err(nvrm_nv_status_code(*status), "%s: %s returned RM status %s (0x%x)", what,
                      esc, nvrm_nv_status_name(*status), *status);
    return 0;
}

/* An escape of the session's ABI table; `bufsize` is the size of what `arg`
 * points to, which the table's argument size must not exceed. */
int nvrm_esc_call(struct nvrm_ctx *nc, const struct nvrm_esc *e, const char *esc, void *arg,
                  size_t bufsize, const uint32_t *status, const char *what)
{
    if (e->size > bufsize)
        return gp_err(GDRPY_EIO, "%s: the ABI table %s says %s takes %u bytes, more than our "
                                 "%zu-byte definition: refused",
                      what, nc->abi.branch, esc, e->size,
                      bufsize);
    return nvrm_nv_call(nc->ctl, e->nr, esc, arg, e->size, status, what);
}

int nvrm_rm_free(struct nvrm_ctx *nc, uint32_t hParent, uint32_t h, const char *what)
{
    nv_os00_t a = {nc->hClient, hParent, h, 0};
    return nvrm_esc_call(nc, &nc->abi.rm_free, "RM_FREE", &a, sizeof a, &a.status, what);
}

int nvrm_rm_control(struct nvrm_ctx *nc, uint32_t cmd, void *params, uint32_t size,
                    const char *what)
{
    nv_os54_t a;
    memset(&a, 0, sizeof a);
    a.hClient = nc->hClient;
    a.hObject = nc->hClient;
    a.cmd = cmd;
    a.params = (uint64_t)(uintptr_t)params;
    a.paramsSize = size;
    return nvrm_esc_call(nc, &nc->abi.rm_control, "RM_CONTROL", &a, sizeof a, &a.status, what);
}

uint32_t nvrm_new_handle(struct nvrm_ctx *nc)
{
    pthread_mutex_lock(&nc->hlock);
    uint32_t h = nc->next_handle++;
    if (nc->next_handle > H_MEM_LAST) nc->next_handle = H_MEM_FIRST;
    pthread_mutex_unlock(&nc->hlock);
    return h;
}

/* ---- RM objects in our client: dup, import, free, class, size, physical
 * address -------------------------------------------------------------- */

#define CTRL_GET_HANDLE_INFO 0xd02
#define HANDLE_INFO_CLASSID 2
#define CTRL_GET_SURFACE_INFO 0x410110
#define CTRL_GET_SURFACE_PHYS_ATTR 0x410103 /* privileged: CAP_SYS_ADMIN */
#define SURFACE_INFO_PHYS_SIZE_LO 2
#define SURFACE_INFO_PHYS_SIZE_HI 3

int nvrm_dup(struct nvrm_ctx *nc, uint32_t hcli, uint32_t hobj, uint32_t *hOut, const char *what)
{
    int rc = GDRPY_EIO;
    for (int attempt = 0; attempt < 4; attempt++) {
        nv_os55_t a;
        memset(&a, 0, sizeof a);
        a.hClient = nc->hClient;
        a.hParent = nc->hDevice;
        a.hObject = nvrm_new_handle(nc);
        a.hClientSrc = hcli;
        a.hObjectSrc = hobj;
        a.flags = 0;
        rc = nvrm_esc_call(nc, &nc->abi.rm_dup, "RM_DUP_OBJECT", &a, sizeof a, &a.status, what);
        if (rc && a.status == NV_ERR_INSERT_DUPLICATE_NAME) continue; /* handle taken */
        if (rc) return rc;
        *hOut = a.hObject;
        nvrm_live_add(&nc->n_mem, 1);
        return 0;
    }
    return rc;
}

/* Imports the (single-object) RM export fd `fd` of the memory at `addr`
 * into our client; closes fd. */
int nvrm_import_fd(gp_ctx *ctx, struct nvrm_ctx *nc, uint64_t addr, int fd, uint32_t *hOut)
{
    int rc;
    /* The parameters differ by branch (abi.h): fill the fd, read the two
     * outputs at the table's offsets. */
    union {
        nv0000_export_info_t cur;
        nv0000_export_info_v535_t v535;
    } eu;
    memset(&eu, 0, sizeof eu);
    eu.cur.fd = fd;
    if (nc->abi.size_export_info > sizeof eu) {
        rc = gp_err(GDRPY_EIO, "ABI table %s: GET_EXPORT_OBJECT_INFO size %u exceeds our "
                               "definitions",
                    nc->abi.branch, nc->abi.size_export_info);
        goto out;
    }
    rc = nvrm_rm_control(nc, nc->abi.ctrl_export_info, &eu, nc->abi.size_export_info,
                         "OS_UNIX_GET_EXPORT_OBJECT_INFO on the exported fd");
    if (rc) goto out;
    uint32_t dev_inst;
    uint16_t max_objects;
    memcpy(&dev_inst, (const uint8_t *)&eu + nc->abi.export_off_device_instance, 4);
    memcpy(&max_objects, (const uint8_t *)&eu + nc->abi.export_off_max_objects, 2);
    if (dev_inst != nc->dev_instance) {
        rc = gp_err(GDRPY_ENODEV, "the allocation at 0x%llx lives on RM device instance %u, "
                                  "but this context's GPU (CUDA device %d) is instance %u",
                    (unsigned long long)addr, dev_inst, ctx->device, nc->dev_instance);
        goto out;
    }
    if (max_objects < 1) {
        rc = gp_err(GDRPY_EIO, "the exported fd of 0x%llx holds no objects",
                    (unsigned long long)addr);
        goto out;
    }
    for (int attempt = 0; attempt < 4; attempt++) {
        static nv0000_import_t zero;
        nv0000_import_t *im = malloc(sizeof *im);
        if (!im) {
            rc = gp_err(GDRPY_ENOMEM, "out of memory");
            goto out;
        }
        *im = zero;
        im->fd = fd;
        im->hParent = nc->hDevice;
        im->objects[0] = nvrm_new_handle(nc);
        im->numObjects = 1;
        im->index = 0;
        nv_os54_t a;
        memset(&a, 0, sizeof a);
        a.hClient = nc->hClient;
        a.hObject = nc->hClient;
        a.cmd = nc->abi.ctrl_import_from_fd;
        a.params = (uint64_t)(uintptr_t)im;
        a.paramsSize = nc->abi.size_import_from_fd;
        rc = nvrm_esc_call(nc, &nc->abi.rm_control, "RM_CONTROL", &a, sizeof a, &a.status,
                           "OS_UNIX_IMPORT_OBJECTS_FROM_FD");
        uint32_t hh = im->objects[0];
        uint8_t type = im->objectTypes[0];
        free(im);
        if (rc && a.status == NV_ERR_INSERT_DUPLICATE_NAME) continue; /* handle taken */
        if (rc) goto out;
        if (type != nc->abi.import_type_vidmem) {
            nvrm_rm_free(nc, nc->hDevice, hh, "freeing a non-vidmem import");
            rc = gp_err(GDRPY_ENOTSUP, "the allocation at 0x%llx imported as object type %u, "
                                       "not video memory (1)",
                        (unsigned long long)addr, type);
            goto out;
        }
        *hOut = hh;
        nvrm_live_add(&nc->n_mem, 1);
        rc = 0;
        goto out;
    }
    rc = gp_err(GDRPY_EIO, "no free RM handle for the import after 4 attempts");
out:
    close(fd);
    return rc;
}

void nvrm_free_dups(struct nvrm_ctx *nc, const uint32_t *h, int n, const char *what)
{
    for (int k = 0; k < n; k++) {
        if (!h[k]) continue;
        nvrm_rm_free(nc, nc->hDevice, h[k], what);
        nvrm_live_add(&nc->n_mem, -1);
    }
}

uint32_t nvrm_class_of(struct nvrm_ctx *nc, uint32_t h)
{
    struct {
        uint32_t hObject, index;
        uint64_t result;
    } hi = {h, HANDLE_INFO_CLASSID, 0};
    if (nvrm_rm_control(nc, CTRL_GET_HANDLE_INFO, &hi, sizeof hi, "GET_HANDLE_INFO"))
        return 0;
    return (uint32_t)hi.result;
}

/* RM_CONTROL `cmd` on our object h (its params at p, n bytes). */
static int obj_control(struct nvrm_ctx *nc, uint32_t h, uint32_t cmd, void *p, uint32_t n,
                       const char *what)
{
    nv_os54_t a;
    memset(&a, 0, sizeof a);
    a.hClient = nc->hClient;
    a.hObject = h;
    a.cmd = cmd;
    a.params = (uint64_t)(uintptr_t)p;
    a.paramsSize = n;
    return nvrm_esc_call(nc, &nc->abi.rm_control, "RM_CONTROL", &a, sizeof a, &a.status, what);
}

uint64_t nvrm_obj_size(struct nvrm_ctx *nc, uint32_t h)
{
    struct {
        uint32_t index, data;
    } l[2] = {{SURFACE_INFO_PHYS_SIZE_LO, 0}, {SURFACE_INFO_PHYS_SIZE_HI, 0}};
    struct {
        uint32_t n, pad;
        uint64_t list;
    } prm = {2, 0, (uint64_t)(uintptr_t)l};
    if (obj_control(nc, h, CTRL_GET_SURFACE_INFO, &prm, sizeof prm, "GET_SURFACE_INFO")) return 0;
    return ((uint64_t)l[1].data << 32) | l[0].data;
}

int nvrm_phys_addr(struct nvrm_ctx *nc, uint32_t h, uint64_t off, uint64_t *pa,
                   uint32_t *aperture)
{
    /* NV0041_CTRL_GET_SURFACE_PHYS_ATTR_PARAMS (the same on 535..595) */
    struct {
        uint64_t memOffset;
        uint32_t memFormat, comprOffset, comprFormat, memAperture;
        uint32_t gpuCacheAttr, gpuP2PCacheAttr, mmuContext, pad;
        uint64_t contigSegmentSize;
    } prm;
    /* GDRPY_NVRM_NO_PRIV=1 (tests): as for a caller without CAP_SYS_ADMIN */
    const char *np = getenv("GDRPY_NVRM_NO_PRIV");
    if (np && np[0] == '1')
        return gp_err(GDRPY_EACCES, "GET_SURFACE_PHYS_ATTR: not asked (GDRPY_NVRM_NO_PRIV=1)");
    memset(&prm, 0, sizeof prm);
    prm.memOffset = off;
    int rc = obj_control(nc, h, CTRL_GET_SURFACE_PHYS_ATTR, &prm, sizeof prm,
                         "GET_SURFACE_PHYS_ATTR");
    if (rc) return rc;
    *pa = prm.memOffset;
    *aperture = prm.memAperture;
    return 0;
}

/* ---- session: ctl fd, version gate, GPU match, client, device ---------- */

void nvrm_session_close(struct nvrm_ctx *nc)
{
    if (nc->ctl < 0) return;
    if (nc->hClient) nvrm_rm_free(nc, 0, nc->hClient, "freeing the RM client");
    close(nc->ctl); /* also frees whatever the client still owns */
    nc->ctl = -1;
    nc->hClient = 0;
}

int nvrm_open_node(const char *path, int *fd)
{
    *fd = open(path, O_RDWR | O_CLOEXEC);
    if (*fd >= 0) return 0;
    int e = errno;
    if (e == ENOENT)
        return gp_err(GDRPY_ENXIO, "%s not present: the NVIDIA kernel driver is not loaded "
                                   "(or the device nodes are not visible in this container)",
                      path);
    if (e == EACCES || e == EPERM)
        return gp_err(GDRPY_EACCES, "cannot open %s: %s (device nodes need read-write "
                                    "access for this user)",
                      path, strerror(e));
    return gp_err(GDRPY_EIO, "cannot open %s: errno %d (%s)", path, e, strerror(e));
}

/* The version from /proc/driver/nvidia/version ("... Kernel Module  580.159.04
 * ..." or "... Kernel Module for x86_64  580.159.04 ..."): a fallback when the
 * driver answers the version query with an empty string. */
static void proc_version(char *out, size_t n)
{
    FILE *f = fopen("/proc/driver/nvidia/version", "re");
    if (!f) return;
    char line[256];
    if (fgets(line, sizeof line, f)) {
        char *p = strstr(line, "Kernel Module");
        for (; p && *p; p++) {
            if (*p >= '0' && *p <= '9' && p[-1] == ' ') {
                size_t k = 0;
                while (p[k] && ((p[k] >= '0' && p[k] <= '9') || p[k] == '.')) k++;
                if (k > 2 && memchr(p, '.', k)) {
                    snprintf(out, n, "%.*s", (int)k, p);
                    break;
                }
            }
        }
    }
    fclose(f);
}

int nvrm_session_open(int device, struct nvrm_ctx *nc)
{
    memset(nc, 0, sizeof *nc);
    nc->ctl = -1;
    nc->next_handle = H_MEM_FIRST;
    int rc;

    /* CUDA side: the device and its PCI address. */
    unsigned dom, bus, slot, fn;
    rc = gp_cuda_device_pci(device, &dom, &bus, &slot, &fn);
    if (rc) return rc;

    rc = nvrm_open_node("/dev/nvidiactl", &nc->ctl);
    if (rc) return rc;

    /* Driver version -> ABI table.  CHECK_VERSION_STR (nr 210, 72 bytes) is
     * the same in every table: it is how a table is chosen. */
    nv_version_t ver;
    memset(&ver, 0, sizeof ver);
    ver.cmd = NV_RM_API_VERSION_CMD_QUERY;
    rc = nvrm_nv_call(nc->ctl, NV_ESC_CHECK_VERSION_STR, "CHECK_VERSION_STR", &ver, sizeof ver,
                      NULL, "querying the NVIDIA driver version");
    if (rc) goto fail;
    ver.version[sizeof ver.version - 1] = '\0';
    snprintf(nc->version, sizeof nc->version, "%s", ver.version);
    if (!nc->version[0]) proc_version(nc->version, sizeof nc->version);
    {
        char why[256];
        const struct nvrm_abi *t = nvrm_abi_select(nc->version, getenv("GDRPY_NVRM_FORCE"),
                                                   &nc->abi_newer, why, sizeof why);
        if (!t || nvrm_abi_consistent(t, why, sizeof why) != 0) {
            rc = gp_err(GDRPY_ENOTSUP, "%s", why);
            goto fail;
        }
        nc->abi = *t;
        nvrm_abi_test_corrupt(&nc->abi);
    }
    gp_cuda_driver_version(&nc->cuda_version);

    /* Which RM GPU is the CUDA device? Match by PCI address. */
    enum { NCARDS = 32 };
    nv_card_info_t cards[NCARDS];
    memset(cards, 0, sizeof cards);
    {
        struct nvrm_esc e = {nc->abi.card_info.nr, nc->abi.card_info.size * NCARDS};
        rc = nvrm_esc_call(nc, &e, "CARD_INFO", cards, sizeof cards, NULL, "listing GPUs");
    }
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
                                  "GPUs /dev/nvidiactl lists (%s)",
                    device, dom, bus, slot, fn,
                    seen[0] ? seen : "none");
        goto fail;
    }
    nc->gpu_id = cards[found].gpu_id;
    nc->minor = cards[found].minor_number;
    snprintf(nc->devpath, sizeof nc->devpath, "/dev/nvidia%u", nc->minor);
    {
        int dfd;
        rc = nvrm_open_node(nc->devpath, &dfd);
        if (rc) goto fail;
        close(dfd);
    }

    /* Root client. */
    nv_os21_t a;
    memset(&a, 0, sizeof a);
    a.hClass = nc->abi.cls_root_client;
    rc = nvrm_esc_call(nc, &nc->abi.rm_alloc, "RM_ALLOC", &a, sizeof a, &a.status,
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
    rc = nvrm_rm_control(nc, nc->abi.ctrl_gpu_id_info_v2, &id, nc->abi.size_id_info_v2,
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
    a.hClass = nc->abi.cls_device;
    a.pAllocParms = (uint64_t)(uintptr_t)&dp;
    a.paramsSize = nc->abi.size_device_alloc;
    rc = nvrm_esc_call(nc, &nc->abi.rm_alloc, "RM_ALLOC", &a, sizeof a, &a.status,
                       "allocating the RM device object (class NV01_DEVICE_0)");
    if (rc) goto fail;
    nc->hDevice = H_DEVICE;
    pthread_mutex_init(&nc->hlock, NULL);
    gp_log(2, "nvrm: device %d = %s (PCI %04x:%02x:%02x.%x, gpu_id 0x%x, instance %u), "
              "driver %s, ABI table %s (%s)%s",
           device, nc->devpath, dom, bus, slot, fn,
           nc->gpu_id, nc->dev_instance, nc->version, nc->abi.branch, nc->abi.tag,
           nc->abi_newer ? ", driver newer than every table" : "");
    return 0;
fail:
    gp_err_prefix(rc, "nvrm on CUDA device %d", device);
    nvrm_session_close(nc);
    return rc;
}

/* ---- CPU mappings of an RM memory object ------------------------------ */

int nvrm_map_range(struct nvrm_ctx *nc, uint32_t hMem, uint64_t off, uint64_t len,
                   struct nvrm_map *m)
{
    return nvrm_map_range_at(nc, hMem, off, len, NULL, m);
}

int nvrm_map_range_at(struct nvrm_ctx *nc, uint32_t hMem, uint64_t off, uint64_t len,
                      void *at, struct nvrm_map *m)
{
    m->devfd = -1;
    m->mm = NULL;
    int rc = nvrm_open_node(nc->devpath, &m->devfd);
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
    rc = nvrm_esc_call(nc, &nc->abi.rm_map, "RM_MAP_MEMORY", &a, sizeof a, &a.status, what);
    if (rc) {
        close(m->devfd);
        m->devfd = -1;
        return rc;
    }
    m->plinear = a.pLinearAddress;
    m->flags = a.flags;
    /* The driver aligns the mapping to the kernel's page size (4 KiB on
     * x86-64, often 64 KiB on arm64). */
    const uint64_t hp = (uint64_t)nvrm_host_page();
    m->mm_len = gp_round_up((off & (hp - 1)) + len, hp);
    /* at: an address inside a PROT_NONE reservation of the caller's (pins
     * over several RM objects lay their parts side by side). */
    void *p = mmap(at, m->mm_len, PROT_READ | PROT_WRITE, MAP_SHARED | (at ? MAP_FIXED : 0),
                   m->devfd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        nv_os34_t u = {nc->hClient, nc->hDevice, hMem, 0, m->plinear, 0, 0};
        nvrm_esc_call(nc, &nc->abi.rm_unmap, "RM_UNMAP_MEMORY", &u, sizeof u, &u.status,
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
        nvrm_esc_call(nc, &nc->abi.rm_unmap, "RM_UNMAP_MEMORY", &u, sizeof u, &u.status,
                      "undoing a failed mapping");
        close(m->devfd);
        m->devfd = -1;
        return gp_err(GDRPY_EIO, "%s: madvise(MADV_DONTFORK) failed: errno %d (%s); a "
                                 "mapping a forked child could inherit is refused",
                      what, e, strerror(e));
    }
    /* The VMA holds its own reference to the device file, so the fd is not
     * needed any more.  Closing it now means no descriptor of this process
     * can be passed to another process (SCM_RIGHTS) and mmap'ed there to
     * reach this memory, and a mapping costs no fd. */
    close(m->devfd);
    m->devfd = -1;
    m->mm = p;
    nvrm_live_add(&nc->n_map, 1);
    return 0;
}

int nvrm_unmap_range(struct nvrm_ctx *nc, uint32_t hMem, struct nvrm_map *m)
{
    if (!m->mm) return 0;
    int rc = 0;
    if (munmap(m->mm, m->mm_len) != 0)
        rc = gp_err(GDRPY_EIO, "munmap of the BAR1 mapping failed: %s", strerror(errno));
    m->mm = NULL;
    nv_os34_t u = {nc->hClient, nc->hDevice, hMem, 0, m->plinear, 0, 0};
    int rc2 = nvrm_esc_call(nc, &nc->abi.rm_unmap, "RM_UNMAP_MEMORY", &u, sizeof u,
                            &u.status, "unmapping RM memory");
    nvrm_live_add(&nc->n_map, -1);
    return rc ? rc : rc2;
}

/* Reads [a, a+n) of a mapping with aligned 8-byte loads (BAR1 reads cost
 * ~1 us each, so never byte by byte).  `win` maps the page-aligned window
 * starting at address `wbase`. */
void nvrm_read_mapped(const volatile uint8_t *win, uint64_t wbase, uint64_t a, size_t n,
                      uint8_t *out)
{
    uint64_t lo = gp_round_down(a, 8), hi = gp_round_up(a + n, 8);
    while (lo < hi) {
        uint8_t tmp[256];
        uint64_t chunk_hi = hi - lo > sizeof tmp ? lo + sizeof tmp : hi;
        for (uint64_t x = lo; x < chunk_hi; x += 8) {
            uint64_t v = *(const volatile uint64_t *)(win + (x - wbase));
            memcpy(tmp + (x - lo), &v, 8);
        }
        uint64_t from = a > lo ? a : lo;
        uint64_t to = a + n < chunk_hi ? a + n : chunk_hi;
        memcpy(out + (from - a), tmp + (from - lo), (size_t)(to - from));
        lo = chunk_hi;
    }
}

int nvrm_map_type_of(uint32_t flags)
{
    switch (NVOS33_CACHING_TYPE(flags)) {
    case NVOS33_CT_CACHED:
    case NVOS33_CT_WRITEBACK:
        return GDRPY_MAPPING_CACHING;
    case NVOS33_CT_UNCACHED:
    case NVOS33_CT_UNCACHED_WEAK:
        return GDRPY_MAPPING_DEVICE;
    default: /* 2: write-combined (what the driver picks for video memory) */
        return GDRPY_MAPPING_WC;
    }
}
