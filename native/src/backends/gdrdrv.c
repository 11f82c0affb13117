/*
 * gdrdrv.c - BAR1 mappings through NVIDIA's gdrdrv kernel module (GDRCopy
 * 2.x), /dev/gdrdrv.  The ioctls are gdrdrv's: type byte 0xDA; PIN_BUFFER 1
 * (40 bytes), UNPIN_BUFFER 2, GET_CB_FLAG 3, GET_INFO 4, GET_INFO_V2 5,
 * GET_ATTR 6, PIN_BUFFER_V2 7 (32 bytes), GET_VERSION 255; the argument
 * layouts are the structs below.  The request numbers are computed from
 * those structs and checked at compile time against the values the module
 * answers to (0xC028DA01 ... 0xC008DAFF, below; the ones declared with a
 * pointer type encode size 8).  A pin is mmap'ed at file offset
 * handle << PAGE_SHIFT.
 *
 * Pins are rounded out to 64 KiB GPU pages here (gdrdrv would round them the
 * same way internally, but then refuses to mmap a pin whose address had an
 * offset inside its first GPU page): the pin is therefore always mappable.
 *
 * Thread safety: the core holds ctx->lock around unpin/map/unmap; pins run
 * without it and keep to their own gp_pin (counters are atomic); the kernel
 * module locks its own state.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cudadrv.h"
#include "internal.h"

#define GDRDRV_PATH "/dev/gdrdrv"
#define GDRDRV_IOCTL_TYPE 0xDA

/* ---- argument layouts ------------------------------------------------- */
struct gdrdrv_pin_v1 { /* PIN_BUFFER */
    uint64_t addr, size, p2p_token;
    uint32_t va_space, pad;
    uint64_t handle; /* out */
};
struct gdrdrv_pin_v2 { /* PIN_BUFFER_V2 */
    uint64_t addr, size;
    uint32_t flags, pad;
    uint64_t handle; /* out */
};
struct gdrdrv_unpin {
    uint64_t handle;
};
struct gdrdrv_cb_flag {
    uint64_t handle;
    uint32_t flag, pad; /* out */
};
struct gdrdrv_info { /* GET_INFO (v1) and GET_INFO_V2 */
    uint64_t handle;
    uint64_t va, mapped_size;
    uint32_t page_size, tsc_khz;
    uint64_t tm_cycles;
    uint32_t mapped;
    uint32_t wc_or_type; /* v1: wc_mapping; v2: mapping_type */
};
struct gdrdrv_attr {
    uint32_t attr, val;
};
struct gdrdrv_version {
    uint32_t gdrdrv_version, minimum_gdr_api_version;
};

_Static_assert(sizeof(struct gdrdrv_pin_v1) == 40, "PIN_BUFFER size");
_Static_assert(offsetof(struct gdrdrv_pin_v1, handle) == 32, "PIN_BUFFER.handle");
_Static_assert(sizeof(struct gdrdrv_pin_v2) == 32, "PIN_BUFFER_V2 size");
_Static_assert(offsetof(struct gdrdrv_pin_v2, handle) == 24, "PIN_BUFFER_V2.handle");
_Static_assert(sizeof(struct gdrdrv_unpin) == 8, "UNPIN size");
_Static_assert(sizeof(struct gdrdrv_cb_flag) == 16, "GET_CB_FLAG size");
_Static_assert(sizeof(struct gdrdrv_info) == 48, "GET_INFO size");
_Static_assert(offsetof(struct gdrdrv_info, page_size) == 24, "GET_INFO.page_size");
_Static_assert(offsetof(struct gdrdrv_info, tm_cycles) == 32, "GET_INFO.tm_cycles");
_Static_assert(offsetof(struct gdrdrv_info, mapped) == 40, "GET_INFO.mapped");
_Static_assert(sizeof(struct gdrdrv_attr) == 8, "GET_ATTR size");
_Static_assert(sizeof(struct gdrdrv_version) == 8, "GET_VERSION size");

/* Several numbers were declared in gdrdrv.h with a pointer type, so their
 * encoded size is sizeof(void *) = 8 whatever the struct is. */
