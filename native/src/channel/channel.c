/*
 * channel.c - the host side of the gdrpy message channel; the contract and
 * the memory layout are in include/gdrpy_channel.h, the ordering argument in
 * include/gdrpy_channel.cuh.
 *
 * Hot paths (send, send_batch, recv, recv_many) take no lock and look up no
 * handle: the producer's and the consumer's state live in separate cache
 * lines of the channel object, and the only shared words are in the device
 * block (written by the producer through the mapping) and the host block
 * (written by the kernel).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gdrpy_channel.h"
#include "hostmem.h"
#include "internal.h"
#include "wc.h"
#if GP_MAPPING_UNALIGNED_OK && defined(__SSE2__)
#include <emmintrin.h> /* ll_store_short */
#endif

struct gdrpy_chan {
    /* ---- producer (send*, shutdown) ---- */
    char *ring;                        /* CPU address of message slot 0 */
    char *dev;                         /* CPU address of the device block */
    const volatile uint64_t *consumed; /* host block: kernel's consumed count */
    const volatile uint32_t *status;   /* host block: kernel status */
    uint64_t head;                     /* messages published */
    uint64_t credit;                   /* last consumed count read */
    uint64_t full_waits;
    uint32_t mask, stride, slot_size;
    uint32_t shutdown;       /* mode requested, 0 = none */
    uint32_t settled;        /* the slot table is final (NEAR: once the kernel attached) */
    const uint32_t *slot_of; /* ring slot -> physical slot: `first`, then the kernel's */
    uint32_t ll;             /* 1: LL slot format (gdrpy_channel.h) */
    uint32_t llw;            /* LL data words per slot */
    uint32_t poff;           /* offset of the plain payload in a slot */
    /* ---- consumer (recv*) ---- */
    char *comp __attribute__((aligned(64))); /* CPU address of completion slot 0 */
    uint64_t rhead;                          /* completions read */
    uint64_t published;                      /* rhead last published to the device */
    uint32_t cmask, cstride, csize, half;
    uint32_t cll, cpoff; /* = ll; completions' plain payload offset */
    char *dev_c;         /* = dev (consumer's copy) */
    const volatile uint32_t *status_c;
    /* ---- cold ---- */
    gdrpy_ctx_t ctx __attribute__((aligned(64)));
    gdrpy_pin_t pin;
    gp_hostmem hm;
    char *host;
    uint32_t *first; /* the first nslots slots (slot_of until a NEAR kernel chose) */
    gdrpy_chan_desc_t desc;
    gdrpy_chan_config_t cfg;
};

static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline uint64_t ld_acq64(const volatile uint64_t *p)
{
    return __atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE);
}

static inline uint32_t ld_acq32(const volatile uint32_t *p)
{
    return __atomic_load_n((const uint32_t *)p, __ATOMIC_ACQUIRE);
}

static inline int is_pow2(uint32_t x) { return x && !(x & (x - 1)); }

static inline int stopped(uint32_t st)
{
    return st == GDRPY_CHAN_ST_STOPPED || st == GDRPY_CHAN_ST_TIMEOUT;
}

/* A waiting loop's clock.  A round trip's wait must not read the clock:
 * on a VM clock_gettime() may be a system call costing a good part of a
 * microsecond, which would land on the round trip (or delay seeing the
 * word change).  So the deadline is only computed after GP_WAIT_FREE_SPINS
 * spins (microseconds), then checked every 64 spins; a wait therefore lasts
 * up to that much longer than asked.  Timeouts under GP_WAIT_EAGER_NS start
 * the clock at once (exact). */
#define GP_WAIT_FREE_SPINS 4096u
#define GP_WAIT_EAGER_NS 20000
typedef struct {
    int64_t timeout;  /* < 0: none */
    int64_t deadline; /* 0: not started */
    unsigned spins;
} gp_wait;

static inline void wait_init(gp_wait *w, int64_t timeout_ns)
{
    w->spins = 0;
    w->timeout = timeout_ns;
    w->deadline = timeout_ns >= 0 && timeout_ns < GP_WAIT_EAGER_NS ? now_ns() + timeout_ns : 0;
}

/* 1 when the time is up.  The first 16384 spins (some tens of
 * microseconds: every round trip) poll back to back - PAUSE costs up to
 * ~140 cycles on recent Intel cores, all of it added to the latency of
 * seeing the word change - later ones pause, and after about a million
 * (milliseconds) each yields the CPU (an oversubscribed host, a CPU stand-in
 * consumer that needs the core). */
static inline int wait_expired(gp_wait *w)
{
    unsigned n = ++w->spins;
    if (n < GP_WAIT_FREE_SPINS && w->deadline == 0) return 0;
    if (n >= (1u << 20)) sched_yield(); /* ~ms of spinning: an oversubscribed host */
    else if (n >= 16384) gp_cpu_relax();
    if ((n & 63u) != 0 || w->timeout < 0) return 0;
    int64_t t = now_ns();
    if (w->deadline == 0) w->deadline = t + w->timeout;
    return t >= w->deadline;
}

/* ---- configuration ---------------------------------------------------- */

static int check_config(const gdrpy_chan_config_t *cfg, const char *what)
{
    if (!cfg) return gp_err(GDRPY_EINVAL, "%s: config is NULL", what);
    if (!is_pow2(cfg->nslots) || cfg->nslots < 2 || cfg->nslots > GDRPY_CHAN_MAX_SLOTS)
        return gp_err(GDRPY_EINVAL, "%s: nslots %u must be a power of two in [2, %u]", what,
                      cfg->nslots, GDRPY_CHAN_MAX_SLOTS);
    if (cfg->slot_size == 0 || cfg->slot_size > GDRPY_CHAN_MAX_SLOT_SIZE)
        return gp_err(GDRPY_EINVAL, "%s: slot_size %u must be in [1, %u]", what, cfg->slot_size,
                      GDRPY_CHAN_MAX_SLOT_SIZE);
    uint32_t cn = cfg->comp_nslots ? cfg->comp_nslots : cfg->nslots;
    if (!is_pow2(cn) || cn < 2 || cn > GDRPY_CHAN_MAX_SLOTS)
        return gp_err(GDRPY_EINVAL, "%s: comp_nslots %u must be 0 or a power of two in [2, %u]",
                      what, cfg->comp_nslots, GDRPY_CHAN_MAX_SLOTS);
    if (cfg->comp_size > GDRPY_CHAN_MAX_SLOT_SIZE)
        return gp_err(GDRPY_EINVAL, "%s: comp_size %u must be at most %u", what, cfg->comp_size,
                      GDRPY_CHAN_MAX_SLOT_SIZE);
    if ((cfg->flags & ~(GDRPY_CHAN_PLAIN | GDRPY_CHAN_NEAR)) || cfg->reserved)
        return gp_err(GDRPY_EINVAL, "%s: flags 0x%x: only GDRPY_CHAN_PLAIN (0x1) and "
                                    "GDRPY_CHAN_NEAR (0x2) are defined; reserved must be 0",
                      what, cfg->flags);
    if ((cfg->flags & GDRPY_CHAN_NEAR) && cfg->nslots > GDRPY_CHAN_NEAR_MAX_SLOTS)
        return gp_err(GDRPY_EINVAL, "%s: nslots %u: a GDRPY_CHAN_NEAR channel has at most %u",
                      what, cfg->nslots, GDRPY_CHAN_NEAR_MAX_SLOTS);
    return 0;
}

