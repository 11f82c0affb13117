/*
 * feedcore.c - the trading-feed example's C side: the C handler, the ack
 * collector, the sim consumer and the UDP batch receive.  See feedcore.h.
 * Built by examples/feed/Makefile against libgdrpy (gdrpy.h,
 * gdrpy_channel.h).  Example code: not part of the gdrpy library.
 */
#include "feedcore.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "gdrpy.h"
#include "gdrpy_channel.h"

#define MAXB 4096
#define MAX_PER_PACKET 32
#define GRO_SEGS 64 /* the sender's UDP_SEGMENT sends carry at most 64 datagrams */

static __thread char feed_err[256];

const char *feed_last_error(void) { return feed_err; }

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t feed_now_ns(void) { return now_ns(); }

static inline void cpu_relax(void) { __builtin_ia32_pause(); }

static inline uint64_t ld_acq(const volatile uint64_t *p)
{
    return __atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE);
}

static inline void st_rel(volatile uint64_t *p, uint64_t v)
{
    __atomic_store_n((uint64_t *)p, v, __ATOMIC_RELEASE);
}

static void pin_cpu(int cpu)
{
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

/* ---- histograms ------------------------------------------------------- */
static inline unsigned hidx(uint64_t v)
{
    if (v < 1024) return (unsigned)v;
    int msb = 63 - __builtin_clzll(v);
    int sh = msb - 9;
    if (sh > 40) return FEED_HBUCKETS - 1;
    unsigned i = 1024u + (unsigned)(sh - 1) * 512u + (unsigned)((v >> sh) - 512u);
    return i < FEED_HBUCKETS ? i : FEED_HBUCKETS - 1;
}

double feed_hist_value(int k)
{
    if (k < 1024) return (double)k;
    int sh = (k - 1024) / 512 + 1;
    int j = (k - 1024) % 512;
    return (double)((uint64_t)(512 + j) << sh) + (double)(1ull << sh) / 2.0;
}

static inline void hadd(feed_hist_t *h, int64_t d)
{
    uint64_t v = d < 0 ? 0 : (uint64_t)d;
    h->b[hidx(v)]++;
    h->n++;
    h->sum += v;
    if (v > h->max) h->max = v;
    if (h->n == 1 || v < h->min) h->min = v;
}

/* ---- ack collector ---------------------------------------------------- */
struct feed_acks {
    feed_ts_t *ts;
    uint64_t mask;
    const volatile uint64_t *ack;
    volatile uint64_t done;
    volatile int stop;
    int cpu;
    pthread_t th;
    int started;
    uint64_t first_ns, last_ns, stamp_waits;
    uint64_t max_gap_ns, gaps_50us, ctx_invol, ctx_vol, minflt;
    feed_hist_t h[FEED_H_COUNT];
    /* tail attribution (feed_acks_tail): per end-to-end bucket, the ticks,
     * their summed stages (socket, handler, ring+consumer+ack) and how often
     * each stage was the tick's largest */
    uint64_t ta[FEED_TA_BUCKETS][FEED_TA_FIELDS];
};

/* e2e bucket of the tail attribution: 0.5 us wide below 64 us, then one
 * per power of two (64 us, 128 us, ... up to ~2 s) */
static inline unsigned ta_bucket(uint64_t ns)
{
    if (ns < 64000) return (unsigned)(ns / 500);
    unsigned k = 128 + (unsigned)(63 - __builtin_clzll(ns / 64000));
    return k < FEED_TA_BUCKETS ? k : FEED_TA_BUCKETS - 1;
}

double feed_ta_edge_ns(int k)
{
    if (k < 128) return 500.0 * k;
    return 64000.0 * (double)(1ull << (k - 128));
}

static inline void ta_add(feed_acks_t *a, int64_t e2e, int64_t s, int64_t h, int64_t g)
{
    if (e2e < 0) e2e = 0;
    uint64_t *r = a->ta[ta_bucket((uint64_t)e2e)];
    int64_t v[3] = {s > 0 ? s : 0, h > 0 ? h : 0, g > 0 ? g : 0};
    int big = v[0] >= v[1] ? (v[0] >= v[2] ? 0 : 2) : (v[1] >= v[2] ? 1 : 2);
    r[0]++;
    r[1] += (uint64_t)v[0];
    r[2] += (uint64_t)v[1];
    r[3] += (uint64_t)v[2];
    r[4 + big]++;
}

void feed_acks_tail(feed_acks_t *a, uint64_t *out)
{
    memcpy(out, a->ta, sizeof a->ta);
}

/* This thread's context switches and minor page faults so far. */
static void thread_usage(uint64_t *invol, uint64_t *vol, uint64_t *minflt)
{
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    getrusage(RUSAGE_THREAD, &ru);
    *invol = (uint64_t)ru.ru_nivcsw;
    *vol = (uint64_t)ru.ru_nvcsw;
    *minflt = (uint64_t)ru.ru_minflt;
}

feed_acks_t *feed_acks_new(uint64_t ts_slots)
{
    if (ts_slots < 2 || (ts_slots & (ts_slots - 1))) {
        snprintf(feed_err, sizeof feed_err, "ts_slots %llu is not a power of two >= 2",
                 (unsigned long long)ts_slots);
        return NULL;
    }
    feed_acks_t *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    if (posix_memalign((void **)&a->ts, 64, ts_slots * sizeof(feed_ts_t))) {
        free(a);
        return NULL;
    }
    memset(a->ts, 0, ts_slots * sizeof(feed_ts_t));
    a->mask = ts_slots - 1;
    return a;
}

void feed_acks_free(feed_acks_t *a)
{
    if (!a) return;
    if (a->started) feed_acks_stop(a);
    free(a->ts);
    free(a);
}

feed_ts_t *feed_acks_ts(feed_acks_t *a) { return a->ts; }
uint64_t feed_acks_mask(feed_acks_t *a) { return a->mask; }
uint64_t feed_acks_done(feed_acks_t *a) { return ld_acq(&a->done); }
feed_hist_t *feed_acks_hist(feed_acks_t *a, int k) { return &a->h[k]; }
uint64_t feed_acks_first_ns(feed_acks_t *a) { return a->first_ns; }
uint64_t feed_acks_last_ns(feed_acks_t *a) { return a->last_ns; }
uint64_t feed_acks_stamp_waits(feed_acks_t *a) { return a->stamp_waits; }

void feed_acks_thread_info(feed_acks_t *a, uint64_t *out5)
{
    out5[0] = a->max_gap_ns;
    out5[1] = a->gaps_50us;
    out5[2] = a->ctx_invol;
    out5[3] = a->ctx_vol;
    out5[4] = a->minflt;
}

int feed_acks_stamp(feed_acks_t *a, uint64_t first, uint32_t m, const void *ticks,
                    uint32_t stride, uint64_t t_recv)
{
    uint64_t t_wr = now_ns();
    int waited = 0;
    if (m == 0) return 0;
    /* the slots of first..first+m-1 held first-(mask+1)..: accounted yet? */
    while (first + m - 1 - ld_acq(&a->done) > a->mask) {
        waited = 1;
        cpu_relax();
    }
    const unsigned char *p = ticks;
    for (uint32_t j = 0; j < m; j++) {
        feed_ts_t *e = &a->ts[(first + j) & a->mask];
        memcpy(&e->send_ns, p + (size_t)j * stride + 8, 8);
        e->recv_ns = t_recv;
        e->wr_ns = t_wr;
        st_rel(&e->idx, first + j);
    }
    return waited;
}

static void *acks_main(void *arg)
{
    feed_acks_t *a = arg;
    pin_cpu(a->cpu);
    thread_usage(&a->ctx_invol, &a->ctx_vol, &a->minflt);
    uint64_t done = a->done;
    uint64_t t_prev = now_ns();
    unsigned idle = 0;
    for (;;) {
        int stopping = __atomic_load_n(&a->stop, __ATOMIC_ACQUIRE);
        uint64_t c = ld_acq(a->ack);
        if (c > done || (++idle & 63u) == 0) {
            /* stall evidence: time between two looks (every 64th idle look) */
            uint64_t t = now_ns();
            uint64_t g = t - t_prev;
            t_prev = t;
            if (g > a->max_gap_ns) a->max_gap_ns = g;
            if (g > 50000) a->gaps_50us++;
            if (c <= done) continue;
            if (!a->first_ns) a->first_ns = t;
            a->last_ns = t;
            for (uint64_t i = done + 1; i <= c; i++) {
                feed_ts_t *e = &a->ts[i & a->mask];
                /* the handler stamps wr_ns after publishing: the ack can be
                 * faster than the stamp.  The ack time is taken already. */
                uint64_t spins = 0;
                while (ld_acq(&e->idx) != i) {
                    a->stamp_waits++;
                    cpu_relax();
                    if (++spins > (1ull << 28)) break; /* never stamped: give up */
                }
                hadd(&a->h[FEED_H_E2E], (int64_t)(t - e->send_ns));
                hadd(&a->h[FEED_H_SOCKET], (int64_t)(e->recv_ns - e->send_ns));
                hadd(&a->h[FEED_H_HANDLER], (int64_t)(e->wr_ns - e->recv_ns));
                hadd(&a->h[FEED_H_GPU], (int64_t)(t - e->wr_ns));
                hadd(&a->h[FEED_H_RECV_ACK], (int64_t)(t - e->recv_ns));
                ta_add(a, (int64_t)(t - e->send_ns), (int64_t)(e->recv_ns - e->send_ns),
                       (int64_t)(e->wr_ns - e->recv_ns), (int64_t)(t - e->wr_ns));
            }
            done = c;
            st_rel(&a->done, done);
            continue;
        }
        if (stopping) break;
        cpu_relax();
    }
    {
        uint64_t i1, v1, f1;
        thread_usage(&i1, &v1, &f1);
        a->ctx_invol = i1 - a->ctx_invol; /* started as the values at start */
        a->ctx_vol = v1 - a->ctx_vol;
        a->minflt = f1 - a->minflt;
    }
    return NULL;
}

int feed_acks_start(feed_acks_t *a, const volatile uint64_t *ack, int cpu)
{
    if (a->started) return EBUSY;
    a->ack = ack;
    a->cpu = cpu;
    a->stop = 0;
    a->done = 0;
    a->first_ns = a->last_ns = a->stamp_waits = 0;
    a->max_gap_ns = a->gaps_50us = a->ctx_invol = a->ctx_vol = a->minflt = 0;
    memset(a->h, 0, sizeof a->h);
    memset(a->ta, 0, sizeof a->ta);
    memset(a->ts, 0, (a->mask + 1) * sizeof(feed_ts_t));
    int rc = pthread_create(&a->th, NULL, acks_main, a);
    if (rc) return rc;
    a->started = 1;
    return 0;
}

int feed_acks_stop(feed_acks_t *a)
{
    if (!a->started) return 0;
    __atomic_store_n(&a->stop, 1, __ATOMIC_RELEASE);
    pthread_join(a->th, NULL);
    a->started = 0;
    return 0;
}

/* ---- host stall probe ------------------------------------------------- */
struct feed_stalls {
    uint64_t thr_ns;
    volatile int stop;
    pthread_t th;
    uint64_t n, total_ns, t0, t1;
    feed_hist_t dur, gap;
};

static void *stalls_main(void *arg)
{
    feed_stalls_t *s = arg; /* on its CPU from the start (feed_stalls_start) */
    uint64_t prev = now_ns(), last_start = 0;
    s->t0 = prev;
    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        uint64_t t = now_ns();
        if (t - prev > s->thr_ns) {
            s->n++;
            s->total_ns += t - prev;
            hadd(&s->dur, (int64_t)(t - prev));
            if (last_start) hadd(&s->gap, (int64_t)(prev - last_start));
            last_start = prev;
        }
        prev = t;
    }
    s->t1 = prev;
    return NULL;
}

