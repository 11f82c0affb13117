/*
 * test_channel.c - the message channel and gdrpy_writev on the sim backend,
 * with a CPU thread (gdrpy_chan_sim_consumer) standing in for the GPU
 * kernel: ordering over 10^6 messages (the consumer checks every payload
 * and tag, the host checks every completion), ring full, timeouts,
 * shutdown with messages in flight (drain and abort), batches, writev.
 *
 * Final line: test_channel: N passed, M failed
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdrpy.h"
#include "gdrpy_channel.h"

#include "check.h"

typedef struct {
    gdrpy_ctx_t ctx;
    uint64_t dptr;
    gdrpy_pin_t pin;
    gdrpy_chan_t *ch;
} env_t;

/* The slot format the channel tests run with (main runs them with LL, the
 * default, and again with GDRPY_CHAN_PLAIN). */
static uint32_t g_flags;

static int env_open(env_t *e, uint32_t nslots, uint32_t slot, uint32_t comp_n, uint32_t comp_sz)
{
    memset(e, 0, sizeof *e);
    gdrpy_chan_config_t cfg = {nslots, slot, comp_n, comp_sz, g_flags, 0};
    size_t need = 0;
    if (gdrpy_chan_device_bytes(&cfg, &need)) return 1;
    if (gdrpy_open(0, GDRPY_BACKEND_SIM, &e->ctx)) return 1;
    if (gdrpy_sim_alloc(need, &e->dptr)) return 1;
    if (gdrpy_pin(e->ctx, e->dptr, need, 0, &e->pin)) return 1;
    void *mp, *up;
    if (gdrpy_map(e->ctx, e->pin, &mp, &up)) return 1;
    return gdrpy_chan_create(e->ctx, e->pin, &cfg, &e->ch) != 0;
}

static void env_close(env_t *e)
{
    gdrpy_chan_destroy(e->ch);
    gdrpy_unmap(e->ctx, e->pin);
    gdrpy_unpin(e->ctx, e->pin);
    gdrpy_sim_free(e->dptr);
    gdrpy_close(e->ctx);
}

/* Consumer checks every message; host checks every completion. */
static int ordering_1e6_messages_checked_both_ways(void)
{
    env_t e;
    CHECK(env_open(&e, 64, 96, 0, 16) == 0);
    gdrpy_chan_sim_consumer_t *sc;
    CHECK(gdrpy_chan_sim_consumer_start(e.ch, GDRPY_CHAN_SIM_CHECK | GDRPY_CHAN_SIM_COMPLETE,
                                        0, 10000000000LL, &sc) == 0);
    const uint64_t N = 1000000;
    unsigned char msg[96];
    uint64_t got = 0, bad = 0;
    struct {
        uint64_t seq;
        uint32_t csum, len;
    } r[64];
    uint32_t csum_of[64]; /* ring of expected checksums by index & 63 */
    uint32_t len_of[64];
    for (uint64_t i = 0; i < N; i++) {
        uint32_t len = (uint32_t)(1 + (i * 7) % 96);
        gdrpy_chan_pattern(i, msg, len);
        int rc = gdrpy_chan_send(e.ch, msg, len, (uint32_t)i, 0);
        while (rc == GDRPY_EAGAIN || got + 64 <= i) {
            /* ring (or our checksum ring) full: drain completions */
            size_t n = 0;
            int rr = gdrpy_chan_recv_many(e.ch, r, sizeof r[0], NULL, NULL, 1, 64,
                                          2000000000LL, &n);
            CHECK(rr == 0);
            for (size_t k = 0; k < n; k++, got++)
                if (r[k].seq != got + 1 || r[k].csum != csum_of[got & 63] ||
                    r[k].len != len_of[got & 63])
                    bad++;
            if (rc == GDRPY_EAGAIN) rc = gdrpy_chan_send(e.ch, msg, len, (uint32_t)i, 0);
        }
        CHECK(rc == 0);
        csum_of[i & 63] = gdrpy_chan_checksum(msg, len);
        len_of[i & 63] = len;
    }
    while (got < N) {
        size_t n = 0;
        CHECK(gdrpy_chan_recv_many(e.ch, r, sizeof r[0], NULL, NULL, 1, 64, 2000000000LL, &n) == 0);
        for (size_t k = 0; k < n; k++, got++)
            if (r[k].seq != got + 1 || r[k].csum != csum_of[got & 63] || r[k].len != len_of[got & 63])
                bad++;
    }
    gdrpy_chan_stats_t st;
    CHECK(gdrpy_chan_shutdown(e.ch, GDRPY_CHAN_DRAIN, 5000000000LL, &st) == 0);
    uint64_t consumed, errors, first;
    CHECK(gdrpy_chan_sim_consumer_join(sc, &consumed, &errors, &first) == 0);
    if (errors || bad)
        fprintf(stderr, "  consumer errors %llu (first bad message %llu), host bad "
                        "completions %llu\n",
                (unsigned long long)errors, (unsigned long long)first,
                (unsigned long long)bad);
    CHECK(errors == 0 && bad == 0);
    CHECK(consumed == N && st.sent == N && st.final_consumed == N && st.dropped == 0);
    CHECK(st.status == GDRPY_CHAN_ST_STOPPED);
    env_close(&e);
    return 0;
}

