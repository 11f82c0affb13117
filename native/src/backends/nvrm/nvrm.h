/*
 * nvrm.h - shared between the files of the nvrm backend (not installed).
 *
 *   abi.h      our definitions of the RM ioctl interface
 *   rm.c       RM ioctl wrappers, status names, handles, the session
 *              (ctl fd, version, GPU match, client, device), CPU mappings
 *   routes.c   route A (cuMemCreate -> POSIX fd -> import) and route C
 *              (cuMemAlloc -> IPC handle words -> RM dup) + identity check
 *   backend.c  the gp_backend vtable: probe/open/close/pin/unpin/map/unmap
 */
#ifndef GDRPY_NVRM_H
#define GDRPY_NVRM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "abi.h"
#include "cudadrv.h"
#include "internal.h"

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

struct nvrm_map {
    int devfd;                  /* open only while a mapping is being made */
    void *mm;                   /* mmap result */
    size_t mm_len;
    uint64_t plinear;           /* RM's linear address (needed to unmap) */
    uint32_t flags;             /* NVOS33 flags returned by the driver */
};

struct nvrm_pin {
    char route;                 /* 'A' (import), 'C' (dup), 'V' (found + dup) */
    char strict;                /* identity only by a test write (route V
                                   candidates: equal content proves nothing) */
    uint32_t hMemory;
    uint64_t rm_off;            /* offset of pin->va inside the RM object */
    struct nvrm_map map;
};

static inline void nvrm_live_add(uint64_t *c, int d)
{
    __atomic_add_fetch(c, (uint64_t)(int64_t)d, __ATOMIC_RELAXED);
}

/* ---- rm.c ------------------------------------------------------------- */
GP_HIDDEN const char *nvrm_nv_status_name(uint32_t st);
GP_HIDDEN int nvrm_nv_status_code(uint32_t st);
GP_HIDDEN long nvrm_host_page(void);
GP_HIDDEN int nvrm_env_force(void);
GP_HIDDEN int nvrm_nv_call(int fd, unsigned nr, const char *esc, void *arg, size_t size,
                           const uint32_t *status, const char *what);
GP_HIDDEN int nvrm_rm_free(int ctl, uint32_t hClient, uint32_t hParent, uint32_t h,
                           const char *what);
GP_HIDDEN int nvrm_rm_control(struct nvrm_ctx *nc, uint32_t cmd, void *params, uint32_t size,
                              const char *what);
GP_HIDDEN uint32_t nvrm_new_handle(struct nvrm_ctx *nc);
GP_HIDDEN void nvrm_session_close(struct nvrm_ctx *nc);
GP_HIDDEN int nvrm_open_node(const char *path, int *fd);
GP_HIDDEN int nvrm_session_open(int device, struct nvrm_ctx *nc);
GP_HIDDEN int nvrm_map_range(struct nvrm_ctx *nc, uint32_t hMem, uint64_t off, uint64_t len,
                             struct nvrm_map *m);
GP_HIDDEN int nvrm_unmap_range(struct nvrm_ctx *nc, uint32_t hMem, struct nvrm_map *m);
GP_HIDDEN int nvrm_map_type_of(uint32_t flags);

/* ---- routes.c --------------------------------------------------------- */
GP_HIDDEN int nvrm_import_vmm(gp_ctx *ctx, struct nvrm_ctx *nc, uint64_t addr,
                              const gp_cuda_ptr *cp, uint32_t *hOut);
GP_HIDDEN int nvrm_import_fd(gp_ctx *ctx, struct nvrm_ctx *nc, uint64_t addr, int fd,
                             uint32_t *hOut);
GP_HIDDEN int nvrm_dup_legacy(gp_ctx *ctx, struct nvrm_ctx *nc, const gp_cuda_ptr *cp,
                              uint32_t *hOut, uint64_t *objoff);
GP_HIDDEN int nvrm_verify_identity(gp_ctx *ctx, struct nvrm_ctx *nc, gp_pin *p,
                                   struct nvrm_pin *np, const gp_cuda_ptr *cp);

/* ---- route_v.c -------------------------------------------------------- */
/* Route V: VMM memory without POSIX_FD, pool memory.  `cp` describes the
 * allocation (base/size: the mapping), `mbase` the VA where the RM object's
 * offset 0 is mapped, `va` the first pinned byte.  0 and *hOut (a handle in
 * our client, proven by the identity check) or ENOTSUP naming why. */
GP_HIDDEN int nvrm_route_v(gp_ctx *ctx, struct nvrm_ctx *nc, gp_pin *p, uint64_t anchor,
                           const gp_cuda_ptr *cp, uint64_t mbase, uint64_t va, uint32_t *hOut,
                           uint64_t *rm_off, char *how, size_t howlen);

/* Pool memory: fills cp->base/size with the mapping that holds p->addr
 * (CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR/SIZE of the anchor, the first
 * allocated byte of the request) and checks the device and
 * that the request stays inside it. */
GP_HIDDEN int nvrm_pool_range(gp_ctx *ctx, gp_pin *p, uint64_t anchor, gp_cuda_ptr *cp);

/* ---- chunk.c ---------------------------------------------------------- */
/* First address in [lo, hi) that lies in a CUDA allocation, or 0. */
GP_HIDDEN uint64_t nvrm_first_alloc(uint64_t lo, uint64_t hi);
/* The 16 words of cuIpcGetMemHandle(base). */
GP_HIDDEN int nvrm_ipc_words(uint64_t base, uint32_t w[16]);
/* Route C: checks that [*lo, *hi) lies in the RM object (chunk) behind the
 * cuMemAlloc allocation `cp` (at offset `objoff` in it) and that every
 * allocation met in the range belongs to that chunk; returns the chunk's
 * VA range.  EINVAL naming the allowed range otherwise. */
GP_HIDDEN int nvrm_chunk_range(gp_ctx *ctx, const gp_cuda_ptr *cp, uint64_t objoff,
                               uint64_t *lo, uint64_t *hi, uint64_t *chunk_lo,
                               uint64_t *chunk_hi);

#endif /* GDRPY_NVRM_H */