feed_stalls_t *feed_stalls_start(int cpu, uint64_t thr_ns)
{
    feed_stalls_t *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(feed_err, sizeof feed_err, "stall probe: out of memory");
        return NULL;
    }
    s->thr_ns = thr_ns;
    /* the thread starts on its CPU (it must not spin, even briefly, on the
     * CPU of the thread that starts it: the handler's), and a CPU it may
     * not run on is an error here, not a probe on the wrong CPU */
    pthread_attr_t attr;
    int rc = cpu < 0 || cpu >= CPU_SETSIZE ? EINVAL : pthread_attr_init(&attr);
    if (!rc) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        rc = pthread_attr_setaffinity_np(&attr, sizeof set, &set);
        if (!rc) rc = pthread_create(&s->th, &attr, stalls_main, s);
        pthread_attr_destroy(&attr);
    }
    if (rc) {
        snprintf(feed_err, sizeof feed_err, "stall probe on CPU %d: %s", cpu, strerror(rc));
        free(s);
        return NULL;
    }
    return s;
}

void feed_stalls_stop(feed_stalls_t *s, uint64_t *out3)
{
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
    pthread_join(s->th, NULL);
    out3[0] = s->n;
    out3[1] = s->total_ns;
    out3[2] = s->t1 - s->t0;
}