static int batch_of_32_one_fence_all_checked(void)
{
    env_t e;
    CHECK(env_open(&e, 64, 64, 0, 16) == 0);
    gdrpy_chan_sim_consumer_t *sc;
    CHECK(gdrpy_chan_sim_consumer_start(e.ch, GDRPY_CHAN_SIM_CHECK | GDRPY_CHAN_SIM_COMPLETE,
                                        0, 10000000000LL, &sc) == 0);
    unsigned char buf[32][64];
    gdrpy_chan_msg_t m[32];
    uint64_t i = 0;
    for (int round = 0; round < 2000; round++) {
        for (int k = 0; k < 32; k++, i++) {
            gdrpy_chan_pattern(i, buf[k], 64);
            m[k].buf = buf[k];
            m[k].len = 64;
            m[k].tag = (uint32_t)i;
        }
        CHECK(gdrpy_chan_send_batch(e.ch, m, 32, 2000000000LL) == 0);
        size_t n = 0;
        CHECK(gdrpy_chan_recv_many(e.ch, NULL, 0, NULL, NULL, 32, 32, 2000000000LL, &n) == 0);
        CHECK(n == 32);
    }
    CHECK(gdrpy_chan_send_batch(e.ch, m, 65, 0) == GDRPY_EINVAL); /* > nslots */
    CHECK(gdrpy_chan_shutdown(e.ch, GDRPY_CHAN_DRAIN, 5000000000LL, NULL) == 0);
    uint64_t consumed, errors, first;
    CHECK(gdrpy_chan_sim_consumer_join(sc, &consumed, &errors, &first) == 0);
    CHECK(errors == 0 && consumed == i);
    env_close(&e);
    return 0;
}