#define GDRDRV_IOC_PIN_BUFFER _IOWR(GDRDRV_IOCTL_TYPE, 1, struct gdrdrv_pin_v1)
#define GDRDRV_IOC_UNPIN_BUFFER _IOWR(GDRDRV_IOCTL_TYPE, 2, void *)
#define GDRDRV_IOC_GET_CB_FLAG _IOWR(GDRDRV_IOCTL_TYPE, 3, void *)
#define GDRDRV_IOC_GET_INFO _IOWR(GDRDRV_IOCTL_TYPE, 4, void *)
#define GDRDRV_IOC_GET_INFO_V2 _IOWR(GDRDRV_IOCTL_TYPE, 5, void *)
#define GDRDRV_IOC_GET_ATTR _IOWR(GDRDRV_IOCTL_TYPE, 6, void *)
#define GDRDRV_IOC_PIN_BUFFER_V2 _IOWR(GDRDRV_IOCTL_TYPE, 7, struct gdrdrv_pin_v2)
#define GDRDRV_IOC_GET_VERSION _IOWR(GDRDRV_IOCTL_TYPE, 255, void *)

_Static_assert(GDRDRV_IOC_PIN_BUFFER == 0xC028DA01u, "PIN_BUFFER request");
_Static_assert(GDRDRV_IOC_UNPIN_BUFFER == 0xC008DA02u, "UNPIN_BUFFER request");
_Static_assert(GDRDRV_IOC_GET_CB_FLAG == 0xC008DA03u, "GET_CB_FLAG request");
_Static_assert(GDRDRV_IOC_GET_INFO == 0xC008DA04u, "GET_INFO request");
_Static_assert(GDRDRV_IOC_GET_INFO_V2 == 0xC008DA05u, "GET_INFO_V2 request");
_Static_assert(GDRDRV_IOC_GET_ATTR == 0xC008DA06u, "GET_ATTR request");
_Static_assert(GDRDRV_IOC_PIN_BUFFER_V2 == 0xC020DA07u, "PIN_BUFFER_V2 request");
_Static_assert(GDRDRV_IOC_GET_VERSION == 0xC008DAFFu, "GET_VERSION request");

#define GDR_VER(maj, min) (((uint32_t)(maj) << 16) | (uint32_t)(min))
#define GDR_API_VERSION GDR_VER(2, 6) /* the API we provide */
#define GDRDRV_MIN_VERSION GDR_VER(2, 0)
#define GDRDRV_VER_INFO_V2 GDR_VER(2, 4)
#define GDRDRV_VER_PIN_V2 GDR_VER(2, 5)

struct gdrdrv_ctx {
    int fd;
    uint32_t version;
    uint64_t n_pin, n_map; /* live objects (atomic), for leak checks */
};

struct gdrdrv_pin {
    uint64_t handle;
    void *mm;
    size_t mm_len;
};

static long host_page(void)
{
    long v = sysconf(_SC_PAGESIZE);
    return v > 0 ? v : 4096;
}

static int page_shift(void)
{
    long pg = host_page();
    int s = 0;
    while ((1L << s) < pg) s++;
    return s;
}

static int xioctl(int fd, unsigned long req, void *arg)
{
    int r;
    do {
        r = ioctl(fd, req, arg);
    } while (r < 0 && errno == EINTR);
    return r < 0 ? errno : 0;
}

static int errno_code(int e)
{
    switch (e) {
    case ENOMEM: return GDRPY_ENOMEM;
    case EINVAL: return GDRPY_EINVAL;
    case EACCES:
    case EPERM: return GDRPY_EACCES;
    case EBUSY: return GDRPY_EBUSY;
    case ENODEV: return GDRPY_ENODEV;
    case ENOTSUP: return GDRPY_ENOTSUP;
    default: return GDRPY_EIO;
    }
}