feed_hist_t *feed_stalls_hist(feed_stalls_t *s, int k) { return k ? &s->gap : &s->dur; }

void feed_stalls_free(feed_stalls_t *s) { free(s); }

/* ---- UDP batch receive (for the Python handler) ----------------------- */
int feed_udp_recv_batch(int fd, void *buf, uint32_t cap, uint32_t max, uint32_t *lens)
{
    struct mmsghdr msgs[256];
    struct iovec iov[256];
    if (max > 256) max = 256;
    for (uint32_t k = 0; k < max; k++) {
        iov[k].iov_base = (char *)buf + (size_t)k * cap;
        iov[k].iov_len = cap;
        memset(&msgs[k].msg_hdr, 0, sizeof msgs[k].msg_hdr);
        msgs[k].msg_hdr.msg_iov = &iov[k];
        msgs[k].msg_hdr.msg_iovlen = 1;
    }
    int r = recvmmsg(fd, msgs, max, MSG_DONTWAIT, NULL);
    if (r < 0) return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -errno;
    for (int k = 0; k < r; k++) lens[k] = msgs[k].msg_len;
    return r;
}

/* What both receivers share (first in each): the handler's bookkeeping of
 * the last receive, so that stamping it is one call without arguments. */
typedef struct {
    uint64_t t_poll; /* when the poll that found ticks began (feed_rx_t_poll) */
    uint64_t t_recv; /* when that receive returned */
    uint64_t w;      /* ring indices stamped so far */
    uint64_t last;   /* ticks (rows of `ticks`) the last receive returned */
    feed_acks_t *acks;
    unsigned char *ticks;
} rx_common_t;

struct feed_udp_rx {
    rx_common_t c;
    int fd, gro;
    uint32_t max, row, region;
    uint64_t end[6];
    uint64_t spin_ns;
    uint32_t *lens;
    struct mmsghdr *msgs;
    struct iovec *iov;
};

feed_udp_rx_t *feed_udp_rx_new(int fd, void *ticks, uint32_t per_packet, uint32_t max_dgrams,
                               void *side, uint32_t *lens, uint64_t spin_ns)
{
    if (!ticks || !side || !lens || per_packet < 1 || per_packet > MAX_PER_PACKET ||
        max_dgrams < 1 || max_dgrams > MAXB) {
        snprintf(feed_err, sizeof feed_err, "feed_udp_rx_new: bad arguments");
        return NULL;
    }
    feed_udp_rx_t *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->msgs = calloc(max_dgrams, sizeof *r->msgs);
    r->iov = calloc(2 * (size_t)max_dgrams, sizeof *r->iov);
    if (!r->msgs || !r->iov) {
        feed_udp_rx_free(r);
        return NULL;
    }
    r->fd = fd;
    r->c.ticks = ticks;
    r->spin_ns = spin_ns;
    r->max = max_dgrams;
    r->lens = lens;
    r->row = per_packet * FEED_TICK_SIZE;
    size_t row = r->row;
    for (uint32_t k = 0; k < max_dgrams; k++) {
        r->iov[2 * k].iov_base = (char *)ticks + k * row;
        r->iov[2 * k].iov_len = row;
        r->iov[2 * k + 1].iov_base = (char *)side + (size_t)k * 64;
        r->iov[2 * k + 1].iov_len = 64;
        r->msgs[k].msg_hdr.msg_iov = &r->iov[2 * k];
        r->msgs[k].msg_hdr.msg_iovlen = 2;
    }
    return r;
}

int feed_udp_rx(feed_udp_rx_t *r)
{
    int n;
    uint64_t t0 = 0;
    uint64_t t = now_ns();
    for (;;) {
        r->c.t_poll = t;
        n = recvmmsg(r->fd, r->msgs, r->max, MSG_DONTWAIT, NULL);
        t = now_ns();
        if (n > 0) break;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -errno;
        if (!t0) t0 = r->c.t_poll;
        if (t - t0 >= r->spin_ns) return 0;
    }
    r->c.t_recv = t;
    if (r->gro) {
        /* coalesced datagrams: move every message's ticks to the front, in
         * order; the END packet's counts are kept; the rest is malformed */
        uint64_t w = 0;
        for (int k = 0; k < n; k++) {
            const unsigned char *p = r->c.ticks + (size_t)k * r->region;
            uint32_t len = r->msgs[k].msg_len;
            uint64_t q0 = 0;
            if (len >= 8) memcpy(&q0, p, 8);
            if (len >= 56 && q0 == FEED_END_SEQ) {
                if (!r->lens[1]) memcpy(r->end, p + 8, sizeof r->end);
                r->lens[1] = 1;
                continue;
            }
            if (len == 0 || len % FEED_TICK_SIZE || (r->msgs[k].msg_hdr.msg_flags & MSG_TRUNC)) {
                r->lens[0]++;
                continue;
            }
            if ((size_t)k * r->region != w * FEED_TICK_SIZE)
                memmove(r->c.ticks + w * FEED_TICK_SIZE, p, len);
            w += len / FEED_TICK_SIZE;
        }
        r->c.last = w;
        return (int)w;
    }
    r->c.last = (uint64_t)n * (r->row / FEED_TICK_SIZE);
    uint32_t odd = 0;
    for (int k = 0; k < n; k++) {
        r->lens[k] = r->msgs[k].msg_len;
        odd += r->msgs[k].msg_len != r->row;
    }
    r->lens[r->max] = odd;
    return n;
}

