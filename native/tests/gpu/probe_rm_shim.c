/*
 * probe_rm_shim.c - the nvrm backend's internals behind plain C types, for
 * probe_pool_rm.c (which includes cuda.h, whose types clash with the
 * backend's own minimal definitions).  Diagnostic builds only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include "cudadrv.h"
#include "internal.h"
#include "nvrm.h"
#include "probe_rm_shim.h"

static struct nvrm_ctx NC;

int shim_open(int device, char *ver, size_t verlen, uint32_t *cli, uint32_t *devh)
{
    if (gp_cuda_load(NULL, 0)) return -1;
    if (nvrm_session_open(device, &NC)) return -1;
    snprintf(ver, verlen, "%s", NC.version);
    *cli = NC.hClient;
    *devh = NC.hDevice;
    return NC.ctl;
}
const char *shim_err(void) { return gdrpy_last_error(); }
const char *shim_status(uint32_t st) { return nvrm_nv_status_name(st); }

uint32_t shim_ctl(int fd, uint32_t cli, uint32_t obj, uint32_t cmd, void *p, uint32_t sz)
{
    nv_os54_t a;
    memset(&a, 0, sizeof a);
    a.hClient = cli;
    a.hObject = obj;
    a.cmd = cmd;
    a.params = (uint64_t)(uintptr_t)p;
    a.paramsSize = sz;
    int r = ioctl(fd, NV_IOC(NC.abi.rm_control.nr, NC.abi.rm_control.size), &a);
    if (r < 0 && a.status == 0) return 0xffffffffu;
    return a.status;
}

int shim_dup(uint32_t cli, uint32_t obj, uint32_t *h)
{
    return nvrm_dup(&NC, cli, obj, h, "probe dup");
}
int shim_free(uint32_t h) { return nvrm_rm_free(&NC, NC.hDevice, h, "probe free"); }

void *shim_map(uint32_t h, uint64_t off, uint64_t len, void **cookie)
{
    struct nvrm_map *m = calloc(1, sizeof *m);
    if (nvrm_map_range(&NC, h, off, len, m)) {
        free(m);
        return NULL;
    }
    *cookie = m;
    return (uint8_t *)m->mm + (off & 4095);
}
void shim_unmap(uint32_t h, void *cookie)
{
    nvrm_unmap_range(&NC, h, cookie);
    free(cookie);
}

uint32_t shim_export_info(int fd, uint16_t *maxo, uint32_t *devinst, uint8_t meta[64])
{
    nv0000_export_info_t ei;
    memset(&ei, 0, sizeof ei);
    ei.fd = fd;
    uint32_t st = shim_ctl(NC.ctl, NC.hClient, NC.hClient, NC.abi.ctrl_export_info, &ei,
                           NC.abi.size_export_info);
    memcpy(maxo, (uint8_t *)&ei + NC.abi.export_off_max_objects, 2);
    memcpy(devinst, (uint8_t *)&ei + NC.abi.export_off_device_instance, 4);
    memcpy(meta, ei.metadata, 64);
    return st;
}

uint32_t shim_import(int fd, int index, uint32_t *h, uint8_t *type)
{
    nv0000_import_t *im = calloc(1, sizeof *im);
    im->fd = fd;
    im->hParent = NC.hDevice;
    im->objects[0] = nvrm_new_handle(&NC);
    im->numObjects = 1;
    im->index = (uint16_t)index;
    uint32_t st = shim_ctl(NC.ctl, NC.hClient, NC.hClient, NC.abi.ctrl_import_from_fd, im,
                           NC.abi.size_import_from_fd);
    *h = im->objects[0];
    *type = im->objectTypes[0];
    free(im);
    return st;
}

void shim_close(void) { nvrm_session_close(&NC); }
