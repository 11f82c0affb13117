/*
 * backend_dmabuf.c - CPU mappings of GPU memory through a dma-buf:
 * cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD) at pin
 * time, mmap() of that fd at map time.
 *
 * Whether the driver allows mmap of such a dma-buf cannot be learnt without
 * an allocation, so probe() checks only what it can without one (libcuda,
 * the device, its dma-buf attribute, the entry point); a driver that refuses
 * the mmap (the open 580 driver on GPUs with their own framebuffer: errno
 * 524, ENOTSUPP) is reported by map() with ENOTSUP and the reason.
 *
 * Thread safety: the core holds ctx->lock around unpin/map/unmap; pins run
 * without it, and keep to their own gp_pin (counters are atomic).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cudadrv.h"
#include "internal.h"

#define LINUX_ENOTSUPP 524 /* kernel-internal "not supported", leaks to user space */

struct dmabuf_ctx {
    uint64_t n_fd, n_map; /* live dma-buf fds and mappings (atomic) */
};

struct dmabuf_pin {
    int fd; /* the dma-buf */
    void *mm;
    size_t mm_len;
};

static long host_page(void)
{
    long v = sysconf(_SC_PAGESIZE);
    return v > 0 ? v : 4096;
}

static int dmabuf_check(int device)
{
    int rc = gp_cuda_load(NULL, 0);
    if (rc) return rc;
    rc = gp_cuda_check_device(device);
    if (rc) return rc;
    if (!gp_cu.MemGetHandleForAddressRange)
        return gp_err(GDRPY_ENOTSUP, "libcuda has no cuMemGetHandleForAddressRange: the "
                                     "CUDA driver is too old for dma-buf export (CUDA 11.7+ needed)");
    CUdevice d;
    CUresult r = gp_cu.DeviceGet(&d, device);
    if (r) return gp_cuda_err(0, r, "cuDeviceGet", "looking up CUDA device %d", device);
    int v = 0;
    r = gp_cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, d);
    if (r)
        return gp_cuda_err(GDRPY_ENOTSUP, r, "cuDeviceGetAttribute",
                           "querying dma-buf support of CUDA device %d", device);
    if (!v)
        return gp_err(GDRPY_ENOTSUP, "CUDA device %d does not support dma-buf export "
                                     "(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0; needs the open kernel "
                                     "module and a recent kernel)",
                      device);
    return 0;
}

/* Whether the driver lets the CPU mmap a dma-buf of this GPU's memory.
 * Export support says little: the H100 with driver 580.x exports and then
 * refuses the mmap with errno 524.  Only a trial tells, so the probe exports
 * and maps one page of a small scratch allocation, once per device (the
 * verdict is cached for the process). */
#define DMABUF_TRIAL_DEVICES 64
static pthread_mutex_t trial_lock = PTHREAD_MUTEX_INITIALIZER;
static int trial_verdict[DMABUF_TRIAL_DEVICES]; /* 0 unknown, 1 maps, 2 refused */
static char trial_why[DMABUF_TRIAL_DEVICES][256];