static int open_gdrdrv(int *fd, uint32_t *version)
{
    *fd = open(GDRDRV_PATH, O_RDWR | O_CLOEXEC);
    if (*fd < 0) {
        int e = errno;
        if (e == ENOENT || e == ENXIO || e == ENODEV)
            return gp_err(GDRPY_ENXIO, GDRDRV_PATH " not present: the gdrdrv kernel module "
                                                   "(GDRCopy) is not loaded on this host");
        if (e == EACCES || e == EPERM)
            return gp_err(GDRPY_EACCES, "cannot open " GDRDRV_PATH ": %s", strerror(e));
        return gp_err(GDRPY_EIO, "cannot open " GDRDRV_PATH ": errno %d (%s)", e, strerror(e));
    }
    struct gdrdrv_version v = {0, 0};
    int e = xioctl(*fd, GDRDRV_IOC_GET_VERSION, &v);
    if (e) {
        close(*fd);
        *fd = -1;
        return gp_err(GDRPY_ENOTSUP, "gdrdrv GET_VERSION failed (errno %d, %s): the module is "
                                     "older than 2.0 and not supported",
                      e, strerror(e));
    }
    if (v.gdrdrv_version < GDRDRV_MIN_VERSION || v.minimum_gdr_api_version > GDR_API_VERSION) {
        close(*fd);
        *fd = -1;
        return gp_err(GDRPY_ENOTSUP, "gdrdrv %u.%u (needs API >= %u.%u) is not compatible with "
                                     "API %u.%u",
                      v.gdrdrv_version >> 16, v.gdrdrv_version & 0xffff,
                      v.minimum_gdr_api_version >> 16, v.minimum_gdr_api_version & 0xffff,
                      GDR_API_VERSION >> 16, GDR_API_VERSION & 0xffff);
    }
    *version = v.gdrdrv_version;
    return 0;
}

static int gdrdrv_probe(int device, char *why, size_t whylen)
{
    int fd = -1;
    uint32_t ver = 0;
    int rc = open_gdrdrv(&fd, &ver);
    if (!rc) {
        close(fd);
        rc = gp_cuda_load(NULL, 0);
        if (!rc) rc = gp_cuda_check_device(device);
    }
    if (rc && why && whylen) snprintf(why, whylen, "%s", gdrpy_last_error());
    return rc;
}

static int gdrdrv_open(gp_ctx *ctx)
{
    int rc = gp_cuda_load(NULL, 0);
    if (rc) return rc;
    rc = gp_cuda_check_device(ctx->device);
    if (rc) return rc;
    struct gdrdrv_ctx *g = calloc(1, sizeof *g);
    if (!g) return gp_err(GDRPY_ENOMEM, "gdrdrv open: out of memory");
    rc = open_gdrdrv(&g->fd, &g->version);
    if (rc) {
        free(g);
        return rc;
    }
    gp_cuda_device_info(ctx->device, ctx->info.gpu_name, sizeof ctx->info.gpu_name,
                        ctx->info.pci_bus_id, sizeof ctx->info.pci_bus_id);
    snprintf(ctx->info.driver_version, sizeof ctx->info.driver_version, "gdrdrv %u.%u",
             g->version >> 16, g->version & 0xffff);
    gp_cuda_hold(ctx->device);
    ctx->bpriv = g;
    return 0;
}

static void gdrdrv_close(gp_ctx *ctx)
{
    struct gdrdrv_ctx *g = ctx->bpriv;
    if (!g) return;
    close(g->fd); /* the module unpins whatever this fd still holds */
    gp_cuda_unhold(ctx->device);
    free(g);
    ctx->bpriv = NULL;
}

static int get_info(struct gdrdrv_ctx *g, uint64_t handle, struct gdrdrv_info *info, int *type)
{
    memset(info, 0, sizeof *info);
    info->handle = handle;
    int v2 = g->version >= GDRDRV_VER_INFO_V2;
    int e = xioctl(g->fd, v2 ? GDRDRV_IOC_GET_INFO_V2 : GDRDRV_IOC_GET_INFO, info);
    if (e)
        return gp_err(errno_code(e), "gdrdrv %s of handle 0x%llx failed: errno %d (%s)",
                      v2 ? "GET_INFO_V2" : "GET_INFO", (unsigned long long)handle, e,
                      strerror(e));
    if (type) {
        if (!info->mapped)
            *type = GDRPY_MAPPING_NONE;
        else if (v2)
            *type = info->wc_or_type <= GDRPY_MAPPING_DEVICE ? (int)info->wc_or_type
                                                             : GDRPY_MAPPING_WC;
        else
            *type = info->wc_or_type ? GDRPY_MAPPING_WC : GDRPY_MAPPING_CACHING;
    }
    return 0;
}

