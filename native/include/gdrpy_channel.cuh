/*
 * gdrpy_channel.cuh - device side of the gdrpy message channel
 * (gdrpy_channel.h): helpers for persistent kernels.  Header-only CUDA C++,
 * usable with nvcc and NVRTC (it includes nothing).  `python -m gdrpy
 * includedir` prints where it is.
 *
 * Usage (one warp serves the channel; see gdrpy_chan_serve_warp below):
 *
 *   #include "gdrpy_channel.cuh"
 *   extern "C" __global__ void k(gdrpy_chan_desc_t d, unsigned long long idle_ns) {
 *       if (threadIdx.x >= 32) return;      // one warp serves
 *       gdrpy_chan_serve_warp(d, idle_ns,
 *           [](unsigned long long i, const volatile unsigned char *msg,
 *              unsigned len, unsigned tag, unsigned char *out) -> int {
 *               out[0] = msg[0];            // build the completion
 *               return 1;                   // its length; < 0: no completion
 *           });
 *   }
 *
 * Slot formats (gdrpy_channel.h): LL (the default) and PLAIN
 * ----------------------------------------------------------
 * LL: every 8-byte word of a slot carries the message's 32-bit sequence
 * number f = (u32)(i + 1) in its low half: word 0 {f, tag}, word 1 {f, len},
 * word 2+k {f, payload bytes 4k..4k+3}.  Messages (and completions) of at
 * most GDRPY_CHAN_LL_MAX bytes are LL words only; the reader loads the words
 * with relaxed (volatile, ld.relaxed.sys) loads and takes the message when
 * every word it needs carries f.  No ordering between locations is needed:
 * an aligned 8-byte store - the CPU's through BAR1, the GPU's into mapped
 * host memory - is one single-copy-atomic access, so a word that carries f
 * carries its data.  That is why the LL poll is a plain load (no acquire,
 * no fence) and the LL completion is plain stores (no fence): the two
 * system-scope barriers that dominated the PLAIN round trip are gone.
 * Longer payloads use the slot's plain area, published with a release:
 * host payload, sfence, words 1 and 0 (the kernel confirms word 0 with
 * ld.acquire.sys before it reads the payload); kernel payload,
 * __threadfence_system(), words 1 and 0 (x86 loads are ordered).
 * Slot reuse needs the consumer's loads of a slot to be done before the
 * producer overwrites it: the kernel publishes its consumed count with a
 * st.release.sys - lazily on LL channels (gdrpy_chan_consume_lazy: every
 * nslots/2 messages, and when idle), the host reads it with an acquire.
 * gdrpy_chan_take()/gdrpy_chan_poll_warp_in() and gdrpy_chan_comp_fill()
 * implement both formats; gdrpy_chan_ready()/gdrpy_chan_msg() read PLAIN
 * rings only.
 *
 * Memory-ordering argument (PLAIN)
 * --------------------------------
 * host -> GPU.  The CPU writes a message's payload and len/tag, executes
 * sfence, then writes the slot's 64-bit sequence word (seq = index + 1) with
 * one aligned store.  Write-combined stores separated by sfence leave the
 * core in order; they travel as PCIe posted writes to the GPU's BAR1, and
 * posted writes from one requester are not reordered on the way to the
 * same device; the GPU commits them to memory in order.  So when the kernel
 * *observes* seq == index + 1, the payload is already in GPU memory.  The
 * kernel must then (a) observe the sequence word with a load that is not
 * served from a stale cache line and that orders later loads after it:
 * `ld.acquire.sys` (sm_70+; older: volatile load + __threadfence_system()),
 * and (b) read the payload with loads that bypass the non-coherent L1
 * (volatile / ld.relaxed.sys): the slot was read on the previous lap and L1
 * might still hold those bytes.  gdrpy_chan_ready() and gdrpy_chan_msg()
 * do exactly this.
 *
 * GPU -> host.  The kernel writes a completion's payload and len/tag into
 * page-locked host memory (mapped into the device), then
 * __threadfence_system() (all those writes are visible to the CPU before any
 * later write), then the completion's sequence word.  The CPU spins on that
 * word (x86: a plain load; TSO keeps the payload loads after it).
 *
 * Slot reuse.  After the kernel has finished reading messages < n it
 * publishes n in host memory with a system-scope *release* store
 * (st.release.sys: the earlier payload loads are complete before the host
 * can see n and overwrite the slots).  The host publishes how many
 * completions it has read in GPU memory (through BAR1); the kernel reads it
 * with ld.acquire.sys before reusing a completion slot.
 *
 * Shutdown.  The host stores the number of messages sent, sfence, then the
 * mode word.  A kernel that sees mode DRAIN (acquire) therefore sees the
 * count and every message before it; it stops when it has consumed them
 * all.  ABORT: it stops at the next check.  Either way it publishes the
 * final consumed count, __threadfence_system(), then status STOPPED.
 */
#ifndef GDRPY_CHANNEL_CUH
#define GDRPY_CHANNEL_CUH

/* ---- ABI shared with gdrpy_channel.h ---------------------------------- */
#define GDRPY_CHAN_HDR 16u
#define GDRPY_CHAN_DEV_SHUTDOWN 0u
#define GDRPY_CHAN_DEV_SENT 8u
#define GDRPY_CHAN_DEV_COMP_READ 64u
#define GDRPY_CHAN_HOST_CONSUMED 0u
#define GDRPY_CHAN_HOST_SMID 16u
#define GDRPY_CHAN_HOST_STATUS 64u
#define GDRPY_CHAN_HOST_FINAL 72u
#define GDRPY_CHAN_HOST_PLACED 80u
#define GDRPY_CHAN_RUN 0u
#define GDRPY_CHAN_DRAIN 1u
#define GDRPY_CHAN_ABORT 2u
#define GDRPY_CHAN_ST_NONE 0u
#define GDRPY_CHAN_ST_RUNNING 1u
#define GDRPY_CHAN_ST_STOPPED 2u
#define GDRPY_CHAN_ST_TIMEOUT 3u
#define GDRPY_CHAN_PLAIN 1u
#define GDRPY_CHAN_NEAR 2u
#define GDRPY_CHAN_LL_MAX 64u

typedef unsigned long long gdrpy_u64;
typedef unsigned int gdrpy_u32;

typedef struct gdrpy_chan_desc {
    gdrpy_u64 dev_ctrl;
    gdrpy_u64 ring;
    gdrpy_u64 host_ctrl;
    gdrpy_u64 comp;
    gdrpy_u32 nslots, slot_stride, slot_size;
    gdrpy_u32 comp_nslots, comp_stride, comp_size;
    gdrpy_u32 flags;        /* GDRPY_CHAN_PLAIN or 0 (LL); GDRPY_CHAN_NEAR */
    gdrpy_u32 place_nslots; /* NEAR: physical slots (>= 2 * nslots), else 0 */
} gdrpy_chan_desc_t;

