/*
 * nvrm.h - shared between the files of the nvrm backend (not installed).
 *
 * The backend's files, lower layers first: a .c file calls functions of .c
 * files listed before it only.  The same list as files.mk (which the build
 * uses) and docs/nvrm.md; tests/test_nvrm_layout.py checks that the three
 * and the folder agree, and the layer order on the built objects.
 *
 *   files.mk      this list
 *   abi.h         our definitions of the RM ioctl interface
 *   abi/          the RM interface of each driver branch, as JSON (generated)
 *   abi_tables.h  one struct nvrm_abi per branch (generated from abi/)
 *   nvrm.h        what the files share: state, structs, one section per file
 *   table.c       ABI tables: choosing the one of the running driver
 *   rm.c          RM primitives: ioctls, handles, objects, the session, CPU maps
 *   identity.c    the identity proof: does an RM object hold the caller's bytes
 *   desc.c        reading CUDA's records: IPC words, walks, the per-pin rule
 *   diag.c        logs of what route V saw (GDRPY_NVRM_POOL_DIAG dumps)
 *   scratch.c     checks on scratch memory of our own (self-test, learning)
 *   route_a.c     route A: cuMemCreate memory with POSIX_FD: export -> import
 *   route_c.c     route C: cuMemAlloc memory: IPC words -> dup, pins over the chunk
 *   learn_vmm.c   learning where CUDA names VMM memory without handle types
 *   learn_pool.c  learning where a pool's records name its chunks' memory
 *   route_v.c     route V: VMM without handle types and pools, per pin
 *   selftest.c    the per-device self-test (which routes work) and its report
 *   backend.c     the gp_backend vtable: probe/open/close/pin/unpin/map/unmap
 *
 * Below: the state every file sees, then one section per .c file, in the
 * same order.
 */
#ifndef GDRPY_NVRM_H
#define GDRPY_NVRM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "abi.h"
#include "cudadrv.h"
#include "internal.h"

/* ---- state ----------------------------------------------------------- */
#define NVRM_MAX_DEV 64 /* CUDA devices per process this backend tracks */

struct nvrm_ctx {
    int ctl; /* /dev/nvidiactl */
    uint32_t hClient, hDevice;
    uint32_t gpu_id, dev_instance, minor;
    char devpath[32];          /* /dev/nvidiaN */
    char version[64];          /* kernel driver version string */
    struct nvrm_abi abi;       /* the table chosen for it (a copy) */
    int abi_newer;             /* the driver is newer than every table */
    int cuda_version;          /* cuDriverGetVersion */
    struct nvrm_dev_state *st; /* the device's self-test result (selftest.c) */
    pthread_mutex_t hlock;     /* guards next_handle */
    uint32_t next_handle;
    /* live driver objects, for leak checks (atomic: read without the lock) */
    uint64_t n_mem; /* imported / duplicated RM memory handles */
    uint64_t n_map; /* RM CPU mappings (each an RM mapping + a mmap) */
};

struct nvrm_map {
    int devfd; /* open only while a mapping is being made */
    void *mm;  /* mmap result */
    size_t mm_len;
    uint64_t plinear; /* RM's linear address (needed to unmap) */
    uint32_t flags;   /* NVOS33 flags returned by the driver */
};

/* A further RM object of a pin over several VMM chunks mapped side by
 * side (cuMemMap of several handles into one VA range). */
struct nvrm_part {
    char route; /* 'A' or 'V' */
    uint32_t hMemory;
    uint64_t va, len; /* the part of [pin->va, +pin->len) it backs */
    uint64_t rm_off;  /* offset of part va in the RM object */
    struct nvrm_map map;
};

struct nvrm_pin {
    char route; /* 'A' (import), 'C' (dup), 'V' (found + dup) */
    uint32_t hMemory;
    uint64_t rm_off; /* offset of pin->va inside the RM object */
    struct nvrm_map map;
    /* pins over several VMM chunks: the first chunk is the fields above
     * (covering [pin->va, +len0)), the others are parts */
    uint64_t len0;
    int nparts;
    struct nvrm_part *parts;
    void *resv; /* PROT_NONE reservation the parts (or a chunk that ends
                 * inside the last GPU page) are mapped into */
    size_t resv_len;
};

/* Route C: which of the 16 u32 words of a cuIpcGetMemHandle handle hold
 * what; learned and proven per process by route C's self-test (route_c.c). */
