/*
 * test_nvrm_backend.c - GPU-only harness for the nvrm backend (and the probes
 * of gdrdrv and dmabuf).  Drives the backend hooks directly with hand-built
 * gp_ctx / gp_pin objects, without core.c.
 *
 * Build and run: tests/gpu/run_backend_test.sh (the backend's sources from
 * src/backends/nvrm/files.mk, with -DGDRPY_NVRM_TESTING, linked with -lcuda).
 *
 * Prints one PASS/FAIL line per check, INFO/TIME lines for what it measured,
 * and exits non-zero if any check failed.
 */
#include <cuda.h>
#include <dirent.h>
#include <errno.h>
#include <immintrin.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include "internal.h"

/* cudadrv.h cannot be included next to cuda.h (both define CUresult...):
 * declare the two helpers used here with compatible types. */
int gp_cuda_memcpy(int device, int dir, uint64_t dptr, void *host, size_t n, void *stream);
int gp_cuda_driver_version(int *v);
extern uint64_t gp_nvrm_test_skew; /* backends/nvrm/route_c.c, -DGDRPY_NVRM_TESTING */

/* ---- tiny test framework --------------------------------------------- */
static int n_pass, n_fail;

static void check(int ok, const char *name, const char *fmt, ...) GP_PRINTF(3, 4);
static void check(int ok, const char *name, const char *fmt, ...)
{
    char msg[1024] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
    }
    if (ok) {
        n_pass++;
        printf("PASS %s%s%s\n", name, msg[0] ? ": " : "", msg);
    } else {
        n_fail++;
        printf("FAIL %s%s%s\n", name, msg[0] ? ": " : "", msg);
    }
    fflush(stdout);
}

#define CU(call)                                                                   \
    do {                                                                           \
        CUresult r_ = (call);                                                      \
        if (r_ != CUDA_SUCCESS) {                                                  \
            const char *s_ = NULL;                                                 \
            cuGetErrorName(r_, &s_);                                               \
            printf("FAIL cuda %s: %s (%d) at line %d\n", #call, s_ ? s_ : "?", r_, \
                   __LINE__);                                                      \
            n_fail++;                                                              \
        }                                                                          \
    } while (0)

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *name, double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    double med = v[n / 2], p99 = v[(int)(n * 0.99) < n ? (int)(n * 0.99) : n - 1];
    if (med >= 10000)
        printf("TIME %-52s median %9.1f us  p99 %9.1f us  (n=%d)\n", name, med / 1e3, p99 / 1e3, n);
    else
        printf("TIME %-52s median %9.0f ns  p99 %9.0f ns  (n=%d)\n", name, med, p99, n);
    fflush(stdout);
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the DIR's own fd */
}

/* ---- hand-built objects ----------------------------------------------- */
static CUdevice cudev;
static CUcontext primary;

static gp_ctx *mkctx(const struct gp_backend *be, int dev, int *rc)
{
    gp_ctx *c = calloc(1, sizeof *c);
    c->device = dev;
    c->be = be;
    c->pid = getpid();
    pthread_mutex_init(&c->lock, NULL);
    *rc = be->open(c);
    if (*rc) {
        free(c);
        return NULL;
    }
    return c;
}

static void rmctx(gp_ctx *c)
{
    c->be->close(c);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static int do_pin(gp_ctx *c, gp_pin *p, uint64_t addr, uint64_t size)
{
    memset(p, 0, sizeof *p);
    p->addr = addr;
    p->size = size;
    return c->be->pin(c, p);
}

/* The invariants the core checks, plus "within the GPU pages of the
 * request". */
static int pin_ok(const gp_pin *p, uint64_t abase, uint64_t asize, char *why, size_t n)
{
    why[0] = '\0';
    if (p->va > p->addr || p->va + p->len < p->addr + p->size) {
        snprintf(why, n, "range [0x%llx,+0x%llx) does not cover the request",
                 (unsigned long long)p->va, (unsigned long long)p->len);
        return 0;
    }
    if ((p->va & 4095) || (p->len & 4095) || p->len == 0) {
        snprintf(why, n, "va/len not host-page multiples");
        return 0;
    }
    /* GDRCopy's extent: no more than the 64 KiB GPU pages the request
     * touches (neighbours of the same chunk may share them; route_c.c). */
    if (p->va < (p->addr & ~0xffffull) ||
        p->va + p->len > ((p->addr + p->size + 0xffff) & ~0xffffull)) {
        snprintf(why, n, "range [0x%llx,+0x%llx) leaves the GPU pages of the request "
                         "(allocation [0x%llx,+0x%llx))",
                 (unsigned long long)p->va, (unsigned long long)p->len,
                 (unsigned long long)abase, (unsigned long long)asize);
        return 0;
    }
    if (p->page_size != 65536) {
        snprintf(why, n, "page_size %u", p->page_size);
        return 0;
    }
    return 1;
}

static inline uint8_t *uptr(const gp_pin *p) { return (uint8_t *)p->map_base + (p->addr - p->va); }

static void wc_write(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
    _mm_sfence();
}

/* Byte-exact reads of WC/UC memory in 8-byte aligned loads. */
static void wc_read(void *dst, const void *src, size_t n)
{
    uintptr_t a = (uintptr_t)src, lo = a & ~7ul, hi = (a + n + 7) & ~7ul;
    uint8_t *tmp = malloc(hi - lo);
    for (uintptr_t x = lo; x < hi; x += 8) {
        uint64_t v = *(const volatile uint64_t *)x;
        memcpy(tmp + (x - lo), &v, 8);
    }
    memcpy(dst, tmp + (a - lo), n);
    free(tmp);
}

static void fill(uint8_t *b, size_t n, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b[i] = (uint8_t)x;
    }
}

/* ---- allocations ------------------------------------------------------- */
typedef struct {
    CUdeviceptr ptr;
    size_t size;
    CUmemGenericAllocationHandle h;
    int vmm;
} dalloc;

static int alloc_vmm(dalloc *a, size_t size, int posix_fd)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = posix_fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                                         : CU_MEM_HANDLE_TYPE_NONE;
    prop.allocFlags.gpuDirectRDMACapable = 1;
    size_t gran = 0;
    if (cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) return -1;
    size = (size + gran - 1) / gran * gran;
    memset(a, 0, sizeof *a);
    a->vmm = 1;
    a->size = size;
    CUresult r = cuMemCreate(&a->h, size, &prop, 0);
    if (r) return r;
    if ((r = cuMemAddressReserve(&a->ptr, size, 0, 0, 0))) return r;
    if ((r = cuMemMap(a->ptr, size, 0, a->h, 0))) return r;
    CUmemAccessDesc ad;
    memset(&ad, 0, sizeof ad);
    ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ad.location.id = 0;
    ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return cuMemSetAccess(a->ptr, size, &ad, 1);
}