static int gdrdrv_pin(gp_ctx *ctx, gp_pin *p)
{
    struct gdrdrv_ctx *g = ctx->bpriv;
    gp_cuda_ptr cp;
    int rc = gp_cuda_classify(p->addr, p->size, ctx->device, &cp);
    if (rc) return rc;
    uint64_t va = gp_round_down(p->addr, GDRPY_GPU_PAGE_SIZE);
    uint64_t len = gp_round_up(p->addr + p->size, GDRPY_GPU_PAGE_SIZE) - va;
    uint64_t handle = 0;
    int e;
    const char *which;
    if (g->version >= GDRDRV_VER_PIN_V2) {
        struct gdrdrv_pin_v2 a;
        memset(&a, 0, sizeof a);
        a.addr = va;
        a.size = len;
        a.flags = (p->flags & GDRPY_PIN_FORCE_PCIE) ? 1u : 0u;
        which = "PIN_BUFFER_V2";
        e = xioctl(g->fd, GDRDRV_IOC_PIN_BUFFER_V2, &a);
        handle = a.handle;
    } else {
        if (p->flags & GDRPY_PIN_FORCE_PCIE)
            return gp_err(GDRPY_ENOTSUP, "pin flag FORCE_PCIE needs gdrdrv >= 2.5 (this is "
                                         "%u.%u)",
                          g->version >> 16, g->version & 0xffff);
        struct gdrdrv_pin_v1 a;
        memset(&a, 0, sizeof a);
        a.addr = va;
        a.size = len;
        which = "PIN_BUFFER";
        e = xioctl(g->fd, GDRDRV_IOC_PIN_BUFFER, &a);
        handle = a.handle;
    }
    if (e)
        return gp_err(errno_code(e), "gdrdrv %s of [0x%llx, +0x%llx) failed: errno %d (%s)",
                      which, (unsigned long long)va, (unsigned long long)len, e, strerror(e));
    struct gdrdrv_info info;
    rc = get_info(g, handle, &info, NULL);
    if (!rc && (info.va > p->addr || info.va + info.mapped_size < p->addr + p->size ||
                (info.va & (uint64_t)(host_page() - 1)) ||
                (info.mapped_size & (uint64_t)(host_page() - 1))))
        rc = gp_err(GDRPY_EIO, "gdrdrv pinned [0x%llx, +0x%llx), which does not cover "
                               "0x%llx+%llu",
                    (unsigned long long)info.va,
                    (unsigned long long)info.mapped_size, (unsigned long long)p->addr,
                    (unsigned long long)p->size);
    struct gdrdrv_pin *gp = rc ? NULL : calloc(1, sizeof *gp);
    if (!rc && !gp) rc = gp_err(GDRPY_ENOMEM, "out of memory");
    if (rc) {
        struct gdrdrv_unpin u = {handle};
        xioctl(g->fd, GDRDRV_IOC_UNPIN_BUFFER, &u);
        return rc;
    }
    gp->handle = handle;
    __atomic_add_fetch(&g->n_pin, 1, __ATOMIC_RELAXED);
    p->va = info.va;
    p->len = info.mapped_size;
    p->page_size = info.page_size ? info.page_size : (uint32_t)GDRPY_GPU_PAGE_SIZE;
    p->bpriv = gp;
    return 0;
}

static int gdrdrv_unpin(gp_ctx *ctx, gp_pin *p)
{
    struct gdrdrv_ctx *g = ctx->bpriv;
    struct gdrdrv_pin *gp = p->bpriv;
    if (!gp) return 0;
    if (gp->mm) {
        munmap(gp->mm, gp->mm_len);
        gp->mm = NULL;
        __atomic_sub_fetch(&g->n_map, 1, __ATOMIC_RELAXED);
    }
    struct gdrdrv_unpin u = {gp->handle};
    int e = xioctl(g->fd, GDRDRV_IOC_UNPIN_BUFFER, &u);
    __atomic_sub_fetch(&g->n_pin, 1, __ATOMIC_RELAXED);
    free(gp);
    p->bpriv = NULL;
    if (e)
        return gp_err(errno_code(e), "gdrdrv UNPIN_BUFFER failed: errno %d (%s)", e,
                      strerror(e));
    return 0;
}