feed_udp_rx_t *feed_udp_rx_new_gro(int fd, void *ticks, uint32_t per_packet, uint32_t max_msgs,
                                   uint32_t *lens, uint64_t spin_ns)
{
    if (!ticks || !lens || per_packet < 1 || per_packet > MAX_PER_PACKET || max_msgs < 1 ||
        max_msgs > MAXB) {
        snprintf(feed_err, sizeof feed_err, "feed_udp_rx_new_gro: bad arguments");
        return NULL;
    }
    feed_udp_rx_t *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->msgs = calloc(max_msgs, sizeof *r->msgs);
    r->iov = calloc(max_msgs, sizeof *r->iov);
    if (!r->msgs || !r->iov) {
        feed_udp_rx_free(r);
        return NULL;
    }
    r->fd = fd;
    r->gro = 1;
    r->c.ticks = ticks;
    r->spin_ns = spin_ns;
    r->max = max_msgs;
    r->lens = lens;
    r->row = per_packet * FEED_TICK_SIZE;
    r->region = GRO_SEGS * r->row; /* the most one coalesced message carries */
    for (uint32_t k = 0; k < max_msgs; k++) {
        r->iov[k].iov_base = (char *)ticks + (size_t)k * r->region;
        r->iov[k].iov_len = r->region;
        r->msgs[k].msg_hdr.msg_iov = &r->iov[k];
        r->msgs[k].msg_hdr.msg_iovlen = 1;
    }
    return r;
}

void feed_udp_rx_end(const feed_udp_rx_t *r, uint64_t *out6) { memcpy(out6, r->end, sizeof r->end); }

void feed_udp_rx_free(feed_udp_rx_t *r)
{
    if (!r) return;
    free(r->msgs);
    free(r->iov);
    free(r);
}

struct feed_shm_rx {
    rx_common_t c;
    feed_shm_hdr_t *h;
    unsigned char *slots, *ticks;
    uint64_t tail, mask, spin_ns;
    uint32_t max;
};

feed_shm_rx_t *feed_shm_rx_new(void *shm, void *ticks, uint32_t max, uint64_t spin_ns)
{
    feed_shm_hdr_t *h = shm;
    if (!h || !ticks || max < 1 || h->magic != FEED_SHM_MAGIC || !h->nslots ||
        (h->nslots & (h->nslots - 1))) {
        snprintf(feed_err, sizeof feed_err, "feed_shm_rx_new: bad arguments or not a feed ring");
        return NULL;
    }
    feed_shm_rx_t *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->h = h;
    r->slots = (unsigned char *)shm + FEED_SHM_HDR;
    r->ticks = ticks;
    r->c.ticks = ticks;
    r->mask = h->nslots - 1;
    r->tail = ld_acq(&h->tail);
    r->max = max;
    r->spin_ns = spin_ns;
    return r;
}

int feed_shm_rx(feed_shm_rx_t *r)
{
    uint32_t n = 0;
    /* spin (up to spin_ns) until the next slot is ready or the producer is done */
    const unsigned char *first = r->slots + (r->tail & r->mask) * FEED_SHM_SLOT;
    if (ld_acq((const volatile uint64_t *)(first + FEED_SHM_MARK)) != r->tail + 1) {
        uint64_t t0 = now_ns();
        unsigned k = 0;
        while (ld_acq((const volatile uint64_t *)(first + FEED_SHM_MARK)) != r->tail + 1) {
            if (ld_acq(&r->h->done)) break;
            cpu_relax();
            if ((++k & 63u) == 0 && now_ns() - t0 >= r->spin_ns) break;
        }
    }
    r->c.t_poll = now_ns();
    while (n < r->max) {
        const unsigned char *slot = r->slots + ((r->tail + n) & r->mask) * FEED_SHM_SLOT;
        if (ld_acq((const volatile uint64_t *)(slot + FEED_SHM_MARK)) != r->tail + n + 1) break;
        memcpy(r->ticks + (size_t)n * FEED_TICK_SIZE, slot, FEED_TICK_SIZE);
        n++;
    }
    if (n) {
        r->tail += n;
        st_rel(&r->h->tail, r->tail);
        r->c.t_recv = now_ns();
        r->c.last = n;
        return (int)n;
    }
    if (ld_acq(&r->h->done)) {
        /* done is stored after the last slot: one more look */
        const unsigned char *slot = r->slots + (r->tail & r->mask) * FEED_SHM_SLOT;
        if (ld_acq((const volatile uint64_t *)(slot + FEED_SHM_MARK)) == r->tail + 1) return 0;
        return -1;
    }
    return 0;
}

void feed_shm_rx_free(feed_shm_rx_t *r) { free(r); }

const uint64_t *feed_rx_t_poll(const void *rx) { return &((const rx_common_t *)rx)->t_poll; }

void feed_rx_set_acks(void *rx, feed_acks_t *acks) { ((rx_common_t *)rx)->acks = acks; }

int feed_rx_commit(void *rx)
{
    rx_common_t *c = rx;
    int waited = feed_acks_stamp(c->acks, c->w + 1, (uint32_t)c->last, c->ticks,
                                 FEED_TICK_SIZE, c->t_recv);
    c->w += c->last;
    return waited;
}

void feed_rx_advance(void *rx, uint64_t m) { ((rx_common_t *)rx)->w += m; }

/* ---- the C handler ---------------------------------------------------- */
typedef struct {
    const feed_hcfg_t *cfg;
    feed_hstats_t *st;
    /* UDP */
    struct mmsghdr msgs[MAXB];
    struct iovec iov[MAXB];
    unsigned char *rbuf;
    uint32_t cap, ndg;
    /* shm */
    feed_shm_hdr_t *shm;
    unsigned char *slots;
    uint64_t shm_tail, shm_mask;
    /* batch */
    feed_tick_t tb[MAXB];
    const feed_tick_t *fwd[MAXB];
    gdrpy_chan_msg_t cm[MAXB];
    unsigned char *staging;
    uint64_t exp, w;
} hstate_t;

static int set_err(feed_hstats_t *st, int code, const char *fmt, const char *detail)
{
    st->error = code;
    snprintf(st->msg, sizeof st->msg, fmt, detail ? detail : "");
    return code;
}

