/*
 * probe_pool_rm.c - one short GPU run that records how the CUDA driver
 * represents stream-ordered pool memory and VMM memory in RM, so that the
 * nvrm backend can reach it with a read-only proof.  Diagnostic only: it
 * writes patterns into its OWN allocations (never anyone else's) and prints
 * every RM status.
 *
 * Lines: FACT (a measured fact), OBJ (an RM object of CUDA's client), HIT (a
 * place behind a CUDA handle where a value of interest sits), BACK (which RM
 * object at which offset backs an allocation, found by a pattern written into
 * the probe's own allocation).
 *
 * Build + run: native/tests/gpu/run_probe_pool_rm.sh
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "probe_rm_shim.h"

static int OURFD;
static uint32_t OURCLI, OURDEV;
static const char *cuerr(CUresult r)
{
    const char *s = NULL;
    cuGetErrorName(r, &s);
    return s ? s : "?";
}
#define FACT(...)                    \
    do {                             \
        printf("FACT " __VA_ARGS__); \
        printf("\n");                \
        fflush(stdout);              \
    } while (0)

static int safe_read(uint64_t addr, void *buf, size_t n)
{
    if (addr < 4096 || addr >= (1ull << 47)) return -1;
    struct iovec l = {buf, n}, r = {(void *)(uintptr_t)addr, n};
    ssize_t k = process_vm_readv(getpid(), &l, 1, &r, 1, 0);
    return k == (ssize_t)n ? 0 : -1;
}

/* ---- raw RM control on any fd / client -------------------------------- */
static uint32_t ctl(int fd, uint32_t cli, uint32_t obj, uint32_t cmd, void *p, uint32_t sz,
                    int *err)
{
    if (err) *err = 0;
    return shim_ctl(fd, cli, obj, cmd, p, sz);
}

typedef struct {
    uint32_t hObject, index;
    uint64_t result;
} hinfo_t;

static uint32_t handle_info(int fd, uint32_t cli, uint32_t h, uint32_t idx, uint64_t *out)
{
    hinfo_t hi = {h, idx, 0};
    uint32_t st = ctl(fd, cli, cli, 0xd02, &hi, sizeof hi, NULL);
    *out = hi.result;
    return st;
}

typedef struct {
    uint32_t index, data;
} sinfo_t;
typedef struct {
    uint32_t n, pad;
    uint64_t list;
} sinfo_params_t;

/* physical size of a memory object (0 on failure, status in *st) */
static uint64_t obj_size(int fd, uint32_t cli, uint32_t h, uint32_t *st, uint32_t *aspace,
                         uint32_t *attr)
{
    sinfo_t l[4] = {{2, 0}, {3, 0}, {9, 0}, {8, 0}};
    sinfo_params_t p = {4, 0, (uint64_t)(uintptr_t)l};
    *st = ctl(fd, cli, h, 0x410110, &p, sizeof p, NULL);
    if (aspace) *aspace = l[2].data;
    if (attr) *attr = l[3].data;
    return *st ? 0 : ((uint64_t)l[1].data << 32) | l[0].data;
}

/* ---- CUDA's ctl fds ----------------------------------------------------- */
static int cuda_fds[16], n_cuda_fds;
static void find_cuda_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int fd = atoi(e->d_name);
        char p[64], t[256];
        snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
        ssize_t k = readlink(p, t, sizeof t - 1);
        if (k <= 0) continue;
        t[k] = 0;
        if (strcmp(t, "/dev/nvidiactl") == 0 && fd != OURFD && n_cuda_fds < 16)
            cuda_fds[n_cuda_fds++] = fd;
        if (strstr(t, "nvidia")) printf("FACT fd %d -> %s%s\n", fd, t, fd == OURFD ? " (ours)" : "");
    }
    if (d) closedir(d);
}

/* ---- object enumeration by handle scan ---------------------------------- */
typedef struct {
    uint32_t h, cls, parent, cli;
    int fd;
} obj_t;
enum { MAXO = 8192 };
static obj_t objs[MAXO];
static int nobjs;