struct nvrm_ipc_layout {
    int valid;           /* proven on the self-test's scratch allocations */
    int w_size;          /* allocation size, low 32 bits */
    int w_pages;         /* size of the RM object in 4 KiB pages; -1 unknown */
    int w_off;           /* offset of the allocation in the RM object */
    int w_client, w_mem; /* CUDA's RM client and memory handle */
    int off_proven;      /* the offset word was seen non-zero and right */
    int mapbase;         /* alloc base - CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR
                                   equalled the offset word on every scratch allocation */
    int pages_rm;        /* RM's size of the object equalled the pages word */
    int searched;        /* 0: the known layout confirmed; 1: found by search */
};

struct nvrm_route_report {
    int tested, ok;
    char step[64];    /* the step that failed */
    char detail[384]; /* its message (RM status, errno, ...) */
};

/* One per CUDA device per process: what the self-test found. */
struct nvrm_dev_state {
    int done;
    int usable; /* at least one route passed */
    char version[64];
    char branch[8], tag[24];
    int newer, cuda_version;
    struct nvrm_route_report route_a, route_c;
    struct nvrm_ipc_layout ipc;
    double ms;         /* cost of the self-test */
    int corrupt;       /* GDRPY_NVRM_TEST_CORRUPT_ABI in effect */
    char reason[1024]; /* why the backend is unusable (usable == 0) */
};

static inline void nvrm_live_add(uint64_t *c, int d)
{
    __atomic_add_fetch(c, (uint64_t)(int64_t)d, __ATOMIC_RELAXED);
}

/* ---- table.c --------------------------------------------------------- */
GP_HIDDEN size_t nvrm_abi_count(void);
GP_HIDDEN const struct nvrm_abi *nvrm_abi_at(size_t i);
GP_HIDDEN int nvrm_abi_consistent(const struct nvrm_abi *t, char *why, size_t whylen);
GP_HIDDEN const struct nvrm_abi *nvrm_abi_select(const char *version, const char *force,
                                                 int *newer, char *why, size_t whylen);
/* GDRPY_NVRM_TEST_CORRUPT_ABI (tests only): 1 = the table's RM_MAP_MEMORY
 * argument size is made wrong; 2 = the self-test maps 64 KiB past its
 * scratch data (a wrong offset).  Returns the mode (0 = none). */
GP_HIDDEN int nvrm_abi_test_corrupt(struct nvrm_abi *t);

/* ---- rm.c ------------------------------------------------------------ */
GP_HIDDEN const char *nvrm_nv_status_name(uint32_t st);
GP_HIDDEN int nvrm_nv_status_code(uint32_t st);
GP_HIDDEN long nvrm_host_page(void);
/* RM status / errno of the calling thread's last ioctl (for reports). */
GP_HIDDEN extern __thread uint32_t nvrm_last_rm_status;
GP_HIDDEN extern __thread int nvrm_last_errno;
GP_HIDDEN int nvrm_nv_call(int fd, unsigned nr, const char *esc, void *arg, size_t size,
                           const uint32_t *status, const char *what);
GP_HIDDEN int nvrm_esc_call(struct nvrm_ctx *nc, const struct nvrm_esc *e, const char *esc,
                            void *arg, size_t bufsize, const uint32_t *status, const char *what);
GP_HIDDEN int nvrm_rm_free(struct nvrm_ctx *nc, uint32_t hParent, uint32_t h,
                           const char *what);
GP_HIDDEN int nvrm_rm_control(struct nvrm_ctx *nc, uint32_t cmd, void *params, uint32_t size,
                              const char *what);
GP_HIDDEN uint32_t nvrm_new_handle(struct nvrm_ctx *nc);
GP_HIDDEN void nvrm_session_close(struct nvrm_ctx *nc);
GP_HIDDEN int nvrm_open_node(const char *path, int *fd);
GP_HIDDEN int nvrm_session_open(int device, struct nvrm_ctx *nc);
GP_HIDDEN int nvrm_map_range(struct nvrm_ctx *nc, uint32_t hMem, uint64_t off, uint64_t len,
                             struct nvrm_map *m);
