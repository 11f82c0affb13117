/*
 * feed_sender - the trading-feed example's market-data source (a separate
 * process, so it never shares the handler's CPU or interpreter).
 *
 *   feed_sender --mode udp --port P --rate R --seconds S [options]
 *   feed_sender --mode shm --shm-fd FD --rate R --seconds S [options]
 *
 * Pacing: every pass of the loop computes how many ticks are due by now
 * and publishes them in one batch (at most --batch): one sendmmsg() for
 * UDP, one run of slot stores for the shared-memory ring.  So the offered
 * rate is kept over any time slice longer than one batch, and at low rates
 * batches are small and each tick's timestamp is close to its real
 * departure.  send_ns is CLOCK_MONOTONIC taken just before the batch goes
 * out.  --rate 0: as fast as possible.
 *
 * When ticks are due (--arrivals): `poisson` (the default) draws the gaps
 * between ticks from an exponential distribution of mean 1/rate (seeded by
 * --seed): a Poisson process, as independent orders reach an exchange, so
 * the ticks fall at every phase of any periodic event on the host.  `even`
 * spaces them exactly 1/rate apart (a metronome).  A metronome at a rate
 * that is a multiple of a periodic host stall (the H200 VMs stop every vCPU
 * about every 1 ms; the default 20,000/s is 20 ticks a ms) keeps one phase
 * to it for long stretches, so in one run a tick meets every stall for a
 * while and in the next none does (docs/examples.md).
 *
 * Between passes with nothing due the sender gives its CPU away (--pace):
 * `yield` (default) calls sched_yield(), so anything else runnable on its
 * CPU (ksoftirqd/N, a kworker) runs at once instead of waiting for the
 * scheduler to preempt a busy-waiting sender; `sleep` sleeps until the next
 * tick is due when that is over --sleep-min-us away (timer slack 1 ns) and
 * yields otherwise; `spin` busy-waits (the old behaviour).  UDP passes also
 * yield after each send.  (On the H100 VM the three gave the same tails:
 * ksoftirqd ran ~1 ms in 3 s; the loopback receive work runs inline.)
 *
 * The sender reports what could hide a stall of its own: the longest gap
 * between two passes, how many gaps exceeded 50 us (and their total), and
 * its context switches (getrusage).
 *
 * Stops after --ticks seqs or --seconds, whichever first.  UDP: then sends
 * an END packet (seq = UINT64_MAX) three times, carrying the counts.  shm:
 * sets the header's counts and `done`.  Either way it prints one JSON line
 * with what it achieved (its own rate, so that a short figure can be put on
 * the sender rather than the handler).
 *
 * UDP: --per-packet K puts K ticks in a datagram; --gso hands the kernel up
 * to 64 datagrams per send (UDP_SEGMENT): each still arrives as its own
 * datagram, the sender's trip down the stack is paid once per send.
 * --burst N (default 256): at most N ticks per pass.  On loopback the
 * kernel's receive processing of what a send carries runs inside that send,
 * on the sender's CPU (measured on the H100 VM: 62% of the sender's CPU in
 * softirq at 500k/s, about 1.25 us a datagram), and every tick of a pass
 * carries the stamp taken before it: at that cost the last ticks of a
 * 4096-datagram catch-up pass (the old limit) wait ~5 ms in the kernel.
 * With a cap, a sender that is behind goes on in passes of N, each stamped
 * when it goes (`max_behind` says how far behind it got).
 *
 * Test knobs: --inject-skip K skips every K-th seq (simulated loss, counted
 * as "skipped").
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "feed.h"

#define MAX_BATCH 1024
#define MAX_PER_PACKET 32
#define GSO_SEGS 64
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef SOL_UDP
#define SOL_UDP 17
#endif

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

enum { PACE_YIELD = 0,
       PACE_SLEEP = 1,
       PACE_SPIN = 2 };

enum { ARRIVE_POISSON = 0,
       ARRIVE_EVEN = 1 };

typedef struct {
    const char *mode;
    int port, shm_fd, cpu, batch, per_packet, gso, pace, burst, arrivals;
    double sleep_min_us;
    double rate, seconds;
    uint64_t ticks, seed, inject_skip;
    uint32_t nsym;
} opts_t;

typedef struct {
    uint64_t generated; /* seqs consumed (last seq) */
    uint64_t sent;      /* published: sendmmsg accepted / slot written */
    uint64_t skipped;   /* --inject-skip */
    uint64_t failed;    /* UDP: sendmmsg refused (errno counted) */
    uint64_t dropped;   /* shm: ring full at publish time */
    uint64_t batches;
    uint64_t packets;                 /* UDP: datagrams sent */
    uint64_t max_behind;              /* most ticks the sender was behind its schedule */
    uint64_t max_gap_ns;              /* longest time between two passes of the loop */
    uint64_t gaps_50us, gaps_50us_ns; /* passes that came > 50 us after the last */
    uint64_t yields, sleeps;
    uint64_t t_first, t_last;
    int last_errno;
    int sndbuf;
    int gso, gso_failed;
} counts_t;

