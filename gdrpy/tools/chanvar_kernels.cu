/*
 * chanvar_kernels.cu - the channel's round trip taken apart: one persistent
 * ping-pong kernel whose every protocol choice is a compile-time macro, for
 * `gdrpy_chanpp --variants` (native/tools/chanpp/chanvar.c, which owns the variant
 * table and the host side) and `python -m gdrpy bench pingpong --variants`
 * (compiles each variant with NVRTC).  Self-contained: includes nothing.
 *
 * Layout (each variant has its own regions):
 *   device (cuMemAlloc, pinned + BAR1-mapped by gdrpy; the host writes it):
 *     +0    u32 abort (host: 1 = stop)
 *     +64   u64 floor flag / +72 u32 floor data (VAR_FLOOR)
 *     +128  ring: 64 slots of 64 B {u64 seq, u32 len, u32 tag, u32 data}
 *           VAR_MSG=1: word 0 = seq32 | data << 32 (one 8-byte store)
 *   host (cuMemHostAlloc DEVICEMAP; the kernel writes it):
 *     +0 u64 consumed, +8 u32 status (1 running, 2 stopped, 3 idle timeout),
 *     +16 u64 bad messages, +24 u64 first bad index + 1, +32 u32 the kernel's SM,
 *     +64 floor flag / +72 floor data
 *     +128 completions: 64 slots of 64 B {u64 seq, u32 csum, u32 bad}
 *           VAR_PUB=3 (LL): {u32 seq32, u32 csum}, {u32 seq32, u32 bad}
 * Message i (from `start`): seq = i + 1, data = pat(i), len 4, tag (u32)i;
 * answer csum = data * 2654435761 + seq32 and bad = whether data/len/tag
 * were not those of message i (an ordering failure: a stale payload).
 *
 * Macros (defaults = the library's current design):
 *   VAR_FLOOR 0 | 1 pplat flag-only | 2 pplat data+flag (thread 0, volatile, no fences)
 *   floor-flag taken a step towards the channel's traffic (VAR_FLOOR 1 only):
 *   VAR_FRING 1: the flag word moves through the ring's 64 slot lines (message
 *             i = seq32 | data << 32 in slot i's word 0), not one fixed line
 *   VAR_CRING 1: the answer moves through the 64 completion lines
 *   VAR_CS    bytes between completions with VAR_CRING (64: one per line; 8,
 *             16, 32: several completions share a line)
 *   VAR_AW    0/1: answer = one 8-byte store | 2: two 8-byte stores (word 1,
 *             then word 0), each carrying seq32 | 8: the whole 64-byte line,
 *             four lanes x 16 bytes (every word = the answer word) | 16: one
 *             16-byte store | 32: two lanes x 16 bytes | 40: a 32-byte answer
 *             on the fixed line (two lanes), then the whole 64-byte completion
 *             line in the ring (four lanes): a mailbox the host reads, and the
 *             ring a channel must keep
 *   (VAR_MLINE, host only: the message is written as a whole 64-byte line)
 *   VAR_WARP  1 every lane polls slot head+lane, ballot (library) | 0 lane 0 alone
 *   VAR_POLL  0 ld.acquire.sys | 1 ld.acquire.gpu | 2 ld.relaxed.sys + fence.acq_rel.sys
 *             | 3 ld.volatile + fence.acq_rel.gpu | 4 ld.volatile alone
 *   VAR_MSG   0 seq word + header + payload | 1 seq32|data in one 8-byte word
 *   VAR_PUB   0 st.release.sys seq | 1 fence.sc.sys (__threadfence_system) + volatile seq
 *             | 2 fence.acq_rel.sys + volatile seq | 3 LL: every 8-byte word carries
 *             seq32 (volatile, no fence) | 4 volatile payload then volatile seq, no fence
 *   VAR_CONS  0 none | 1 st.release.sys consumed every message | 2 volatile consumed
 *             after the publish (library) | 3 st.release.sys every 32 messages (lazy)
 */
typedef unsigned long long u64;
typedef unsigned int u32;

#ifndef VAR_FLOOR
#define VAR_FLOOR 0
#endif
#ifndef VAR_WARP
#define VAR_WARP 1
#endif
#ifndef VAR_POLL
#define VAR_POLL 0
#endif
#ifndef VAR_MSG
#define VAR_MSG 0
#endif
#ifndef VAR_PUB
#define VAR_PUB 0
#endif
#ifndef VAR_CONS
#define VAR_CONS 2
#endif
#ifndef VAR_FRING
#define VAR_FRING 0
#endif
#ifndef VAR_CRING
#define VAR_CRING 0
#endif
#ifndef VAR_AW
#define VAR_AW 0
#endif
#ifndef VAR_CS
#define VAR_CS 64
#endif

#define CV_NSLOTS 64u
#define CV_RING 128u
#define CV_COMP 128u

__device__ __forceinline__ u32 cv_pat(u64 i) { return (u32)(i * 0x9E3779B97F4A7C15ull >> 32) ^ 0x5bd1e995u; }