/* As nvrm_map_range, mmap'ed at `at` (MAP_FIXED) when not NULL. */
GP_HIDDEN int nvrm_map_range_at(struct nvrm_ctx *nc, uint32_t hMem, uint64_t off, uint64_t len,
                                void *at, struct nvrm_map *m);
GP_HIDDEN int nvrm_unmap_range(struct nvrm_ctx *nc, uint32_t hMem, struct nvrm_map *m);
GP_HIDDEN int nvrm_map_type_of(uint32_t flags);
/* 8-byte-load reads through a mapping (BAR1: never byte by byte). */
GP_HIDDEN void nvrm_read_mapped(const volatile uint8_t *win, uint64_t wbase, uint64_t a,
                                size_t n, uint8_t *out);

/* Imports the (single-object) RM export fd `fd` of the memory at `addr`
 * into our client; closes fd. */
GP_HIDDEN int nvrm_import_fd(gp_ctx *ctx, struct nvrm_ctx *nc, uint64_t addr, int fd,
                             uint32_t *hOut);
/* RM_DUP_OBJECT of (hClientSrc, hObjectSrc) into our client under hDevice. */
GP_HIDDEN int nvrm_dup(struct nvrm_ctx *nc, uint32_t hcli, uint32_t hobj, uint32_t *hOut,
                       const char *what);
/* Frees our dups h[0..n) (zero entries skipped). */
GP_HIDDEN void nvrm_free_dups(struct nvrm_ctx *nc, const uint32_t *h, int n, const char *what);
/* RM class of a handle in our client (0 if unknown); physical size of a
 * memory object in our client (0 if the driver does not say). */
GP_HIDDEN uint32_t nvrm_class_of(struct nvrm_ctx *nc, uint32_t h);
GP_HIDDEN uint64_t nvrm_obj_size(struct nvrm_ctx *nc, uint32_t h);
/* The physical address and aperture (0 video memory, 1 system memory) of
 * byte `off` of our RM memory object h (NV0041_CTRL_CMD_GET_SURFACE_PHYS_ATTR;
 * the driver answers only callers with CAP_SYS_ADMIN).  0, or the error. */
GP_HIDDEN int nvrm_phys_addr(struct nvrm_ctx *nc, uint32_t h, uint64_t off, uint64_t *pa,
                             uint32_t *aperture);

/* ---- identity.c ------------------------------------------------------ */
/* What a read-only comparison agreed on: bytes that stayed the same across
 * two BAR1 reads and equal CUDA's copy (stable), and whether they hold more
 * than one value (mixed; else all are `value`). */
struct nvrm_seen {
    size_t stable;
    int mixed;
    uint8_t value;
};
/* Where the bytes alone decide, this many stable bytes at least. */
#define NVRM_PROOF_MIN_BYTES 32
/* Read-only identity check: `hMem` at RM offset `rm_off` must hold what
 * CUDA shows at virtual address `va` (rm_off corresponds to va), sampled at
 * the first and last host page of [addr, addr + size) (va <= addr).  Never
 * writes anywhere.  tied: the object is named by CUDA's own description of
 * the allocation, and the bytes only cross-check it (a stable difference
 * refuses); else the bytes must prove it (nvrm_content_proves).  0, or EIO
 * naming the bytes that differ, or ENOTSUP saying why the bytes prove
 * nothing. */
GP_HIDDEN int nvrm_verify_identity(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t hMem,
                                   uint64_t va, uint64_t rm_off, uint64_t addr, uint64_t size,
                                   int tied);
/* The comparison itself, filling *sn, telling a refusal for a stable
 * difference (*differs = 1) from a mapping or copy that failed (*differs =
 * 0: nothing was learnt). */
GP_HIDDEN int nvrm_identity(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t hMem, uint64_t va,
                            uint64_t rm_off, uint64_t addr, uint64_t size, int *differs,
                            struct nvrm_seen *sn);
/* 1 if what was compared proves an object by content alone (at least
 * NVRM_PROOF_MIN_BYTES stable bytes, not all one value), else 0 with the
 * reason in why (may be NULL); nvrm_content_refuse: the refusal (ENOTSUP)
 * naming `what`, the reason and what to do. */
