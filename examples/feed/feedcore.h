/*
 * feedcore.h - the trading-feed example's C library (libfeedcore.so, loaded
 * by examples/feed/ (Python, ctypes); structs mirrored there).
 *
 *  - the C feed handler (feed_handler_run): UDP via recvmmsg or the
 *    shared-memory ring -> batches -> gdrpy channel (gdrpy_chan_send_batch:
 *    one fence per batch) or the cuMemcpy path; back-pressure counted.
 *  - the ack collector (feed_acks_*): a thread that spins on the consumer's
 *    cumulative ack word in host memory (FEED_OUT_ACK) and turns every
 *    advance into per-tick latencies (histograms), so no handler ever waits
 *    for an ack.
 *  - the sim consumer (feed_simc_*): a CPU thread running the GPU kernel's
 *    protocol and checks on host memory (backend sim only).
 *  - feed_udp_recv_batch: recvmmsg into a preallocated array, for the
 *    Python handler (Python's socket module has no recvmmsg).
 */
#ifndef FEEDCORE_H
#define FEEDCORE_H

#include <stdint.h>

#include "feed.h"

#define FEED_API __attribute__((visibility("default")))

/* ---- latency histograms (ns) ------------------------------------------
 * Exact below 1024 ns, then 512 sub-buckets per power of two (<= 0.2 %). */
#define FEED_HBUCKETS (1024 + 40 * 512)
typedef struct feed_hist {
    uint64_t n, sum, min, max;
    uint64_t b[FEED_HBUCKETS];
} feed_hist_t;

/* end-to-end (send -> ack seen), send -> recv, recv -> written, written ->
 * ack seen, and recv -> ack seen (the handler's view: the old "tick -> ack") */
enum { FEED_H_E2E = 0, FEED_H_SOCKET, FEED_H_HANDLER, FEED_H_GPU, FEED_H_RECV_ACK, FEED_H_COUNT };

/* Per-tick stamps, written by the handler for ring index i (1-based) at
 * ts[i & mask]: send (from the tick), recv (the batch's receive returned),
 * wr (the batch was published), then `idx` = i LAST (release). */
typedef struct feed_ts {
    uint64_t send_ns, recv_ns, wr_ns, idx;
} feed_ts_t;

typedef struct feed_acks feed_acks_t;

/* ---- consumer block (host memory): the ack word while it runs, the
 * results at the end.  The sim consumer and the GPU kernel write the same
 * layout. */
#define FEED_OUT_PROCESSED 0
#define FEED_OUT_TORN 8         /* tick fields that do not match its seq */
#define FEED_OUT_MISSING 16     /* seqs skipped in ring order */
#define FEED_OUT_GAPS 24        /* forward jumps */
#define FEED_OUT_BACKWARD 32    /* seq <= previous (reordered / duplicate) */
#define FEED_OUT_LAST_SEQ 40
#define FEED_OUT_BADLEN 48
#define FEED_OUT_DONE 56        /* u32: 1 once the block is final */
/* u64, a line of its own: ticks received and checked so far - the ack.  A
 * plain store (no fence) after each round's checks; the channel's consumed
 * word (release, for slot reuse) follows it. */
#define FEED_OUT_ACK 64
#define FEED_OUT_SYM 128        /* per symbol: sum(px*qty) u64, sum(qty) u64, count u64 */
#define FEED_OUT_SYM_BYTES 24
/* The cuMemcpy path publishes its count here (device control block). */
#define FEED_DEV_PUBLISHED 96

/* ---- handler ---------------------------------------------------------- */
enum { FEED_SRC_UDP = 0, FEED_SRC_SHM = 1 };
enum { FEED_PATH_CHANNEL = 0, FEED_PATH_CUMEMCPY = 1 };
enum { FEED_FULL_WAIT = 0, FEED_FULL_DROP = 1 };

