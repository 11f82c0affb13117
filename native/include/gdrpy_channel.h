/*
 * gdrpy_channel.h - a host<->GPU message channel on top of libgdrpy, and a
 * vectored put.  C API; the matching device side (persistent kernels) is
 * gdrpy_channel.cuh.  Both ship in `python -m gdrpy includedir`.
 *
 * Model
 * -----
 *  host -> GPU: a single-producer ring of `nslots` fixed-size slots in pinned
 *  + mapped GPU memory (the caller's pin, written through BAR1); slot k of
 *  lap L carries message i = L*nslots + k.  GPU -> host: a completion ring of
 *  `comp_nslots` slots in page-locked host memory mapped into the device
 *  (cuMemHostAlloc DEVICEMAP).  Both rings use the same slot format, chosen
 *  per channel by gdrpy_chan_config_t.flags:
 *
 *  LL (the default, flags 0) - every 8-byte word of a slot carries the
 *  message's 32-bit sequence number f = (u32)(i + 1) in its low half, so a
 *  reader validates each word on its own and needs no ordering between
 *  words (NCCL's "LL" protocol):
 *      word 0  {f, tag}
 *      word 1  {f, len}
 *      word 2+k {f, payload bytes 4k..4k+3}    k < ceil(min(size, LL_MAX)/4)
 *  A message of len <= GDRPY_CHAN_LL_MAX bytes is all LL words: the writer
 *  stores them in any order and fences once (host: one sfence to push the
 *  write-combining buffer out); the reader polls the words with plain
 *  (relaxed / volatile) loads and takes the message when every word it needs
 *  carries f - an aligned 8-byte store is one single-copy-atomic access
 *  (one PCIe write), so a word that carries f carries its data with it.
 *  Longer messages go to the slot's plain area (after the LL words, see
 *  gdrpy_chan_slot_layout): payload, a release (host: sfence; GPU: a
 *  system-scope fence), then words 1 and 0; the reader confirms word 0 with
 *  an acquire load before it reads the payload.  Stale words of earlier laps
 *  carry older sequence numbers; every (2^31 / nslots)-th lap the writer
 *  rewrites all of a slot's LL words, so no word is older than 2^31
 *  messages and a 32-bit sequence never matches a stale word.
 *
 *  PLAIN (GDRPY_CHAN_PLAIN, the format of gdrpy 0.x) - header
 *      u64 seq  (= i + 1 once the message is complete; written LAST)
 *      u32 len, u32 tag
 *  then `slot_size` payload bytes.  Host: len/tag and payload, sfence, seq,
 *  sfence; the kernel polls seq with ld.acquire.sys.  Completions: payload
 *  and len/tag, then a system-scope release of seq.  Kernels that read the
 *  ring with gdrpy_chan_ready()/gdrpy_chan_msg() need this format.
 *
 *  Flow control: the kernel publishes (in host memory, with a release store)
 *  how many messages it has consumed - LL kernels lazily (every nslots/2 and
 *  when idle); send() never overwrites an unconsumed slot: with
 *  timeout_ns == 0 it returns GDRPY_EAGAIN when the ring is full, otherwise
 *  it waits up to timeout_ns (< 0: forever) and returns GDRPY_ETIMEDOUT.
 *  The host publishes (through the mapping, lazily: every comp_nslots/2
 *  completions) how many completions it has read; the kernel never
 *  overwrites an unread completion.
 *
 *  Near slots (GDRPY_CHAN_NEAR): the ring has twice as many slots as it
 *  uses (and at least GDRPY_CHAN_NEAR_SPAN bytes of them: place_nslots); the kernel, when it attaches (gdrpy_chan_attach), times an atomic
 *  on each slot's first line from its SM and keeps the `nslots` fastest -
 *  on GPUs whose L2 is split in partitions (H100: two), those homed in the
 *  polling SM's partition, where the host's write lands next to the poll
 *  (docs/channel.md, "Near slots").  It leaves the choice, a table of
 *  physical slot numbers in ring order, in both blocks and sets the host
 *  block's PLACED word before its status RUNNING; the host reads it once it
 *  sees the kernel attached, so sends on such a channel wait for the
 *  attach (timeout_ns == 0: GDRPY_EAGAIN).  A kernel that attaches without
 *  choosing (one that does not use the header's attach) gets the first
 *  `nslots` slots, as on any other channel.
 *
 *  Shutdown: gdrpy_chan_shutdown() stores the number of messages sent and
 *  then a mode word (DRAIN: the kernel consumes every message sent before it
 *  stops; ABORT: it stops at once and the unconsumed ones are counted), and
 *  waits (timeout) until the kernel reports "stopped" in host memory.
 *
 * Memory layout (offsets in bytes; all constants below are ABI, shared with
 * gdrpy_channel.cuh):
 *  device block (the pin, from its first byte, gdrpy_chan_device_bytes()):
 *    [0]    u32 shutdown mode (0 run, 1 drain, 2 abort)   written last
 *    [8]    u64 messages sent when shutdown was requested  written first
 *    [64]   u64 completions read by the host (credit for the kernel)
 *    [128]  message slot 0, then every slot_stride bytes
 *    NEAR:  after place_nslots slots, the slot table: place_nslots u32 (the
 *           kernel's scratch while it chooses; then entry k = the physical
 *           slot of ring slot k, k < nslots)
 *  host block (page-locked, allocated by the channel):
 *    [0]    u64 messages consumed by the kernel (slot credit for the host)
 *    [16]   u32 the SM the kernel attached from (diagnostics)
 *    [64]   u32 kernel status (GDRPY_CHAN_ST_*)
 *    [72]   u64 messages consumed when the kernel stopped
 *    [80]   u32 1 = the kernel chose near slots (NEAR; written before status)
 *    [128]  completion slot 0, then every comp_stride bytes
 *    NEAR:  after comp_nslots completion slots, the slot table (nslots u32)
 *  PLAIN: slot_stride = round_up(16 + slot_size, 64), comp_stride likewise.
 *  LL: see gdrpy_chan_slot_layout().
 *
 * Threads: one producer thread (send*, shutdown) and one consumer thread
 * (recv*) may use a channel concurrently; several producers (or several
 * consumers) must serialise themselves.  The hot calls take no lock and do
 * no handle lookup: the channel holds its pin (unmap/unpin return EBUSY
 * while it lives); destroy the channel before closing its context.
 */