/* ---- system-scope loads and stores ------------------------------------ */
__device__ __forceinline__ gdrpy_u64 gdrpy_ld_acquire_sys_u64(const void *p)
{
    gdrpy_u64 v;
#if __CUDA_ARCH__ >= 700
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#else
    v = *(const volatile gdrpy_u64 *)p;
    __threadfence_system();
#endif
    return v;
}

__device__ __forceinline__ gdrpy_u32 gdrpy_ld_acquire_sys_u32(const void *p)
{
    gdrpy_u32 v;
#if __CUDA_ARCH__ >= 700
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
    v = *(const volatile gdrpy_u32 *)p;
    __threadfence_system();
#endif
    return v;
}

__device__ __forceinline__ void gdrpy_st_release_sys_u64(void *p, gdrpy_u64 v)
{
#if __CUDA_ARCH__ >= 700
    asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
#else
    __threadfence_system();
    *(volatile gdrpy_u64 *)p = v;
#endif
}

__device__ __forceinline__ gdrpy_u64 gdrpy_globaltimer(void)
{
    gdrpy_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* ---- addresses -------------------------------------------------------- */
/* NEAR: the slot table after the physical slots (gdrpy_chan_place). */
__device__ __forceinline__ gdrpy_u32 *gdrpy_chan_slot_table(const gdrpy_chan_desc_t &d)
{
    return (gdrpy_u32 *)(d.ring + (gdrpy_u64)d.place_nslots * d.slot_stride);
}

/* Message i's slot.  NEAR: through the slot table, which the attaching
 * thread wrote (a plain load, cached in L1: call it only after
 * gdrpy_chan_attach has returned on this warp - __syncwarp /
 * __syncthreads for other warps of the block; other blocks need a grid
 * sync (or a flag with release / acquire) before their first look). */
__device__ __forceinline__ unsigned char *gdrpy_chan_slot(const gdrpy_chan_desc_t &d, gdrpy_u64 i)
{
    gdrpy_u64 k = i & (d.nslots - 1);
    if (d.place_nslots) k = gdrpy_chan_slot_table(d)[k];
    return (unsigned char *)(d.ring + k * (gdrpy_u64)d.slot_stride);
}

__device__ __forceinline__ unsigned char *gdrpy_chan_comp_slot(const gdrpy_chan_desc_t &d,
                                                                gdrpy_u64 j)
{
    return (unsigned char *)(d.comp + (j & (d.comp_nslots - 1)) * (gdrpy_u64)d.comp_stride);
}

/* ---- LL helpers --------------------------------------------------------- */
__device__ __forceinline__ bool gdrpy_chan_is_ll(const gdrpy_chan_desc_t &d)
{
    return !(d.flags & GDRPY_CHAN_PLAIN);
}

/* LL data words and the plain area's offset of a slot of `size` bytes
 * (gdrpy_chan_slot_layout() in gdrpy_channel.h). */
__device__ __forceinline__ gdrpy_u32 gdrpy_chan_ll_words(gdrpy_u32 size)
{
    return ((size < GDRPY_CHAN_LL_MAX ? size : GDRPY_CHAN_LL_MAX) + 3u) / 4u;
}

__device__ __forceinline__ gdrpy_u32 gdrpy_chan_plain_off(const gdrpy_chan_desc_t &d,
                                                          gdrpy_u32 size)
{
    if (d.flags & GDRPY_CHAN_PLAIN) return GDRPY_CHAN_HDR;
    return (8u * (2u + gdrpy_chan_ll_words(size)) + 63u) & ~63u;
}

__device__ __forceinline__ void gdrpy_ld_relaxed_v2(const void *p, gdrpy_u64 *a, gdrpy_u64 *b)
{
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p)
                 : "memory");
}

__device__ __forceinline__ void gdrpy_st_relaxed_u64(void *p, gdrpy_u64 v)
{
    *(volatile gdrpy_u64 *)p = v;
}

/* p 16-byte aligned; each 8-byte element is one single-copy-atomic store */
__device__ __forceinline__ void gdrpy_st_relaxed_v2(void *p, gdrpy_u64 a, gdrpy_u64 b)
{
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b)
                 : "memory");
}

__device__ __forceinline__ gdrpy_u64 gdrpy_llword(gdrpy_u32 f, gdrpy_u32 data)
{
    return (gdrpy_u64)f | ((gdrpy_u64)data << 32);
}

/* A message as a consumer took it.  plain == NULL: the payload is in `buf`
 * (little-endian 4-byte words: an LL message, or a PLAIN one of at most 16
 * bytes) - thread-private, in registers when the caller indexes it with
 * constants (read it as words, not through a pointer: taking its address
 * puts it in local memory).  plain != NULL: the payload in place in global
 * memory (a long LL message's plain area, a PLAIN slot): read it through
 * that volatile pointer (never from a stale L1 line). */
typedef struct gdrpy_chan_in {
    const volatile unsigned char *plain;
    gdrpy_u32 len, tag;
    gdrpy_u32 buf[GDRPY_CHAN_LL_MAX / 4];
} gdrpy_chan_in_t;

/* The payload as one pointer either way (puts `buf` in local memory). */
__device__ __forceinline__ const volatile unsigned char *gdrpy_chan_in_payload(
    const gdrpy_chan_in_t *in)
{
    return in->plain ? in->plain : (const volatile unsigned char *)in->buf;
}

__device__ __forceinline__ const volatile unsigned char *gdrpy_chan_msg(
    const gdrpy_chan_desc_t &d, gdrpy_u64 i, gdrpy_u32 *len, gdrpy_u32 *tag);

/* LL: message f - 1 of slot s from its words: w0, w1 (header) and w[k] =
 * word 2 + k for k < `have` (the rest, if the message needs more, are
 * loaded here).  true when every word the message needs carries f; then
 * *in describes it. */