static int dmabuf_trial_map(int device)
{
    if (device < 0 || device >= DMABUF_TRIAL_DEVICES || !gp_cu.MemAlloc || !gp_cu.MemFree)
        return 0; /* cannot try: pin/map will report what happens */
    pthread_mutex_lock(&trial_lock);
    int v = trial_verdict[device];
    if (v == 0) {
        gp_cuda_scope sc;
        int rc = gp_cuda_enter(device, &sc);
        if (rc) {
            pthread_mutex_unlock(&trial_lock);
            return rc;
        }
        const size_t n = 2u << 20;
        CUdeviceptr d = 0;
        int fd = -1;
        CUresult r = gp_cu.MemAlloc(&d, n);
        if (r == CUDA_SUCCESS)
            r = gp_cu.MemGetHandleForAddressRange(&fd, d, n, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        if (r != CUDA_SUCCESS) {
            v = 2;
            snprintf(trial_why[device], sizeof trial_why[device],
                     "a trial dma-buf export of device %d failed: %s", device,
                     gp_cuda_errname(r));
        } else {
            void *m = mmap(NULL, (size_t)host_page(), PROT_READ, MAP_SHARED, fd, 0);
            if (m == MAP_FAILED) {
                int e = errno;
                v = 2;
                snprintf(trial_why[device], sizeof trial_why[device],
                         "dma-buf mmap refused by the driver (errno %d%s): this NVIDIA driver "
                         "does not let the CPU map dma-bufs of device %d's memory; use the "
                         "nvrm or gdrdrv backend",
                         e, e == LINUX_ENOTSUPP ? ", ENOTSUPP" : "",
                         device);
            } else {
                munmap(m, (size_t)host_page());
                v = 1;
            }
        }
        if (fd >= 0) close(fd);
        if (d) gp_cu.MemFree(d);
        gp_cuda_leave(&sc);
        trial_verdict[device] = v;
    }
    pthread_mutex_unlock(&trial_lock);
    return v == 2 ? gp_err(GDRPY_ENOTSUP, "%s", trial_why[device]) : 0;
}

static int dmabuf_probe(int device, char *why, size_t whylen)
{
    int rc = dmabuf_check(device);
    if (!rc) rc = dmabuf_trial_map(device);
    if (rc && why && whylen) snprintf(why, whylen, "%s", gdrpy_last_error());
    return rc;
}

static int dmabuf_open(gp_ctx *ctx)
{
    int rc = dmabuf_check(ctx->device);
    if (rc) return rc;
    gp_cuda_device_info(ctx->device, ctx->info.gpu_name, sizeof ctx->info.gpu_name,
                        ctx->info.pci_bus_id, sizeof ctx->info.pci_bus_id);
    int v = 0;
    if (gp_cuda_driver_version(&v) == 0)
        snprintf(ctx->info.driver_version, sizeof ctx->info.driver_version, "CUDA %d.%d",
                 v / 1000, (v % 1000) / 10);
    struct dmabuf_ctx *dc = calloc(1, sizeof *dc);
    if (!dc) return gp_err(GDRPY_ENOMEM, "dmabuf open: out of memory");
    gp_cuda_hold(ctx->device);
    ctx->bpriv = dc;
    return 0;
}

static void dmabuf_close(gp_ctx *ctx)
{
    gp_cuda_unhold(ctx->device);
    free(ctx->bpriv);
    ctx->bpriv = NULL;
}

static int dmabuf_pin(gp_ctx *ctx, gp_pin *p)
{
    gp_cuda_scope sc;
    int rc = gp_cuda_enter(ctx->device, &sc);
    if (rc) return rc;
    gp_cuda_ptr cp;
    rc = gp_cuda_classify(p->addr, p->size, ctx->device, &cp);
    if (rc) goto out;
    /* 64 KiB GPU pages around the request, clamped to the allocation
     * rounded out to host pages (the export needs host-page alignment). */
    const uint64_t hp = (uint64_t)host_page();
    uint64_t va = gp_round_down(p->addr, GDRPY_GPU_PAGE_SIZE);
    uint64_t hi = gp_round_up(p->addr + p->size, GDRPY_GPU_PAGE_SIZE);
    if (va < gp_round_down(cp.base, hp)) va = gp_round_down(cp.base, hp);
    if (hi > gp_round_up(cp.base + cp.size, hp)) hi = gp_round_up(cp.base + cp.size, hp);
    int fd = -1;
    unsigned long long flags =
        (p->flags & GDRPY_PIN_FORCE_PCIE) ? CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE : 0;
    CUresult r = gp_cu.MemGetHandleForAddressRange(&fd, va, (size_t)(hi - va),
                                                   CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, flags);
    if (r) {
        rc = gp_cuda_err(0, r, "cuMemGetHandleForAddressRange",
                         "exporting [0x%llx, +0x%llx) as a dma-buf%s",
                         (unsigned long long)va, (unsigned long long)(hi - va),
                         flags ? " (FORCE_PCIE)" : "");
        goto out;
    }
    struct dmabuf_pin *dp = calloc(1, sizeof *dp);
    if (!dp) {
        close(fd);
        rc = gp_err(GDRPY_ENOMEM, "out of memory");
        goto out;
    }
    dp->fd = fd;
    __atomic_add_fetch(&((struct dmabuf_ctx *)ctx->bpriv)->n_fd, 1, __ATOMIC_RELAXED);
    p->va = va;
    p->len = hi - va;
    p->page_size = (uint32_t)GDRPY_GPU_PAGE_SIZE;
    p->bpriv = dp;
out:
    gp_cuda_leave(&sc);
    return rc;
}

static int dmabuf_unpin(gp_ctx *ctx, gp_pin *p)
{
    struct dmabuf_ctx *dc = ctx->bpriv;
    struct dmabuf_pin *dp = p->bpriv;
    if (!dp) return 0;
    if (dp->mm) {
        munmap(dp->mm, dp->mm_len);
        __atomic_sub_fetch(&dc->n_map, 1, __ATOMIC_RELAXED);
    }
    close(dp->fd);
    __atomic_sub_fetch(&dc->n_fd, 1, __ATOMIC_RELAXED);
    free(dp);
    p->bpriv = NULL;
    return 0;
}

static int dmabuf_map(gp_ctx *ctx, gp_pin *p)
{
    struct dmabuf_pin *dp = p->bpriv;
    if (!dp) return gp_err(GDRPY_EINVAL, "map: pin has no dma-buf (bug)");
    if (dp->mm) return gp_err(GDRPY_EAGAIN, "map: already mapped");
    size_t len = (size_t)gp_round_up(p->len, (uint64_t)host_page());
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, dp->fd, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        if (e == LINUX_ENOTSUPP || e == ENOTSUP || e == ENODEV)
            return gp_err(GDRPY_ENOTSUP, "dma-buf mmap refused by the driver (errno %d%s): "
                                         "this NVIDIA driver does not let the CPU map dma-bufs of this GPU's "
                                         "memory (the open driver allows it only on GPUs without their own "
                                         "framebuffer, or with newer CUDA drivers); use the nvrm or gdrdrv "
                                         "backend",
                          e, e == LINUX_ENOTSUPP ? ", ENOTSUPP" : "");
        return gp_err(e == ENOMEM ? GDRPY_ENOMEM : GDRPY_EIO,
                      "mmap of the dma-buf (%zu bytes) failed: errno %d (%s)", len, e,
                      strerror(e));
    }
    if (madvise(m, len, MADV_DONTFORK) != 0) {
        int e = errno;
        munmap(m, len);
        return gp_err(GDRPY_EIO, "madvise(MADV_DONTFORK) on the dma-buf mapping failed: "
                                 "errno %d (%s)",
                      e, strerror(e));
    }
    dp->mm = m;
    dp->mm_len = len;
    __atomic_add_fetch(&((struct dmabuf_ctx *)ctx->bpriv)->n_map, 1, __ATOMIC_RELAXED);
    p->map_base = m;
    p->map_len = len;
    p->mapping_type = GDRPY_MAPPING_WC;
    return 0;
}