typedef struct feed_hcfg {
    int32_t src, path, on_full, cpu;
    int32_t fd;                 /* UDP: bound socket */
    int32_t per_packet_max;     /* UDP: most ticks in one datagram */
    void *shm;                  /* shm: mapped ring (header first) */
    void *chan;                 /* channel path: gdrpy_chan_t * */
    uint64_t ctx;               /* cuMemcpy path: gdrpy context (this library's copy) */
    uint64_t dev_ctrl, ring;    /* cuMemcpy path: device addresses */
    const volatile uint64_t *consumed;   /* host word: ticks consumed by the consumer */
    uint32_t nslots, slot_stride;
    uint32_t batch;             /* most ticks per batch (datagrams x per_packet; with gro,
                                 * a message may carry up to 64 datagrams) */
    uint32_t gro;               /* UDP: the socket has UDP_GRO (coalesced datagrams) */
    feed_acks_t *acks;
    uint64_t max_ns;            /* give up after this long */
    uint64_t full_timeout_ns;   /* ring full this long: error */
    uint64_t idle_end_ns;       /* shm: producer done and nothing new this long: stop */
} feed_hcfg_t;

typedef struct feed_hstats {
    uint64_t received, forwarded, missing, gaps, backward, bad_packets;
    uint64_t batches, max_batch, full_events, full_wait_ns, dropped_full;
    uint64_t collector_waits, empty_polls, busy_ns;
    uint64_t t_first_recv, t_last_fwd, last_seq;
    uint64_t end_seen, snd_sent, snd_generated, snd_skipped, snd_failed, snd_t0, snd_t1;
    /* stall evidence: the longest time between two polls, polls that came
     * > 50 us after the last (count, total ns), context switches of the
     * handler thread (getrusage RUSAGE_THREAD) */
    uint64_t max_gap_ns, gaps_50us, gaps_50us_ns, ctx_invol, ctx_vol, minflt;
    /* where a batch's time goes: the receive call that returned it, the
     * channel write (publish); and the publish of batches of >= 64 ticks
     * alone (a backlog's), to tell a per-tick from a per-batch cost */
    uint64_t recv_ns, publish_ns, big_batches, big_ticks, big_publish_ns;
    int32_t error, pad;
    char msg[160];
} feed_hstats_t;

/* Tail attribution: which stage makes the slow ticks slow.  For each
 * end-to-end bucket k (feed_ta_edge_ns(k) = its lower edge: 0.5 us wide
 * below 64 us, then powers of two), FEED_TA_FIELDS u64: ticks, summed
 * socket (send->recv) ns, summed handler (recv->written) ns, summed
 * ring+consumer+ack (written->ack seen) ns, then the ticks whose largest
 * stage was the socket, the handler, the ring+ack.  feed_acks_tail copies
 * FEED_TA_BUCKETS x FEED_TA_FIELDS u64 to out. */
#define FEED_TA_BUCKETS 160
#define FEED_TA_FIELDS 7
FEED_API void feed_acks_tail(feed_acks_t *a, uint64_t *out);
FEED_API double feed_ta_edge_ns(int k);

FEED_API int feed_handler_run(const feed_hcfg_t *cfg, feed_hstats_t *st);

/* ---- ack collector ---------------------------------------------------- */
FEED_API feed_acks_t *feed_acks_new(uint64_t ts_slots);   /* power of two */
FEED_API void feed_acks_free(feed_acks_t *a);
FEED_API feed_ts_t *feed_acks_ts(feed_acks_t *a);
FEED_API uint64_t feed_acks_mask(feed_acks_t *a);
/* Starts the thread on `cpu` (-1: any) spinning on *ack (FEED_OUT_ACK). */
FEED_API int feed_acks_start(feed_acks_t *a, const volatile uint64_t *ack, int cpu);
/* Accounts what is acknowledged now, stops and joins. */
FEED_API int feed_acks_stop(feed_acks_t *a);
FEED_API uint64_t feed_acks_done(feed_acks_t *a);        /* ring index accounted */
FEED_API feed_hist_t *feed_acks_hist(feed_acks_t *a, int k);
FEED_API uint64_t feed_acks_first_ns(feed_acks_t *a);
FEED_API uint64_t feed_acks_last_ns(feed_acks_t *a);
FEED_API uint64_t feed_acks_stamp_waits(feed_acks_t *a);
/* The collector thread's stall evidence, after stop: out[0] longest gap
 * between two looks at the ack word (ns), out[1] gaps > 50 us, out[2]
 * involuntary and out[3] voluntary context switches, out[4] minor page
 * faults of the thread. */