static void scan_window(int fd, uint32_t cli, uint32_t lo, uint32_t n)
{
    for (uint32_t h = lo; h < lo + n && nobjs < MAXO; h++) {
        uint64_t cls = 0, par = 0;
        if (handle_info(fd, cli, h, 2, &cls) != 0) continue;
        handle_info(fd, cli, h, 1, &par);
        objs[nobjs++] = (obj_t){h, (uint32_t)cls, (uint32_t)par, cli, fd};
    }
}
static uint32_t win_lo[8], win_n[8];
static int nwin;
static uint32_t own_cli[8];
static int own_fd[8], nown;
static void scan_all(void)
{
    nobjs = 0;
    for (int c = 0; c < nown; c++)
        for (int i = 0; i < nwin; i++) scan_window(own_fd[c], own_cli[c], win_lo[i], win_n[i]);
}
static int has_obj(const obj_t *v, int n, const obj_t *o)
{
    for (int i = 0; i < n; i++)
        if (v[i].h == o->h && v[i].cli == o->cli) return 1;
    return 0;
}

/* ---- BFS behind a CUDA handle for values of interest -------------------- */
typedef struct {
    uint64_t addr;
    int parent, off; /* pointer found at parent's block + off */
    int level;
} node_t;
static void path_str(node_t *q, int i, int off, char *out, size_t n)
{
    char tmp[256] = "";
    int chain[8], k = 0;
    for (int x = i; x >= 0 && k < 8; x = q[x].parent) chain[k++] = x;
    size_t w = 0;
    w += snprintf(tmp + w, sizeof tmp - w, "h");
    for (int j = k - 2; j >= 0; j--) w += snprintf(tmp + w, sizeof tmp - w, "[+0x%x]", q[chain[j]].off);
    snprintf(out, n, "%s+0x%x", tmp, off);
}
static void bfs(const char *what, uint64_t root, const uint64_t *v64, int n64,
                const uint32_t *v32, int n32)
{
    enum { MAXN = 800 };
    node_t *q = calloc(MAXN, sizeof *q);
    int qn = 0, hits = 0;
    q[qn++] = (node_t){root, -1, 0, 0};
    for (int i = 0; i < qn; i++) {
        size_t len = q[i].level == 0 ? 1024 : 512;
        uint8_t blk[1024];
        if (safe_read(q[i].addr, blk, len)) continue;
        int at64[3] = {-1, -1, -1}, at32 = -1;
        for (size_t o = 0; o + 4 <= len; o += 4) {
            uint32_t x;
            memcpy(&x, blk + o, 4);
            if (n32 && x == v32[0] && at32 < 0) at32 = (int)o;
            for (int k = 0; k < n32; k++)
                if (x == v32[k] && hits < 8) {
                    char ps[256];
                    path_str(q, i, (int)o, ps, sizeof ps);
                    printf("HIT %s u32 #%d (0x%x) at %s\n", what, k, x, ps);
                    hits++;
                }
            if (o % 8 == 0 && o + 8 <= len) {
                uint64_t y;
                memcpy(&y, blk + o, 8);
                for (int k = 0; k < n64 && k < 3; k++)
                    if (y == v64[k] && at64[k] < 0) at64[k] = (int)o;
                for (int k = 0; k < n64; k++)
                    if (y == v64[k] && hits < 8) {
                        char ps[256];
                        path_str(q, i, (int)o, ps, sizeof ps);
                        printf("HIT %s u64 #%d (0x%llx) at %s\n", what, k, (unsigned long long)y, ps);
                        hits++;
                    }
                if (q[i].level < 4 && qn < MAXN && y >= 0x10000 && y < (1ull << 47) && (y & 7) == 0)
                    q[qn++] = (node_t){y, i, (int)o, q[i].level + 1};
            }
        }
        if (at32 >= 0 && (at64[0] >= 0 || at64[1] >= 0 || at64[2] >= 0)) {
            char ps[256];
            path_str(q, i, 0, ps, sizeof ps);
            printf("PAIR %s block #%d %s: handle@+0x%x va@%+d mbase@%+d msize@%+d (level %d)\n", what, i,
                   ps, at32, at64[0] < 0 ? -1 : at64[0], at64[1] < 0 ? -1 : at64[1],
                   at64[2] < 0 ? -1 : at64[2], q[i].level);
        }
    }
    printf("FACT bfs %s: %d blocks, %d hits\n", what, qn, hits);
    free(q);
}