static int gdrdrv_map(gp_ctx *ctx, gp_pin *p)
{
    struct gdrdrv_ctx *g = ctx->bpriv;
    struct gdrdrv_pin *gp = p->bpriv;
    if (!gp) return gp_err(GDRPY_EINVAL, "map: pin has no gdrdrv handle (bug)");
    if (gp->mm) return gp_err(GDRPY_EAGAIN, "map: already mapped");
    size_t len = gp_round_up(p->len, (uint64_t)host_page());
    int sh = page_shift();
    if (gp->handle > ((uint64_t)INT64_MAX >> sh))
        return gp_err(GDRPY_EIO, "gdrdrv handle 0x%llx too large for an mmap offset",
                      (unsigned long long)gp->handle);
    off_t off = (off_t)(gp->handle << sh);
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd, off);
    if (m == MAP_FAILED) {
        int e = errno;
        return gp_err(errno_code(e), "mmap of gdrdrv handle 0x%llx (%zu bytes) failed: "
                                     "errno %d (%s)",
                      (unsigned long long)gp->handle, len, e, strerror(e));
    }
    madvise(m, len, MADV_DONTFORK); /* gdrdrv sets VM_DONTCOPY itself too */
    gp->mm = m;
    gp->mm_len = len;
    __atomic_add_fetch(&g->n_map, 1, __ATOMIC_RELAXED);
    int type = GDRPY_MAPPING_WC;
    struct gdrdrv_info info;
    if (get_info(g, gp->handle, &info, &type) == 0 && type == GDRPY_MAPPING_NONE)
        type = GDRPY_MAPPING_WC;
    p->map_base = m;
    p->map_len = len;
    p->mapping_type = type;
    return 0;
}

static int gdrdrv_unmap(gp_ctx *ctx, gp_pin *p)
{
    struct gdrdrv_ctx *g = ctx->bpriv;
    struct gdrdrv_pin *gp = p->bpriv;
    if (!gp || !gp->mm) return gp_err(GDRPY_EINVAL, "unmap: not mapped");
    int rc = 0;
    if (munmap(gp->mm, gp->mm_len) != 0)
        rc = gp_err(GDRPY_EIO, "munmap of the gdrdrv mapping failed: %s", strerror(errno));
    gp->mm = NULL;
    __atomic_sub_fetch(&g->n_map, 1, __ATOMIC_RELAXED);
    p->map_base = NULL;
    p->map_len = 0;
    p->mapping_type = GDRPY_MAPPING_NONE;
    return rc;
}

/* gdrdrv pins + mappings held by this context. */
static uint64_t gdrdrv_live_objects(gp_ctx *ctx)
{
    struct gdrdrv_ctx *g = ctx->bpriv;
    if (!g) return 0;
    return __atomic_load_n(&g->n_pin, __ATOMIC_RELAXED) +
           __atomic_load_n(&g->n_map, __ATOMIC_RELAXED);
}

static int gdrdrv_get_invalidated(gp_ctx *ctx, gp_pin *p, int *flag)
{
    struct gdrdrv_ctx *g = ctx->bpriv;
    struct gdrdrv_pin *gp = p->bpriv;
    *flag = 0;
    if (!gp) return 0;
    struct gdrdrv_cb_flag a;
    memset(&a, 0, sizeof a);
    a.handle = gp->handle;
    int e = xioctl(g->fd, GDRDRV_IOC_GET_CB_FLAG, &a);
    if (e)
        return gp_err(errno_code(e), "gdrdrv GET_CB_FLAG failed: errno %d (%s)", e,
                      strerror(e));
    *flag = a.flag ? 1 : 0;
    return 0;
}

static int gdrdrv_dev_memcpy(gp_ctx *ctx, int dir, uint64_t dptr, void *host, size_t n,
                             void *stream)
{
    return gp_cuda_memcpy(ctx->device, dir, dptr, host, n, stream);
}

const struct gp_backend gp_backend_gdrdrv = {
    .name = "gdrdrv",
    .id = GDRPY_BACKEND_GDRDRV,
    .is_real = 1,
    .probe = gdrdrv_probe,
    .open = gdrdrv_open,
    .close = gdrdrv_close,
    .pin = gdrdrv_pin,
    .unpin = gdrdrv_unpin,
    .map = gdrdrv_map,
    .unmap = gdrdrv_unmap,
    .get_invalidated = gdrdrv_get_invalidated,
    .dev_memcpy = gdrdrv_dev_memcpy,
    .live_objects = gdrdrv_live_objects,
};
