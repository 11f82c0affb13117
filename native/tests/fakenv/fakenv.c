/*
 * fakenv.c - a stand-in NVIDIA driver for testing the nvrm backend's logic
 * without a GPU: one shared library that is both "libcuda.so.1" (the CUDA
 * driver calls gdrpy makes) and, when LD_PRELOADed, the kernel driver's
 * /dev/nvidiactl + /dev/nvidia0 ioctls and mmap.  "Video memory" is a memfd;
 * RM objects, CUDA allocations, IPC handles and BAR1 mappings are modelled
 * after what the real driver did on an H100 (open kernel module 580.159.04,
 * CUDA 13.0): cuMemAlloc allocations packed at 4 KiB granularity into 2 MiB
 * RM objects; IPC handle words w4 = size, w7 = offset in the RM object,
 * w12 = CUDA's RM client, w13 = its RM memory handle; RM_DUP_OBJECT between
 * clients of one process; an ioctl whose status field says the call failed.
 * It checks argument sizes exactly, as the driver does.  Test knobs (environment):
 *   FAKE_NV_VERSION     version string (default 580.159.04)
 *   FAKE_NV_EXPORT_SIZE GET_EXPORT_OBJECT_INFO params size it accepts (80; 535: 76)
 *   FAKE_IPC_LAYOUT     "cuda13" (default) or "alt" (words moved around)
 *   FAKE_MAPBASE        "chunk" (default: MAPPING_BASE_ADDR = the RM chunk's
 *                       VA) or "alloc" (= the allocation's own base)
 *   FAKE_FRESH_CHUNKS   the first N cuMemAlloc calls each start a new RM chunk
 *   FAKE_IPC_SKEW       bytes added to the offset word of allocations made
 *                       after fake_arm_skew() (a driver whose words lie)
 * Route V models (CUDA's own records, which the backend learns to read):
 * cuMemCreate without a handle type returns the address of a record whose
 * inner block names the RM object; pools keep one record per chunk (mapping
 * base, client, size, RM handle).  fake_arm_lie(1) makes later records name
 * a decoy object of the same size; fake_arm_ambiguous(1) adds a second
 * record for later chunks naming a decoy, fake_arm_ambiguous(2) one naming a
 * second handle of the same memory; GET_SURFACE_PHYS_ATTR answers (video
 * memory offsets) unless fake_deny_phys(1), as for a caller without
 * CAP_SYS_ADMIN.  RM_MAP_MEMORY returns the bus address of the video memory
 * itself (BAR1 physical mode), or with fake_bar1_dynamic(1) a BAR1 range of
 * its own for every mapping; fake_unmappable_decoys(1) makes such second
 * records name objects that cannot be mapped.  FAKE_POOL_LAYOUT=hop keeps a
 * chunk's RM handle in a block its record points to; FAKE_POOL_LAYOUT=first
 * adds to each record a pointer to the pool's first chunk record (right only
 * in a pool of one chunk); FAKE_POOL_LAYOUT=hop2 keeps the handle two
 * pointers away (record -> allocation record -> inner block), as the round-5 GPU
 * showed for pools without handle types.  FAKE_DEFAULT_POOL_LAYOUT gives the
 * default pool a layout of its own (the others keep FAKE_POOL_LAYOUT's);
 * FAKE_POOL_LAYOUT=list chains a pool's chunk records in a list.
 * Proofs (issue 45): fake_arm_lie(2) makes the decoy twice the size;
 * fake_hide_records(1) leaves later chunk records unlinked from their pool
 * (only a scan of the heap finds them); fake_churn(1) rewrites every byte a
 * device-to-host copy read, in the source and in its decoys (a kernel
 * rewriting the memory: nothing stays stable between two reads);
 * fake_mirror_decoys(1) writes host-to-device copies into the decoys too
 * (another object with the same bytes); fake_slow_private(ms) makes every
 * device-to-host copy take that long (a proof that takes its time);
 * fake_exact_objects(1) gives each later cuMemAlloc an RM object of its own
 * of its size rounded to 4 KiB (a chunk that ends inside a GPU page).
 * cuDeviceGetAttribute says the GPU has no coherent CPU-GPU link (attribute
 * 100 is 0) unless FAKE_COHERENT=1.
 * The legacy default stream: fake_legacy_busy(1) stands for a kernel running
 * on it (or on any blocking stream); from then on every call that would wait
 * for that kernel on a real driver (synchronous copies, work on or
 * synchronizing the legacy, per-thread or a blocking stream, cuMemFree of
 * cuMemAlloc memory, cuMemFreeHost) is counted (fake_waits) instead.
 * Not a driver: no security, one device, no freeing of video memory.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))
typedef int CUresult;
typedef uint64_t CUdeviceptr;

#define FB_SIZE (8ull << 30) /* sparse: a memfd (room for allocations past 4 GiB) */
#define CHUNK (2u << 20)
#define VA_LEGACY 0x7e0000000000ull
#define VA_VMM 0x7f0000000000ull
#define CUDA_CLIENT 0xc1d0cafeu
#define MAXO 256

static pthread_mutex_t L = PTHREAD_MUTEX_INITIALIZER;

/* Records the fake hands out as handles (VMM records, pools) stay alive after
 * release/destroy, as a driver's may, so that a stale handle is still readable by
 * the route under test; they are listed here so LeakSanitizer sees them as held. */
static void *kept[4096];
static int nkept;
static void *keep(void *p)
{
    int i = __atomic_fetch_add(&nkept, 1, __ATOMIC_RELAXED);
    if (i < (int)(sizeof kept / sizeof kept[0])) kept[i] = p;
    return p;
}
static int fb_fd = -1;
static uint8_t *fb;
static uint64_t fb_used;

struct obj {
    uint32_t h;
    uint64_t fb_off, size;
    int live;
    int nomap;    /* RM_MAP_MEMORY fails (fake_unmappable_decoys) */
    int decoy_of; /* a decoy made for object decoy_of (-1: none) */
};
static struct obj objs[MAXO]; /* CUDA's RM objects (client CUDA_CLIENT) */
static int nobjs;