__device__ __forceinline__ bool gdrpy_chan_take_ll(const gdrpy_chan_desc_t &d, gdrpy_u32 f,
                                                   const unsigned char *s, gdrpy_u64 w0,
                                                   gdrpy_u64 w1,
                                                   gdrpy_u64 (&w)[GDRPY_CHAN_LL_MAX / 4],
                                                   gdrpy_u32 have, gdrpy_chan_in_t *in)
{
    if ((gdrpy_u32)w0 != f || (gdrpy_u32)w1 != f) return false;
    gdrpy_u32 len = (gdrpy_u32)(w1 >> 32);
    if (len > d.slot_size) len = d.slot_size;
    in->tag = (gdrpy_u32)(w0 >> 32);
    in->len = len;
    if (len > GDRPY_CHAN_LL_MAX) {
        if ((gdrpy_u32)gdrpy_ld_acquire_sys_u64(s) != f) return false;
        in->plain = s + gdrpy_chan_plain_off(d, d.slot_size);
        return true;
    }
    in->plain = nullptr;
    if (len <= 8u) {
        /* the common short message: its words came with the header (no
         * loop on the path from seeing it to answering it) */
        in->buf[0] = (gdrpy_u32)(w[0] >> 32);
        in->buf[1] = (gdrpy_u32)(w[1] >> 32);
        return (len == 0u || (gdrpy_u32)w[0] == f) && (len <= 4u || (gdrpy_u32)w[1] == f);
    }
    const gdrpy_u32 nw = (len + 3u) / 4u;
    /* words the caller did not load: all issued before any is looked at */
#pragma unroll
    for (gdrpy_u32 k = 2; k < GDRPY_CHAN_LL_MAX / 4; k += 2)
        if (k < nw && k >= have) gdrpy_ld_relaxed_v2(s + 16 + 8 * k, &w[k], &w[k + 1]);
    bool ok = true;
#pragma unroll
    for (gdrpy_u32 k = 0; k < GDRPY_CHAN_LL_MAX / 4; ++k)
        if (k < nw) {
            ok &= (gdrpy_u32)w[k] == f;
            in->buf[k] = (gdrpy_u32)(w[k] >> 32);
        }
    return ok;
}

/* One thread: true when message i is complete; `in` describes it.  LL: the
 * slot's first four words come in two 16-byte loads (header + 8 payload
 * bytes), the rest only when the message is longer; a long message is
 * confirmed with ld.acquire.sys of word 0.  PLAIN: the sequence word with
 * ld.acquire.sys, then len/tag and the first 16 payload bytes together. */
__device__ __forceinline__ bool gdrpy_chan_take(const gdrpy_chan_desc_t &d, gdrpy_u64 i,
                                                gdrpy_chan_in_t *in)
{
    if (d.flags & GDRPY_CHAN_PLAIN) {
        const unsigned char *ps = gdrpy_chan_slot(d, i);
        if (gdrpy_ld_acquire_sys_u64(ps) != i + 1) return false;
        gdrpy_u64 h = *(const volatile gdrpy_u64 *)(ps + 8), p0, p1;
        gdrpy_ld_relaxed_v2(ps + 16, &p0, &p1); /* inside the slot: its stride is >= 64 */
        gdrpy_u32 pl = (gdrpy_u32)h;
        in->len = pl < d.slot_size ? pl : d.slot_size;
        in->tag = (gdrpy_u32)(h >> 32);
        in->buf[0] = (gdrpy_u32)p0;
        in->buf[1] = (gdrpy_u32)(p0 >> 32);
        in->buf[2] = (gdrpy_u32)p1;
        in->buf[3] = (gdrpy_u32)(p1 >> 32);
        in->plain = in->len <= 16u ? nullptr : ps + GDRPY_CHAN_HDR;
        return true;
    }
    const unsigned char *s = gdrpy_chan_slot(d, i);
    gdrpy_u64 w0, w1, w[GDRPY_CHAN_LL_MAX / 4];
    /* every LL word the slot can hold, all loads issued before any is
     * looked at: one load latency whatever the message's length (16-byte
     * pairs stay inside the slot: see gdrpy_chan_slot_layout) */
    const gdrpy_u32 nwmax = gdrpy_chan_ll_words(d.slot_size);
    gdrpy_ld_relaxed_v2(s, &w0, &w1);
    gdrpy_ld_relaxed_v2(s + 16, &w[0], &w[1]);
#pragma unroll
    for (gdrpy_u32 k = 2; k < GDRPY_CHAN_LL_MAX / 4; k += 2)
        if (k < nwmax) gdrpy_ld_relaxed_v2(s + 16 + 8 * k, &w[k], &w[k + 1]);
    return gdrpy_chan_take_ll(d, (gdrpy_u32)(i + 1), s, w0, w1, w, nwmax, in);
}

/* ---- consumer side (host -> GPU) -------------------------------------- */
/* PLAIN rings: 1 when message i is complete (acquire: its payload is
 * visible after). */
__device__ __forceinline__ bool gdrpy_chan_ready(const gdrpy_chan_desc_t &d, gdrpy_u64 i)
{
    if (!(d.flags & GDRPY_CHAN_PLAIN)) { /* LL: every word it needs is there */
        gdrpy_chan_in_t in;
        return gdrpy_chan_take(d, i, &in);
    }
    return gdrpy_ld_acquire_sys_u64(gdrpy_chan_slot(d, i)) == i + 1;
}

/* PLAIN rings: message i's payload (call after gdrpy_chan_ready(d, i)
 * returned true): read it through this volatile pointer (never from a stale
 * L1 line).  LL rings: use gdrpy_chan_take() / gdrpy_chan_poll_warp_in(). */
__device__ __forceinline__ const volatile unsigned char *gdrpy_chan_msg(
    const gdrpy_chan_desc_t &d, gdrpy_u64 i, gdrpy_u32 *len, gdrpy_u32 *tag)
{
    const volatile unsigned char *s = gdrpy_chan_slot(d, i);
    gdrpy_u32 l = *(const volatile gdrpy_u32 *)(s + 8);
    if (len) *len = l < d.slot_size ? l : d.slot_size;
    if (tag) *tag = *(const volatile gdrpy_u32 *)(s + 12);
    return s + GDRPY_CHAN_HDR;
}

/* Messages < n are consumed: their slots may be reused by the host. */
__device__ __forceinline__ void gdrpy_chan_consume(const gdrpy_chan_desc_t &d, gdrpy_u64 n)
{
    gdrpy_st_release_sys_u64((void *)(d.host_ctrl + GDRPY_CHAN_HOST_CONSUMED), n);
}

__device__ __forceinline__ gdrpy_u32 gdrpy_chan_shutdown_mode(const gdrpy_chan_desc_t &d)
{
    /* a relaxed look first (the word is 0 nearly always), the acquire load
     * - which orders the later read of the sent count - only when set */
    if (*(const volatile gdrpy_u32 *)(d.dev_ctrl + GDRPY_CHAN_DEV_SHUTDOWN) == 0) return 0;
    return gdrpy_ld_acquire_sys_u32((const void *)(d.dev_ctrl + GDRPY_CHAN_DEV_SHUTDOWN));
}

/* Messages the host had sent when it asked for shutdown (read after
 * gdrpy_chan_shutdown_mode() returned non-zero). */
__device__ __forceinline__ gdrpy_u64 gdrpy_chan_sent(const gdrpy_chan_desc_t &d)
{
    return *(const volatile gdrpy_u64 *)(d.dev_ctrl + GDRPY_CHAN_DEV_SENT);
}

/* ---- producer side (GPU -> host) -------------------------------------- */
/* Waits until completion slot j is free (the host has read j - comp_nslots
 * and published it); *credit caches the host's count.  false on timeout
 * (timeout_ns from now; 0: no limit). */
