/*
 * channel_kernels.cu - persistent kernels on the gdrpy channel, used by
 * `python -m gdrpy bench pingpong`, the C tool gdrpy_chanpp and the GPU
 * tests.  Compiled at run time by NVRTC (gdrpy.tools.cuda_rt), with gdrpy's
 * include directory on the include path.  One warp serves a channel.
 *
 * Answer to message i (all kernels): one completion
 *     {u64 seq = i + 1, u32 checksum, u32 len}     (16 bytes)
 * with the message's tag; checksum = sum(byte[k] * ((k & 255) + 1)) mod 2^32
 * (gdrpy_chan_checksum).  On a channel whose completions carry no payload
 * (comp_size 0) the answer is the checksum as the completion's tag ("tag
 * answers": the completion is its 16-byte header, one store; a burst of 32
 * is one store instruction) - the sim consumer answers the same way.
 */
#include "gdrpy_channel.cuh"

typedef unsigned long long u64;
typedef unsigned int u32;

#define SMALL_MSG 256u   /* one lane per message up to this many bytes */

struct gdrpy_answer {
    u64 seq;
    u32 csum;
    u32 len;
};

/* sum over the 4 bytes of v (payload bytes i0..i0+3, those below len) of
 * byte * ((index & 255) + 1) */
__device__ __forceinline__ u32 bytes_checksum(u32 v, u32 i0, u32 len)
{
    u32 c = 0;
#pragma unroll
    for (u32 b = 0; b < 4; ++b)
        if (i0 + b < len) c += ((v >> (8 * b)) & 0xffu) * (((i0 + b) & 255u) + 1u);
    return c;
}

/* The checksum of a message, computed by the whole warp (every lane gets
 * it).  Payloads start 16-byte aligned (slot stride 64, header 16). */