static int alloc_dev(dalloc *a, size_t size)
{
    memset(a, 0, sizeof *a);
    a->size = size;
    return cuMemAlloc(&a->ptr, size);
}

static void dfree(dalloc *a)
{
    if (!a->ptr) return;
    if (a->vmm) {
        cuMemUnmap(a->ptr, a->size);
        cuMemAddressFree(a->ptr, a->size);
        cuMemRelease(a->h);
    } else {
        cuMemFree(a->ptr);
    }
    a->ptr = 0;
}

/* ---- tests ------------------------------------------------------------ */

static void test_probes(void)
{
    char why[512];
    int rc = gp_backend_nvrm.probe(0, why, sizeof why);
    check(rc == 0, "nvrm.probe(0) succeeds", "%s", rc ? why : "");
    rc = gp_backend_nvrm.probe(99, why, sizeof why);
    check(rc == GDRPY_ENODEV, "nvrm.probe(99) says ENODEV", "rc=%d why=\"%s\"", rc, why);
    rc = gp_backend_gdrdrv.probe(0, why, sizeof why);
    check(rc != 0 && strstr(why, "/dev/gdrdrv not present"), "gdrdrv.probe(0) explains",
          "rc=%d why=\"%s\"", rc, why);
    rc = gp_backend_dmabuf.probe(0, why, sizeof why);
    printf("INFO dmabuf.probe(0) rc=%d why=\"%s\"\n", rc, rc ? why : "");
}

static void dump_ipc_words(void)
{
    size_t sizes[] = {8, 100, 4096, 65536, 1 << 20, (2 << 20) + 5, 64 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        CUdeviceptr p;
        if (cuMemAlloc(&p, sizes[i])) continue;
        CUdeviceptr b;
        size_t s;
        cuMemGetAddressRange(&b, &s, p);
        CUipcMemHandle h;
        memset(&h, 0, sizeof h);
        CUresult r = cuIpcGetMemHandle(&h, p);
        uint32_t w[16];
        memcpy(w, h.reserved, sizeof w);
        printf("INFO ipc size %-9zu ptr 0x%llx range %zu r=%d w:", sizes[i],
               (unsigned long long)p, s, r);
        for (int k = 0; k < 16; k++) printf(" %x", w[k]);
        printf("\n");
        cuMemFree(p);
    }
    /* with neighbours alive: the offset word moves */
    CUdeviceptr q[4];
    size_t qs[4] = {8, 100, 4096, 65536};
    for (int i = 0; i < 4; i++)
        if (cuMemAlloc(&q[i], qs[i])) q[i] = 0;
    for (int i = 0; i < 4; i++) {
        if (!q[i]) continue;
        CUipcMemHandle h;
        memset(&h, 0, sizeof h);
        CUresult r = cuIpcGetMemHandle(&h, q[i]);
        uint32_t w[16];
        memcpy(w, h.reserved, sizeof w);
        printf("INFO ipc live size %-6zu ptr 0x%llx r=%d w4=%x w6=%x w7=%x w12=%x w13=%x\n", qs[i],
               (unsigned long long)q[i], r, w[4], w[6], w[7], w[12], w[13]);
    }
    for (int i = 0; i < 4; i++)
        if (q[i]) cuMemFree(q[i]);
}

/* Pin whole allocation, map, data both ways at several offsets. */
static void test_data(gp_ctx *c, dalloc *a, const char *tag)
{
    char name[128], why[256];
    uint8_t *buf = malloc(a->size), *back = malloc(a->size);
    fill(buf, a->size, 1);
    CU(cuMemcpyHtoD(a->ptr, buf, a->size));
    CU(cuCtxSynchronize());
    gp_pin p;
    int rc = do_pin(c, &p, a->ptr, a->size);
    snprintf(name, sizeof name, "%s: pin whole allocation (%zu B)", tag, a->size);
    check(rc == 0, name, "%s", rc ? gdrpy_last_error() : "");
    if (rc) goto out;
    snprintf(name, sizeof name, "%s: pinned range is sane", tag);
    check(pin_ok(&p, a->ptr, a->size, why, sizeof why), name, "%s", why);
    rc = c->be->map(c, &p);
    snprintf(name, sizeof name, "%s: map", tag);
    check(rc == 0 && p.map_base && p.map_len >= p.len, name, "%s type=%d",
          rc ? gdrpy_last_error() : "", p.mapping_type);
    if (rc) goto unpin;
    snprintf(name, sizeof name, "%s: map() again says EAGAIN", tag);
    {
        gp_pin q = p;
        int rc2 = c->be->map(c, &q);
        check(rc2 == GDRPY_EAGAIN, name, "rc=%d", rc2);
    }
    /* read through BAR1 what CUDA wrote (first and last 256 bytes) */
    size_t k = a->size < 256 ? a->size : 256;
    uint8_t got[256];
    wc_read(got, uptr(&p), k);
    snprintf(name, sizeof name, "%s: BAR1 read sees cuMemcpyHtoD data (head)", tag);
    check(memcmp(got, buf, k) == 0, name, NULL);
    wc_read(got, uptr(&p) + a->size - k, k);
    snprintf(name, sizeof name, "%s: BAR1 read sees cuMemcpyHtoD data (tail)", tag);
    check(memcmp(got, buf + a->size - k, k) == 0, name, NULL);
    /* writes at odd offsets / sizes through the mapping, checked by DtoH */
    size_t offs[] = {0, 1, 3, 7, 13, 4095, 4097, 65535, 65537, 100003};
    size_t lens[] = {1, 2, 3, 8, 15, 64, 4096 + 5};
    int bad = 0;
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++)
        for (size_t j = 0; j < sizeof lens / sizeof lens[0]; j++) {
            size_t o = offs[i], n = lens[j];
            if (o + n > a->size) continue;
            uint8_t src[4200];
            fill(src, n, (unsigned)(i * 31 + j));
            wc_write(uptr(&p) + o, src, n);
            memcpy(buf + o, src, n);
        }
    CU(cuMemcpyDtoH(back, a->ptr, a->size));
    for (size_t i = 0; i < a->size; i++)
        if (back[i] != buf[i]) {
            bad++;
            if (bad == 1) printf("INFO first mismatch at %zu\n", i);
        }
    snprintf(name, sizeof name, "%s: CPU stores at odd offsets land (cuMemcpyDtoH)", tag);
    check(bad == 0, name, "%d bytes differ", bad);
    /* the reverse: CUDA writes, BAR1 reads at odd offsets */
    bad = 0;
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        size_t o = offs[i], n = 13;
        if (o + n > a->size) continue;
        uint8_t src[13], rd[13];
        fill(src, n, (unsigned)(1000 + i));
        CU(cuMemcpyHtoD(a->ptr + o, src, n));
        CU(cuCtxSynchronize());
        wc_read(rd, uptr(&p) + o, n);
        bad += memcmp(rd, src, n) != 0;
    }
    snprintf(name, sizeof name, "%s: cuMemcpyHtoD at odd offsets visible through BAR1", tag);
    check(bad == 0, name, "%d offsets differ", bad);
    rc = c->be->unmap(c, &p);
    snprintf(name, sizeof name, "%s: unmap", tag);
    check(rc == 0 && !p.map_base, name, "%s", rc ? gdrpy_last_error() : "");