static int ring_full_eagain_then_timeout_then_progress(void)
{
    env_t e;
    CHECK(env_open(&e, 8, 32, 0, 16) == 0);
    unsigned char msg[32];
    for (uint64_t i = 0; i < 8; i++) {
        gdrpy_chan_pattern(i, msg, 32);
        CHECK(gdrpy_chan_send(e.ch, msg, 32, (uint32_t)i, 0) == 0);
    }
    gdrpy_chan_pattern(8, msg, 32);
    CHECK(gdrpy_chan_send(e.ch, msg, 32, 8, 0) == GDRPY_EAGAIN);
    CHECK(strstr(gdrpy_last_error(), "full") != NULL);
    CHECK(gdrpy_chan_send(e.ch, msg, 32, 8, 2000000) == GDRPY_ETIMEDOUT); /* 2 ms */
    gdrpy_chan_stats_t st;
    CHECK(gdrpy_chan_get_stats(e.ch, &st) == 0);
    CHECK(st.sent == 8 && st.consumed == 0 && st.full_waits == 2);
    /* nothing to receive yet */
    uint32_t len;
    CHECK(gdrpy_chan_recv(e.ch, NULL, 0, &len, NULL, 0) == GDRPY_EAGAIN);
    CHECK(gdrpy_chan_recv(e.ch, NULL, 0, &len, NULL, 1000000) == GDRPY_ETIMEDOUT);
    /* a consumer frees the ring: the blocked send goes through */
    gdrpy_chan_sim_consumer_t *sc;
    CHECK(gdrpy_chan_sim_consumer_start(e.ch, GDRPY_CHAN_SIM_CHECK | GDRPY_CHAN_SIM_COMPLETE,
                                        0, 10000000000LL, &sc) == 0);
    CHECK(gdrpy_chan_send(e.ch, msg, 32, 8, 2000000000LL) == 0);
    size_t n = 0;
    CHECK(gdrpy_chan_recv_many(e.ch, NULL, 0, NULL, NULL, 8, 8, 2000000000LL, &n) == 0 && n == 8);
    CHECK(gdrpy_chan_recv(e.ch, NULL, 0, &len, NULL, 2000000000LL) == 0 && len == 16);
    CHECK(gdrpy_chan_shutdown(e.ch, GDRPY_CHAN_DRAIN, 5000000000LL, &st) == 0);
    uint64_t consumed, errors, first;
    CHECK(gdrpy_chan_sim_consumer_join(sc, &consumed, &errors, &first) == 0);
    CHECK(errors == 0 && consumed == 9 && st.final_consumed == 9);
    /* sends after shutdown fail */
    CHECK(gdrpy_chan_send(e.ch, msg, 32, 9, 0) == GDRPY_EPIPE);
    env_close(&e);
    return 0;
}

static int shutdown_drain_consumes_messages_in_flight(void)
{
    env_t e;
    CHECK(env_open(&e, 16, 32, 0, 16) == 0);
    unsigned char msg[32];
    for (uint64_t i = 0; i < 10; i++) {
        gdrpy_chan_pattern(i, msg, 32);
        CHECK(gdrpy_chan_send(e.ch, msg, 32, (uint32_t)i, 0) == 0);
    }
    gdrpy_chan_sim_consumer_t *sc;
    /* attached now, consumes only after 50 ms: all 10 are in flight */
    CHECK(gdrpy_chan_sim_consumer_start(e.ch, GDRPY_CHAN_SIM_CHECK, 50000000LL,
                                        10000000000LL, &sc) == 0);
    gdrpy_chan_stats_t st;
    CHECK(gdrpy_chan_shutdown(e.ch, GDRPY_CHAN_DRAIN, 5000000000LL, &st) == 0);
    uint64_t consumed, errors, first;
    CHECK(gdrpy_chan_sim_consumer_join(sc, &consumed, &errors, &first) == 0);
    CHECK(errors == 0 && consumed == 10);
    CHECK(st.status == GDRPY_CHAN_ST_STOPPED && st.final_consumed == 10 && st.dropped == 0);
    env_close(&e);
    return 0;
}

static int shutdown_abort_counts_dropped(void)
{
    env_t e;
    CHECK(env_open(&e, 16, 32, 0, 16) == 0);
    unsigned char msg[32];
    for (uint64_t i = 0; i < 10; i++) {
        gdrpy_chan_pattern(i, msg, 32);
        CHECK(gdrpy_chan_send(e.ch, msg, 32, (uint32_t)i, 0) == 0);
    }
    gdrpy_chan_sim_consumer_t *sc;
    CHECK(gdrpy_chan_sim_consumer_start(e.ch, GDRPY_CHAN_SIM_CHECK, 50000000LL,
                                        10000000000LL, &sc) == 0);
    gdrpy_chan_stats_t st;
    CHECK(gdrpy_chan_shutdown(e.ch, GDRPY_CHAN_ABORT, 5000000000LL, &st) == 0);
    uint64_t consumed, errors, first;
    CHECK(gdrpy_chan_sim_consumer_join(sc, &consumed, &errors, &first) == 0);
    CHECK(consumed == 0 && st.final_consumed == 0 && st.dropped == 10 && st.sent == 10);
    env_close(&e);
    return 0;
}