__device__ __forceinline__ bool gdrpy_chan_comp_wait(const gdrpy_chan_desc_t &d, gdrpy_u64 j,
                                                     gdrpy_u64 *credit, gdrpy_u64 timeout_ns)
{
    if (j - *credit < d.comp_nslots) return true;
    gdrpy_u64 t0 = gdrpy_globaltimer();
    for (unsigned n = 0;; ++n) {
        *credit = gdrpy_ld_acquire_sys_u64((const void *)(d.dev_ctrl + GDRPY_CHAN_DEV_COMP_READ));
        if (j - *credit < d.comp_nslots) return true;
        if (timeout_ns && (n & 255u) == 0 && gdrpy_globaltimer() - t0 > timeout_ns) return false;
    }
}

/* All 32 lanes of one warp: gdrpy_chan_comp_wait() with *credit kept the
 * same in every lane (start it at 0 in every lane).  The common case - the
 * slot is known to be free from an earlier look - is one compare and a
 * uniform branch (no shuffle on the way to the answer); otherwise lane 0
 * waits (ld.acquire.sys of the host's count) and broadcasts the result and
 * the credit, and a __syncwarp() orders lane 0's acquire before every
 * lane's later stores into the freed slots (the host's loads of the old
 * completions happen before those stores).  Either way a lane only stores
 * into slots that an acquire load of this warp has seen freed. */
__device__ __forceinline__ bool gdrpy_chan_comp_wait_warp(const gdrpy_chan_desc_t &d, gdrpy_u64 j,
                                                          gdrpy_u64 *credit, gdrpy_u64 timeout_ns)
{
    if (j - *credit < d.comp_nslots) return true;
    int ok = 1;
    if ((threadIdx.x & 31u) == 0) ok = gdrpy_chan_comp_wait(d, j, credit, timeout_ns) ? 1 : 0;
    *credit = __shfl_sync(0xffffffffu, *credit, 0);
    ok = __shfl_sync(0xffffffffu, ok, 0);
    __syncwarp();
    return ok != 0;
}

/* LL: stores completion j's header words (after its payload is in the
 * plain area: one system-scope fence first).  PLAIN: stores len/tag (the
 * sequence word comes with gdrpy_chan_comp_publish*). */
__device__ __forceinline__ void gdrpy_chan_comp_header(const gdrpy_chan_desc_t &d, gdrpy_u64 j,
                                                       gdrpy_u32 len, gdrpy_u32 tag)
{
    unsigned char *s = gdrpy_chan_comp_slot(d, j);
    if (len > d.comp_size) len = d.comp_size;
    if (d.flags & GDRPY_CHAN_PLAIN) {
        *(volatile gdrpy_u64 *)(s + 8) = (gdrpy_u64)len | ((gdrpy_u64)tag << 32);
        return;
    }
    const gdrpy_u32 f = (gdrpy_u32)(j + 1);
    if ((j & 0x7fffffffull) < d.comp_nslots) /* the lap that rewrites every LL word */
        for (gdrpy_u32 k = 0; k < gdrpy_chan_ll_words(d.comp_size); ++k)
            gdrpy_st_relaxed_u64(s + 16 + 8 * k, gdrpy_llword(f, 0));
    __threadfence_system();
    gdrpy_st_relaxed_u64(s + 8, gdrpy_llword(f, len));
    gdrpy_st_relaxed_u64(s, gdrpy_llword(f, tag));
}

/* Where a completion payload written directly (not through comp_fill) goes:
 * PLAIN, or LL completions longer than GDRPY_CHAN_LL_MAX; then
 * gdrpy_chan_comp_header(). */
__device__ __forceinline__ unsigned char *gdrpy_chan_comp_payload(const gdrpy_chan_desc_t &d,
                                                                  gdrpy_u64 j)
{
    return gdrpy_chan_comp_slot(d, j) + gdrpy_chan_plain_off(d, d.comp_size);
}

/* Writes completion j: `len` bytes of `src` (<= comp_size) and its tag.
 * LL: complete when it returns - LL words (plain stores, no fence; every
 * (2^31 / comp_nslots)-th lap all of the slot's words), or for a long
 * payload the plain area, a system-scope fence, the header words.  PLAIN:
 * header and payload, the sequence word is still to be published
 * (gdrpy_chan_comp_publish / _n). */
__device__ __forceinline__ void gdrpy_chan_comp_fill(const gdrpy_chan_desc_t &d, gdrpy_u64 j,
                                                     const unsigned char *src, gdrpy_u32 len,
                                                     gdrpy_u32 tag)
{
    volatile unsigned char *s = gdrpy_chan_comp_slot(d, j);
    if (len > d.comp_size) len = d.comp_size;
    if (!(d.flags & GDRPY_CHAN_PLAIN)) {
        const gdrpy_u32 f = (gdrpy_u32)(j + 1);
        gdrpy_u32 words = (j & 0x7fffffffull) < d.comp_nslots ? gdrpy_chan_ll_words(d.comp_size) : 0u;
        if (len <= GDRPY_CHAN_LL_MAX) {
            const gdrpy_u32 nw = (len + 3u) / 4u;
            if (words < nw) words = nw;
            /* 16-byte stores (each 8-byte half single-copy atomic; one PCIe
             * write each), data words first, the header pair last */
            for (gdrpy_u32 k = 0; k < words; k += 2) {
                gdrpy_u32 v[2] = {0, 0};
                for (gdrpy_u32 b = 0; b < 8u; ++b)
                    if (4u * k + b < len) v[b >> 2] |= (gdrpy_u32)src[4u * k + b] << (8u * (b & 3u));
                gdrpy_st_relaxed_v2((void *)(s + 16 + 8 * k), gdrpy_llword(f, v[0]),
                                    gdrpy_llword(f, v[1]));
            }
            gdrpy_st_relaxed_v2((void *)s, gdrpy_llword(f, tag), gdrpy_llword(f, len));
            return;
        }
        volatile unsigned char *p = gdrpy_chan_comp_payload(d, j);
        for (gdrpy_u32 k = 0; k < len; ++k) p[k] = src[k];
        gdrpy_chan_comp_header(d, j, len, tag);
        return;
    }
    /* len and tag in one 8-byte store; the payload in 8-byte stores where
     * the source allows (each store is one PCIe write) */
    *(volatile gdrpy_u64 *)(s + 8) = (gdrpy_u64)len | ((gdrpy_u64)tag << 32);
    gdrpy_u32 k = 0;
    if ((((gdrpy_u64)src) & 7) == 0)
        for (; k + 8 <= len; k += 8)
            *(volatile gdrpy_u64 *)(s + GDRPY_CHAN_HDR + k) = *(const gdrpy_u64 *)(src + k);
    if ((((gdrpy_u64)src + k) & 3) == 0)
        for (; k + 4 <= len; k += 4)
            *(volatile gdrpy_u32 *)(s + GDRPY_CHAN_HDR + k) = *(const gdrpy_u32 *)(src + k);
    for (; k < len; ++k) s[GDRPY_CHAN_HDR + k] = src[k];
}