static void usage(void)
{
    fprintf(stderr, "usage: feed_sender --mode udp|shm [--port P | --shm-fd FD] --rate R "
                    "--seconds S [--ticks N] [--symbols N] [--seed N] [--batch N] [--cpu N] "
                    "[--inject-skip K] [--per-packet K] [--gso] [--pace yield|sleep|spin] "
                    "[--sleep-min-us U] [--burst N] [--arrivals poisson|even]\n");
    exit(2);
}

/* ---- the schedule: when seq k is due (see --arrivals) ----------------- */
#define SCHED_KEEP 65536u /* due times kept (poisson): the pass's first tick */

typedef struct {
    double rate;
    int poisson;
    uint64_t t0;
    uint64_t n;              /* poisson: seqs 1..n are due at times already drawn */
    double next;             /* poisson: when seq n + 1 is due (ns after t0) */
    uint64_t rng;            /* splitmix64 state */
    uint64_t at[SCHED_KEEP]; /* poisson: due time of seq k at k % SCHED_KEEP */
} sched_t;

static sched_t sched;

static void sched_init(sched_t *s, const opts_t *o, uint64_t t0)
{
    s->rate = o->rate;
    s->poisson = o->arrivals == ARRIVE_POISSON;
    s->t0 = t0;
    s->n = 0;
    s->next = 0.0; /* seq 1 is due at once, as with even arrivals */
    s->rng = o->seed ^ 0x5851f42d4c957f2dull;
}

/* An exponential gap of mean 1/rate, in ns (splitmix64: feed.h's mixer on
 * a Weyl sequence). */
static double sched_gap(sched_t *s)
{
    uint64_t z = feed_mix64(s->rng += 0x9e3779b97f4a7c15ull);
    double u = ((double)(z >> 11) + 0.5) * 0x1.0p-53; /* (0, 1) */
    return -log(u) * 1e9 / s->rate;
}

/* How many seqs are due at `t`; `rate` 0 = a full batch every pass. */
static uint64_t sched_due(sched_t *s, uint64_t t)
{
    if (s->rate <= 0) return UINT64_MAX;
    if (!s->poisson) return (uint64_t)((double)(t - s->t0) * s->rate * 1e-9) + 1;
    while (s->next <= (double)(t - s->t0)) {
        s->n++;
        s->at[s->n % SCHED_KEEP] = s->t0 + (uint64_t)s->next;
        s->next += sched_gap(s);
    }
    return s->n;
}

/* When seq k is due: k <= n + 1 (poisson; older than SCHED_KEEP seqs: the
 * oldest time kept). */
static uint64_t sched_at(const sched_t *s, uint64_t k)
{
    if (!s->poisson) return s->t0 + (uint64_t)((double)(k - 1) * 1e9 / s->rate);
    if (k == s->n + 1) return s->t0 + (uint64_t)s->next;
    if (s->n - k >= SCHED_KEEP) k = s->n - SCHED_KEEP + 1;
    return s->at[k % SCHED_KEEP];
}

/* Loop bookkeeping: the gap since the previous pass (a stall of the sender
 * itself - preempted, or its CPU taken by interrupts or the hypervisor). */
static inline void pass_gap(counts_t *c, uint64_t *t_prev, uint64_t t)
{
    uint64_t g = t - *t_prev;
    *t_prev = t;
    if (g > c->max_gap_ns) c->max_gap_ns = g;
    if (g > 50000) {
        c->gaps_50us++;
        c->gaps_50us_ns += g;
    }
}

/* A small latency histogram (ns): 32 ns buckets below 32.768 us, then
 * powers of two.  The sender keeps two: how long each send call took (with
 * one datagram per send and no RPS, the time the kernel took to put it in
 * the handler's socket: the loopback receive work runs inside the send), and
 * how late each pass's stamp came after its first tick's scheduled time
 * (queueing before the stamp: outside the end-to-end figure, reported). */
