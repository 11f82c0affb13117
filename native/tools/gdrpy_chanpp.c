/*
 * gdrpy_chanpp - round trips through a gdrpy channel from C (the number the
 * Python channel is compared with in `python -m gdrpy bench pingpong`).
 *
 *   gdrpy_chanpp --cubin FILE [--kernel NAME] [--device N] [--sizes 4,64,1024,4096]
 *                [--iters N] [--warmup N] [--batch 32] [--cpu N] [--timeout S]
 *                [--alloc cumemalloc|vmm] [--plain] [--near] [--answer tag|line]
 *   gdrpy_chanpp --sim ...      (no GPU: libgdrpy's CPU consumer thread answers)
 *
 * The kernel (FILE: a cubin or PTX image, e.g. written by gdrpy.tools.pingpong
 * after NVRTC compiled it) must be
 *     extern "C" __global__ void NAME(gdrpy_chan_desc_t d, unsigned long long idle_ns)
 * and answer message i as the sim consumer does (gdrpy_channel.h,
 * GDRPY_CHAN_SIM_COMPLETE): --answer tag (the default) makes a channel
 * without completion payloads (comp_size 0), answered with the checksum
 * (gdrpy_chan_checksum) as the completion's tag; --answer line, comp_size
 * 16: {u64 i+1, u32 checksum, u32 len}.  Every answer is checked.
 * libcuda is loaded with dlopen; the ring lives in cuMemAlloc memory (--alloc
 * vmm: cuMemCreate with gpuDirectRDMACapable, as gdrpy.memory.alloc and
 * GDRCopy's pplat -a cuMemCreate) pinned and mapped by libgdrpy (backend
 * auto).  --plain: the channel uses GDRPY_CHAN_PLAIN slots (default LL).
 * --near: a GDRPY_CHAN_NEAR channel (the kernel keeps the slots nearest its SM).
 *
 * Output: one JSON object per line:
 *   {"path":"info", ...}   alloc, slot format, the kernel's SM, the timer and its cost
 *   {"path":"c","size":4,"n":...,"min_us":...,"median_us":...,"p99_us":...,...}
 *   {"path":"c-avg10","size":4,...}   blocks of 10 round trips timed together
 *        (per round trip; GDRCopy pplat's method: one timer pair per block)
 *   {"path":"c-batch","size":...,"batch":32,...}   (send_batch of 32 + recv of 32)
 *   {"path":"c-batch-send"|"c-batch-first"|"c-batch-second",...}   a second
 *        batch run, taken apart: send_batch alone; up to the first, the
 *        second completion
 * Exit status 0; 1 with a message on stderr; 2 for a usage error.
 */
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chanpp/cuvmm.h"
#include "chanpp/ptimer.h"
#include "gdrpy.h"
#include "gdrpy_channel.h"

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamQuery)(CUstream);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void **, void **);
    CUresult (*GetErrorName)(CUresult, const char **);
} cu;

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gdrpy_chanpp: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static void cucheck(CUresult r, const char *what)
{
    if (r == 0) return;
    const char *n = "?";
    if (cu.GetErrorName) cu.GetErrorName(r, &n);
    die("%s failed: %s (%d)", what, n, r);
}

static void gcheck(int rc, const char *what)
{
    if (rc) {
        fprintf(stderr, "gdrpy_chanpp: %s: %s (%s)\n", what, gdrpy_last_error(),
                gdrpy_strerror(rc));
        exit(1);
    }
}

static void load_cuda(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) die("cannot load libcuda.so.1: %s", dlerror());
#define L(f, n)                                \
    do {                                       \
        *(void **)&cu.f = dlsym(h, n);         \
        if (!cu.f) die("libcuda lacks %s", n); \
    } while (0)
    L(Init, "cuInit");
    L(DeviceGet, "cuDeviceGet");
    L(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    L(CtxSetCurrent, "cuCtxSetCurrent");
    L(MemAlloc, "cuMemAlloc_v2");
    L(MemFree, "cuMemFree_v2");
    L(ModuleLoadData, "cuModuleLoadData");
    L(ModuleGetFunction, "cuModuleGetFunction");
    L(ModuleUnload, "cuModuleUnload");
    L(StreamCreate, "cuStreamCreate");
    L(StreamQuery, "cuStreamQuery");
    L(StreamDestroy, "cuStreamDestroy_v2");
    L(LaunchKernel, "cuLaunchKernel");
    L(GetErrorName, "cuGetErrorName");
#undef L
}