/* gdrpy_chan_comp_fill() from N 4-byte words held in registers (index them
 * with constants only: no local memory): `len` (<= 4*N <= GDRPY_CHAN_LL_MAX)
 * bytes of w, little-endian.  LL: 16-byte stores of word pairs, the header
 * pair last; complete when it returns.  PLAIN: header and payload, the
 * sequence word still to be published. */
template <int N>
__device__ __forceinline__ void gdrpy_chan_comp_fill_words(const gdrpy_chan_desc_t &d,
                                                           gdrpy_u64 j, const gdrpy_u32 (&w)[N],
                                                           gdrpy_u32 len, gdrpy_u32 tag)
{
    static_assert(N >= 1 && 4 * N <= (int)GDRPY_CHAN_LL_MAX, "at most LL_MAX bytes");
    unsigned char *s = gdrpy_chan_comp_slot(d, j);
    if (len > d.comp_size) len = d.comp_size;
    if (len > 4u * N) len = 4u * N;
    const gdrpy_u32 nw = (len + 3u) / 4u;
    if (d.flags & GDRPY_CHAN_PLAIN) {
        *(volatile gdrpy_u64 *)(s + 8) = (gdrpy_u64)len | ((gdrpy_u64)tag << 32);
#pragma unroll
        for (int k = 0; k < N; ++k)
            if ((gdrpy_u32)k < nw) {
                gdrpy_u32 v = w[k];
                if (4u * k + 4u > len) v &= 0xffffffffu >> (8u * (4u * k + 4u - len));
                if (4u * k + 4u <= d.comp_size) {
                    *(volatile gdrpy_u32 *)(s + GDRPY_CHAN_HDR + 4 * k) = v;
                } else {
                    for (gdrpy_u32 b = 0; 4u * k + b < len; ++b)
                        *(volatile unsigned char *)(s + GDRPY_CHAN_HDR + 4 * k + b) =
                            (unsigned char)(v >> (8u * b));
                }
            }
        return;
    }
    const gdrpy_u32 f = (gdrpy_u32)(j + 1);
#pragma unroll
    for (int k = 0; k < N; k += 2)
        if ((gdrpy_u32)k < nw) {
            gdrpy_u32 a = w[k], b = 0;
            if (k + 1 < N && (gdrpy_u32)(k + 1) < nw) b = w[k + 1];
            if (4u * k + 4u > len) a &= 0xffffffffu >> (8u * (4u * k + 4u - len));
            if (k + 1 < N && 4u * k + 8u > len && (gdrpy_u32)(k + 1) < nw)
                b &= 0xffffffffu >> (8u * (4u * k + 8u - len));
            gdrpy_st_relaxed_v2(s + 16 + 8 * k, gdrpy_llword(f, a), gdrpy_llword(f, b));
        }
    if ((j & 0x7fffffffull) < d.comp_nslots) /* the lap that rewrites every LL word */
        for (gdrpy_u32 k = (nw + 1u) & ~1u; k < gdrpy_chan_ll_words(d.comp_size); ++k)
            gdrpy_st_relaxed_u64(s + 16 + 8 * k, gdrpy_llword(f, 0));
    gdrpy_st_relaxed_v2(s, gdrpy_llword(f, tag), gdrpy_llword(f, len));
}

/* Publishes completion j: a system-scope release store of its sequence
 * word (everything this thread wrote before is visible to the host first). */
__device__ __forceinline__ void gdrpy_chan_comp_publish(const gdrpy_chan_desc_t &d, gdrpy_u64 j)
{
    if (!(d.flags & GDRPY_CHAN_PLAIN)) return; /* LL: comp_fill completed it */
    gdrpy_st_release_sys_u64(gdrpy_chan_comp_slot(d, j), j + 1);
}

/* One completion from one thread: wait for the slot, fill, publish. */
__device__ __forceinline__ bool gdrpy_chan_complete(const gdrpy_chan_desc_t &d, gdrpy_u64 j,
                                                    gdrpy_u64 *credit, const unsigned char *src,
                                                    gdrpy_u32 len, gdrpy_u32 tag,
                                                    gdrpy_u64 timeout_ns)
{
    if (!gdrpy_chan_comp_wait(d, j, credit, timeout_ns)) return false;
    gdrpy_chan_comp_fill(d, j, src, len, tag);
    gdrpy_chan_comp_publish(d, j);
    return true;
}

/* ---- near slots (GDRPY_CHAN_NEAR) ---------------------------------------- */
/* SM cycles of one atomic add of 0 on p (the value is unchanged; an
 * atomic is performed where the line is homed, so it shows whether that is
 * this SM's L2 partition, where a plain load of a cached line does not). */
__device__ __forceinline__ gdrpy_u32 gdrpy_chan_atomic_cycles(const void *p)
{
    gdrpy_u64 t0, t1;
    gdrpy_u32 v, w;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t0));
    asm volatile("atom.gpu.add.u32 %0, [%1], 0;" : "=r"(v) : "l"(p) : "memory");
    /* a use of the result that stays (an identity op would be dropped and
     * the clock read would not wait for the atomic) */
    asm volatile("add.u32 %0, %1, 1;" : "=r"(w) : "r"(v));
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t1));
    return (gdrpy_u32)(t1 - t0) + (w == 0u); /* +1 at most, when the word is ~0 */
}

/* The fewest SM cycles of `reps` atomics on p, at most 4095. */
__device__ __forceinline__ gdrpy_u32 gdrpy_chan_atomic_cycles_min(const void *p, int reps)
{
    gdrpy_u32 best = 4095u;
    for (int r = 0; r < reps; ++r) {
        const gdrpy_u32 c = gdrpy_chan_atomic_cycles(p);
        best = c < best ? c : best;
    }
    return best;
}

/* How many of the np cycle counts in t are at most `cut`. */
__device__ __forceinline__ gdrpy_u32 gdrpy_chan_count_le(const gdrpy_u32 *t, gdrpy_u32 np,
                                                         gdrpy_u32 cut)
{
    gdrpy_u32 c = 0;
    for (gdrpy_u32 p = 0; p < np; ++p) c += t[p] <= cut;
    return c;
}

/* One thread: chooses the n of the np >= 2 * n physical slots (stride bytes
 * apart from ring) whose first line is fastest to reach from this SM (the
 * best of three atomics each, clipped to 4095 cycles; ties: the lower
 * slots) and writes the slot table, in ring order, after the slots (its
 * first np words are the scratch for the cycle counts) and to host_table,
 * then PLACED (host_ctrl).  Scalars only, so that the caller's descriptor
 * stays out of local memory.  Called by gdrpy_chan_attach. */
