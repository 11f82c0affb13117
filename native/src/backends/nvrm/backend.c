/*
 * backends/nvrm/backend.c - BAR1 mappings through the NVIDIA driver's own resource
 * manager (RM) interface: /dev/nvidiactl + /dev/nvidiaN, no extra module.
 *
 * The ioctl sequence (CARD_INFO, an RM root client, the device object, the
 * pin's memory handle, RM_MAP_MEMORY on /dev/nvidiactl with a /dev/nvidiaN
 * fd that is then mmap'ed) was first measured on an H100 with the open
 * kernel module 580.159.04 and CUDA 13.0; what is sent to the driver comes
 * from the ABI table of the running driver's branch (abi.h, table.c), and
 * the first open of a device runs the self-test (selftest.c), which decides
 * which routes are used.  docs/nvrm.md describes both.
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
 * Thread safety: the core holds ctx->lock around unpin/map/unmap; pins run
 * without it (proofs and learning take milliseconds), at the same time as
 * other pins, unpins and maps of the context: the RM handle counter has its
 * own lock, the live-object counts are atomic, the self-test state has its
 * own lock and never changes once published, what learning found has its
 * own lock (route_v.c), so do the backend's kept allocations (desc.c);
 * everything else is per pin.  No CUDA copy is ordered after the caller's
 * work: proofs, learning and the self-test copy on gdrpy's own stream.
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

/* ---- architecture gate ------------------------------------------------ */
/* The backend has run on x86-64 GPU hosts only.  Elsewhere the ioctl layouts
 * are the same (abi.h asserts them), but what the driver does with the
 * mappings is unverified: on arm64 it maps BAR1 Device-nGnRE (kernel-open
 * nv-pgprot.h), kernels often use 64 KiB pages, and Grace systems take the
 * coherent C2C paths of RM_MAP_MEMORY.  Refuse there unless GDRPY_NVRM_FORCE
 * is set (any value), rather than guess (docs/arm.md). */