GP_HIDDEN int nvrm_content_proves(const struct nvrm_seen *sn, char *why, size_t whylen);
GP_HIDDEN int nvrm_content_refuse(const char *what, const struct nvrm_seen *sn);
/* Which of the n live candidates c[0..n) (our dups: freed here unless
 * chosen) holds the caller's memory [lo, lo + len) (va: the CUDA address
 * rm_off corresponds to), proven read-only; tied: the candidates are what
 * CUDA's record of this allocation names (else the bytes must prove the
 * one chosen).  0 with *hOut and how in proof, else the reason
 * (identity.c has the steps). */
GP_HIDDEN int nvrm_identity_pick(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t *c, int n,
                                 uint64_t va, uint64_t rm_off, uint64_t lo, uint64_t len,
                                 int tied, uint32_t *hOut, char *proof, size_t prooflen);

/* ---- desc.c ---------------------------------------------------------- */
#define NVRM_CLASS_LOCAL_USER 0x40 /* NV01_MEMORY_LOCAL_USER: video memory */
#define NVRM_DESC_RULES 8
#define NVRM_MAX_CAND 64 /* candidates per lookup; a lookup that fills it is refused */

/* A place in CUDA's memory: from a root address, `hops` (<= 5) pointers read at
 * off[0..hops-1] of successive blocks, then the value at off[hops]. */
struct nvrm_path {
    uint8_t hops;
    uint16_t off[6];
};
/* Where CUDA names the RM memory of a VMM allocation, behind the address
 * cuMemRetainAllocationHandle returns (learned by learn_vmm.c).  Every place
 * that named the right object on two scratch allocations is kept. */
struct nvrm_vmm_desc {
    int nobj, ncli;
    struct nvrm_path obj[NVRM_DESC_RULES]; /* the RM memory handle (u32) */
    struct nvrm_path cli[NVRM_DESC_RULES]; /* the RM client (u32); none: cli_fixed */
    uint32_t cli_fixed;                    /* route C's client */
    int size_exact;                        /* RM's size of the object equalled the mapping's on every
                       scratch allocation: a candidate of another size is not it */
};
/* Where a pool's record of a chunk names its RM memory: byte offsets from a
 * u64 field holding the chunk's mapping base address (learned by
 * learn_pool.c). */
struct nvrm_pool_rule {
    int hop;          /* 1: the handle is in the block a pointer at dp points to;
                         2: in the block a pointer at dp2 in that block points to */
    int dp;           /* that pointer (u64), when hop */
    int dp2;          /* the second pointer's offset, when hop == 2 */
    int dh;           /* the RM memory handle (u32); when hop, its offset in that block */
    int dc;           /* the RM client (u32), unless cli_fixed */
    int ds, has_size; /* the mapping size (u64), when the record holds it */
    uint32_t cli_fixed;
};
struct nvrm_pool_desc {
    int n;
    struct nvrm_pool_rule r[NVRM_DESC_RULES];
    int size_exact; /* as nvrm_vmm_desc's, for the chunk's mapping */
};

/* A breadth-first walk of the memory behind a pointer (desc.c). */
enum { NVRM_WALK_VMM_B = 192,  /* blocks behind a VMM allocation handle */
       NVRM_WALK_VMM_L = 2,    /* pointer levels below it */
       NVRM_WALK_POOL_B = 768, /* blocks behind a pool (its chunk records) */
       NVRM_WALK_POOL_L = 4,
       NVRM_WALK_POOL_BIG_B = 12288, /* the wider walk when those name nothing */
       NVRM_WALK_POOL_BIG_L = 8,
       NVRM_WALK_L0 = 1024,
       NVRM_WALK_BLK = 512 };
struct nvrm_blk {
    uint64_t addr;
    int parent;   /* -1: the root */
    uint16_t off; /* where the parent holds the pointer */
    uint16_t len; /* bytes read */
    uint8_t level;
    uint8_t d[NVRM_WALK_L0];
};
/* cuIpcGetMemHandle of the allocation at `base` as 16 u32 words. */
GP_HIDDEN int nvrm_ipc_words(uint64_t base, uint32_t w[16]);
/* Reads n bytes of this process at addr without faulting: 0 or -1. */
GP_HIDDEN int nvrm_safe_read(uint64_t addr, void *buf, size_t n);
/* Fills b[maxb] with the block at root and, breadth first, the blocks it
 * points to, `levels` pointer levels deep; returns the count (0: root
 * unreadable). */