static inline uint32_t stride_of(uint32_t flags, uint32_t payload)
{
    uint32_t w, off, stride;
    gdrpy_chan_slot_layout(flags, payload, &w, &off, &stride);
    return stride;
}

/* Physical slots: NEAR rings have twice as many as they use, and at least
 * GDRPY_CHAN_NEAR_SPAN bytes of them (a small ring inside one or two 4 KiB
 * blocks would have nothing to choose from: the H100 homes whole blocks). */
static inline uint32_t phys_slots(const gdrpy_chan_config_t *cfg)
{
    if (!(cfg->flags & GDRPY_CHAN_NEAR)) return cfg->nslots;
    const uint32_t stride = stride_of(cfg->flags, cfg->slot_size);
    const uint32_t span = (GDRPY_CHAN_NEAR_SPAN + stride - 1) / stride;
    return 2 * cfg->nslots > span ? 2 * cfg->nslots : span;
}

int gdrpy_chan_device_bytes(const gdrpy_chan_config_t *cfg, size_t *out)
{
    if (!out) return gp_err(GDRPY_EINVAL, "chan_device_bytes: output pointer is NULL");
    *out = 0;
    int rc = check_config(cfg, "chan_device_bytes");
    if (rc) return rc;
    uint32_t np = phys_slots(cfg);
    *out = GDRPY_CHAN_DEV_CTRL + (size_t)np * stride_of(cfg->flags, cfg->slot_size);
    if (cfg->flags & GDRPY_CHAN_NEAR) *out += gp_round_up((size_t)np * 4, GDRPY_CHAN_ALIGN);
    return 0;
}

/* NEAR: the slot table after the physical slots (CPU address, through the
 * mapping) and its copy after the completion ring in the host block. */
static inline uint32_t *dev_table(const gdrpy_chan_t *c)
{
    return (uint32_t *)(c->ring + (size_t)c->desc.place_nslots * c->stride);
}

static inline uint32_t *host_table(const gdrpy_chan_t *c)
{
    return (uint32_t *)(c->comp + (size_t)(c->cmask + 1) * c->cstride);
}

/* ---- create / destroy ------------------------------------------------- */

int gdrpy_chan_create(gdrpy_ctx_t ctx, gdrpy_pin_t pin, const gdrpy_chan_config_t *cfg,
                      gdrpy_chan_t **out)
{
    if (!out) return gp_err(GDRPY_EINVAL, "chan_create: output pointer is NULL");
    *out = NULL;
    size_t need;
    int rc = gdrpy_chan_device_bytes(cfg, &need);
    if (rc) return gp_err_prefix(rc, "chan_create");
    gdrpy_pin_info_t info;
    int device = 0, is_real = 0;
    rc = gp_chan_pin_hold(ctx, pin, 1, &info, &device, &is_real);
    if (rc) return rc;
    if (info.size < need) {
        gp_chan_pin_hold(ctx, pin, 0, NULL, NULL, NULL);
        return gp_err(GDRPY_ERANGE, "chan_create: the pin holds %llu bytes; %u slots of %u "
                                    "bytes need %zu",
                      (unsigned long long)info.size, cfg->nslots,
                      cfg->slot_size, need);
    }
    if ((info.addr & (GDRPY_CHAN_ALIGN - 1)) != 0) {
        gp_chan_pin_hold(ctx, pin, 0, NULL, NULL, NULL);
        return gp_err(GDRPY_EINVAL, "chan_create: the pinned address 0x%llx is not 64-byte "
                                    "aligned",
                      (unsigned long long)info.addr);
    }
    gdrpy_chan_t *c = aligned_alloc(64, gp_round_up(sizeof *c, 64));
    if (!c) {
        gp_chan_pin_hold(ctx, pin, 0, NULL, NULL, NULL);
        return gp_err(GDRPY_ENOMEM, "chan_create: out of memory");
    }
    memset(c, 0, sizeof *c);
    c->cfg = *cfg;
    uint32_t cn = cfg->comp_nslots ? cfg->comp_nslots : cfg->nslots;
    c->cfg.comp_nslots = cn;
    uint32_t cllw, cpoff, cstride;
    gdrpy_chan_slot_layout(cfg->flags, cfg->comp_size, &cllw, &cpoff, &cstride);
    const int near = (cfg->flags & GDRPY_CHAN_NEAR) != 0;
    c->first = malloc((size_t)cfg->nslots * sizeof *c->first);
    rc = c->first ? gp_hostmem_alloc(device, is_real,
                                     GDRPY_CHAN_HOST_CTRL + (size_t)cn * cstride +
                                         (near ? (size_t)cfg->nslots * 4 : 0),
                                     &c->hm)
                  : gp_err(GDRPY_ENOMEM, "chan_create: out of memory");
    if (rc) {
        if (c->first) gp_err_prefix(rc, "chan_create: completion ring");
        gp_chan_pin_hold(ctx, pin, 0, NULL, NULL, NULL);
        free(c->first);
        free(c);
        return rc;
    }
    for (uint32_t k = 0; k < cfg->nslots; k++) c->first[k] = k;
    c->slot_of = c->first;
    c->settled = !near;
    c->ctx = ctx;
    c->pin = pin;
    c->host = c->hm.ptr;
    c->dev = info.user_ptr;
    c->ring = c->dev + GDRPY_CHAN_DEV_CTRL;
    c->consumed = (const volatile uint64_t *)(c->host + GDRPY_CHAN_HOST_CONSUMED);
    c->status = (const volatile uint32_t *)(c->host + GDRPY_CHAN_HOST_STATUS);
    c->mask = cfg->nslots - 1;
    gdrpy_chan_slot_layout(cfg->flags, cfg->slot_size, &c->llw, &c->poff, &c->stride);
    c->ll = !(cfg->flags & GDRPY_CHAN_PLAIN);
    c->cll = c->ll;
    c->cpoff = cpoff;
    c->slot_size = cfg->slot_size;
    c->comp = c->host + GDRPY_CHAN_HOST_CTRL;
    c->cmask = cn - 1;
    c->cstride = cstride;
    c->csize = cfg->comp_size;
    c->half = cn / 2;
    c->dev_c = c->dev;
    c->status_c = c->status;
    c->desc.dev_ctrl = info.addr;
    c->desc.ring = info.addr + GDRPY_CHAN_DEV_CTRL;
    c->desc.host_ctrl = c->hm.dptr;
    c->desc.comp = c->hm.dptr + GDRPY_CHAN_HOST_CTRL;
    c->desc.nslots = cfg->nslots;
    c->desc.slot_stride = c->stride;
    c->desc.slot_size = cfg->slot_size;
    c->desc.comp_nslots = cn;
    c->desc.comp_stride = cstride;
    c->desc.comp_size = cfg->comp_size;
    c->desc.flags = cfg->flags;
    c->desc.place_nslots = near ? phys_slots(cfg) : 0;
    /* Zero the device block (old sequence words must not look current). */
    gp_wc_zero(c->dev, need);
    if (near) {
        /* the device's slot table starts as the first nslots, so that a
         * kernel that attaches without choosing agrees with the host */
        uint32_t *t = dev_table(c);
        for (uint32_t k = 0; k < cfg->nslots; k++) gp_wc_store_u32(t + k, k);
    }
    gp_wc_fence();
    *out = c;
    return 0;
}