/* UDP: receive one batch into s->tb; returns ticks; *end set on END. */
static int udp_batch(hstate_t *s, int *end)
{
    feed_hstats_t *st = s->st;
    int r = recvmmsg(s->cfg->fd, s->msgs, s->ndg, MSG_DONTWAIT, NULL);
    if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
        set_err(st, errno, "recvmmsg: %s", strerror(errno));
        return -1;
    }
    int n = 0;
    for (int k = 0; k < r; k++) {
        const unsigned char *p = s->rbuf + (size_t)k * s->cap;
        uint32_t len = s->msgs[k].msg_len;
        uint64_t seq0;
        if (len >= 8) memcpy(&seq0, p, 8);
        if (len >= 8 && seq0 == FEED_END_SEQ) {
            if (len >= 56 && !st->end_seen) {
                uint64_t e[7];
                memcpy(e, p, sizeof e);
                st->snd_sent = e[1];
                st->snd_generated = e[2];
                st->snd_skipped = e[3];
                st->snd_failed = e[4];
                st->snd_t0 = e[5];
                st->snd_t1 = e[6];
            }
            st->end_seen = 1;
            *end = 1;
            continue;
        }
        if (len == 0 || len % FEED_TICK_SIZE || (s->msgs[k].msg_hdr.msg_flags & MSG_TRUNC)) {
            st->bad_packets++;
            continue;
        }
        uint32_t k2 = len / FEED_TICK_SIZE;
        memcpy(&s->tb[n], p, len);
        n += (int)k2;
    }
    return n;
}

/* shm: take the ready prefix (up to batch) and release the slots at once. */
static int shm_batch(hstate_t *s, int *end)
{
    uint32_t maxn = s->cfg->batch;
    int n = 0;
    while ((uint32_t)n < maxn) {
        unsigned char *slot = s->slots + ((s->shm_tail + (uint64_t)n) & s->shm_mask) * FEED_SHM_SLOT;
        if (ld_acq((const volatile uint64_t *)(slot + FEED_SHM_MARK)) != s->shm_tail + (uint64_t)n + 1)
            break;
        memcpy(&s->tb[n], slot, FEED_TICK_SIZE);
        n++;
    }
    if (n) {
        s->shm_tail += (uint64_t)n;
        st_rel(&s->shm->tail, s->shm_tail);
        return n;
    }
    if (ld_acq(&s->shm->done)) {
        /* done was stored after the last slot: one more look */
        unsigned char *slot = s->slots + (s->shm_tail & s->shm_mask) * FEED_SHM_SLOT;
        if (ld_acq((const volatile uint64_t *)(slot + FEED_SHM_MARK)) == s->shm_tail + 1) return 0;
        feed_hstats_t *st = s->st;
        st->end_seen = 1;
        st->snd_sent = s->shm->sent;
        st->snd_generated = s->shm->last_seq;
        st->snd_failed = s->shm->dropped; /* rx_missed: ring full at the producer */
        st->snd_t0 = s->shm->t_first_ns;
        st->snd_t1 = s->shm->t_last_ns;
        *end = 1;
    }
    return 0;
}

/* Publishes s->fwd[0..m) as ring indices w+1..w+m. */
static int publish(hstate_t *s, uint32_t m)
{
    const feed_hcfg_t *cfg = s->cfg;
    if (cfg->path == FEED_PATH_CHANNEL) {
        for (uint32_t j = 0; j < m; j++) {
            s->cm[j].buf = s->fwd[j];
            s->cm[j].len = FEED_TICK_SIZE;
            s->cm[j].tag = 0;
        }
        int rc = gdrpy_chan_send_batch((gdrpy_chan_t *)cfg->chan, s->cm, m,
                                       (int64_t)cfg->full_timeout_ns);
        if (rc) return set_err(s->st, rc, "gdrpy_chan_send_batch: %s", gdrpy_last_error());
        return 0;
    }
    /* cuMemcpy path: slots (header + tick) for each contiguous ring range,
     * one cuMemcpyHtoD each, then the published count (another one). */
    uint32_t done = 0;
    while (done < m) {
        uint64_t idx = s->w + done; /* 0-based index of the first */
        uint32_t pos = (uint32_t)(idx & (cfg->nslots - 1));
        uint32_t cnt = m - done;
        if (pos + cnt > cfg->nslots) cnt = cfg->nslots - pos;
        for (uint32_t j = 0; j < cnt; j++) {
            unsigned char *sl = s->staging + (size_t)j * cfg->slot_stride;
            uint64_t seq = idx + j + 1;
            uint32_t len = FEED_TICK_SIZE, tag = 0;
            memcpy(sl, &seq, 8);
            memcpy(sl + 8, &len, 4);
            memcpy(sl + 12, &tag, 4);
            memcpy(sl + 16, s->fwd[done + j], FEED_TICK_SIZE);
        }
        int rc = gdrpy_memcpy_htod(cfg->ctx, cfg->ring + (uint64_t)pos * cfg->slot_stride,
                                   s->staging, (size_t)cnt * cfg->slot_stride);
        if (rc) return set_err(s->st, rc, "cuMemcpyHtoD (slots): %s", gdrpy_last_error());
        done += cnt;
    }
    uint64_t pub = s->w + m;
    int rc = gdrpy_memcpy_htod(cfg->ctx, cfg->dev_ctrl + FEED_DEV_PUBLISHED, &pub, 8);
    if (rc) return set_err(s->st, rc, "cuMemcpyHtoD (count): %s", gdrpy_last_error());
    return 0;
}