static __device__ __noinline__ void gdrpy_chan_place(gdrpy_u64 ring, gdrpy_u32 np, gdrpy_u32 n,
                                              gdrpy_u32 stride, gdrpy_u64 host_table,
                                              gdrpy_u64 host_ctrl)
{
    gdrpy_u32 *t = (gdrpy_u32 *)(ring + (gdrpy_u64)np * stride);
    for (gdrpy_u32 p = 0; p < np; ++p)
        t[p] = gdrpy_chan_atomic_cycles_min((const void *)(ring + (gdrpy_u64)p * stride), 3);
    /* the smallest count `cut` with at least n slots at or below it */
    gdrpy_u32 lo = 0, hi = 4095u;
    while (lo < hi) {
        const gdrpy_u32 mid = (lo + hi) / 2u;
        if (gdrpy_chan_count_le(t, np, mid) >= n) hi = mid;
        else lo = mid + 1u;
    }
    gdrpy_u32 at_cut = n - (lo ? gdrpy_chan_count_le(t, np, lo - 1u) : 0u), k = 0;
    volatile gdrpy_u32 *host = (volatile gdrpy_u32 *)host_table;
    for (gdrpy_u32 p = 0; p < np && k < n; ++p) {
        const gdrpy_u32 c = t[p];
        if (c < lo || (c == lo && at_cut && at_cut--)) {
            t[k] = p; /* k <= p: the counts not yet read stay intact */
            host[k] = p;
            ++k;
        }
    }
    __threadfence_system(); /* the table before PLACED */
    *(volatile gdrpy_u32 *)(host_ctrl + GDRPY_CHAN_HOST_PLACED) = 1u;
}

/* ---- lifecycle -------------------------------------------------------- */
/* One thread, once per kernel, before any message is taken: NEAR channels
 * choose their slots here (gdrpy_chan_place; ~0.4 ms for 256 slots), then
 * the SM and the status RUNNING go to the host block. */
__device__ __forceinline__ void gdrpy_chan_attach(const gdrpy_chan_desc_t &d)
{
    if (d.place_nslots)
        gdrpy_chan_place(d.ring, d.place_nslots, d.nslots, d.slot_stride,
                         d.comp + (gdrpy_u64)d.comp_nslots * d.comp_stride, d.host_ctrl);
    gdrpy_u32 sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    *(volatile gdrpy_u32 *)(d.host_ctrl + GDRPY_CHAN_HOST_SMID) = sm;
    __threadfence_system(); /* the SM before the status (once per kernel) */
    *(volatile gdrpy_u32 *)(d.host_ctrl + GDRPY_CHAN_HOST_STATUS) = GDRPY_CHAN_ST_RUNNING;
    __threadfence_system();
}

/* Final report: consumed count, fence, then status (STOPPED or TIMEOUT). */
__device__ __forceinline__ void gdrpy_chan_stop(const gdrpy_chan_desc_t &d, gdrpy_u64 consumed,
                                                gdrpy_u32 status)
{
    *(volatile gdrpy_u64 *)(d.host_ctrl + GDRPY_CHAN_HOST_FINAL) = consumed;
    gdrpy_chan_consume(d, consumed);
    __threadfence_system();
    *(volatile gdrpy_u32 *)(d.host_ctrl + GDRPY_CHAN_HOST_STATUS) = status;
    __threadfence_system();
}

/* ---- warp-level building blocks --------------------------------------- */
/* All 32 lanes of one warp: the number of consecutive complete messages
 * from `head` (0..min(nslots, 32)); lane k polls message head + k with an
 * acquire load.  After a non-zero return every lane may read any of those
 * messages' payloads (each was observed with an acquire load by one lane,
 * and the warp-synchronous ballot orders the other lanes' later loads after
 * it; payload loads go through gdrpy_chan_msg()'s volatile pointer). */
__device__ __forceinline__ unsigned gdrpy_chan_poll_warp(const gdrpy_chan_desc_t &d,
                                                         gdrpy_u64 head)
{
    const unsigned full = 0xffffffffu;
    const unsigned lane = threadIdx.x & 31u;
    const unsigned window = d.nslots < 32u ? d.nslots : 32u;
    /* every lane polls its slot: one load latency per poll, not two */
    bool ready = lane < window && gdrpy_chan_ready(d, head + lane);
    unsigned mask = __ballot_sync(full, ready);
    return mask == full ? 32u : (unsigned)(__ffs(~mask) - 1);
}

/* All 32 lanes of one warp, both formats: the number n of consecutive
 * complete messages from `head` (0..min(nslots, 32)); lane k < n has
 * message head + k in *in (gdrpy_chan_take).  A long (plain-area) message's
 * payload may be read by any lane after the call (the taking lane's acquire
 * load, then the warp barrier of the ballot). */
#ifndef GDRPY_CHAN_POLL_LANES
#define GDRPY_CHAN_POLL_LANES 32u /* lanes that poll (1: lane 0 alone, no batches) */
#endif
__device__ __forceinline__ unsigned gdrpy_chan_poll_warp_in(const gdrpy_chan_desc_t &d,
                                                            gdrpy_u64 head, gdrpy_chan_in_t *in)
{
    const unsigned full = 0xffffffffu;
    const unsigned lane = threadIdx.x & 31u;
    const unsigned lanes = GDRPY_CHAN_POLL_LANES;
    const unsigned window = d.nslots < lanes ? d.nslots : lanes;
    bool ready = lane < window && gdrpy_chan_take(d, head + lane, in);
    unsigned mask = __ballot_sync(full, ready);
    return mask == full ? 32u : (unsigned)(__ffs(~mask) - 1);
}

/* All 32 lanes of one warp, both formats: every lane takes message `head`
 * (gdrpy_chan_take; the lanes load the same address: one request for the
 * warp).  1 in every lane when every lane took it, else 0; then every lane
 * holds the same message in *in.  Cheaper than gdrpy_chan_poll_warp_in()
 * (32 slots, a request each) for a warp that waits for the next message
 * alone: serving loops poll this way while idle and look at 32 slots only
 * right after a round that found messages (bursts). */
__device__ __forceinline__ unsigned gdrpy_chan_poll_warp_one(const gdrpy_chan_desc_t &d,
                                                             gdrpy_u64 head, gdrpy_chan_in_t *in)
{
    return __all_sync(0xffffffffu, gdrpy_chan_take(d, head, in)) ? 1u : 0u;
}

/* ---- pipelined idle poll (LL) ----------------------------------------- */
/* A strong load of GPU memory takes hundreds of SM cycles (~1000 measured on
 * an H100 for the channel's slot), and a poll loop with one load in flight
 * samples the slot once per load latency: a message that lands just after a
 * sample waits for the next one.  With K loads in flight, issued `gap`
 * cycles apart, the slot is sampled every gap cycles; each load is re-issued
 * as soon as its value has been looked at, so the spacing keeps itself.
 * Every load is the same relaxed LL load as gdrpy_chan_take's (the words
 * carry f), so nothing changes for ordering.  Measured on an H100 (round 5)
 * it did not pay: 4-byte round trips unchanged, messages of 32..64 bytes
 * 0.7..1.3 us slower (the rest of such a message is loaded behind the
 * samples still in flight); so the default is 1. */
