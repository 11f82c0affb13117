/*
 * route_v.c - nvrm backend, route V: VMM memory created without an
 * exportable handle type (GDRCopy's own tests allocate so), and
 * stream-ordered pool memory (cuMemAllocAsync, cuMemPoolCreate pools).
 *
 * The physical memory behind such a mapping is an RM video-memory object in
 * one of CUDA's RM clients of this process; CUDA hands out no export for it.
 * Route V finds it and proves it:
 *  1. cuMemRetainAllocationHandle(addr) gives CUDA's allocation handle;
 *     when cuMemExportToShareableHandle(POSIX_FD) works on it (pools
 *     created with that handle type), the export is imported as in route A
 *     and its offset proven as in 3.
 *  2. Otherwise the handle is an address inside CUDA (undocumented): the
 *     words there (and one pointer level below) are read with
 *     process_vm_readv (never a fault), and each (client, object) pair among
 *     them is tried with RM_DUP_OBJECT into our client.  A dup succeeds only
 *     for objects of this process's own RM clients.
 *     Failing that, the handles next to a memory handle CUDA gave route C
 *     (a 1-byte cuMemAlloc's IPC words) are tried the same way.
 *  3. A candidate is kept only if it is video memory (class
 *     NV01_MEMORY_LOCAL_USER) and the identity check of route C passes at
 *     the pinned address (BAR1 bytes == cuMemcpyDtoH bytes, or a test write
 *     through CUDA seen through BAR1): the object is then proven to back the
 *     caller's own mapping at that offset.
 * Nothing is written through a mapping before that proof.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "cudadrv.h"
#include "internal.h"
#include "nvrm.h"

#define NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO 0xd02
#define NV0000_HANDLE_INFO_INDEX_CLASSID 2
#define NV01_MEMORY_LOCAL_USER_CLASS 0x40
#define RS_CLIENT_HANDLE_BASE_ 0xc1d00000u

typedef struct {
    uint32_t hObject, index;
    uint64_t result;
} nv0000_handle_info_t;
_Static_assert(sizeof(nv0000_handle_info_t) == 16, "GET_HANDLE_INFO params");

enum { SCAN_BYTES = 512,
       MAX_OBJ = 2048,
       MAX_CLI = 6 };

/* Reads n bytes at addr of this process, or -1 if any of it is unmapped. */
static int safe_read(uint64_t addr, void *buf, size_t n)
{
    if (addr < 4096) return -1;
    struct iovec l = {buf, n}, r = {(void *)(uintptr_t)addr, n};
    ssize_t k = process_vm_readv(getpid(), &l, 1, &r, 1, 0);
    if (k == (ssize_t)n) return 0;
    if (k >= 0 || errno == EFAULT) return -1;
    /* process_vm_readv refused (seccomp, ENOSYS): a pipe does the same
     * without faulting: write(2) from an unmapped address gives EFAULT. */
    int pfd[2];
    if (n > 4096 || pipe(pfd) != 0) return -1;
    ssize_t w = write(pfd[1], (const void *)(uintptr_t)addr, n);
    int ok = w == (ssize_t)n && read(pfd[0], buf, n) == (ssize_t)n;
    close(pfd[0]);
    close(pfd[1]);
    return ok ? 0 : -1;
}

static int add_unique(uint32_t *v, int n, int max, uint32_t x)
{
    if (!x) return n;
    for (int i = 0; i < n; i++)
        if (v[i] == x) return n;
    if (n < max) v[n++] = x;
    return n;
}

static uint32_t class_of(struct nvrm_ctx *nc, uint32_t h)
{
    nv0000_handle_info_t hi;
    memset(&hi, 0, sizeof hi);
    hi.hObject = h;
    hi.index = NV0000_HANDLE_INFO_INDEX_CLASSID;
    if (nvrm_rm_control(nc, NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO, &hi, sizeof hi,
                        "GET_HANDLE_INFO of a candidate"))
        return 0;
    return (uint32_t)hi.result;
}

/* CUDA's RM client and a memory handle in it, as route C sees them: from
 * the IPC handle of a 1-byte cuMemAlloc allocation made and freed here.
 * 0 if that fails. */
static uint32_t cuda_client_by_ipc(uint32_t *obj)
{
    *obj = 0;
    if (!gp_cu.MemAlloc || !gp_cu.MemFree) return 0;
    CUdeviceptr d = 0;
    if (gp_cu.MemAlloc(&d, 1) != CUDA_SUCCESS) return 0;
    uint32_t w[16];
    uint32_t c = 0;
    if (nvrm_ipc_words(d, w) == 0) {
        c = w[12];
        *obj = w[13];
    }
    gp_cu.MemFree(d);
    return c;
}