#ifndef GDRPY_CHANNEL_H
#define GDRPY_CHANNEL_H

#include <stddef.h>
#include <stdint.h>

#include "gdrpy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes used by the channel besides gdrpy_status_t. */
#define GDRPY_ETIMEDOUT 110 /* the wait ran out of time */
/* GDRPY_EAGAIN (11): ring full / nothing to receive with timeout_ns == 0.
 * GDRPY_EPIPE: the channel is shut down (send after shutdown). */
#define GDRPY_EPIPE 32

/* ---- layout constants (ABI) ------------------------------------------- */
#define GDRPY_CHAN_HDR 16u /* seq u64, len u32, tag u32 */
#define GDRPY_CHAN_ALIGN 64u
#define GDRPY_CHAN_DEV_CTRL 128u     /* device control block before slot 0 */
#define GDRPY_CHAN_DEV_SHUTDOWN 0u   /* u32 mode */
#define GDRPY_CHAN_DEV_SENT 8u       /* u64 */
#define GDRPY_CHAN_DEV_COMP_READ 64u /* u64 */
#define GDRPY_CHAN_HOST_CTRL 128u    /* host block before completion slot 0 */
#define GDRPY_CHAN_HOST_CONSUMED 0u  /* u64 */
#define GDRPY_CHAN_HOST_SMID 16u     /* u32: the SM the kernel attached from (diagnostics) */
#define GDRPY_CHAN_HOST_STATUS 64u   /* u32 */
#define GDRPY_CHAN_HOST_FINAL 72u    /* u64 */
#define GDRPY_CHAN_HOST_PLACED 80u   /* u32: 1 = the slot table is the kernel's (NEAR) */