/* ---- find which object (and offset) backs an allocation ----------------- */
/* Writes magic^page into the first 8 bytes of each 4 KiB page of the probe's
 * own allocation [va, va+len), then scans RM object `h` (in OUR client) at
 * 4 KiB stride.  Returns the offset of va in h, or -1. */
static const uint64_t MAGIC = 0x6764727079000000ull;
static void stamp(CUdeviceptr va, size_t len, uint64_t tag)
{
    for (size_t o = 0; o < len; o += 4096) {
        uint64_t v = MAGIC ^ tag ^ (o / 4096);
        cuMemcpyHtoD(va + o, &v, 8);
    }
}
static int64_t locate(uint32_t h, uint64_t objsz, uint64_t tag, size_t len)
{
    if (!objsz) objsz = 64ull << 20;
    if (objsz > (256ull << 20)) objsz = 256ull << 20; /* scan the first 256 MiB */
    void *ck = NULL;
    uint8_t *mm = shim_map(h, 0, objsz, &ck);
    if (!mm) {
        printf("FACT   map of 0x%x (%llu B) failed: %s\n", h, (unsigned long long)objsz,
               shim_err());
        return -2;
    }
    int64_t found = -1;
    for (uint64_t o = 0; o < objsz && found < 0; o += 4096) {
        uint64_t v = *(volatile uint64_t *)(mm + o);
        uint64_t d = v ^ MAGIC ^ tag;
        if (d < len / 4096 && (v & 0xffffffffff000000ull) == ((MAGIC ^ tag) & 0xffffffffff000000ull))
            found = (int64_t)(o - d * 4096);
    }
    shim_unmap(h, ck);
    return found;
}

/* fdpool focus: the words around every place the mapping base sits in the
 * pool's memory, with the RM class of each (GET_HANDLE_INFO on CUDA's fd),
 * and whether a LOCAL_USER among them is the chunk the pool's export holds
 * (NV0000_CTRL_CMD_CLIENT_OBJECTS_ARE_DUPLICATES on our client). */
static void focus_places(int cfd, uint32_t cc, uint64_t root, uint64_t mbase, uint32_t himport)
{
    enum { MAXN = 800 };
    node_t *q = calloc(MAXN, sizeof *q);
    int qn = 0, shown = 0;
    q[qn++] = (node_t){root, -1, 0, 0};
    for (int i = 0; i < qn && shown < 6; i++) {
        size_t len = q[i].level == 0 ? 1024 : 512;
        uint8_t blk[1024];
        if (safe_read(q[i].addr, blk, len)) continue;
        for (size_t o = 0; o + 8 <= len; o += 8) {
            uint64_t y;
            memcpy(&y, blk + o, 8);
            if (y == mbase && shown < 6) {
                char ps[256];
                path_str(q, i, (int)o, ps, sizeof ps);
                printf("PLACE #%d block %d %s (level %d):", shown, i, ps, q[i].level);
                int lo = (int)o - 64 < 0 ? 0 : (int)o - 64, hi = (int)o + 128 > (int)len ? (int)len : (int)o + 128;
                for (int z = lo; z + 4 <= hi; z += 4) {
                    uint32_t x;
                    memcpy(&x, blk + z, 4);
                    uint64_t cls = 0;
                    uint32_t st = x ? handle_info(cfd, cc, x, 2, &cls) : 1;
                    if (st == 0) {
                        printf(" [%+d]=%x(c%llx", z - (int)o, x, (unsigned long long)cls);
                        if (cls == 0x40 && himport) {
                            uint32_t hd = 0;
                            if (!shim_dup(cc, x, &hd)) {
                                struct {
                                    uint32_t a, b;
                                    uint8_t dup, pad[3];
                                } od = {himport, hd, 0, {0}};
                                uint32_t s2 = shim_ctl(OURFD, OURCLI, OURCLI, 0xd07, &od, 12);
                                printf(",dupOfExport=%u st%x", od.dup, s2);
                                shim_free(hd);
                            }
                        }
                        printf(")");
                    } else if (x && z != (int)o && z != (int)o + 4) {
                        printf(" [%+d]=%x", z - (int)o, x);
                    }
                }
                printf("\n");
                shown++;
            }
            if (q[i].level < 4 && qn < MAXN && y >= 0x10000 && y < (1ull << 47) && (y & 7) == 0)
                q[qn++] = (node_t){y, i, (int)o, q[i].level + 1};
        }
    }
    printf("FACT focus: %d blocks, %d places of 0x%llx\n", qn, shown, (unsigned long long)mbase);
    free(q);
}

