/*
 * chanvar.c - `gdrpy_chanpp --variants`: the channel's 4-byte round trip
 * taken apart.  Every variant is one protocol choice (kernel side: the
 * macros of gdrpy/tools/chanvar_kernels.cu; host side: fences, PAUSE,
 * credit stores) and runs its own persistent kernel on its own memory;
 * variants run interleaved in rounds (drift cancels), each message is
 * checked on both sides, and a table says median / p99 / check / whether
 * the variant is correct by the memory model or only empirically.
 *
 *   gdrpy_chanpp --list-variants                  name<TAB>-D macros, one a line
 *   gdrpy_chanpp --variants --cubin-dir DIR [--only a,b] [--iters 20000]
 *                [--rounds 5] [--warmup 500] [--cpu N] [--device N] [--timeout S]
 *                [--alloc cumemalloc|vmm|both]
 *       --alloc: where the rings live: cuMemAlloc (default), cuMemCreate with
 *       gpuDirectRDMACapable (as GDRCopy's pplat -a cuMemCreate; rows NAME@vmm),
 *       or both side by side.  Every row also lists the SM its kernel ran on
 *       in each round ("sm:median"), since the persistent kernel's placement
 *       relative to the polled memory is one source of round-to-round spread.
 *   gdrpy_chanpp --variants --sim [--sim-corrupt a,b]   a CPU thread stands in for the
 *                kernel (--sim-corrupt: it answers every 997th message of those
 *                variants from a stale payload, to show that the checks fail)
 *
 * DIR holds NAME.cubin (or NAME.ptx) per variant, e.g. written by
 * `python -m gdrpy bench pingpong --variants` after NVRTC compiled
 * chanvar_kernels.cu with the variant's macros.  A variant whose image is
 * missing, that fails to launch, to answer (timeout) or to stop is reported
 * as such; the table is always printed.  Exit status: 0 when every variant
 * ran and passed its checks, 1 otherwise.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuvmm.h"
#include "ptimer.h"
#include "gdrpy.h"
#include "gdrpy_channel.h"

int chanvar_main(int argc, char **argv);

/* ---- the variants ------------------------------------------------------ */
typedef struct {
    const char *name;
    int floor, warp, poll, msg, pub, cons; /* kernel macros */
    int sfence2, pause, hcredit;           /* host side */
    int model;                             /* 1: correct by the memory models */
    const char *what;
    int library; /* the real thing: gdrpy_chan_* + gdrpy_pp_serve (2: PLAIN slots;
                  * 3: compiled with -DGDRPY_CHAN_POLL_LANES=1; 4: retired (the
                  * round-3 kernel, measured in docs/results.md); 5: -DGDRPY_PP_TIMING, the kernel
                  * reports its own cycles; 6: -DGDRPY_PP_ANSWER_LANE=1; 7, 8: the
                  * library's kernel and channel, the host side written out inline
                  * here: lib_roundtrip_inline; 10, 11, 12: -DGDRPY_CHAN_POLL_PIPE=2, 4, 8;
                  * 13: library again, a control row; 14: -DGDRPY_PP_FAST=0; 15, 16:
                  * rings of 8 and 256 slots: lib_cfg) */
    /* floor-flag (floor 1) taken a step towards the channel's traffic:
     * FX_FRING: the flag moves through the ring's slot lines (message packed
     * seq32 | data); FX_CRING: the answer moves through the completion lines;
     * FX_AW2 / FX_AW8: the answer is two 8-byte stores / the whole line by
     * four lanes (else one 8-byte store); FX_MLINE: the host writes the
     * message as a whole 64-byte line */
    int fx; /* FX_* bits; 0 elsewhere */
} variant_t;
enum {
    FX_FRING = 1,
    FX_CRING = 2,
    FX_AW2 = 4,
    FX_AW8 = 8,
    FX_MLINE = 16,
    FX_AW16 = 32,   /* answer: one 16-byte store */
    FX_AW32 = 64,   /* answer: two lanes x 16 bytes */
    FX_CS8 = 128,   /* with FX_CRING: completions 8 bytes apart (else 64) */
    FX_CS16 = 256,  /* ... 16 bytes apart */
    FX_CS32 = 512,  /* ... 32 bytes apart */
    FX_MAIL = 1024, /* answer: 32 bytes on the fixed line, then the ring's whole line */
};
#define V_FRING(v) (((v)->fx & FX_FRING) != 0)
#define V_CRING(v) (((v)->fx & FX_CRING) != 0)
static inline int v_aw(int fx)
{
    return fx & FX_AW8 ? 8 : fx & FX_AW2 ? 2
                         : fx & FX_AW16  ? 16
                         : fx & FX_AW32  ? 32
                         : fx & FX_MAIL  ? 40
                                         : 1;
}
static inline unsigned v_cs(int fx)
{
    return fx & FX_CS8 ? 8u : fx & FX_CS16 ? 16u
                          : fx & FX_CS32   ? 32u
                                           : 64u;
}
/* floor rows whose answer is whole 16-byte stores of the sequence (VAR_AW 8,
 * 16, 32, 40): how many 8-byte words of the polled line it covers; 0 else */
static inline int v_aw_words(int fx)
{
    const int aw = v_aw(fx);
    return aw == 8 ? 8 : aw == 16           ? 2
                     : aw == 32 || aw == 40 ? 4
                                            : 0;
}
#define V_AW(v) v_aw((v)->fx)
#define V_CS(v) v_cs((v)->fx)
#define V_MLINE(v) (((v)->fx & FX_MLINE) != 0)

/* lane0 = lib-like with lane 0 polling alone; every "lane0; ..." row changes
 * one thing from it; floors and combinations say what they are.  `model`:
 * see docs/channel.md "Variants" for the argument of each row. */