#define GDRPY_CHAN_RUN 0u
#define GDRPY_CHAN_DRAIN 1u
#define GDRPY_CHAN_ABORT 2u

#define GDRPY_CHAN_ST_NONE 0u /* no kernel has attached */
#define GDRPY_CHAN_ST_RUNNING 1u
#define GDRPY_CHAN_ST_STOPPED 2u /* drained or aborted on request */
#define GDRPY_CHAN_ST_TIMEOUT 3u /* the kernel's own watchdog fired */

#define GDRPY_CHAN_MAX_SLOTS (1u << 20)

/* gdrpy_chan_config_t.flags */
#define GDRPY_CHAN_PLAIN 1u /* the PLAIN slot format (default: LL) */
#define GDRPY_CHAN_NEAR 2u  /* the kernel picks near slots of twice as many (above) */
/* NEAR: at most this many slots (the kernel times 2 * nslots when it attaches) */
#define GDRPY_CHAN_NEAR_MAX_SLOTS (1u << 16)
/* NEAR: the physical slots cover at least this many bytes */
#define GDRPY_CHAN_NEAR_SPAN 65536u
/* LL: messages up to this many bytes are all LL words */
#define GDRPY_CHAN_LL_MAX 64u
#define GDRPY_CHAN_MAX_SLOT_SIZE (1u << 20)

typedef struct gdrpy_chan gdrpy_chan_t; /* opaque */

typedef struct gdrpy_chan_config {
    uint32_t nslots;      /* message slots: a power of two, 2..2^20 */
    uint32_t slot_size;   /* payload bytes per message, 1..2^20 */
    uint32_t comp_nslots; /* completion slots: power of two; 0 = nslots */
    uint32_t comp_size;   /* payload bytes per completion, 0..2^20 */
    uint32_t flags;       /* GDRPY_CHAN_PLAIN (default LL), GDRPY_CHAN_NEAR */
    uint32_t reserved;
} gdrpy_chan_config_t;

/* What a kernel needs (pass by value as a kernel argument; 64 bytes). */
typedef struct gdrpy_chan_desc {
    uint64_t dev_ctrl;  /* device address of the device block */
    uint64_t ring;      /* device address of message slot 0 */
    uint64_t host_ctrl; /* device address of the host block */
    uint64_t comp;      /* device address of completion slot 0 */
    uint32_t nslots, slot_stride, slot_size;
    uint32_t comp_nslots, comp_stride, comp_size;
    uint32_t flags;        /* the config's flags (GDRPY_CHAN_PLAIN, GDRPY_CHAN_NEAR) */
    uint32_t place_nslots; /* NEAR: the physical slots (>= 2 * nslots); else 0 */
} gdrpy_chan_desc_t;

/* Where things are in one slot of `size` payload bytes (LL and PLAIN):
 * ll_words = LL data words (0 for PLAIN), plain_off = where a payload that
 * is not LL starts (PLAIN: 16), stride = the slot's size. */
static inline void gdrpy_chan_slot_layout(uint32_t flags, uint32_t size, uint32_t *ll_words,
                                          uint32_t *plain_off, uint32_t *stride)
{
    if (flags & GDRPY_CHAN_PLAIN) {
        *ll_words = 0;
        *plain_off = 16;
        *stride = (uint32_t)((16ull + size + 63) & ~63ull);
        return;
    }
    uint32_t w = ((size < GDRPY_CHAN_LL_MAX ? size : GDRPY_CHAN_LL_MAX) + 3) / 4;
    uint32_t off = (8 * (2 + w) + 63) & ~63u; /* the plain area starts on a 64-byte line */
    *ll_words = w;
    *plain_off = off;
    *stride = (uint32_t)((off + (size > GDRPY_CHAN_LL_MAX ? (uint64_t)size : 0) + 63) & ~63ull);
}