GP_HIDDEN int nvrm_walk(uint64_t root, struct nvrm_blk *b, int maxb, int levels);
GP_HIDDEN struct nvrm_path nvrm_path_of(const struct nvrm_blk *b, int i, uint32_t pos);
GP_HIDDEN int nvrm_path_read(uint64_t root, const struct nvrm_path *p, void *out, size_t w);
GP_HIDDEN void nvrm_path_str(const struct nvrm_path *p, char *s, size_t n);
GP_HIDDEN int nvrm_is_client(uint32_t x);
/* cuMemAlloc memory of the backend's own on `device`, slot k of NVRM_KEPT,
 * `size` bytes: allocated at first use (inside a CUDA scope of the device)
 * and never freed (cuMemFree waits for the caller's kernels; desc.c); 0 if
 * it cannot be had.  Slot 0 is NVRM_KEPT0_SIZE bytes. */
#define NVRM_KEPT 3
#define NVRM_KEPT0_SIZE 0x6000
GP_HIDDEN uint64_t nvrm_kept_alloc(int device, int k, size_t size);
/* CUDA's RM client as route C sees it (the IPC words of kept memory of
 * ours, slot 0), or 0. */
GP_HIDDEN uint32_t nvrm_cuda_client(int device);
/* An RM memory handle of CUDA's client (the same words), or 0. */
GP_HIDDEN uint32_t nvrm_cuda_handle(int device);
/* The distinct (client, object) pairs a descriptor names for one
 * allocation; the count (pools: -1 if the pool is unreadable). */
GP_HIDDEN int nvrm_desc_vmm_candidates(const struct nvrm_vmm_desc *d, uint64_t handle,
                                       uint32_t *cli, uint32_t *obj, int max);
/* What a pool lookup saw (logged on refusals). */
#define NVRM_LOOK_REC 8
struct nvrm_pool_look {
    int nb, full, wide; /* blocks walked, the cap was reached, the wider walk ran */
    int places, minlvl; /* fields holding the mapping base; the shallowest level */
    int nrec;           /* candidates recorded below: their level and rule */
    uint8_t rec_lvl[NVRM_LOOK_REC], rec_rule[NVRM_LOOK_REC];
};
/* Applies d's rules at every field of the walk b[nb] holding mbase. */
GP_HIDDEN int nvrm_pool_scan(const struct nvrm_pool_desc *d, const struct nvrm_blk *b, int nb,
                             uint64_t mbase, uint64_t msize, uint32_t *cli, uint32_t *obj,
                             int max, struct nvrm_pool_look *st);
GP_HIDDEN int nvrm_desc_pool_lookup(const struct nvrm_pool_desc *d, uint64_t pool,
                                    uint64_t mbase, uint64_t msize, uint32_t *cli,
                                    uint32_t *obj, int max, struct nvrm_pool_look *st);
/* The same, with wide_only: only the wider walk (a lookup whose candidates
 * named no live object in the usual walk). */
GP_HIDDEN int nvrm_desc_pool_lookup_w(const struct nvrm_pool_desc *d, uint64_t pool,
                                      uint64_t mbase, uint64_t msize, uint32_t *cli,
                                      uint32_t *obj, int max, struct nvrm_pool_look *st,
                                      int wide_only);
/* The same over every field holding mbase in this process's anonymous
 * private writable memory (st->wide = 2): when no walk reaches the record. */
GP_HIDDEN int nvrm_desc_pool_lookup_heap(const struct nvrm_pool_desc *d, uint64_t mbase,
                                         uint64_t msize, uint32_t *cli, uint32_t *obj, int max,
                                         struct nvrm_pool_look *st);
GP_HIDDEN int nvrm_desc_pool_candidates(const struct nvrm_pool_desc *d, uint64_t pool,
                                        uint64_t mbase, uint64_t msize, uint32_t *cli,
                                        uint32_t *obj, int max);
/* RM_DUP_OBJECT of each pair into our client: the dups that are video
 * memory (NV01_MEMORY_LOCAL_USER) of at least `need` bytes (exact: of
 * exactly `need` bytes, where RM tells the size) are kept in keep[] (room
 * for NVRM_MAX_CAND; counted in n_mem), the rest freed.  Returns how many
 * were kept, or -1 (nothing kept) when the lookup filled its list and may
 * have dropped some.  Which of several is the caller's memory is for route
 * V's proof (route_v.c) to decide. */
