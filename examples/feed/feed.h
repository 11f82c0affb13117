/*
 * feed.h - the trading-feed example's wire format, shared-memory ring and
 * deterministic tick content.  Shared by the C sender (feed_sender.c), the
 * example's C library (feedcore.c: C handler, ack collector, sim consumer)
 * and, as documented constants, by the Python side (examples/feed/ticks.py)
 * and the CUDA consumer kernel (examples/feed/kernel.py).
 *
 * A tick is 32 bytes, little-endian:
 *   u64 seq       1, 2, 3, ... (the feed's sequence number)
 *   u64 send_ns   CLOCK_MONOTONIC when the sender published it
 *   i64 px        price in 1e-4 units
 *   u32 sym       symbol index
 *   u32 qty       quantity
 * sym, qty and px are a pure function of (seq, seed, nsym) (feed_tick_fill),
 * so any stage - the GPU consumer included - can check a tick it holds
 * against its seq: a torn tick (fields of two different ticks) is caught.
 */
#ifndef FEED_H
#define FEED_H

#include <stdint.h>

#define FEED_TICK_SIZE 32u
#define FEED_END_SEQ UINT64_MAX     /* UDP: the sender's END packet (carries counts) */

typedef struct feed_tick {
    uint64_t seq;
    uint64_t send_ns;
    int64_t px;
    uint32_t sym;
    uint32_t qty;
} feed_tick_t;

_Static_assert(sizeof(feed_tick_t) == FEED_TICK_SIZE, "tick is 32 bytes");

static inline uint64_t feed_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The content of tick `seq` (send_ns is left alone). */
static inline void feed_tick_fill(feed_tick_t *t, uint64_t seq, uint64_t seed, uint32_t nsym)
{
    uint64_t h1 = feed_mix64(seq + seed * 0x9e3779b97f4a7c15ULL);
    uint64_t h2 = feed_mix64(h1);
    t->seq = seq;
    t->sym = (uint32_t)((h1 >> 32) % nsym);
    t->qty = 1u + (uint32_t)((h1 & 0xffffffffULL) % 1000u);
    t->px = 1000000 + (int64_t)(h2 % 4000000u);
}

/* ---- the shared-memory source ------------------------------------------
 * A single-producer single-consumer ring in a memfd, as kernel-bypass NIC
 * libraries hand received packets to user space: a 4 KiB header, then
 * `nslots` 64-byte slots.  Slot i (ring position p = i % nslots) carries the
 * tick in bytes 0..31 and, at byte 56, its publication number i + 1,
 * stored last with release semantics: the consumer takes slot p when that
 * word equals the index it expects.  The producer never overwrites a slot
 * the consumer has not released (`tail`); when the ring is full it DROPS
 * the tick and counts it, as a NIC counts rx_missed when its RX ring is
 * full.  Counters live on their own cache lines. */
#define FEED_SHM_MAGIC 0x4d48534445454646ULL    /* "FFEEDSHM" */
#define FEED_SHM_HDR 4096u
#define FEED_SHM_SLOT 64u
#define FEED_SHM_MARK 56u

typedef struct feed_shm_hdr {
    uint64_t magic;
    uint64_t nslots;                    /* power of two */
    uint64_t pad0[6];
    volatile uint64_t head;             /* producer: slots published */
    uint64_t pad1[7];
    volatile uint64_t tail;             /* consumer: slots released */
    uint64_t pad2[7];
    volatile uint64_t sent;             /* producer: ticks published */
    volatile uint64_t dropped;          /* producer: ticks dropped (ring full) */
    volatile uint64_t last_seq;         /* producer: highest seq generated */
    volatile uint64_t t_first_ns;       /* producer: first publish */
    volatile uint64_t t_last_ns;        /* producer: last publish */
    volatile uint64_t done;             /* producer: 1 when finished (counts final) */
    uint64_t pad3[2];
} feed_shm_hdr_t;

_Static_assert(sizeof(feed_shm_hdr_t) <= FEED_SHM_HDR, "header fits");

#endif /* FEED_H */