#define LH_LIN 1024
#define LH_N (LH_LIN + 40)
typedef struct {
    uint64_t n, max;
    uint64_t b[LH_N];
} lhist_t;

static inline void lh_add(lhist_t *h, uint64_t ns)
{
    unsigned k;
    if (ns < 32ull * LH_LIN) k = (unsigned)(ns >> 5);
    else k = LH_LIN + (unsigned)(63 - __builtin_clzll(ns >> 15)); /* >= 32.768 us */
    if (k >= LH_N) k = LH_N - 1;
    h->b[k]++;
    h->n++;
    if (ns > h->max) h->max = ns;
}

/* upper edge of the bucket holding quantile q, in us (capped at max) */
static double lh_q(const lhist_t *h, double q)
{
    if (!h->n) return 0.0;
    uint64_t want = (uint64_t)(q * (double)h->n), acc = 0;
    if (want >= h->n) want = h->n - 1;
    for (unsigned k = 0; k < LH_N; k++) {
        acc += h->b[k];
        if (acc > want) {
            double edge = k < LH_LIN ? (double)((k + 1) * 32ull) : (double)(32768ull << (k - LH_LIN + 1));
            return (edge < (double)h->max ? edge : (double)h->max) / 1e3;
        }
    }
    return (double)h->max / 1e3;
}

static lhist_t h_send, h_lag;

/* how many values exceeded `us` (bucket resolution) */
static uint64_t lh_over(const lhist_t *h, double us)
{
    uint64_t n = 0;
    for (unsigned k = 0; k < LH_N; k++) {
        double lo = k < LH_LIN ? (double)(k * 32ull) : (double)(32768ull << (k - LH_LIN));
        if (lo >= us * 1e3) n += h->b[k];
    }
    return n;
}

/* Nothing is due: give the CPU away until seq `next` is (see --pace). */
static inline void pace_idle(const opts_t *o, counts_t *c, uint64_t t, uint64_t next)
{
    if (o->pace == PACE_SPIN || o->rate <= 0) {
        __builtin_ia32_pause();
        return;
    }
    if (o->pace == PACE_SLEEP) {
        uint64_t at = sched_at(&sched, next);
        if (at > t && (double)(at - t) > o->sleep_min_us * 1e3) {
            struct timespec ts = {.tv_sec = (time_t)(at / 1000000000ull),
                                  .tv_nsec = (long)(at % 1000000000ull)};
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
            c->sleeps++;
            return;
        }
    }
    sched_yield();
    c->yields++;
}

