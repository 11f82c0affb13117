/*
 * backends/nvrm/backend.c - BAR1 mappings through the NVIDIA driver's own resource
 * manager (RM) interface: /dev/nvidiactl + /dev/nvidiaN, no extra module.
 *
 * The ioctl sequence follows facts/nvrm-bar1.md (measured on driver
 * 580.159.04); what is sent to the driver comes from the ABI table of the
 * running driver's branch (abi.h, table.c), and the first open of a device
 * runs the self-test (selftest.c), which decides which routes are used.
 * docs/nvrm.md describes both.
 *
 * Per context: one /dev/nvidiactl fd, one RM root client, one RM device
 * object (the GPU matched to the CUDA ordinal by PCI address).
 * Per pin: one RM memory handle in our client that keeps the pages alive
 *   route A - cuMemCreate memory: export as POSIX fd, import into our client;
 *   route C - cuMemAlloc memory: RM_DUP_OBJECT of CUDA's own RM handle, found
 *             through the (undocumented) cuIpcGetMemHandle words whose layout
 *             the self-test proved, checked read-only before the pin is
 *             accepted (nothing of the caller's is ever written).
 * Per mapping: one /dev/nvidiaN fd carrying one RM CPU mapping, mmap'ed
 * MAP_SHARED and MADV_DONTFORK.
 *
 * Thread safety: the core holds ctx->lock around pin/unpin/map/unmap; the
 * RM handle counter has its own lock; the self-test state has its own lock
 * and never changes once published; everything else is per object.
 *
 * This file: the gp_backend hooks.  See nvrm.h for the other files.
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

/* ---- backend hooks: probe / open / close ------------------------------ */

static int nvrm_probe(int device, char *why, size_t whylen)
{
    int rc = gp_cuda_load(why, whylen);
    if (rc) return rc;
    rc = gp_cuda_check_device(device);
    if (!rc) {
        struct nvrm_ctx nc;
        rc = nvrm_session_open(device, &nc);
        if (!rc) {
            nvrm_session_close(&nc);
            pthread_mutex_destroy(&nc.hlock);
            /* The self-test runs at the first open; once it has run, its
             * verdict is the probe's. */
            const struct nvrm_dev_state *st = nvrm_selftest_state(device);
            if (st && !st->usable) rc = gp_err(GDRPY_ENOTSUP, "%s", st->reason);
        }
    }
    if (rc && why && whylen) snprintf(why, whylen, "%s", gdrpy_last_error());
    return rc;
}

static int nvrm_open(gp_ctx *ctx)
{
    int rc = gp_cuda_load(NULL, 0);
    if (rc) return rc;
    struct nvrm_ctx *nc = calloc(1, sizeof *nc);
    if (!nc) return gp_err(GDRPY_ENOMEM, "nvrm open: out of memory");
    rc = nvrm_session_open(ctx->device, nc);
    if (rc) {
        free(nc);
        return rc;
    }
    gp_cuda_hold(ctx->device);
    /* First open of the device in this process: prove the routes (cached). */
    gp_cuda_scope sc;
    rc = gp_cuda_enter(ctx->device, &sc);
    if (!rc) {
        rc = nvrm_selftest(ctx->device, nc);
        gp_cuda_leave(&sc);
    }
    if (rc) {
        gp_err_prefix(rc, "nvrm on CUDA device %d", ctx->device);
        gp_cuda_unhold(ctx->device);
        nvrm_session_close(nc);
        pthread_mutex_destroy(&nc->hlock);
        free(nc);
        return rc;
    }
    gp_cuda_device_info(ctx->device, ctx->info.gpu_name, sizeof ctx->info.gpu_name,
                        ctx->info.pci_bus_id, sizeof ctx->info.pci_bus_id);
    snprintf(ctx->info.driver_version, sizeof ctx->info.driver_version, "%.*s",
             (int)sizeof ctx->info.driver_version - 1, nc->version);
    ctx->bpriv = nc;
    return 0;
}