static const variant_t VARIANTS[] = {
    {"library", 0, 0, 0, 0, 0, 0, 1, 0, 0, 1,
     "gdrpy_chan_send/recv + gdrpy_pp_serve (channel_kernels.cu): the channel as shipped (LL)", 1, 0},
    {"library-timed", 0, 0, 0, 0, 0, 0, 1, 0, 0, 1,
     "library-nofast built with -DGDRPY_PP_TIMING (counts its own cycles; an empty poll = one call: up to 16 samples)", 5, 0},
    {"library-poll32", 0, 0, 0, 0, 0, 0, 1, 0, 0, 1,
     "library, but 32 slots polled also while idle (-DGDRPY_PP_POLL_ONE=0)", 9, 0},
    {"library-alane", 0, 0, 0, 0, 0, 0, 1, 0, 0, 1,
     "library, each answer written by its own lane (3 x 16-byte stores), not as one line", 6, 0},
    {"lib-inline64", 0, 0, 0, 0, 0, 0, 1, 0, 0, 1,
     "library kernel; host speaks LL inline (no calls): 64-byte line, sfence; spins on the answer",
     7, 0},
    {"lib-inline24", 0, 0, 0, 0, 0, 0, 1, 0, 0, 1,
     "lib-inline64, but the message is 3 8-byte stores (24 bytes; full line on the first lap)", 8, 0},
    {"library-again", 0, 0, 0, 0, 0, 0, 1, 0, 0, 1,
     "the library row once more, on its own memory (control: what placement alone changes)", 13, 0},
    {"library-pipe4", 0, 0, 0, 0, 0, 0, 1, 0, 0, 1,
     "library, idle poll with 4 loads in flight, answer from the poll (-DGDRPY_CHAN_POLL_PIPE=4)",
     11, 0},
    {"library-pipe2", 0, 0, 0, 0, 0, 0, 1, 0, 0, 1,
     "library, idle poll with 2 loads in flight (-DGDRPY_CHAN_POLL_PIPE=2)", 10, 0},
    {"library-ring8", 0, 0, 0, 0, 0, 0, 1, 0, 0, 1,
     "library on a ring of 8 slots and 8 completion slots (64: fewer lines in turn)", 15, 0},
    {"library-ring256", 0, 0, 0, 0, 0, 0, 1, 0, 0, 1,
     "library on a ring of 256 slots and 256 completion slots (as bench pingpong's C run)", 16, 0},
    {"library-nofast", 0, 0, 0, 0, 0, 0, 1, 0, 0, 1,
     "library, the poll returns and the loop answers (-DGDRPY_PP_FAST=0: no answer from the poll)",
     14, 0},
    {"library-pipe8", 0, 0, 0, 0, 0, 0, 1, 0, 0, 1,
     "library, idle poll with 8 loads in flight (-DGDRPY_CHAN_POLL_PIPE=8)", 12, 0},
    {"library-plain", 0, 0, 0, 0, 0, 0, 1, 0, 0, 1,
     "the same channel with GDRPY_CHAN_PLAIN slots (acquire poll, release completions)", 2, 0},
    {"library-poll1", 0, 0, 0, 0, 0, 0, 1, 0, 0, 1,
     "library (LL), but lane 0 alone polls (GDRPY_CHAN_POLL_LANES=1: no batches)", 3, 0},
    {"floor-flag", 1, 0, 4, 0, 4, 0, 1, 0, 0, 1,
     "pplat flag-only: host flag store+sfence; thread 0 volatile poll, volatile answer", 0, 0},
    {"floor-data", 2, 0, 4, 0, 4, 0, 1, 0, 0, 0,
     "pplat data+flag: data,sfence,flag,sfence; volatile loads/stores, no GPU fences", 0, 0},
    {"floor-ring", 1, 0, 4, 0, 4, 0, 1, 0, 0, 1,
     "floor-flag, but the flag (seq32|data) moves through the 64 slot lines", 0, FX_FRING},
    {"floor-cring", 1, 0, 4, 0, 4, 0, 1, 0, 0, 1,
     "floor-flag, but the answer moves through the 64 completion lines", 0, FX_CRING},
    {"floor-2w", 1, 0, 4, 0, 4, 0, 1, 0, 0, 1,
     "floor-flag, answer = two 8-byte stores each carrying seq32 (host checks both)", 0, FX_AW2},
    {"floor-aline", 1, 0, 4, 0, 4, 0, 1, 0, 0, 1,
     "floor-flag, answer = the whole 64-byte line, 4 lanes x 16 bytes (as the library)", 0, FX_AW8},
    {"floor-mline", 1, 0, 4, 0, 4, 0, 1, 0, 0, 1,
     "floor-flag, the host writes the flag as a whole 64-byte line (as the library)", 0, FX_MLINE},
    {"floor-all", 1, 0, 4, 0, 4, 0, 1, 0, 0, 1,
     "floor-ring + floor-cring + floor-aline + floor-mline: the library's traffic, floor's kernel",
     0, FX_FRING | FX_CRING | FX_AW8 | FX_MLINE},
    {"floor-mail", 1, 0, 4, 0, 4, 0, 1, 0, 0, 1,
     "floor-a32 (a 32-byte answer on the fixed line), then the whole completion line in the "
     "ring: does the ring's write slow the mailbox?",
     0, FX_MAIL},
    {"floor-a16", 1, 0, 4, 0, 4, 0, 1, 0, 0, 1,
     "floor-flag, answer = one 16-byte store (one lane)", 0, FX_AW16},
    {"floor-a32", 1, 0, 4, 0, 4, 0, 1, 0, 0, 1,
     "floor-flag, answer = 32 bytes, two lanes x 16", 0, FX_AW32},
    {"floor-cring8", 1, 0, 4, 0, 4, 0, 1, 0, 0, 1,
     "floor-cring, completions 8 bytes apart (8 to a line)", 0, FX_CRING | FX_CS8},
    {"floor-cring16", 1, 0, 4, 0, 4, 0, 1, 0, 0, 1,
     "floor-cring, completions of two 8-byte words, 16 bytes apart (4 to a line)", 0,
     FX_CRING | FX_CS16 | FX_AW2},
    {"floor-cring16v", 1, 0, 4, 0, 4, 0, 1, 0, 0, 1,
     "floor-cring16, the completion as one 16-byte store", 0, FX_CRING | FX_CS16 | FX_AW16},
    {"floor-cring32", 1, 0, 4, 0, 4, 0, 1, 0, 0, 1,
     "floor-cring, completions of 32 bytes (two lanes), 32 bytes apart (2 to a line)", 0,
     FX_CRING | FX_CS32 | FX_AW32},
    {"lib-like", 0, 1, 0, 0, 0, 2, 1, 0, 0, 1,
     "the library's choices: 32 lanes poll (acquire.sys) + ballot, st.release.sys seq, "
     "consumed, 2 sfence",
     0, 0},
    {"lane0", 0, 0, 0, 0, 0, 2, 1, 0, 0, 1, "lib-like, but lane 0 alone polls and answers", 0, 0},
    {"poll-relaxed+fsys", 0, 0, 2, 0, 0, 2, 1, 0, 0, 1,
     "lane0; poll ld.relaxed.sys, then fence.acq_rel.sys", 0, 0},
    {"poll-acq.gpu", 0, 0, 1, 0, 0, 2, 1, 0, 0, 0, "lane0; poll ld.acquire.gpu", 0, 0},
    {"poll-vol+fgpu", 0, 0, 3, 0, 0, 2, 1, 0, 0, 0,
     "lane0; poll ld.volatile, then fence.acq_rel.gpu (__threadfence)", 0, 0},
    {"poll-vol", 0, 0, 4, 0, 0, 2, 1, 0, 0, 0, "lane0; poll ld.volatile, no fence", 0, 0},
    {"pub-fsc.sys", 0, 0, 0, 0, 1, 2, 1, 0, 0, 1,
     "lane0; publish __threadfence_system + volatile seq", 0, 0},
    {"pub-facqrel.sys", 0, 0, 0, 0, 2, 2, 1, 0, 0, 1,
     "lane0; publish fence.acq_rel.sys + volatile seq", 0, 0},
    {"pub-LL", 0, 0, 0, 0, 3, 3, 1, 0, 0, 1,
     "lane0; completion words each carry seq32 (no fence); consumed st.release.sys every 32", 0, 0},
    {"pub-vol", 0, 0, 0, 0, 4, 0, 1, 0, 0, 0, "lane0; volatile payload, volatile seq, no fence", 0, 0},
    {"no-consumed", 0, 0, 0, 0, 0, 0, 1, 0, 0, 1,
     "lane0; no consumed store (the release completion is the credit)", 0, 0},
    {"sfence1", 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, "lane0; host: no sfence after the seq store", 0, 0},
    {"pause", 0, 0, 0, 0, 0, 2, 1, 1, 0, 1, "lane0; host spins with PAUSE", 0, 0},
    {"hcredit", 0, 0, 0, 0, 0, 2, 1, 0, 1, 1,
     "lane0; host stores its completion count (+sfence) every message", 0, 0},
    {"msg-packed", 0, 0, 0, 1, 0, 2, 1, 0, 0, 1,
     "lane0; message = one 8-byte store seq32|data, then sfence", 0, 0},
    {"best-model", 0, 0, 0, 1, 3, 3, 1, 0, 0, 1,
     "lane0 acquire.sys poll, packed msg, LL completion, lazy release consumed", 0, 0},
    {"packed-vol", 0, 0, 4, 1, 3, 3, 1, 0, 0, 1,
     "best-model with a volatile poll: the whole message is in the polled word", 0, 0},
    {"best-empirical", 0, 0, 4, 1, 3, 0, 1, 0, 0, 0,
     "lane0 volatile poll, packed msg, LL completion, no consumed", 0, 0},
};
#define NV ((int)(sizeof VARIANTS / sizeof VARIANTS[0]))