struct alloc {
    uint64_t va, size;
    int obj;
    uint64_t off;
    int vmm;
    int live;
    int64_t skew;
    int kind;        /* 0 device, 1 host, 2 managed */
    int htypes;      /* VMM: requested handle types */
    uint64_t handle; /* VMM: what cuMemRetainAllocationHandle returns */
    void *pool;      /* pool memory: its pool */
};
static struct alloc allocs[MAXO];
static int nallocs;
static int legacy_chunk = -1;
static uint64_t legacy_used;
static uint64_t vmm_next = VA_VMM;
static int64_t skew_armed;

/* our (the library's) RM side */
struct handle {
    uint32_t client, h;
    int obj;
    int live;
};
static struct handle hs[4 * MAXO];
static int nhs;
static uint32_t next_client = 0xc1d00100u;

struct dfd {
    int fd;
    int kind;
    int64_t pending_fb;
    int export_obj;
};
static struct dfd fds[256];
static int nfds;

/* CUDA's records (route V) */
struct vinner {
    uint32_t a, b;
    uint64_t x;
    uint32_t client, pad;
    uint32_t hmem, flags;
};
struct vrec {
    uint64_t magic, size;
    uint32_t junk[4];
    struct vinner *inner;
    int obj; /* the fake's own index */
};
struct pphys { /* FAKE_POOL_LAYOUT=hop: the handle one pointer away */
    uint64_t junk[3];
    uint32_t flags, hmem;
};
struct prec {
    uint64_t tag, va;
    uint32_t client, flags;
    uint64_t size;
    uint32_t hmem, pad;
    struct pphys *phys;
    struct prec *first;   /* FAKE_POOL_LAYOUT=first: the pool's first chunk record */
    struct palloc *alloc; /* FAKE_POOL_LAYOUT=hop2: an allocation record of its own */
    struct prec *next;    /* FAKE_POOL_LAYOUT=list: the next chunk's record */
};
/* hop2: as CUDA 13 keeps pool chunks without handle types (round-5 GPU run):
 * the record points to an allocation record whose inner block (+0x60) holds
 * the RM handle (+0x38 there, as cuMemCreate records do). */
struct palloc {
    uint64_t junk[12];
    struct pinner *inner; /* +0x60 */
};
struct pinner {
    uint64_t junk[7];
    uint32_t hmem, pad; /* +0x38 */
};
struct fpool {
    uint64_t magic;
    int htypes;
    uint32_t junk[6];
    struct prec *recs[16];
    int nrec, live, chunk_obj;
    uint64_t chunk_va, used;
};
/* FAKE_POOL_LAYOUT=list: each pool's last record, kept outside the pool */
static struct {
    void *pool;
    struct prec *tail;
} list_tails[64];
static struct prec **list_tail(void *pool)
{
    for (int i = 0; i < 64; i++)
        if (list_tails[i].pool == pool || !list_tails[i].pool) {
            list_tails[i].pool = pool;
            return &list_tails[i].tail;
        }
    return &list_tails[63].tail;
}
static struct fpool default_pool = {0x706f6f6cull, 0, {0}, {0}, 0, 1, -1, 0, 0};
static uint64_t pool_va_next = 0x7d0000000000ull;
static int lie_armed, ambig_armed, phys_denied, bar1_dynamic, decoys_nomap;
static int hide_armed, churn_armed, mirror_armed, slow_ms;

/* ---- the legacy default stream (fake_legacy_busy) ------------------------- */
#define FSTREAM_MAGIC 0x7374726561ull
struct fstream {
    uint64_t magic;
    unsigned flags;
};
static int legacy_busy, nwaits;
static char first_wait[128];
/* A stream whose work is ordered after a kernel on the legacy default stream:
 * the legacy and per-thread default streams, and any stream created without
 * CU_STREAM_NON_BLOCKING. */
static int blocking(const void *st)
{
    const struct fstream *f = st;
    if ((uintptr_t)st <= 2) return 1;
    return f->magic != FSTREAM_MAGIC || !(f->flags & 1);
}
static void waits(const char *call, const void *st)
{
    if (!__atomic_load_n(&legacy_busy, __ATOMIC_RELAXED) || (st && !blocking(st))) return;
    pthread_mutex_lock(&L);
    if (nwaits++ == 0) snprintf(first_wait, sizeof first_wait, "%s", call);
    pthread_mutex_unlock(&L);
}
static uint64_t bar1_next = 0x200000000000ull;

static uint64_t htod_log_va[4096], htod_log_n[4096];
static int htod_logged;

static void fb_init(void)
{
    if (fb) return;
    fb_fd = memfd_create("fake-fb", MFD_CLOEXEC);
    if (fb_fd < 0 || ftruncate(fb_fd, FB_SIZE) != 0) abort();
    fb = mmap(NULL, FB_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fb_fd, 0);
    if (fb == MAP_FAILED) abort();
}

static int exact_armed; /* fake_exact_objects */
static int new_obj(uint64_t size)
{
    fb_init();
    uint64_t room = (size + CHUNK - 1) & ~(uint64_t)(CHUNK - 1);
    size = exact_armed ? (size + 4095) & ~4095ull : room;
    if (fb_used + room > FB_SIZE || nobjs >= MAXO) return -1;
    int i = nobjs++;
    objs[i] = (struct obj){0xcaf00000u + (uint32_t)i * 16 + 3, fb_used, size, 1, 0, -1};
    fb_used += room;
    return i;
}

/* A second RM handle of object o's memory (CUDA may keep more than one). */
static int new_alias(int o)
{
    if (nobjs >= MAXO) return -1;
    int i = nobjs++;
    objs[i] = objs[o];
    objs[i].h = 0xcaf00000u + (uint32_t)i * 16 + 3;
    return i;
}

/* A decoy of the size the armed lie asks for (twice the size: fake_arm_lie(2)). */
static int new_decoy(int o)
{
    int d = new_obj(lie_armed == 2 ? 2 * objs[o].size : objs[o].size);
    if (d >= 0) objs[d].decoy_of = o;
    return d;
}

static struct alloc *new_alloc(void)
{
    for (int i = 0; i < nallocs; i++)
        if (!allocs[i].live) return &allocs[i];
    return nallocs < MAXO ? &allocs[nallocs++] : NULL;
}

static struct alloc *find_alloc(uint64_t va)
{
    for (int i = 0; i < nallocs; i++)
        if (allocs[i].live && va >= allocs[i].va && va < allocs[i].va + allocs[i].size)
            return &allocs[i];
    return NULL;
}