/* Discriminating proof by a test write (route V only): 8 bytes of the
 * caller's range at `t` are flipped through CUDA (cuMemcpyHtoD), must be seen
 * through BAR1 at the candidate offset, and are restored.  Equal content
 * cannot tell two buffers apart; this can.  0 if proven. */
static int prove_by_write(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t h, uint64_t va,
                          uint64_t off, uint64_t t, uint64_t alloc_end)
{
    const uint64_t hp = (uint64_t)nvrm_host_page();
    uint64_t w0 = gp_round_down(t, hp);
    if (w0 < va) w0 = va;
    size_t n = (size_t)(alloc_end - t);
    if (n > 8) n = 8;
    if (t + n > gp_round_down(t, hp) + hp) n = (size_t)(gp_round_down(t, hp) + hp - t);
    if (n == 0) return -1;
    uint8_t save[8], pat[8], got[8];
    if (gp_cuda_memcpy(ctx->device, 1, t, save, n, NULL)) return -1;
    for (size_t k = 0; k < n; k++) pat[k] = (uint8_t)~save[k];
    struct nvrm_map m;
    if (nvrm_map_range(nc, h, off + (w0 - va), gp_round_down(t, hp) + hp - w0, &m)) return -1;
    const volatile uint8_t *base = (const volatile uint8_t *)m.mm + ((off + (w0 - va)) & ((uint64_t)nvrm_host_page() - 1));
    int match = 0;
    if (gp_cuda_memcpy(ctx->device, 0, t, pat, n, NULL) == 0) {
        nvrm_read_mapped(base, w0, t, n, got);
        match = memcmp(got, pat, n) == 0;
    }
    int restored = gp_cuda_memcpy(ctx->device, 0, t, save, n, NULL) == 0;
    if (restored && match) {
        nvrm_read_mapped(base, w0, t, n, got);
        match = memcmp(got, save, n) == 0;
    }
    nvrm_unmap_range(nc, h, &m);
    if (!restored)
        gp_log(4, "nvrm: route V: could not restore %zu bytes at 0x%llx after a test write", n,
               (unsigned long long)t);
    return match && restored ? 0 : -1;
}

/* Dups (cli, obj); if it is video memory, each offset whose bytes agree
 * with CUDA's (read only) is then proven by a test write.  1 with *hOut
 * (the dup, kept) and *off on proof; 0 otherwise (dup freed). */
static int try_candidate(gp_ctx *ctx, struct nvrm_ctx *nc, const gp_pin *vp, uint64_t va,
                         uint64_t alloc_end, const uint64_t *offs, int noffs, uint32_t cli,
                         uint32_t obj, uint32_t *hOut, uint64_t *off, int *n_dup, int *n_agree)
{
    uint32_t h = 0;
    if (nvrm_dup(nc, cli, obj, &h, "route V candidate")) return 0;
    (*n_dup)++;
    uint32_t cls = class_of(nc, h);
    gp_log(1, "nvrm: route V: dup of client 0x%x object 0x%x is class 0x%x", cli, obj, cls);
    if (cls == NV01_MEMORY_LOCAL_USER_CLASS) {
        for (int i = 0; i < noffs; i++) {
            if (nvrm_verify_identity(ctx, nc, h, va, offs[i], vp->addr, vp->size)) continue;
            (*n_agree)++;
            if (prove_by_write(ctx, nc, h, va, offs[i], vp->addr, alloc_end) == 0) {
                gp_log(1, "nvrm: route V: client 0x%x object 0x%x offset 0x%llx backs 0x%llx "
                          "(proven by a test write)",
                       cli, obj, (unsigned long long)offs[i],
                       (unsigned long long)vp->addr);
                *hOut = h;
                *off = offs[i];
                return 1;
            }
        }
    }
    nvrm_rm_free(nc, nc->hDevice, h, "freeing a route V candidate");
    nvrm_live_add(&nc->n_mem, -1);
    return 0;
}