#ifndef GDRPY_CHAN_POLL_PIPE
#define GDRPY_CHAN_POLL_PIPE 1 /* loads in flight while idle (1: one poll per latency) */
#endif

__device__ __forceinline__ void gdrpy_spin_cycles(unsigned n)
{
    const long long t0 = clock64();
    while (clock64() - t0 < (long long)n) {
    }
}

/* The latency of one relaxed load of the channel's device memory in SM
 * cycles: 32 dependent loads of the device block's first word (each address
 * depends on the previous value; the word is small, so it stays put). */
__device__ __forceinline__ unsigned gdrpy_chan_load_latency(const gdrpy_chan_desc_t &d)
{
    const unsigned char *base = (const unsigned char *)d.dev_ctrl;
    const unsigned char *p = base;
    const long long t0 = clock64();
#pragma unroll 1
    for (int k = 0; k < 32; ++k) {
        gdrpy_u64 v = *(const volatile gdrpy_u64 *)p;
        p = base + ((v >> 60) & 8u);
    }
    gdrpy_u64 v = *(const volatile gdrpy_u64 *)p; /* the last address is used */
    const long long t1 = clock64();
    unsigned lat = (unsigned)((t1 - t0) / 33);
    return v == 0x5a5a5a5a5a5a5a5aull ? lat + 1u : lat;
}

/* The spacing of the pipelined poll, learned from an empty call of
 * gdrpy_chan_poll_warp_pipe<k> that took `cycles` for `rounds` rounds: a
 * round waits for one load of the slot, and the slot's line (written by the
 * host through BAR1) may take longer to load than the device block that
 * gdrpy_chan_load_latency() measures; so the spacing follows what the poll
 * itself sees (a moving average; at most 8192 cycles per load).  Uniform in
 * the warp (lane 0's value). */
__device__ __forceinline__ unsigned gdrpy_chan_pipe_gap(unsigned gap, long long cycles, unsigned k,
                                                        unsigned rounds)
{
    long long per = (cycles - (long long)gap * (long long)(k - 1u)) / (long long)rounds;
    if (per < 0) per = 0;
    if (per > 8192) per = 8192;
    const unsigned g = ((unsigned)per / k + 3u * gap + 2u) / 4u;
    return __shfl_sync(0xffffffffu, g, 0);
}

/* All 32 lanes of one warp, uniform: gdrpy_chan_poll_warp_one() with K
 * loads of slot `head` in flight, `gap` cycles apart, for up to `rounds` x K
 * samples; 1 when every lane took message head (then *in holds it in every
 * lane), 0 when it has not come.  PLAIN channels and K == 1: one
 * gdrpy_chan_poll_warp_one() per call. */
template <int K>
__device__ __forceinline__ unsigned gdrpy_chan_poll_warp_pipe(const gdrpy_chan_desc_t &d,
                                                              gdrpy_u64 head, gdrpy_chan_in_t *in,
                                                              unsigned gap, unsigned rounds)
{
    const unsigned full = 0xffffffffu;
    if (K <= 1 || (d.flags & GDRPY_CHAN_PLAIN)) return gdrpy_chan_poll_warp_one(d, head, in);
    const unsigned char *s = gdrpy_chan_slot(d, head);
    const gdrpy_u32 f = (gdrpy_u32)(head + 1);
    gdrpy_u64 w[K > 1 ? K : 1][4];
#pragma unroll
    for (int k = 0; k < K; ++k) {
        if (k) gdrpy_spin_cycles(gap);
        gdrpy_ld_relaxed_v2(s, &w[k][0], &w[k][1]);
        gdrpy_ld_relaxed_v2(s + 16, &w[k][2], &w[k][3]);
    }
#pragma unroll 1
    for (unsigned r = 0; r < rounds; ++r) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            /* a message longer than 8 bytes: the rest of its words are
             * loaded now (one more load latency, as gdrpy_chan_take) */
            gdrpy_u64 rest[GDRPY_CHAN_LL_MAX / 4];
            rest[0] = w[k][2];
            rest[1] = w[k][3];
            if (__all_sync(full, gdrpy_chan_take_ll(d, f, s, w[k][0], w[k][1], rest, 2u, in)))
                return 1u;
            gdrpy_ld_relaxed_v2(s, &w[k][0], &w[k][1]);
            gdrpy_ld_relaxed_v2(s + 16, &w[k][2], &w[k][3]);
        }
    }
    return 0u;
}

/* Lane 0 only: publishes completions [first, first + n) whose headers and
 * payloads any lane of the warp has written (the caller __syncwarp()s
 * first).  One completion: a system-scope release store of its sequence
 * word (orders the earlier writes - the other lanes' too, made visible to
 * lane 0 by the warp barrier: release is cumulative - before it).  Several:
 * ONE __threadfence_system(), then the n sequence words. */
__device__ __forceinline__ void gdrpy_chan_comp_publish_n(const gdrpy_chan_desc_t &d,
                                                          gdrpy_u64 first, unsigned n)
{
    if (!(d.flags & GDRPY_CHAN_PLAIN)) return; /* LL: comp_fill completed them */
    if (n == 1) {
        gdrpy_st_release_sys_u64(gdrpy_chan_comp_slot(d, first), first + 1);
        return;
    }
    __threadfence_system();
    for (unsigned k = 0; k < n; ++k)
        *(volatile gdrpy_u64 *)gdrpy_chan_comp_slot(d, first + k) = first + k + 1;
}

/* Messages < n are consumed, right after gdrpy_chan_comp_publish_n() of
 * this round: that fence/release already ordered the round's payload loads
 * (whose values the completions carry) before it, so a plain store does. */
__device__ __forceinline__ void gdrpy_chan_consume_after_publish(const gdrpy_chan_desc_t &d,
                                                                 gdrpy_u64 n)
{
    if (!(d.flags & GDRPY_CHAN_PLAIN)) { /* LL completions are no release */
        gdrpy_chan_consume(d, n);
        return;
    }
    *(volatile gdrpy_u64 *)(d.host_ctrl + GDRPY_CHAN_HOST_CONSUMED) = n;
}

/* LL kernels (one thread): publish the consumed count `head` with a
 * system-scope release only every nslots/2 messages, or when `idle` (the
 * caller's poll has found nothing for a while) - one release per
 * nslots/2 messages instead of one per message; the host can always have
 * nslots/2 messages in flight without waiting for it.  *published: the
 * count last published (start at 0). */
__device__ __forceinline__ void gdrpy_chan_consume_lazy(const gdrpy_chan_desc_t &d,
                                                        gdrpy_u64 head, gdrpy_u64 *published,
                                                        bool idle)
{
    const gdrpy_u64 every = d.nslots > 1u ? d.nslots / 2u : 1u;
    if (head != *published && (idle || head - *published >= every)) {
        gdrpy_chan_consume(d, head);
        *published = head;
    }
}