static int run_udp(const opts_t *o, counts_t *c)
{
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) {
        perror("socket");
        return 1;
    }
    int sb = 16 << 20;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sb, sizeof sb) != 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sb, sizeof sb);
    socklen_t sl = sizeof c->sndbuf;
    getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &c->sndbuf, &sl);
    struct sockaddr_in dst = {0};
    dst.sin_family = AF_INET;
    dst.sin_port = htons((uint16_t)o->port);
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&dst, sizeof dst) != 0) {
        perror("connect");
        return 1;
    }

    /* --per-packet K: K ticks per datagram, back to back (as MoldUDP64 and
     * similar feed protocols pack messages); --batch counts datagrams. */
    const int K = o->per_packet;
    static feed_tick_t ticks[MAX_BATCH * MAX_PER_PACKET * GSO_SEGS];
    static struct mmsghdr msgs[MAX_BATCH];
    static struct iovec iov[MAX_BATCH];
    /* --gso: UDP generic segmentation offload; one send carries up to
     * GSO_SEGS datagrams of K ticks, split by the kernel (each still arrives
     * as its own datagram); it saves the per-datagram trip down the stack */
    int G = 1;
    if (o->gso) {
        int seg = K * (int)FEED_TICK_SIZE;
        if (setsockopt(fd, SOL_UDP, UDP_SEGMENT, &seg, sizeof seg) == 0) G = GSO_SEGS;
        else c->gso_failed = errno;
    }
    c->gso = G > 1;
    for (int i = 0; i < MAX_BATCH; i++) {
        iov[i].iov_base = &ticks[(size_t)i * K * G];
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    uint64_t t0 = now_ns();
    sched_init(&sched, o, t0);
    uint64_t t_end = t0 + (uint64_t)(o->seconds * 1e9);
    uint64_t seq = 0; /* last seq generated */
    uint64_t t_prev = t0;
    for (;;) {
        uint64_t t = now_ns();
        pass_gap(c, &t_prev, t);
        if (t >= t_end || seq >= o->ticks) break;
        uint64_t due = sched_due(&sched, t);
        if (due > o->ticks) due = o->ticks;
        if (due <= seq) {
            pace_idle(o, c, t, seq + 1);
            continue;
        }
        uint64_t behind = due - seq;
        if (o->rate > 0 && behind > c->max_behind) c->max_behind = behind;
        int n = 0;
        while (n < o->batch * K * G && n < o->burst && seq < due) {
            ++seq;
            if (o->inject_skip && seq % o->inject_skip == 0) {
                c->skipped++;
                continue;
            }
            feed_tick_fill(&ticks[n], seq, o->seed, o->nsym);
            n++;
        }
        if (n == 0) continue;
        int per = K * G; /* ticks per send */
        int nd = (n + per - 1) / per;
        for (int i = 0; i < nd; i++)
            iov[i].iov_len = (size_t)((i + 1) * per <= n ? per : n - i * per) * FEED_TICK_SIZE;
        uint64_t ts = now_ns();
        for (int i = 0; i < n; i++) ticks[i].send_ns = ts;
        if (o->rate > 0) { /* how late the pass's first tick goes out */
            uint64_t at = sched_at(&sched, ticks[0].seq);
            lh_add(&h_lag, ts > at ? ts - at : 0);
        }
        int off = 0;
        while (off < nd) {
            int r = sendmmsg(fd, msgs + off, (unsigned)(nd - off), 0);
            if (r < 0) {
                if (errno == EINTR) continue;
                c->last_errno = errno;
                c->failed += iov[off].iov_len / FEED_TICK_SIZE; /* lost; go on */
                off++;
                continue;
            }
            for (int i = off; i < off + r; i++) {
                c->sent += iov[i].iov_len / FEED_TICK_SIZE;
                c->packets += (iov[i].iov_len / FEED_TICK_SIZE + (size_t)K - 1) / (size_t)K;
            }
            off += r;
        }
        c->batches++;
        if (!c->t_first) c->t_first = ts;
        c->t_last = now_ns();
        lh_add(&h_send, c->t_last - ts);
        /* the loopback receive work this send raised runs on THIS CPU (the
         * NET_RX softirq; ksoftirqd/N when deferred): let it run now */
        if (o->pace != PACE_SPIN) {
            sched_yield();
            c->yields++;
        }
    }
    c->generated = seq;
    /* END: seq, sent, generated, skipped, failed, t_first, t_last */
    uint64_t end[8] = {FEED_END_SEQ, c->sent, c->generated, c->skipped, c->failed,
                       c->t_first, c->t_last, 0};
    if (c->gso) { /* END is one 64-byte datagram: segmentation off */
        int zero = 0;
        setsockopt(fd, SOL_UDP, UDP_SEGMENT, &zero, sizeof zero);
    }
    for (int k = 0; k < 3; k++) {
        if (send(fd, end, sizeof end, 0) < 0) c->last_errno = errno;
        usleep(1000);
    }
    close(fd);
    return 0;
}