#if defined(__aarch64__)
#define NVRM_ARCH "aarch64"
#elif defined(__powerpc64__)
#define NVRM_ARCH "ppc64le"
#elif defined(__riscv)
#define NVRM_ARCH "riscv64"
#else
#define NVRM_ARCH "this architecture"
#endif
static int arch_gate(void)
{
#if defined(__x86_64__)
    return 0;
#else
    const char *f = getenv("GDRPY_NVRM_FORCE");
    if (f && *f)
        return 0;
    return gp_err(GDRPY_ENOTSUP, "validated on x86-64 only; on %s the ioctl layouts match at "
                                 "compile time but BAR1 mapping is untested on its hardware "
                                 "(GDRPY_NVRM_FORCE tries it)",
                  NVRM_ARCH);
#endif
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
    int rc = arch_gate();
    if (rc) return rc;
    rc = gp_cuda_load(NULL, 0);
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

/* Frees every RM object of a pin (mappings must be gone) and the pin. */
static int nvrm_pin_release(struct nvrm_ctx *nc, struct nvrm_pin *np)
{
    int rc = nvrm_rm_free(nc, nc->hDevice, np->hMemory, "releasing the pinned RM memory");
    nvrm_live_add(&nc->n_mem, -1);
    for (int i = 0; i < np->nparts; i++) {
        int r2 = nvrm_rm_free(nc, nc->hDevice, np->parts[i].hMemory,
                              "releasing a further chunk of the pin");
        nvrm_live_add(&nc->n_mem, -1);
        if (!rc) rc = r2;
    }
    free(np->parts);
    free(np);
    return rc;
}

/* A pin over several VMM chunks mapped side by side: one part per further
 * cuMemMap mapping, from x (the end of the previous one) to the request's
 * end; each reached by route A (POSIX_FD) or V.  *hi is set to the end of
 * the pinned pages. */
static int pin_parts(gp_ctx *ctx, struct nvrm_ctx *nc, gp_pin *p, struct nvrm_pin *np,
                     uint64_t x, uint64_t full_hi, uint64_t *hi)
{
    const uint64_t end = p->addr + p->size;
    const uint64_t hp = (uint64_t)nvrm_host_page();
    while (x < end) {
        gp_cuda_ptr c;
        int rc = gp_cuda_classify(x, 1, ctx->device, &c);
        if (rc || c.kind != GP_CUMEM_VMM || c.base != x) {
            char why[200];
            snprintf(why, sizeof why, "%s", rc ? gdrpy_last_error() : gp_cuda_kind_name(c.kind));
            return gp_err(GDRPY_EINVAL, "range 0x%llx+%llu runs past the cuMemMap mapping that "
                                        "ends at 0x%llx into memory that is not a further cuMemCreate mapping "
                                        "starting there (%s); pin within [0x%llx, 0x%llx)",
                          (unsigned long long)p->addr, (unsigned long long)p->size,
                          (unsigned long long)x, why, (unsigned long long)p->addr,
                          (unsigned long long)x);
        }
        struct nvrm_part *parts = realloc(np->parts, (size_t)(np->nparts + 1) * sizeof *parts);
        if (!parts) return gp_err(GDRPY_ENOMEM, "out of memory");
        np->parts = parts;
        struct nvrm_part *pt = &parts[np->nparts];
        memset(pt, 0, sizeof *pt);
        pt->map.devfd = -1;
        pt->va = x;
        uint64_t pend = gp_round_up(c.base + c.size, hp);
        pt->len = (full_hi < pend ? full_hi : pend) - x;
        pt->rm_off = 0; /* cuMemMap maps a handle from its offset 0 */
        if (c.handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
            pt->route = 'A';
            rc = nvrm_import_vmm(ctx, nc, x, &c, &pt->hMemory);
        } else {
            pt->route = 'V';
            char how[32];
            gp_pin vp = *p;
            vp.addr = x;
            vp.size = (end < c.base + c.size ? end : c.base + c.size) - x;
            rc = nvrm_route_v(ctx, nc, &vp, x, &c, c.base, x, &pt->hMemory, &pt->rm_off, how,
                              sizeof how);
        }
        if (rc) return gp_err_prefix(rc, "chunk %d of the range (at 0x%llx)", np->nparts + 2,
                                     (unsigned long long)x);
        np->nparts++;
        *hi = pt->va + pt->len;
        x = c.base + c.size;
    }
    return 0;
}

static int nvrm_pin(gp_ctx *ctx, gp_pin *p)
{
    struct nvrm_ctx *nc = ctx->bpriv;
    gp_cuda_scope sc;
    int rc = gp_cuda_enter(ctx->device, &sc);
    if (rc) return rc;
    gp_cuda_ptr cp;
    const uint64_t end = p->addr + p->size;
    /* The anchor: the allocation holding the first byte, or, when the range
     * starts in free space of a chunk (UCX pins whole GPU pages), the first
     * allocation inside the range. */
    uint64_t anchor = p->addr;
    rc = gp_cuda_classify(anchor, 1, ctx->device, &cp);
    if (rc && cp.kind == GP_CUMEM_UNKNOWN) {
        uint64_t a = nvrm_first_alloc(p->addr, end);
        if (a) {
            anchor = a;
            rc = gp_cuda_classify(anchor, 1, ctx->device, &cp);
        } else {
            rc = gp_err(GDRPY_EINVAL, "no CUDA allocation of this process lies in [0x%llx, "
                                      "0x%llx): nothing to pin",
                        (unsigned long long)p->addr,
                        (unsigned long long)end);
        }
    }
    /* routes A, V: the request may run on into further cuMemMap mappings
     * placed right after this one (several chunks in one VA range) */
    /* Pool memory: classify refuses it for every backend; nvrm tries route V. */
    int pool = rc == GDRPY_ENOTSUP && cp.kind == GP_CUMEM_POOL;
    if (pool) rc = nvrm_pool_range(ctx, p, anchor, &cp);
    if (rc) goto out;
    int vmm_fd = cp.kind == GP_CUMEM_VMM &&
                 (cp.handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    char route = pool || cp.kind == GP_CUMEM_VMM ? (vmm_fd ? 'A' : 'V') : 'C';

    /* Routes the self-test disabled stay disabled, with its reason (route V
     * needs RM dup and mapping, which route C's self-test proves). */
    const struct nvrm_route_report *rr = route == 'A' ? &nc->st->route_a : &nc->st->route_c;
    if (!rr->ok) {
        rc = gp_err(GDRPY_ENOTSUP, "pinning %s (route %c) is disabled on CUDA device %d: the "
                                   "nvrm self-test failed at \"%s\": %s%s",
                    gp_cuda_kind_name(cp.kind), route,
                    ctx->device, rr->step, rr->detail,
                    route == 'A' ? "" : "; allocate with cuMemCreate and "
                                        "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (gdrpy.memory does)");
        goto out;
    }

    /* The pinned range: the 64 KiB GPU pages around the request, as GDRCopy
     * pins (routes A, V: clamped to the mapping; route C: they must lie in
     * the chunk behind the allocation, see route_c.c). */
    uint64_t va = gp_round_down(p->addr, GDRPY_GPU_PAGE_SIZE);
    uint64_t hi = gp_round_up(end, GDRPY_GPU_PAGE_SIZE);

    int c_tied = 0; /* route C: the words' offset checked against the mapping base */
    struct nvrm_pin *np = calloc(1, sizeof *np);
    if (!np) {
        rc = gp_err(GDRPY_ENOMEM, "out of memory");
        goto out;
    }
    np->map.devfd = -1;
    np->route = route;
    if (route != 'C') {
        /* cuMemMap maps a handle from its offset 0 at the mapping base. */
        const uint64_t hp = (uint64_t)nvrm_host_page();
        if (va < cp.base) va = cp.base; /* never before the handle's first byte */
        if (hi > gp_round_up(cp.base + cp.size, hp)) hi = gp_round_up(cp.base + cp.size, hp);
        np->rm_off = va - cp.base;
        if (route == 'A') {
            rc = nvrm_import_vmm(ctx, nc, p->addr, &cp, &np->hMemory);
        } else {
            char how[32];
            gp_pin vp = *p;
            rc = nvrm_route_v(ctx, nc, &vp, anchor, &cp, cp.base, va, &np->hMemory,
                              &np->rm_off, how, sizeof how);
            if (!rc) gp_log(1, "nvrm: route V (%s) for %s", how, gp_cuda_kind_name(cp.kind));
        }
        if (rc) {
            free(np);
            goto out;
        }
        np->len0 = hi - va;
        const uint64_t full_hi = gp_round_up(end, GDRPY_GPU_PAGE_SIZE);
        if (end > cp.base + cp.size) {
            rc = pin_parts(ctx, nc, p, np, cp.base + cp.size, full_hi, &hi);
            if (rc) {
                nvrm_pin_release(nc, np);
                goto out;
            }
        }
    } else {
        uint64_t objoff = 0, clo = 0, chi = 0;
        rc = nvrm_dup_legacy(ctx, nc, &cp, &np->hMemory, &objoff, &c_tied);
        if (!rc) {
            /* The GPU pages of the request, clamped to the chunk only where a
             * page straddles its edge (a chunk smaller than a GPU page). */
            uint64_t rlo = p->addr, rhi = end;
            rc = nvrm_chunk_range(ctx, &cp, objoff, &rlo, &rhi, &clo, &chi);
            if (!rc) {
                /* the GPU pages around the request stop where the chunk's
                 * last GPU page does; past the chunk's end they are not
                 * backed (p->backed) */
                if (va < clo) va = clo;
                if (hi > gp_round_up(chi, GDRPY_GPU_PAGE_SIZE))
                    hi = gp_round_up(chi, GDRPY_GPU_PAGE_SIZE);
                rc = nvrm_chunk_range(ctx, &cp, objoff, &va, &hi, &clo, &chi);
                if (!rc && p->addr >= chi)
                    rc = gp_err(GDRPY_EINVAL, "range 0x%llx+%llu starts past the end of the "
                                              "memory behind the allocation at 0x%llx (0x%llx)",
                                (unsigned long long)p->addr, (unsigned long long)p->size,
                                (unsigned long long)cp.base, (unsigned long long)chi);
                if (!rc && hi > chi) p->backed = chi - va;
            }
            if (rc) {
                nvrm_rm_free(nc, nc->hDevice, np->hMemory, "freeing a refused dup");
                nvrm_live_add(&nc->n_mem, -1);
            }
        }
        if (rc) {
            free(np);
            goto out;
        }
        np->rm_off = objoff + va - cp.base; /* va >= chunk base = cp.base - objoff */
    }
    p->va = va;
    p->len = hi - va;
    p->page_size = (uint32_t)GDRPY_GPU_PAGE_SIZE;
    if (np->route == 'C') {
        /* Identity is checked on the anchor allocation's part of the request
         * (free space of the chunk cannot be read through CUDA). */
        uint64_t ilo = p->addr > cp.base ? p->addr : cp.base;
        uint64_t ihi = end < cp.base + cp.size ? end : cp.base + cp.size;
        if (ihi <= ilo) { /* the request starts in free space: the anchor's head */
            ilo = cp.base;
            ihi = cp.base + cp.size < hi ? cp.base + cp.size : hi;
        }
        rc = nvrm_verify_identity(ctx, nc, np->hMemory, p->va, np->rm_off, ilo, ihi - ilo,
                                  c_tied);
        if (rc) {
            nvrm_rm_free(nc, nc->hDevice, np->hMemory, "freeing a refused dup");
            nvrm_live_add(&nc->n_mem, -1);
            free(np);
            goto out;
        }
    }
    p->bpriv = np;
    gp_log(1, "nvrm: pinned 0x%llx+%llu as [0x%llx, +0x%llx) route %c, RM memory 0x%x "
              "offset 0x%llx",
           (unsigned long long)p->addr, (unsigned long long)p->size,
           (unsigned long long)p->va, (unsigned long long)p->len, np->route, np->hMemory,
           (unsigned long long)np->rm_off);
out:
    gp_cuda_leave(&sc);
    return rc;
}

/* With the RM mappings of a pin gone: what is left of its reservation (the
 * no-access tail of a chunk that ends inside a GPU page; parts cover theirs
 * exactly). */
static void resv_release(struct nvrm_pin *np, size_t mapped)
{
    if (np->resv && !np->nparts && np->resv_len > mapped)
        munmap((uint8_t *)np->resv + mapped, np->resv_len - mapped);
    np->resv = NULL;
    np->resv_len = 0;
}

static int nvrm_unpin(gp_ctx *ctx, gp_pin *p)
{
    struct nvrm_ctx *nc = ctx->bpriv;
    struct nvrm_pin *np = p->bpriv;
    if (!np) return 0;
    int rc = 0;
    size_t mapped = np->map.mm_len;
    if (np->map.mm) { /* the core unmaps first; be safe anyway */
        rc = nvrm_unmap_range(nc, np->hMemory, &np->map);
        p->map_base = NULL;
        p->map_len = 0;
    }
    for (int i = 0; i < np->nparts; i++)
        if (np->parts[i].map.mm) nvrm_unmap_range(nc, np->parts[i].hMemory, &np->parts[i].map);
    resv_release(np, mapped);
    int rc2 = nvrm_pin_release(nc, np);
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
    if (np->nparts) {
        /* several RM objects side by side in one reservation */
        size_t total = gp_round_up(p->len, 4096);
        void *r = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (r == MAP_FAILED)
            return gp_err(GDRPY_ENOMEM, "map: reserving %zu bytes failed", total);
        /* Parts are mapped in address order over the reservation and cover
         * it exactly, so unmapping them leaves nothing of it; on failure the
         * still-reserved tail is released first. */
        size_t done = 0;
        int rc = nvrm_map_range_at(nc, np->hMemory, np->rm_off, np->len0, r, &np->map);
        if (!rc) done = np->map.mm_len;
        for (int i = 0; !rc && i < np->nparts; i++) {
            struct nvrm_part *pt = &np->parts[i];
            rc = nvrm_map_range_at(nc, pt->hMemory, pt->rm_off, pt->len,
                                   (uint8_t *)r + (pt->va - p->va), &pt->map);
            if (!rc) done = (size_t)(pt->va - p->va) + pt->map.mm_len;
        }
        if (rc) {
            if (done < total) munmap((uint8_t *)r + done, total - done);
            for (int i = 0; i < np->nparts; i++)
                if (np->parts[i].map.mm)
                    nvrm_unmap_range(nc, np->parts[i].hMemory, &np->parts[i].map);
            if (np->map.mm) nvrm_unmap_range(nc, np->hMemory, &np->map);
            return rc;
        }
        np->resv = r;
        np->resv_len = total;
        p->map_base = r;
        p->map_len = p->len;
        p->mapping_type = nvrm_map_type_of(np->map.flags);
        return 0;
    }
    const uint64_t sub = np->rm_off & ((uint64_t)nvrm_host_page() - 1);
    if (p->backed && p->backed < p->len) {
        /* Route C, a chunk that ends inside the last GPU page: the whole
         * pinned range is reserved with no access and the chunk's part
         * mapped over it; the rest (no memory of the chunk's) faults when
         * touched and is never mapped to anything. */
        size_t total = gp_round_up(sub + p->len, nvrm_host_page());
        void *r = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (r == MAP_FAILED)
            return gp_err(GDRPY_ENOMEM, "map: reserving %zu bytes failed", total);
        madvise(r, total, MADV_DONTFORK);
        int rc = nvrm_map_range_at(nc, np->hMemory, np->rm_off, p->backed, r, &np->map);
        if (rc) {
            munmap(r, total);
            return rc;
        }
        np->resv = r;
        np->resv_len = total;
        p->map_base = (uint8_t *)r + sub;
        p->map_len = p->len;
        p->mapping_type = nvrm_map_type_of(np->map.flags);
        return 0;
    }
    int rc = nvrm_map_range(nc, np->hMemory, np->rm_off, p->len, &np->map);
    if (rc) return rc;
    p->map_base = (uint8_t *)np->map.mm + sub;
    p->map_len = np->map.mm_len - sub;
    p->mapping_type = nvrm_map_type_of(np->map.flags);
    return 0;
}


static int nvrm_unmap(gp_ctx *ctx, gp_pin *p)
{
    struct nvrm_ctx *nc = ctx->bpriv;
    struct nvrm_pin *np = p->bpriv;
    if (!np || !np->map.mm) return gp_err(GDRPY_EINVAL, "unmap: not mapped");
    size_t mapped = np->map.mm_len;
    int rc = nvrm_unmap_range(nc, np->hMemory, &np->map);
    for (int i = 0; i < np->nparts; i++) {
        int r2 = nvrm_unmap_range(nc, np->parts[i].hMemory, &np->parts[i].map);
        if (!rc) rc = r2;
    }
    resv_release(np, mapped);
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