/* Idle handling shared by serving loops (all lanes): 0 = keep polling,
 * else the status to stop with.  Looks at the shutdown word every 64th call
 * and at the clock every 256th; `*t_idle` is lane 0's start of idleness. */
__device__ __forceinline__ gdrpy_u32 gdrpy_chan_idle_warp(const gdrpy_chan_desc_t &d,
                                                         gdrpy_u64 head, gdrpy_u64 idle_ns,
                                                         unsigned *spins, gdrpy_u64 *t_idle)
{
    const unsigned full = 0xffffffffu;
    const unsigned lane = threadIdx.x & 31u;
    gdrpy_u32 stop = 0;
    /* *spins is the same in every lane: the common call is an increment
     * and a uniform branch (no shuffle in the poll loop) */
    if ((++*spins & 63u) != 0) return 0;
    if (lane == 0) {
        gdrpy_u32 mode = gdrpy_chan_shutdown_mode(d);
        if (mode == GDRPY_CHAN_ABORT || (mode == GDRPY_CHAN_DRAIN && head >= gdrpy_chan_sent(d)))
            stop = GDRPY_CHAN_ST_STOPPED;
        if (!stop && idle_ns && (*spins & 255u) == 0) {
            gdrpy_u64 now = gdrpy_globaltimer();
            if (*t_idle == 0) *t_idle = now;
            else if (now - *t_idle > idle_ns) stop = GDRPY_CHAN_ST_TIMEOUT;
        }
    }
    return __shfl_sync(full, stop, 0);
}

/* ---- a complete serving loop for one warp ----------------------------- */
/* Call from all 32 lanes of ONE warp (other warps must not call it).  Each
 * round takes the ready messages (up to 32; while idle it polls only the
 * next slot, with one request: gdrpy_chan_poll_warp_one) and lane k calls
 *     int handler(u64 index, const volatile unsigned char *payload,
 *                 u32 len, u32 tag, unsigned char *out)
 * for message head + k; it returns the completion's length (<= comp_size
 * and <= GDRPY_CHAN_MAX_COMP, written to `out`) or < 0 for no completion;
 * the completion carries the message's tag.  Completions keep message
 * order; one fence (or release store) per round publishes them all, then
 * the consumed count.  Stops on shutdown (drain: after every message sent;
 * abort: when idle, or after at most 16 busy rounds) or after idle_ns
 * without a message (0: never),
 * reporting STOPPED / TIMEOUT.  Returns the number of messages consumed.
 * (A plain lambda defined inside the kernel is a device lambda: no
 * __device__ annotation or --extended-lambda needed.) */
#ifndef GDRPY_CHAN_MAX_COMP
#define GDRPY_CHAN_MAX_COMP 64
#endif

template <class Handler>
__device__ gdrpy_u64 gdrpy_chan_serve_warp(const gdrpy_chan_desc_t &d, gdrpy_u64 idle_ns,
                                           Handler handler)
{
    const unsigned lane = threadIdx.x & 31u;
    const unsigned full = 0xffffffffu;
    const bool ll = gdrpy_chan_is_ll(d);
    gdrpy_u64 head = 0, comp_head = 0, credit = 0, t_idle = 0, published = 0;
    unsigned spins = 0, rounds = 0;
    unsigned char out[GDRPY_CHAN_MAX_COMP];
    gdrpy_chan_in_t in;
    unsigned gap = 0; /* the pipelined idle poll's spacing (GDRPY_CHAN_POLL_PIPE) */
    if (GDRPY_CHAN_POLL_PIPE > 1)
        gap = __shfl_sync(full, gdrpy_chan_load_latency(d), 0);
    if (gap > 8192u) gap = 8192u; /* bounded: a preempted measurement */
    gap /= GDRPY_CHAN_POLL_PIPE;
    if (lane == 0) gdrpy_chan_attach(d);
    __syncwarp();
    gdrpy_u32 status = GDRPY_CHAN_ST_STOPPED;
    bool burst = false; /* the last round found messages: look at 32 slots */
    for (;;) {
        /* idle: every lane polls slot head (one request per poll); after a
         * round that found messages, lane k looks at head + k */
        const long long t_poll = clock64();
        unsigned n = burst ? gdrpy_chan_poll_warp_in(d, head, &in)
                           : gdrpy_chan_poll_warp_pipe<GDRPY_CHAN_POLL_PIPE>(d, head, &in, gap, 4u);
        if (GDRPY_CHAN_POLL_PIPE > 1 && !burst && n == 0 && ll)
            gap = gdrpy_chan_pipe_gap(gap, clock64() - t_poll, GDRPY_CHAN_POLL_PIPE, 4u);
        burst = n != 0;
        if (n == 0) {
            gdrpy_u32 stop = gdrpy_chan_idle_warp(d, head, idle_ns, &spins, &t_idle);
            if (stop) { status = stop; break; }
            if (ll && spins == 64u && lane == 0) gdrpy_chan_consume_lazy(d, head, &published, true);
            continue;
        }
        spins = 0;
        t_idle = 0;
        int clen = -1;
        if (lane < n) {
            clen = handler(head + lane, gdrpy_chan_in_payload(&in), in.len, in.tag, out);
            if (clen > (int)d.comp_size) clen = (int)d.comp_size;
            if (clen > GDRPY_CHAN_MAX_COMP) clen = GDRPY_CHAN_MAX_COMP;
        }
        unsigned cmask = __ballot_sync(full, clen >= 0);
        unsigned ncomp = __popc(cmask);
        if (ncomp) {
            if (!gdrpy_chan_comp_wait_warp(d, comp_head + ncomp - 1, &credit, idle_ns)) {
                status = GDRPY_CHAN_ST_TIMEOUT;
                break;
            }
            if (clen >= 0)
                gdrpy_chan_comp_fill(d, comp_head + __popc(cmask & ((1u << lane) - 1u)), out,
                                     (gdrpy_u32)clen, in.tag);
            __syncwarp();
            if (lane == 0) gdrpy_chan_comp_publish_n(d, comp_head, ncomp);
            comp_head += ncomp;
        }
        head += n;
        __syncwarp();
        gdrpy_u32 mode = 0;
        if (lane == 0) {
            if (ll) gdrpy_chan_consume_lazy(d, head, &published, false);
            else if (ncomp) gdrpy_chan_consume_after_publish(d, head);
            else gdrpy_chan_consume(d, head);
            if ((++rounds & 15u) == 0) mode = gdrpy_chan_shutdown_mode(d);
        }
        mode = __shfl_sync(full, mode, 0);
        if (mode == GDRPY_CHAN_ABORT) break;     /* checked every 16 busy rounds */
    }
    __syncwarp();
    if (lane == 0) gdrpy_chan_stop(d, head, status);
    __syncwarp();
    return head;
}

#endif /* GDRPY_CHANNEL_CUH */