int feed_handler_run(const feed_hcfg_t *cfg, feed_hstats_t *st)
{
    memset(st, 0, sizeof *st);
    if (!cfg || cfg->batch < 1 || cfg->batch > MAXB || cfg->nslots < 2 ||
        (cfg->nslots & (cfg->nslots - 1)) || cfg->batch > cfg->nslots || !cfg->acks ||
        !cfg->consumed || (cfg->path == FEED_PATH_CHANNEL && !cfg->chan) ||
        (cfg->src == FEED_SRC_SHM && !cfg->shm) ||
        (cfg->src == FEED_SRC_UDP && (cfg->per_packet_max < 1 || cfg->per_packet_max > MAX_PER_PACKET)))
        return set_err(st, EINVAL, "feed_handler_run: bad configuration%s", NULL);
    hstate_t *s = calloc(1, sizeof *s);
    if (!s) return set_err(st, ENOMEM, "out of memory%s", NULL);
    s->cfg = cfg;
    s->st = st;
    s->exp = 1;
    int rc = 0;
    uint64_t u0_invol = 0, u0_vol = 0, u0_flt = 0;
    int u0_set = 0;
    if (cfg->src == FEED_SRC_UDP) {
        s->cap = (uint32_t)cfg->per_packet_max * FEED_TICK_SIZE;
        if (cfg->gro) s->cap *= GRO_SEGS; /* one message: up to 64 datagrams */
        if (s->cap < 64) s->cap = 64;
        s->ndg = cfg->batch / (uint32_t)cfg->per_packet_max;
        if (cfg->gro) {
            /* every message may be full: the batch stays within tb and the ring */
            uint32_t per = GRO_SEGS * (uint32_t)cfg->per_packet_max;
            uint32_t lim = (cfg->nslots < MAXB ? cfg->nslots : MAXB) / per;
            if (s->ndg > lim) s->ndg = lim;
            if (lim < 1) {
                free(s);
                return set_err(st, EINVAL, "feed_handler_run: with UDP GRO the ring needs at "
                                           "least 64 x per_packet slots%s",
                               NULL);
            }
        }
        if (s->ndg < 1) s->ndg = 1;
        s->rbuf = malloc((size_t)s->ndg * s->cap);
        if (!s->rbuf) {
            free(s);
            return set_err(st, ENOMEM, "out of memory%s", NULL);
        }
        for (uint32_t k = 0; k < s->ndg; k++) {
            s->iov[k].iov_base = s->rbuf + (size_t)k * s->cap;
            s->iov[k].iov_len = s->cap;
            s->msgs[k].msg_hdr.msg_iov = &s->iov[k];
            s->msgs[k].msg_hdr.msg_iovlen = 1;
        }
    } else {
        s->shm = (feed_shm_hdr_t *)cfg->shm;
        s->slots = (unsigned char *)cfg->shm + FEED_SHM_HDR;
        s->shm_mask = s->shm->nslots - 1;
        s->shm_tail = ld_acq(&s->shm->tail);
    }
    if (cfg->path == FEED_PATH_CUMEMCPY) {
        s->staging = aligned_alloc(64, (size_t)cfg->nslots * cfg->slot_stride);
        if (!s->staging) {
            rc = set_err(st, ENOMEM, "out of memory%s", NULL);
            goto out;
        }
    }
    pin_cpu(cfg->cpu);
    thread_usage(&u0_invol, &u0_vol, &u0_flt);
    u0_set = 1;
    feed_ts_t *ts = feed_acks_ts(cfg->acks);
    uint64_t tsmask = feed_acks_mask(cfg->acks);
    uint64_t t_start = now_ns();
    uint64_t deadline = t_start + cfg->max_ns;
    uint64_t consumed_seen = 0, acks_seen = 0;
    uint64_t t_data = t_start;
    uint64_t t_prev = t_start;
    for (;;) {
        int end = 0;
        uint64_t t_call = now_ns();
        {
            uint64_t g = t_call - t_prev;
            t_prev = t_call;
            if (g > st->max_gap_ns) st->max_gap_ns = g;
            if (g > 50000) {
                st->gaps_50us++;
                st->gaps_50us_ns += g;
            }
        }
        if (t_call > deadline) {
            rc = set_err(st, ETIMEDOUT, "handler deadline reached%s", NULL);
            break;
        }
        int n = cfg->src == FEED_SRC_UDP ? udp_batch(s, &end) : shm_batch(s, &end);
        if (n < 0) {
            rc = st->error;
            break;
        }
        if (n == 0) {
            st->empty_polls++;
            if (end) break;
            /* UDP: the END datagrams can be lost with the others when the
             * socket overflows: nothing for idle_end_ns after data = the end */
            if (cfg->idle_end_ns && st->received && t_call - t_data > cfg->idle_end_ns) break;
            continue;
        }
        uint64_t t_recv = now_ns();
        t_data = t_recv;
        if (!st->t_first_recv) st->t_first_recv = t_recv;
        /* sequence check: forward in-order and forward-jumping ticks */
        uint32_t m = 0;
        for (int j = 0; j < n; j++) {
            uint64_t q = s->tb[j].seq;
            st->received++;
            if (q == s->exp) {
                s->exp++;
            } else if (q > s->exp) {
                st->gaps++;
                st->missing += q - s->exp;
                s->exp = q + 1;
            } else {
                st->backward++;
                continue;
            }
            s->fwd[m++] = &s->tb[j];
        }
        if (m == 0) {
            if (end) break;
            continue;
        }
        /* ring room (back-pressure): never more than nslots unconsumed */
        if (s->w + m - consumed_seen > cfg->nslots) {
            consumed_seen = ld_acq(cfg->consumed);
            if (s->w + m - consumed_seen > cfg->nslots) {
                st->full_events++;
                if (cfg->on_full == FEED_FULL_DROP) {
                    uint64_t room = cfg->nslots - (s->w - consumed_seen);
                    st->dropped_full += m - room;
                    m = (uint32_t)room;
                } else {
                    uint64_t t0 = now_ns();
                    while (s->w + m - (consumed_seen = ld_acq(cfg->consumed)) > cfg->nslots) {
                        if (now_ns() - t0 > cfg->full_timeout_ns) {
                            rc = set_err(st, ETIMEDOUT, "ring full too long: the consumer "
                                                        "stopped%s",
                                         NULL);
                            goto out;
                        }
                        cpu_relax();
                    }
                    st->full_wait_ns += now_ns() - t0;
                }
            }
        }
        if (m) {
            /* stamps ring room (the collector is far behind: rare); its
             * `done` word is re-read only when the last value read is not
             * enough (the collector writes it all the time: reading it every
             * batch would cost a cache miss a batch) */
            if (s->w + m - acks_seen > tsmask) {
                acks_seen = feed_acks_done(cfg->acks);
                if (s->w + m - acks_seen > tsmask) {
                    st->collector_waits++;
                    while (s->w + m - (acks_seen = feed_acks_done(cfg->acks)) > tsmask)
                        cpu_relax();
                }
            }
            for (uint32_t j = 0; j < m; j++) {
                feed_ts_t *e = &ts[(s->w + 1 + j) & tsmask];
                e->send_ns = s->fwd[j]->send_ns;
                e->recv_ns = t_recv;
            }
            uint64_t t_pub = now_ns();
            if ((rc = publish(s, m))) break;
            uint64_t t_wr = now_ns();
            st->recv_ns += t_recv - t_call;
            st->publish_ns += t_wr - t_pub;
            if (m >= 64) {
                st->big_batches++;
                st->big_ticks += m;
                st->big_publish_ns += t_wr - t_pub;
            }
            for (uint32_t j = 0; j < m; j++) {
                feed_ts_t *e = &ts[(s->w + 1 + j) & tsmask];
                e->wr_ns = t_wr;
                st_rel(&e->idx, s->w + 1 + j);
            }
            s->w += m;
            st->forwarded += m;
            st->batches++;
            if (m > st->max_batch) st->max_batch = m;
            st->t_last_fwd = t_wr;
            st->busy_ns += t_wr - t_call;
        }
        if (end) break;
    }
out:
    st->last_seq = s->exp - 1;
    if (u0_set) {
        uint64_t i1, v1, f1;
        thread_usage(&i1, &v1, &f1);
        st->ctx_invol = i1 - u0_invol;
        st->ctx_vol = v1 - u0_vol;
        st->minflt = f1 - u0_flt;
    }
    free(s->rbuf);
    free(s->staging);
    free(s);
    return rc;
}