static int run_shm(const opts_t *o, counts_t *c)
{
    struct stat st;
    if (fstat(o->shm_fd, &st) != 0) {
        perror("fstat(shm fd)");
        return 1;
    }
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, o->shm_fd, 0);
    if (base == MAP_FAILED) {
        perror("mmap(shm fd)");
        return 1;
    }
    feed_shm_hdr_t *h = (feed_shm_hdr_t *)base;
    uint64_t nslots = h->nslots;
    if (h->magic != FEED_SHM_MAGIC || nslots == 0 || (nslots & (nslots - 1)) ||
        FEED_SHM_HDR + nslots * FEED_SHM_SLOT > (uint64_t)st.st_size) {
        fprintf(stderr, "feed_sender: the shm region is not a feed ring\n");
        return 1;
    }
    unsigned char *slots = (unsigned char *)base + FEED_SHM_HDR;
    uint64_t head = h->head, tail = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
    uint64_t t0 = now_ns();
    sched_init(&sched, o, t0);
    uint64_t t_end = t0 + (uint64_t)(o->seconds * 1e9);
    uint64_t seq = 0;
    uint64_t t_prev = t0;
    for (;;) {
        uint64_t t = now_ns();
        pass_gap(c, &t_prev, t);
        if (t >= t_end || seq >= o->ticks) break;
        uint64_t due = sched_due(&sched, t);
        if (due > o->ticks) due = o->ticks;
        if (due <= seq) {
            pace_idle(o, c, t, seq + 1);
            continue;
        }
        uint64_t behind = due - seq;
        if (o->rate > 0 && behind > c->max_behind) c->max_behind = behind;
        int n = 0;
        uint64_t ts = now_ns();
        while (n < o->batch && seq < due) {
            ++seq;
            n++;
            if (o->inject_skip && seq % o->inject_skip == 0) {
                c->skipped++;
                continue;
            }
            if (head - tail >= nslots) {
                tail = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
                if (head - tail >= nslots) {
                    c->dropped++;
                    continue;
                } /* rx_missed */
            }
            unsigned char *s = slots + (head & (nslots - 1)) * FEED_SHM_SLOT;
            feed_tick_t tk;
            feed_tick_fill(&tk, seq, o->seed, o->nsym);
            tk.send_ns = ts;
            memcpy(s, &tk, sizeof tk);
            __atomic_store_n((uint64_t *)(s + FEED_SHM_MARK), head + 1, __ATOMIC_RELEASE);
            head++;
            c->sent++;
        }
        __atomic_store_n(&h->head, head, __ATOMIC_RELEASE);
        c->batches++;
        if (!c->t_first) c->t_first = ts;
        c->t_last = now_ns();
    }
    c->generated = seq;
    h->sent = c->sent;
    h->dropped = c->dropped;
    h->last_seq = seq;
    h->t_first_ns = c->t_first;
    h->t_last_ns = c->t_last;
    __atomic_store_n(&h->done, 1, __ATOMIC_RELEASE);
    munmap(base, (size_t)st.st_size);
    return 0;
}