int gdrpy_chan_destroy(gdrpy_chan_t *c)
{
    if (!c) return 0;
    int rc = 0;
    uint32_t st = ld_acq32(c->status);
    if (st == GDRPY_CHAN_ST_RUNNING) {
        rc = gp_err(GDRPY_EBUSY, "chan_destroy: the kernel has not reported stopped; its "
                                 "completion ring (%zu bytes of page-locked memory) is left allocated so "
                                 "that the GPU never writes to freed memory",
                    c->hm.size);
        gp_log(3, "%s", gdrpy_last_error());
    } else {
        gp_hostmem_free(&c->hm);
    }
    gp_chan_pin_hold(c->ctx, c->pin, 0, NULL, NULL, NULL); /* EBADF if the ctx is gone */
    if (c->slot_of != c->first) free((void *)c->slot_of);
    free(c->first);
    free(c);
    return rc;
}

int gdrpy_chan_get_desc(const gdrpy_chan_t *c, gdrpy_chan_desc_t *out)
{
    if (!c || !out) return gp_err(GDRPY_EINVAL, "chan_get_desc: NULL argument");
    *out = c->desc;
    return 0;
}

int gdrpy_chan_get_config(const gdrpy_chan_t *c, gdrpy_chan_config_t *out)
{
    if (!c || !out) return gp_err(GDRPY_EINVAL, "chan_get_config: NULL argument");
    *out = c->cfg;
    return 0;
}

void *gdrpy_chan_device_block(const gdrpy_chan_t *c) { return c ? c->dev : NULL; }
void *gdrpy_chan_host_block(const gdrpy_chan_t *c) { return c ? c->host : NULL; }

/* ---- send ------------------------------------------------------------- */

/* Message i's slot (CPU address). */
static inline char *slot_at(const gdrpy_chan_t *c, uint64_t i)
{
    return c->ring + (size_t)c->slot_of[i & c->mask] * c->stride;
}

/* What the LL send paths read of the channel for every message, copied out
 * once per call: the loop then reads only the messages and the slot table
 * between one message's write-combined stores and the next one's (on x86 a
 * load there can wait behind those stores, which lengthened a batch's send span
 * on the H200 hosts). */
typedef struct {
    char *ring;
    const uint32_t *slot_of;
    uint32_t mask, stride, llw, poff;
} ring_view;

static inline ring_view ring_view_of(const gdrpy_chan_t *c)
{
    ring_view v = {c->ring, c->slot_of, c->mask, c->stride, c->llw, c->poff};
    return v;
}

static inline char *view_slot(ring_view v, uint64_t i)
{
    return v.ring + (size_t)v.slot_of[i & v.mask] * v.stride;
}

/* NEAR: takes the kernel's slot table once it has attached (GDRPY_EIO if it
 * is not a choice of distinct physical slots; nothing is taken then); a
 * kernel that attached without choosing leaves the first nslots.  0 when
 * settled, -1 when no kernel has attached yet, else the error.  The
 * producer and a thread in wait_attached may both get here: the table is
 * checked in a copy of its own and published once (compare-and-swap), then
 * `settled` (release), which the sends read (acquire) before slot_of. */