/* A CPU reading message i of a ring as a consumer kernel does (sim
 * consumers, host-side tests), either format: `slot` is the slot's CPU
 * address (ring + (i & (nslots - 1)) * slot_stride; NEAR: the slot table's
 * entry instead of i & (nslots - 1), gdrpy_chan_slot_offset()).  1 when message i is
 * complete: *len (at most d->slot_size), *tag, and *payload - `buf`
 * (GDRPY_CHAN_LL_MAX bytes, the LL words unpacked) for an LL message of at
 * most GDRPY_CHAN_LL_MAX bytes, else the slot's payload in place, read
 * after an acquire load of the sequence word.  0: not (yet) complete. */
static inline int gdrpy_chan_host_take(const gdrpy_chan_desc_t *d, const void *slot, uint64_t i,
                                       unsigned char *buf, uint32_t *len, uint32_t *tag,
                                       const unsigned char **payload)
{
    const unsigned char *s = (const unsigned char *)slot;
    uint32_t n;
    if (d->flags & GDRPY_CHAN_PLAIN) {
        if (__atomic_load_n((const uint64_t *)s, __ATOMIC_ACQUIRE) != i + 1) return 0;
        const uint64_t h = __atomic_load_n((const uint64_t *)(s + 8), __ATOMIC_RELAXED);
        n = (uint32_t)h;
        *tag = (uint32_t)(h >> 32);
        *payload = s + GDRPY_CHAN_HDR;
    } else {
        const uint32_t f = (uint32_t)(i + 1);
        const uint64_t w0 = __atomic_load_n((const uint64_t *)s, __ATOMIC_RELAXED);
        const uint64_t w1 = __atomic_load_n((const uint64_t *)(s + 8), __ATOMIC_RELAXED);
        if ((uint32_t)w0 != f || (uint32_t)w1 != f) return 0;
        n = (uint32_t)(w1 >> 32);
        if (n <= GDRPY_CHAN_LL_MAX) {
            for (uint32_t k = 0; 4 * k < n; k++) {
                const uint64_t w = __atomic_load_n((const uint64_t *)(s + 16 + 8 * k), __ATOMIC_RELAXED);
                if ((uint32_t)w != f) return 0;
                const uint32_t v = (uint32_t)(w >> 32);
                __builtin_memcpy(buf + 4 * k, &v, n - 4 * k < 4 ? n - 4 * k : 4);
            }
            *payload = buf;
        } else {
            /* the plain area: word 0 again with an acquire load (the
             * writer's release between payload and header words) */
            if ((uint32_t)__atomic_load_n((const uint64_t *)s, __ATOMIC_ACQUIRE) != f) return 0;
            uint32_t w, off, stride;
            gdrpy_chan_slot_layout(d->flags, d->slot_size, &w, &off, &stride);
            *payload = s + off;
        }
        *tag = (uint32_t)(w0 >> 32);
    }
    *len = n < d->slot_size ? n : d->slot_size;
    return 1;
}

/* One message of a batch. */
typedef struct gdrpy_chan_msg {
    const void *buf;
    uint32_t len;
    uint32_t tag;
} gdrpy_chan_msg_t;

typedef struct gdrpy_chan_stats {
    uint64_t sent;           /* messages published by the host */
    uint64_t consumed;       /* messages the kernel reported consumed */
    uint64_t received;       /* completions read by the host */
    uint64_t full_waits;     /* sends that found the ring full */
    uint32_t status;         /* GDRPY_CHAN_ST_* as the kernel reported it */
    uint32_t shutdown;       /* GDRPY_CHAN_RUN / DRAIN / ABORT requested */
    uint64_t final_consumed; /* consumed when the kernel stopped */
    uint64_t dropped;        /* sent but never consumed (abort / kernel timeout) */
} gdrpy_chan_stats_t;

/* Bytes of device memory (the pin) a channel with `cfg` needs. */
GDRPY_API int gdrpy_chan_device_bytes(const gdrpy_chan_config_t *cfg, size_t *out);