static int shutdown_times_out_when_consumer_never_stops(void)
{
    env_t e;
    CHECK(env_open(&e, 16, 32, 0, 16) == 0);
    gdrpy_chan_sim_consumer_t *sc;
    /* attached, but sleeps 300 ms before it looks at anything */
    CHECK(gdrpy_chan_sim_consumer_start(e.ch, 0, 300000000LL, 10000000000LL, &sc) == 0);
    CHECK(gdrpy_chan_shutdown(e.ch, GDRPY_CHAN_DRAIN, 1000000LL, NULL) == GDRPY_ETIMEDOUT);
    CHECK(gdrpy_chan_destroy(NULL) == 0);
    CHECK(gdrpy_chan_shutdown(e.ch, GDRPY_CHAN_DRAIN, 5000000000LL, NULL) == 0);
    CHECK(gdrpy_chan_sim_consumer_join(sc, NULL, NULL, NULL) == 0);
    env_close(&e);
    return 0;
}

static int kernel_watchdog_stop_makes_waits_fail_fast(void)
{
    env_t e;
    CHECK(env_open(&e, 4, 16, 0, 16) == 0);
    gdrpy_chan_sim_consumer_t *sc;
    /* no completions, idle timeout 20 ms */
    CHECK(gdrpy_chan_sim_consumer_start(e.ch, 0, 0, 20000000LL, &sc) == 0);
    CHECK(gdrpy_chan_sim_consumer_join(sc, NULL, NULL, NULL) == 0);
    gdrpy_chan_stats_t st;
    CHECK(gdrpy_chan_get_stats(e.ch, &st) == 0 && st.status == GDRPY_CHAN_ST_TIMEOUT);
    CHECK(gdrpy_chan_recv(e.ch, NULL, 0, NULL, NULL, -1) == GDRPY_EPIPE);
    unsigned char m[16] = {0};
    for (int i = 0; i < 4; i++) CHECK(gdrpy_chan_send(e.ch, m, 16, 0, 0) == 0);
    CHECK(gdrpy_chan_send(e.ch, m, 16, 0, -1) == GDRPY_EPIPE);
    env_close(&e);
    return 0;
}

