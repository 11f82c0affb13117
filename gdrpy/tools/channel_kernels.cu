/*
 * channel_kernels.cu - persistent kernels on the gdrpy channel, used by
 * `python -m gdrpy bench pingpong`, the C tool gdrpy_chanpp and the GPU
 * tests.  Compiled at run time by NVRTC (gdrpy.tools.cuda_rt), with gdrpy's
 * include directory on the include path.  One warp serves a channel.
 *
 * Answer to message i (all kernels): one completion
 *     {u64 seq = i + 1, u32 checksum, u32 len}     (16 bytes)
 * with the message's tag; checksum = sum(byte[k] * ((k & 255) + 1)) mod 2^32
 * (gdrpy_chan_checksum).
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

/* The checksum of a message, computed by the whole warp (every lane gets
 * it).  Payloads start 16-byte aligned (slot stride 64, header 16). */
__device__ __forceinline__ u32 warp_checksum(const volatile unsigned char *p, u32 len)
{
    const unsigned lane = threadIdx.x & 31u;
    u32 c = 0;
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

/* The serving loop of both kernels.  check: verify every payload and tag;
 * `errors` (2 u64 in page-locked host memory, written by lane 0 only):
 * [0] mismatching messages, [1] first such index + 1.  complete: answer
 * every message.  Both slot formats (gdrpy_channel.cuh): each round lane k
 * takes message head + k (LL: its words in registers, one load latency);
 * small messages are handled one per lane, in parallel; a long one (plain
 * area, global memory) by the whole warp. */
__device__ __forceinline__ void serve(const gdrpy_chan_desc_t &d, u64 idle_ns, bool check,
                                      bool complete, volatile u64 *errors)
{
    const unsigned full = 0xffffffffu;
    const unsigned lane = threadIdx.x & 31u;
    const bool ll = gdrpy_chan_is_ll(d);
    u64 head = 0, comp_head = 0, credit = 0, t_idle = 0, nerr = 0, published = 0;
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
        if (complete) {
            int ok = 1;
            if (lane == 0) ok = gdrpy_chan_comp_wait(d, comp_head + n - 1, &credit, idle_ns) ? 1 : 0;
            ok = __shfl_sync(full, ok, 0);
            if (!ok) { status = GDRPY_CHAN_ST_TIMEOUT; break; }
        }
        /* messages this lane can do alone: LL ones (payload in its local
         * memory) and short plain-area ones */
        bool small = __all_sync(full, lane >= n || in.len <= SMALL_MSG ||
                                          in.len <= GDRPY_CHAN_LL_MAX);
        if (small) {
            bool bad = false;
            if (lane < n) {
                u64 i = head + lane;
                bad = check && (lane_pattern_errors(in.payload, in.len, i) || in.tag != (u32)i);
                if (complete) {
                    gdrpy_answer a = {i + 1, lane_checksum(in.payload, in.len), in.len};
                    gdrpy_chan_comp_fill(d, comp_head + lane, (const unsigned char *)&a,
                                         (u32)sizeof a, in.tag);
                }
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
                bool alone = len <= GDRPY_CHAN_LL_MAX && ll;   /* payload in lane m */
                u32 c = 0, bad = 0;
                if (alone) {
                    if (lane == m) {
                        c = lane_checksum(in.payload, len);
                        bad = check ? lane_pattern_errors(in.payload, len, head + m) : 0u;
                    }
                    c = __shfl_sync(full, c, m);
                    bad = __shfl_sync(full, bad, m);
                } else {
                    const volatile unsigned char *msg = (const volatile unsigned char *)
                        __shfl_sync(full, (unsigned long long)in.payload, m);
                    c = warp_checksum(msg, len);
                    if (check) bad = warp_pattern_errors(msg, len, head + m);
                }
                if (check && lane == 0 && (bad || tag != (u32)(head + m))) {
                    if (nerr++ == 0) errors[1] = head + m + 1;
                    errors[0] = nerr;
                }
                if (complete && lane == 0) {
                    gdrpy_answer a = {head + m + 1, c, len};
                    gdrpy_chan_comp_fill(d, comp_head + m, (const unsigned char *)&a,
                                         (u32)sizeof a, tag);
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
    if (lane == 0) gdrpy_chan_stop(d, head, status);
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
        int ok = 1;
        if (lane == 0) ok = gdrpy_chan_comp_wait(d, head + n - 1, &credit, idle_ns) ? 1 : 0;
        ok = __shfl_sync(full, ok, 0);
        if (!ok) { status = GDRPY_CHAN_ST_TIMEOUT; break; }
        for (unsigned m = 0; m < n; ++m) {
            u32 len = __shfl_sync(full, in.len, m);
            u32 tag = __shfl_sync(full, in.tag, m);
            if (len > d.comp_size) len = d.comp_size;
            if (ll && len <= GDRPY_CHAN_LL_MAX) {
                /* the payload is in lane m's registers/local memory */
                if (lane == m)
                    gdrpy_chan_comp_fill(d, head + m, (const unsigned char *)in.buf, len, tag);
                continue;
            }
            const volatile unsigned char *msg = (const volatile unsigned char *)
                __shfl_sync(full, (unsigned long long)in.payload, m);
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