FEED_API void feed_acks_thread_info(feed_acks_t *a, uint64_t *out5);
/* Stamps ring indices first..first+m-1 for a batch just published: send_ns
 * from each tick (ticks + j*stride + 8), recv = t_recv, written = now, then
 * the index (release).  Waits first while the collector still needs those
 * slots (returns 1 then, else 0).  One call per batch: the Python handler's
 * bookkeeping in C, as the C handler does it inline. */
FEED_API int feed_acks_stamp(feed_acks_t *a, uint64_t first, uint32_t m, const void *ticks,
                             uint32_t stride, uint64_t t_recv);
/* ---- host stall probe ------------------------------------------------- */
/* A thread pinned to `cpu` reads the clock back to back and counts every
 * gap longer than thr_ns: time in which that CPU did not run it (an
 * interrupt, the scheduler, on a VM the hypervisor).  Run beside a feed
 * run on a CPU no other role uses, it says how often the host itself
 * stops a spinning thread - the ack collector and the handler spin too -
 * so the run's tail can be read against it.  NULL (feed_last_error) when
 * the thread cannot start. */
typedef struct feed_stalls feed_stalls_t;
FEED_API feed_stalls_t *feed_stalls_start(int cpu, uint64_t thr_ns);
/* Stops and joins: out[0] stalls, out[1] their summed ns, out[2] the ns
 * the probe ran. */
FEED_API void feed_stalls_stop(feed_stalls_t *s, uint64_t *out3);
/* After stop: k = 0 the stalls' durations, k = 1 the time from one stall's
 * start to the next one's (ns). */
FEED_API feed_hist_t *feed_stalls_hist(feed_stalls_t *s, int k);
FEED_API void feed_stalls_free(feed_stalls_t *s);

/* Bucket k's representative value (ns). */
FEED_API double feed_hist_value(int k);

/* ---- Python handler's batch receives ---------------------------------- */
/* Both receives spin in C up to spin_ns for the first tick (one call from
 * Python instead of a Python loop of empty polls), then return what is
 * there without waiting for more.
 * UDP: a receiver that recvmmsg()s (MSG_DONTWAIT) up to max_dgrams datagrams
 * so that full datagrams (per_packet ticks) land back to back in `ticks`
 * (rows of per_packet*32 bytes: one contiguous array of ticks, no copy);
 * bytes beyond that (the 64-byte END packet) go to side + k*64; lens[k]
 * gets each datagram's length and lens[max_dgrams] how many of them are
 * not exactly one full row (lens has max_dgrams + 1 entries).  feed_udp_rx returns the count, 0 when
 * nothing is there, -errno on error. */
typedef struct feed_udp_rx feed_udp_rx_t;
FEED_API feed_udp_rx_t *feed_udp_rx_new(int fd, void *ticks, uint32_t per_packet,
                                        uint32_t max_dgrams, void *side, uint32_t *lens,
                                        uint64_t spin_ns);
/* The same on a socket with UDP_GRO, where one message may carry up to 64
 * datagrams of per_packet ticks back to back: `ticks` holds max_msgs * 64 *
 * per_packet rows; feed_udp_rx then returns the number of TICKS, moved to
 * the front of `ticks` in order (one contiguous array), counts malformed
 * datagrams in lens[0] and sets lens[1] once the END packet came (its
 * counts: feed_udp_rx_end).  lens has 2 entries. */
FEED_API feed_udp_rx_t *feed_udp_rx_new_gro(int fd, void *ticks, uint32_t per_packet,
                                            uint32_t max_msgs, uint32_t *lens, uint64_t spin_ns);
FEED_API void feed_udp_rx_end(const feed_udp_rx_t *r, uint64_t *out6);
FEED_API int feed_udp_rx(feed_udp_rx_t *r);
FEED_API void feed_udp_rx_free(feed_udp_rx_t *r);
/* shm: an "rx burst" as kernel-bypass NIC libraries offer: copies the ready
 * prefix of the ring (up to max ticks) into `ticks` and releases the slots.
 * Returns the count; 0 when nothing is ready; -1 when the producer is done
 * and the ring is empty (the end; counts in the header). */