/* Builds a channel on a MAPPED pin of `ctx` (the pin's first
 * gdrpy_chan_device_bytes() bytes; they are zeroed) and allocates the
 * page-locked host block (sim: plain aligned memory).  The channel holds the
 * pin until gdrpy_chan_destroy(). */
GDRPY_API int gdrpy_chan_create(gdrpy_ctx_t ctx, gdrpy_pin_t pin,
                                const gdrpy_chan_config_t *cfg, gdrpy_chan_t **out);
/* Frees the host block and lets go of the pin.  If a kernel attached and has
 * not reported stopped, the host block is leaked on purpose (the GPU may
 * still write to it) and GDRPY_EBUSY is returned; the channel is gone either
 * way.  NULL is a no-op.  As with free(), no other thread may still be in a
 * call on the channel: a send or receive waiting in another thread returns
 * (GDRPY_EPIPE) once gdrpy_chan_shutdown() has seen the kernel stop; let it
 * return, then destroy.  (gdrpy.Channel.close() waits for its callers.) */
GDRPY_API int gdrpy_chan_destroy(gdrpy_chan_t *chan);
GDRPY_API int gdrpy_chan_get_desc(const gdrpy_chan_t *chan, gdrpy_chan_desc_t *out);
GDRPY_API int gdrpy_chan_get_config(const gdrpy_chan_t *chan, gdrpy_chan_config_t *out);
/* CPU addresses (tests, sim consumers): the device block through the
 * mapping, and the host block. */
GDRPY_API void *gdrpy_chan_device_block(const gdrpy_chan_t *chan);
GDRPY_API void *gdrpy_chan_host_block(const gdrpy_chan_t *chan);

/* timeout_ns: 0 = do not wait (GDRPY_EAGAIN), < 0 = wait forever,
 * > 0 = wait that long (GDRPY_ETIMEDOUT). */
GDRPY_API int gdrpy_chan_send(gdrpy_chan_t *chan, const void *buf, size_t len,
                              uint32_t tag, int64_t timeout_ns);
/* All `n` messages or none: waits for n free slots (n <= nslots), stores every
 * message (LL: every word; PLAIN: header + payload), ONE sfence (LL messages
 * are then complete; plain-area / PLAIN ones get their sequence words and
 * one more sfence). */
GDRPY_API int gdrpy_chan_send_batch(gdrpy_chan_t *chan, const gdrpy_chan_msg_t *msgs,
                                    size_t n, int64_t timeout_ns);
/* The next completion: copies min(len, cap) payload bytes to buf (may be
 * NULL when cap == 0); *len_out / *tag_out (may be NULL) get its len/tag. */
GDRPY_API int gdrpy_chan_recv(gdrpy_chan_t *chan, void *buf, size_t cap,
                              uint32_t *len_out, uint32_t *tag_out, int64_t timeout_ns);
/* Up to `max` completions, waiting (timeout_ns) until at least `min`
 * (1 <= min <= max) are there.  Completion k's payload goes to
 * buf + k*stride (buf may be NULL: payloads skipped; else min(len, stride)
 * bytes); lens/tags (may be NULL) get max entries.  *got: how many. */
GDRPY_API int gdrpy_chan_recv_many(gdrpy_chan_t *chan, void *buf, size_t stride,
                                   uint32_t *lens, uint32_t *tags, size_t min, size_t max,
                                   int64_t timeout_ns, size_t *got);
/* Requests shutdown (GDRPY_CHAN_DRAIN or GDRPY_CHAN_ABORT) and waits up to
 * timeout_ns for the kernel to report stopped (ETIMEDOUT otherwise; the
 * request stays).  A kernel that never attached (status NONE) is not waited
 * for.  Sends after shutdown fail with GDRPY_EPIPE.  st may be NULL. */
GDRPY_API int gdrpy_chan_shutdown(gdrpy_chan_t *chan, unsigned mode, int64_t timeout_ns,
                                  gdrpy_chan_stats_t *st);