static int settle(gdrpy_chan_t *c, const char *what)
{
    if (ld_acq32(c->status) == GDRPY_CHAN_ST_NONE) return -1;
    if (ld_acq32((const volatile uint32_t *)(c->host + GDRPY_CHAN_HOST_PLACED)) == 1) {
        const uint32_t n = c->mask + 1, np = c->desc.place_nslots;
        const volatile uint32_t *t = host_table(c);
        unsigned char *seen = calloc(np, 1);
        uint32_t *mine = malloc((size_t)n * sizeof *mine);
        if (!seen || !mine) {
            free(seen);
            free(mine);
            return gp_err(GDRPY_ENOMEM, "%s: out of memory", what);
        }
        for (uint32_t k = 0; k < n; k++) {
            const uint32_t p = t[k];
            if (p >= np || seen[p]) {
                free(seen);
                free(mine);
                return gp_err(GDRPY_EIO, "%s: the kernel's slot table is not valid (entry %u: "
                                         "physical slot %u of %u)",
                              what, k, p, np);
            }
            seen[p] = 1;
            mine[k] = p;
        }
        free(seen);
        const uint32_t *expect = c->first;
        if (!__atomic_compare_exchange_n(&c->slot_of, &expect, mine, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
            free(mine); /* another thread took it first (the same table) */
    }
    __atomic_store_n(&c->settled, 1, __ATOMIC_RELEASE);
    return 0;
}

/* Sends on a NEAR channel wait (timeout) for the kernel's slot table. */
static int wait_settled(gdrpy_chan_t *c, int64_t *timeout_ns_p, const char *what)
{
    const int64_t timeout_ns = *timeout_ns_p, t0 = timeout_ns > 0 ? now_ns() : 0;
    gp_wait w;
    wait_init(&w, timeout_ns);
    for (;;) {
        int rc = settle(c, what);
        if (rc >= 0) {
            if (timeout_ns > 0) { /* one deadline: the ring's wait gets what is left */
                const int64_t left = timeout_ns - (now_ns() - t0);
                *timeout_ns_p = left > 0 ? left : 1;
            }
            return rc;
        }
        if (timeout_ns == 0)
            return gp_err(GDRPY_EAGAIN, "%s: no kernel has attached yet (on a near-slot channel "
                                        "the kernel chooses the slots when it attaches)",
                          what);
        if (wait_expired(&w))
            return gp_err(GDRPY_ETIMEDOUT, "%s: no kernel attached within %.6f s (on a near-slot "
                                           "channel the kernel chooses the slots when it attaches)",
                          what, timeout_ns * 1e-9);
        gp_cpu_relax();
    }
}

/* Waits until message `last` (an index) has a free slot. */
static int wait_credit(gdrpy_chan_t *c, uint64_t last, int64_t timeout_ns, const char *what)
{
    uint64_t nslots = (uint64_t)c->mask + 1;
    c->credit = ld_acq64(c->consumed);
    if (last - c->credit < nslots) return 0;
    c->full_waits++;
    if (timeout_ns == 0)
        return gp_err(GDRPY_EAGAIN, "%s: the ring is full (%llu of %llu slots unconsumed)", what,
                      (unsigned long long)(c->head - c->credit), (unsigned long long)nslots);
    gp_wait w;
    wait_init(&w, timeout_ns);
    for (;;) {
        c->credit = ld_acq64(c->consumed);
        if (last - c->credit < nslots) return 0;
        if ((w.spins & 63u) == 63u && stopped(ld_acq32(c->status))) {
            c->credit = ld_acq64(c->consumed);
            if (last - c->credit < nslots) return 0;
            return gp_err(GDRPY_EPIPE, "%s: the ring is full and the kernel has stopped "
                                       "(status %u)",
                          what, ld_acq32(c->status));
        }
        if (wait_expired(&w))
            return gp_err(GDRPY_ETIMEDOUT, "%s: the ring stayed full (%llu of %llu slots "
                                           "unconsumed) for %.6f s",
                          what,
                          (unsigned long long)(c->head - c->credit), (unsigned long long)nslots,
                          timeout_ns * 1e-9);
    }
}

static inline void put_payload(char *dst, const void *src, size_t len)
{
    if (len > 256)
        gdrpy_copy_to_mapping(dst, src, len); /* tuned kernel; ends with a fence */
    else if (len)
        gp_wc_store_nofence(dst, src, len);
}

/* ---- LL words (gdrpy_channel.h) ---- */
static inline uint64_t llword(uint32_t f, uint32_t data) { return (uint64_t)f | (uint64_t)data << 32; }

/* 1 when message/completion i's LL words must all be rewritten this lap (no
 * word of a slot gets older than 2^31 messages). */
static inline int ll_refresh(uint64_t i, uint32_t nslots)
{
    return (i & 0x7fffffffull) < nslots;
}

/* Stores LL words 2.. of a slot: `len` payload bytes, padded with zero data
 * up to `words` words (>= ceil(len / 4)).  Aligned 8-byte stores only. */
static inline void ll_store_data(char *s, uint32_t f, const unsigned char *p, size_t len,
                                 uint32_t words)
{
    uint32_t k = 0;
    for (; (size_t)(k + 1) * 4 <= len; k++) {
        uint32_t d;
        memcpy(&d, p + 4 * k, 4);
        gp_wc_store_u64(s + 16 + 8 * k, llword(f, d));
    }
    if ((size_t)k * 4 < len) {
        uint32_t d = 0;
        memcpy(&d, p + 4 * k, len - (size_t)k * 4);
        gp_wc_store_u64(s + 16 + 8 * k, llword(f, d));
        k++;
    }
    for (; k < words; k++) gp_wc_store_u64(s + 16 + 8 * k, llword(f, 0));
}

/* The `nb` bytes (whole 64-byte lines) of a short LL message: words {f, tag},
 * {f, len}, then the payload 4 bytes per word, then {f, 0} up to the end of
 * the last line.  The words are stored line by line: a write-combining
 * buffer that is full leaves the core as one 64-byte PCIe write, so the
 * kernel's first look usually finds every word there (a partly filled
 * buffer may leave as several smaller writes in any order).  No fence. */
#if GP_MAPPING_UNALIGNED_OK && defined(__SSE2__)
/* x86: every 16 bytes built in a register and stored from there.  A line
 * built in a stack buffer and copied out is read back by 16-byte loads of
 * two 8-byte stores, which cannot be forwarded: such a load waits until the
 * stores are written to the cache, and stores are written in order, behind
 * the previous message's write-combined ones (round 17: the batch's send
 * span 0.41-0.69 us against 0.50-1.03). */
static inline __attribute__((always_inline)) void ll_store_short(char *s, uint32_t f, uint32_t tag,
                                                                 uint32_t len,
                                                                 const unsigned char *p,
                                                                 uint32_t nb)
{
    const __m128i fv = _mm_set1_epi32((int)f);
    _mm_storeu_si128((__m128i *)s, _mm_set_epi32((int)len, (int)f, (int)tag, (int)f));
    uint32_t off = 0; /* payload bytes in the words stored so far */
    for (uint32_t b = 16; b < nb; b += 16, off += 8) {
        uint64_t d = 0; /* the next two words' data: 8 payload bytes, fewer at the end, or none */
        if (off + 8 <= len) memcpy(&d, p + off, 8);
        else
            for (uint32_t j = off; j < len; j++) d |= (uint64_t)p[j] << (8 * (j - off));
        _mm_storeu_si128((__m128i *)(s + b), _mm_unpacklo_epi32(fv, _mm_cvtsi64_si128((long long)d)));
    }
    __asm__ __volatile__("" ::: "memory");
}
#else
/* Elsewhere the mapping takes aligned stores only (Device memory on arm64):
 * the words go through a buffer to the dispatched copy kernel. */
static inline void ll_store_short(char *s, uint32_t f, uint32_t tag, uint32_t len,
                                  const unsigned char *p, uint32_t nb)
{
    uint64_t w[24] __attribute__((aligned(64))); /* at most 2 + 16 words = 144 bytes -> 3 lines */
    w[0] = llword(f, tag);
    w[1] = llword(f, len);
    uint32_t k = 0;
    for (; (k + 1) * 4 <= len; k++) {
        uint32_t d;
        memcpy(&d, p + 4 * k, 4);
        w[2 + k] = llword(f, d);
    }
    if (k * 4 < len) {
        uint32_t d = 0;
        memcpy(&d, p + 4 * k, len - k * 4);
        w[2 + k++] = llword(f, d);
    }
    for (k += 2; k < nb / 8; k++) w[k] = llword(f, 0);
    gp_wc_store_nofence(s, w, nb);
}
#endif

/* A plain-area message's payload (and on a refresh lap its LL words); its
 * header words follow after a fence (ll_put_header).  Out of line: the
 * send loops keep their registers for short messages. */
static __attribute__((noinline)) void ll_put_long(ring_view v, uint64_t i, const void *buf,
                                                  size_t len)
{
    char *s = view_slot(v, i);
    if (ll_refresh(i, v.mask + 1)) ll_store_data(s, (uint32_t)(i + 1), NULL, 0, v.llw);
    put_payload(s + v.poff, buf, len);
}

/* Message i of an LL channel, without the fence.  Returns 1 when it is a
 * plain-area message whose header words are still to be stored (after a
 * fence) by ll_put_header(). */
static inline __attribute__((always_inline)) int ll_put(ring_view v, uint64_t i,
                                                        const void *buf, size_t len,
                                                        uint32_t tag)
{
    if (__builtin_expect(len > GDRPY_CHAN_LL_MAX, 0)) {
        ll_put_long(v, i, buf, len);
        return 1;
    }
    uint32_t words = ll_refresh(i, v.mask + 1) ? v.llw : (uint32_t)((len + 3) / 4);
    /* whole lines, <= stride (gdrpy_chan_slot_layout) */
    ll_store_short(view_slot(v, i), (uint32_t)(i + 1), tag, (uint32_t)len, buf,
                   (8 * (2 + words) + 63) & ~63u);
    return 0;
}

static inline void ll_put_header(ring_view v, uint64_t i, size_t len, uint32_t tag)
{
    char *s = view_slot(v, i);
    uint32_t f = (uint32_t)(i + 1);
    gp_wc_store_u64(s + 8, llword(f, (uint32_t)len));
    gp_wc_store_u64(s, llword(f, tag));
}

int gdrpy_chan_send(gdrpy_chan_t *c, const void *buf, size_t len, uint32_t tag,
                    int64_t timeout_ns)
{
    if (__builtin_expect(!c, 0)) return gp_err(GDRPY_EINVAL, "chan_send: channel is NULL");
    if (__builtin_expect(len > c->slot_size, 0))
        return gp_err(GDRPY_EINVAL, "chan_send: %zu bytes do not fit a %u-byte slot", len,
                      c->slot_size);
    if (__builtin_expect(len && !buf, 0)) return gp_err(GDRPY_EINVAL, "chan_send: buffer is NULL");
    if (__builtin_expect(c->shutdown != 0, 0))
        return gp_err(GDRPY_EPIPE, "chan_send: the channel is shut down");
    if (__builtin_expect(!__atomic_load_n(&c->settled, __ATOMIC_ACQUIRE), 0)) {
        int rc = wait_settled(c, &timeout_ns, "chan_send");
        if (rc) return rc;
    }
    uint64_t i = c->head;
    if (__builtin_expect(i - c->credit > c->mask, 0)) {
        int rc = wait_credit(c, i, timeout_ns, "chan_send");
        if (rc) return rc;
    }
    if (__builtin_expect(c->ll, 1)) {
        /* LL: every word carries the sequence; one fence pushes them out */
        const ring_view v = ring_view_of(c);
        if (ll_put(v, i, buf, len, tag)) {
            gp_wc_fence(); /* plain payload before the header words */
            ll_put_header(v, i, len, tag);
        }
        gp_wc_fence();
        c->head = i + 1;
        return 0;
    }
    char *s = slot_at(c, i);
    gp_wc_store_u64(s + 8, (uint64_t)len | ((uint64_t)tag << 32));
    put_payload(s + GDRPY_CHAN_HDR, buf, len);
    gp_wc_fence(); /* payload and len/tag before seq */
    gp_wc_store_u64(s, i + 1);
    gp_wc_fence(); /* push the sequence word out now */
    c->head = i + 1;
    return 0;
}

int gdrpy_chan_send_batch(gdrpy_chan_t *c, const gdrpy_chan_msg_t *m, size_t n,
                          int64_t timeout_ns)
{
    if (!c) return gp_err(GDRPY_EINVAL, "chan_send_batch: channel is NULL");
    if (n == 0) return 0;
    if (!m) return gp_err(GDRPY_EINVAL, "chan_send_batch: msgs is NULL");
    if (n > (size_t)c->mask + 1)
        return gp_err(GDRPY_EINVAL, "chan_send_batch: %zu messages exceed the ring's %u slots",
                      n, c->mask + 1);
    for (size_t k = 0; k < n; k++) {
        if (m[k].len > c->slot_size)
            return gp_err(GDRPY_EINVAL, "chan_send_batch: message %zu: %u bytes do not fit a "
                                        "%u-byte slot",
                          k, m[k].len, c->slot_size);
        if (m[k].len && !m[k].buf)
            return gp_err(GDRPY_EINVAL, "chan_send_batch: message %zu: buffer is NULL", k);
    }
    if (c->shutdown) return gp_err(GDRPY_EPIPE, "chan_send_batch: the channel is shut down");
    if (!__atomic_load_n(&c->settled, __ATOMIC_ACQUIRE)) {
        int rc = wait_settled(c, &timeout_ns, "chan_send_batch");
        if (rc) return rc;
    }
    uint64_t i = c->head;
    uint64_t last = i + n - 1;
    if (last - c->credit > c->mask) {
        int rc = wait_credit(c, last, timeout_ns, "chan_send_batch");
        if (rc) return rc;
    }
    if (c->ll) {
        const ring_view v = ring_view_of(c);
        int plain = 0;
        for (size_t k = 0; k < n; k++) plain |= ll_put(v, i + k, m[k].buf, m[k].len, m[k].tag);
        if (plain) {
            gp_wc_fence(); /* plain payloads before their header words */
            for (size_t k = 0; k < n; k++)
                if (m[k].len > GDRPY_CHAN_LL_MAX) ll_put_header(v, i + k, m[k].len, m[k].tag);
        }
        gp_wc_fence();
        c->head = i + n;
        return 0;
    }
    for (size_t k = 0; k < n; k++) {
        char *s = slot_at(c, i + k);
        gp_wc_store_u64(s + 8, (uint64_t)m[k].len | ((uint64_t)m[k].tag << 32));
        if (m[k].len) gp_wc_store_nofence(s + GDRPY_CHAN_HDR, m[k].buf, m[k].len);
    }
    gp_wc_fence(); /* every payload before any sequence word */
    for (size_t k = 0; k < n; k++)
        gp_wc_store_u64(slot_at(c, i + k), i + k + 1);
    gp_wc_fence();
    c->head = i + n;
    return 0;
}

/* ---- receive ---------------------------------------------------------- */

/* PLAIN: completion j is there (acquire on its sequence word). */
static inline int comp_ready_plain(const gdrpy_chan_t *c, uint64_t j)
{
    return ld_acq64((const volatile uint64_t *)(c->comp + (size_t)(j & c->cmask) * c->cstride)) == j + 1;
}

static inline void take_plain(gdrpy_chan_t *c, uint64_t j, void *buf, size_t cap,
                              uint32_t *len_out, uint32_t *tag_out)
{
    const char *s = c->comp + (size_t)(j & c->cmask) * c->cstride;
    uint64_t h = *(const volatile uint64_t *)(s + 8);
    uint32_t len = (uint32_t)h;
    if (len > c->csize) len = c->csize;
    size_t n = len < cap ? len : cap;
    if (n) memcpy(buf, s + GDRPY_CHAN_HDR, n);
    if (len_out) *len_out = len;
    if (tag_out) *tag_out = (uint32_t)(h >> 32);
}

/* LL: takes completion j if every word it needs carries its sequence
 * number (copying min(len, cap) payload bytes to buf); 0 if not (yet). */
static inline int take_ll(gdrpy_chan_t *c, uint64_t j, void *buf, size_t cap, uint32_t *len_out,
                          uint32_t *tag_out)
{
    const char *s = c->comp + (size_t)(j & c->cmask) * c->cstride;
    uint32_t f = (uint32_t)(j + 1);
    uint64_t w0 = ld_acq64((const volatile uint64_t *)s);
    if ((uint32_t)w0 != f) return 0;
    uint64_t w1 = ld_acq64((const volatile uint64_t *)(s + 8));
    if ((uint32_t)w1 != f) return 0;
    uint32_t len = (uint32_t)(w1 >> 32);
    if (len > c->csize) len = c->csize;
    size_t n = len < cap ? len : cap;
    if (len <= GDRPY_CHAN_LL_MAX) {
        uint32_t d[GDRPY_CHAN_LL_MAX / 4];
        uint32_t nw = (len + 3) / 4;
        for (uint32_t k = 0; k < nw; k++) {
            uint64_t w = ld_acq64((const volatile uint64_t *)(s + 16 + 8 * k));
            if ((uint32_t)w != f) return 0;
            d[k] = (uint32_t)(w >> 32);
        }
        if (n) memcpy(buf, d, n);
    } else if (n) {
        /* a plain-area completion: its header words were stored after a
         * system-scope fence; the acquire loads above order these after */
        memcpy(buf, s + c->cpoff, n);
    }
    if (len_out) *len_out = len;
    if (tag_out) *tag_out = (uint32_t)(w0 >> 32);
    return 1;
}

/* 1 when completion j was taken (see take_ll; PLAIN: when it is there). */
static inline int try_take(gdrpy_chan_t *c, uint64_t j, void *buf, size_t cap, uint32_t *len_out,
                           uint32_t *tag_out)
{
    if (__builtin_expect(c->cll, 1)) return take_ll(c, j, buf, cap, len_out, tag_out);
    if (!comp_ready_plain(c, j)) return 0;
    take_plain(c, j, buf, cap, len_out, tag_out);
    return 1;
}

static inline void publish_read(gdrpy_chan_t *c)
{
    if (c->rhead - c->published >= c->half) {
        gp_wc_store_u64(c->dev_c + GDRPY_CHAN_DEV_COMP_READ, c->rhead);
        gp_wc_fence();
        c->published = c->rhead;
    }
}

/* Starts loading the cache lines of completions [j, j + n) (at most 64):
 * the kernel writes a round's completions together, so once one is there
 * the next ones are there or on their way; taking them one by one would
 * pay one cache miss after the other (each line was invalidated by the
 * device's write).  A line loaded before the device writes it is only
 * loaded again: no effect on what is read. */
static inline void prefetch_comps(const gdrpy_chan_t *c, uint64_t j, size_t n)
{
    if (n > 64) n = 64;
    for (size_t k = 0; k < n; k++)
        __builtin_prefetch(c->comp + (size_t)((j + k) & c->cmask) * c->cstride, 0, 3);
}

/* Waits until completion j is there and takes it (try_take). */
static int wait_take(gdrpy_chan_t *c, uint64_t j, void *buf, size_t cap, uint32_t *len_out,
                     uint32_t *tag_out, int64_t timeout_ns, const char *what)
{
    if (timeout_ns == 0)
        return gp_err(GDRPY_EAGAIN, "%s: no completion yet", what);
    gp_wait w;
    wait_init(&w, timeout_ns);
    for (;;) {
        if (try_take(c, j, buf, cap, len_out, tag_out)) return 0;
        if ((w.spins & 63u) == 63u && stopped(ld_acq32(c->status_c))) {
            if (try_take(c, j, buf, cap, len_out, tag_out)) return 0;
            return gp_err(GDRPY_EPIPE, "%s: the kernel has stopped (status %u) and completion "
                                       "%llu will not come",
                          what, ld_acq32(c->status_c),
                          (unsigned long long)j);
        }
        if (wait_expired(&w))
            return gp_err(GDRPY_ETIMEDOUT, "%s: no completion within %.6f s (%llu received)",
                          what, timeout_ns * 1e-9, (unsigned long long)c->rhead);
    }
}

int gdrpy_chan_recv(gdrpy_chan_t *c, void *buf, size_t cap, uint32_t *len_out,
                    uint32_t *tag_out, int64_t timeout_ns)
{
    if (__builtin_expect(!c, 0)) return gp_err(GDRPY_EINVAL, "chan_recv: channel is NULL");
    if (__builtin_expect(cap && !buf, 0)) return gp_err(GDRPY_EINVAL, "chan_recv: buffer is NULL");
    uint64_t j = c->rhead;
    if (!try_take(c, j, buf, cap, len_out, tag_out)) {
        int rc = wait_take(c, j, buf, cap, len_out, tag_out, timeout_ns, "chan_recv");
        if (rc) return rc;
    }
    c->rhead = j + 1;
    publish_read(c);
    return 0;
}

int gdrpy_chan_recv_many(gdrpy_chan_t *c, void *buf, size_t stride, uint32_t *lens,
                         uint32_t *tags, size_t min, size_t max, int64_t timeout_ns,
                         size_t *got)
{
    if (got) *got = 0;
    if (!c || !got) return gp_err(GDRPY_EINVAL, "chan_recv_many: NULL argument");
    if (min < 1 || max < min)
        return gp_err(GDRPY_EINVAL, "chan_recv_many: need 1 <= min (%zu) <= max (%zu)", min, max);
    if (min > (size_t)c->cmask + 1)
        return gp_err(GDRPY_EINVAL, "chan_recv_many: min %zu exceeds the %u completion slots",
                      min, c->cmask + 1);
    if (max > (size_t)c->cmask + 1) max = (size_t)c->cmask + 1;
    uint64_t j = c->rhead;
    size_t avail = 0;
#define TAKE_ARGS(k) buf ? (char *)buf + (k) * stride : NULL, buf ? stride : 0, \
                     lens ? &lens[k] : NULL, tags ? &tags[k] : NULL
    if (max > 1) prefetch_comps(c, j, max);
    while (avail < max && try_take(c, j + avail, TAKE_ARGS(avail))) avail++;
    if (avail < min) {
        if (timeout_ns == 0) {
            /* nothing taken: the completions stay (rhead unchanged) */
            return gp_err(GDRPY_EAGAIN, "chan_recv_many: %zu of %zu completions there", avail, min);
        }
        while (avail < min) {
            int rc = wait_take(c, j + avail, TAKE_ARGS(avail), timeout_ns, "chan_recv_many");
            if (rc) return rc; /* nothing taken: the completions stay */
            avail++;
            if (avail < max) prefetch_comps(c, j + avail, max - avail);
        }
        while (avail < max && try_take(c, j + avail, TAKE_ARGS(avail))) avail++;
    }
#undef TAKE_ARGS
    c->rhead = j + avail;
    publish_read(c);
    *got = avail;
    return 0;
}

/* ---- shutdown and stats ----------------------------------------------- */

static void fill_stats(gdrpy_chan_t *c, gdrpy_chan_stats_t *st)
{
    memset(st, 0, sizeof *st);
    st->sent = c->head;
    st->consumed = ld_acq64(c->consumed);
    st->received = c->rhead;
    st->full_waits = c->full_waits;
    st->status = ld_acq32(c->status);
    st->shutdown = c->shutdown;
    if (stopped(st->status)) {
        st->final_consumed = *(const volatile uint64_t *)(c->host + GDRPY_CHAN_HOST_FINAL);
        st->dropped = c->head - st->final_consumed;
    }
}

int gdrpy_chan_get_stats(gdrpy_chan_t *c, gdrpy_chan_stats_t *out)
{
    if (!c || !out) return gp_err(GDRPY_EINVAL, "chan_get_stats: NULL argument");
    fill_stats(c, out);
    return 0;
}

int gdrpy_chan_wait_attached(gdrpy_chan_t *c, int64_t timeout_ns)
{
    if (!c) return gp_err(GDRPY_EINVAL, "chan_wait_attached: channel is NULL");
    gp_wait w;
    wait_init(&w, timeout_ns);
    for (;;) {
        uint32_t st = ld_acq32(c->status);
        if (st != GDRPY_CHAN_ST_NONE) {
            if (__atomic_load_n(&c->settled, __ATOMIC_ACQUIRE)) return 0;
            int rc = settle(c, "chan_wait_attached");
            if (rc >= 0) return rc; /* -1: the attach was withdrawn (a failed start) */
        }
        if (timeout_ns == 0 || wait_expired(&w))
            return gp_err(timeout_ns == 0 ? GDRPY_EAGAIN : GDRPY_ETIMEDOUT,
                          "chan_wait_attached: no kernel attached within %.6f s",
                          timeout_ns * 1e-9);
    }
}

int gdrpy_chan_slot_offset(const gdrpy_chan_t *c, uint64_t i, size_t *out)
{
    if (!c || !out) return gp_err(GDRPY_EINVAL, "chan_slot_offset: NULL argument");
    if (!__atomic_load_n(&c->settled, __ATOMIC_ACQUIRE))
        return gp_err(GDRPY_EAGAIN, "chan_slot_offset: near-slot channel: the slots are known "
                                    "once the kernel has attached (wait_attached)");
    *out = (size_t)(slot_at(c, i) - c->ring);
    return 0;
}

int gdrpy_chan_shutdown(gdrpy_chan_t *c, unsigned mode, int64_t timeout_ns,
                        gdrpy_chan_stats_t *st)
{
    if (!c) return gp_err(GDRPY_EINVAL, "chan_shutdown: channel is NULL");
    if (mode != GDRPY_CHAN_DRAIN && mode != GDRPY_CHAN_ABORT)
        return gp_err(GDRPY_EINVAL, "chan_shutdown: mode %u is neither DRAIN (1) nor ABORT (2)",
                      mode);
    if (c->shutdown != mode && c->shutdown != GDRPY_CHAN_ABORT) {
        gp_wc_store_u64(c->dev + GDRPY_CHAN_DEV_SENT, c->head);
        gp_wc_fence(); /* the count before the mode */
        gp_wc_store_u32(c->dev + GDRPY_CHAN_DEV_SHUTDOWN, mode);
        gp_wc_fence();
        c->shutdown = mode;
    }
    int rc = 0;
    if (ld_acq32(c->status) != GDRPY_CHAN_ST_NONE) {
        gp_wait w;
        wait_init(&w, timeout_ns);
        while (!stopped(ld_acq32(c->status))) {
            if (timeout_ns == 0 || wait_expired(&w)) {
                rc = gp_err(GDRPY_ETIMEDOUT, "chan_shutdown: the kernel did not report stopped "
                                             "within %.6f s (%llu of %llu messages consumed)",
                            timeout_ns * 1e-9,
                            (unsigned long long)ld_acq64(c->consumed),
                            (unsigned long long)c->head);
                break;
            }
        }
    }
    if (st) fill_stats(c, st);
    return rc;
}

/* ---- check pattern and checksum (tests, reference consumers) --------- */

void gdrpy_chan_pattern(uint64_t i, void *buf, size_t len)
{
    unsigned char *b = buf;
    for (size_t k = 0; k < len; k++)
        b[k] = k < 8 ? (unsigned char)(i >> (8 * k)) : (unsigned char)((i * 131u + k) & 0xff);
}

uint32_t gdrpy_chan_checksum(const void *buf, size_t len)
{
    const unsigned char *b = buf;
    uint32_t s = 0;
    for (size_t k = 0; k < len; k++) s += (uint32_t)b[k] * (uint32_t)((k & 255u) + 1u);
    return s;
}

/* ---- a CPU thread standing in for the GPU kernel ---------------------- */

#include <pthread.h>

struct gdrpy_chan_sim_consumer {
    pthread_t thread;
    /* copies: the thread never touches the channel object, which may be
     * destroyed while it runs (as a kernel outlives a channel) */
    gdrpy_chan_desc_t desc;
    char *ring, *dev, *host;
    uint32_t *slot_of; /* the ring's slot table (sim_place) */
    unsigned flags;
    int64_t delay_ns, idle_ns;
    uint64_t consumed, errors, first_bad;
};

static void sleep_ns(int64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* Writes LL completion j: words in any order (each carries the sequence);
 * a payload longer than LL_MAX goes to the plain area, then a release, then
 * the header words. */
static void sim_ll_complete(char *cs, uint64_t j, const gdrpy_chan_desc_t *d, const void *src,
                            uint32_t len, uint32_t tag)
{
    uint32_t f = (uint32_t)(j + 1), llw, off, stride;
    gdrpy_chan_slot_layout(d->flags, d->comp_size, &llw, &off, &stride);
    uint32_t words = ll_refresh(j, d->comp_nslots) ? llw : 0;
    const unsigned char *p = src;
    if (len <= GDRPY_CHAN_LL_MAX) {
        uint32_t nw = (len + 3) / 4;
        if (words < nw) words = nw;
        for (uint32_t k = 0; k < words; k++) {
            uint32_t v = 0;
            if (4 * k < len) memcpy(&v, p + 4 * k, len - 4 * k < 4 ? len - 4 * k : 4);
            __atomic_store_n((uint64_t *)(cs + 16 + 8 * k), llword(f, v), __ATOMIC_RELAXED);
        }
        __atomic_store_n((uint64_t *)(cs + 8), llword(f, len), __ATOMIC_RELAXED);
        __atomic_store_n((uint64_t *)cs, llword(f, tag), __ATOMIC_RELAXED);
        return;
    }
    for (uint32_t k = 0; k < words; k++)
        __atomic_store_n((uint64_t *)(cs + 16 + 8 * k), llword(f, 0), __ATOMIC_RELAXED);
    memcpy(cs + off, src, len);
    __atomic_store_n((uint64_t *)(cs + 8), llword(f, len), __ATOMIC_RELEASE);
    __atomic_store_n((uint64_t *)cs, llword(f, tag), __ATOMIC_RELEASE);
}

/* The sim consumer's slot table.  A NEAR channel gets the odd physical
 * slots (host memory has no L2 partitions: any choice that is not the first
 * nslots exercises the table on both sides), written as gdrpy_chan_place()
 * does: both blocks' tables, then PLACED; the caller then sets RUNNING. */
static void sim_place(gdrpy_chan_t *c, uint32_t *slot_of)
{
    const gdrpy_chan_desc_t *d = &c->desc;
    if (!d->place_nslots) {
        for (uint32_t k = 0; k < d->nslots; k++) slot_of[k] = k;
        return;
    }
    uint32_t *dev_t = dev_table(c), *host_t = host_table(c);
    for (uint32_t k = 0; k < d->nslots; k++) {
        slot_of[k] = 2 * k + 1;
        dev_t[k] = host_t[k] = 2 * k + 1;
    }
    gp_wc_fence(); /* dev_t may be a write-combined mapping */
    __atomic_store_n((uint32_t *)(c->host + GDRPY_CHAN_HOST_PLACED), 1u, __ATOMIC_RELEASE);
}

static void *sim_consumer_main(void *arg)
{
    struct gdrpy_chan_sim_consumer *sc = arg;
    const gdrpy_chan_desc_t *d = &sc->desc;
    /* The device block through the mapping (the same memory the GPU would
     * read), the host block directly. */
    const char *ring = sc->ring;
    const uint32_t *slot_of = sc->slot_of;
    const volatile uint32_t *mode_p = (const volatile uint32_t *)(sc->dev + GDRPY_CHAN_DEV_SHUTDOWN);
    const volatile uint64_t *sent_p = (const volatile uint64_t *)(sc->dev + GDRPY_CHAN_DEV_SENT);
    const volatile uint64_t *cread_p = (const volatile uint64_t *)(sc->dev + GDRPY_CHAN_DEV_COMP_READ);
    char *host = sc->host;
    char *comp = host + GDRPY_CHAN_HOST_CTRL;
    uint64_t *consumed_p = (uint64_t *)(host + GDRPY_CHAN_HOST_CONSUMED);
    unsigned char *expect = malloc(d->slot_size ? d->slot_size : 1);
    unsigned char llbuf[GDRPY_CHAN_LL_MAX];
    const int ll = !(d->flags & GDRPY_CHAN_PLAIN);
    uint64_t head = 0, comp_head = 0, credit = 0;
    uint32_t status = GDRPY_CHAN_ST_STOPPED;
    if (sc->delay_ns > 0) sleep_ns(sc->delay_ns);
    int64_t idle_since = now_ns();
    unsigned spins = 0;
    int yielding = 0;
    for (;;) {
        const char *s = ring + (size_t)slot_of[head & (d->nslots - 1)] * d->slot_stride;
        /* ABORT is looked at before every message (a GPU kernel would look
         * once per batch: the contract is "at the next check"). */
        if (__atomic_load_n((const uint32_t *)mode_p, __ATOMIC_ACQUIRE) == GDRPY_CHAN_ABORT)
            break;
        uint32_t len = 0, tag = 0;
        const unsigned char *pl = NULL;
        if (gdrpy_chan_host_take(d, s, head, llbuf, &len, &tag, &pl)) {
            if (sc->flags & GDRPY_CHAN_SIM_CHECK) {
                gdrpy_chan_pattern(head, expect, len);
                if (tag != (uint32_t)head || (expect && memcmp(expect, pl, len) != 0)) {
                    if (!sc->errors) sc->first_bad = head;
                    sc->errors++;
                }
            }
            if (sc->flags & (GDRPY_CHAN_SIM_COMPLETE | GDRPY_CHAN_SIM_ECHO)) {
                int64_t wait_since = now_ns();
                while (comp_head - credit >= d->comp_nslots) {
                    credit = __atomic_load_n((const uint64_t *)cread_p, __ATOMIC_ACQUIRE);
                    if (comp_head - credit < d->comp_nslots) break;
                    if (__atomic_load_n((const uint32_t *)mode_p, __ATOMIC_ACQUIRE) == GDRPY_CHAN_ABORT)
                        goto out;
                    if (sc->idle_ns >= 0 && now_ns() - wait_since > sc->idle_ns) {
                        status = GDRPY_CHAN_ST_TIMEOUT;
                        goto out;
                    }
                    gp_cpu_relax();
                }
                struct {
                    uint64_t seq;
                    uint32_t csum, len;
                } r = {head + 1, 0, len};
                const void *src = pl;
                uint32_t rl = len < d->comp_size ? len : d->comp_size; /* ECHO */
                if (sc->flags & GDRPY_CHAN_SIM_COMPLETE) {
                    r.csum = gdrpy_chan_checksum(pl, len);
                    src = &r;
                    rl = d->comp_size < sizeof r ? d->comp_size : (uint32_t)sizeof r;
                    if (d->comp_size == 0) tag = r.csum; /* tag answers */
                }
                char *cs = comp + (size_t)(comp_head & (d->comp_nslots - 1)) * d->comp_stride;
                if (ll) {
                    sim_ll_complete(cs, comp_head, d, src, rl, tag);
                } else {
                    *(volatile uint64_t *)(cs + 8) = (uint64_t)rl | ((uint64_t)tag << 32);
                    memcpy(cs + GDRPY_CHAN_HDR, src, rl);
                    __atomic_store_n((uint64_t *)cs, comp_head + 1, __ATOMIC_RELEASE);
                }
                comp_head++;
            }
            head++;
            __atomic_store_n(consumed_p, head, __ATOMIC_RELEASE);
            idle_since = 0;
            spins = 0;
            yielding = 0;
            continue;
        }
        uint32_t mode = __atomic_load_n((const uint32_t *)mode_p, __ATOMIC_ACQUIRE);
        if (mode == GDRPY_CHAN_DRAIN && head >= *sent_p) break;
        if (!idle_since) idle_since = now_ns();
        if ((++spins & 255u) == 0 && sc->idle_ns >= 0 && now_ns() - idle_since > sc->idle_ns) {
            status = GDRPY_CHAN_ST_TIMEOUT;
            break;
        }
        /* a CPU thread, not a GPU: after 200 us idle, give the core away
         * between polls (an oversubscribed host) */
        if ((spins & 63u) == 0 && now_ns() - idle_since > 200000) yielding = 1;
        if (yielding) sched_yield();
        else gp_cpu_relax();
    }
out:
    free(expect);
    free(sc->slot_of);
    sc->consumed = head;
    *(volatile uint64_t *)(host + GDRPY_CHAN_HOST_FINAL) = head;
    __atomic_store_n(consumed_p, head, __ATOMIC_RELEASE);
    __atomic_store_n((uint32_t *)(host + GDRPY_CHAN_HOST_STATUS), status, __ATOMIC_RELEASE);
    return NULL;
}

int gdrpy_chan_sim_consumer_start(gdrpy_chan_t *c, unsigned flags, int64_t start_delay_ns,
                                  int64_t idle_timeout_ns, gdrpy_chan_sim_consumer_t **out)
{
    if (!c || !out) return gp_err(GDRPY_EINVAL, "chan_sim_consumer_start: NULL argument");
    *out = NULL;
    if (flags & ~(GDRPY_CHAN_SIM_CHECK | GDRPY_CHAN_SIM_COMPLETE | GDRPY_CHAN_SIM_ECHO))
        return gp_err(GDRPY_EINVAL, "chan_sim_consumer_start: unknown flags 0x%x", flags);
    if (ld_acq32(c->status) != GDRPY_CHAN_ST_NONE)
        return gp_err(GDRPY_EBUSY, "chan_sim_consumer_start: a consumer has already attached");
    struct gdrpy_chan_sim_consumer *sc = calloc(1, sizeof *sc);
    if (!sc) return gp_err(GDRPY_ENOMEM, "chan_sim_consumer_start: out of memory");
    sc->desc = c->desc;
    sc->ring = c->ring;
    sc->dev = c->dev;
    sc->host = c->host;
    sc->flags = flags;
    sc->delay_ns = start_delay_ns;
    sc->idle_ns = idle_timeout_ns;
    sc->first_bad = UINT64_MAX;
    sc->slot_of = malloc((size_t)c->desc.nslots * sizeof *sc->slot_of);
    if (!sc->slot_of) {
        free(sc);
        return gp_err(GDRPY_ENOMEM, "chan_sim_consumer_start: out of memory");
    }
    sim_place(c, sc->slot_of);
    /* Attach now, so that shutdown/destroy know a consumer is there. */
    __atomic_store_n((uint32_t *)(c->host + GDRPY_CHAN_HOST_STATUS), GDRPY_CHAN_ST_RUNNING,
                     __ATOMIC_RELEASE);
    int e = pthread_create(&sc->thread, NULL, sim_consumer_main, sc);
    if (e) {
        __atomic_store_n((uint32_t *)(c->host + GDRPY_CHAN_HOST_STATUS), GDRPY_CHAN_ST_NONE,
                         __ATOMIC_RELEASE);
        __atomic_store_n((uint32_t *)(c->host + GDRPY_CHAN_HOST_PLACED), 0u, __ATOMIC_RELEASE);
        free(sc->slot_of);
        free(sc);
        return gp_err(GDRPY_ENOMEM, "chan_sim_consumer_start: pthread_create: %s", strerror(e));
    }
    *out = sc;
    return 0;
}

int gdrpy_chan_sim_consumer_join(gdrpy_chan_sim_consumer_t *sc, uint64_t *consumed,
                                 uint64_t *errors, uint64_t *first_bad)
{
    if (!sc) return gp_err(GDRPY_EINVAL, "chan_sim_consumer_join: NULL consumer");
    pthread_join(sc->thread, NULL);
    if (consumed) *consumed = sc->consumed;
    if (errors) *errors = sc->errors;
    if (first_bad) *first_bad = sc->first_bad;
    free(sc);
    return 0;
}
