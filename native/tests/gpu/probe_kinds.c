/*
 * probe_kinds.c - one GPU run decides which memory kinds the nvrm backend
 * pins, and records the driver facts behind each answer.
 *
 * For every allocation kind (cuMemAlloc, cuMemAllocPitch, cuMemCreate with
 * and without handle types / RDMA flag, two chunks in one VA range,
 * stream-ordered pools: default, POSIX_FD, none; managed):
 *   FACT lines: pointer attributes, cuMemRetainAllocationHandle, export to
 *     POSIX fd, dma-buf, legacy IPC words, pool exports, and the words
 *     behind CUDA's opaque allocation handle;
 *   one table row: pin (gdrpy, nvrm backend) / map / BAR write checked by
 *     cuMemcpyDtoH / cuMemcpyHtoD checked by BAR read / copy-engine put+get /
 *     behaviour when CUDA frees the memory while mapped.
 * Then issue 18's pins by GPU page (UCX's range rule) around small
 * cuMemAlloc allocations, with neighbours checked untouched.
 *
 * Build + run: native/tests/gpu/run_probe_kinds.sh [outdir]
 * Exit status: 0 unless a check that must hold failed (a kind being
 * refused is a result, not a failure; a refusal without a reason, a pin
 * that maps wrong data, or a neighbour changed, are failures).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "gdrpy.h"

#define PAGE 65536ull
static int n_bad;
static gdrpy_ctx_t G;
static CUcontext C;

static const char *cuerr(CUresult r)
{
    const char *s = NULL;
    cuGetErrorName(r, &s);
    return s ? s : "?";
}

#define FACT(...)            \
    do {                     \
        printf("FACT ");     \
        printf(__VA_ARGS__); \
        printf("\n");        \
    } while (0)
#define BAD(...)             \
    do {                     \
        n_bad++;             \
        printf("BAD ");      \
        printf(__VA_ARGS__); \
        printf("\n");        \
    } while (0)

static int safe_read(uint64_t addr, void *buf, size_t n)
{
    if (addr < 4096) return -1;
    struct iovec l = {buf, n}, r = {(void *)(uintptr_t)addr, n};
    ssize_t k = process_vm_readv(getpid(), &l, 1, &r, 1, 0);
    if (k == (ssize_t)n) return 0;
    if (k >= 0 || errno == EFAULT) return -1;
    int pfd[2]; /* process_vm_readv refused: write(2) gives EFAULT, never a fault */
    if (n > 4096 || pipe(pfd) != 0) return -1;
    int ok = write(pfd[1], (const void *)(uintptr_t)addr, n) == (ssize_t)n &&
             read(pfd[0], buf, n) == (ssize_t)n;
    close(pfd[0]);
    close(pfd[1]);
    return ok ? 0 : -1;
}

/* ---- allocation kinds ------------------------------------------------- */
typedef struct kind {
    const char *name;
    CUdeviceptr ptr; /* what the user pins */
    size_t size;
    /* for freeing */
    int type; /* 0 cuMemAlloc, 1 vmm, 2 pool, 3 managed */
    CUdeviceptr va;
    size_t va_size;
    CUmemGenericAllocationHandle h[2];
    int nh;
    CUmemoryPool pool;
    CUstream st;
    CUdeviceptr extra; /* pool: an earlier allocation, so ptr sits at an offset */
} kind;

static CUresult vmm_alloc(kind *k, size_t size, int htype, int rdma, int nchunks)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = (CUmemAllocationHandleType)htype;
    prop.allocFlags.gpuDirectRDMACapable = (unsigned char)rdma;
    size_t gran = 0;
    CUresult r = cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r) return r;
    size_t chunk = (size + gran - 1) / gran * gran;
    k->va_size = chunk * (size_t)nchunks;
    if ((r = cuMemAddressReserve(&k->va, k->va_size, 0, 0, 0))) return r;
    for (int i = 0; i < nchunks; i++) {
        if ((r = cuMemCreate(&k->h[i], chunk, &prop, 0))) return r;
        k->nh++;
        if ((r = cuMemMap(k->va + (size_t)i * chunk, chunk, 0, k->h[i], 0))) return r;
    }
    CUmemAccessDesc ad;
    memset(&ad, 0, sizeof ad);
    ad.location = prop.location;
    ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((r = cuMemSetAccess(k->va, k->va_size, &ad, 1))) return r;
    k->type = 1;
    k->ptr = k->va;
    k->size = size * (size_t)nchunks <= k->va_size ? size * (size_t)nchunks : k->va_size;
    if (nchunks > 1) k->size = k->va_size;
    return CUDA_SUCCESS;
}