static int bad_arguments_are_rejected(void)
{
    gdrpy_chan_config_t cfg = {3, 64, 0, 16, 0, 0};
    size_t n;
    CHECK(gdrpy_chan_device_bytes(&cfg, &n) == GDRPY_EINVAL); /* not a power of two */
    cfg.nslots = 4;
    cfg.slot_size = 0;
    CHECK(gdrpy_chan_device_bytes(&cfg, &n) == GDRPY_EINVAL);
    cfg.slot_size = 64;
    cfg.comp_nslots = 6;
    CHECK(gdrpy_chan_device_bytes(&cfg, &n) == GDRPY_EINVAL);
    cfg.comp_nslots = 0;
    /* LL (default): 2 header words + 16 data words = 144 B, plain area none -> 192 */
    CHECK(gdrpy_chan_device_bytes(&cfg, &n) == 0 && n == 128 + 4 * 192);
    cfg.flags = GDRPY_CHAN_PLAIN; /* 16 B header + 64 B payload -> 128 */
    CHECK(gdrpy_chan_device_bytes(&cfg, &n) == 0 && n == 128 + 4 * 128);
    cfg.flags = GDRPY_CHAN_NEAR; /* 64 KiB of slots (342 of 192 B), then 342 u32 (1408 B) */
    CHECK(gdrpy_chan_device_bytes(&cfg, &n) == 0 && n == 128 + 342 * 192 + 1408);
    cfg.nslots = 256; /* 2 * 256 slots are more than 64 KiB */
    CHECK(gdrpy_chan_device_bytes(&cfg, &n) == 0 && n == 128 + 512 * 192 + 2048);
    cfg.nslots = 4;
    cfg.flags = 4; /* undefined flag */
    CHECK(gdrpy_chan_device_bytes(&cfg, &n) == GDRPY_EINVAL);
    cfg.flags = GDRPY_CHAN_NEAR;
    cfg.nslots = GDRPY_CHAN_NEAR_MAX_SLOTS * 2;
    CHECK(gdrpy_chan_device_bytes(&cfg, &n) == GDRPY_EINVAL);
    cfg.nslots = 4;
    cfg.flags = 0;
    env_t e;
    CHECK(env_open(&e, 4, 64, 0, 16) == 0);
    unsigned char m[65] = {0};
    CHECK(gdrpy_chan_send(e.ch, m, 65, 0, 0) == GDRPY_EINVAL);
    CHECK(gdrpy_chan_send(e.ch, NULL, 4, 0, 0) == GDRPY_EINVAL);
    CHECK(gdrpy_chan_shutdown(e.ch, 7, 0, NULL) == GDRPY_EINVAL);
    /* the channel holds its pin: unmap and unpin are refused */
    CHECK(gdrpy_unmap(e.ctx, e.pin) == GDRPY_EBUSY);
    /* a pin too small */
    gdrpy_pin_t p2;
    void *mp, *up;
    CHECK(gdrpy_pin(e.ctx, e.dptr, 256, 0, &p2) == 0);
    CHECK(gdrpy_map(e.ctx, p2, &mp, &up) == 0);
    gdrpy_chan_t *c2 = NULL;
    CHECK(gdrpy_chan_create(e.ctx, p2, &cfg, &c2) == GDRPY_ERANGE && c2 == NULL);
    gdrpy_unmap(e.ctx, p2);
    gdrpy_unpin(e.ctx, p2);
    /* an unmapped pin */
    CHECK(gdrpy_pin(e.ctx, e.dptr, 4096, 0, &p2) == 0);
    CHECK(gdrpy_chan_create(e.ctx, p2, &cfg, &c2) == GDRPY_EINVAL);
    gdrpy_unpin(e.ctx, p2);
    env_close(&e);
    return 0;
}

static int writev_checks_every_range_first(void)
{
    gdrpy_ctx_t c;
    CHECK(gdrpy_open(0, GDRPY_BACKEND_SIM, &c) == 0);
    uint64_t d;
    CHECK(gdrpy_sim_alloc(65536, &d) == 0);
    gdrpy_pin_t p;
    void *mp, *up;
    CHECK(gdrpy_pin(c, d, 4096, 0, &p) == 0);
    CHECK(gdrpy_map(c, p, &mp, &up) == 0);
    memset(up, 0, 4096);
    const char a[] = "hello", b[] = "world!";
    gdrpy_iov_t iov[3] = {{0, a, 5}, {100, b, 6}, {4095, b, 2}};
    CHECK(gdrpy_writev(c, p, iov, 3) == GDRPY_ERANGE);
    CHECK(memcmp(up, "\0\0\0\0\0", 5) == 0); /* nothing written */
    iov[2].len = 1;
    CHECK(gdrpy_writev(c, p, iov, 3) == 0);
    CHECK(memcmp(up, "hello", 5) == 0 && memcmp((char *)up + 100, "world!", 6) == 0);
    CHECK(((char *)up)[4095] == 'w');
    CHECK(gdrpy_writev(c, p, NULL, 0) == 0);
    CHECK(gdrpy_writev(c, p, NULL, 1) == GDRPY_EINVAL);
    gdrpy_iov_t z = {0, NULL, 3};
    CHECK(gdrpy_writev(c, p, &z, 1) == GDRPY_EINVAL);
    CHECK(gdrpy_writev(c, 0, iov, 1) == GDRPY_EBADF);
    gdrpy_unmap(c, p);
    CHECK(gdrpy_writev(c, p, iov, 1) == GDRPY_EINVAL); /* not mapped */
    gdrpy_unpin(c, p);
    gdrpy_sim_free(d);
    gdrpy_close(c);
    return 0;
}