static void nvrm_close(gp_ctx *ctx)
{
    struct nvrm_ctx *nc = ctx->bpriv;
    if (!nc) return;
    nvrm_session_close(nc);
    pthread_mutex_destroy(&nc->hlock);
    gp_cuda_unhold(ctx->device);
    free(nc);
    ctx->bpriv = NULL;
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
    const uint64_t hp = (uint64_t)nvrm_host_page();
    uint64_t a_lo = gp_round_down(cp.base, hp);
    uint64_t a_hi = gp_round_up(cp.base + cp.size, hp);
    uint64_t va = gp_round_down(p->addr, GDRPY_GPU_PAGE_SIZE);
    uint64_t hi = gp_round_up(p->addr + p->size, GDRPY_GPU_PAGE_SIZE);
    if (va < a_lo) va = a_lo;
    if (hi > a_hi) hi = a_hi;

    /* Routes the self-test disabled stay disabled, with its reason. */
    const struct nvrm_route_report *rr =
        cp.kind == GP_CUMEM_VMM ? &nc->st->route_a : &nc->st->route_c;
    if (!rr->ok) {
        rc = gp_err(GDRPY_ENOTSUP, "pinning %s (route %c) is disabled on CUDA device %d: the "
                    "nvrm self-test failed at \"%s\": %s%s", gp_cuda_kind_name(cp.kind),
                    cp.kind == GP_CUMEM_VMM ? 'A' : 'C', ctx->device, rr->step, rr->detail,
                    cp.kind == GP_CUMEM_VMM ? "" : "; allocate with cuMemCreate and "
                    "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (gdrpy.memory does)");
        goto out;
    }

    struct nvrm_pin *np = calloc(1, sizeof *np);
    if (!np) { rc = gp_err(GDRPY_ENOMEM, "out of memory"); goto out; }
    np->map.devfd = -1;
    if (cp.kind == GP_CUMEM_VMM) {
        np->route = 'A';
        rc = nvrm_import_vmm(ctx, nc, p->addr, &cp, &np->hMemory);
        if (rc) { free(np); goto out; }
        /* cuMemMap maps a handle from its offset 0 at the mapping base. */
        if (va < cp.base) va = cp.base;   /* never before the handle's first byte */
        np->rm_off = va - cp.base;
    } else {
        np->route = 'C';
        uint64_t objoff = 0;
        rc = nvrm_dup_legacy(ctx, nc, &cp, &np->hMemory, &objoff);
        if (rc) { free(np); goto out; }
        /* stay inside the RM object */
        if (va < cp.base && cp.base - va > objoff) va = cp.base - objoff;
        np->rm_off = objoff + va - cp.base;
    }
    p->va = va;
    p->len = hi - va;
    p->page_size = (uint32_t)GDRPY_GPU_PAGE_SIZE;
    if (np->route == 'C') {
        rc = nvrm_verify_identity(ctx, nc, np->hMemory, p->va, np->rm_off, p->addr, p->size);
        if (rc) {
            nvrm_rm_free(nc, nc->hDevice, np->hMemory, "freeing a refused dup");
            nvrm_live_add(&nc->n_mem, -1);
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
        rc = nvrm_unmap_range(nc, np->hMemory, &np->map);
        p->map_base = NULL;
        p->map_len = 0;
    }
    int rc2 = nvrm_rm_free(nc, nc->hDevice, np->hMemory,
                      "releasing the pinned RM memory");
    nvrm_live_add(&nc->n_mem, -1);
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
    int rc = nvrm_map_range(nc, np->hMemory, np->rm_off, p->len, &np->map);
    if (rc) return rc;
    p->map_base = (uint8_t *)np->map.mm + (np->rm_off & 4095);
    p->map_len = np->map.mm_len - (np->rm_off & 4095);
    p->mapping_type = nvrm_map_type_of(np->map.flags);
    return 0;
}

static int nvrm_unmap(gp_ctx *ctx, gp_pin *p)
{
    struct nvrm_ctx *nc = ctx->bpriv;
    struct nvrm_pin *np = p->bpriv;
    if (!np || !np->map.mm) return gp_err(GDRPY_EINVAL, "unmap: not mapped");
    int rc = nvrm_unmap_range(nc, np->hMemory, &np->map);
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
