/*
 * gdrpy_chanpp - round trips through a gdrpy channel from C (the number the
 * Python channel is compared with in `python -m gdrpy bench pingpong`).
 *
 *   gdrpy_chanpp --cubin FILE [--kernel NAME] [--device N] [--sizes 4,64,1024,4096]
 *                [--iters N] [--warmup N] [--batch 32] [--cpu N] [--timeout S]
 *                [--alloc cumemalloc|vmm] [--plain] [--near] [--kernel-rounds]
 *                [--answer tag|line] [--timeline] [--comp-nslots N]
 *                [--ab-answer ROUNDS [--ab-modes M,...] [--ab-sm N]]   (in-place A/B, see ab_answer)
 *                [--steer-probe VISITS]   (what steering past slow slots gives, see steer_probe)
 *   gdrpy_chanpp --sim ...      (no GPU: libgdrpy's CPU consumer thread answers)
 *   gdrpy_chanpp --variants ... (protocol variants side by side: tools/chanpp/chanvar.c)
 *   gdrpy_chanpp --timeline-selftest   (the timeline's kernel arithmetic on made-up stamps)
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
 * --comp-nslots N: the completion ring's slots (a power of two; default: as
 * many as the message ring's), to see what the ring's size costs a round trip.
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
 *   {"path":"timeline",...}   --timeline: batches taken apart on both sides
 *        (tools/chanpp/timeline.c; the kernel's columns with a kernel built
 *        with -DGDRPY_PP_RSTAMPS)
 *   {"path":"kernel-rounds",...}   --kernel-rounds, with a kernel built with
 *        -DGDRPY_PP_ROUNDS: how its busy rounds found their messages
 *   {"path":"steer-slots",...}, {"path":"steer-deciles",...}, {"path":"c-steer-base",...},
 *   {"path":"c-steer",...}   --steer-probe
 *   {"path":"ab-modeM",...}, {"path":"ab-batch32-modeM",...}, {"path":"ab-timeline",...}
 *        --ab-answer, with a kernel built with -DGDRPY_PP_AB (see ab_answer)
 * Exit status 0, or 1 with a message on stderr.
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
#include "chanpp/timeline.h"
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

/* The median of t[0..n) (sorts it in place). */
static int64_t median_sort(int64_t *t, size_t n)
{
    qsort(t, n, sizeof *t, cmp_i64);
    return t[n / 2];
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

/* The channel's answers (--answer): shape 1, tag answers (comp_size 0), or
 * shape 0, {seq, checksum, len} lines (comp_size 16); see answer_ok. */
static unsigned answer_shape = 1;

/* Whether a completion (len bytes of ans, its tag) answers message seq of
 * `size` bytes, checksum want, sent with tag sent_tag, in the answer shape
 * `shape` (the --ab-answer modes' bits 0-1): 0 {u64 seq, u32 checksum, u32
 * len}; 1 no payload, the checksum as the tag; 2, 3 a 4-byte payload (the
 * checksum) with the message's tag. */
static int answer_ok(unsigned shape, uint32_t len, uint32_t tag, const unsigned char *ans,
                     uint64_t seq, uint32_t want, size_t size, uint32_t sent_tag)
{
    uint32_t c4, l4;
    uint64_t sq;
    memcpy(&c4, ans, 4);
    memcpy(&sq, ans, 8);
    memcpy(&l4, ans + 12, 4);
    if (shape == 0) return len == 16 && sq == seq && memcmp(ans + 8, &want, 4) == 0 && l4 == size;
    if (shape == 1) return len == 0 && tag == want;
    return len == 4 && c4 == want && tag == sent_tag;
}

/* After a batch's send and receive returned rc == 0: 0 when answer k (ans[k],
 * lens[k], tags[k]) is message seq + 1 + k's, else 1 with a message. */
static int check_batch(const unsigned char (*ans)[16], const uint32_t *lens, const uint32_t *tags,
                       const gdrpy_chan_msg_t *bm, int batch, uint64_t seq, size_t s)
{
    for (int k = 0; k < batch; k++)
        if (!answer_ok(answer_shape, lens[k], tags[k], ans[k], seq + 1 + (uint64_t)k,
                       gdrpy_chan_checksum(bm[k].buf, s), s, bm[k].tag)) {
            fprintf(stderr, "gdrpy_chanpp: batch: wrong answer %d (len %u tag 0x%x)\n", k,
                    lens[k], tags[k]);
            return 1;
        }
    return 0;
}

/* --ab-answer ROUNDS [--ab-modes M,...] (a kernel built with -DGDRPY_PP_AB):
 * in-place A/B - the same channel, kernel, SM and memory, switched between
 * modes every 200 round trips of `s` bytes (plus 40 batches of 32), ROUNDS
 * times.  The host stores the mode in the device block's spare word 16;
 * the kernel reads it after each busy round, so after a switch one untimed
 * round trip lets it do so.  Modes (channel_kernels.cu):
 *   bits 0-1  the answer's shape: 0 the channel's own (--answer: tag
 *             answers, or the 64-byte answer line); 1 a 0-byte completion
 *             with the checksum as its tag (16 bytes, one lane; in bursts
 *             too); 2 a 4-byte completion (32 bytes, two lanes); 3 the same
 *             from one lane (2 and 3 need --answer line: a comp_size 0
 *             channel cannot carry their payload)
 *   131072    shapes 1-3 answered from round 11's sample (before the vote),
 *             not after it
 *   256       the idle poll of round 8 (one sample per serve() pass)
 *   4096      GDRCopy pplat's flag-only round trip on this kernel and
 *             memory (ab_floor_block); +33554432: its flag on a fixed line;
 *             +536870912: its flag on line ab_scan_line(r) of the ring, one
 *             line per block, 64 lines in turn ("ab-scan" line per block, with
 *             the kernel's load and atomic cycles on that line)
 *             +1073741824: the floor's answer stored with st.mmio
 *   2048      round 10's idle sample (every LL word of the slot, a vote,
 *             the answer built after) instead of round 11's 32-byte sample
 *   8192      round 11's sample, its answer stored with st.mmio
 *   65536     round 11's sample without the length guess
 * --ab-sm N: the kernel serves from SM N (1024 blocks are launched; those
 * on other SMs leave, the first on SM N claims the channel).
 * Every answer is checked; one "ab-modeM" (and "ab-batch32-modeM") line per
 * mode, and after the run the kernel's "ab-timeline". */
/* Mode 4096 + 536870912, block r: the device block offset of the flag -
 * line (r % 64) of 64 spread over the ring: slot (r % 64) * nslots / 64,
 * and a different 64-byte line of that slot each time (the slot's first
 * line every 8th).  Never the device block's control words. */
static uint32_t ab_scan_line(const gdrpy_chan_desc_t *d, int r)
{
    const uint32_t j = (uint32_t)r % 64u;
    const uint32_t slot = j * (d->nslots >= 64 ? d->nslots / 64 : 1) % d->nslots;
    const uint32_t lines = d->slot_stride / 64u;
    const uint32_t line = (j % 8u) * 7u % lines;
    return GDRPY_CHAN_DEV_CTRL + slot * d->slot_stride + line * 64u;
}

/* One --ab-answer block of the flag-only floor (mode 4096): a channel round
 * trip (the kernel reads the mode after it), then `per` timed round trips
 * of an 8-byte flag (word 0 of the next message's slot, or the device
 * block's word 48; store + sfence) answered in the host block's word 96;
 * then the next mode is stored and a flag with bit 63 set sends the kernel
 * back to the channel.  lat: the kernel's load latencies, summed. */
static int ab_floor_block(gdrpy_chan_t *ch, int64_t tmo, const unsigned char *msg, size_t s,
                          uint32_t want, uint64_t *seq, unsigned prev, uint64_t *fseq,
                          const unsigned *modes, int nmodes, int mi, uint64_t *lat, int64_t *t,
                          int per, uint32_t at)
{
    unsigned char ans[16];
    uint32_t len = 99, tag = 0;
    int rc = gdrpy_chan_send(ch, msg, s, 0, tmo);
    if (!rc) rc = gdrpy_chan_recv(ch, ans, sizeof ans, &len, &tag, tmo);
    if (rc) {
        fprintf(stderr, "gdrpy_chanpp: ab floor: %s\n", gdrpy_last_error());
        return 1;
    }
    ++*seq;
    if (!answer_ok(prev, len, tag, ans, *seq, want, s, 0) &&
        !answer_ok(answer_shape, len, tag, ans, *seq, want, s, 0)) {
        fprintf(stderr, "gdrpy_chanpp: ab floor: wrong answer to message %llu\n",
                (unsigned long long)*seq);
        return 1;
    }
    gdrpy_chan_desc_t dsc;
    gdrpy_chan_get_desc(ch, &dsc);
    /* the flag: word 0 of the next message's slot (ab_floor) */
    size_t slot_off = 0;
    gdrpy_chan_slot_offset(ch, *seq, &slot_off);
    volatile uint64_t *flag =
        (volatile uint64_t *)((char *)gdrpy_chan_device_block(ch) + GDRPY_CHAN_DEV_CTRL + slot_off);
    if (modes[mi] & 33554432u) /* the flag in the device block's word 48 */
        flag = (volatile uint64_t *)((char *)gdrpy_chan_device_block(ch) + 48);
    else if (modes[mi] & 536870912u) /* the scanned line (ab_scan_line) */
        flag = (volatile uint64_t *)((char *)gdrpy_chan_device_block(ch) + at);
    const volatile uint64_t *answer =
        (const volatile uint64_t *)((char *)gdrpy_chan_host_block(ch) + 96);
    for (int i = -1; i <= per; i++) {
        uint64_t v = ++*fseq << 32; /* a zero low half: no LL word looks like it */
        if (i == per) {             /* leave: the next mode first */
            *(volatile uint32_t *)((char *)gdrpy_chan_device_block(ch) + 16) =
                modes[(mi + 1) % nmodes] & ~4096u; /* the next block starts on the channel */
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            v |= 1ull << 63;
        }
        uint64_t t0 = pt_now();
        *flag = v;
#if defined(__x86_64__)
        __asm__ __volatile__("sfence" ::: "memory"); /* as pplat: store, sfence */
#else
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
        uint64_t spins = 0;
        while (*answer != v)
            if (++spins > 2000000000ull) {
                fprintf(stderr, "gdrpy_chanpp: ab floor: no answer to flag %llu\n",
                        (unsigned long long)v);
                return 1;
            }
        uint64_t t1 = pt_now();
        if (i >= 0 && i < per) t[i] = pt_ns(t1 - t0);
    }
    /* the kernel's load latencies (SM cycles) of the flag's line and the device block */
    lat[0] += answer[1];
    lat[1] += answer[2];
    lat[2]++;
    if (modes[mi] & 536870912u) /* (the mode's report sorts all its blocks again) */
        printf("{\"path\": \"ab-scan\", \"offset\": %u, \"slot\": %u, \"line\": %u, "
               "\"median_us\": %.3f, \"flag_line_cycles\": %llu, \"atomic_cycles\": %llu}\n",
               at, (at - GDRPY_CHAN_DEV_CTRL) / dsc.slot_stride,
               (at - GDRPY_CHAN_DEV_CTRL) % dsc.slot_stride / 64,
               median_sort(t, (size_t)per) / 1000.0, (unsigned long long)answer[1],
               (unsigned long long)answer[3]);
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
    if (!answer_ok(answer_shape, clen, tag, ans, *seq, want, s, 0)) {
        fprintf(stderr, "gdrpy_chanpp: wrong answer to message %llu (%zu B): %u bytes, tag 0x%x "
                        "(expected checksum 0x%x)\n",
                (unsigned long long)*seq, s, clen, tag, want);
        return 1;
    }
    *t = pt_ns(t1 - t0);
    return 0;
}

/* --steer-probe VISITS: how fast would round trips be if messages only
 * used the ring's fast slots?  Times VISITS round trips per slot (4 bytes
 * of sizes[0]), splits the slots' medians at their largest gap (at their
 * median when no gap of 40 ns stands out), then
 * alternates blocks of 200 timed round trips with and without steering:
 * with it, a slow next slot first gets a filler message (sent and
 * answered, untimed), so the timed message lands on a fast slot. */
static int steer_probe(gdrpy_chan_t *ch, int visits, size_t s, int64_t tmo, uint64_t *seq)
{
    gdrpy_chan_desc_t dsc;
    gdrpy_chan_get_desc(ch, &dsc);
    const uint32_t n = dsc.nslots;
    unsigned char msg[64];
    for (size_t k = 0; k < s; k++) msg[k] = (unsigned char)(k * 7 + s);
    const uint32_t want = gdrpy_chan_checksum(msg, s);
    int64_t *ts = calloc((size_t)n * (size_t)visits, sizeof *ts);
    int64_t *med = calloc(n, sizeof *med), *srt = calloc(n, sizeof *srt);
    enum { PER = 200,
           ROUNDS = 40 };
    int64_t *tr[2] = {calloc(PER * ROUNDS, sizeof(int64_t)), calloc(PER * ROUNDS, sizeof(int64_t))};
    unsigned char *fast = calloc(n, 1);
    int rc = 1;
    if (!ts || !med || !srt || !tr[0] || !tr[1] || !fast) goto out;
    for (int v = 0; v < visits; v++)
        for (uint32_t k = 0; k < n; k++) {
            int64_t x;
            if (checked_rt(ch, msg, s, want, tmo, seq, &x)) goto out;
            ts[(size_t)((*seq - 1) & (n - 1)) * (size_t)visits + (size_t)v] = x;
        }
    for (uint32_t k = 0; k < n; k++)
        med[k] = srt[k] = median_sort(ts + (size_t)k * (size_t)visits, (size_t)visits);
    qsort(srt, n, sizeof *srt, cmp_i64);
    uint32_t cut = n; /* fast: median below srt[cut] */
    int64_t gap = 0;
    for (uint32_t k = n / 10; k + 1 < n - n / 10; k++)
        if (srt[k + 1] - srt[k] > gap) gap = srt[k + 1] - srt[k], cut = k + 1;
    /* two clear groups: split at the gap; otherwise at the median */
    const int64_t thr = gap >= 40 ? srt[cut] : srt[n / 2];
    uint32_t nfast = 0;
    for (uint32_t k = 0; k < n; k++) nfast += (fast[k] = med[k] < thr);
    printf("{\"path\": \"steer-slots\", \"slots\": %u, \"fast\": %u, \"gap_us\": %.3f, "
           "\"fast_median_us\": %.3f, \"slow_median_us\": %.3f}\n",
           n, nfast, gap / 1000.0, srt[(cut < n ? cut : n) / 2] / 1000.0,
           cut < n ? srt[cut + (n - cut) / 2] / 1000.0 : 0.0);
    printf("{\"path\": \"steer-deciles\", \"us\": [");
    for (int q = 0; q <= 10; q++) printf("%s%.3f", q ? ", " : "", srt[(n - 1) * (uint32_t)q / 10] / 1000.0);
    printf("]}\n");
    for (int r = 0; r < ROUNDS; r++)
        for (int m = 0; m < 2; m++)
            for (int i = -1; i < PER; i++) {
                int64_t x;
                if (m) /* steering: fillers into slow slots first */
                    while (!fast[*seq & (n - 1)])
                        if (checked_rt(ch, msg, s, want, tmo, seq, &x)) goto out;
                if (checked_rt(ch, msg, s, want, tmo, seq, &x)) goto out;
                if (i >= 0) tr[m][r * PER + i] = x;
            }
    report("c-steer-base", s, 1, tr[0], PER * ROUNDS);
    report("c-steer", s, 1, tr[1], PER * ROUNDS);
    rc = 0;
out:
    free(ts), free(med), free(srt), free(tr[0]), free(tr[1]), free(fast);
    return rc;
}

static int ab_answer(gdrpy_chan_t *ch, int rounds, const unsigned *modes, int nmodes, size_t s,
                     int64_t tmo, int64_t *t, uint64_t *seq)
{
    enum { PER = 200,
           BPER = 40 };
    int64_t *tb = calloc((size_t)rounds * BPER * (size_t)nmodes, sizeof *tb);
    if (!tb) return 1;
    int rc = 1;
    uint64_t lat[16][3] = {{0}};
    unsigned char msg[64];
    for (size_t k = 0; k < s; k++) msg[k] = (unsigned char)(k * 7 + s);
    const uint32_t want = gdrpy_chan_checksum(msg, s);
    volatile uint32_t *mode_word = (volatile uint32_t *)((char *)gdrpy_chan_device_block(ch) + 16);
    gdrpy_chan_desc_t dsc;
    gdrpy_chan_get_desc(ch, &dsc);
    unsigned prev = answer_shape;
    uint64_t fseq = 0;
    for (int r = 0; r < rounds; r++)
        for (int mi = 0; mi < nmodes; mi++) {
            /* mode 0: the channel's own answers (--answer) */
            const unsigned shape = (modes[mi] & 3u) ? modes[mi] & 3u : answer_shape;
            uint32_t at = 0;
            if (modes[mi] & 536870912u) {
                /* the scanned flag's offset, for the kernel's ab_floor (word 24) */
                at = ab_scan_line(&dsc, r);
                *(volatile uint32_t *)((char *)gdrpy_chan_device_block(ch) + 24) = at;
            }
            *mode_word = modes[mi];
            __atomic_thread_fence(__ATOMIC_SEQ_CST); /* x86: mfence, which also drains WC */
            if (modes[mi] & 4096u) {
                /* the flag-only floor in the kernel (ab_floor): after one
                 * channel round trip the kernel polls word 40 */
                if (ab_floor_block(ch, tmo, msg, s, want, seq, prev, &fseq, modes, nmodes, mi,
                                   lat[mi], t + (size_t)mi * rounds * PER + (size_t)r * PER, PER,
                                   at))
                    goto out;
                continue;
            }
            for (int i = -1; i < PER; i++) {
                unsigned char ans[16];
                uint32_t len = 99, tag = 0;
                uint64_t t0 = pt_now();
                int e = gdrpy_chan_send(ch, msg, s, 0, tmo);
                if (!e) e = gdrpy_chan_recv(ch, ans, sizeof ans, &len, &tag, tmo);
                uint64_t t1 = pt_now();
                if (e) {
                    fprintf(stderr, "gdrpy_chanpp: ab: %s\n", gdrpy_last_error());
                    goto out;
                }
                ++*seq;
                /* a message found by the kernel's burst round (after the
                 * last answer) gets the channel's own answer in every mode */
                int ok = answer_ok(shape, len, tag, ans, *seq, want, s, 0) ||
                         answer_ok(answer_shape, len, tag, ans, *seq, want, s, 0) ||
                         (i < 0 && answer_ok(prev, len, tag, ans, *seq, want, s, 0));
                if (!ok) {
                    fprintf(stderr, "gdrpy_chanpp: ab: wrong answer to message %llu in mode %u "
                                    "(len %u tag 0x%x)\n",
                            (unsigned long long)*seq, modes[mi], len, tag);
                    goto out;
                }
                if (i >= 0) t[(size_t)mi * rounds * PER + (size_t)r * PER + i] = pt_ns(t1 - t0);
            }
            prev = shape;
            /* batches of 32 ticks in this mode */
            for (int b = 0; b < BPER; b++) {
                enum { NB = 32 };
                gdrpy_chan_msg_t bm[NB];
                unsigned char bans[NB][16];
                uint32_t lens[NB], tags[NB];
                for (int k = 0; k < NB; k++) {
                    bm[k].buf = msg;
                    bm[k].len = (uint32_t)s;
                    bm[k].tag = (uint32_t)k;
                }
                size_t got = 0;
                uint64_t t0 = pt_now();
                int e = gdrpy_chan_send_batch(ch, bm, NB, tmo);
                if (!e) e = gdrpy_chan_recv_many(ch, bans, 16, lens, tags, NB, NB, tmo, &got);
                uint64_t t1 = pt_now();
                if (e) {
                    fprintf(stderr, "gdrpy_chanpp: ab batch: %s\n", gdrpy_last_error());
                    goto out;
                }
                for (int k = 0; k < NB; k++)
                    if (!answer_ok(shape, lens[k], tags[k], bans[k], *seq + 1 + (uint64_t)k, want, s,
                                   (uint32_t)k) &&
                        !answer_ok(answer_shape, lens[k], tags[k], bans[k], *seq + 1 + (uint64_t)k, want, s,
                                   (uint32_t)k)) {
                        fprintf(stderr, "gdrpy_chanpp: ab batch: wrong answer %d in mode %u\n", k,
                                modes[mi]);
                        goto out;
                    }
                *seq += NB;
                tb[(size_t)mi * rounds * BPER + (size_t)r * BPER + b] = pt_ns(t1 - t0);
            }
        }
    for (int mi = 0; mi < nmodes; mi++) {
        char name[32];
        snprintf(name, sizeof name, "ab-mode%u", modes[mi]);
        report(name, s, 1, t + (size_t)mi * rounds * PER, (size_t)rounds * PER);
        if (modes[mi] & 4096u) {
            if (lat[mi][2])
                printf("{\"path\": \"ab-floor-latency-mode%u\", \"flag_line_cycles\": %.0f, "
                       "\"device_block_cycles\": %.0f}\n",
                       modes[mi], (double)lat[mi][0] / lat[mi][2], (double)lat[mi][1] / lat[mi][2]);
            continue;
        }
        snprintf(name, sizeof name, "ab-batch32-mode%u", modes[mi]);
        report(name, s, 32, tb + (size_t)mi * rounds * BPER, (size_t)rounds * BPER);
    }
    rc = 0;
out:
    free(tb);
    return rc;
}

int chanvar_main(int argc, char **argv); /* chanvar.c: --variants */

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--variants") || !strcmp(argv[i], "--list-variants"))
            return chanvar_main(argc, argv);
        if (!strcmp(argv[i], "--timeline-selftest")) return chanpp_timeline_selftest();
    }
    const char *cubin = NULL, *kname = "gdrpy_pp_serve", *sizes_s = "4,64,1024,4096";
    int device = 0, iters = 10000, warmup = -1, batch = 32, cpu = -1, sim = 0, plain = 0, near = 0;
    int kernel_rounds = 0, timeline = 0, ab_rounds = 0, nab = 4, ab_sm = -1, steer_visits = 0;
    long comp_nslots = 0;
    unsigned ab_modes[16] = {0, 1, 2, 3}; /* tag channels: tag_modes below */
    int ab_modes_given = 0;
    const char *alloc_kind = "cumemalloc";
    double timeout_s = 5.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--sim")) {
            sim = 1;
            continue;
        }
        if (!strcmp(a, "--plain")) {
            plain = 1;
            continue;
        }
        if (!strcmp(a, "--near")) {
            near = 1;
            continue;
        }
        if (!strcmp(a, "--timeline")) {
            timeline = 1;
            continue;
        }
        if (!strcmp(a, "--kernel-rounds")) {
            kernel_rounds = 1;
            continue;
        }
        if (!v) die("option %s needs a value", a);
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
        else if (!strcmp(a, "--ab-answer")) ab_rounds = atoi(v);
        else if (!strcmp(a, "--ab-sm")) ab_sm = atoi(v);
        else if (!strcmp(a, "--steer-probe")) steer_visits = atoi(v);
        else if (!strcmp(a, "--comp-nslots")) comp_nslots = atol(v);
        else if (!strcmp(a, "--answer")) {
            if (!strcmp(v, "tag")) answer_shape = 1;
            else if (!strcmp(v, "line")) answer_shape = 0;
            else die("--answer must be tag or line");
        } else if (!strcmp(a, "--ab-modes")) {
            ab_modes_given = 1;
            nab = 0;
            for (const char *p = v; *p;) {
                char *end;
                unsigned long m = strtoul(p, &end, 10);
                if (end == p || (*end && *end != ',') || nab == 16) die("bad --ab-modes %s", v);
                ab_modes[nab++] = (unsigned)m;
                p = *end ? end + 1 : end;
            }
            if (nab == 0) die("bad --ab-modes %s", v);
        } else die("unknown option %s", a);
        i++;
    }
    if (iters <= 0) die("--iters must be positive");
    int vmm = !strcmp(alloc_kind, "vmm");
    if (!vmm && strcmp(alloc_kind, "cumemalloc")) die("--alloc must be cumemalloc or vmm");
    if (warmup < 0) warmup = iters / 10 > 10 ? iters / 10 : 10;
    if (!sim && !cubin) die("--cubin FILE is required (or --sim)");
    if (ab_rounds > 0 && sim) die("--ab-answer needs a GPU kernel built with -DGDRPY_PP_AB");
    if (!ab_modes_given && answer_shape == 1) { /* the default modes a tag channel can answer */
        const unsigned tag_modes[3] = {0, 1, 131073};
        memcpy(ab_modes, tag_modes, sizeof tag_modes);
        nab = 3;
    }
    for (int k = 0; k < nab && ab_rounds > 0; k++)
        if ((ab_modes[k] & 3u) >= 2u && answer_shape == 1)
            die("--ab-modes %u: shapes 2 and 3 answer with a 4-byte payload: add --answer line",
                ab_modes[k]);
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
    if (timeline && (batch < 2 || ab_rounds > 0 || steer_visits > 0))
        die("--timeline takes batches of 2 or more apart: not with --batch 1, --ab-answer or "
            "--steer-probe");
    int64_t tmo = (int64_t)(timeout_s * 1e9);

    /* ring: 256 slots of maxsize (>= batch) */
    gdrpy_chan_config_t cfg = {256, (uint32_t)maxsize, 0, answer_shape == 1 ? 0u : 16u,
                               (plain ? GDRPY_CHAN_PLAIN : 0) | (near ? GDRPY_CHAN_NEAR : 0), 0};
    while (cfg.nslots < (uint32_t)batch * 2) cfg.nslots *= 2;
    if (comp_nslots < 0 || comp_nslots > (1L << 20)) die("--comp-nslots %ld out of range", comp_nslots);
    cfg.comp_nslots = (uint32_t)comp_nslots; /* 0: nslots; the library checks the rest */
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
    /* --timeline: the array a -DGDRPY_PP_RSTAMPS kernel stamps its rounds
     * into; its device address where the kernel looks (before the launch) */
    CUdeviceptr tl_dev = 0;
    gdrpy_pin_t tl_pin;
    void *tl_map = NULL, *tl_user = NULL;
    if (timeline && !sim) {
        cucheck(cu.MemAlloc(&tl_dev, CHANPP_TL_BYTES), "cuMemAlloc");
        gcheck(gdrpy_pin(ctx, tl_dev, CHANPP_TL_BYTES, 0, &tl_pin), "pin");
        gcheck(gdrpy_map(ctx, tl_pin, &tl_map, &tl_user), "map");
        const uint64_t a = (uint64_t)tl_dev;
        gdrpy_copy_to_mapping((char *)gdrpy_chan_device_block(ch) + CHANPP_TL_DEV_OFFSET, &a, 8);
    }
    gdrpy_chan_sim_consumer_t *sc = NULL;
    unsigned long long idle_ns = (unsigned long long)(tmo > 0 ? tmo * 4 : 20000000000LL);
    if (sim) {
        gcheck(gdrpy_chan_sim_consumer_start(ch, GDRPY_CHAN_SIM_COMPLETE, 0, (int64_t)idle_ns, &sc),
               "sim consumer");
    } else {
        void *params[2] = {&desc, &idle_ns};
        /* --ab-sm: an -DGDRPY_PP_AB kernel serves from SM ab_sm (its blocks
         * on other SMs leave; the first on that SM claims the channel):
         * device block bytes 40 (the SM + 1; the channel zeroed it: any) and
         * 44 (the claim) */
        if (ab_sm >= 0) {
            *(volatile uint32_t *)((char *)gdrpy_chan_device_block(ch) + 40) = (uint32_t)ab_sm + 1u;
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
        }
        const unsigned blocks = ab_sm >= 0 ? 1024u : 1u;
        cucheck(cu.LaunchKernel(fn, blocks, 1, 1, 32, 1, 1, 0, st, params, NULL), "cuLaunchKernel");
    }
    gcheck(gdrpy_chan_wait_attached(ch, 10000000000LL), "wait for the kernel to attach");
    printf("{\"path\": \"info\", \"alloc\": \"%s\", \"format\": \"%s\", \"slots\": \"%s\", "
           "\"answer\": \"%s\", \"sm\": %d, ",
           sim ? "sim" : alloc_kind, plain ? "plain" : "ll", near ? "near" : "all",
           answer_shape == 1 ? "tag" : "line",
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
    if (ab_rounds > 0) {
        int64_t *ta = malloc(sizeof(int64_t) * (size_t)ab_rounds * 200 * (size_t)nab);
        if (!ta) die("out of memory");
        if (sizes[0] > 64) die("--ab-answer: the first size must be <= 64 bytes");
        rc = ab_answer(ch, ab_rounds, ab_modes, nab, sizes[0], tmo, ta, &seq);
        free(ta);
        nsizes = 0; /* nothing else */
        batch = 0;
    }
    if (steer_visits > 0 && !rc) {
        if (sizes[0] > 8) die("--steer-probe: the first size must be <= 8 bytes");
        rc = steer_probe(ch, steer_visits, sizes[0], tmo, &seq);
        nsizes = 0;
        batch = 0;
    }
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
                if (!answer_ok(answer_shape, alen[k], atag[k], ans[k], seq + 1 + (uint64_t)k, want, s, 0)) {
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
    chanpp_timeline_t *tl = NULL; /* reported once the kernel has stopped */
    if (!rc && timeline) {
        tl = chanpp_timeline_run(ch, bm, batch, sizes[0], tmo, &seq, tl_user, check_batch);
        if (!tl) rc = 1;
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
    if (kernel_rounds && !sim) { /* a kernel built with -DGDRPY_PP_ROUNDS left its counts */
        const volatile uint64_t *r =
            (const volatile uint64_t *)((char *)gdrpy_chan_host_block(ch) + 24);
        printf("{\"path\": \"kernel-rounds\", \"idle_finds\": %llu, \"bursts\": %llu, "
               "\"burst_cycles\": %llu, \"burst_poll_cycles\": %llu, \"burst_rest_cycles\": %llu}\n",
               (unsigned long long)r[0], (unsigned long long)r[1], (unsigned long long)r[2],
               (unsigned long long)r[3], (unsigned long long)r[4]);
    }
    chanpp_timeline_report(tl);
    if (ab_rounds > 0 && !sim) { /* the -DGDRPY_PP_AB kernel's idle-poll timeline */
        const volatile uint64_t *r =
            (const volatile uint64_t *)((char *)gdrpy_chan_host_block(ch) + 24);
        const double found = r[2] ? (double)r[2] : 1.0, samples = r[0] ? (double)r[0] : 1.0;
        printf("{\"path\": \"ab-timeline\", \"samples\": %llu, \"cycles_per_sample\": %.0f, "
               "\"answered\": %llu, \"issue_to_seen\": %.0f, \"seen_to_stored\": %.0f}\n",
               (unsigned long long)r[0], (double)r[1] / samples, (unsigned long long)r[2],
               (double)r[3] / found, (double)r[4] / found);
    }
    gdrpy_chan_destroy(ch);
    if (tl_map) {
        gdrpy_unmap(ctx, tl_pin);
        gdrpy_unpin(ctx, tl_pin);
        cu.MemFree(tl_dev);
    }
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