static uint8_t *host_of(uint64_t va, size_t n)
{
    struct alloc *a = find_alloc(va);
    if (!a || va + n > a->va + a->size) return NULL;
    if (a->kind == 1) return (uint8_t *)(uintptr_t)va;
    return fb + objs[a->obj].fb_off + a->off + (va - a->va);
}

/* ---- test hooks --------------------------------------------------------- */
API void fake_arm_skew(int64_t s) { skew_armed = s; }
API void fake_arm_lie(int on) { lie_armed = on; }
API void fake_arm_ambiguous(int mode) { ambig_armed = mode; }
API void fake_deny_phys(int on) { phys_denied = on; }
API void fake_bar1_dynamic(int on) { bar1_dynamic = on; }
API void fake_unmappable_decoys(int on) { decoys_nomap = on; }
API void fake_hide_records(int on) { hide_armed = on; }
API void fake_churn(int on) { churn_armed = on; }
API void fake_mirror_decoys(int on) { mirror_armed = on; }
API void fake_slow_private(int ms) { __atomic_store_n(&slow_ms, ms, __ATOMIC_RELAXED); }
API void fake_exact_objects(int on) { exact_armed = on; }
API void fake_legacy_busy(int on)
{
    pthread_mutex_lock(&L);
    if (on) {
        nwaits = 0;
        first_wait[0] = '\0';
    }
    __atomic_store_n(&legacy_busy, on, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&L);
}
/* calls that would have waited for the kernel since fake_legacy_busy(1) */
API int fake_waits(char *first, size_t n)
{
    pthread_mutex_lock(&L);
    int k = nwaits;
    if (first && n) snprintf(first, n, "%s", first_wait);
    pthread_mutex_unlock(&L);
    return k;
}
API void fake_htod_reset(void)
{
    pthread_mutex_lock(&L);
    htod_logged = 0;
    pthread_mutex_unlock(&L);
}
/* bytes CUDA copies wrote into [va, va+n) since the last reset */
API uint64_t fake_htod_into(uint64_t va, uint64_t n)
{
    uint64_t t = 0;
    pthread_mutex_lock(&L);
    for (int i = 0; i < htod_logged && i < 4096; i++) {
        uint64_t a = htod_log_va[i], b = a + htod_log_n[i];
        uint64_t lo = a > va ? a : va, hi = b < va + n ? b : va + n;
        if (hi > lo) t += hi - lo;
    }
    pthread_mutex_unlock(&L);
    return t;
}
/* host pointer of device memory (a "kernel" writing it) */
API void *fake_host_ptr(uint64_t va) { return host_of(va, 1); }

/* ---- CUDA driver API ----------------------------------------------------- */
API CUresult cuInit(unsigned f)
{
    fb_init();
    return 0;
}
API CUresult cuDriverGetVersion(int *v)
{
    *v = 13000;
    return 0;
}
API CUresult cuGetErrorName(CUresult r, const char **s)
{
    *s = r ? "CUDA_ERROR_FAKE" : "CUDA_SUCCESS";
    return 0;
}
API CUresult cuGetErrorString(CUresult r, const char **s)
{
    *s = "fake";
    return 0;
}
API CUresult cuDeviceGet(int *d, int o)
{
    if (o != 0) return 101;
    *d = 0;
    return 0;
}
API CUresult cuDeviceGetCount(int *n)
{
    *n = 1;
    return 0;
}
API CUresult cuDeviceGetName(char *n, int len, int d)
{
    snprintf(n, (size_t)len, "Fake GPU");
    return 0;
}
API CUresult cuDeviceGetPCIBusId(char *id, int len, int d)
{
    snprintf(id, (size_t)len, "0000:41:00.0");
    return 0;
}
API CUresult cuDeviceGetAttribute(int *v, int a, int d)
{
    const char *coh = getenv("FAKE_COHERENT");
    *v = a == 33 ? 0x41 : a == 34 ? 0
                      : a == 50   ? 0
                      : a == 124  ? 0
                      : a == 100  ? coh && !strcmp(coh, "1") /* PCIe unless FAKE_COHERENT=1 */
                                  : 1;
    return 0;
}
static __thread void *cur_stack[16];
static __thread int cur_n;
API CUresult cuDevicePrimaryCtxRetain(void **c, int d)
{
    *c = (void *)0x1234;
    return 0;
}
API CUresult cuDevicePrimaryCtxRelease_v2(int d) { return 0; }
API CUresult cuCtxGetCurrent(void **c)
{
    *c = cur_n ? cur_stack[cur_n - 1] : NULL;
    return 0;
}
API CUresult cuCtxSetCurrent(void *c)
{
    if (cur_n) cur_stack[cur_n - 1] = c;
    else cur_stack[cur_n++] = c;
    return 0;
}
API CUresult cuCtxPushCurrent_v2(void *c)
{
    if (cur_n >= 16) return 1;
    cur_stack[cur_n++] = c;
    return 0;
}
API CUresult cuCtxPopCurrent_v2(void **c)
{
    if (!cur_n) return 201;
    *c = cur_stack[--cur_n];
    return 0;
}
API CUresult cuCtxGetDevice(int *d)
{
    if (!cur_n) return 201;
    *d = 0;
    return 0;
}