static int dmabuf_unmap(gp_ctx *ctx, gp_pin *p)
{
    struct dmabuf_pin *dp = p->bpriv;
    if (!dp || !dp->mm) return gp_err(GDRPY_EINVAL, "unmap: not mapped");
    int rc = 0;
    if (munmap(dp->mm, dp->mm_len) != 0)
        rc = gp_err(GDRPY_EIO, "munmap of the dma-buf mapping failed: %s", strerror(errno));
    dp->mm = NULL;
    __atomic_sub_fetch(&((struct dmabuf_ctx *)ctx->bpriv)->n_map, 1, __ATOMIC_RELAXED);
    p->map_base = NULL;
    p->map_len = 0;
    p->mapping_type = GDRPY_MAPPING_NONE;
    return rc;
}

static int dmabuf_get_invalidated(gp_ctx *ctx, gp_pin *p, int *flag)
{
    *flag = 0; /* the dma-buf holds the memory until it is closed */
    return 0;
}

/* dma-buf fds + mappings held by this context. */
static uint64_t dmabuf_live_objects(gp_ctx *ctx)
{
    struct dmabuf_ctx *dc = ctx->bpriv;
    if (!dc) return 0;
    return __atomic_load_n(&dc->n_fd, __ATOMIC_RELAXED) +
           __atomic_load_n(&dc->n_map, __ATOMIC_RELAXED);
}

static int dmabuf_dev_memcpy(gp_ctx *ctx, int dir, uint64_t dptr, void *host, size_t n,
                             void *stream)
{
    return gp_cuda_memcpy(ctx->device, dir, dptr, host, n, stream);
}

const struct gp_backend gp_backend_dmabuf = {
    .name = "dmabuf",
    .id = GDRPY_BACKEND_DMABUF,
    .is_real = 1,
    .probe = dmabuf_probe,
    .open = dmabuf_open,
    .close = dmabuf_close,
    .pin = dmabuf_pin,
    .unpin = dmabuf_unpin,
    .map = dmabuf_map,
    .unmap = dmabuf_unmap,
    .get_invalidated = dmabuf_get_invalidated,
    .dev_memcpy = dmabuf_dev_memcpy,
    .live_objects = dmabuf_live_objects,
};