static uint32_t CC;
static int CC_FD = -1; /* the fd that owns CUDA's client */

/* Objects new since `before`, classes and sizes, and which backs [va,+len). */
static uint32_t newobjs(const char *what, obj_t *before, int nb, CUdeviceptr va, size_t len,
                        uint64_t tag, int64_t *off_out)
{
    uint32_t backing = 0;
    int shown = 0;
    for (int i = 0; i < nobjs; i++) {
        if (has_obj(before, nb, &objs[i])) continue;
        uint32_t st = 0, as = 0, at = 0;
        uint64_t sz = obj_size(objs[i].fd, objs[i].cli, objs[i].h, &st, &as, &at);
        if (shown++ < 6)
            printf("OBJ %s new 0x%x (client 0x%x) class 0x%x parent 0x%x size 0x%llx (st 0x%x aspace %u attr "
                   "0x%x)\n",
                   what, objs[i].h, objs[i].cli, objs[i].cls, objs[i].parent, (unsigned long long)sz, st, as,
                   at);
        if (objs[i].cls != 0x40 || !len || backing) continue;
        uint32_t hd = 0;
        if (shim_dup(objs[i].cli, objs[i].h, &hd)) {
            printf("FACT   dup 0x%x failed: %s\n", objs[i].h, shim_err());
            continue;
        }
        int64_t off = locate(hd, sz, tag, len);
        printf("BACK %s: object 0x%x size 0x%llx: va 0x%llx at offset %lld\n", what, objs[i].h,
               (unsigned long long)sz, (unsigned long long)va, (long long)off);
        if (off >= 0) {
            backing = objs[i].h;
            *off_out = off;
        }
        shim_free(hd);
    }
    printf("FACT %s: %d new objects\n", what, shown);
    return backing;
}

static void attrs(const char *what, CUdeviceptr p, uint64_t *mb, uint64_t *ms)
{
    uint64_t b = 0, s = 0, pool = 0, bid = 0;
    CUresult r1 = cuPointerGetAttribute(&b, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, p);
    CUresult r2 = cuPointerGetAttribute(&s, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, p);
    cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p);
    cuPointerGetAttribute(&bid, CU_POINTER_ATTRIBUTE_BUFFER_ID, p);
    CUdeviceptr ab = 0;
    size_t as = 0;
    CUresult r3 = cuMemGetAddressRange(&ab, &as, p);
    CUmemGenericAllocationHandle ah = 0;
    CUresult r4 = cuMemRetainAllocationHandle(&ah, (void *)(uintptr_t)p);
    if (!r4) cuMemRelease(ah);
    CUipcMemHandle ih;
    CUresult r5 = cuIpcGetMemHandle(&ih, p);
    FACT("%s: va 0x%llx mapping [0x%llx +0x%llx] (%s/%s) range [0x%llx +0x%zx] (%s) pool 0x%llx "
         "buffer_id %llu retain %s ipc %s",
         what, (unsigned long long)p, (unsigned long long)b, (unsigned long long)s, cuerr(r1),
         cuerr(r2), (unsigned long long)ab, as, cuerr(r3), (unsigned long long)pool,
         (unsigned long long)bid, cuerr(r4), cuerr(r5));
    if (!r5) {
        uint32_t w[16];
        memcpy(w, ih.reserved, 64);
        printf("FACT %s ipc words:", what);
        for (int i = 0; i < 16; i++) printf(" %x", w[i]);
        printf("\n");
    }
    *mb = b;
    *ms = s;
}