/* which: 0 default, 1 POSIX_FD, 2 none, 3 as RMM's cuda_async_memory_resource
 * creates its pool (no handle type, release threshold = total memory), 4 default pool
 * with an earlier 64 KiB allocation (ptr at an offset in the chunk) */
static CUresult pool_alloc(kind *k, size_t size, int which)
{
    CUresult r;
    if ((r = cuStreamCreate(&k->st, CU_STREAM_NON_BLOCKING))) return r;
    int dflt = which == 0 || which == 4;
    if (which == 4 && (r = cuMemAllocAsync(&k->extra, 64 << 10, k->st))) return r;
    if (dflt) {
        if ((r = cuDeviceGetDefaultMemPool(&k->pool, 0))) return r;
    } else {
        CUmemPoolProps pp;
        memset(&pp, 0, sizeof pp);
        pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        pp.handleTypes = which == 1 ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
        pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        pp.location.id = 0;
        if ((r = cuMemPoolCreate(&k->pool, &pp))) {
            k->pool = NULL;
            return r;
        }
        if (which == 3) {
            size_t tot = 0; /* RMM sets the device's total memory */
            cuDeviceTotalMem(&tot, 0);
            cuuint64_t thr = tot ? tot : ~(cuuint64_t)0;
            if ((r = cuMemPoolSetAttribute(k->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr)))
                return r;
        }
    }
    r = dflt ? cuMemAllocAsync(&k->ptr, size, k->st)
             : cuMemAllocFromPoolAsync(&k->ptr, size, k->pool, k->st);
    if (r) return r;
    k->size = size;
    k->type = 2;
    return cuStreamSynchronize(k->st);
}

static CUresult do_free(kind *k)
{
    CUresult r = CUDA_SUCCESS;
    switch (k->type) {
    case 0: r = cuMemFree(k->ptr); break;
    case 1:
        r = cuMemUnmap(k->va, k->va_size);
        for (int i = 0; i < k->nh; i++) cuMemRelease(k->h[i]);
        cuMemAddressFree(k->va, k->va_size);
        break;
    case 2:
        if (k->extra) cuMemFreeAsync(k->extra, k->st);
        k->extra = 0;
        r = cuMemFreeAsync(k->ptr, k->st);
        if (!r) r = cuStreamSynchronize(k->st);
        break;
    case 3: r = cuMemFree(k->ptr); break;
    }
    k->type = -1;
    return r;
}

static void cleanup(kind *k)
{
    if (k->type >= 0 && k->ptr) do_free(k);
    if (k->pool && strncmp(k->name, "pool_default", 12) != 0) cuMemPoolDestroy(k->pool);
    if (k->st) cuStreamDestroy(k->st);
}