static void defines(const variant_t *v, char *out, size_t n)
{
    if (v->library) {
        snprintf(out, n, "@%s%s", "channel_kernels.cu",
                 v->library == 3    ? " -DGDRPY_CHAN_POLL_LANES=1"
                 : v->library == 5  ? " -DGDRPY_PP_TIMING=1 -DGDRPY_PP_FAST=0"
                 : v->library == 6  ? " -DGDRPY_PP_ANSWER_LANE=1"
                 : v->library == 9  ? " -DGDRPY_PP_POLL_ONE=0"
                 : v->library == 10 ? " -DGDRPY_CHAN_POLL_PIPE=2"
                 : v->library == 11 ? " -DGDRPY_CHAN_POLL_PIPE=4"
                 : v->library == 12 ? " -DGDRPY_CHAN_POLL_PIPE=8"
                 : v->library == 14 ? " -DGDRPY_PP_FAST=0"
                                    : "");
        return;
    }
    snprintf(out, n, "-DVAR_FLOOR=%d -DVAR_WARP=%d -DVAR_POLL=%d -DVAR_MSG=%d -DVAR_PUB=%d "
                     "-DVAR_CONS=%d -DVAR_FRING=%d -DVAR_CRING=%d -DVAR_AW=%d -DVAR_CS=%u",
             v->floor, v->warp, v->poll, v->msg, v->pub, v->cons, V_FRING(v), V_CRING(v), V_AW(v) == 1 ? 0 : V_AW(v), V_CS(v));
}

/* ---- layout (chanvar_kernels.cu) -------------------------------------- */
#define CV_NSLOTS 64u
#define CV_RING 128u
#define CV_COMP 128u
#define CV_REGION 8192u

static inline uint32_t cv_pat(uint64_t i)
{
    return (uint32_t)(i * 0x9E3779B97F4A7C15ull >> 32) ^ 0x5bd1e995u;
}
static inline uint32_t cv_csum(uint64_t i) { return cv_pat(i) * 2654435761u + (uint32_t)(i + 1); }

/* ---- CUDA driver (dlopen) ---------------------------------------------- */
typedef int CUresult;
typedef uint64_t CUdeviceptr;
static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(int *, int);
    CUresult (*PrimaryCtxRetain)(void **, int);
    CUresult (*CtxSetCurrent)(void *);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*HostAlloc)(void **, size_t, unsigned);
    CUresult (*HostGetDevicePointer)(CUdeviceptr *, void *, unsigned);
    CUresult (*ModuleLoadData)(void **, const void *);
    CUresult (*ModuleGetFunction)(void **, void *, const char *);
    CUresult (*StreamCreate)(void **, unsigned);
    CUresult (*StreamQuery)(void *);
    CUresult (*LaunchKernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, void *, void **, void **);
} cv_cu;

static int cv_load_cuda(char *err, size_t n)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        snprintf(err, n, "cannot load libcuda.so.1: %s", dlerror());
        return -1;
    }