static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void report(const char *path, size_t size, int batch, int64_t *t, size_t n)
{
    qsort(t, n, sizeof *t, cmp_i64);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (double)t[i];
#define Q(p) (t[(size_t)((double)(n - 1) * (p) + 0.5)] / 1000.0)
    printf("{\"path\": \"%s\", \"size\": %zu, \"batch\": %d, \"n\": %zu, \"min_us\": %.3f, "
           "\"median_us\": %.3f, \"mean_us\": %.3f, \"p90_us\": %.3f, \"p99_us\": %.3f, "
           "\"p99.9_us\": %.3f, \"max_us\": %.3f}\n",
           path, size, batch, n, t[0] / 1000.0, Q(0.5), sum / n / 1000.0, Q(0.9), Q(0.99),
           Q(0.999), t[n - 1] / 1000.0);
#undef Q
    fflush(stdout);
}

/* The channel's answers (--answer): tag answers (comp_size 0, the default)
 * or {u64 seq, u32 checksum, u32 len} lines (comp_size 16). */
static int answer_line = 0;

/* Whether a completion (len bytes of ans, its tag) answers message seq of
 * `size` bytes with checksum want. */
static int answer_ok(uint32_t len, uint32_t tag, const unsigned char *ans, uint64_t seq,
                     uint32_t want, size_t size)
{
    if (!answer_line) return len == 0 && tag == want;
    uint64_t sq;
    uint32_t l4;
    memcpy(&sq, ans, 8);
    memcpy(&l4, ans + 12, 4);
    return len == 16 && sq == seq && memcmp(ans + 8, &want, 4) == 0 && l4 == size;
}

/* After a batch's send and receive returned rc == 0: 0 when answer k (ans[k],
 * lens[k], tags[k]) is message seq + 1 + k's, else 1 with a message. */
static int check_batch(const unsigned char (*ans)[16], const uint32_t *lens, const uint32_t *tags,
                       const gdrpy_chan_msg_t *bm, int batch, uint64_t seq, size_t s)
{
    for (int k = 0; k < batch; k++)
        if (!answer_ok(lens[k], tags[k], ans[k], seq + 1 + (uint64_t)k,
                       gdrpy_chan_checksum(bm[k].buf, s), s)) {
            fprintf(stderr, "gdrpy_chanpp: batch: wrong answer %d (len %u tag 0x%x)\n", k,
                    lens[k], tags[k]);
            return 1;
        }
    return 0;
}

/* One timed round trip of message *seq (s bytes of msg, checksum want),
 * its answer checked (answer_ok).  Its time in *t; 1 (with a message) on
 * error. */