unpin:
    rc = c->be->unpin(c, &p);
    snprintf(name, sizeof name, "%s: unpin", tag);
    check(rc == 0, name, "%s", rc ? gdrpy_last_error() : "");
out:
    free(buf);
    free(back);
}

static void test_subrange(gp_ctx *c)
{
    dalloc a;
    char why[256];
    if (alloc_dev(&a, 4 << 20)) {
        check(0, "subrange: cuMemAlloc 4 MiB", NULL);
        return;
    }
    uint8_t *ref = malloc(a.size), *back = malloc(a.size);
    fill(ref, a.size, 7);
    CU(cuMemcpyHtoD(a.ptr, ref, a.size));
    uint64_t addr = a.ptr + 100000;
    size_t n = 5000;
    gp_pin p;
    int rc = do_pin(c, &p, addr, n);
    check(rc == 0, "subrange: pin 5000 B at +100000", "%s", rc ? gdrpy_last_error() : "");
    if (rc) goto out;
    check(pin_ok(&p, a.ptr, a.size, why, sizeof why), "subrange: range sane", "%s va=+0x%llx len=0x%llx",
          why, (unsigned long long)(p.va - a.ptr), (unsigned long long)p.len);
    check(p.va == (addr & ~0xffffull) && p.len == 0x10000,
          "subrange: range is the covering 64 KiB pages", "va=+0x%llx len=0x%llx",
          (unsigned long long)(p.va - a.ptr), (unsigned long long)p.len);
    rc = c->be->map(c, &p);
    check(rc == 0, "subrange: map", "%s", rc ? gdrpy_last_error() : "");
    if (!rc) {
        uint8_t src[5000];
        fill(src, n, 99);
        wc_write(uptr(&p), src, n);
        memcpy(ref + (addr - a.ptr), src, n);
        CU(cuMemcpyDtoH(back, a.ptr, a.size));
        check(memcmp(back, ref, a.size) == 0, "subrange: write lands, neighbours untouched", NULL);
        c->be->unmap(c, &p);
    }
    c->be->unpin(c, &p);
out:
    dfree(&a);
    free(ref);
    free(back);
}

static void test_small_buffers(gp_ctx *c)
{
    /* (a) two cuMemAlloc(8) allocations */
    dalloc x, y;
    char why[256];
    if (alloc_dev(&x, 8) || alloc_dev(&y, 8)) {
        check(0, "small: cuMemAlloc 8", NULL);
        return;
    }
    printf("INFO small: two cuMemAlloc(8) at 0x%llx and 0x%llx (same 64 KiB page: %s)\n",
           (unsigned long long)x.ptr, (unsigned long long)y.ptr,
           (x.ptr >> 16) == (y.ptr >> 16) ? "yes" : "no");
    uint64_t zx = 0x1111111111111111ull, zy = 0x2222222222222222ull;
    CU(cuMemcpyHtoD(x.ptr, &zx, 8));
    CU(cuMemcpyHtoD(y.ptr, &zy, 8));
    gp_pin px, py;
    int rx = do_pin(c, &px, x.ptr, 8), ry = do_pin(c, &py, y.ptr, 8);
    check(rx == 0 && ry == 0, "small: pin two 8-byte allocations", "%s",
          rx || ry ? gdrpy_last_error() : "");
    if (!rx && !ry) {
        CUdeviceptr b;
        size_t s;
        cuMemGetAddressRange(&b, &s, x.ptr);
        check(pin_ok(&px, b, s, why, sizeof why), "small: first pin stays in the GPU pages of its request",
              "%s va=0x%llx len=0x%llx", why, (unsigned long long)px.va, (unsigned long long)px.len);
        int m1 = c->be->map(c, &px), m2 = c->be->map(c, &py);
        check(m1 == 0 && m2 == 0, "small: map both", "%s", m1 || m2 ? gdrpy_last_error() : "");
        if (!m1 && !m2) {
            uint64_t vx = 0xAAAAAAAA00000001ull, vy = 0xBBBBBBBB00000002ull, rxv = 0, ryv = 0;
            wc_write(uptr(&px), &vx, 8);
            wc_write(uptr(&py), &vy, 8);
            CU(cuMemcpyDtoH(&rxv, x.ptr, 8));
            CU(cuMemcpyDtoH(&ryv, y.ptr, 8));
            check(rxv == vx && ryv == vy, "small: each 8-byte store lands in its own buffer",
                  "x=%llx y=%llx", (unsigned long long)rxv, (unsigned long long)ryv);
        }
        if (!m1) c->be->unmap(c, &px);
        if (!m2) c->be->unmap(c, &py);
    }
    if (!rx) c->be->unpin(c, &px);
    if (!ry) c->be->unpin(c, &py);
    dfree(&x);
    dfree(&y);

    /* (b) GDRCopy's case: two 8-byte buffers inside one GPU page of one allocation */
    dalloc a;
    if (alloc_dev(&a, 65536)) return;
    CU(cuMemsetD8(a.ptr, 0, a.size));
    uint64_t b0 = a.ptr + 8, b1 = a.ptr + 24;
    int r0 = do_pin(c, &px, b0, 8), r1 = do_pin(c, &py, b1, 8);
    check(r0 == 0 && r1 == 0, "small: pin two 8-byte buffers in one GPU page (zeroed memory)", "%s",
          r0 || r1 ? gdrpy_last_error() : "");
    uint64_t z[8];
    CU(cuMemcpyDtoH(z, a.ptr, sizeof z));
    int allzero = 1;
    for (int i = 0; i < 8; i++) allzero &= z[i] == 0;
    check(allzero, "small: pinning zeroed memory wrote nothing (still zero)", NULL);
    if (!r0 && !r1 && !c->be->map(c, &px) && !c->be->map(c, &py)) {
        uint64_t v0 = 0x0123456789abcdefull, v1 = 0xfedcba9876543210ull, g[4];
        wc_write(uptr(&px), &v0, 8);
        wc_write(uptr(&py), &v1, 8);
        CU(cuMemcpyDtoH(g, a.ptr, sizeof g));
        check(g[1] == v0 && g[3] == v1 && g[0] == 0 && g[2] == 0,
              "small: buffers in one page are written independently", NULL);
        c->be->unmap(c, &px);
        c->be->unmap(c, &py);
    }
    if (!r0) c->be->unpin(c, &px);
    if (!r1) c->be->unpin(c, &py);
    dfree(&a);
}