/* ---- sim consumer ------------------------------------------------------- */
struct feed_simc {
    gdrpy_chan_desc_t d;
    int published, cpu;
    unsigned char *out;
    uint32_t nsym;
    uint64_t seed, idle_ns, delay_ns;
    pthread_t th;
    volatile int finished;
};

static void *simc_main(void *arg)
{
    feed_simc_t *c = arg;
    pin_cpu(c->cpu);
    const gdrpy_chan_desc_t *d = &c->d;
    unsigned char *host = (unsigned char *)(uintptr_t)d->host_ctrl;
    unsigned char *dev = (unsigned char *)(uintptr_t)d->dev_ctrl;
    unsigned char *ring = (unsigned char *)(uintptr_t)d->ring;
    uint64_t *sums = calloc((size_t)c->nsym * 3, sizeof(uint64_t));
    uint64_t head = 0, last = 0, torn = 0, missing = 0, gaps = 0, backward = 0, badlen = 0;
    uint32_t status = GDRPY_CHAN_ST_STOPPED;
    *(volatile uint32_t *)(host + GDRPY_CHAN_HOST_STATUS) = GDRPY_CHAN_ST_RUNNING;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    uint64_t t_idle = now_ns();
    for (;;) {
        uint64_t n = 0, avail = 128;
        if (c->published) {
            uint64_t pub = ld_acq((const volatile uint64_t *)(dev + FEED_DEV_PUBLISHED));
            avail = pub > head ? pub - head : 0;
            if (avail > 128) avail = 128;
        }
        for (; n < avail; n++) {
            /* the channel's slots in either format (gdrpy_chan_host_take);
             * the cuMemcpy path's: header + tick, counted by `published` */
            const unsigned char *sl = ring + ((head + n) & (d->nslots - 1)) * d->slot_stride;
            unsigned char llbuf[GDRPY_CHAN_LL_MAX];
            const unsigned char *pl = sl + GDRPY_CHAN_HDR;
            uint32_t len, tag;
            if (c->published) memcpy(&len, sl + 8, 4);
            else if (!gdrpy_chan_host_take(d, sl, head + n, llbuf, &len, &tag, &pl)) break;
            feed_tick_t t, ref;
            memset(&t, 0, sizeof t);
            memcpy(&t, pl, len < sizeof t ? len : sizeof t);
            if (len != FEED_TICK_SIZE) badlen++;
            feed_tick_fill(&ref, t.seq, c->seed, c->nsym);
            if (ref.sym != t.sym || ref.qty != t.qty || ref.px != t.px) torn++;
            /* against the previous tick in ring order (as the kernel does) */
            if (t.seq > last + 1) {
                gaps++;
                missing += t.seq - last - 1;
            } else if (t.seq <= last) {
                backward++;
            }
            last = t.seq;
            if (t.sym < c->nsym) {
                sums[3 * t.sym] += (uint64_t)t.px * t.qty;
                sums[3 * t.sym + 1] += t.qty;
                sums[3 * t.sym + 2] += 1;
            }
            if (c->delay_ns) {
                uint64_t t0 = now_ns();
                while (now_ns() - t0 < c->delay_ns) cpu_relax();
            }
        }
        if (n == 0) {
            uint32_t mode = __atomic_load_n((const uint32_t *)(dev + GDRPY_CHAN_DEV_SHUTDOWN),
                                            __ATOMIC_ACQUIRE);
            if (mode == GDRPY_CHAN_ABORT) break;
            if (mode == GDRPY_CHAN_DRAIN &&
                head >= *(volatile uint64_t *)(dev + GDRPY_CHAN_DEV_SENT)) break;
            if (c->idle_ns && now_ns() - t_idle > c->idle_ns) {
                status = GDRPY_CHAN_ST_TIMEOUT;
                break;
            }
            sched_yield();
            continue;
        }
        head += n;
        /* the ack, then the consumed count (the kernel's order) */
        __atomic_store_n((uint64_t *)(c->out + FEED_OUT_ACK), head, __ATOMIC_RELAXED);
        st_rel((volatile uint64_t *)(host + GDRPY_CHAN_HOST_CONSUMED), head);
        t_idle = now_ns();
    }
    unsigned char *o = c->out;
    uint64_t vals[7] = {head, torn, missing, gaps, backward, last, badlen};
    memcpy(o, vals, sizeof vals);
    if (sums) memcpy(o + FEED_OUT_SYM, sums, (size_t)c->nsym * FEED_OUT_SYM_BYTES);
    free(sums);
    __atomic_store_n((uint32_t *)(o + FEED_OUT_DONE), 1u, __ATOMIC_RELEASE);
    *(volatile uint64_t *)(host + GDRPY_CHAN_HOST_FINAL) = head;
    st_rel((volatile uint64_t *)(host + GDRPY_CHAN_HOST_CONSUMED), head);
    __atomic_store_n((uint32_t *)(host + GDRPY_CHAN_HOST_STATUS), status, __ATOMIC_RELEASE);
    c->finished = 1;
    return NULL;
}