__device__ __forceinline__ u64 cv_timer(void)
{
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* The sequence-word load of the poll (orders later loads after it where the
 * variant says so). */
__device__ __forceinline__ u64 cv_poll_load(const void *p)
{
    u64 v;
#if VAR_POLL == 0
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#elif VAR_POLL == 1
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#elif VAR_POLL == 2
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#else
    v = *(const volatile u64 *)p;
#endif
    return v;
}

/* After a poll load saw the word change (fence variants). */
__device__ __forceinline__ void cv_poll_fence(void)
{
#if VAR_POLL == 2
    asm volatile("fence.acq_rel.sys;" ::: "memory");
#elif VAR_POLL == 3
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
#endif
}

__device__ __forceinline__ void cv_st_release_sys(void *p, u64 v)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}

/* 1 when message i's sequence word is there. */
__device__ __forceinline__ bool cv_ready(const unsigned char *slot, u64 i)
{
#if VAR_MSG == 1
    return (u32)cv_poll_load(slot) == (u32)(i + 1);
#else
    return cv_poll_load(slot) == i + 1;
#endif
}

/* Reads message i (after cv_ready and the poll fence): data, and whether it
 * is not message i's. */
__device__ __forceinline__ u32 cv_read(const unsigned char *slot, u64 i, u32 *bad)
{
#if VAR_MSG == 1
    u64 w = *(const volatile u64 *)slot;
    u32 data = (u32)(w >> 32);
    *bad = (u32)w != (u32)(i + 1) || data != cv_pat(i);
#else
    u64 h = *(const volatile u64 *)(slot + 8);
    u32 data = *(const volatile u32 *)(slot + 16);
    *bad = (u32)h != 4u || (u32)(h >> 32) != (u32)i || data != cv_pat(i);
#endif
    return data;
}

/* Writes and publishes completion i. */
__device__ __forceinline__ void cv_publish(unsigned char *c, u64 i, u32 csum, u32 bad)
{
    u64 seq = i + 1;
#if VAR_PUB == 3
    *(volatile u64 *)(c + 8) = (u64)(u32)seq | ((u64)bad << 32);
    *(volatile u64 *)c = (u64)(u32)seq | ((u64)csum << 32);
#else
    *(volatile u64 *)(c + 8) = (u64)csum | ((u64)bad << 32);
#if VAR_PUB == 0
    cv_st_release_sys(c, seq);
#elif VAR_PUB == 1
    __threadfence_system();
    *(volatile u64 *)c = seq;
#elif VAR_PUB == 2
    asm volatile("fence.acq_rel.sys;" ::: "memory");
    *(volatile u64 *)c = seq;
#else
    *(volatile u64 *)c = seq;
#endif
#endif
}

__device__ __forceinline__ void cv_consumed(unsigned char *host, u64 n)
{
#if VAR_CONS == 1
    cv_st_release_sys(host, n);
#elif VAR_CONS == 2
    *(volatile u64 *)host = n;
#elif VAR_CONS == 3
    if ((n & 31u) == 0) cv_st_release_sys(host, n);
#endif
}

__device__ __forceinline__ void cv_note_bad(unsigned char *host, u64 i, u64 *nbad)
{
    if (*nbad == 0) *(volatile u64 *)(host + 24) = i + 1;
    *(volatile u64 *)(host + 16) = ++*nbad;
}

__device__ __forceinline__ void cv_stop(unsigned char *host, u64 head, u32 status)
{
    *(volatile u64 *)host = head;
    __threadfence_system();
    *(volatile u32 *)(host + 8) = status;
    __threadfence_system();
}

/* Idle check shared by the loops (caller: one thread): 0 = go on. */
__device__ __forceinline__ u32 cv_idle(const unsigned char *dev, u64 idle_ns, unsigned *spins,
                                       u64 *t_idle)
{
    if ((++*spins & 255u) != 0) return 0;
    if (*(const volatile u32 *)dev) return 2u;
    u64 now = cv_timer();
    if (*t_idle == 0) *t_idle = now;
    else if (idle_ns && now - *t_idle > idle_ns) return 3u;
    return 0;
}