static void test_free_while_pinned(gp_ctx *c, int vmm)
{
    const char *tag = vmm ? "free-while-pinned (route A)" : "free-while-pinned (route C)";
    char name[160];
    dalloc a;
    /* route C: 4 MiB, an RM object of its own. A small cuMemAlloc allocation
     * shares CUDA's chunk with others (the self-test's scratch lives for the
     * process), so CUDA may place a later allocation at the freed bytes of a
     * chunk the pin keeps: the old mapping then reaches that allocation, memory
     * of the same process (docs/security.md). An object of its own is freed
     * with the allocation, and the pin keeps its pages out of CUDA's reach. */
    const size_t csize = 4u << 20;
    int r = vmm ? alloc_vmm(&a, 2 << 20, 1) : alloc_dev(&a, csize);
    if (r) {
        check(0, tag, "alloc failed %d", r);
        return;
    }
    uint8_t pat[256], got[256];
    fill(pat, sizeof pat, 5);
    CU(cuMemcpyHtoD(a.ptr, pat, sizeof pat));
    gp_pin p;
    int rc = do_pin(c, &p, a.ptr, a.size);
    if (!rc) rc = c->be->map(c, &p);
    snprintf(name, sizeof name, "%s: pin+map", tag);
    check(rc == 0, name, "%s", rc ? gdrpy_last_error() : "");
    if (rc) {
        dfree(&a);
        return;
    }
    dfree(&a);
    CU(cuCtxSynchronize());
    wc_read(got, uptr(&p), sizeof got);
    snprintf(name, sizeof name, "%s: old data readable after the free", tag);
    check(memcmp(got, pat, sizeof pat) == 0, name, NULL);
    uint64_t v = 0x5555aaaa5555aaaaull, rv = 0;
    wc_write(uptr(&p) + 64, &v, 8);
    wc_read(&rv, uptr(&p) + 64, 8);
    snprintf(name, sizeof name, "%s: still writable", tag);
    check(rv == v, name, NULL);
    /* a new allocation must not alias the pinned pages */
    dalloc b;
    if (!(vmm ? alloc_vmm(&b, 2 << 20, 1) : alloc_dev(&b, csize))) {
        uint64_t nv = 0x7777777777777777ull;
        CU(cuMemcpyHtoD(b.ptr + 64, &nv, 8));
        CU(cuCtxSynchronize());
        wc_read(&rv, uptr(&p) + 64, 8);
        snprintf(name, sizeof name, "%s: new allocation (0x%llx, old was 0x%llx) does not alias",
                 tag, (unsigned long long)b.ptr, (unsigned long long)p.addr);
        check(rv == v, name, NULL);
        dfree(&b);
    }
    rc = c->be->unmap(c, &p);
    rc |= c->be->unpin(c, &p);
    snprintf(name, sizeof name, "%s: unmap+unpin", tag);
    check(rc == 0, name, "%s", rc ? gdrpy_last_error() : "");
}