/* The decoys of the object behind [va, +n) at the same offsets: fn(ptr). */
static void for_decoys(uint64_t va, size_t n, void (*fn)(uint8_t *p, size_t n, const void *arg),
                       const void *arg)
{
    struct alloc *a = find_alloc(va);
    if (!a || a->kind == 1) return;
    uint64_t x = a->off + (va - a->va);
    for (int k = 0; k < nobjs; k++)
        if (objs[k].decoy_of == a->obj && x + n <= objs[k].size) fn(fb + objs[k].fb_off + x, n, arg);
}
static void put_bytes(uint8_t *p, size_t n, const void *src) { memcpy(p, src, n); }
static void bump_bytes(uint8_t *p, size_t n, const void *unused)
{
    for (size_t i = 0; i < n; i++) __atomic_add_fetch(&p[i], 1, __ATOMIC_RELAXED);
}
static CUresult copy_in(CUdeviceptr dst, const void *src, size_t n)
{
    pthread_mutex_lock(&L);
    uint8_t *h = host_of(dst, n);
    if (h) {
        if (htod_logged < 4096) {
            htod_log_va[htod_logged] = dst;
            htod_log_n[htod_logged] = n;
        }
        htod_logged++;
        if (mirror_armed) for_decoys(dst, n, put_bytes, src);
    }
    pthread_mutex_unlock(&L);
    if (!h) return 1;
    memcpy(h, src, n);
    return 0;
}
static CUresult copy_out(void *dst, CUdeviceptr src, size_t n)
{
    int ms = __atomic_load_n(&slow_ms, __ATOMIC_RELAXED);
    if (ms) {
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&L);
    uint8_t *h = host_of(src, n);
    if (h) memcpy(dst, h, n);
    if (h && churn_armed) {
        bump_bytes(h, n, NULL);
        for_decoys(src, n, bump_bytes, NULL);
    }
    pthread_mutex_unlock(&L);
    return h ? 0 : 1;
}
API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    waits("cuMemcpyHtoD", NULL);
    return copy_in(dst, src, n);
}
API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    waits("cuMemcpyDtoH", NULL);
    return copy_out(dst, src, n);
}
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st)
{
    waits("cuMemcpyHtoDAsync on a blocking stream", st ? st : (void *)1);
    return copy_in(d, s, n);
}
API CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st)
{
    waits("cuMemcpyDtoHAsync on a blocking stream", st ? st : (void *)1);
    return copy_out(d, s, n);
}
API CUresult cuStreamSynchronize(void *s)
{
    waits("cuStreamSynchronize of a blocking stream", s ? s : (void *)1);
    return 0;
}
/* Events: copies complete when issued, so an event has fired once recorded;
 * recording one on a blocking stream stands for waiting for the kernel. */