int main(int argc, char **argv)
{
    opts_t o = {.mode = NULL, .port = 0, .shm_fd = -1, .cpu = -1, .batch = 64, .per_packet = 1, .gso = 0, .pace = PACE_YIELD, .burst = 256, .arrivals = ARRIVE_POISSON, .sleep_min_us = 30.0, .rate = 0, .seconds = 1.0, .ticks = UINT64_MAX - 1, .seed = 7, .inject_skip = 0, .nsym = 16};
    static struct option lo[] = {
        {"mode", 1, 0, 'm'}, {"port", 1, 0, 'p'}, {"shm-fd", 1, 0, 'f'}, {"rate", 1, 0, 'r'}, {"seconds", 1, 0, 's'}, {"ticks", 1, 0, 'n'}, {"symbols", 1, 0, 'y'}, {"seed", 1, 0, 'e'}, {"batch", 1, 0, 'b'}, {"cpu", 1, 0, 'c'}, {"inject-skip", 1, 0, 'k'}, {"per-packet", 1, 0, 'K'}, {"gso", 0, 0, 'G'}, {"pace", 1, 0, 'P'}, {"sleep-min-us", 1, 0, 'S'}, {"burst", 1, 0, 'B'}, {"arrivals", 1, 0, 'A'}, {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'm': o.mode = optarg; break;
        case 'p': o.port = atoi(optarg); break;
        case 'f': o.shm_fd = atoi(optarg); break;
        case 'r': o.rate = atof(optarg); break;
        case 's': o.seconds = atof(optarg); break;
        case 'n': o.ticks = strtoull(optarg, NULL, 0); break;
        case 'y': o.nsym = (uint32_t)strtoul(optarg, NULL, 0); break;
        case 'e': o.seed = strtoull(optarg, NULL, 0); break;
        case 'b': o.batch = atoi(optarg); break;
        case 'c': o.cpu = atoi(optarg); break;
        case 'k': o.inject_skip = strtoull(optarg, NULL, 0); break;
        case 'K': o.per_packet = atoi(optarg); break;
        case 'G': o.gso = 1; break;
        case 'P':
            if (strcmp(optarg, "yield") == 0) o.pace = PACE_YIELD;
            else if (strcmp(optarg, "sleep") == 0) o.pace = PACE_SLEEP;
            else if (strcmp(optarg, "spin") == 0) o.pace = PACE_SPIN;
            else usage();
            break;
        case 'S': o.sleep_min_us = atof(optarg); break;
        case 'B': o.burst = atoi(optarg); break;
        case 'A':
            if (strcmp(optarg, "poisson") == 0) o.arrivals = ARRIVE_POISSON;
            else if (strcmp(optarg, "even") == 0) o.arrivals = ARRIVE_EVEN;
            else usage();
            break;
        default: usage();
        }
    }
    if (!o.mode || o.rate < 0 || o.seconds <= 0 || o.nsym == 0 || o.batch < 1 ||
        o.batch > MAX_BATCH || o.ticks == 0 ||
        o.per_packet < 1 || o.per_packet > MAX_PER_PACKET || o.burst < 1)
        usage();
    if (o.cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(o.cpu, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) o.cpu = -1;
    }
    if (o.pace == PACE_SLEEP) prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    counts_t c = {0};
    int rc;
    if (strcmp(o.mode, "udp") == 0) {
        if (o.port <= 0 || o.port > 65535) usage();
        rc = run_udp(&o, &c);
    } else if (strcmp(o.mode, "shm") == 0) {
        if (o.shm_fd < 0) usage();
        rc = run_shm(&o, &c);
    } else {
        usage();
        return 2;
    }
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    getrusage(RUSAGE_SELF, &ru);
    double secs = c.t_last > c.t_first ? (double)(c.t_last - c.t_first) * 1e-9 : 0.0;
    printf("{\"mode\": \"%s\", \"rate\": %.1f, \"generated\": %llu, \"sent\": %llu, "
           "\"skipped\": %llu, \"failed\": %llu, \"dropped_ring_full\": %llu, "
           "\"batches\": %llu, \"packets\": %llu, \"per_packet\": %d, \"max_behind\": %llu, \"seconds\": %.6f, "
           "\"achieved_per_s\": %.1f, \"t_first_ns\": %llu, \"t_last_ns\": %llu, "
           "\"sndbuf\": %d, \"last_errno\": %d, \"cpu\": %d, \"gso\": %d, "
           "\"gso_errno\": %d, \"pace\": \"%s\", \"arrivals\": \"%s\", \"yields\": %llu, \"sleeps\": %llu, "
           "\"max_gap_us\": %.2f, \"gaps_over_50us\": %llu, \"gaps_over_50us_ms\": %.3f, "
           "\"ctx_switches_involuntary\": %ld, \"ctx_switches_voluntary\": %ld, "
           "\"cpu_user_s\": %.3f, \"cpu_sys_s\": %.3f, \"minflt\": %ld, \"burst\": %d, "
           "\"send_call_us\": {\"n\": %llu, \"median\": %.3f, \"p99\": %.3f, \"p99.9\": %.3f, \"max\": %.3f, \"over_5us\": %llu}, "
           "\"stamp_lag_us\": {\"n\": %llu, \"median\": %.3f, \"p99\": %.3f, \"p99.9\": %.3f, \"max\": %.3f}}\n",
           o.mode, o.rate, (unsigned long long)c.generated, (unsigned long long)c.sent,
           (unsigned long long)c.skipped, (unsigned long long)c.failed,
           (unsigned long long)c.dropped, (unsigned long long)c.batches,
           (unsigned long long)c.packets, o.per_packet,
           (unsigned long long)c.max_behind, secs,
           secs > 0 ? (double)(c.sent + c.dropped + c.failed) / secs : 0.0,
           (unsigned long long)c.t_first, (unsigned long long)c.t_last, c.sndbuf,
           c.last_errno, o.cpu, c.gso, c.gso_failed,
           o.pace == PACE_YIELD ? "yield" : o.pace == PACE_SLEEP ? "sleep"
                                                                 : "spin",
           o.arrivals == ARRIVE_POISSON ? "poisson" : "even",
           (unsigned long long)c.yields, (unsigned long long)c.sleeps, c.max_gap_ns / 1e3,
           (unsigned long long)c.gaps_50us, c.gaps_50us_ns / 1e6, ru.ru_nivcsw, ru.ru_nvcsw,
           (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6,
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6, ru.ru_minflt, o.burst,
           (unsigned long long)h_send.n, lh_q(&h_send, 0.5), lh_q(&h_send, 0.99),
           lh_q(&h_send, 0.999), h_send.max / 1e3, (unsigned long long)lh_over(&h_send, 5.0),
           (unsigned long long)h_lag.n, lh_q(&h_lag, 0.5), lh_q(&h_lag, 0.99),
           lh_q(&h_lag, 0.999), h_lag.max / 1e3);
    fflush(stdout);
    return rc;
}