static void test_refusals(gp_ctx *c)
{
    gp_pin p;
    int rc;
    CUdeviceptr m;
    if (!cuMemAllocManaged(&m, 65536, CU_MEM_ATTACH_GLOBAL)) {
        rc = do_pin(c, &p, m, 64);
        check(rc == GDRPY_ENOTSUP && strstr(gdrpy_last_error(), "managed"),
              "refuse managed memory with ENOTSUP", "rc=%d \"%s\"", rc, gdrpy_last_error());
        if (!rc) c->be->unpin(c, &p);
        cuMemFree(m);
    }
    void *hm = NULL;
    if (!cuMemHostAlloc(&hm, 65536, 0)) {
        rc = do_pin(c, &p, (uintptr_t)hm, 64);
        check(rc == GDRPY_ENOTSUP && strstr(gdrpy_last_error(), "host memory"),
              "refuse host memory with ENOTSUP", "rc=%d \"%s\"", rc, gdrpy_last_error());
        if (!rc) c->be->unpin(c, &p);
        cuMemFreeHost(hm);
    }
    char *mal = malloc(65536);
    rc = do_pin(c, &p, (uintptr_t)mal, 64);
    check(rc == GDRPY_EINVAL, "refuse a malloc pointer with EINVAL", "rc=%d \"%s\"", rc,
          gdrpy_last_error());
    free(mal);
    dalloc a;
    if (!alloc_dev(&a, 65536)) {
        /* GDRCopy's rule (route_c.c): past the allocation but inside the RM
         * chunk behind it is accepted; past the chunk is refused naming the
         * allowed range */
        rc = do_pin(c, &p, a.ptr + 65536 - 8, 16);
        check(rc == 0 || (rc == GDRPY_EINVAL && strstr(gdrpy_last_error(), "pin within")),
              "a range past the allocation end: pinned in its chunk, or refused naming the "
              "allowed range",
              "rc=%d \"%s\"", rc, gdrpy_last_error());
        if (!rc) c->be->unpin(c, &p);
        dfree(&a);
    }
    if (!alloc_vmm(&a, 2 << 20, 0)) {
        rc = do_pin(c, &p, a.ptr, 4096);
        check(rc == 0 || (rc == GDRPY_ENOTSUP && strstr(gdrpy_last_error(), "what works")),
              "VMM memory without POSIX_FD: route V proven, or refused with the reason",
              "rc=%d \"%s\"", rc, gdrpy_last_error());
        if (!rc) c->be->unpin(c, &p);
        dfree(&a);
    }
    /* two VMM handles mapped back to back: a pin across them maps each GPU
     * page from its own handle (one VA range of several physical chunks is a
     * kind the backend pins: memory-kinds.md), or is refused; never a mapping
     * that shows one handle's memory where the other's lies */
    {
        dalloc v1;
        if (!alloc_vmm(&v1, 2 << 20, 1)) {
            /* reserve 4 MiB, map two separate 2 MiB handles */
            CUdeviceptr base;
            CUmemGenericAllocationHandle h1 = 0, h2 = 0;
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
            if (!cuMemAddressReserve(&base, 4 << 20, 0, 0, 0) &&
                !cuMemCreate(&h1, 2 << 20, &prop, 0) && !cuMemCreate(&h2, 2 << 20, &prop, 0) &&
                !cuMemMap(base, 2 << 20, 0, h1, 0) && !cuMemMap(base + (2 << 20), 2 << 20, 0, h2, 0)) {
                CUmemAccessDesc ad;
                memset(&ad, 0, sizeof ad);
                ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
                ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
                cuMemSetAccess(base, 4 << 20, &ad, 1);
                uint64_t across[2] = {0x5151515151515151ull, 0x6262626262626262ull}, got[2] = {0, 0};
                CU(cuMemcpyHtoD(base + (2 << 20) - 8, &across[0], 8));
                CU(cuMemcpyHtoD(base + (2 << 20), &across[1], 8));
                CU(cuCtxSynchronize());
                rc = do_pin(c, &p, base + (2 << 20) - 8, 16);
                if (rc) {
                    check(rc == GDRPY_EINVAL || rc == GDRPY_ENOTSUP,
                          "a VMM range across two handles: pinned by chunk, or refused",
                          "rc=%d \"%s\"", rc, gdrpy_last_error());
                } else if (!c->be->map(c, &p)) {
                    wc_read(got, uptr(&p), 16);
                    check(got[0] == across[0] && got[1] == across[1],
                          "a VMM range across two handles: each side shows its own handle",
                          "read 0x%016llx 0x%016llx", (unsigned long long)got[0],
                          (unsigned long long)got[1]);
                    c->be->unmap(c, &p);
                } else {
                    check(0, "a VMM range across two handles: map", "%s", gdrpy_last_error());
                }
                if (!rc) c->be->unpin(c, &p);
                /* and a pin in the second handle maps the second handle */
                uint64_t v = 0x4242424242424242ull, rv = 0;
                CU(cuMemcpyHtoD(base + (2 << 20) + 128, &v, 8));
                CU(cuCtxSynchronize());
                rc = do_pin(c, &p, base + (2 << 20) + 128, 8);
                if (!rc && !c->be->map(c, &p)) {
                    wc_read(&rv, uptr(&p), 8);
                    check(rv == v, "pin in the second VMM handle sees the second handle", NULL);
                    c->be->unmap(c, &p);
                } else {
                    check(0, "pin in the second VMM handle", "%s", gdrpy_last_error());
                }
                if (!rc) c->be->unpin(c, &p);
                cuMemUnmap(base, 4 << 20);
            }
            if (h1) cuMemRelease(h1);
            if (h2) cuMemRelease(h2);
            cuMemAddressFree(base, 4 << 20);
            dfree(&v1);
        }
    }
}

/* A wrong RM offset (IPC words that lie) must be refused: by the mapping-
 * base check where the self-test proved CUDA reports it, else by the
 * read-only content compare; and pinning never writes the user's bytes. */
static void test_identity_check(gp_ctx *c)
{
    static char rep[16384];
    gdrpy_nvrm_selftest(0, rep, sizeof rep);
    int mapbase = strstr(rep, "\"mapping_base_checked\": true") != NULL;
    printf("INFO self-test report: %s\n", rep);
    dalloc a;
    if (alloc_dev(&a, 65536)) return;
    gp_pin p;
    uint8_t *pat = malloc(a.size), *back = malloc(a.size);
    fill(pat, a.size, 77);
    CU(cuMemcpyHtoD(a.ptr, pat, a.size));
    CU(cuCtxSynchronize());
    gp_nvrm_test_skew = 4096;
    int rc = do_pin(c, &p, a.ptr + 100, 200);
    check((rc == GDRPY_EIO && strstr(gdrpy_last_error(), "identity check failed")) ||
              (rc == GDRPY_ENOTSUP && strstr(gdrpy_last_error(), "MAPPING_BASE_ADDR")),
          "identity: skewed offset refused (patterned memory)", "rc=%d \"%s\"", rc,
          gdrpy_last_error());
    if (!rc) c->be->unpin(c, &p);
    CU(cuMemsetD8(a.ptr, 0, a.size));
    CU(cuCtxSynchronize());
    rc = do_pin(c, &p, a.ptr + 100, 200);
    if (mapbase)
        check(rc == GDRPY_ENOTSUP && strstr(gdrpy_last_error(), "MAPPING_BASE_ADDR"),
              "identity: skewed offset on zeroed memory refused by the mapping-base check",
              "rc=%d \"%s\"", rc, gdrpy_last_error());
    else /* nothing but the bytes proves the offset, and zeros prove nothing */
        check(rc == GDRPY_ENOTSUP && strstr(gdrpy_last_error(), "0x00"),
              "identity: skewed offset on zeroed memory refused (no mapping-base check on "
              "this CUDA: zeros prove nothing)",
              "rc=%d \"%s\"", rc, gdrpy_last_error());
    if (!rc) c->be->unpin(c, &p);
    CU(cuMemcpyDtoH(back, a.ptr, a.size));
    int nz = 0;
    for (size_t i = 0; i < a.size; i++) nz += back[i] != 0;
    check(nz == 0, "identity: refused pins wrote nothing", "%d non-zero", nz);
    gp_nvrm_test_skew = 0;
    rc = do_pin(c, &p, a.ptr + 4093, 3);
    if (mapbase) /* the words and the mapping base prove it; the bytes cross-check */
        check(rc == 0, "identity: 3 bytes at a page end, zeroed", "%s",
              rc ? gdrpy_last_error() : "");
    else
        check(rc == GDRPY_ENOTSUP && strstr(gdrpy_last_error(), "0x00"),
              "identity: 3 zeroed bytes without a mapping-base check refused", "rc=%d \"%s\"",
              rc, gdrpy_last_error());
    if (!rc) c->be->unpin(c, &p);
    CU(cuMemcpyDtoH(back, a.ptr, a.size));
    nz = 0;
    for (size_t i = 0; i < a.size; i++) nz += back[i] != 0;
    check(nz == 0, "identity: accepted pin wrote nothing", "%d non-zero", nz);
    free(pat);
    free(back);
    dfree(&a);
}