/* gdrpy_chan_host_take on slots built by hand: an LL message is taken only
 * when every word it needs carries its sequence; lengths are clamped to the
 * slot; PLAIN needs its sequence word. */
static int host_take_checks_every_word_and_clamps(void)
{
    _Alignas(64) unsigned char s[256];
    unsigned char buf[GDRPY_CHAN_LL_MAX];
    const unsigned char *pl;
    uint32_t len, tag;
    uint64_t w[6];
    gdrpy_chan_desc_t d;
    memset(&d, 0, sizeof d);
    d.nslots = 8;
    d.slot_size = 16;
    const uint64_t i = 41;          /* f = 42 */
    w[0] = 42 | (uint64_t)7 << 32;  /* tag 7 */
    w[1] = 42 | (uint64_t)12 << 32; /* len 12: words 2..4 */
    for (int k = 0; k < 4; k++) w[2 + k] = 42 | (uint64_t)(0x01020304u * (k + 1)) << 32;
    memcpy(s, w, sizeof w);
    CHECK(gdrpy_chan_host_take(&d, s, i, buf, &len, &tag, &pl) == 1);
    CHECK(len == 12 && tag == 7 && pl == buf);
    uint32_t v[3];
    memcpy(v, buf, 12);
    CHECK(v[0] == 0x01020304u && v[1] == 0x02040608u && v[2] == 0x0306090cu);
    CHECK(gdrpy_chan_host_take(&d, s, i + 8, buf, &len, &tag, &pl) == 0); /* next lap */
    uint64_t old = 41 | (uint64_t)0xdead << 32;                           /* a stale word of the last lap */
    memcpy(s + 32, &old, 8);
    CHECK(gdrpy_chan_host_take(&d, s, i, buf, &len, &tag, &pl) == 0);
    memcpy(s + 32, &w[4], 8);
    w[1] = 42 | (uint64_t)4 << 32; /* len 4: word 2 only, word 4 may be stale */
    memcpy(s + 8, &w[1], 8);
    CHECK(gdrpy_chan_host_take(&d, s, i, buf, &len, &tag, &pl) == 1 && len == 4);
    memcpy(s + 32, &old, 8);
    CHECK(gdrpy_chan_host_take(&d, s, i, buf, &len, &tag, &pl) == 1 && len == 4);
    /* PLAIN: the sequence word, then len/tag; len clamped to the slot */
    d.flags = GDRPY_CHAN_PLAIN;
    uint64_t h[2] = {i + 1, 999 | (uint64_t)5 << 32};
    memcpy(s, h, sizeof h);
    CHECK(gdrpy_chan_host_take(&d, s, i, buf, &len, &tag, &pl) == 1);
    CHECK(len == 16 && tag == 5 && pl == s + GDRPY_CHAN_HDR);
    h[0] = i;
    memcpy(s, h, 8);
    CHECK(gdrpy_chan_host_take(&d, s, i, buf, &len, &tag, &pl) == 0);
    return 0;
}

/* NEAR: sends wait for the consumer's slot table; then every message goes
 * to the slot the table names (the sim consumer's: the odd physical slots)
 * and the even ones are never written. */