API CUresult cuEventCreate(void **e, unsigned f)
{
    *e = calloc(1, 16);
    return *e ? 0 : 2;
}
API CUresult cuEventDestroy_v2(void *e)
{
    free(e);
    return 0;
}
API CUresult cuEventRecord(void *e, void *st)
{
    waits("cuEventRecord on a blocking stream", st ? st : (void *)1);
    return 0;
}
API CUresult cuEventSynchronize(void *e) { return 0; }
API CUresult cuEventQuery(void *e) { return 0; }
API CUresult cuStreamGetCtx(void *s, void **c)
{
    *c = (void *)0x1234;
    return 0;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
    pthread_mutex_lock(&L);
    fb_init();
    uint64_t need = (n + 4095) & ~4095ull;
    static int fresh_done;
    const char *fc = getenv("FAKE_FRESH_CHUNKS");
    int fresh = fc && fresh_done < atoi(fc);
    if (fresh) fresh_done++;
    if (fresh || exact_armed || legacy_chunk < 0 || legacy_used + need > objs[legacy_chunk].size) {
        legacy_chunk = new_obj(need > CHUNK || exact_armed ? need : CHUNK);
        legacy_used = 0;
    }
    struct alloc *a = legacy_chunk < 0 ? NULL : new_alloc();
    if (!a) {
        pthread_mutex_unlock(&L);
        return 2;
    }
    *a = (struct alloc){VA_LEGACY + objs[legacy_chunk].fb_off + legacy_used, n, legacy_chunk,
                        legacy_used, 0, 1, skew_armed, 0, 0, 0, NULL};
    legacy_used += need;
    *p = a->va;
    pthread_mutex_unlock(&L);
    return 0;
}
API CUresult cuMemFree_v2(CUdeviceptr p)
{
    waits("cuMemFree", NULL);
    pthread_mutex_lock(&L);
    struct alloc *a = find_alloc(p);
    int ok = a && a->va == p && !a->vmm && a->kind != 1;
    if (ok) a->live = 0;
    pthread_mutex_unlock(&L);
    return ok ? 0 : 1;
}
API CUresult cuMemGetAddressRange_v2(CUdeviceptr *b, size_t *s, CUdeviceptr p)
{
    struct alloc *a = find_alloc(p);
    if (!a) return 1;
    if (b) *b = a->va;
    if (s) *s = a->size;
    return 0;
}
static void attr(struct alloc *a, int at, void *out)
{
    uint64_t v = 0;
    if (a) switch (at) {
        case 2: v = a->kind == 1 ? 1 : 2; break;             /* MEMORY_TYPE host / device */
        case 8: v = a->kind == 2; break;                     /* IS_MANAGED */
        case 9: v = 0; break;                                /* DEVICE_ORDINAL */
        case 10: v = !a->vmm && !a->kind && !a->pool; break; /* legacy IPC capable */
        case 11: v = a->va; break;
        case 12: v = a->size; break;
        case 13: v = 1; break;
        case 14:
            v = a->vmm ? (uint64_t)a->htypes : a->pool ? (uint64_t)((struct fpool *)a->pool)->htypes
                                                       : 0;
            break;
        case 17: v = (uint64_t)(uintptr_t)a->pool; break;
        case 15: v = 1; break;
        case 7: v = (uint64_t)(a - allocs) + 1; break;
        case 18: v = a->vmm ? a->size : objs[a->obj].size; break; /* pools: the chunk */
        case 19: {
            const char *m = getenv("FAKE_MAPBASE");
            v = a->vmm || (m && !strcmp(m, "alloc")) ? a->va : a->va - a->off;
            break;
        }
        default: v = 0;
        }
    if (at == 2 || at == 8 || at == 9 || at == 10 || at == 13 || at == 14 || at == 15)
        *(uint32_t *)out = (uint32_t)v;
    else
        *(uint64_t *)out = v;
}
API CUresult cuPointerGetAttribute(void *d, int at, CUdeviceptr p)
{
    pthread_mutex_lock(&L);
    struct alloc *a = find_alloc(p);
    pthread_mutex_unlock(&L);
    if (!a) return 1;
    attr(a, at, d);
    return 0;
}
API CUresult cuPointerGetAttributes(unsigned n, int *at, void **d, CUdeviceptr p)
{
    pthread_mutex_lock(&L);
    struct alloc *a = find_alloc(p);
    pthread_mutex_unlock(&L);
    for (unsigned i = 0; i < n; i++) attr(a, at[i], d[i]);
    return 0;
}
API CUresult cuIpcGetMemHandle(void *h, CUdeviceptr p)
{
    pthread_mutex_lock(&L);
    struct alloc *a = find_alloc(p);
    if (!a || a->vmm || a->va != p || a->pool) {
        pthread_mutex_unlock(&L);
        return 1;
    }
    uint32_t w[16];
    for (int i = 0; i < 16; i++) w[i] = 0x11110000u + (uint32_t)i; /* noise */
    uint32_t size = (uint32_t)a->size, pages = (uint32_t)(objs[a->obj].size / 4096);
    uint32_t off = (uint32_t)(a->off + (uint64_t)a->skew), cli = CUDA_CLIENT;
    uint32_t mem = objs[a->obj].h;
    const char *lay = getenv("FAKE_IPC_LAYOUT");
    if (lay && !strcmp(lay, "alt")) {
        w[1] = mem;
        w[2] = size;
        w[9] = cli;
        w[10] = off;
        w[11] = pages;
        w[4] = 0;
        w[7] = 0;
    } else {
        w[4] = size;
        w[6] = pages;
        w[7] = off;
        w[12] = cli;
        w[13] = mem;
    }
    memcpy(h, w, 64);
    pthread_mutex_unlock(&L);
    return 0;
}
typedef struct {
    int type, requestedHandleTypes, location_type, location_id;
    void *meta;
    unsigned char compressionType, gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
} prop_t;
API CUresult cuMemGetAllocationGranularity(size_t *g, const prop_t *p, int o)
{
    *g = CHUNK;
    return 0;
}
API CUresult cuMemCreate(uint64_t *h, size_t size, const prop_t *p, unsigned long long f)
{
    pthread_mutex_lock(&L);
    int o = new_obj(size);
    int decoy = o >= 0 && !p->requestedHandleTypes && lie_armed ? new_decoy(o) : -1;
    pthread_mutex_unlock(&L);
    if (o < 0) return 2;
    if (p->requestedHandleTypes) {
        *h = (uint64_t)o + 1;
        return 0;
    }
    /* no handle type: the handle is the address of CUDA's record */
    struct vrec *r = keep(calloc(1, sizeof *r));
    r->inner = calloc(1, sizeof *r->inner);
    r->magic = 0x7265636f7264ull;
    r->size = size;
    for (int i = 0; i < 4; i++) r->junk[i] = 0x1000u + (uint32_t)i;
    r->inner->a = 7;
    r->inner->x = 0x123456789ull;
    r->inner->client = CUDA_CLIENT;
    r->inner->hmem = objs[decoy >= 0 ? decoy : o].h;
    r->obj = o;
    *h = (uint64_t)(uintptr_t)r;
    return 0;
}
static int obj_of_handle(uint64_t h)
{
    return h >= 0x10000 ? ((struct vrec *)(uintptr_t)h)->obj : (int)h - 1;
}
API CUresult cuMemRelease(uint64_t h) { return 0; }
API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t s, size_t al, CUdeviceptr a, unsigned long long f)
{
    pthread_mutex_lock(&L);
    *p = vmm_next;
    vmm_next += (s + CHUNK - 1) & ~(uint64_t)(CHUNK - 1);
    pthread_mutex_unlock(&L);
    return 0;
}
API CUresult cuMemAddressFree(CUdeviceptr p, size_t s) { return 0; }
API CUresult cuMemMap(CUdeviceptr va, size_t s, size_t off, uint64_t h, unsigned long long f)
{
    pthread_mutex_lock(&L);
    struct alloc *a = new_alloc();
    if (!a) {
        pthread_mutex_unlock(&L);
        return 2;
    }
    *a = (struct alloc){va, s, obj_of_handle(h), off, 1, 1, 0, 0, 0, 0, NULL};
    a->htypes = h >= 0x10000 ? 0 : 1;
    a->handle = h;
    pthread_mutex_unlock(&L);
    return 0;
}
API CUresult cuMemUnmap(CUdeviceptr va, size_t s)
{
    pthread_mutex_lock(&L);
    struct alloc *a = find_alloc(va);
    if (a && a->vmm) a->live = 0;
    pthread_mutex_unlock(&L);
    return a ? 0 : 1;
}
API CUresult cuMemSetAccess(CUdeviceptr va, size_t s, const void *d, size_t n) { return 0; }
API CUresult cuMemRetainAllocationHandle(uint64_t *h, void *addr)
{
    struct alloc *a = find_alloc((uint64_t)(uintptr_t)addr);
    if (!a || !a->vmm) return 1;
    *h = a->handle;
    return 0;
}
API CUresult cuMemGetAllocationPropertiesFromHandle(prop_t *p, uint64_t h)
{
    memset(p, 0, sizeof *p);
    p->type = 1;
    p->requestedHandleTypes = h >= 0x10000 ? 0 : 1;
    p->location_type = 1;
    return 0;
}
API CUresult cuCtxSynchronize(void) { return 0; }
API CUresult cuStreamCreate(void **s, unsigned f)
{
    struct fstream *st = keep(calloc(1, sizeof *st));
    st->magic = FSTREAM_MAGIC;
    st->flags = f;
    *s = st;
    return 0;
}
API CUresult cuStreamDestroy_v2(void *s)
{
    struct fstream *st = s;
    if ((uintptr_t)s <= 2 || st->magic != FSTREAM_MAGIC) return 400;
    st->magic = 0; /* kept: a stale handle stays readable */
    return 0;
}
API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n)
{
    pthread_mutex_lock(&L);
    uint8_t *h = host_of(d, n);
    pthread_mutex_unlock(&L);
    if (!h) return 1;
    memset(h, v, n);
    return 0;
}
static CUresult other_alloc(uint64_t *p, size_t n, int kind)
{
    pthread_mutex_lock(&L);
    struct alloc *na = new_alloc();
    if (!na) {
        pthread_mutex_unlock(&L);
        return 2;
    }
    uint64_t va;
    int obj = 0;
    if (kind == 1) {
        va = (uint64_t)(uintptr_t)calloc(1, n);
    } else {
        obj = new_obj(n);
        if (obj < 0) {
            pthread_mutex_unlock(&L);
            return 2;
        }
        va = VA_LEGACY + objs[obj].fb_off;
    }
    *na = (struct alloc){va, n, obj, 0, 0, 1, 0, kind, 0, 0, NULL};
    *p = va;
    pthread_mutex_unlock(&L);
    return 0;
}
API CUresult cuMemAllocHost_v2(void **p, size_t n) { return other_alloc((uint64_t *)p, n, 1); }
API CUresult cuMemHostAlloc(void **p, size_t n, unsigned f) { return other_alloc((uint64_t *)p, n, 1); }
API CUresult cuMemFreeHost(void *p)
{
    waits("cuMemFreeHost", NULL);
    pthread_mutex_lock(&L);
    struct alloc *a = find_alloc((uint64_t)(uintptr_t)p);
    if (a) a->live = 0;
    pthread_mutex_unlock(&L);
    return a ? 0 : 1;
}
API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned f) { return other_alloc(p, n, 2); }