static void test_cycles(gp_ctx *c, int vmm)
{
    const char *tag = vmm ? "1000 cycles route A" : "1000 cycles route C";
    dalloc a;
    if (vmm ? alloc_vmm(&a, 2 << 20, 1) : alloc_dev(&a, 65536)) {
        check(0, tag, "alloc");
        return;
    }
    uint8_t pat[64];
    fill(pat, sizeof pat, 11);
    CU(cuMemcpyHtoD(a.ptr, pat, sizeof pat));
    int fd0 = count_fds();
    int fails = 0;
    double t0 = now_ns();
    for (int i = 0; i < 1000; i++) {
        gp_pin p;
        if (do_pin(c, &p, a.ptr, 4096)) {
            fails++;
            if (fails == 1) printf("INFO %s\n", gdrpy_last_error());
            continue;
        }
        if (c->be->map(c, &p)) {
            fails++;
            c->be->unpin(c, &p);
            continue;
        }
        uint64_t v = (uint64_t)i;
        *(volatile uint64_t *)(uptr(&p) + 64) = v;
        _mm_sfence();
        if (c->be->unmap(c, &p)) fails++;
        if (c->be->unpin(c, &p)) fails++;
    }
    double t1 = now_ns();
    int fd1 = count_fds();
    uint64_t last = 0;
    CU(cuMemcpyDtoH(&last, a.ptr + 64, 8));
    uint64_t live = c->be->live_objects ? c->be->live_objects(c) : 0;
    check(fails == 0 && fd1 == fd0 && last == 999 && live == 0, tag,
          "failures=%d fds %d -> %d, live objects %llu, last value %llu, %.1f us/cycle", fails,
          fd0, fd1, (unsigned long long)live, (unsigned long long)last, (t1 - t0) / 1000 / 1e3);
    dfree(&a);
}