feed_simc_t *feed_simc_start(const void *desc, int published, void *out, uint32_t nsym,
                             uint64_t seed, uint64_t idle_ns, uint64_t delay_ns, int cpu)
{
    feed_simc_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    memcpy(&c->d, desc, sizeof c->d);
    c->published = published;
    c->out = out;
    c->nsym = nsym;
    c->seed = seed;
    c->idle_ns = idle_ns;
    c->delay_ns = delay_ns;
    c->cpu = cpu;
    if (pthread_create(&c->th, NULL, simc_main, c)) {
        free(c);
        return NULL;
    }
    return c;
}

int feed_simc_join(feed_simc_t *c, double timeout_s)
{
    uint64_t t0 = now_ns();
    while (!c->finished) {
        if ((double)(now_ns() - t0) * 1e-9 > timeout_s) return 1;
        usleep(100);
    }
    pthread_join(c->th, NULL);
    free(c);
    return 0;
}

/* ---- a channel on this library's own context (the C handler's) -------- */
struct feed_cchan {
    gdrpy_ctx_t ctx;
    gdrpy_pin_t pin;
    int mapped;
    gdrpy_chan_t *chan;
};

uint64_t feed_ctx_open(int device, const char *backend)
{
    gdrpy_ctx_t ctx = 0;
    int b = gdrpy_backend_from_name(backend ? backend : "auto");
    if (b < 0) {
        snprintf(feed_err, sizeof feed_err, "unknown backend %s", backend);
        return 0;
    }
    if (gdrpy_open(device, b, &ctx)) {
        snprintf(feed_err, sizeof feed_err, "gdrpy_open: %s", gdrpy_last_error());
        return 0;
    }
    return ctx;
}

void feed_ctx_close(uint64_t ctx)
{
    if (ctx) gdrpy_close(ctx);
}

uint64_t feed_sim_alloc(uint64_t size)
{
    uint64_t p = 0;
    if (gdrpy_sim_alloc(size, &p)) {
        snprintf(feed_err, sizeof feed_err, "gdrpy_sim_alloc: %s", gdrpy_last_error());
        return 0;
    }
    return p;
}

void feed_sim_free(uint64_t dptr)
{
    if (dptr) gdrpy_sim_free(dptr);
}

/* The feed's channel: `nslots` tick slots, LL (plain == 0) or PLAIN format;
 * no completions (the consumer's ack word, FEED_OUT_ACK, is the ack). */
static gdrpy_chan_config_t feed_chan_config(uint32_t nslots, int plain)
{
    gdrpy_chan_config_t cfg = {.nslots = nslots, .slot_size = FEED_TICK_SIZE, .comp_nslots = 2, .comp_size = 0, .flags = plain ? GDRPY_CHAN_PLAIN : 0};
    return cfg;
}

feed_cchan_t *feed_cchan_open(int device, const char *backend, uint64_t dptr, uint64_t size,
                              uint32_t nslots, int plain, char *err, int errlen)
{
    feed_cchan_t *c = calloc(1, sizeof *c);
    void *mp, *up;
    gdrpy_chan_config_t cfg = feed_chan_config(nslots, plain);
    const char *what = "calloc";
    if (!c) goto fail;
    what = "gdrpy_open";
    c->ctx = feed_ctx_open(device, backend);
    if (!c->ctx) goto fail;
    what = "gdrpy_pin";
    if (gdrpy_pin(c->ctx, dptr, size, 0, &c->pin)) goto fail;
    what = "gdrpy_map";
    if (gdrpy_map(c->ctx, c->pin, &mp, &up)) goto fail;
    c->mapped = 1;
    what = "gdrpy_chan_create";
    if (gdrpy_chan_create(c->ctx, c->pin, &cfg, &c->chan)) goto fail;
    return c;
fail:
    if (err) snprintf(err, (size_t)errlen, "%s: %s", what, gdrpy_last_error());
    feed_cchan_close(c);
    return NULL;
}

uint64_t feed_chan_device_bytes(uint32_t nslots, int plain)
{
    gdrpy_chan_config_t cfg = feed_chan_config(nslots, plain);
    size_t n = 0;
    if (gdrpy_chan_device_bytes(&cfg, &n)) {
        snprintf(feed_err, sizeof feed_err, "gdrpy_chan_device_bytes: %s", gdrpy_last_error());
        return 0;
    }
    return n;
}

void *feed_cchan_chan(feed_cchan_t *c) { return c->chan; }
void *feed_cchan_host_block(feed_cchan_t *c) { return gdrpy_chan_host_block(c->chan); }
uint64_t feed_cchan_ctx(feed_cchan_t *c) { return c->ctx; }

int feed_cchan_desc(feed_cchan_t *c, void *out64)
{
    return gdrpy_chan_get_desc(c->chan, (gdrpy_chan_desc_t *)out64);
}

int feed_cchan_shutdown(feed_cchan_t *c, int drain, double timeout_s, uint64_t *stats5)
{
    gdrpy_chan_stats_t st;
    memset(&st, 0, sizeof st);
    int rc = gdrpy_chan_shutdown(c->chan, drain ? GDRPY_CHAN_DRAIN : GDRPY_CHAN_ABORT,
                                 (int64_t)(timeout_s * 1e9), &st);
    if (stats5) {
        stats5[0] = st.sent;
        stats5[1] = st.consumed;
        stats5[2] = st.full_waits;
        stats5[3] = st.status;
        stats5[4] = st.dropped;
    }
    if (rc) snprintf(feed_err, sizeof feed_err, "gdrpy_chan_shutdown: %s", gdrpy_last_error());
    return rc;
}

void feed_cchan_close(feed_cchan_t *c)
{
    if (!c) return;
    if (c->chan) gdrpy_chan_destroy(c->chan);
    if (c->mapped) gdrpy_unmap(c->ctx, c->pin);
    if (c->pin) gdrpy_unpin(c->ctx, c->pin);
    if (c->ctx) gdrpy_close(c->ctx);
    free(c);
}