/* ---- facts ------------------------------------------------------------ */
static void facts(kind *k)
{
    CUpointer_attribute at[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
                                CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE,
                                CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                                CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
                                CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE};
    const char *an[] = {"memtype", "legacy_ipc", "handle_types", "rdma", "range_start",
                        "range_size", "mapping_base", "mapping_size", "mempool"};
    char line[1024];
    size_t u = 0;
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        uint64_t v = 0;
        CUresult r = cuPointerGetAttribute(&v, at[i], k->ptr);
        u += (size_t)snprintf(line + u, sizeof line - u, " %s=%s%llx", an[i],
                              r ? cuerr(r) : "0x", r ? 0ull : (unsigned long long)v);
        if (u >= sizeof line) break;
    }
    FACT("%s ptr=0x%llx size=%zu%s", k->name, (unsigned long long)k->ptr, k->size, line);

    CUipcMemHandle ih;
    CUresult r = cuIpcGetMemHandle(&ih, k->ptr);
    if (r == CUDA_SUCCESS) {
        uint32_t w[16];
        memcpy(w, ih.reserved, sizeof w);
        FACT("%s ipc words: size 0x%x objpages 0x%x off 0x%x client 0x%x object 0x%x", k->name,
             w[4], w[6], w[7], w[12], w[13]);
    } else {
        FACT("%s cuIpcGetMemHandle: %s", k->name, cuerr(r));
    }
    CUmemGenericAllocationHandle h = 0;
    r = cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)k->ptr);
    FACT("%s cuMemRetainAllocationHandle: %s handle=0x%llx", k->name, cuerr(r),
         (unsigned long long)h);
    if (r == CUDA_SUCCESS) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        CUresult r2 = cuMemGetAllocationPropertiesFromHandle(&prop, h);
        FACT("%s props: %s requestedHandleTypes=0x%x rdma=%u location=%d/%d", k->name,
             cuerr(r2), (unsigned)prop.requestedHandleTypes,
             (unsigned)prop.allocFlags.gpuDirectRDMACapable, (int)prop.location.type,
             prop.location.id);
        int fd = -1;
        r2 = cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        FACT("%s export POSIX_FD: %s fd=%d", k->name, cuerr(r2), fd);
        if (fd >= 0) close(fd);
        uint32_t words[64];
        if (safe_read((uint64_t)h, words, sizeof words) == 0) {
            char s[64 * 9 + 1];
            for (int i = 0; i < 64; i++) snprintf(s + i * 9, 10, " %08x", words[i]);
            FACT("%s handle words:%s", k->name, s);
        } else {
            FACT("%s handle words: not readable (not an address)", k->name);
        }
        cuMemRelease(h);
    }
    int dfd = -1;
    r = cuMemGetHandleForAddressRange(&dfd, k->ptr,
                                      (k->size + 4095) & ~4095ull,
                                      CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    FACT("%s dma-buf export: %s", k->name, cuerr(r));
    if (dfd >= 0) close(dfd);
    if (k->type == 2 && k->pool) {
        int pfd = -1;
        r = cuMemPoolExportToShareableHandle(&pfd, k->pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        FACT("%s cuMemPoolExportToShareableHandle(POSIX_FD): %s", k->name, cuerr(r));
        if (pfd >= 0) close(pfd);
        CUmemPoolPtrExportData ed;
        r = cuMemPoolExportPointer(&ed, k->ptr);
        FACT("%s cuMemPoolExportPointer: %s", k->name, cuerr(r));
    }
}

/* ---- the pin/map/write/read/put/get/free row --------------------------- */
static void row(kind *k, int expect_ok)
{
    char res[8][24];
    for (int i = 0; i < 8; i++) strcpy(res[i], "-");
    const char *msg = "";
    static char msgbuf[1024];
    gdrpy_pin_t pin = 0;
    int rc = gdrpy_pin(G, k->ptr, k->size, 0, &pin);
    if (rc) {
        snprintf(res[0], sizeof res[0], "REFUSED %s", gdrpy_strerror(rc));
        snprintf(msgbuf, sizeof msgbuf, "%s", gdrpy_last_error());
        msg = msgbuf;
        if (expect_ok == 1) BAD("%s: pin refused: %s", k->name, msg);
        if (!strstr(msg, "because") && strlen(msg) < 40) BAD("%s: refusal without a reason", k->name);
        goto print;
    }
    strcpy(res[0], "ok");
    if (expect_ok == 0) BAD("%s: pin accepted but must be refused", k->name);
    void *mp = NULL, *up = NULL;
    rc = gdrpy_map(G, pin, &mp, &up);
    if (rc) {
        snprintf(res[1], sizeof res[1], "FAIL %s", gdrpy_strerror(rc));
        snprintf(msgbuf, sizeof msgbuf, "%s", gdrpy_last_error());
        msg = msgbuf;
        BAD("%s: map failed: %s", k->name, msg);
        gdrpy_unpin(G, pin);
        goto print;
    }
    strcpy(res[1], "ok");
    size_t n = k->size < (1u << 20) ? k->size : (1u << 20);
    uint8_t *a = malloc(n), *b = malloc(n);
    for (size_t i = 0; i < n; i++) a[i] = (uint8_t)(i * 131 + 7 + k->size);
    /* BAR write, checked by cuMemcpyDtoH */
    rc = gdrpy_write(G, pin, 0, a, n);
    CUresult cr = cuMemcpyDtoH(b, k->ptr, n);
    int ok = !rc && !cr && memcmp(a, b, n) == 0;
    strcpy(res[2], ok ? "ok" : "MISMATCH");
    if (!ok) BAD("%s: BAR write not seen by cuMemcpyDtoH (rc %d, %s)", k->name, rc, cuerr(cr));
    /* cuMemcpyHtoD, checked by BAR read */
    for (size_t i = 0; i < n; i++) a[i] = (uint8_t)(i * 17 + 3);
    cr = cuMemcpyHtoD(k->ptr, a, n);
    if (!cr) cr = cuCtxSynchronize();
    memset(b, 0, n);
    rc = gdrpy_read(G, pin, 0, b, n > 65536 ? 65536 : n);
    ok = !rc && !cr && memcmp(a, b, n > 65536 ? 65536 : n) == 0;
    strcpy(res[3], ok ? "ok" : "MISMATCH");
    if (!ok) BAD("%s: cuMemcpyHtoD not seen through BAR (rc %d, %s)", k->name, rc, cuerr(cr));
    /* copy-engine put + get */
    for (size_t i = 0; i < n; i++) a[i] = (uint8_t)(i * 29 + 11);
    rc = gdrpy_ce_write(G, pin, 0, a, n, NULL);
    memset(b, 0, n);
    int rc2 = gdrpy_ce_read(G, pin, 0, b, n, NULL);
    ok = !rc && !rc2 && memcmp(a, b, n) == 0;
    strcpy(res[4], ok ? "ok" : "FAIL");
    if (!ok) BAD("%s: copy-engine put/get (rc %d/%d: %s)", k->name, rc, rc2, gdrpy_last_error());
    /* range check: one byte past the pin is refused */
    rc = gdrpy_write(G, pin, k->size, a, 1);
    strcpy(res[5], rc == GDRPY_ERANGE ? "ERANGE" : "NOT REFUSED");
    if (rc != GDRPY_ERANGE) BAD("%s: write past the pin returned %d", k->name, rc);
    /* free while mapped: the pin holds the pages (persistent semantics) */
    uint64_t before = 0;
    gdrpy_read(G, pin, 0, &before, 8 <= k->size ? 8 : k->size);
    cr = do_free(k);
    uint64_t after = 0;
    rc = gdrpy_read(G, pin, 0, &after, 8 <= k->size ? 8 : k->size);
    uint64_t pat = 0x0123456789abcdefull;
    rc2 = gdrpy_write(G, pin, 0, &pat, 8 <= k->size ? 8 : k->size);
    snprintf(res[6], sizeof res[6], "%s", !cr && !rc && !rc2 && before == after ? "kept" : cr ? "free failed"
                                                                                              : "CHANGED");
    if (cr) BAD("%s: freeing while mapped failed: %s", k->name, cuerr(cr));
    rc = gdrpy_unmap(G, pin);
    rc2 = gdrpy_unpin(G, pin);
    strcpy(res[7], !rc && !rc2 ? "ok" : "FAIL");
    if (rc || rc2) BAD("%s: unmap/unpin %d/%d: %s", k->name, rc, rc2, gdrpy_last_error());
    free(a);
    free(b);
print:
    printf("ROW %-22s | %-16s | %-4s | %-8s | %-8s | %-4s | %-6s | %-10s | %-4s | %s\n", k->name,
           res[0], res[1], res[2], res[3], res[4], res[5], res[6], res[7], msg);
    fflush(stdout);
}

/* ---- issue 18: pins by GPU page around small allocations -------------- */
static void ucx_pages(void)
{
    size_t sizes[] = {1, 8, 16, 64, 512, 4096, 65536};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t sz = sizes[si];
        enum { N = 6 };
        CUdeviceptr p[N];
        for (int i = 0; i < N; i++) {
            if (cuMemAlloc(&p[i], sz)) {
                BAD("cuMemAlloc(%zu)", sz);
                return;
            }
            uint8_t fill[65536];
            memset(fill, 0x40 + i, sz);
            cuMemcpyHtoD(p[i], fill, sz);
        }
        cuCtxSynchronize();
        int ok_all = 1;
        char note[256] = "";
        for (int t = 0; t < N; t++) {
            uint64_t start = p[t] & ~(PAGE - 1);
            uint64_t end = (p[t] + sz + PAGE - 1) & ~(PAGE - 1);
            gdrpy_pin_t pin;
            int rc = gdrpy_pin(G, start, end - start, 0, &pin);
            if (rc) {
                ok_all = 0;
                snprintf(note, sizeof note, "pin [0x%llx,+0x%llx) refused: %s",
                         (unsigned long long)start, (unsigned long long)(end - start),
                         gdrpy_last_error());
                BAD("ucx page pin size %zu: %s", sz, note);
                break;
            }
            void *mp, *up;
            rc = gdrpy_map(G, pin, &mp, &up);
            uint8_t data[65536];
            memset(data, 0xA0 + t, sz);
            if (!rc) rc = gdrpy_write(G, pin, p[t] - start, data, sz);
            /* one byte past the pinned pages is refused */
            int rr = gdrpy_write(G, pin, end - start, data, 1);
            if (rr != GDRPY_ERANGE) {
                ok_all = 0;
                BAD("size %zu: write past pin gave %d", sz, rr);
            }
            gdrpy_unmap(G, pin);
            gdrpy_unpin(G, pin);
            if (rc) {
                ok_all = 0;
                BAD("ucx page size %zu: map/write %d: %s", sz, rc, gdrpy_last_error());
                break;
            }
            for (int j = 0; j < N; j++) {
                uint8_t got[65536];
                cuMemcpyDtoH(got, p[j], sz);
                uint8_t want = j == t ? (uint8_t)(0xA0 + t) : (uint8_t)(0x40 + j);
                for (size_t x = 0; x < sz; x++)
                    if (got[x] != want) {
                        ok_all = 0;
                        BAD("size %zu: allocation %d byte %zu is 0x%02x, want 0x%02x (target %d)",
                            sz, j, x, got[x], want, t);
                        break;
                    }
            }
            /* restore the target's fill for later targets */
            memset(data, 0x40 + t, sz);
            cuMemcpyHtoD(p[t], data, sz);
            cuCtxSynchronize();
        }
        /* one pin over all of them, when they share one 2 MiB window */
        uint64_t lo = p[0], hi = p[0] + sz;
        for (int i = 1; i < N; i++) {
            if (p[i] < lo) lo = p[i];
            if (p[i] + sz > hi) hi = p[i] + sz;
        }
        lo &= ~(PAGE - 1);
        hi = (hi + PAGE - 1) & ~(PAGE - 1);
        gdrpy_pin_t pin;
        int rc = gdrpy_pin(G, lo, hi - lo, 0, &pin);
        char span[400];
        if (rc) snprintf(span, sizeof span, "refused: %s", gdrpy_last_error());
        else {
            snprintf(span, sizeof span, "ok");
            gdrpy_unpin(G, pin);
        }
        printf("UCX size %-6zu ptrs 0x%llx..0x%llx  per-allocation page pins: %s  one pin over "
               "all [0x%llx, +0x%llx): %s\n",
               sz, (unsigned long long)p[0],
               (unsigned long long)p[N - 1], ok_all ? "ok, neighbours untouched" : "FAILED",
               (unsigned long long)lo, (unsigned long long)(hi - lo), span);
        for (int i = 0; i < N; i++) cuMemFree(p[i]);
    }
    /* interior pointer */
    CUdeviceptr d;
    if (!cuMemAlloc(&d, 3 * PAGE)) {
        gdrpy_pin_t pin;
        int rc = gdrpy_pin(G, d + PAGE + 100, 10, 0, &pin);
        printf("UCX interior pointer 0x%llx+10: %s\n", (unsigned long long)(d + PAGE + 100),
               rc ? gdrpy_last_error() : "ok");
        if (rc) BAD("interior pointer pin refused");
        else gdrpy_unpin(G, pin);
        cuMemFree(d);
    }
    /* reaching past a large allocation's own chunk must be refused */
    if (!cuMemAlloc(&d, 64 << 20)) {
        gdrpy_pin_t pin;
        int rc = gdrpy_pin(G, d, (64 << 20) + PAGE, 0, &pin);
        printf("UCX past a 64 MiB allocation: %s %s\n", rc ? gdrpy_strerror(rc) : "ACCEPTED",
               rc ? gdrpy_last_error() : "");
        if (!rc) {
            BAD("pin past a 64 MiB allocation accepted");
            gdrpy_unpin(G, pin);
        }
        cuMemFree(d);
    }
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    CUresult r = cuInit(0);
    CUdevice dev;
    if (r || (r = cuDeviceGet(&dev, 0)) || (r = cuDevicePrimaryCtxRetain(&C, dev)) ||
        (r = cuCtxSetCurrent(C))) {
        printf("probe_kinds: CUDA unavailable: %s\n", cuerr(r));
        return 2;
    }
    int drv = 0;
    cuDriverGetVersion(&drv);
    int rc = gdrpy_open(0, GDRPY_BACKEND_NVRM, &G);
    if (rc) {
        printf("probe_kinds: gdrpy_open(nvrm): %s\n", gdrpy_last_error());
        return 2;
    }
    gdrpy_ctx_info_t ci;
    gdrpy_ctx_get_info(G, &ci);
    printf("probe_kinds: %s, driver %s, CUDA %d\n", ci.gpu_name, ci.driver_version, drv);

    /* expect: 1 must pin, 0 must be refused, -1 either (research) */
    struct {
        const char *name;
        int expect;
    } plan[] = {
        {"cumemalloc_1MiB", 1},
        {"cumemalloc_16B", 1},
        {"cumemallocpitch", 1},
        {"vmm_fd_rdma", 1},
        {"vmm_none_rdma", -1},
        {"vmm_none", -1},
        {"vmm_fd_2chunks", 1},
        {"pool_default", -1},
        {"pool_default_offset", -1},
        {"pool_fd", -1},
        {"pool_none", -1},
        {"pool_rmm_like", -1},
        {"managed", 0},
    };
    printf("ROW %-22s | %-16s | %-4s | %-8s | %-8s | %-4s | %-6s | %-10s | %-4s | %s\n", "kind",
           "pin", "map", "bar->dtoh", "htod->bar", "ce", "range", "free@map", "unpin", "why");
    for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++) {
        kind k;
        memset(&k, 0, sizeof k);
        k.name = plan[i].name;
        k.type = -1;
        CUresult ar = CUDA_SUCCESS;
        const char *n = k.name;
        if (!strcmp(n, "cumemalloc_1MiB")) {
            ar = cuMemAlloc(&k.ptr, 1 << 20);
            k.size = 1 << 20;
            k.type = 0;
        } else if (!strcmp(n, "cumemalloc_16B")) {
            ar = cuMemAlloc(&k.ptr, 16);
            k.size = 16;
            k.type = 0;
        } else if (!strcmp(n, "cumemallocpitch")) {
            size_t pitch = 0;
            ar = cuMemAllocPitch(&k.ptr, &pitch, 1000, 64, 16);
            k.size = pitch * 64;
            k.type = 0;
        } else if (!strcmp(n, "vmm_fd_rdma")) ar = vmm_alloc(&k, 2 << 20, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1, 1);
        else if (!strcmp(n, "vmm_none_rdma")) ar = vmm_alloc(&k, 2 << 20, 0, 1, 1);
        else if (!strcmp(n, "vmm_none")) ar = vmm_alloc(&k, 2 << 20, 0, 0, 1);
        else if (!strcmp(n, "vmm_fd_2chunks")) ar = vmm_alloc(&k, 2 << 20, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1, 2);
        else if (!strcmp(n, "pool_default")) ar = pool_alloc(&k, 1 << 20, 0);
        else if (!strcmp(n, "pool_fd")) ar = pool_alloc(&k, 1 << 20, 1);
        else if (!strcmp(n, "pool_none")) ar = pool_alloc(&k, 1 << 20, 2);
        else if (!strcmp(n, "pool_rmm_like")) ar = pool_alloc(&k, 1 << 20, 3);
        else if (!strcmp(n, "pool_default_offset")) ar = pool_alloc(&k, 1 << 20, 4);
        else if (!strcmp(n, "managed")) {
            ar = cuMemAllocManaged(&k.ptr, 1 << 20, CU_MEM_ATTACH_GLOBAL);
            k.size = 1 << 20;
            k.type = 3;
        }
        if (ar) {
            printf("ROW %-22s | alloc failed: %s\n", n, cuerr(ar));
            cleanup(&k);
            continue;
        }
        facts(&k);
        if (!strcmp(n, "vmm_fd_2chunks")) {
            /* a pin across the two chunks: one RM object per pin */
            gdrpy_pin_t pin;
            int prc = gdrpy_pin(G, k.ptr + (k.va_size / 2) - PAGE, 2 * PAGE, 0, &pin);
            printf("FACT vmm_fd_2chunks pin across the chunk boundary: %s\n",
                   prc ? gdrpy_last_error() : "ok");
            if (prc) BAD("vmm_fd_2chunks: pin across the seam refused: %s", gdrpy_last_error());
            else gdrpy_unpin(G, pin);
            k.size = k.va_size / 2; /* the row pins the first chunk */
        }
        row(&k, plan[i].expect);
        cleanup(&k);
    }
    ucx_pages();
    uint64_t live = 0;
    gdrpy_ctx_live_objects(G, &live);
    if (live) BAD("%llu RM objects still live after everything was unpinned",
                  (unsigned long long)live);
    gdrpy_close(G);
    printf("probe_kinds: %d bad\n", n_bad);
    return n_bad ? 1 : 0;
}