static void test_fork(gp_ctx *c)
{
    dalloc a;
    if (alloc_dev(&a, 65536)) return;
    gp_pin p;
    if (do_pin(c, &p, a.ptr, a.size) || c->be->map(c, &p)) {
        check(0, "fork: pin+map", NULL);
        dfree(&a);
        return;
    }
    uint64_t live = c->be->live_objects ? c->be->live_objects(c) : 0;
    check(live == 3, "live_objects counts 1 RM handle + 1 mapping + its fd", "%llu",
          (unsigned long long)live);
    char needle[32];
    snprintf(needle, sizeof needle, "%lx-", (unsigned long)(uintptr_t)p.map_base);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = fopen("/proc/self/maps", "r");
        char line[512];
        int found = 0;
        while (f && fgets(line, sizeof line, f)) found |= strncmp(line, needle, strlen(needle)) == 0;
        _exit(found ? 1 : 0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fork: child does not inherit the mapping (MADV_DONTFORK)", NULL);
    c->be->unmap(c, &p);
    c->be->unpin(c, &p);
    dfree(&a);
}

static void test_ctx_and_memcpy(gp_ctx *c)
{
    uint64_t v = 0x1234, r = 0;
    dalloc a;
    if (alloc_dev(&a, 4096)) return;
    /* no current context: the helper must push the primary one and pop it */
    CU(cuCtxSetCurrent(NULL));
    int rc = c->be->dev_memcpy(c, 0, a.ptr, &v, 8, NULL);
    rc |= c->be->dev_memcpy(c, 1, a.ptr, &r, 8, NULL);
    CUcontext cur = (CUcontext)1;
    cuCtxGetCurrent(&cur);
    check(rc == 0 && r == v && cur == NULL, "dev_memcpy with no current context (primary pushed, popped)",
          "rc=%d %s", rc, rc ? gdrpy_last_error() : "");
    CU(cuCtxSetCurrent(primary));
    /* stream variant */
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    uint64_t *pin_host;
    CU(cuMemAllocHost((void **)&pin_host, 4096));
    pin_host[0] = 0xabcdef;
    rc = c->be->dev_memcpy(c, 0, a.ptr, pin_host, 8, s);
    CU(cuStreamSynchronize(s));
    pin_host[1] = 0;
    rc |= c->be->dev_memcpy(c, 1, a.ptr, &pin_host[1], 8, s);
    CU(cuStreamSynchronize(s));
    check(rc == 0 && pin_host[1] == 0xabcdef, "dev_memcpy on a stream", "%s", rc ? gdrpy_last_error() : "");
    rc = c->be->dev_memcpy(c, 1, 0x10, &r, 8, NULL);
    check(rc != 0 && strstr(gdrpy_last_error(), "cuMemcpyDtoH"), "dev_memcpy error names the call",
          "rc=%d \"%s\"", rc, gdrpy_last_error());

    /* timings: the CE path as the backend does it, vs raw */
    enum { N = 2000 };
    static double t[N];
    for (int i = 0; i < N; i++) {
        double t0 = now_ns();
        c->be->dev_memcpy(c, 0, a.ptr, pin_host, 8, NULL);
        t[i] = now_ns() - t0;
    }
    report("gp_cuda_memcpy H2D 8 B (pinned host, sync)", t, N);
    for (int i = 0; i < N; i++) {
        double t0 = now_ns();
        cuMemcpyHtoD(a.ptr, pin_host, 8);
        t[i] = now_ns() - t0;
    }
    report("cuMemcpyHtoD 8 B (pinned host, raw)", t, N);
    for (int i = 0; i < N; i++) {
        double t0 = now_ns();
        cuMemcpyHtoD(a.ptr, &v, 8);
        t[i] = now_ns() - t0;
    }
    report("cuMemcpyHtoD 8 B (pageable host, raw)", t, N);
    for (int i = 0; i < N; i++) {
        double t0 = now_ns();
        cuMemcpyHtoD(a.ptr, &v, 8);
        cuStreamSynchronize(0);
        t[i] = now_ns() - t0;
    }
    report("cuMemcpyHtoD 8 B pageable + cuStreamSynchronize(0)", t, N);
    for (int i = 0; i < N; i++) {
        double t0 = now_ns();
        c->be->dev_memcpy(c, 1, a.ptr, pin_host, 8, NULL);
        t[i] = now_ns() - t0;
    }
    report("gp_cuda_memcpy D2H 8 B (pinned host, sync)", t, N);
    CU(cuCtxSetCurrent(NULL));
    for (int i = 0; i < N; i++) {
        double t0 = now_ns();
        c->be->dev_memcpy(c, 0, a.ptr, pin_host, 8, NULL);
        t[i] = now_ns() - t0;
    }
    report("gp_cuda_memcpy H2D 8 B, no current ctx (push/pop)", t, N);
    CU(cuCtxSetCurrent(primary));
    cuMemFreeHost(pin_host);
    cuStreamDestroy(s);
    dfree(&a);
}

static void test_timing(gp_ctx *c)
{
    enum { N = 200 };
    static double t1[N], t2[N], t3[N];
    size_t sizes[] = {65536, 64 << 20};
    for (int vmm = 0; vmm < 2; vmm++)
        for (int si = 0; si < 2; si++) {
            dalloc a;
            if (vmm ? alloc_vmm(&a, sizes[si] < (2 << 20) ? 2 << 20 : sizes[si], 1)
                    : alloc_dev(&a, sizes[si]))
                continue;
            uint8_t *pat = malloc(sizes[si]);
            fill(pat, sizes[si], 3);
            CU(cuMemcpyHtoD(a.ptr, pat, sizes[si]));
            free(pat);
            int n = sizes[si] > (1 << 20) ? 50 : N;
            int fails = 0;
            for (int i = 0; i < n; i++) {
                gp_pin p;
                double a0 = now_ns();
                int rc = do_pin(c, &p, a.ptr, sizes[si]);
                double a1 = now_ns();
                if (!rc) rc = c->be->map(c, &p);
                double a2 = now_ns();
                if (rc) {
                    fails++;
                    continue;
                }
                c->be->unmap(c, &p);
                c->be->unpin(c, &p);
                double a3 = now_ns();
                t1[i] = a1 - a0;
                t2[i] = a2 - a1;
                t3[i] = a3 - a2;
            }
            char nm[96];
            const char *r = vmm ? "A" : "C";
            const char *sz = si ? "64 MiB" : "64 KiB";
            if (fails) {
                check(0, "timing pin/map", "%d failures: %s", fails, gdrpy_last_error());
            }
            snprintf(nm, sizeof nm, "pin %s route %s (content-verified for C)", sz, r);
            report(nm, t1, n);
            snprintf(nm, sizeof nm, "map %s route %s", sz, r);
            report(nm, t2, n);
            snprintf(nm, sizeof nm, "unmap+unpin %s route %s", sz, r);
            report(nm, t3, n);
            dfree(&a);
        }
    /* route C pin of zeroed memory (read-only identity check) */
    {
        dalloc a;
        if (!alloc_dev(&a, 65536)) {
            CU(cuMemsetD8(a.ptr, 0, a.size));
            CU(cuCtxSynchronize());
            for (int i = 0; i < N; i++) {
                gp_pin p;
                double a0 = now_ns();
                int rc = do_pin(c, &p, a.ptr, a.size);
                t1[i] = now_ns() - a0;
                if (!rc) c->be->unpin(c, &p);
            }
            report("pin 64 KiB route C, zeroed (read-only identity)", t1, N);
            dfree(&a);
        }
    }
    /* store latency through BAR1 */
    dalloc a;
    if (alloc_dev(&a, 65536)) return;
    gp_pin p;
    if (do_pin(c, &p, a.ptr, a.size) || c->be->map(c, &p)) return;
    volatile uint64_t *q = (volatile uint64_t *)uptr(&p);
    enum { M = 20000 };
    static double s[M];
    /* calibrate the TSC */
    double c0 = now_ns();
    uint64_t k0 = __rdtsc();
    while (now_ns() - c0 < 50e6) {}
    double ns_per_tick = (now_ns() - c0) / (double)(__rdtsc() - k0);
    unsigned aux;
    for (int i = 0; i < M; i++) {
        uint64_t x0 = __rdtscp(&aux);
        uint64_t x1 = __rdtscp(&aux);
        s[i] = (double)(x1 - x0) * ns_per_tick;
    }
    report("timer overhead (rdtscp pair)", s, M);
    for (int i = 0; i < M; i++) {
        uint64_t x0 = __rdtscp(&aux);
        q[0] = (uint64_t)i;
        _mm_sfence();
        uint64_t x1 = __rdtscp(&aux);
        s[i] = (double)(x1 - x0) * ns_per_tick;
    }
    report("BAR1 8 B store + sfence", s, M);
    for (int i = 0; i < 2000; i++) {
        uint64_t x0 = __rdtscp(&aux);
        q[0] = (uint64_t)i;
        _mm_sfence();
        (void)q[0];
        uint64_t x1 = __rdtscp(&aux);
        s[i] = (double)(x1 - x0) * ns_per_tick;
    }
    report("BAR1 8 B store + sfence + 8 B read-back", s, 2000);
    for (int i = 0; i < 2000; i++) {
        uint64_t x0 = __rdtscp(&aux);
        (void)q[1];
        uint64_t x1 = __rdtscp(&aux);
        s[i] = (double)(x1 - x0) * ns_per_tick;
    }
    report("BAR1 8 B load", s, 2000);
    c->be->unmap(c, &p);
    c->be->unpin(c, &p);
    dfree(&a);
}

static void test_dmabuf(void)
{
    int rc;
    gp_ctx *c = mkctx(&gp_backend_dmabuf, 0, &rc);
    if (!c) {
        printf("INFO dmabuf open failed: %s\n", gdrpy_last_error());
        return;
    }
    dalloc a;
    if (!alloc_dev(&a, 2 << 20)) {
        gp_pin p;
        rc = do_pin(c, &p, a.ptr, 65536);
        printf("INFO dmabuf pin rc=%d %s\n", rc, rc ? gdrpy_last_error() : "");
        if (!rc) {
            rc = c->be->map(c, &p);
            check(rc == 0 || (rc == GDRPY_ENOTSUP && strstr(gdrpy_last_error(), "errno 524")),
                  "dmabuf map works or explains errno 524", "rc=%d \"%s\"", rc,
                  rc ? gdrpy_last_error() : "");
            if (!rc) {
                uint64_t v = 0x99, r = 0;
                wc_write(uptr(&p), &v, 8);
                cuMemcpyDtoH(&r, a.ptr, 8);
                check(r == v, "dmabuf store lands", NULL);
                c->be->unmap(c, &p);
            }
            c->be->unpin(c, &p);
        }
        dfree(&a);
    }
    rmctx(c);
}

/* ---- threads: shared ctx, a lock around the hooks as the core holds -- */
static pthread_mutex_t th_lock = PTHREAD_MUTEX_INITIALIZER;
struct th_arg {
    gp_ctx *c;
    CUdeviceptr ptr;
    int fails;
    int had_ctx_after;
    char err[256];
};

static void *th_main(void *v)
{
    struct th_arg *a = v;
    for (int i = 0; i < 200; i++) {
        gp_pin p;
        pthread_mutex_lock(&th_lock);
        int rc = do_pin(a->c, &p, a->ptr, 4096);
        if (!rc) {
            rc = a->c->be->map(a->c, &p);
            if (rc) a->c->be->unpin(a->c, &p);
        }
        if (rc && !a->fails) snprintf(a->err, sizeof a->err, "%s", gdrpy_last_error());
        pthread_mutex_unlock(&th_lock);
        if (rc) {
            a->fails++;
            continue;
        }
        *(volatile uint64_t *)uptr(&p) = (uint64_t)i;
        _mm_sfence();
        pthread_mutex_lock(&th_lock);
        rc = a->c->be->unmap(a->c, &p);
        rc |= a->c->be->unpin(a->c, &p);
        pthread_mutex_unlock(&th_lock);
        if (rc) a->fails++;
    }
    CUcontext cur = NULL;
    cuCtxGetCurrent(&cur);
    a->had_ctx_after = cur != NULL;
    return NULL;
}

static void test_threads(gp_ctx *c)
{
    enum { T = 4 };
    dalloc al[T];
    struct th_arg args[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
        memset(&args[i], 0, sizeof args[i]);
        if (i & 1 ? alloc_vmm(&al[i], 2 << 20, 1) : alloc_dev(&al[i], 65536)) {
            check(0, "threads: alloc", NULL);
            return;
        }
        CU(cuMemsetD8(al[i].ptr, 0x5a, 4096));
        args[i].c = c;
        args[i].ptr = al[i].ptr;
    }
    CU(cuCtxSynchronize());
    for (int i = 0; i < T; i++) pthread_create(&th[i], NULL, th_main, &args[i]);
    int fails = 0, leaked = 0, ok = 1;
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        fails += args[i].fails;
        leaked += args[i].had_ctx_after;
        if (args[i].fails) printf("INFO thread %d: %s\n", i, args[i].err);
        uint64_t last = 0;
        CU(cuMemcpyDtoH(&last, al[i].ptr, 8));
        ok &= last == 199;
        dfree(&al[i]);
    }
    check(fails == 0 && ok && leaked == 0,
          "threads: 4 threads without a current context, 200 cycles each (routes A and C)",
          "failures=%d values ok=%d contexts left current=%d", fails, ok, leaked);
}