static int near_sends_wait_for_the_table_then_follow_it(void)
{
    env_t e;
    CHECK(env_open(&e, 8, 32, 0, 16) == 0);
    unsigned char msg[32];
    gdrpy_chan_pattern(0, msg, 32);
    CHECK(gdrpy_chan_send(e.ch, msg, 32, 0, 0) == GDRPY_EAGAIN);
    CHECK(gdrpy_chan_send(e.ch, msg, 32, 0, 1000000) == GDRPY_ETIMEDOUT);
    gdrpy_chan_msg_t m = {msg, 32, 0};
    CHECK(gdrpy_chan_send_batch(e.ch, &m, 1, 0) == GDRPY_EAGAIN);
    gdrpy_chan_desc_t d;
    CHECK(gdrpy_chan_get_desc(e.ch, &d) == 0 && d.place_nslots == (65536 + d.slot_stride - 1) / d.slot_stride);
    gdrpy_chan_sim_consumer_t *sc;
    CHECK(gdrpy_chan_sim_consumer_start(e.ch, GDRPY_CHAN_SIM_CHECK | GDRPY_CHAN_SIM_COMPLETE,
                                        0, 10000000000LL, &sc) == 0);
    CHECK(gdrpy_chan_wait_attached(e.ch, 1000000000LL) == 0);
    for (uint64_t i = 0; i < 20; i++) {
        size_t off = 1;
        CHECK(gdrpy_chan_slot_offset(e.ch, i, &off) == 0);
        CHECK(off == (2 * (i % 8) + 1) * (size_t)d.slot_stride);
        gdrpy_chan_pattern(i, msg, 32);
        CHECK(gdrpy_chan_send(e.ch, msg, 32, (uint32_t)i, 2000000000LL) == 0);
        CHECK(gdrpy_chan_recv(e.ch, NULL, 0, NULL, NULL, 2000000000LL) == 0);
    }
    CHECK(gdrpy_chan_shutdown(e.ch, GDRPY_CHAN_DRAIN, 5000000000LL, NULL) == 0);
    uint64_t consumed, errors, first;
    CHECK(gdrpy_chan_sim_consumer_join(sc, &consumed, &errors, &first) == 0);
    CHECK(errors == 0 && consumed == 20);
    const unsigned char *ring = (const unsigned char *)gdrpy_chan_device_block(e.ch) + 128;
    for (uint32_t p = 0; p < d.place_nslots; p++) /* the table: 1, 3, .., 15 */
        if (p % 2 == 0 || p > 15)
            for (uint32_t b = 0; b < d.slot_stride; b++) CHECK(ring[(size_t)p * d.slot_stride + b] == 0);
    env_close(&e);
    return 0;
}

/* LL: what a short message leaves in its slot, byte for byte, for every
 * length 0..64, through send and send_batch: {f, tag}, {f, len}, the
 * payload 4 bytes per word (the last one zero-filled), {f, 0} up to the end
 * of its last 64-byte line, and nothing after that line (the refresh lap,
 * the ring's first, writes all of the slot's LL words).  A consumer thread
 * frees the slots between laps; it reads them and writes nothing there. */