__device__ __forceinline__ u32 warp_checksum(const volatile unsigned char *p, u32 len)
{
    const unsigned lane = threadIdx.x & 31u;
    u32 c = 0;
    if ((((unsigned long long)p) & 15u) == 0) {
        /* 16-byte volatile loads, four in flight per lane (a plain area
         * starts on a 64-byte line) */
        const u32 n16 = len >> 4;
#pragma unroll 4
        for (u32 q = lane; q < n16; q += 32) {
            u32 a, b, e, g;
            asm volatile("ld.volatile.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(a), "=r"(b), "=r"(e), "=r"(g) : "l"(p + 16ull * q) : "memory");
            const u32 i0 = q << 4;
            c += bytes_checksum(a, i0, len) + bytes_checksum(b, i0 + 4, len) +
                 bytes_checksum(e, i0 + 8, len) + bytes_checksum(g, i0 + 12, len);
        }
        for (u32 i = (n16 << 4) + lane; i < len; i += 32) c += (u32)p[i] * ((i & 255u) + 1u);
        for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
        return c;
    }
    u32 nw = len >> 2;
    const volatile u32 *w = (const volatile u32 *)p;
    for (u32 k = lane; k < nw; k += 32) {
        u32 v = w[k];
        u32 i = k << 2;
        c += (v & 0xffu) * ((i & 255u) + 1u) + ((v >> 8) & 0xffu) * (((i + 1u) & 255u) + 1u) +
             ((v >> 16) & 0xffu) * (((i + 2u) & 255u) + 1u) +
             (v >> 24) * (((i + 3u) & 255u) + 1u);
    }
    for (u32 i = (nw << 2) + lane; i < len; i += 32) c += (u32)p[i] * ((i & 255u) + 1u);
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
    return c;
}

/* The checksum by one lane alone (small messages, one per lane). */
__device__ __forceinline__ u32 lane_checksum(const volatile unsigned char *p, u32 len)
{
    u32 c = 0;
    u32 nw = len >> 2;
    const volatile u32 *w = (const volatile u32 *)p;
    for (u32 k = 0; k < nw; ++k) {
        u32 v = w[k];
        u32 i = k << 2;
        c += (v & 0xffu) * ((i & 255u) + 1u) + ((v >> 8) & 0xffu) * (((i + 1u) & 255u) + 1u) +
             ((v >> 16) & 0xffu) * (((i + 2u) & 255u) + 1u) +
             (v >> 24) * (((i + 3u) & 255u) + 1u);
    }
    for (u32 i = nw << 2; i < len; ++i) c += (u32)p[i] * ((i & 255u) + 1u);
    return c;
}

__device__ __forceinline__ u32 lane_pattern_errors(const volatile unsigned char *p, u32 len, u64 i)
{
    u32 bad = 0;
    for (u32 k = 0; k < len; ++k) {
        unsigned char want = k < 8 ? (unsigned char)(i >> (8 * k))
                                   : (unsigned char)((i * 131ull + k) & 0xffu);
        bad += p[k] != want;
    }
    return bad;
}

/* Bytes [0, n) of a word as a mask (n >= 4: all). */
__device__ __forceinline__ u32 low_bytes(u32 n)
{
    return n >= 4u ? 0xffffffffu : (1u << (8u * n)) - 1u;
}

/* The same from a taken message's words (gdrpy_chan_in_t.buf, registers:
 * constant indices only).  Byte 4k+b of an LL payload (<= 64 bytes) has the
 * weight 4k+b+1 < 256, so a word is one dp4a against the packed weights
 * {4k+1, .., 4k+4}; bytes at and after `len` are masked off (the protocol
 * leaves them unspecified).  Payloads of <= 8 bytes take two dp4a.  Longer
 * ones take every word of buf, each masked to its bytes below len (words
 * past the message count 0, so buf must hold defined values there: the
 * caller zeroes it once): a select per word, not a branch.  A branch per
 * word - `if (k < words)` - compiles to a branch and a reconvergence
 * barrier for each of the 16 words; measured on the H200 (round 18, the
 * kernel's own stamps) that cost the round that answers a 32-byte message
 * 0.19 us, and a burst of 32 such messages 0.36 us. */
__device__ __forceinline__ u32 words_checksum(const u32 (&w)[GDRPY_CHAN_LL_MAX / 4], u32 len)
{
    if (len <= 4u) return len ? __dp4a(w[0] & low_bytes(len), 0x04030201u, 0u) : 0u;
    if (len <= 8u) return __dp4a(w[1] & low_bytes(len - 4u), 0x08070605u, __dp4a(w[0], 0x04030201u, 0u));
    u32 c0 = 0, c1 = 0; /* two sums: half the dependent chain */
#pragma unroll
    for (u32 k = 0; k < GDRPY_CHAN_LL_MAX / 4; k += 2) {
        const u32 h0 = len > 4u * k ? len - 4u * k : 0u, h1 = len > 4u * k + 4u ? len - 4u * k - 4u : 0u;
        c0 = __dp4a(w[k] & low_bytes(h0), 0x04030201u + 0x04040404u * k, c0);
        c1 = __dp4a(w[k + 1] & low_bytes(h1), 0x04030201u + 0x04040404u * (k + 1), c1);
    }
    return c0 + c1;
}

__device__ __forceinline__ u32 words_pattern_errors(const u32 (&w)[GDRPY_CHAN_LL_MAX / 4], u32 len,
                                                    u64 i)
{
    u32 bad = 0;
#pragma unroll
    for (u32 k = 0; k < GDRPY_CHAN_LL_MAX; ++k)
        if (k < len) {
            unsigned char got = (unsigned char)(w[k / 4] >> (8 * (k & 3)));
            unsigned char want = k < 8 ? (unsigned char)(i >> (8 * k))
                                       : (unsigned char)((i * 131ull + k) & 0xffu);
            bad += got != want;
        }
    return bad;
}

/* Checksum and pattern errors of a taken message, by its lane alone. */
__device__ __forceinline__ u32 in_checksum(const gdrpy_chan_in_t &in)
{
    return in.plain ? lane_checksum(in.plain, in.len) : words_checksum(in.buf, in.len);
}

__device__ __forceinline__ u32 in_pattern_errors(const gdrpy_chan_in_t &in, u64 i)
{
    return in.plain ? lane_pattern_errors(in.plain, in.len, i)
                    : words_pattern_errors(in.buf, in.len, i);
}

/* The answer {u64 seq, u32 csum, u32 len} as the 4 words of a completion;
 * comp_size 0: the checksum as the tag of a completion without payload. */
__device__ __forceinline__ void answer(const gdrpy_chan_desc_t &d, u64 j, u64 i, u32 csum,
                                       u32 len, u32 tag)
{
    const u32 w[4] = {(u32)(i + 1), (u32)((i + 1) >> 32), csum, len};
    if (d.comp_size == 0u) gdrpy_chan_comp_fill_words(d, j, w, 0u, csum);
    else gdrpy_chan_comp_fill_words(d, j, w, 16u, tag);
}

/* Bytes [off, off + 4) of a `clen`-byte answer that exist, as a mask. */
__device__ __forceinline__ u32 answer_mask(u32 clen, u32 off)
{
    return clen <= off ? 0u : clen >= off + 4u ? 0xffffffffu : (1u << (8u * (clen - off))) - 1u;
}

/* What one lane stores of every answer line (answer_lines): depends only
 * on the lane and comp_size, so it is computed once, before the loop. */
struct answer_lane {
    u32 pair; /* words 2*pair, 2*pair+1 of the line */
    u32 stores; /* lanes that store one answer: 4 (a line), 1 (a tag answer) */
    u32 clen; /* the answer's bytes: min(comp_size, 16) */
    u32 am, bm; /* masks of the two data words (pair 1: seq; 2: csum, len; 3: pad) */
    /* short_answer_guess(): which of the message's tag, checksum and length
     * go into this lane's data words (as masks: all-ones, am/bm or 0) */
    u32 tag_m, csum_m, len_m;
};

__device__ __forceinline__ answer_lane answer_lane_of(const gdrpy_chan_desc_t &d)
{
    answer_lane a;
    a.pair = threadIdx.x & 3u;
    a.clen = d.comp_size < 16u ? d.comp_size : 16u;
    a.am = a.pair == 1u ? answer_mask(a.clen, 0u) : a.pair == 2u ? answer_mask(a.clen, 8u) : 0u;
    a.bm = a.pair == 1u ? answer_mask(a.clen, 4u) : a.pair == 2u ? answer_mask(a.clen, 12u) : 0u;
    a.tag_m = a.pair == 0u ? 0xffffffffu : 0u;
    a.csum_m = a.pair == 2u ? a.am : 0u;
    a.len_m = a.pair == 2u ? a.bm : 0u;
    a.stores = 4u;
    if (d.comp_size == 0u) { /* tag answers: lane 0 stores {f, checksum}, {f, 0} */
        a.tag_m = 0u;
        a.csum_m = a.pair == 0u ? 0xffffffffu : 0u;
        a.stores = 1u;
    }
    return a;
}

/* A tag answer: completion comp_head + k as its 16-byte header {f, csum},
 * {f, 0} (one relaxed 16-byte store; LL: complete when it lands). */
__device__ __forceinline__ void tag_answer(const gdrpy_chan_desc_t &d, u64 comp_head, unsigned k,
                                           u32 csum)
{
    const u32 f = (u32)(comp_head + k + 1);
    gdrpy_st_relaxed_v2(gdrpy_chan_comp_slot(d, comp_head + k), gdrpy_llword(f, csum),
                        gdrpy_llword(f, 0u));
}

/* LL channels, all 32 lanes: the answers to messages head..head+n-1 (lane
 * k < n holds message head + k's checksum, len and tag) written as whole
 * 64-byte lines - the completion's 6 LL words and 2 pad words {f, 0} - four
 * lanes per line (lane 4m + p stores words 2p, 2p+1 of line m), eight lines
 * per store instruction.  Every slot is at least 64 bytes; words beyond the
 * completion's LL area are padding or longer completions' LL words, written
 * with the current f (harmless).  The caller uses answer() instead on a
 * refresh lap when the LL area is longer than the line (comp_size > 24).
 * Tag answers (comp_size 0): lane k < n stores its completion's 16 bytes -
 * one store instruction for the burst. */
__device__ __forceinline__ void answer_lines(const gdrpy_chan_desc_t &d, const answer_lane &al,
                                             u64 comp_head, u64 head, unsigned n, u32 csum,
                                             u32 len, u32 tag)
{
    const unsigned full = 0xffffffffu;
    const unsigned lane = threadIdx.x & 31u;
    if (al.stores == 1u) { /* tag answers: lane k's, one store instruction */
        if (lane < n) tag_answer(d, comp_head, lane, csum);
        return;
    }
    for (unsigned base = 0; base < n; base += 8) {
        const unsigned m = base + (lane >> 2);                  /* completion of this lane */
        const unsigned src = m < n ? m : 0u;
        const u32 c_m = __shfl_sync(full, csum, src);
        const u32 len_m = __shfl_sync(full, len, src);
        const u32 tag_m = __shfl_sync(full, tag, src);
        if (m < n) {
            const u64 j = comp_head + m, i1 = head + m + 1;
            const u32 f = (u32)(j + 1);
            const u32 a = al.pair == 0u ? tag_m : (al.pair == 1u ? (u32)i1 : c_m) & al.am;
            const u32 b = al.pair == 0u ? al.clen : (al.pair == 1u ? (u32)(i1 >> 32) : len_m) & al.bm;
            unsigned char *line = gdrpy_chan_comp_slot(d, j);
            gdrpy_st_relaxed_v2(line + 16u * al.pair, gdrpy_llword(f, a), gdrpy_llword(f, b));
        }
    }
}

/* What lanes 0..3 store of the answer to the next message, as far as it is
 * known before the message comes (serve() computes it before each idle
 * poll): the lane's 16 bytes of the answer line (slot), its two LL words
 * with the message's tag / checksum / length still zero (a, b: the
 * sequence pair, the padding pair, the length word are complete), and for
 * a message of the length the last one had (glen <= 8) the masks of its
 * payload's two words (m0, m1). */
struct answer_pre {
    u64 slot, a, b;
    u32 glen, m0, m1;
};

/* Lanes 0..3 store their 16 bytes of the answer line to message head: the
 * message's tag, checksum and length masked into answer_pre's words -
 * three-input logic ops, no branch (answer_lane's *_m masks). */
__device__ __forceinline__ void answer_line_store(const answer_lane &al, const answer_pre &pre,
                                                  u32 tag, u32 c, u32 len)
{
    const u32 f = (u32)pre.a;
    const u32 ah = (tag & al.tag_m) | (c & al.csum_m) | (u32)(pre.a >> 32);
    const u32 bh = (len & al.len_m) | (u32)(pre.b >> 32);
    if ((threadIdx.x & 31u) < al.stores)
        gdrpy_st_relaxed_v2((void *)pre.slot, gdrpy_llword(f, ah), gdrpy_llword(f, bh));
}

/* The same answer line, straight from the sampled words of a short LL
 * message (<= 8 bytes: header w0, w1 = {f, len}, payload words w2, w3):
 * two dp4a for the checksum, then answer_line_store.  When the message is
 * as long as the last one (pre.glen), its payload masks were computed
 * before it came; otherwise they come from len (one uniform branch).  The
 * caller has checked that every word the message needs carries its f. */
__device__ __forceinline__ void short_answer(const answer_lane &al, const answer_pre &pre, u64 w0,
                                             u32 len, u64 w2, u64 w3)
{
    u32 m0 = pre.m0, m1 = pre.m1;
    if (len != pre.glen) {
        m0 = low_bytes(len);
        m1 = len > 4u ? low_bytes(len - 4u) : 0u;
    }
    const u32 c = __dp4a((u32)(w3 >> 32) & m1, 0x08070605u, __dp4a((u32)(w2 >> 32) & m0, 0x04030201u, 0u));
    answer_line_store(al, pre, (u32)(w0 >> 32), c, len);
}

/* 1 when a completion in [j, j + n) is on a lap that rewrites every LL
 * word (see gdrpy_chan_comp_fill) - n <= 32, far below any nslots' laps of
 * 2^31 messages, so the two ends cover the range. */
__device__ __forceinline__ bool refresh_lap(const gdrpy_chan_desc_t &d, u64 j, unsigned n)
{
    return (j & 0x7fffffffull) < d.comp_nslots || ((j + n - 1) & 0x7fffffffull) < d.comp_nslots;
}

/* Check pattern of message i (gdrpy_chan_pattern): bytes 0..7 = i (little
 * endian), byte k >= 8 = (i * 131 + k) & 0xff.  Returns the number of
 * mismatching bytes seen by this lane (whole warp walks the payload). */
__device__ __forceinline__ u32 warp_pattern_errors(const volatile unsigned char *p, u32 len, u64 i)
{
    const unsigned lane = threadIdx.x & 31u;
    u32 bad = 0;
    for (u32 k = lane; k < len; k += 32) {
        unsigned char want = k < 8 ? (unsigned char)(i >> (8 * k))
                                   : (unsigned char)((i * 131ull + k) & 0xffu);
        bad += p[k] != want;
    }
    for (int o = 16; o > 0; o >>= 1) bad += __shfl_xor_sync(0xffffffffu, bad, o);
    return bad;
}

/* Samples of the slot per idle pp_poll() call, taken back to back: each
 * sample's two loads are issued as soon as the last one has been looked
 * at, and a short message is answered in the poll.  Only while the last
 * messages were short (<= 8 bytes, serve()'s short_last): measured on the
 * H100, back-to-back samples took 0.10 us off the 4-byte round trip but
 * added 0.12 us to the 32-byte one against one sample per serve() pass,
 * which is what longer messages keep.  serve()'s idle work (shutdown word,
 * clock, lazy consumed count) runs once per call. */
#define PP_IDLE_SAMPLES 16u

/* serve()'s idle poll: gdrpy_chan_poll_warp_pipe<K> (gdrpy_channel.cuh),
 * and when `fast` (an LL channel whose next completion slot is known to be
 * free and needs no refresh lap; one load in flight, K == 1) back-to-back
 * samples of the slot's first 32 bytes: a message of at most 8 bytes is
 * answered the moment it is seen - lanes 0..3 store the answer line from
 * its words and answer_pre (short_answer) - and *answered is set; serve()
 * then only does the bookkeeping.  A lane stores when its own words show
 * the whole message (every word it needs carries f), before the vote: the
 * warp's loads are one request each, so all lanes see the same words; were
 * they ever to differ, the vote fails, the message is answered later with
 * the same bytes (LL words carry their data: a repeated store changes
 * nothing), and the completion slot is not reused before this round's
 * bookkeeping.  A longer message is taken by gdrpy_chan_take in the same
 * pass.  Measured in place: 0.08 - 0.12 us off the 4- and 8-byte round
 * trip against a sample of all of the slot's LL words, a vote, then the
 * answer. */
template <int K>
__device__ __forceinline__ unsigned pp_poll(const gdrpy_chan_desc_t &d, u64 head,
                                            gdrpy_chan_in_t *in, unsigned gap, bool fast,
                                            const answer_lane &al, const answer_pre &pre,
                                            bool *answered)
{
    const unsigned full = 0xffffffffu;
    if (K > 1 || !fast) return gdrpy_chan_poll_warp_pipe<K>(d, head, in, gap, 4u);
    /* back-to-back samples of the slot's first 32 bytes: the header and
     * 8 payload bytes, all a short message has.  One is answered from
     * the loaded words (short_answer: no loop, no vote before the
     * store); a longer one is taken by gdrpy_chan_take in the same pass */
    const unsigned char *s = gdrpy_chan_slot(d, head);
    const u32 f = (u32)(head + 1);
#pragma unroll 1
    for (unsigned r = 0; r < PP_IDLE_SAMPLES; ++r) {
        u64 w0, w1, w2, w3;
        gdrpy_ld_relaxed_v2(s, &w0, &w1);
        gdrpy_ld_relaxed_v2(s + 16, &w2, &w3);
        const bool hdr = (u32)w0 == f && (u32)w1 == f;
        const u32 len = (u32)(w1 >> 32);
        const bool mine =
            hdr && len <= 8u && (len == 0u || (u32)w2 == f) && (len <= 4u || (u32)w3 == f);
        if (mine) short_answer(al, pre, w0, len, w2, w3);
        if (__all_sync(full, mine)) {
            in->plain = nullptr;
            in->len = len;
            in->tag = (u32)(w0 >> 32);
            in->buf[0] = (u32)(w2 >> 32);
            in->buf[1] = len > 4u ? (u32)(w3 >> 32) : 0u;
            *answered = true;
            return 1u;
        }
        if (__any_sync(full, hdr) && __all_sync(full, gdrpy_chan_take(d, head, in))) return 1u;
    }
    return 0u;
}

/* The serving loop of both kernels.  check: verify every payload and tag;
 * `errors` (2 u64 in page-locked host memory, written by lane 0 only):
 * [0] mismatching messages, [1] first such index + 1.  complete: answer
 * every message.  Both slot formats (gdrpy_channel.cuh).  While idle every
 * lane polls slot head (pp_poll: one request per poll; measured on the
 * H100, a poll of 32 slots took ~590 ns, which the average message waited
 * half of); a short LL message found that way is answered by lanes 0..3
 * from their own copy (no vote, shuffle or divergence).  The round after
 * one that found messages looks at 32 slots (lane k takes message head +
 * k, LL: its words in registers): small messages are handled one per lane,
 * in parallel; a long one (plain area, global memory) by the whole warp.
 * The same protocol as gdrpy_chan_serve_warp (gdrpy_channel.cuh), with the
 * answers computed in registers and stored as whole lines. */
__device__ __forceinline__ void serve(const gdrpy_chan_desc_t &d, u64 idle_ns, bool check,
                                      bool complete, volatile u64 *errors)
{
    const unsigned full = 0xffffffffu;
    const unsigned lane = threadIdx.x & 31u;
    const bool ll = gdrpy_chan_is_ll(d);
    u64 head = 0, comp_head = 0, credit = 0, t_idle = 0, nerr = 0, published = 0;
    unsigned spins = 0, rounds = 0;
    gdrpy_chan_in_t in = {}; /* buf zeroed: words_checksum reads all of it */
    const answer_lane al = answer_lane_of(d);
    /* the idle poll's spacing with GDRPY_CHAN_POLL_PIPE > 1 loads in flight:
     * one load latency over the loads in flight; the latency is left in the
     * host block's spare word [20] for diagnostics (before attach: its
     * fence orders it) */
    unsigned gap = 0;
    if (GDRPY_CHAN_POLL_PIPE > 1) {
        const unsigned lat = __shfl_sync(full, gdrpy_chan_load_latency(d), 0);
        gap = (lat < 8192u ? lat : 8192u) / GDRPY_CHAN_POLL_PIPE; /* bounded: a preempted measurement */
        if (lane == 0) *(volatile u32 *)(d.host_ctrl + 20u) = lat;
    }
    if (lane == 0) gdrpy_chan_attach(d);
    __syncwarp();
    u32 status = GDRPY_CHAN_ST_STOPPED;
    bool burst = false; /* the last round found messages: look at 32 slots */
    /* the last round's messages were all short (<= 8 bytes): the idle poll
     * samples the slot back to back (pp_poll) - see PP_IDLE_SAMPLES */
    bool short_last = true;
    /* the length of the newest message while they are short: the next one
     * is guessed to be as long (answer_pre's payload masks) */
    u32 glen = 4u;
    for (;;) {
        /* idle: every lane polls slot head (one request); after a round
         * that found messages: lane k looks at head + k (a burst) */
        const bool one = !burst;
        /* what lanes 0..3 store of the answer to message head, as far as it
         * is known before the message comes (answer_pre): computed here,
         * while the poll waits, not after (the empty asm keeps the compiler
         * from sinking it below the poll) */
        answer_pre pre = {0, 0, 0, 0, 0, 0};
        if (one) {
            const u32 f = (u32)(comp_head + 1);
            const u64 i1 = head + 1;
            pre.slot = (u64)(gdrpy_chan_comp_slot(d, comp_head) + 16u * al.pair);
            pre.a = gdrpy_llword(f, al.pair == 1u ? (u32)i1 & al.am : 0u);
            pre.b = gdrpy_llword(f, al.pair == 0u ? al.clen : al.pair == 1u ? (u32)(i1 >> 32) & al.bm : 0u);
            pre.glen = glen;
            pre.m0 = low_bytes(glen);
            pre.m1 = glen > 4u ? low_bytes(glen - 4u) : 0u;
            asm volatile("" : "+l"(pre.slot), "+l"(pre.a), "+l"(pre.b), "+r"(pre.m0), "+r"(pre.m1));
        }
        /* the poll may answer a short message itself (pp_poll): only when
         * the single-message path below would answer it the same way */
        const bool fast = one && ll && complete && short_last && comp_head - credit < d.comp_nslots &&
                          (d.comp_size <= 24u || !refresh_lap(d, comp_head, 1));
        bool answered = false;
        const long long t_poll = clock64();
        unsigned n = one ? pp_poll<GDRPY_CHAN_POLL_PIPE>(d, head, &in, gap, fast, al, pre, &answered)
                         : gdrpy_chan_poll_warp_in(d, head, &in);
        /* an empty pipelined call: learn the spacing from what it took */
        if (GDRPY_CHAN_POLL_PIPE > 1 && one && n == 0 && ll)
            gap = gdrpy_chan_pipe_gap(gap, clock64() - t_poll, GDRPY_CHAN_POLL_PIPE, 4u);
        burst = n != 0;
        if (n == 0) {
            u32 stop = gdrpy_chan_idle_warp(d, head, idle_ns, &spins, &t_idle);
            if (stop) { status = stop; break; }
            if (ll && spins == 64u && lane == 0) gdrpy_chan_consume_lazy(d, head, &published, true);
            continue;
        }
        spins = 0;
        t_idle = 0;
        short_last = __all_sync(full, lane >= n || (!in.plain && in.len <= 8u));
        if (short_last) glen = __shfl_sync(full, in.len, n - 1u); /* the newest message's */
        if (complete && !gdrpy_chan_comp_wait_warp(d, comp_head + n - 1, &credit, idle_ns)) {
            status = GDRPY_CHAN_ST_TIMEOUT;
            break;
        }
        if (one && ll && !in.plain && (!complete || d.comp_size <= 24u || !refresh_lap(d, comp_head, 1))) {
            /* one short LL message, the same in every lane: no vote, no
             * shuffle, no divergence on the way to its answer line */
            if (complete && !answered)
                answer_line_store(al, pre, in.tag, words_checksum(in.buf, in.len), in.len);
            if (check && lane == 0 && (words_pattern_errors(in.buf, in.len, head) || in.tag != (u32)head)) {
                if (nerr++ == 0) errors[1] = head + 1;
                errors[0] = nerr;
            }
        } else {
        /* messages this lane can do alone: LL ones (payload in its local
         * memory) and short plain-area ones */
        bool small = __all_sync(full, lane >= n || in.len <= SMALL_MSG || !in.plain);
        if (small) {
            bool bad = false;
            u32 c = 0;
            if (lane < n && complete) c = in_checksum(in);
            if (complete) {
                if (ll && (d.comp_size <= 24u || !refresh_lap(d, comp_head, n)))
                    answer_lines(d, al, comp_head, head, n, c, in.len, in.tag);   /* all lanes */
                else if (lane < n)
                    answer(d, comp_head + lane, head + lane, c, in.len, in.tag);
            }
            if (lane < n) {
                u64 i = head + lane;
                bad = check && (in_pattern_errors(in, i) || in.tag != (u32)i);
            }
            unsigned badmask = __ballot_sync(full, bad);
            if (lane == 0 && badmask) {
                if (nerr == 0) errors[1] = head + (unsigned)(__ffs(badmask) - 1) + 1;
                nerr += (u64)__popc(badmask);
                errors[0] = nerr;
            }
        } else {
            for (unsigned m = 0; m < n; ++m) {
                u32 len = __shfl_sync(full, in.len, m);
                u32 tag = __shfl_sync(full, in.tag, m);
                const volatile unsigned char *msg = (const volatile unsigned char *)
                    __shfl_sync(full, (unsigned long long)in.plain, m);
                u32 c = 0, bad = 0;
                if (!msg) {                     /* the payload is lane m's */
                    if (lane == m) {
                        c = in_checksum(in);
                        bad = check ? in_pattern_errors(in, head + m) : 0u;
                    }
                    c = __shfl_sync(full, c, m);
                    bad = __shfl_sync(full, bad, m);
                } else {
                    c = warp_checksum(msg, len);
                    if (check) bad = warp_pattern_errors(msg, len, head + m);
                }
                if (check && lane == 0 && (bad || tag != (u32)(head + m))) {
                    if (nerr++ == 0) errors[1] = head + m + 1;
                    errors[0] = nerr;
                }
                if (complete && lane == 0) answer(d, comp_head + m, head + m, c, len, tag);
            }
        }
        }
        __syncwarp();
        u32 mode = 0;
        if (lane == 0) {
            if (ll) {
                gdrpy_chan_consume_lazy(d, head + n, &published, false);
            } else if (complete) {
                gdrpy_chan_comp_publish_n(d, comp_head, n);
                gdrpy_chan_consume_after_publish(d, head + n);
            } else {
                gdrpy_chan_consume(d, head + n);
            }
            if ((++rounds & 15u) == 0) mode = gdrpy_chan_shutdown_mode(d);
        }
        if (complete) comp_head += n;
        head += n;
        mode = __shfl_sync(full, mode, 0);
        if (mode == GDRPY_CHAN_ABORT) break;     /* checked every 16 busy rounds */
    }
    __syncwarp();
    if (lane == 0) {
        /* the learned per-load time of the poll, where the start-up
         * measurement was (before the stop's fence and status) */
        if (GDRPY_CHAN_POLL_PIPE > 1) *(volatile u32 *)(d.host_ctrl + 20u) = gap * GDRPY_CHAN_POLL_PIPE;
        gdrpy_chan_stop(d, head, status);
    }
}

/* Ping-pong server: answers every message (launch with 32 threads). */
extern "C" __global__ void gdrpy_pp_serve(gdrpy_chan_desc_t d, u64 idle_ns)
{
    if (threadIdx.x >= 32) return;
    serve(d, idle_ns, false, true, nullptr);
}

/* Checking consumer for the tests: verifies every message's pattern and tag
 * (errors: 2 u64 in page-locked host memory, see serve()), answers when
 * `complete`. */
extern "C" __global__ void gdrpy_chan_check(gdrpy_chan_desc_t d, u64 idle_ns, u64 *errors,
                                            u32 complete)
{
    if (threadIdx.x >= 32) return;
    serve(d, idle_ns, true, complete != 0, errors);
}

/* Echo server (examples/mpi_eager.py): every message comes back as a
 * completion carrying the same bytes (up to comp_size) and tag; the warp
 * copies each payload with 4-byte volatile loads and stores.  Launch with
 * 32 threads. */
extern "C" __global__ void gdrpy_chan_echo(gdrpy_chan_desc_t d, u64 idle_ns)
{
    if (threadIdx.x >= 32) return;
    const unsigned full = 0xffffffffu;
    const unsigned lane = threadIdx.x & 31u;
    const bool ll = gdrpy_chan_is_ll(d);
    u64 head = 0, credit = 0, t_idle = 0, published = 0;
    unsigned spins = 0, rounds = 0;
    gdrpy_chan_in_t in;
    if (lane == 0) gdrpy_chan_attach(d);
    __syncwarp();
    u32 status = GDRPY_CHAN_ST_STOPPED;
    for (;;) {
        unsigned n = gdrpy_chan_poll_warp_in(d, head, &in);
        if (n == 0) {
            u32 stop = gdrpy_chan_idle_warp(d, head, idle_ns, &spins, &t_idle);
            if (stop) { status = stop; break; }
            if (ll && spins == 64u && lane == 0) gdrpy_chan_consume_lazy(d, head, &published, true);
            continue;
        }
        spins = 0;
        t_idle = 0;
        if (!gdrpy_chan_comp_wait_warp(d, head + n - 1, &credit, idle_ns)) {
            status = GDRPY_CHAN_ST_TIMEOUT;
            break;
        }
        for (unsigned m = 0; m < n; ++m) {
            u32 len = __shfl_sync(full, in.len, m);
            u32 tag = __shfl_sync(full, in.tag, m);
            if (len > d.comp_size) len = d.comp_size;
            const volatile unsigned char *msg = (const volatile unsigned char *)
                __shfl_sync(full, (unsigned long long)in.plain, m);
            if (!msg) {
                /* the payload is lane m's (registers) */
                if (lane == m) gdrpy_chan_comp_fill_words(d, head + m, in.buf, len, tag);
                continue;
            }
            volatile unsigned char *c = gdrpy_chan_comp_payload(d, head + m);
            u32 nw = len >> 2;
            for (u32 k = lane; k < nw; k += 32)
                ((volatile u32 *)c)[k] = ((const volatile u32 *)msg)[k];
            for (u32 k = (nw << 2) + lane; k < len; k += 32) c[k] = msg[k];
            __syncwarp();
            if (lane == 0) gdrpy_chan_comp_header(d, head + m, len, tag);
        }
        __syncwarp();
        u32 mode = 0;
        if (lane == 0) {
            if (ll) {
                gdrpy_chan_consume_lazy(d, head + n, &published, false);
            } else {
                gdrpy_chan_comp_publish_n(d, head, n);
                gdrpy_chan_consume_after_publish(d, head + n);
            }
            if ((++rounds & 15u) == 0) mode = gdrpy_chan_shutdown_mode(d);
        }
        head += n;
        mode = __shfl_sync(full, mode, 0);
        if (mode == GDRPY_CHAN_ABORT) break;
    }
    __syncwarp();
    if (lane == 0) gdrpy_chan_stop(d, head, status);
}

/* The cuMemcpy path's one-shot kernel: checksum of `len` bytes at `payload`
 * (device memory), answer {seq, csum, len} to `resp` (device memory). */
extern "C" __global__ void gdrpy_pp_once(const unsigned char *payload, u32 len, u64 seq,
                                         gdrpy_answer *resp)
{
    if (threadIdx.x >= 32) return;
    u32 c = warp_checksum(payload, len);
    if (threadIdx.x == 0) {
        resp->seq = seq;
        resp->csum = c;
        resp->len = len;
    }
}