static int checked_rt(gdrpy_chan_t *ch, const unsigned char *msg, size_t s, uint32_t want,
                      int64_t tmo, uint64_t *seq, int64_t *t)
{
    unsigned char ans[16] = {0};
    uint32_t clen = 0, tag = 0;
    uint64_t t0 = pt_now();
    int e = gdrpy_chan_send(ch, msg, s, 0, tmo);
    if (!e) e = gdrpy_chan_recv(ch, ans, sizeof ans, &clen, &tag, tmo);
    uint64_t t1 = pt_now();
    if (e) {
        fprintf(stderr, "gdrpy_chanpp: %s\n", gdrpy_last_error());
        return 1;
    }
    ++*seq;
    if (!answer_ok(clen, tag, ans, *seq, want, s)) {
        fprintf(stderr, "gdrpy_chanpp: wrong answer to message %llu (%zu B): %u bytes, tag 0x%x "
                        "(expected checksum 0x%x)\n",
                (unsigned long long)*seq, s, clen, tag, want);
        return 1;
    }
    *t = pt_ns(t1 - t0);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: gdrpy_chanpp --cubin FILE [options]   (a GPU kernel answers)\n"
            "       gdrpy_chanpp --sim [options]          (libgdrpy's CPU consumer answers)\n"
            "Round trips through a gdrpy channel from C; one JSON object per line.\n"
            "  --cubin FILE       the kernel's image (cubin or PTX)\n"
            "  --kernel NAME      the serving kernel in it (default gdrpy_pp_serve)\n"
            "  --device N         CUDA device (default 0)\n"
            "  --sizes A,B,...    payload sizes in bytes (default 4,64,1024,4096)\n"
            "  --iters N          round trips per size (default 10000)\n"
            "  --warmup N         untimed round trips first (default iters/10, at least 10)\n"
            "  --batch N          messages per batch, 1..1024 (default 32)\n"
            "  --cpu N            pin the process to CPU N\n"
            "  --timeout S        the longest wait for one answer (default 5 s)\n"
            "  --alloc KIND       ring memory: cumemalloc (default) or vmm (cuMemCreate)\n"
            "  --plain            GDRPY_CHAN_PLAIN slots (default LL)\n"
            "  --near             a GDRPY_CHAN_NEAR channel\n"
            "  --answer tag|line  the checksum as the completion's tag (default) or a\n"
            "                     16-byte completion {seq, checksum, len}\n"
            "  -h, --help         this text\n");
}