int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (cuInit(0)) return 2;
    CUdevice dev;
    CUcontext C;
    cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&C, dev);
    cuCtxSetCurrent(C);
    char ver[64];
    OURFD = shim_open(0, ver, sizeof ver, &OURCLI, &OURDEV);
    if (OURFD < 0) {
        printf("FACT session failed: %s\n", shim_err());
        return 2;
    }
    FACT("driver %s, our client 0x%x device 0x%x", ver, OURCLI, OURDEV);
    find_cuda_fds();

    /* CUDA's client from a cuMemAlloc's IPC words */
    CUdeviceptr a1 = 0;
    cuMemAlloc(&a1, 1 << 20);
    uint64_t mb, ms;
    attrs("cuMemAlloc", a1, &mb, &ms);
    CUipcMemHandle ih;
    cuIpcGetMemHandle(&ih, a1);
    uint32_t w[16];
    memcpy(w, ih.reserved, 64);
    CC = w[12];
    uint32_t HM = w[13];
    for (int i = 0; i < n_cuda_fds; i++) {
        uint64_t cls = 0;
        uint32_t st = handle_info(cuda_fds[i], CC, HM, 2, &cls);
        FACT("GET_HANDLE_INFO(client 0x%x, 0x%x) via fd %d: st 0x%x class 0x%llx", CC, HM,
             cuda_fds[i], st, (unsigned long long)cls);
        if (st == 0 && CC_FD < 0) CC_FD = cuda_fds[i];
    }
    {
        uint64_t cls = 0;
        uint32_t st = handle_info(OURFD, CC, HM, 2, &cls);
        FACT("GET_HANDLE_INFO(client 0x%x) via OUR fd: st 0x%x (%s)", CC, st, shim_status(st));
    }
    if (CC_FD < 0) {
        FACT("no fd owns CUDA's client: stop");
        return 1;
    }
    /* other clients on CUDA's fds */
    for (int i = 0; i < n_cuda_fds; i++)
        for (uint32_t c = 0xc1d00000u; c < 0xc1d00000u + 0x800; c++) {
            uint64_t cls = 0;
            uint32_t st = handle_info(cuda_fds[i], c, c, 2, &cls);
            if (st == 0) {
                FACT("fd %d owns client 0x%x", cuda_fds[i], c);
                if (nown < 8) {
                    own_fd[nown] = cuda_fds[i];
                    own_cli[nown++] = c;
                }
            }
        }
    {
        int have = 0;
        for (int i = 0; i < nown; i++) have |= own_cli[i] == CC;
        if (!have && nown < 8) {
            own_fd[nown] = CC_FD;
            own_cli[nown++] = CC;
        }
    }
    win_lo[nwin] = HM & 0xfffe0000u;
    win_n[nwin++] = 0x20000;
    if ((HM & 0xfffe0000u) != 0x5c000000u) {
        win_lo[nwin] = 0x5c000000u;
        win_n[nwin++] = 0x4000;
    }
    if ((HM & 0xfffe0000u) != 0xcaf00000u) {
        win_lo[nwin] = 0xcaf00000u;
        win_n[nwin++] = 0x4000;
    }
    FACT("cuMemAlloc IPC: client 0x%x object 0x%x; scanning %d handle windows", CC, HM, nwin);
    scan_all();
    {
        int cnt[8] = {0};
        uint32_t cl[8] = {0x40, 0x3e, 0x50a0, 0x90f1, 0x80, 0x2080, 0x503c, 0x71};
        for (int i = 0; i < nobjs; i++)
            for (int k = 0; k < 8; k++)
                if (objs[i].cls == cl[k]) cnt[k]++;
        FACT("client 0x%x: %d objects in windows; LOCAL_USER %d SYSMEM %d VIRTUAL %d VASPACE %d "
             "DEVICE %d SUBDEV %d P2P503C %d OSDESC %d",
             CC, nobjs, cnt[0], cnt[1], cnt[2], cnt[3], cnt[4], cnt[5], cnt[6], cnt[7]);
        int shown = 0;
        for (int i = 0; i < nobjs; i++)
            if (objs[i].cls != 0x40 && objs[i].cls != 0x3e && shown++ < 12)
                printf("OBJ 0x%x class 0x%x parent 0x%x\n", objs[i].h, objs[i].cls, objs[i].parent);
        /* PTE info of the cuMemAlloc VA on each VA space */
        for (int i = 0; i < nobjs; i++)
            if (objs[i].cls == 0x90f1) {
                uint8_t p[184];
                memset(p, 0, sizeof p);
                uint64_t va = a1;
                memcpy(p, &va, 8);
                p[12] = 1;
                memcpy(p + 176, &objs[i].h, 4);
                uint32_t st = ctl(objs[i].fd, objs[i].cli, objs[i].parent, 0x801801, p, sizeof p, NULL);
                uint64_t ps0, ps1;
                uint32_t fl0, fl1;
                memcpy(&ps0, p + 16, 8);
                memcpy(&fl0, p + 16 + 24, 4);
                memcpy(&ps1, p + 48, 8);
                memcpy(&fl1, p + 48 + 24, 4);
                FACT("GET_PTE_INFO(va 0x%llx, vaspace 0x%x on 0x%x): st 0x%x blk0 ps 0x%llx "
                     "flags 0x%x blk1 ps 0x%llx flags 0x%x",
                     (unsigned long long)va, objs[i].h, objs[i].parent, st,
                     (unsigned long long)ps0, fl0, (unsigned long long)ps1, fl1);
            }
    }
    /* the cuMemAlloc's object: size & offset rule */
    {
        uint32_t st, as, at;
        uint64_t sz = obj_size(CC_FD, CC, HM, &st, &as, &at);
        FACT("cuMemAlloc object 0x%x size 0x%llx st 0x%x aspace %u attr 0x%x; ipc off word 0x%x",
             HM, (unsigned long long)sz, st, as, at, w[7]);
    }

    obj_t *before = malloc(sizeof objs);
    CUstream s;
    cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);

    /* 1. default pool */
    for (int pass = 0; pass < 2; pass++) {
        memcpy(before, objs, sizeof objs);
        int nb = nobjs;
        CUdeviceptr p = 0;
        size_t len = pass ? (3 << 20) : (1 << 20);
        CUresult r = cuMemAllocAsync(&p, len, s);
        cuStreamSynchronize(s);
        FACT("default pool alloc %zu: %s", len, cuerr(r));
        if (r) break;
        attrs("defpool", p, &mb, &ms);
        stamp(p, len, 0x100 * (pass + 1));
        scan_all();
        int64_t off = -1;
        uint32_t b = newobjs("defpool", before, nb, p, len, 0x100 * (pass + 1), &off);
        if (!b) { /* maybe an existing object backs it */
            for (int i = 0; i < nobjs && !b; i++) {
                if (objs[i].cls != 0x40) continue;
                uint32_t hd = 0, st;
                uint64_t sz = obj_size(objs[i].fd, objs[i].cli, objs[i].h, &st, NULL, NULL);
                if (sz < len || shim_dup(objs[i].cli, objs[i].h, &hd)) continue;
                int64_t o = locate(hd, sz, 0x100 * (pass + 1), len);
                shim_free(hd);
                if (o >= 0) {
                    b = objs[i].h;
                    off = o;
                    printf("BACK defpool (existing) object 0x%x size 0x%llx offset %lld\n", b,
                           (unsigned long long)sz, (long long)o);
                }
            }
        }
        FACT("defpool pass %d: va 0x%llx mapping base 0x%llx: backing 0x%x offset 0x%llx "
             "(va-mbase 0x%llx)",
             pass, (unsigned long long)p, (unsigned long long)mb, b, (unsigned long long)off,
             (unsigned long long)(p - mb));
        CUmemoryPool pool = 0;
        cuDeviceGetDefaultMemPool(&pool, dev);
        uint64_t v64[3] = {p, mb, ms};
        uint32_t v32[2] = {b, CC};
        bfs("defpool-handle", (uint64_t)(uintptr_t)pool, v64, 3, v32, b ? 2 : 0);
        if (pass == 0) focus_places(CC_FD, CC, (uint64_t)(uintptr_t)pool, mb, 0);
        cuMemFreeAsync(p, s);
        cuStreamSynchronize(s);
    }

    /* 2. pools with POSIX_FD and with no handle type */
    for (int which = 0; which < 2; which++) {
        CUmemPoolProps pp;
        memset(&pp, 0, sizeof pp);
        pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        pp.handleTypes = which == 0 ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
        pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        pp.location.id = 0;
        CUmemoryPool pool;
        CUresult r = cuMemPoolCreate(&pool, &pp);
        const char *nm = which == 0 ? "fdpool" : "nonepool";
        FACT("%s create: %s", nm, cuerr(r));
        if (r) continue;
        memcpy(before, objs, sizeof objs);
        int nb = nobjs;
        CUdeviceptr p = 0;
        size_t len = 1 << 20;
        r = cuMemAllocFromPoolAsync(&p, len, pool, s);
        cuStreamSynchronize(s);
        FACT("%s alloc: %s", nm, cuerr(r));
        if (r) continue;
        attrs(nm, p, &mb, &ms);
        stamp(p, len, 0x300 + which);
        scan_all();
        int64_t off = -1;
        uint32_t b = newobjs(nm, before, nb, p, len, 0x300 + which, &off);
        FACT("%s: backing 0x%x offset 0x%llx (va-mbase 0x%llx)", nm, b, (unsigned long long)off,
             (unsigned long long)(p - mb));
        uint64_t v64[3] = {p, mb, ms};
        uint32_t v32[2] = {b, CC};
        bfs(nm, (uint64_t)(uintptr_t)pool, v64, 3, v32, b ? 2 : 0);
        if (which == 0) {
            int fd = -1;
            r = cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
            FACT("fdpool export: %s fd %d", cuerr(r), fd);
            CUmemPoolPtrExportData ed;
            memset(&ed, 0, sizeof ed);
            CUresult r2 = cuMemPoolExportPointer(&ed, p);
            uint32_t ew[16];
            memcpy(ew, &ed, 64);
            printf("FACT fdpool export pointer %s:", cuerr(r2));
            for (int i = 0; i < 16; i++) printf(" %x", ew[i]);
            printf("\n");
            uint32_t himp = 0;
            if (!r && fd >= 0) {
                uint16_t maxo = 0;
                uint32_t devinst = 0;
                uint8_t meta[64];
                uint32_t st = shim_export_info(fd, &maxo, &devinst, meta);
                printf("FACT   export info st 0x%x maxObjects %u metadata", st, maxo);
                for (int i = 0; i < 16; i++) printf(" %02x", meta[i]);
                printf("\n");
                int types[4] = {0};
                for (int idx = 0; idx < maxo && idx < 64; idx++) {
                    uint32_t h = 0;
                    uint8_t type = 0;
                    uint32_t s2 = shim_import(fd, idx, &h, &type);
                    if (s2 == 0 && type < 4) types[type]++;
                    if (s2 == 0 && type == 1 && !himp) {
                        himp = h;
                        uint32_t st2;
                        uint64_t sz = obj_size(OURFD, OURCLI, h, &st2, NULL, NULL);
                        int64_t o = locate(h, sz, 0x300, len);
                        printf("BACK fdpool import index %d (0x%x) size 0x%llx: offset %lld\n", idx, h,
                               (unsigned long long)sz, (long long)o);
                    } else if (s2 == 0) {
                        shim_free(h);
                    }
                }
                printf("FACT   imports of 64 indices: type0 %d type1 %d type2 %d\n", types[0],
                       types[1], types[2]);
                close(fd);
            }
            focus_places(CC_FD, CC, (uint64_t)(uintptr_t)pool, mb, himp);
            if (himp) shim_free(himp);
        }
        cuMemFreeAsync(p, s);
        cuStreamSynchronize(s);
        cuMemPoolDestroy(pool);
    }

    /* 3. VMM without handle type: where CUDA keeps the RM handle */
    if (!getenv("PROBE_POOLS_ONLY")) {
        memcpy(before, objs, sizeof objs);
        int nb = nobjs;
        CUmemAllocationProp pr;
        memset(&pr, 0, sizeof pr);
        pr.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        pr.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        pr.location.id = 0;
        pr.allocFlags.gpuDirectRDMACapable = 1;
        size_t len = 2 << 20;
        CUmemGenericAllocationHandle h;
        CUresult r = cuMemCreate(&h, len, &pr, 0);
        CUdeviceptr va = 0;
        if (!r) r = cuMemAddressReserve(&va, len, 0, 0, 0);
        if (!r) r = cuMemMap(va, len, 0, h, 0);
        CUmemAccessDesc ad = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        if (!r) r = cuMemSetAccess(va, len, &ad, 1);
        FACT("vmm none: %s handle 0x%llx", cuerr(r), (unsigned long long)h);
        if (!r) {
            stamp(va, len, 0x500);
            scan_all();
            int64_t off = -1;
            uint32_t b = newobjs("vmm", before, nb, va, len, 0x500, &off);
            uint64_t v64[1] = {va};
            uint32_t v32[2] = {b, CC};
            bfs("vmm-handle", (uint64_t)h, v64, 1, v32, b ? 2 : 0);
            cuMemUnmap(va, len);
            cuMemAddressFree(va, len);
            cuMemRelease(h);
        }
    }
    FACT("probe done");
    shim_close();
    return 0;
}