extern "C" __global__ void gdrpy_chanvar(u64 dev_p, u64 host_p, u64 start, u64 idle_ns)
{
    unsigned char *dev = (unsigned char *)dev_p;
    unsigned char *host = (unsigned char *)host_p;
    const unsigned lane = threadIdx.x & 31u;
    if (threadIdx.x >= 32) return;
    u64 head = start, t_idle = 0, nbad = 0;
    unsigned spins = 0;
    u32 status = 2;
#if VAR_FLOOR == 1 && (VAR_AW == 8 || VAR_AW == 32 || VAR_AW == 40)
    if (lane >= (VAR_AW == 32 ? 2u : 4u)) return; /* lanes poll the same word, store 16 bytes each */
#elif VAR_FLOOR || !VAR_WARP
    if (lane != 0) return;
#endif
    if (lane == 0) {
        u32 sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        *(volatile u32 *)(host + 32) = sm;    /* the SM this round runs on */
        __threadfence_system();
        *(volatile u32 *)(host + 8) = 1u;
        __threadfence_system();
    }
#if VAR_FLOOR
    /* pplat: thread 0 polls a flag with volatile loads and answers with
     * volatile stores into mapped host memory; no fences. */
    for (;;) {
#if VAR_FRING
        const volatile u64 *flag = (const volatile u64 *)(dev + CV_RING + (head & (CV_NSLOTS - 1)) * 64u);
        const u64 w = *flag;
        const bool ready = (u32)w == (u32)(head + 1);
#else
        const volatile u64 *flag = (const volatile u64 *)(dev + 64);
        const u64 w = *flag;
        const bool ready = w == head + 1;
#endif
        if (!ready) {
            u32 st = cv_idle(dev, idle_ns, &spins, &t_idle);
            if (st) { status = st; break; }
            continue;
        }
        spins = 0;
        t_idle = 0;
#if VAR_FLOOR == 2
        u32 data = *(const volatile u32 *)(dev + 72);
        if (data != cv_pat(head)) cv_note_bad(host, head, &nbad);
        *(volatile u32 *)(host + 72) = data * 2654435761u + (u32)(head + 1);
        *(volatile u64 *)(host + 64) = head + 1;
#else
#if VAR_FRING
        if ((u32)(w >> 32) != cv_pat(head) && lane == 0) cv_note_bad(host, head, &nbad);
#endif
        unsigned char *c = VAR_CRING ? host + CV_COMP + (head & (CV_NSLOTS - 1)) * (u32)VAR_CS : host + 64;
#if VAR_AW == 2
        const u64 aw = (u64)(u32)(head + 1) | ((u64)cv_pat(head) * 2654435761u + (u32)(head + 1)) << 32;
        *(volatile u64 *)(c + 8) = aw;
        *(volatile u64 *)c = aw;
#elif VAR_AW == 40
        if (lane < 2)
            asm volatile("st.volatile.global.v2.u64 [%0], {%1, %1};" :: "l"(host + 64 + 16u * lane), "l"(head + 1) : "memory");
        asm volatile("st.volatile.global.v2.u64 [%0], {%1, %1};" :: "l"(host + CV_COMP + (head & (CV_NSLOTS - 1)) * 64u + 16u * lane), "l"(head + 1) : "memory");
#elif VAR_AW == 8 || VAR_AW == 16 || VAR_AW == 32
        asm volatile("st.volatile.global.v2.u64 [%0], {%1, %1};" :: "l"(c + 16u * lane), "l"(head + 1) : "memory");
#else
        *(volatile u64 *)c = head + 1;
#endif
#endif
        ++head;
    }
    if (lane == 0) cv_stop(host, head, status);
#else
    for (;;) {
#if VAR_WARP
        /* the library's poll: lane k looks at message head + k */
        const unsigned char *myslot = dev + CV_RING + ((head + lane) & (CV_NSLOTS - 1)) * 64u;
        bool r = cv_ready(myslot, head + lane);
        unsigned mask = __ballot_sync(0xffffffffu, r);
        unsigned n = mask == 0xffffffffu ? 32u : (unsigned)(__ffs(~mask) - 1);
        if (n == 0) {
            u32 st = 0;
            if (lane == 0) st = cv_idle(dev, idle_ns, &spins, &t_idle);
            st = __shfl_sync(0xffffffffu, st, 0);
            if (st) { status = st; break; }
            continue;
        }
        cv_poll_fence();
        spins = 0;
        t_idle = 0;
        u32 bad = 0;
        if (lane < n) {
            u32 data = cv_read(myslot, head + lane, &bad);
            unsigned char *c = host + CV_COMP + ((head + lane) & (CV_NSLOTS - 1)) * 64u;
            cv_publish(c, head + lane, data * 2654435761u + (u32)(head + lane + 1), bad);
        }
        unsigned badmask = __ballot_sync(0xffffffffu, bad != 0);
        __syncwarp();
        if (lane == 0) {
            for (unsigned k = 0; k < n; ++k)
                if (badmask & (1u << k)) cv_note_bad(host, head + k, &nbad);
            cv_consumed(host, head + n);
        }
        head += n;
#else
        const unsigned char *slot = dev + CV_RING + (head & (CV_NSLOTS - 1)) * 64u;
        if (!cv_ready(slot, head)) {
            u32 st = cv_idle(dev, idle_ns, &spins, &t_idle);
            if (st) { status = st; break; }
            continue;
        }
        cv_poll_fence();
        spins = 0;
        t_idle = 0;
        u32 bad;
        u32 data = cv_read(slot, head, &bad);
        unsigned char *c = host + CV_COMP + (head & (CV_NSLOTS - 1)) * 64u;
        cv_publish(c, head, data * 2654435761u + (u32)(head + 1), bad);
        if (bad) cv_note_bad(host, head, &nbad);
        cv_consumed(host, head + 1);
        ++head;
#endif
    }
    if (lane == 0) cv_stop(host, head, status);
#endif
}