/* ---- stream-ordered pools ---------------------------------------------- */
#define POOL_CHUNK (4u << 20)
API CUresult cuDeviceGetDefaultMemPool(void **pool, int dev)
{
    *pool = &default_pool;
    return 0;
}
API CUresult cuMemPoolCreate(void **pool, const void *props)
{
    struct fpool *p = keep(calloc(1, sizeof *p));
    p->magic = 0x706f6f6cull;
    p->htypes = props ? ((const int *)props)[1] : 0; /* CUmemPoolProps.handleTypes */
    p->live = 1;
    p->chunk_obj = -1;
    *pool = p;
    return 0;
}
API CUresult cuMemPoolDestroy(void *pool)
{
    ((struct fpool *)pool)->live = 0;
    return 0;
}
static void *real_mmap_anon(size_t n);
static struct prec *new_prec(struct fpool *p, int obj, uint64_t va)
{
    const char *lay0 = getenv("FAKE_POOL_LAYOUT");
    /* list: records far apart in the heap (no block read shows the next);
     * fake_hide_records: a page of its own, away from every block a walk
     * from the pool reads (only a scan of the heap finds it) */
    struct prec *r = hide_armed ? (struct prec *)((char *)real_mmap_anon(4096) + 1024)
                                : calloc(1, lay0 && !strcmp(lay0, "list") ? 2048 : sizeof *r);
    r->tag = 0x63686e6bull;
    r->va = va;
    r->client = CUDA_CLIENT;
    r->flags = 3;
    r->size = objs[obj].size;
    r->hmem = objs[obj].h;
    /* FAKE_DEFAULT_POOL_LAYOUT: the default pool keeps its chunks otherwise */
    const char *lay = p == &default_pool && getenv("FAKE_DEFAULT_POOL_LAYOUT")
                          ? getenv("FAKE_DEFAULT_POOL_LAYOUT")
                          : getenv("FAKE_POOL_LAYOUT");
    if (lay && !strcmp(lay, "hop")) {
        r->phys = calloc(1, sizeof *r->phys);
        r->phys->junk[0] = 0x5555;
        r->phys->hmem = r->hmem;
        r->hmem = 0;
    }
    /* a pointer next to the base that leads to the right record only while
     * the pool has one chunk (a learner that saw one chunk per pool keeps it) */
    if (lay && !strcmp(lay, "first")) r->first = p->nrec ? p->recs[0] : r;
    if (lay && !strcmp(lay, "hop2")) {
        r->alloc = keep(calloc(1, 4096)); /* large: its inner block lies beyond one hop */
        r->alloc->junk[0] = 0x5151;
        r->alloc->inner = keep(calloc(1, sizeof *r->alloc->inner));
        r->alloc->inner->junk[1] = 0x6161;
        r->alloc->inner->hmem = r->hmem;
        r->hmem = 0;
    }
    if (hide_armed) return r; /* linked from nothing */
    if (lay && !strcmp(lay, "list")) {
        /* the pool holds its first record; each record the next one (the
         * n-th chunk's record lies n pointers deep) */
        struct prec **t = list_tail(p);
        if (*t) (*t)->next = r;
        else p->recs[p->nrec++] = r;
        *t = keep(r);
        return r;
    }
    if (p->nrec < 16) p->recs[p->nrec++] = r;
    return r;
}
static void prec_set_handle(struct prec *r, uint32_t h)
{
    if (r->alloc) r->alloc->inner->hmem = h;
    else if (r->phys) r->phys->hmem = h;
    else r->hmem = h;
}
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *out, size_t n, void *pool, void *stream)
{
    struct fpool *p = pool;
    if (!p || !p->live) return 1;
    waits("cuMemAllocFromPoolAsync on a blocking stream", stream ? stream : (void *)1);
    pthread_mutex_lock(&L);
    uint64_t need = (n + 0xffff) & ~0xffffull;
    if (p->chunk_obj < 0 || p->used + need > objs[p->chunk_obj].size) {
        int o = new_obj(need > POOL_CHUNK ? need : POOL_CHUNK);
        if (o < 0) {
            pthread_mutex_unlock(&L);
            return 2;
        }
        p->chunk_obj = o;
        p->used = 0;
        p->chunk_va = pool_va_next;
        pool_va_next += objs[o].size + (2u << 20);
        struct prec *r = new_prec(p, o, p->chunk_va);
        if (lie_armed) {
            int d = new_decoy(o);
            if (d >= 0) prec_set_handle(r, objs[d].h);
        }
        if (ambig_armed) {
            /* 1: a record naming other memory of the same size; 2: one
             * naming a second handle of the same memory */
            int d = ambig_armed == 2 ? new_alias(o) : new_obj(objs[o].size);
            if (d >= 0 && ambig_armed != 2) objs[d].decoy_of = o;
            if (d >= 0) objs[d].nomap = decoys_nomap;
            if (d >= 0) new_prec(p, d, p->chunk_va);
        }
    }
    struct alloc *a = new_alloc();
    if (!a) {
        pthread_mutex_unlock(&L);
        return 2;
    }
    *a = (struct alloc){p->chunk_va + p->used, n, p->chunk_obj, p->used, 0, 1, 0, 0, 0, 0, NULL};
    a->pool = p;
    p->used += need;
    *out = a->va;
    pthread_mutex_unlock(&L);
    return 0;
}
API CUresult cuMemAllocAsync(CUdeviceptr *out, size_t n, void *stream)
{
    return cuMemAllocFromPoolAsync(out, n, &default_pool, stream);
}
API CUresult cuMemFreeAsync(CUdeviceptr p, void *stream)
{
    waits("cuMemFreeAsync on a blocking stream", stream ? stream : (void *)1);
    pthread_mutex_lock(&L);
    struct alloc *a = find_alloc(p);
    int ok = a && a->va == p && a->pool;
    if (ok) a->live = 0;
    pthread_mutex_unlock(&L);
    return ok ? 0 : 1;
}