static void profile_route_a(void)
{
    dalloc a;
    if (alloc_vmm(&a, 2 << 20, 1)) return;
    enum { N = 50 };
    static double t_ret[N], t_exp[N], t_close[N];
    for (int i = 0; i < N; i++) {
        CUmemGenericAllocationHandle h;
        int fd = -1;
        double t0 = now_ns();
        cuMemRetainAllocationHandle(&h, (void *)a.ptr);
        double t1 = now_ns();
        cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        double t2 = now_ns();
        close(fd);
        cuMemRelease(h);
        double t3 = now_ns();
        t_ret[i] = t1 - t0;
        t_exp[i] = t2 - t1;
        t_close[i] = t3 - t2;
    }
    report("route A part: cuMemRetainAllocationHandle", t_ret, N);
    report("route A part: cuMemExportToShareableHandle(POSIX_FD)", t_exp, N);
    report("route A part: close(fd) + cuMemRelease", t_close, N);
    dfree(&a);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    CU(cuInit(0));
    CU(cuDeviceGet(&cudev, 0));
    CU(cuDevicePrimaryCtxRetain(&primary, cudev));
    CU(cuCtxSetCurrent(primary));
    char name[128] = "";
    cuDeviceGetName(name, sizeof name, cudev);
    int dv = 0;
    cuDriverGetVersion(&dv);
    printf("INFO device 0: %s, CUDA driver %d\n", name, dv);

    test_probes();
    dump_ipc_words();

    int fd_start = count_fds();
    int rc;
    gp_ctx *c = mkctx(&gp_backend_nvrm, 0, &rc);
    check(c != NULL, "nvrm.open(0)", "%s", c ? "" : gdrpy_last_error());
    if (!c) goto done;
    printf("INFO ctx: gpu \"%s\" pci %s driver %s\n", c->info.gpu_name, c->info.pci_bus_id,
           c->info.driver_version);

    dalloc a;
    if (!alloc_dev(&a, 1 << 20)) {
        test_data(c, &a, "route C cuMemAlloc 1 MiB");
        dfree(&a);
    }
    if (!alloc_dev(&a, 100)) {
        test_data(c, &a, "route C cuMemAlloc 100 B");
        dfree(&a);
    }
    if (!alloc_dev(&a, (3 << 20) + 5)) {
        test_data(c, &a, "route C cuMemAlloc 3 MiB+5");
        dfree(&a);
    }
    if (!alloc_vmm(&a, 2 << 20, 1)) {
        test_data(c, &a, "route A cuMemCreate 2 MiB");
        dfree(&a);
    } else check(0, "cuMemCreate POSIX_FD", NULL);
    if (!alloc_vmm(&a, 64 << 20, 1)) {
        test_data(c, &a, "route A cuMemCreate 64 MiB");
        dfree(&a);
    }
    test_subrange(c);
    test_small_buffers(c);
    test_free_while_pinned(c, 0);
    test_free_while_pinned(c, 1);
    test_refusals(c);
    test_fork(c);
    test_identity_check(c);
    test_ctx_and_memcpy(c);
    test_cycles(c, 0);
    test_cycles(c, 1);
    test_threads(c);
    profile_route_a();
    test_timing(c);
    rmctx(c);

    /* contexts open and close without leaking fds */
    static double to[20], tp[20];
    for (int i = 0; i < 20; i++) {
        double t0 = now_ns();
        gp_ctx *x = mkctx(&gp_backend_nvrm, 0, &rc);
        if (x) rmctx(x);
        double t1 = now_ns();
        char why[256];
        gp_backend_nvrm.probe(0, why, sizeof why);
        tp[i] = now_ns() - t1;
        to[i] = t1 - t0;
    }
    report("nvrm open+close", to, 20);
    report("nvrm probe", tp, 20);
    check(count_fds() == fd_start, "20 open/close cycles leak no fd", "%d -> %d", fd_start,
          count_fds());
    test_dmabuf();
done:
    printf("SUMMARY %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