int main(int argc, char **argv)
{
    const char *cubin = NULL, *kname = "gdrpy_pp_serve", *sizes_s = "4,64,1024,4096";
    int device = 0, iters = 10000, warmup = -1, batch = 32, cpu = -1, sim = 0, plain = 0, near = 0;
    const char *alloc_kind = "cumemalloc";
    double timeout_s = 5.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--sim")) sim = 1;
        else if (!strcmp(a, "--plain")) plain = 1;
        else if (!strcmp(a, "--near")) near = 1;
        else {
            static const char *const valued[] = {"--cubin", "--kernel", "--device", "--sizes",
                                                 "--iters", "--warmup", "--batch", "--cpu",
                                                 "--timeout", "--alloc", "--answer"};
            int known = 0;
            for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) known |= !strcmp(a, valued[k]);
            if (!known || i + 1 >= argc) {
                fprintf(stderr, "gdrpy_chanpp: %s %s (see --help)\n",
                        known ? "option needs a value:" : "unknown option", a);
                return 2;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--cubin")) cubin = v;
            else if (!strcmp(a, "--kernel")) kname = v;
            else if (!strcmp(a, "--device")) device = atoi(v);
            else if (!strcmp(a, "--sizes")) sizes_s = v;
            else if (!strcmp(a, "--iters")) iters = atoi(v);
            else if (!strcmp(a, "--warmup")) warmup = atoi(v);
            else if (!strcmp(a, "--batch")) batch = atoi(v);
            else if (!strcmp(a, "--cpu")) cpu = atoi(v);
            else if (!strcmp(a, "--timeout")) timeout_s = atof(v);
            else if (!strcmp(a, "--alloc")) alloc_kind = v;
            else if (!strcmp(v, "tag") || !strcmp(v, "line")) answer_line = !strcmp(v, "line");
            else die("--answer must be tag or line");
        }
    }
    if (iters <= 0) die("--iters must be positive");
    int vmm = !strcmp(alloc_kind, "vmm");
    if (!vmm && strcmp(alloc_kind, "cumemalloc")) die("--alloc must be cumemalloc or vmm");
    if (warmup < 0) warmup = iters / 10 > 10 ? iters / 10 : 10;
    if (!sim && !cubin) die("--cubin FILE is required (or --sim)");
    if (cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) die("sched_setaffinity(cpu %d) failed: %s", cpu, strerror(errno));
    }
    pt_init();
    size_t sizes[32];
    int nsizes = 0;
    size_t maxsize = 16;
    for (const char *p = sizes_s; *p && nsizes < 32;) {
        char *end;
        unsigned long s = strtoul(p, &end, 10);
        if (end == p || s == 0) die("bad --sizes %s", sizes_s);
        sizes[nsizes++] = s;
        if (s > maxsize) maxsize = s;
        p = *end == ',' ? end + 1 : end;
    }
    if (batch < 1 || batch > 1024) die("--batch %d out of range (1..1024)", batch);
    int64_t tmo = (int64_t)(timeout_s * 1e9);

    /* ring: 256 slots of maxsize (>= batch) */
    gdrpy_chan_config_t cfg = {256, (uint32_t)maxsize, 0, answer_line ? 16u : 0u,
                               (plain ? GDRPY_CHAN_PLAIN : 0) | (near ? GDRPY_CHAN_NEAR : 0), 0};
    while (cfg.nslots < (uint32_t)batch * 2) cfg.nslots *= 2;
    size_t need;
    gcheck(gdrpy_chan_device_bytes(&cfg, &need), "chan_device_bytes");
    size_t alloc = need + GDRPY_GPU_PAGE_SIZE;

    gdrpy_ctx_t ctx;
    CUdeviceptr raw = 0;
    uint64_t dptr;
    CUmodule mod = NULL;
    CUfunction fn = NULL;
    CUstream st = NULL;
    if (sim) {
        gcheck(gdrpy_open(device, GDRPY_BACKEND_SIM, &ctx), "open(sim)");
        gcheck(gdrpy_sim_alloc(need, &dptr), "sim_alloc");
    } else {
        load_cuda();
        cucheck(cu.Init(0), "cuInit");
        CUdevice dev;
        CUcontext cctx;
        cucheck(cu.DeviceGet(&dev, device), "cuDeviceGet");
        cucheck(cu.PrimaryCtxRetain(&cctx, dev), "cuDevicePrimaryCtxRetain");
        cucheck(cu.CtxSetCurrent(cctx), "cuCtxSetCurrent");
        FILE *f = fopen(cubin, "rb");
        if (!f) die("cannot open %s: %s", cubin, strerror(errno));
        fseek(f, 0, SEEK_END);
        long fl = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *img = calloc(1, (size_t)fl + 1); /* NUL-terminated (PTX) */
        if (!img || fread(img, 1, (size_t)fl, f) != (size_t)fl) die("cannot read %s", cubin);
        fclose(f);
        cucheck(cu.ModuleLoadData(&mod, img), "cuModuleLoadData");
        free(img);
        cucheck(cu.ModuleGetFunction(&fn, mod, kname), "cuModuleGetFunction");
        cucheck(cu.StreamCreate(&st, 1 /* CU_STREAM_NON_BLOCKING */), "cuStreamCreate");
        if (vmm) {
            int r = cuvmm_alloc(dev, need, &dptr);
            if (r) die("cuMemCreate (gpuDirectRDMACapable) allocation failed (%d)", r);
        } else {
            cucheck(cu.MemAlloc(&raw, alloc), "cuMemAlloc");
            dptr = (raw + GDRPY_GPU_PAGE_SIZE - 1) & ~(uint64_t)(GDRPY_GPU_PAGE_SIZE - 1);
        }
        gcheck(gdrpy_open(device, GDRPY_BACKEND_AUTO, &ctx), "open");
    }
    gdrpy_pin_t pin;
    void *mp, *up;
    gcheck(gdrpy_pin(ctx, dptr, need, 0, &pin), "pin");
    gcheck(gdrpy_map(ctx, pin, &mp, &up), "map");
    gdrpy_chan_t *ch;
    gcheck(gdrpy_chan_create(ctx, pin, &cfg, &ch), "chan_create");
    gdrpy_chan_desc_t desc;
    gdrpy_chan_get_desc(ch, &desc);
    gdrpy_chan_sim_consumer_t *sc = NULL;
    unsigned long long idle_ns = (unsigned long long)(tmo > 0 ? tmo * 4 : 20000000000LL);
    if (sim) {
        gcheck(gdrpy_chan_sim_consumer_start(ch, GDRPY_CHAN_SIM_COMPLETE, 0, (int64_t)idle_ns, &sc),
               "sim consumer");
    } else {
        void *params[2] = {&desc, &idle_ns};
        cucheck(cu.LaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, st, params, NULL), "cuLaunchKernel");
    }
    gcheck(gdrpy_chan_wait_attached(ch, 10000000000LL), "wait for the kernel to attach");
    printf("{\"path\": \"info\", \"alloc\": \"%s\", \"format\": \"%s\", \"slots\": \"%s\", "
           "\"answer\": \"%s\", \"sm\": %d, ",
           sim ? "sim" : alloc_kind, plain ? "plain" : "ll", near ? "near" : "all",
           answer_line ? "line" : "tag",
           sim ? -1 : (int)*(volatile uint32_t *)((char *)gdrpy_chan_host_block(ch) + GDRPY_CHAN_HOST_SMID));
    pt_json(stdout);
    printf("}\n");

    unsigned char *msg = malloc(maxsize * (size_t)batch);
    /* samples: `iters` per size, and the batch run takes max(iters / 4, 100) */
    const int batch_iters = iters / 4 > 100 ? iters / 4 : 100;
    int64_t *t = malloc(sizeof(int64_t) * (size_t)(iters > batch_iters ? iters : batch_iters));
    unsigned char ans[1024][16]; /* answers, their lengths and tags (answer_ok) */
    uint32_t alen[1024], atag[1024];
    gdrpy_chan_msg_t bm[1024];
    uint64_t seq = 0;
    int rc = 0;
    for (int si = 0; si < nsizes && !rc; si++) {
        size_t s = sizes[si];
        for (size_t k = 0; k < s; k++) msg[k] = (unsigned char)(k * 7 + s);
        uint32_t want = gdrpy_chan_checksum(msg, s);
        for (int i = 0; i < warmup + iters; i++) {
            int64_t x;
            rc = checked_rt(ch, msg, s, want, tmo, &seq, &x);
            if (rc) break;
            if (i >= warmup) t[i - warmup] = x;
        }
        if (!rc) report("c", s, 1, t, (size_t)iters);
        /* the same, timed in blocks of 10 (one timer pair per block) */
        const int nblk = iters / 10 > 10 ? iters / 10 : 10;
        for (int b = 0; b < nblk && !rc; b++) {
            uint64_t t0 = pt_now();
            for (int k = 0; k < 10 && !rc; k++) {
                rc = gdrpy_chan_send(ch, msg, s, 0, tmo);
                if (!rc) rc = gdrpy_chan_recv(ch, ans[k], sizeof ans[0], &alen[k], &atag[k], tmo);
            }
            uint64_t t1 = pt_now();
            if (rc) {
                fprintf(stderr, "gdrpy_chanpp: %s\n", gdrpy_last_error());
                break;
            }
            for (int k = 0; k < 10; k++)
                if (!answer_ok(alen[k], atag[k], ans[k], seq + 1 + (uint64_t)k, want, s)) {
                    fprintf(stderr, "gdrpy_chanpp: wrong answer to message %llu (%zu B, block)\n",
                            (unsigned long long)(seq + 1 + (uint64_t)k), s);
                    rc = 1;
                }
            seq += 10;
            t[b] = pt_ns(t1 - t0) / 10;
        }
        if (!rc) report("c-avg10", s, 10, t, (size_t)nblk);
    }
    /* batch of `batch` ticks of the smallest size vs. one tick */
    if (!rc && batch > 0) {
        size_t s = sizes[0];
        for (int k = 0; k < batch; k++) {
            memset(msg + (size_t)k * s, k + 1, s);
            bm[k].buf = msg + (size_t)k * s;
            bm[k].len = (uint32_t)s;
            bm[k].tag = (uint32_t)k;
        }
        const int bi = batch_iters;
        for (int i = 0; i < warmup + bi && !rc; i++) {
            uint64_t t0 = pt_now();
            rc = gdrpy_chan_send_batch(ch, bm, (size_t)batch, tmo);
            size_t got = 0;
            if (!rc) rc = gdrpy_chan_recv_many(ch, ans, sizeof ans[0], alen, atag, (size_t)batch,
                                               (size_t)batch, tmo, &got);
            uint64_t t1 = pt_now();
            if (rc) fprintf(stderr, "gdrpy_chanpp: batch: %s\n", gdrpy_last_error());
            else rc = check_batch(ans, alen, atag, bm, batch, seq, s);
            if (rc) break;
            seq += (uint64_t)batch;
            if (i >= warmup) t[i - warmup] = pt_ns(t1 - t0);
        }
        if (!rc) report("c-batch", s, batch, t, (size_t)bi);
        /* the same batches taken apart: when send_batch returned, when the
         * first and the second completion came (recv_many of 1, 1, the rest) */
        int64_t *tf = malloc(sizeof(int64_t) * (size_t)bi * 2), *t2 = tf ? tf + bi : NULL;
        for (int i = 0; i < warmup + bi && !rc && tf; i++) {
            size_t got = 0;
            uint64_t t0 = pt_now();
            rc = gdrpy_chan_send_batch(ch, bm, (size_t)batch, tmo);
            uint64_t ts = pt_now();
            if (!rc) rc = gdrpy_chan_recv_many(ch, ans, sizeof ans[0], alen, atag, 1, 1, tmo, &got);
            uint64_t tfirst = pt_now();
            if (!rc && batch > 1)
                rc = gdrpy_chan_recv_many(ch, ans[1], sizeof ans[0], alen + 1, atag + 1, 1, 1, tmo,
                                          &got);
            uint64_t tsecond = pt_now();
            if (!rc && batch > 2)
                rc = gdrpy_chan_recv_many(ch, ans[2], sizeof ans[0], alen + 2, atag + 2,
                                          (size_t)batch - 2, (size_t)batch - 2, tmo, &got);
            if (rc) fprintf(stderr, "gdrpy_chanpp: batch: %s\n", gdrpy_last_error());
            else rc = check_batch(ans, alen, atag, bm, batch, seq, s);
            if (rc) break;
            seq += (uint64_t)batch;
            if (i >= warmup) {
                t[i - warmup] = pt_ns(ts - t0);
                tf[i - warmup] = pt_ns(tfirst - t0);
                t2[i - warmup] = pt_ns(tsecond - t0);
            }
        }
        if (!rc && tf) {
            report("c-batch-send", s, batch, t, (size_t)bi);
            report("c-batch-first", s, batch, tf, (size_t)bi);
            report("c-batch-second", s, batch, t2, (size_t)bi);
        }
        free(tf);
    }
    gdrpy_chan_stats_t stats;
    int src = gdrpy_chan_shutdown(ch, GDRPY_CHAN_DRAIN, 10000000000LL, &stats);
    if (src) {
        fprintf(stderr, "gdrpy_chanpp: shutdown: %s (memory left allocated)\n", gdrpy_last_error());
        return 1;
    }
    if (sim) gdrpy_chan_sim_consumer_join(sc, NULL, NULL, NULL);
    else {
        int64_t end = now_ns() + 10000000000LL;
        while (cu.StreamQuery(st) != 0 && now_ns() < end) {}
    }
    gdrpy_chan_destroy(ch);
    gdrpy_unmap(ctx, pin);
    gdrpy_unpin(ctx, pin);
    gdrpy_close(ctx);
    if (sim) gdrpy_sim_free(dptr);
    else {
        if (raw) cu.MemFree(raw); /* vmm memory: freed at exit */
        cu.StreamDestroy(st);
        cu.ModuleUnload(mod);
    }
    free(msg);
    free(t);
    return rc ? 1 : 0;
}