static int (*real_close)(int);
static void *(*real_mmap)(void *, size_t, int, int, int, off_t);
static int (*real_ioctl)(int, unsigned long, ...);
static int (*real_open)(const char *, int, ...);
static void resolve(void)
{
    if (real_close) return;
    real_close = dlsym(RTLD_NEXT, "close");
    real_mmap = dlsym(RTLD_NEXT, "mmap");
    real_ioctl = dlsym(RTLD_NEXT, "ioctl");
    real_open = dlsym(RTLD_NEXT, "open");
}
static void *real_mmap_anon(size_t n)
{
    resolve();
    void *p = real_mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) abort();
    return p;
}
static struct dfd *fd_of(int fd)
{
    for (int i = 0; i < nfds; i++)
        if (fds[i].fd == fd && fds[i].kind) return &fds[i];
    return NULL;
}
static struct dfd *fd_new(int fd, int kind)
{
    struct dfd *d = NULL;
    for (int i = 0; i < nfds; i++)
        if (!fds[i].kind) {
            d = &fds[i];
            break;
        }
    if (!d && nfds < 256) d = &fds[nfds++];
    if (!d) return NULL;
    *d = (struct dfd){fd, kind, -1, -1};
    return d;
}
API CUresult cuMemExportToShareableHandle(void *out, uint64_t h, int type, unsigned long long f)
{
    resolve();
    if (h >= 0x10000) return 1; /* created without a handle type */
    int fd = memfd_create("fake-export", MFD_CLOEXEC);
    if (fd < 0) return 2;
    pthread_mutex_lock(&L);
    struct dfd *d = fd_new(fd, 3);
    if (d) d->export_obj = (int)h - 1;
    pthread_mutex_unlock(&L);
    *(int *)out = fd;
    return 0;
}

/* ---- the kernel driver side (LD_PRELOAD) ---------------------------------- */
API int open(const char *path, int flags, ...)
{
    resolve();
    va_list ap;
    va_start(ap, flags);
    int mode = va_arg(ap, int);
    va_end(ap);
    int kind = !strcmp(path, "/dev/nvidiactl") ? 1 : !strcmp(path, "/dev/nvidia0") ? 2
                                                                                   : 0;
    if (!kind) return real_open(path, flags, mode);
    int fd = memfd_create(kind == 1 ? "fake-nvidiactl" : "fake-nvidia0", MFD_CLOEXEC);
    pthread_mutex_lock(&L);
    fd_new(fd, kind);
    pthread_mutex_unlock(&L);
    return fd;
}
API int open64(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    int mode = va_arg(ap, int);
    va_end(ap);
    return open(path, flags, mode);
}
API int close(int fd)
{
    resolve();
    pthread_mutex_lock(&L);
    struct dfd *d = fd_of(fd);
    if (d) d->kind = 0;
    pthread_mutex_unlock(&L);
    return real_close(fd);
}
API void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    resolve();
    pthread_mutex_lock(&L);
    struct dfd *d = fd_of(fd);
    if (d && d->kind == 2) {
        int64_t fbo = d->pending_fb;
        d->pending_fb = -1;
        pthread_mutex_unlock(&L);
        if (fbo < 0 || off != 0) {
            errno = EINVAL;
            return MAP_FAILED;
        }
        return real_mmap(addr, len, prot, flags, fb_fd, (off_t)fbo);
    }
    pthread_mutex_unlock(&L);
    return real_mmap(addr, len, prot, flags, fd, off);
}
API void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    return mmap(addr, len, prot, flags, fd, off);
}

static struct handle *h_find(uint32_t client, uint32_t h)
{
    for (int i = 0; i < nhs; i++)
        if (hs[i].live && hs[i].client == client && hs[i].h == h) return &hs[i];
    return NULL;
}
static struct handle *h_add(uint32_t client, uint32_t h, int obj)
{
    for (int i = 0; i < nhs; i++)
        if (!hs[i].live) {
            hs[i] = (struct handle){client, h, obj, 1};
            return &hs[i];
        }
    if (nhs >= 4 * MAXO) return NULL;
    hs[nhs] = (struct handle){client, h, obj, 1};
    return &hs[nhs++];
}