GP_HIDDEN int nvrm_dup_alive(struct nvrm_ctx *nc, const uint32_t *cli, const uint32_t *obj,
                             int n, uint64_t need, int exact, uint32_t *keep);
/* Pool kinds learned apart: pools created without / with an exportable
 * handle type, and the device's default pool (learned on allocations of our
 * own in it, only when the created pools' layouts do not name its chunk). */
enum { NVRM_POOL_PLAIN = 0,
       NVRM_POOL_FD = 1,
       NVRM_POOL_DEFAULT = 2,
       NVRM_POOL_KINDS = 3 };
static inline const char *nvrm_pool_kind_name(int k)
{
    return k == NVRM_POOL_DEFAULT ? "the default pool"
           : k == NVRM_POOL_FD    ? "pools with handle types"
                                  : "pools without handle types";
}

/* ---- diag.c ---------------------------------------------------------- */
/* Logs of what route V saw (GDRPY_LOG_LEVEL=1); the wide dump of a
 * chunk's records only with GDRPY_NVRM_POOL_DIAG=1. */
GP_HIDDEN int nvrm_pool_diag_on(void);
GP_HIDDEN void nvrm_look_str(const struct nvrm_pool_look *st, char *s, size_t n);
GP_HIDDEN void nvrm_cand_log(struct nvrm_ctx *nc, const char *tag, const uint32_t *cli,
                             const uint32_t *obj, int n, uint64_t need);
GP_HIDDEN void nvrm_pool_diag(const char *tag, uint64_t pool, uint64_t mbase, uint64_t msize);

/* ---- scratch.c ------------------------------------------------------- */
#define NVRM_CHECK_BYTES 512 /* the self-test's data check */
#define NVRM_SCRATCH_PAT 64  /* learning's pattern */
GP_HIDDEN double nvrm_now_ms(void);
/* A failed step of a route's self-test: its name and message; _last: the
 * message of the last error, with the RM status of the last ioctl when it
 * was not NV_OK, and the driver version. */
GP_HIDDEN void nvrm_report_fail(struct nvrm_route_report *r, const char *step, const char *fmt,
                                ...) GP_PRINTF(3, 4);
GP_HIDDEN void nvrm_report_last(struct nvrm_route_report *r, const char *step,
                                struct nvrm_ctx *nc);
/* Data check of [dptr, dptr + NVRM_CHECK_BYTES) (scratch memory), which is
 * offset `rm_off` of RM memory `hMem`.  write_back 0: the read direction
 * only.  0, or -1 with r filled; -2 when the failure cannot be a wrong offset
 * (a copy or the ioctl itself failed). */
GP_HIDDEN int nvrm_scratch_check(int device, struct nvrm_ctx *nc, uint32_t hMem, uint64_t rm_off,
                                 uint64_t dptr, int write_back, struct nvrm_route_report *r);
/* Learning: a random pattern; does our dup h hold it at rm_off (read through
 * BAR1); is (cli, obj) video memory holding it; does the per-pin rule pick,
 * among n candidates, the one holding it. */
GP_HIDDEN void nvrm_scratch_pattern(uint8_t *p, size_t n, uint64_t salt);
GP_HIDDEN int nvrm_scratch_holds(struct nvrm_ctx *nc, uint32_t h, uint64_t rm_off,
                                 const uint8_t *pat);
GP_HIDDEN int nvrm_scratch_names(struct nvrm_ctx *nc, uint32_t cli, uint32_t obj, uint64_t rm_off,
                                 const uint8_t *pat);
GP_HIDDEN int nvrm_scratch_rule_picks(struct nvrm_ctx *nc, const uint32_t *cli,
                                      const uint32_t *obj, int n, uint64_t need, int exact,
                                      uint64_t rm_off, const uint8_t *pat);

/* ---- route_a.c ------------------------------------------------------- */
/* Route A: the RM memory of the cuMemCreate(POSIX_FD) allocation at `addr`,
 * exported and imported into our client (*hOut). */
GP_HIDDEN int nvrm_import_vmm(gp_ctx *ctx, struct nvrm_ctx *nc, uint64_t addr,
                              const gp_cuda_ptr *cp, uint32_t *hOut);
/* The self-test of route A (fills st->route_a). */
GP_HIDDEN void nvrm_route_a_selftest(int device, struct nvrm_ctx *nc, struct nvrm_dev_state *st);