int nvrm_route_v(gp_ctx *ctx, struct nvrm_ctx *nc, gp_pin *p, uint64_t anchor,
                 const gp_cuda_ptr *cp, uint64_t mbase, uint64_t va, uint32_t *hOut,
                 uint64_t *rm_off, char *how, size_t howlen)
{
    const char *kind = gp_cuda_kind_name(cp->kind);
    snprintf(how, howlen, "?");
    CUmemGenericAllocationHandle h = 0;
    CUresult r = gp_cu.MemRetainAllocationHandle(&h, (void *)(uintptr_t)anchor);
    if (r)
        return gp_cuda_err(GDRPY_ENOTSUP, r, "cuMemRetainAllocationHandle",
                           "0x%llx is %s: the CUDA driver gives no allocation handle for it, so "
                           "its RM memory cannot be found; this holds for pools with or without "
                           "shareable handle types; what works: cuMemAlloc/cudaMalloc memory "
                           "(CuPy's and PyTorch's default allocators) and cuMemCreate memory "
                           "with any handle type (gdrpy.memory.alloc)",
                           (unsigned long long)anchor, kind);
    /* 2. candidates from the words behind the opaque handle */
    uint32_t cli[MAX_CLI];
    uint32_t *obj = calloc(MAX_OBJ, sizeof *obj);
    if (!obj) {
        gp_cu.MemRelease(h);
        return gp_err(GDRPY_ENOMEM, "out of memory");
    }
    int ncli = 0, nobj = 0;
    uint8_t buf[SCAN_BYTES];
    int readable = safe_read((uint64_t)h, buf, sizeof buf) == 0;
    if (readable) {
        /* breadth-first over pointers: the handle's block, then up to
         * MAX_BLOCKS blocks it points to (two levels) */
        enum { MAX_BLOCKS = 192,
               BLK = 256 };
        uint64_t *q = malloc(MAX_BLOCKS * sizeof *q);
        int qn = 0, depth_end = 0;
        for (int level = 0; level < 3 && q; level++) {
            int from = level == 0 ? -1 : depth_end, to = qn;
            if (level > 0 && from >= to) break;
            depth_end = qn;
            for (int b = from; b < to; b++) {
                uint8_t blk[SCAN_BYTES];
                size_t len = level == 0 ? sizeof buf : BLK;
                if (level == 0) memcpy(blk, buf, sizeof buf);
                else if (safe_read(q[b], blk, len)) continue;
                for (size_t i = 0; i + 4 <= len; i += 4) {
                    uint32_t x;
                    memcpy(&x, blk + i, 4);
                    if ((x & 0xfff00000u) == RS_CLIENT_HANDLE_BASE_)
                        ncli = add_unique(cli, ncli, MAX_CLI, x);
                    nobj = add_unique(obj, nobj, MAX_OBJ, x);
                    if (i % 8 == 0 && i + 8 <= len && level < 2 && qn < MAX_BLOCKS) {
                        uint64_t v;
                        memcpy(&v, blk + i, 8);
                        if (v >= 0x10000 && v < (1ull << 47) && (v & 7) == 0) q[qn++] = v;
                    }
                }
            }
        }
        free(q);
    }
    gp_cu.MemRelease(h);
    uint32_t ipc_obj = 0;
    ncli = add_unique(cli, ncli, MAX_CLI, cuda_client_by_ipc(&ipc_obj));

    /* Identity is checked on the user's range within its allocation. */
    gp_cuda_ptr vcp = *cp;
    CUdeviceptr ab = 0;
    size_t as = 0;
    if (gp_cu.MemGetAddressRange(&ab, &as, anchor) == CUDA_SUCCESS && as) {
        vcp.base = ab;
        vcp.size = as;
    }
    gp_pin vp = *p;
    vp.va = va;
    uint64_t ilo = p->addr > vcp.base ? p->addr : vcp.base;
    uint64_t ihi = p->addr + p->size < vcp.base + vcp.size ? p->addr + p->size
                                                           : vcp.base + vcp.size;
    int rc;
    if (ihi <= ilo) {
        rc = gp_err(GDRPY_EINVAL, "route V: the request does not meet the allocation at "
                                  "0x%llx",
                    (unsigned long long)anchor);
        goto done;
    }
    vp.addr = ilo;
    vp.size = ihi - ilo;
    /* Offsets of va in the object to try: from the mapping base (VMM: the
     * handle is mapped from offset 0), from the allocation base, and from
     * power-of-two chunk boundaries (pools map physical chunks of 2..64 MiB
     * at aligned addresses).  Only a test write can prove one. */
    uint64_t offs[10];
    int noffs = 0;
    uint64_t cand[10];
    int nc_ = 0;
    cand[nc_++] = va - mbase;
    if (va >= vcp.base) cand[nc_++] = va - vcp.base;
    for (int k = 21; k <= 26; k++) cand[nc_++] = va & ((1ull << k) - 1);
    for (int i = 0; i < nc_; i++) {
        int dup = 0;
        for (int j = 0; j < noffs; j++) dup |= offs[j] == cand[i];
        if (!dup) offs[noffs++] = cand[i];
    }
    int n_dup = 0, n_agree = 0;
    const uint64_t alloc_end = vcp.base + vcp.size;
    /* 1. an exportable handle type after all (e.g. a pool created with
     * POSIX_FD): import it; its offset is proven like any candidate's. */
    CUresult export_r = CUDA_ERROR_NOT_SUPPORTED;
    {
        CUmemGenericAllocationHandle h2 = 0;
        int fd = -1;
        uint32_t hImp = 0;
        if (gp_cu.MemRetainAllocationHandle(&h2, (void *)(uintptr_t)anchor) == CUDA_SUCCESS) {
            export_r = gp_cu.MemExportToShareableHandle(&fd, h2,
                                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
            gp_cu.MemRelease(h2);
        }
        if (export_r == CUDA_SUCCESS && fd >= 0 &&
            nvrm_import_fd(ctx, nc, anchor, fd, &hImp) == 0) {
            for (int i = 0; i < noffs; i++) {
                if (nvrm_verify_identity(ctx, nc, hImp, va, offs[i], vp.addr, vp.size)) continue;
                n_agree++;
                if (prove_by_write(ctx, nc, hImp, va, offs[i], vp.addr, alloc_end) == 0) {
                    *hOut = hImp;
                    *rm_off = offs[i];
                    snprintf(how, howlen, "export, offset proven by a test write");
                    rc = 0;
                    goto done;
                }
            }
            nvrm_rm_free(nc, nc->hDevice, hImp, "freeing an unproven import");
            nvrm_live_add(&nc->n_mem, -1);
        }
    }
    /* 2. objects named behind CUDA's handle */
    if (readable)
        for (int c = 0; c < ncli; c++)
            for (int o = 0; o < nobj; o++)
                if (obj[o] != cli[c] &&
                    try_candidate(ctx, nc, &vp, va, alloc_end, offs, noffs, cli[c], obj[o], hOut,
                                  rm_off, &n_dup, &n_agree)) {
                    snprintf(how, howlen, "handle scan, proven by a test write");
                    rc = 0;
                    goto done;
                }
    /* 3. the neighbourhood of a memory handle CUDA gave route C (if CUDA
     * numbers its RM objects in sequence, the one behind this allocation is
     * near) */
    enum { NB = 512 };
    int n_near = 0;
    if (ipc_obj > NB) {
        for (int c = 0; c < ncli; c++)
            for (uint32_t x = ipc_obj - NB; x < ipc_obj + NB; x++) {
                if (x == cli[c]) continue;
                int seen = 0;
                for (int o = 0; o < nobj && !seen; o++) seen = obj[o] == x;
                if (seen) continue;
                n_near++;
                if (try_candidate(ctx, nc, &vp, va, alloc_end, offs, noffs, cli[c], x, hOut,
                                  rm_off, &n_dup, &n_agree)) {
                    snprintf(how, howlen, "neighbour scan, proven by a test write");
                    rc = 0;
                    goto done;
                }
            }
    }
    rc = gp_err(GDRPY_ENOTSUP,
                "0x%llx is %s, which CUDA does not export (cuMemExportToShareableHandle: %s) "
                "and whose RM memory object could not be found and proven in this process "
                "(allocation handle %s; %d client, %d object and %d neighbour candidates, %d "
                "duplicated, %d agreeing by content, none proven by a test write): refused; "
                "what works: "
                "cuMemAlloc/cudaMalloc memory and "
                "cuMemCreate memory with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR "
                "(gdrpy.memory allocates so)",
                (unsigned long long)p->addr,
                kind, gp_cuda_errname(export_r), readable ? "readable" : "not an address",
                ncli, nobj, n_near, n_dup, n_agree);
done:
    free(obj);
    return rc;
}

int nvrm_pool_range(gp_ctx *ctx, gp_pin *p, uint64_t anchor, gp_cuda_ptr *cp)
{
    if (cp->device >= 0 && cp->device != ctx->device)
        return gp_err(GDRPY_ENODEV, "0x%llx is memory of CUDA device %d, but this context is "
                                    "on device %d",
                      (unsigned long long)p->addr, cp->device, ctx->device);
    uint64_t mb = 0, ms = 0;
    CUresult r1 = gp_cu.PointerGetAttribute(&mb, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, anchor);
    CUresult r2 = gp_cu.PointerGetAttribute(&ms, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, anchor);
    if (r1 || r2 || !mb || !ms) {
        CUdeviceptr b = 0;
        size_t s = 0;
        CUresult r = gp_cu.MemGetAddressRange(&b, &s, anchor);
        if (r)
            return gp_cuda_err(0, r, "cuMemGetAddressRange", "range of the pool allocation at "
                                                             "0x%llx",
                               (unsigned long long)anchor);
        mb = b;
        ms = s;
    }
    cp->base = mb;
    cp->size = ms;
    if (p->addr < mb || p->addr + p->size > mb + ms)
        return gp_err(GDRPY_EINVAL, "range 0x%llx+%llu leaves the pool mapping [0x%llx, "
                                    "0x%llx) that holds its first byte; pin within it",
                      (unsigned long long)p->addr, (unsigned long long)p->size,
                      (unsigned long long)mb, (unsigned long long)(mb + ms));
    gp_log(1, "nvrm: pool memory 0x%llx in mapping [0x%llx, +0x%llx)",
           (unsigned long long)p->addr, (unsigned long long)mb, (unsigned long long)ms);
    return 0;
}