#define L(f, s)                                      \
    do {                                             \
        *(void **)&cv_cu.f = dlsym(h, s);            \
        if (!cv_cu.f) {                              \
            snprintf(err, n, "libcuda lacks %s", s); \
            return -1;                               \
        }                                            \
    } while (0)
    L(Init, "cuInit");
    L(DeviceGet, "cuDeviceGet");
    L(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    L(CtxSetCurrent, "cuCtxSetCurrent");
    L(MemAlloc, "cuMemAlloc_v2");
    L(HostAlloc, "cuMemHostAlloc");
    L(HostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
    L(ModuleLoadData, "cuModuleLoadData");
    L(ModuleGetFunction, "cuModuleGetFunction");
    L(StreamCreate, "cuStreamCreate");
    L(StreamQuery, "cuStreamQuery");
    L(LaunchKernel, "cuLaunchKernel");
#undef L
    return 0;
}

/* ---- small helpers ----------------------------------------------------- */
static inline int64_t cv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cv_sfence(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__ __volatile__("sfence" ::: "memory");
#elif defined(__aarch64__)
    __asm__ __volatile__("dmb oshst" ::: "memory");
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

static inline void cv_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static inline void st64(char *p, uint64_t v) { *(volatile uint64_t *)p = v; }
static inline void st32(char *p, uint32_t v) { *(volatile uint32_t *)p = v; }
static inline uint64_t ld64(const char *p)
{
    return __atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE);
}
static inline uint32_t ld32(const char *p)
{
    return __atomic_load_n((const uint32_t *)p, __ATOMIC_ACQUIRE);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* ---- per-variant state ------------------------------------------------- */
typedef struct {
    const variant_t *v;
    char *dev;        /* CPU address of its device region (BAR1 / sim) */
    char *host;       /* CPU address of its host region */
    uint64_t dev_gpu; /* GPU addresses of both */
    uint64_t host_gpu;
    void *fn, *stream;
    uint64_t next;   /* next message index */
    uint64_t credit; /* consumed count last read */
    int64_t *t;      /* samples */
    size_t nt;
    double round_med[64];
    int round_sm[64]; /* the SM the round's kernel ran on (-1: unknown) */
    int nrounds;
    int vmm;    /* memory from cuMemCreate (gpuDirectRDMACapable), not cuMemAlloc */
    int cur_sm; /* this round's */
    char name[48];
    uint64_t host_bad; /* answers with a wrong checksum/seq */
    uint64_t kern_bad; /* messages the kernel found stale */
    char state[160];   /* "" = fine, else why it stopped */
    pthread_t sim_thr; /* --sim */
    int sim_running;
    int corrupt; /* --sim-corrupt: the stand-in reads a stale payload now and then */
    /* library: a channel per round on its own pinned memory */
    gdrpy_ctx_t ctx;
    gdrpy_pin_t pin;
    gdrpy_chan_t *ch;
    gdrpy_chan_sim_consumer_t *sc;
    uint64_t lseq;    /* messages sent on this round's channel */
    uint64_t rpub;    /* lib-inline*: completions read and published to the kernel */
    unsigned lat;     /* pipelined polls: the kernel's load latency, cycles (host block [20]) */
    unsigned lat_end; /* ... and what its poll learned by the end (written before stopped) */
    uint64_t kt[5];   /* library-timed: the kernel's busy cycles, rounds, empty polls,
                     * cycles and ns from attach to stop (host block [24..63]) */
} vstate_t;

static const gdrpy_chan_config_t LIB_CFG = {64, 16, 0, 16, 0, 0};
static const gdrpy_chan_config_t LIB_CFG_PLAIN = {64, 16, 0, 16, GDRPY_CHAN_PLAIN, 0};
static const gdrpy_chan_config_t LIB_CFG_RING8 = {8, 16, 0, 16, 0, 0};
static const gdrpy_chan_config_t LIB_CFG_RING256 = {256, 16, 0, 16, 0, 0};

/* The library rows' channel: 64 slots of 16 bytes (2: PLAIN; 15: 8 slots;
 * 16: 256 slots - how much touching a new line per message costs). */
static const gdrpy_chan_config_t *lib_cfg(const variant_t *v)
{
    return v->library == 2    ? &LIB_CFG_PLAIN
           : v->library == 15 ? &LIB_CFG_RING8
           : v->library == 16 ? &LIB_CFG_RING256
                              : &LIB_CFG;
}

static int lib_start(vstate_t *s, int sim, int64_t tmo_ns)
{
    s->lseq = 0;
    s->credit = 0; /* lib-inline*: this round's channel starts empty */
    s->rpub = 0;
    int rc = gdrpy_chan_create(s->ctx, s->pin, lib_cfg(s->v),
                               &s->ch);
    if (rc) {
        snprintf(s->state, sizeof s->state, "chan_create: %.120s", gdrpy_last_error());
        return -1;
    }
    gdrpy_chan_desc_t desc;
    gdrpy_chan_get_desc(s->ch, &desc);
    unsigned long long idle = 2000000000ull;
    if (sim) {
        rc = gdrpy_chan_sim_consumer_start(s->ch, GDRPY_CHAN_SIM_COMPLETE, 0, (int64_t)idle, &s->sc);
        if (rc) {
            snprintf(s->state, sizeof s->state, "sim consumer: %.120s", gdrpy_last_error());
            return -1;
        }
    } else {
        void *params[2] = {&desc, &idle};
        CUresult r = cv_cu.LaunchKernel(s->fn, 1, 1, 1, 32, 1, 1, 0, s->stream, params, NULL);
        if (r) {
            snprintf(s->state, sizeof s->state, "LAUNCH failed (CUresult %d)", r);
            return -1;
        }
    }
    if (gdrpy_chan_wait_attached(s->ch, tmo_ns * 5)) {
        snprintf(s->state, sizeof s->state, "NOATTACH: %.120s", gdrpy_last_error());
        return -1;
    }
    s->cur_sm = sim ? -1 : (int)ld32((const char *)gdrpy_chan_host_block(s->ch) + GDRPY_CHAN_HOST_SMID);
    if (!sim) s->lat = ld32((const char *)gdrpy_chan_host_block(s->ch) + 20);
    return 0;
}

static int lib_roundtrip(vstate_t *s, int64_t tmo_ns, int64_t *dt)
{
    uint32_t data = cv_pat(s->next);
    struct {
        uint64_t seq;
        uint32_t csum, len;
    } ans;
    uint64_t t0 = pt_now();
    int rc = gdrpy_chan_send(s->ch, &data, 4, (uint32_t)s->next, tmo_ns);
    if (!rc) rc = gdrpy_chan_recv(s->ch, &ans, sizeof ans, NULL, NULL, tmo_ns);
    uint64_t t1 = pt_now();
    if (rc) {
        snprintf(s->state, sizeof s->state, "TIMEOUT/ERROR: %.120s", gdrpy_last_error());
        return -1;
    }
    s->lseq++;
    if (ans.seq != s->lseq || ans.len != 4 || ans.csum != gdrpy_chan_checksum(&data, 4))
        s->host_bad++;
    s->next++;
    *dt = pt_ns(t1 - t0);
    return 0;
}

/* lib-inline64 / lib-inline24: the channel's LL protocol (gdrpy_channel.h)
 * for one 4-byte message and its 16-byte answer, written out here without
 * the library's calls, to tell the host's own cost from the kernel's.  Slot
 * credit: the kernel's consumed count (host block [0]); completion credit:
 * the count read, published every 32 (device block [64]), as the library. */
static inline uint64_t llw(uint32_t f, uint32_t d) { return (uint64_t)f | (uint64_t)d << 32; }

static int lib_roundtrip_inline(vstate_t *s, int64_t tmo_ns, int64_t *dt)
{
    gdrpy_chan_desc_t d;
    gdrpy_chan_get_desc(s->ch, &d);
    char *dev = gdrpy_chan_device_block(s->ch), *host = gdrpy_chan_host_block(s->ch);
    char *ring = dev + (d.ring - d.dev_ctrl), *comp = host + (d.comp - d.host_ctrl);
    uint64_t i = s->lseq;
    uint32_t f = (uint32_t)(i + 1), data = cv_pat(s->next), tag = (uint32_t)s->next;
    int64_t end = 0;
    for (unsigned n = 0; i - s->credit >= d.nslots; n++) { /* slot reuse */
        s->credit = ld64(host + GDRPY_CHAN_HOST_CONSUMED);
        if ((n & 1023u) == 1023u && !end) end = cv_now() + tmo_ns;
        else if ((n & 1023u) == 1023u && cv_now() > end) {
            snprintf(s->state, sizeof s->state, "TIMEOUT waiting for consumed (msg %llu)",
                     (unsigned long long)i);
            return -1;
        }
    }
    char *slot = ring + (size_t)(i & (d.nslots - 1)) * d.slot_stride;
    const char *c = comp + (size_t)(i & (d.comp_nslots - 1)) * d.comp_stride;
    uint64_t t0 = pt_now();
    if (s->v->library != 8 || (i & 0x7fffffffull) < d.nslots) { /* 8: refresh lap only */
        uint64_t w[8] __attribute__((aligned(64))) = {llw(f, tag), llw(f, 4), llw(f, data),
                                                      llw(f, 0), llw(f, 0), llw(f, 0),
                                                      llw(f, 0), llw(f, 0)};
        __builtin_memcpy(slot, w, 64); /* slot_size 16: 6 LL words + 2 pad, one line */
        __asm__ __volatile__("" ::: "memory");
    } else {
        st64(slot + 16, llw(f, data));
        st64(slot + 8, llw(f, 4));
        st64(slot, llw(f, tag));
    }
    cv_sfence();
    uint64_t a[6];
    end = 0;
    for (unsigned n = 0;; n++) {
        int ok = 1;
        for (int k = 0; k < 6 && ok; k++) {
            a[k] = ld64(c + 8 * k);
            ok = (uint32_t)a[k] == f;
        }
        if (ok) break;
        if ((n & 1023u) == 1023u && !end) end = cv_now() + tmo_ns;
        else if ((n & 1023u) == 1023u && cv_now() > end) {
            snprintf(s->state, sizeof s->state, "TIMEOUT: no answer to message %llu",
                     (unsigned long long)i);
            return -1;
        }
    }
    uint64_t t1 = pt_now();
    s->lseq = i + 1;
    if (s->lseq - s->rpub >= d.comp_nslots / 2) {
        st64(dev + GDRPY_CHAN_DEV_COMP_READ, s->lseq);
        cv_sfence();
        s->rpub = s->lseq;
    }
    uint64_t seq = (a[2] >> 32) | (a[3] >> 32) << 32;
    if ((uint32_t)(a[0] >> 32) != tag || (uint32_t)(a[1] >> 32) != 16u || seq != i + 1 ||
        (uint32_t)(a[4] >> 32) != gdrpy_chan_checksum(&data, 4) || (uint32_t)(a[5] >> 32) != 4u)
        s->host_bad++;
    s->next++;
    *dt = pt_ns(t1 - t0);
    return 0;
}

static int lib_stop(vstate_t *s, int sim, int64_t tmo_ns)
{
    int ret = 0;
    if (!s->ch) return 0;
    gdrpy_chan_stats_t st;
    if (gdrpy_chan_shutdown(s->ch, GDRPY_CHAN_ABORT, tmo_ns * 3, &st)) {
        if (!s->state[0])
            snprintf(s->state, sizeof s->state, "HANG: shutdown: %.120s", gdrpy_last_error());
        ret = -1;
    }
    if (sim && s->sc) gdrpy_chan_sim_consumer_join(s->sc, NULL, NULL, NULL);
    s->sc = NULL;
    if (ret == 0 && !sim) s->lat_end = ld32((const char *)gdrpy_chan_host_block(s->ch) + 20);
    if (ret == 0 && s->v->library == 5 && !sim) /* written before status STOPPED */
        for (int k = 0; k < 5; k++)
            s->kt[k] += ld64((const char *)gdrpy_chan_host_block(s->ch) + 24 + 8 * k);
    if (!sim) {
        int64_t end = cv_now() + tmo_ns * 3;
        while (cv_cu.StreamQuery(s->stream) == 600)
            if (cv_now() > end) {
                if (!s->state[0])
                    snprintf(s->state, sizeof s->state, "HANG: the kernel did not stop");
                return -1; /* channel left as is: the kernel may still use it */
            }
    }
    if (ret == 0) {
        gdrpy_chan_destroy(s->ch);
        s->ch = NULL;
    }
    return ret;
}

/* ---- sim stand-in for the kernel (the same protocol on a CPU thread) --- */
static void *sim_kernel(void *arg)
{
    vstate_t *s = arg;
    const variant_t *v = s->v;
    char *dev = s->dev, *host = s->host;
    uint64_t head = s->next, nbad = 0;
    int64_t idle_since = 0;
    unsigned spins = 0;
    uint32_t status = 2;
    __atomic_store_n((uint32_t *)(host + 8), 1u, __ATOMIC_RELEASE);
    for (;;) {
        int ready;
        char *slot = dev + CV_RING + (head & (CV_NSLOTS - 1)) * 64u;
        if (v->floor && V_FRING(v)) ready = (uint32_t)ld64(slot) == (uint32_t)(head + 1);
        else if (v->floor) ready = ld64(dev + 64) == head + 1;
        else if (v->msg) ready = (uint32_t)ld64(slot) == (uint32_t)(head + 1);
        else ready = ld64(slot) == head + 1;
        if (!ready) {
            if ((++spins & 255u) == 0) {
                if (ld32(dev)) break;
                int64_t now = cv_now();
                if (!idle_since) idle_since = now;
                else if (now - idle_since > 2000000000LL) {
                    status = 3;
                    break;
                }
                if ((spins & 4095u) == 0) sched_yield();
            }
            continue;
        }
        spins = 0;
        idle_since = 0;
        uint32_t data, bad;
        if (v->floor) {
            data = v->floor == 2 ? ld32(dev + 72) : V_FRING(v) ? (uint32_t)(ld64(slot) >> 32)
                                                               : cv_pat(head);
            bad = data != cv_pat(head);
        } else if (v->msg) {
            uint64_t w = ld64(slot);
            data = (uint32_t)(w >> 32);
            bad = data != cv_pat(head);
        } else {
            uint64_t h = ld64(slot + 8);
            data = ld32(slot + 16);
            bad = (uint32_t)h != 4u || (uint32_t)(h >> 32) != (uint32_t)head || data != cv_pat(head);
        }
        if (s->corrupt && head % 997 == 996) { /* as if it had read the previous lap's bytes */
            data = cv_pat(head - CV_NSLOTS);
            bad = 0; /* the stand-in does not notice: the host must */
        }
        if (bad) {
            if (!nbad) __atomic_store_n((uint64_t *)(host + 24), head + 1, __ATOMIC_RELAXED);
            __atomic_store_n((uint64_t *)(host + 16), ++nbad, __ATOMIC_RELAXED);
        }
        uint32_t cs = data * 2654435761u + (uint32_t)(head + 1);
        if (v->floor) {
            char *c = V_CRING(v) ? host + CV_COMP + (head & (CV_NSLOTS - 1)) * V_CS(v) : host + 64;
            if (v->floor == 2) __atomic_store_n((uint32_t *)(host + 72), cs, __ATOMIC_RELAXED);
            if (v->floor == 1 && V_AW(v) == 2) {
                const uint64_t aw = (uint32_t)(head + 1) | ((uint64_t)cs << 32);
                __atomic_store_n((uint64_t *)(c + 8), aw, __ATOMIC_RELAXED);
                __atomic_store_n((uint64_t *)c, aw, __ATOMIC_RELEASE);
            } else if (v->floor == 1 && v_aw_words(v->fx)) {
                for (int k = v_aw_words(v->fx) - 1; k >= 0; k--)
                    __atomic_store_n((uint64_t *)(c + 8 * k), head + 1, __ATOMIC_RELEASE);
                /* 40: the 32-byte mailbox on the fixed line, then the ring's line */
                char *r = host + CV_COMP + (head & (CV_NSLOTS - 1)) * 64u;
                for (int k = 0; V_AW(v) == 40 && k < 8; k++)
                    __atomic_store_n((uint64_t *)(r + 8 * k), head + 1, __ATOMIC_RELAXED);
            } else {
                __atomic_store_n((uint64_t *)c, head + 1, __ATOMIC_RELEASE);
            }
        } else {
            char *c = host + CV_COMP + (head & (CV_NSLOTS - 1)) * 64u;
            if (v->pub == 3) {
                __atomic_store_n((uint64_t *)(c + 8), (uint32_t)(head + 1) | ((uint64_t)bad << 32),
                                 __ATOMIC_RELAXED);
                __atomic_store_n((uint64_t *)c, (uint32_t)(head + 1) | ((uint64_t)cs << 32),
                                 __ATOMIC_RELEASE);
            } else {
                __atomic_store_n((uint64_t *)(c + 8), cs | ((uint64_t)bad << 32), __ATOMIC_RELAXED);
                __atomic_store_n((uint64_t *)c, head + 1, __ATOMIC_RELEASE);
            }
            if (v->cons == 1 || v->cons == 2 || (v->cons == 3 && ((head + 1) & 31u) == 0))
                __atomic_store_n((uint64_t *)host, head + 1, __ATOMIC_RELEASE);
        }
        head++;
    }
    __atomic_store_n((uint64_t *)host, head, __ATOMIC_RELEASE);
    __atomic_store_n((uint32_t *)(host + 8), status, __ATOMIC_RELEASE);
    return NULL;
}

/* ---- one round trip ---------------------------------------------------- */
/* 0, or -1 on timeout (s->state says so). */
static int roundtrip(vstate_t *s, int64_t tmo_ns, int64_t *dt)
{
    if (s->v->library == 7 || s->v->library == 8) return lib_roundtrip_inline(s, tmo_ns, dt);
    if (s->v->library) return lib_roundtrip(s, tmo_ns, dt);
    const variant_t *v = s->v;
    uint64_t i = s->next, seq = i + 1;
    char *dev = s->dev, *host = s->host;
    uint64_t t0 = pt_now(); /* the timeouts' clock starts only after 1024 spins */
    /* send */
    if (v->floor) {
        if (v->floor == 2) {
            st32(dev + 72, cv_pat(i));
            cv_sfence();
        }
        char *f = V_FRING(v) ? dev + CV_RING + (i & (CV_NSLOTS - 1)) * 64u : dev + 64;
        const uint64_t w = V_FRING(v) ? (uint32_t)seq | ((uint64_t)cv_pat(i) << 32) : seq;
        if (V_MLINE(v)) /* the whole line, word 0 last (one write-combined line) */
            for (int k = 7; k >= 0; k--) st64(f + 8 * k, w);
        else
            st64(f, w);
        cv_sfence();
    } else {
        if (v->cons && i - s->credit >= CV_NSLOTS) { /* slot reuse: wait for the release */
            int64_t end = 0;
            for (unsigned n = 0;; n++) {
                s->credit = ld64(host);
                if (i - s->credit < CV_NSLOTS) break;
                if ((n & 1023u) == 1023u && !end) end = cv_now() + tmo_ns;
                else if ((n & 1023u) == 1023u && cv_now() > end) {
                    snprintf(s->state, sizeof s->state, "TIMEOUT waiting for consumed (msg %llu)",
                             (unsigned long long)i);
                    return -1;
                }
            }
        }
        char *slot = dev + CV_RING + (i & (CV_NSLOTS - 1)) * 64u;
        if (v->msg) {
            st64(slot, (uint32_t)seq | ((uint64_t)cv_pat(i) << 32));
            cv_sfence();
        } else {
            st64(slot + 8, 4u | ((uint64_t)(uint32_t)i << 32));
            st32(slot + 16, cv_pat(i));
            cv_sfence(); /* payload before seq */
            st64(slot, seq);
            if (v->sfence2) cv_sfence(); /* push it out now */
        }
    }
    /* receive */
    const char *c = v->floor && !V_CRING(v) ? host + 64
                    : v->floor              ? host + CV_COMP + (i & (CV_NSLOTS - 1)) * V_CS(v)
                                            : host + CV_COMP + (i & (CV_NSLOTS - 1)) * 64u;
    int64_t end = 0;
    uint32_t cs, bad = 0;
    for (unsigned n = 0;; n++) {
        int ok;
        if (v->floor == 1 && V_AW(v) == 2)
            ok = (uint32_t)ld64(c) == (uint32_t)seq && (uint32_t)ld64(c + 8) == (uint32_t)seq;
        else if (v->floor == 1 && v_aw_words(v->fx)) /* its first and last word */
            ok = ld64(c) == seq && ld64(c + 8 * (v_aw_words(v->fx) - 1)) == seq;
        else if (v->floor) ok = ld64(c) == seq;
        else if (v->pub == 3)
            ok = (uint32_t)ld64(c) == (uint32_t)seq && (uint32_t)ld64(c + 8) == (uint32_t)seq;
        else ok = ld64(c) == seq;
        if (ok) break;
        if (v->pause) cv_pause();
        if ((n & 1023u) == 1023u && !end) end = cv_now() + tmo_ns;
        else if ((n & 1023u) == 1023u && cv_now() > end) {
            snprintf(s->state, sizeof s->state, "TIMEOUT: no answer to message %llu",
                     (unsigned long long)i);
            return -1;
        }
    }
    if (v->floor == 1 && V_AW(v) == 2) cs = (uint32_t)(ld64(c + 8) >> 32);
    else if (v->floor == 1) cs = cv_csum(i);
    else if (v->floor == 2) cs = ld32(host + 72);
    else if (v->pub == 3) {
        cs = (uint32_t)(ld64(c) >> 32);
        bad = (uint32_t)(ld64(c + 8) >> 32);
    } else {
        uint64_t w = ld64(c + 8);
        cs = (uint32_t)w;
        bad = (uint32_t)(w >> 32);
    }
    if (v->hcredit) {
        st64(dev + 64, seq); /* stands for the library's completion-count store */
        cv_sfence();
    }
    uint64_t t1 = pt_now();
    if (cs != cv_csum(i) || bad) s->host_bad++;
    s->next = i + 1;
    *dt = pt_ns(t1 - t0);
    return 0;
}

/* ---- launch / stop ----------------------------------------------------- */
static int start_kernel(vstate_t *s, int sim, int64_t tmo_ns)
{
    if (s->v->library) return lib_start(s, sim, tmo_ns);
    st32(s->host + 8, 0);
    st32(s->dev, 0); /* abort off */
    cv_sfence();
    if (sim) {
        if (pthread_create(&s->sim_thr, NULL, sim_kernel, s) != 0) {
            snprintf(s->state, sizeof s->state, "cannot start the sim thread");
            return -1;
        }
        s->sim_running = 1;
    } else {
        uint64_t idle = 2000000000ull, start = s->next;
        void *params[4] = {&s->dev_gpu, &s->host_gpu, &start, &idle};
        CUresult r = cv_cu.LaunchKernel(s->fn, 1, 1, 1, 32, 1, 1, 0, s->stream, params, NULL);
        if (r) {
            snprintf(s->state, sizeof s->state, "LAUNCH failed (CUresult %d)", r);
            return -1;
        }
    }
    int64_t end = cv_now() + tmo_ns * 5;
    while (ld32(s->host + 8) == 0) {
        if (cv_now() > end) {
            snprintf(s->state, sizeof s->state, "NOATTACH: the kernel did not start");
            return -1;
        }
        if (sim) sched_yield();
    }
    s->cur_sm = sim ? -1 : (int)ld32(s->host + 32);
    return 0;
}

/* Asks the kernel to stop and waits for it.  0, or -1 (state says why). */
static int stop_kernel(vstate_t *s, int sim, int64_t tmo_ns)
{
    if (s->v->library) return lib_stop(s, sim, tmo_ns);
    st32(s->dev, 1);
    cv_sfence();
    if (sim) {
        if (s->sim_running) pthread_join(s->sim_thr, NULL);
        s->sim_running = 0;
    } else {
        int64_t end = cv_now() + tmo_ns * 3;
        CUresult r;
        while ((r = cv_cu.StreamQuery(s->stream)) == 600 /* NOT_READY */) {
            if (cv_now() > end) {
                if (!s->state[0])
                    snprintf(s->state, sizeof s->state, "HANG: the kernel did not stop");
                return -1;
            }
        }
        if (r) {
            if (!s->state[0])
                snprintf(s->state, sizeof s->state, "KERNEL ERROR (CUresult %d)", r);
            return -1;
        }
    }
    s->kern_bad += ld64(s->host + 16);
    st64(s->host + 16, 0);
    return 0;
}

/* ---- main -------------------------------------------------------------- */
static int in_list(const char *list, const char *name)
{
    if (!list) return 1;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !strncmp(p, name, n)) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

static void *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = calloc(1, (size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    return b;
}

int chanvar_main(int argc, char **argv)
{
    const char *dir = NULL, *only = NULL, *corrupt = NULL, *alloc = "cumemalloc";
    int device = 0, iters = 20000, rounds = 5, warmup = 500, cpu = -1, sim = 0, list = 0;
    double timeout_s = 1.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--variants")) continue;
        if (!strcmp(a, "--sim")) {
            sim = 1;
            continue;
        }
        if (!strcmp(a, "--list-variants")) {
            list = 1;
            continue;
        }
        if (!val) {
            fprintf(stderr, "chanvar: option %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--cubin-dir")) dir = val;
        else if (!strcmp(a, "--only")) only = val;
        else if (!strcmp(a, "--alloc")) alloc = val;
        else if (!strcmp(a, "--sim-corrupt")) corrupt = val;
        else if (!strcmp(a, "--device")) device = atoi(val);
        else if (!strcmp(a, "--iters")) iters = atoi(val);
        else if (!strcmp(a, "--rounds")) rounds = atoi(val);
        else if (!strcmp(a, "--warmup")) warmup = atoi(val);
        else if (!strcmp(a, "--cpu")) cpu = atoi(val);
        else if (!strcmp(a, "--timeout")) timeout_s = atof(val);
        else {
            fprintf(stderr, "chanvar: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (list) {
        char d[256];
        for (int k = 0; k < NV; k++) {
            defines(&VARIANTS[k], d, sizeof d);
            printf("%s\t%s\t%s\t%s\n", VARIANTS[k].name, d, VARIANTS[k].model ? "model" : "empirical",
                   VARIANTS[k].what);
        }
        return 0;
    }
    if (iters < 1 || rounds < 1 || rounds > 64 || warmup < 0) {
        fprintf(stderr, "chanvar: need --iters >= 1, 1 <= --rounds <= 64, --warmup >= 0\n");
        return 2;
    }
    int kinds[2], nk = 0;
    if (!strcmp(alloc, "cumemalloc")) kinds[nk++] = 0;
    else if (!strcmp(alloc, "vmm")) kinds[nk++] = 1;
    else if (!strcmp(alloc, "both")) kinds[nk++] = 0, kinds[nk++] = 1;
    else {
        fprintf(stderr, "chanvar: --alloc must be cumemalloc, vmm or both\n");
        return 2;
    }
    if (!sim && !dir) {
        fprintf(stderr, "chanvar: --cubin-dir DIR is required (or --sim)\n");
        return 2;
    }
    if (cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0)
            fprintf(stderr, "chanvar: sched_setaffinity(cpu %d): %s (going on)\n", cpu,
                    strerror(errno));
    }
    int64_t tmo = (int64_t)(timeout_s * 1e9);
    pt_init();
    int per_round = (iters + rounds - 1) / rounds;
    const int NR = NV * nk; /* rows: every variant on every kind of memory */
    size_t total = ((size_t)NV * CV_REGION + GDRPY_GPU_PAGE_SIZE - 1) &
                   ~(size_t)(GDRPY_GPU_PAGE_SIZE - 1);
    size_t htotal = (size_t)NR * CV_REGION;
    vstate_t *vs = calloc((size_t)NR, sizeof *vs);
    char *devbase[2] = {NULL, NULL}, *hostbase = NULL;
    uint64_t dev_gpu[2] = {0, 0}, host_gpu = 0;
    char err[512];
    gdrpy_ctx_t ctx = 0;
    gdrpy_pin_t pin[2] = {0, 0};
    if (sim) {
        hostbase = aligned_alloc(4096, htotal);
        for (int q = 0; q < nk; q++) devbase[q] = aligned_alloc(4096, total);
        if (!hostbase || !devbase[0] || (nk > 1 && !devbase[1])) {
            fprintf(stderr, "chanvar: out of memory\n");
            return 1;
        }
        for (int q = 0; q < nk; q++) memset(devbase[q], 0, total);
        memset(hostbase, 0, htotal);
        if (gdrpy_open(device, GDRPY_BACKEND_SIM, &ctx)) {
            fprintf(stderr, "chanvar: gdrpy_open(sim): %s\n", gdrpy_last_error());
            return 1;
        }
    } else {
        if (cv_load_cuda(err, sizeof err)) {
            fprintf(stderr, "chanvar: %s\n", err);
            return 1;
        }
        int dv;
        void *cctx;
        CUdeviceptr hp_gpu;
        void *hp;
        if (cv_cu.Init(0) || cv_cu.DeviceGet(&dv, device) || cv_cu.PrimaryCtxRetain(&cctx, dv) ||
            cv_cu.CtxSetCurrent(cctx) ||
            cv_cu.HostAlloc(&hp, htotal, 0x1 | 0x2 /* PORTABLE | DEVICEMAP */) ||
            cv_cu.HostGetDevicePointer(&hp_gpu, hp, 0)) {
            fprintf(stderr, "chanvar: CUDA setup failed\n");
            return 1;
        }
        hostbase = hp;
        host_gpu = hp_gpu;
        memset(hostbase, 0, htotal);
        if (gdrpy_open(device, GDRPY_BACKEND_AUTO, &ctx)) {
            fprintf(stderr, "chanvar: gdrpy_open: %s\n", gdrpy_last_error());
            return 1;
        }
        for (int q = 0; q < nk; q++) {
            CUdeviceptr raw;
            int r;
            if (kinds[q]) {
                r = cuvmm_alloc(dv, total, &dev_gpu[q]);
            } else {
                r = cv_cu.MemAlloc(&raw, total + GDRPY_GPU_PAGE_SIZE);
                dev_gpu[q] = (raw + GDRPY_GPU_PAGE_SIZE - 1) & ~(uint64_t)(GDRPY_GPU_PAGE_SIZE - 1);
            }
            void *mp, *up;
            if (r) {
                fprintf(stderr, "chanvar: %s failed (%d)\n", kinds[q] ? "cuMemCreate" : "cuMemAlloc",
                        r);
                return 1;
            }
            if (gdrpy_pin(ctx, dev_gpu[q], total, 0, &pin[q]) || gdrpy_map(ctx, pin[q], &mp, &up)) {
                fprintf(stderr, "chanvar: gdrpy pin/map failed: %s\n", gdrpy_last_error());
                return 1;
            }
            devbase[q] = up;
            for (size_t k = 0; k < total; k += 8) st64(devbase[q] + k, 0);
        }
        cv_sfence();
    }
    int nrun = 0;
    for (int row = 0; row < NR; row++) {
        int k = row % NV, q = row / NV;
        vstate_t *s = &vs[row];
        s->v = &VARIANTS[k];
        s->vmm = kinds[q];
        snprintf(s->name, sizeof s->name, "%s%s", s->v->name, s->vmm ? "@vmm" : "");
        s->dev = devbase[q] + (size_t)k * CV_REGION;
        s->host = hostbase + (size_t)row * CV_REGION;
        s->dev_gpu = dev_gpu[q] + (uint64_t)k * CV_REGION;
        s->host_gpu = host_gpu + (uint64_t)row * CV_REGION;
        s->t = malloc(sizeof(int64_t) * (size_t)per_round * (size_t)rounds);
        s->corrupt = sim && corrupt && in_list(corrupt, s->v->name);
        if (!in_list(only, s->v->name)) {
            snprintf(s->state, sizeof s->state, "skipped (--only)");
            continue;
        }
        nrun++;
        if (s->v->library) {
            size_t need;
            uint64_t d = 0;
            CUdeviceptr raw = 0;
            s->ctx = ctx;
            gdrpy_chan_device_bytes(lib_cfg(s->v), &need);
            need = (need + GDRPY_GPU_PAGE_SIZE - 1) & ~(size_t)(GDRPY_GPU_PAGE_SIZE - 1);
            int bad;
            if (sim) bad = gdrpy_sim_alloc(need, &d) != 0;
            else if (s->vmm) bad = cuvmm_alloc(device, need, &d) != 0;
            else {
                bad = cv_cu.MemAlloc(&raw, need + GDRPY_GPU_PAGE_SIZE) != 0;
                d = (raw + GDRPY_GPU_PAGE_SIZE - 1) & ~(uint64_t)(GDRPY_GPU_PAGE_SIZE - 1);
            }
            if (bad) {
                snprintf(s->state, sizeof s->state, "cannot allocate the channel's memory");
                continue;
            }
            void *mp, *up;
            if (gdrpy_pin(ctx, d, need, 0, &s->pin) || gdrpy_map(ctx, s->pin, &mp, &up)) {
                snprintf(s->state, sizeof s->state, "pin/map: %.120s", gdrpy_last_error());
                continue;
            }
        }
        if (sim) continue;
        char path[4096];
        void *img = NULL;
        snprintf(path, sizeof path, "%s/%s.cubin", dir, s->v->name);
        img = read_file(path);
        if (!img) {
            snprintf(path, sizeof path, "%s/%s.ptx", dir, s->v->name);
            img = read_file(path);
        }
        void *mod;
        CUresult r;
        if (!img) snprintf(s->state, sizeof s->state, "NO IMAGE (%s/%s.cubin)", dir, s->v->name);
        else if ((r = cv_cu.ModuleLoadData(&mod, img)) != 0)
            snprintf(s->state, sizeof s->state, "MODULE LOAD failed (CUresult %d)", r);
        else if ((r = cv_cu.ModuleGetFunction(&s->fn, mod,
                                              s->v->library ? "gdrpy_pp_serve" : "gdrpy_chanvar")) != 0)
            snprintf(s->state, sizeof s->state, "no kernel function in the image (CUresult %d)", r);
        else if ((r = cv_cu.StreamCreate(&s->stream, 1)) != 0)
            snprintf(s->state, sizeof s->state, "cuStreamCreate failed (CUresult %d)", r);
        free(img);
    }
    int64_t t_start = cv_now();
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < NR; k++) {
            vstate_t *s = &vs[k];
            if (s->state[0]) continue;
            if (start_kernel(s, sim, tmo)) {
                stop_kernel(s, sim, tmo);
                continue;
            }
            int w = r == 0 ? warmup * 4 : warmup;
            int64_t dt;
            int bad = 0;
            size_t first = s->nt;
            for (int i = 0; i < w + per_round; i++) {
                if (roundtrip(s, tmo, &dt)) {
                    bad = 1;
                    break;
                }
                if (i >= w) s->t[s->nt++] = dt;
            }
            if (stop_kernel(s, sim, tmo) == 0 && !bad) {
                size_t n = s->nt - first;
                int64_t *tmp = malloc(sizeof(int64_t) * n);
                memcpy(tmp, s->t + first, sizeof(int64_t) * n);
                qsort(tmp, n, sizeof *tmp, cmp_i64);
                s->round_sm[s->nrounds] = s->cur_sm;
                s->round_med[s->nrounds++] = tmp[n / 2] / 1000.0;
                free(tmp);
            }
        }
    }
    double secs = (cv_now() - t_start) * 1e-9;
    /* ---- the table ---- */
    int allok = 1;
    printf("\nVARIANTS: 4-byte round trips, %d per variant in %d interleaved rounds (%.1f s), %s"
           "; microseconds\n",
           per_round * rounds, rounds, secs, sim ? "sim (a CPU thread is the kernel)" : "GPU");
    printf("timer: {");
    pt_json(stdout);
    printf("} (one read per sample)\n");
    printf("%-18s %8s %8s %8s %15s  %-28s %-9s %s\n", "variant", "median", "p99", "min",
           "round medians", "check", "order", "what");
    for (int k = 0; k < NR; k++) {
        vstate_t *s = &vs[k];
        if (!in_list(only, s->v->name)) continue;
        char check[160];
        if (s->host_bad || s->kern_bad)
            snprintf(check, sizeof check, "FAIL host %llu kernel %llu",
                     (unsigned long long)s->host_bad, (unsigned long long)s->kern_bad);
        else if (s->state[0]) snprintf(check, sizeof check, "FAIL %s", s->state);
        else snprintf(check, sizeof check, "PASS");
        if (strcmp(check, "PASS")) allok = 0;
        const char *order = s->v->model ? "model" : "empirical";
        if (s->nt == 0) {
            printf("%-18s %8s %8s %8s %15s  %-28s %-9s %s\n", s->name, "-", "-", "-", "-",
                   check, order, s->v->what);
            printf("{\"variant\": \"%s\", \"n\": 0, \"check\": \"%s\", \"order\": \"%s\"}\n",
                   s->name, check, order);
            continue;
        }
        qsort(s->t, s->nt, sizeof *s->t, cmp_i64);
        double med = s->t[s->nt / 2] / 1000.0;
        double p99 = s->t[(size_t)((double)(s->nt - 1) * 0.99 + 0.5)] / 1000.0;
        double mn = s->t[0] / 1000.0;
        double lo = 1e30, hi = 0;
        for (int r = 0; r < s->nrounds; r++) {
            if (s->round_med[r] < lo) lo = s->round_med[r];
            if (s->round_med[r] > hi) hi = s->round_med[r];
        }
        char rm[48];
        snprintf(rm, sizeof rm, "%.2f..%.2f", s->nrounds ? lo : 0, hi);
        printf("%-18s %8.3f %8.3f %8.3f %15s  %-28s %-9s %s\n", s->name, med, p99, mn, rm,
               check, order, s->v->what);
        char sms[64 * 12] = "";
        for (int r = 0, o = 0; r < s->nrounds && o < (int)sizeof sms - 12; r++)
            o += snprintf(sms + o, sizeof sms - (size_t)o, "%s%d:%.2f", r ? " " : "",
                          s->round_sm[r], s->round_med[r]);
        if (!sim) printf("%-18s   rounds (sm:median us): %s\n", "", sms);
        if (!sim && s->lat)
            printf("%-18s   kernel: one load of the device block %u SM cycles at start, one "
                   "sample round of the slot %u at the end (last round)\n",
                   "", s->lat, s->lat_end);
        if (s->kt[1] && s->kt[3] && s->kt[4]) {
            double ghz = (double)s->kt[3] / (double)s->kt[4];
            double busy = (double)s->kt[0] / (double)s->kt[1];
            double idle = s->kt[2] ? (double)(s->kt[3] - s->kt[0]) / (double)s->kt[2] : 0;
            printf("%-18s   kernel: seen->answer stored %.0f cycles = %.0f ns per round "
                   "(%llu rounds); empty poll %.0f cycles = %.0f ns; SM clock %.2f GHz\n",
                   "", busy, busy / ghz, (unsigned long long)s->kt[1], idle, idle / ghz, ghz);
        }
        printf("{\"variant\": \"%s\", \"n\": %zu, \"median_us\": %.3f, \"p99_us\": %.3f, "
               "\"min_us\": %.3f, \"check\": \"%s\", \"order\": \"%s\"}\n",
               s->name, s->nt, med, p99, mn, check, order);
    }
    printf("SUMMARY chanperf: %d variants, %s\n", nrun,
           allok ? "all passed their checks" : "SOME FAILED (see check column)");
    fflush(stdout);
    int hung = 0;
    for (int k = 0; k < NR; k++) hung |= !strncmp(vs[k].state, "HANG", 4);
    if (!hung) {
        for (int k = 0; k < NR; k++)
            if (vs[k].v && vs[k].v->library && vs[k].pin && !vs[k].ch) {
                gdrpy_unmap(ctx, vs[k].pin);
                gdrpy_unpin(ctx, vs[k].pin);
            }
        if (!sim)
            for (int q = 0; q < nk; q++) {
                gdrpy_unmap(ctx, pin[q]);
                gdrpy_unpin(ctx, pin[q]);
            }
        gdrpy_close(ctx);
    }
    if (hung) {
        /* a kernel still spins on this memory: leave everything to the
         * process teardown (the driver destroys the context and its kernels) */
        fflush(NULL);
        _exit(allok ? 0 : 1);
    }
    return allok ? 0 : 1;
}