static int ll_short_messages_stored_in_whole_lines(void)
{
    const uint32_t saved = g_flags;
    g_flags = 0; /* LL, every slot where the ring says */
    env_t e;
    CHECK(env_open(&e, 8, 64, 0, 16) == 0);
    gdrpy_chan_desc_t d;
    CHECK(gdrpy_chan_get_desc(e.ch, &d) == 0 && d.slot_stride == 192);
    unsigned char *ring = (unsigned char *)gdrpy_chan_device_block(e.ch) + 128;
    gdrpy_chan_sim_consumer_t *sc;
    CHECK(gdrpy_chan_sim_consumer_start(e.ch, 0, 0, 10000000000LL, &sc) == 0);
    unsigned char msg[8][64];
    gdrpy_chan_msg_t m[8];
    uint64_t i = 0;
    for (uint32_t lap = 0; lap < 10; lap++) {
        gdrpy_chan_stats_t st;
        memset(&st, 0xff, sizeof st);              /* no count at all, should every read fail */
        for (int spin = 0; spin < 2000000; spin++) /* the consumer has taken the last lap */
            if (gdrpy_chan_get_stats(e.ch, &st) == 0 && st.consumed == i) break;
        CHECK(st.consumed == i);
        memset(ring, 0xab, (size_t)8 * d.slot_stride);
        for (uint32_t k = 0; k < 8; k++) {
            const uint32_t len = lap == 0 ? 5 * k : lap == 9 ? 64 - k
                                                             : 8 * (lap - 1) + k; /* 0..64 */
            gdrpy_chan_pattern(i + k, msg[k], len);
            m[k].buf = msg[k];
            m[k].len = len;
            m[k].tag = 1000u + (uint32_t)(i + k);
        }
        if (lap % 2) CHECK(gdrpy_chan_send_batch(e.ch, m, 8, 1000000000LL) == 0);
        else
            for (uint32_t k = 0; k < 8; k++)
                CHECK(gdrpy_chan_send(e.ch, m[k].buf, m[k].len, m[k].tag, 1000000000LL) == 0);
        for (uint32_t k = 0; k < 8; k++, i++) {
            const unsigned char *s = ring + (size_t)(i % 8) * d.slot_stride;
            const uint32_t f = (uint32_t)(i + 1), len = m[k].len, nw = (len + 3) / 4;
            const uint32_t nb = i < 8 ? d.slot_stride : (8 * (2 + nw) + 63) & ~63u;
            uint64_t w;
            memcpy(&w, s, 8);
            CHECK(w == (f | (uint64_t)m[k].tag << 32));
            memcpy(&w, s + 8, 8);
            CHECK(w == (f | (uint64_t)len << 32));
            for (uint32_t b = 16; b < nb; b += 8) {
                const uint32_t at = (b - 16) / 2; /* the payload bytes this word carries */
                uint32_t data = 0;
                if (at < len) memcpy(&data, msg[k] + at, len - at < 4 ? len - at : 4);
                memcpy(&w, s + b, 8);
                CHECK(w == (f | (uint64_t)data << 32));
            }
            for (uint32_t b = nb; b < d.slot_stride; b++) CHECK(s[b] == 0xab);
        }
    }
    CHECK(gdrpy_chan_shutdown(e.ch, GDRPY_CHAN_DRAIN, 5000000000LL, NULL) == 0);
    CHECK(gdrpy_chan_sim_consumer_join(sc, NULL, NULL, NULL) == 0);
    env_close(&e);
    g_flags = saved;
    return 0;
}

int main(void)
{
    RUN(bad_arguments_are_rejected);
    RUN(writev_checks_every_range_first);
    RUN(host_take_checks_every_word_and_clamps);
    RUN(ll_short_messages_stored_in_whole_lines);
    for (int plain = 0; plain < 2; plain++) {
        g_flags = plain ? GDRPY_CHAN_PLAIN : 0;
        printf("-- slot format %s\n", plain ? "PLAIN" : "LL (default)");
        RUN(ring_full_eagain_then_timeout_then_progress);
        RUN(shutdown_drain_consumes_messages_in_flight);
        RUN(shutdown_abort_counts_dropped);
        RUN(shutdown_times_out_when_consumer_never_stops);
        RUN(kernel_watchdog_stop_makes_waits_fail_fast);
        RUN(batch_of_32_one_fence_all_checked);
        RUN(ordering_1e6_messages_checked_both_ways);
        g_flags |= GDRPY_CHAN_NEAR;
        printf("-- slot format %s, near slots\n", plain ? "PLAIN" : "LL (default)");
        RUN(near_sends_wait_for_the_table_then_follow_it);
        RUN(batch_of_32_one_fence_all_checked);
        RUN(ordering_1e6_messages_checked_both_ways);
    }
    printf("test_channel: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