typedef struct feed_shm_rx feed_shm_rx_t;
FEED_API feed_shm_rx_t *feed_shm_rx_new(void *shm, void *ticks, uint32_t max, uint64_t spin_ns);
FEED_API int feed_shm_rx(feed_shm_rx_t *r);
FEED_API void feed_shm_rx_free(feed_shm_rx_t *r);
/* Either receiver's word holding when its last poll that found ticks began
 * (CLOCK_MONOTONIC ns): the handler's busy time starts there, not at the
 * start of the call's spinning. */
FEED_API const uint64_t *feed_rx_t_poll(const void *rx);
/* The handler's stamping through either receiver (feed_rx_set_acks first):
 * feed_rx_commit stamps the ticks of the last receive, all published as
 * they came, as the next ring indices (receive time: when the receive
 * returned; written: now) - one call, no arguments to convert; a batch
 * that was not forwarded as received is stamped with feed_acks_stamp and
 * counted with feed_rx_advance(rx, m).  Returns as feed_acks_stamp. */
FEED_API void feed_rx_set_acks(void *rx, feed_acks_t *acks);
FEED_API int feed_rx_commit(void *rx);
FEED_API void feed_rx_advance(void *rx, uint64_t m);
/* recvmmsg(MSG_DONTWAIT) of up to `max` datagrams of up to `cap` bytes
 * into buf + k*cap; lens[k] gets each length.  Returns the count, 0 when
 * nothing is there, -errno on error. */
FEED_API int feed_udp_recv_batch(int fd, void *buf, uint32_t cap, uint32_t max, uint32_t *lens);

/* ---- sim consumer ----------------------------------------------------- */
typedef struct feed_simc feed_simc_t;
/* desc: a gdrpy_chan_desc_t (host addresses on sim; its flags say the slot
 * format); published: 1 = the cuMemcpy path (header + tick slots and a
 * count word instead of the slots' sequence words); out: the
 * result block; acc unused (the thread keeps its own sums). */
FEED_API feed_simc_t *feed_simc_start(const void *desc, int published, void *out,
                                      uint32_t nsym, uint64_t seed, uint64_t idle_ns,
                                      uint64_t delay_ns, int cpu);
FEED_API int feed_simc_join(feed_simc_t *c, double timeout_s);   /* 0 ok, 1 still running */

/* ---- channel on this library's own gdrpy context (C handler) ---------- */
typedef struct feed_cchan feed_cchan_t;
/* plain: 0 = LL slots (the default), 1 = PLAIN slots (gdrpy_channel.h) */
FEED_API feed_cchan_t *feed_cchan_open(int device, const char *backend, uint64_t dptr,
                                       uint64_t size, uint32_t nslots, int plain, char *err,
                                       int errlen);
FEED_API uint64_t feed_chan_device_bytes(uint32_t nslots, int plain);   /* 0 on error */
FEED_API void *feed_cchan_chan(feed_cchan_t *c);
FEED_API void *feed_cchan_host_block(feed_cchan_t *c);    /* CPU address */
FEED_API uint64_t feed_cchan_ctx(feed_cchan_t *c);
FEED_API int feed_cchan_desc(feed_cchan_t *c, void *out64);
FEED_API int feed_cchan_shutdown(feed_cchan_t *c, int drain, double timeout_s, uint64_t *stats5);
FEED_API void feed_cchan_close(feed_cchan_t *c);
FEED_API uint64_t feed_sim_alloc(uint64_t size);   /* this library's sim allocator */
FEED_API void feed_sim_free(uint64_t dptr);
FEED_API uint64_t feed_ctx_open(int device, const char *backend);   /* 0 on failure */
FEED_API void feed_ctx_close(uint64_t ctx);
FEED_API const char *feed_last_error(void);
FEED_API uint64_t feed_now_ns(void);

#endif /* FEEDCORE_H */