static int rm(unsigned nr, unsigned size, uint8_t *a)
{
    uint32_t *u = (uint32_t *)a;
#define NEED(n)             \
    do {                    \
        if (size != (n)) {  \
            errno = EINVAL; \
            return -1;      \
        }                   \
    } while (0)
    switch (nr) {
    case 210: {
        NEED(72);
        const char *v = getenv("FAKE_NV_VERSION");
        u[1] = 1;
        snprintf((char *)a + 8, 64, "%s", v ? v : "580.159.04");
        return 0;
    }
    case 200: {
        if (size % 72) {
            errno = EINVAL;
            return -1;
        }
        memset(a, 0, size);
        a[0] = 1;
        a[8] = 0x41;
        u[4] = 0x4100;
        u[14] = 0;
        return 0;
    }
    case 0x2B: { /* RM_ALLOC, NVOS21 */
        NEED(32);
        uint32_t cls = u[3];
        if (cls == 0x41) {
            u[2] = next_client++;
            h_add(u[2], u[2], -1);
            u[7] = 0;
        } else if (cls == 0x80) {
            if (u[6] != 56) {
                u[7] = 0x3a;
                return 0;
            }
            if (!h_find(u[0], u[0])) {
                u[7] = 0x23;
                return 0;
            }
            if (h_find(u[0], u[2])) {
                u[7] = 0x19;
                return 0;
            }
            h_add(u[0], u[2], -1);
            u[7] = 0;
        } else {
            u[7] = 0x22;
        }
        return 0;
    }
    case 0x29: { /* RM_FREE */
        NEED(16);
        struct handle *h = h_find(u[0], u[2]);
        if (!h) {
            u[3] = 0x33;
            return 0;
        }
        if (u[2] == u[0])
            for (int i = 0; i < nhs; i++)
                if (hs[i].client == u[0]) hs[i].live = 0;
        h->live = 0;
        u[3] = 0;
        return 0;
    }
    case 0x2A: { /* RM_CONTROL, NVOS54 */
        NEED(32);
        uint32_t cmd = u[2], psz = u[6];
        uint8_t *p = (uint8_t *)(uintptr_t)(*(uint64_t *)(a + 16));
        uint32_t *pu = (uint32_t *)p;
        if (!h_find(u[0], u[0])) {
            u[7] = 0x23;
            return 0;
        }
        if (cmd == 0x205) {
            if (psz != 32) {
                u[7] = 0x3a;
                return 0;
            }
            pu[2] = 0;
            u[7] = 0;
        } else if (cmd == 0x3d08) {
            const char *es = getenv("FAKE_NV_EXPORT_SIZE");
            uint32_t want = es ? (uint32_t)atoi(es) : 80;
            if (psz != want) {
                u[7] = 0x3a;
                return 0;
            }
            struct dfd *d = fd_of((int)pu[0]);
            if (!d || d->kind != 3) {
                u[7] = 0x1f;
                return 0;
            }
            pu[1] = 0;
            uint16_t one = 1;
            memcpy(p + (want == 76 ? 8 : 12), &one, 2);
            u[7] = 0;
        } else if (cmd == 0x3d0c) {
            if (psz != 652) {
                u[7] = 0x3a;
                return 0;
            }
            struct dfd *d = fd_of((int)pu[0]);
            if (!d || d->kind != 3) {
                u[7] = 0x1f;
                return 0;
            }
            if (h_find(u[0], pu[2])) {
                u[7] = 0x19;
                return 0;
            }
            h_add(u[0], pu[2], d->export_obj);
            p[520] = 1;
            u[7] = 0;
        } else if (cmd == 0xd02) { /* GET_HANDLE_INFO */
            if (psz != 16) {
                u[7] = 0x3a;
                return 0;
            }
            struct handle *h = h_find(u[0], pu[0]);
            if (!h) {
                u[7] = 0x33;
                return 0;
            }
            uint64_t cls = h->obj >= 0 ? 0x40 : h->h == u[0] ? 0x41
                                                             : 0x80;
            if (pu[1] == 2) memcpy(p + 8, &cls, 8);
            u[7] = pu[1] == 2 ? 0 : 0x1f;
        } else if (cmd == 0x410103) { /* GET_SURFACE_PHYS_ATTR: privileged */
            struct handle *h = h_find(u[0], u[1]);
            if (psz != 48 || !h || h->obj < 0) {
                u[7] = psz != 48 ? 0x3a : 0x33;
                return 0;
            }
            if (phys_denied) {
                u[7] = 0x1b; /* NV_ERR_INSUFFICIENT_PERMISSIONS */
                return 0;
            }
            uint64_t off;
            memcpy(&off, p, 8);
            if (off >= objs[h->obj].size) {
                u[7] = 0x1f;
                return 0;
            }
            off += objs[h->obj].fb_off;
            memcpy(p, &off, 8);
            memset(p + 8, 0, 40); /* format, compression, aperture 0 = video memory, ... */
            u[7] = 0;
        } else if (cmd == 0x410110) { /* GET_SURFACE_INFO on hObject */
            struct handle *h = h_find(u[0], u[1]);
            if (psz != 16 || !h || h->obj < 0) {
                u[7] = psz != 16 ? 0x3a : 0x33;
                return 0;
            }
            uint32_t n = pu[0];
            uint32_t *l = (uint32_t *)(uintptr_t)(*(uint64_t *)(p + 8));
            for (uint32_t i = 0; i < n && i < 16; i++)
                l[2 * i + 1] = l[2 * i] == 2   ? (uint32_t)objs[h->obj].size
                               : l[2 * i] == 3 ? (uint32_t)(objs[h->obj].size >> 32)
                                               : 0;
            u[7] = 0;
        } else {
            u[7] = 0x24;
        }
        return 0;
    }
    case 0x34: { /* RM_DUP_OBJECT, NVOS55 */
        NEED(28);
        if (u[3] != CUDA_CLIENT) {
            u[6] = 0x23;
            return 0;
        }
        int o = -1;
        for (int i = 0; i < nobjs; i++)
            if (objs[i].h == u[4]) o = i;
        if (o < 0) {
            u[6] = 0x33;
            return 0;
        }
        if (h_find(u[0], u[2])) {
            u[6] = 0x19;
            return 0;
        }
        h_add(u[0], u[2], o);
        u[6] = 0;
        return 0;
    }
    case 0x4E: { /* RM_MAP_MEMORY, NVOS33 + fd */
        NEED(56);
        struct handle *h = h_find(u[0], u[2]);
        uint64_t off = *(uint64_t *)(a + 16), len = *(uint64_t *)(a + 24);
        if (!h || h->obj < 0) {
            u[10] = 0x33;
            return 0;
        }
        struct obj *o = &objs[h->obj];
        if (off > o->size || len > o->size - off || !len) {
            u[10] = 0x2e;
            return 0;
        }
        if (o->nomap) {
            u[10] = 0x56; /* NV_ERR_NOT_SUPPORTED */
            return 0;
        }
        struct dfd *d = fd_of(*(int32_t *)(a + 48));
        if (!d || d->kind != 2) {
            u[10] = 0x1f;
            return 0;
        }
        if (d->pending_fb >= 0) {
            u[10] = 0x63;
            return 0;
        }
        d->pending_fb = (int64_t)((o->fb_off + off) & ~4095ull);
        /* the bus address of the first byte: BAR1 "physical mode" (one
         * address per page of video memory), or, fake_bar1_dynamic(1), a
         * BAR1 range of its own for every mapping */
        if (bar1_dynamic) {
            *(uint64_t *)(a + 32) = bar1_next + (off & 4095u);
            bar1_next += (len + (off & 4095u) + 4095u) & ~4095ull;
        } else {
            *(uint64_t *)(a + 32) = 0x100000000000ull + o->fb_off + off;
        }
        u[11] = 2u << 23;
        u[10] = 0;
        return 0;
    }
    case 0x4F:
        NEED(32);
        u[6] = 0;
        return 0;
    default: errno = EINVAL; return -1;
    }
}

API int ioctl(int fd, unsigned long req, ...)
{
    resolve();
    va_list ap;
    va_start(ap, req);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    pthread_mutex_lock(&L);
    struct dfd *d = fd_of(fd);
    if (!d || d->kind != 1) {
        pthread_mutex_unlock(&L);
        return real_ioctl(fd, req, arg);
    }
    int r = _IOC_TYPE(req) == 'F' ? rm(_IOC_NR(req), _IOC_SIZE(req), arg) : (errno = ENOTTY, -1);
    pthread_mutex_unlock(&L);
    return r;
}