GDRPY_API int gdrpy_chan_get_stats(gdrpy_chan_t *chan, gdrpy_chan_stats_t *out);
/* Waits until a kernel has attached (status no longer NONE): call it after
 * launching the kernel, before sending, so that shutdown and destroy know a
 * kernel is there.  GDRPY_ETIMEDOUT / GDRPY_EAGAIN (timeout_ns == 0);
 * NEAR: it also takes the kernel's slot table (GDRPY_EIO: not a valid one). */
GDRPY_API int gdrpy_chan_wait_attached(gdrpy_chan_t *chan, int64_t timeout_ns);
/* Byte offset of message i's slot from slot 0 (the ring's first byte), as
 * sends use it (NEAR: GDRPY_EAGAIN until the host has the kernel's table,
 * i.e. after wait_attached or a send). */
GDRPY_API int gdrpy_chan_slot_offset(const gdrpy_chan_t *chan, uint64_t i, size_t *out);

/* ---- a CPU thread standing in for the GPU kernel (tests, sim) --------- */
/* It does what the reference checking kernel does (tests/, gdrpy.tools):
 * attaches (status RUNNING) at once, waits start_delay_ns, then consumes
 * messages in order.  CHECK: message i's payload must be gdrpy_chan_pattern
 * (first 8 bytes = i, byte k >= 8 = (i * 131 + k) & 0xff), its tag i & 0xffffffff;
 * a mismatch counts an error.  COMPLETE: one completion per message:
 * payload {u64 seq (= i + 1), u32 checksum, u32 len} (truncated to
 * comp_size), tag = the message's tag; checksum = sum of byte[k] * ((k & 255) + 1)
 * mod 2^32.  A channel without completion payloads (comp_size 0) gets the
 * checksum as the tag instead ("tag answers", as the GPU ping-pong kernel
 * gives them).  ECHO (without COMPLETE): the completion carries the message's
 * own bytes (up to comp_size).  Honours shutdown (drain / abort) and stops
 * with status TIMEOUT after idle_timeout_ns (< 0: never) without a message. */
#define GDRPY_CHAN_SIM_CHECK 1u
#define GDRPY_CHAN_SIM_COMPLETE 2u
#define GDRPY_CHAN_SIM_ECHO 4u
typedef struct gdrpy_chan_sim_consumer gdrpy_chan_sim_consumer_t;
GDRPY_API int gdrpy_chan_sim_consumer_start(gdrpy_chan_t *chan, unsigned flags,
                                            int64_t start_delay_ns, int64_t idle_timeout_ns,
                                            gdrpy_chan_sim_consumer_t **out);
/* Joins the thread and frees it: messages consumed, check errors, first bad
 * message index (UINT64_MAX if none). */
GDRPY_API int gdrpy_chan_sim_consumer_join(gdrpy_chan_sim_consumer_t *c, uint64_t *consumed,
                                           uint64_t *errors, uint64_t *first_bad);
/* Fills buf[0, len) with message i's check pattern (see above). */
GDRPY_API void gdrpy_chan_pattern(uint64_t i, void *buf, size_t len);
/* The checksum above. */
GDRPY_API uint32_t gdrpy_chan_checksum(const void *buf, size_t len);

/* ---- vectored put ------------------------------------------------------ */
typedef struct gdrpy_iov {
    size_t offset; /* relative to the pinned address */
    const void *buf;
    size_t len;
} gdrpy_iov_t;

/* Scatter `n` host buffers into a mapped pin: every range is checked first
 * (GDRPY_ERANGE and nothing written if any is outside the pin), then all are
 * stored and ONE sfence ends the call. */
GDRPY_API int gdrpy_writev(gdrpy_ctx_t ctx, gdrpy_pin_t pin, const gdrpy_iov_t *iov,
                           size_t n);

#ifdef __cplusplus
}
#endif
#endif /* GDRPY_CHANNEL_H */