/* ---- route_c.c ------------------------------------------------------- */
/* Route C: CUDA's RM memory of the cuMemAlloc allocation `cp`, duplicated
 * into our client (*hOut), and the allocation's offset in it (*objoff), by
 * the IPC words the self-test proved; *tied = 1 when the offset word was
 * checked against CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR (the identity
 * check then only cross-checks; else the bytes must prove it). */
GP_HIDDEN int nvrm_dup_legacy(gp_ctx *ctx, struct nvrm_ctx *nc, const gp_cuda_ptr *cp,
                              uint32_t *hOut, uint64_t *objoff, int *tied);
/* First address in [lo, hi) that lies in a CUDA allocation, or 0. */
GP_HIDDEN uint64_t nvrm_first_alloc(uint64_t lo, uint64_t hi);
/* Route C: checks that [*lo, *hi) lies in the RM object (chunk) behind the
 * cuMemAlloc allocation `cp` (at offset `objoff` in it), or runs on past its
 * end only into the rest of the GPU page in which it ends (no memory of the
 * object's: the pin leaves it unmapped), and that every allocation met in
 * the range belongs to that chunk; returns the chunk's VA range.  EINVAL
 * naming the allowed range otherwise. */
GP_HIDDEN int nvrm_chunk_range(gp_ctx *ctx, const gp_cuda_ptr *cp, uint64_t objoff,
                               uint64_t *lo, uint64_t *hi, uint64_t *chunk_lo,
                               uint64_t *chunk_hi);
/* The self-test of route C: learns the IPC word layout (st->ipc) and
 * fills st->route_c. */
GP_HIDDEN void nvrm_route_c_selftest(int device, struct nvrm_ctx *nc, struct nvrm_dev_state *st);

/* ---- learn_vmm.c ----------------------------------------------------- */
/* Learns where CUDA names the RM memory of a VMM allocation,
 * on scratch memory of our own, inside a CUDA scope of the device (0, or -1
 * with why). */
GP_HIDDEN int nvrm_learn_vmm(int device, struct nvrm_ctx *nc, struct nvrm_vmm_desc *out,
                             char *why, size_t wl);

/* ---- learn_pool.c ---------------------------------------------------- */
/* Learns the pool layouts of kind fdkind, an NVRM_POOL_* kind
 * (0, or -1 with why). */
GP_HIDDEN int nvrm_learn_pool(int device, struct nvrm_ctx *nc, int fdkind,
                              struct nvrm_pool_desc *out, char *why, size_t wl);

/* ---- route_v.c ------------------------------------------------------- */
/* Route V: VMM memory without POSIX_FD, pool memory.  `anchor` is the first
 * allocated byte of the request, `cp` the allocation (base/size: its
 * mapping), `mbase` the VA of the mapping, `va` the first pinned byte.
 * 0 with *hOut (a handle in our client) and *rm_off (offset of va in it),
 * proven to back the caller's range; else ENOTSUP naming why. */
GP_HIDDEN int nvrm_route_v(gp_ctx *ctx, struct nvrm_ctx *nc, gp_pin *p, uint64_t anchor,
                           const gp_cuda_ptr *cp, uint64_t mbase, uint64_t va, uint32_t *hOut,
                           uint64_t *rm_off, char *how, size_t howlen);
/* Pool memory: fills cp->base/size with the mapping that holds the anchor
 * (CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR/SIZE) and checks the device and
 * that the request stays inside it. */
GP_HIDDEN int nvrm_pool_range(gp_ctx *ctx, gp_pin *p, uint64_t anchor, gp_cuda_ptr *cp);

/* ---- selftest.c ------------------------------------------------------ */
/* Runs the device's self-test once per process (the session `nc` must be
 * open, inside a CUDA scope of the device) and sets nc->st.  0 if at least
 * one route works, else ENOTSUP with the reason. */
GP_HIDDEN int nvrm_selftest(int device, struct nvrm_ctx *nc);
/* The device's state if the self-test has run, else NULL. */
GP_HIDDEN const struct nvrm_dev_state *nvrm_selftest_state(int device);

/* ---- backend.c ------------------------------------------------------- */
/* gp_backend_nvrm, the vtable (declared in internal.h), and
 * gdrpy_nvrm_selftest (include/gdrpy.h). */

#endif /* GDRPY_NVRM_H */
