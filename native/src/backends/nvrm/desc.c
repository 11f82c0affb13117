/*
 * desc.c - nvrm backend: reading CUDA's own records of its memory, without
 * faulting: the cuIpcGetMemHandle words (route C), and where CUDA describes
 * memory it gives no export for (route V).
 *
 * A cuMemCreate allocation without an exportable handle type, and the
 * physical chunks of a stream-ordered pool, are RM video-memory objects in
 * CUDA's RM client of this process.  CUDA names them in its own memory:
 *  - VMM: behind the opaque allocation handle (cuMemRetainAllocationHandle
 *    returns the address of CUDA's record of the allocation);
 *  - pools: in the pool's records of its chunks (the pool handle,
 *    CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, is the address of CUDA's pool),
 *    where a chunk's record holds its mapping base address next to the RM
 *    handle of the chunk.
 * Where exactly is undocumented; learn_vmm.c and learn_pool.c learn it once
 * per process and device on scratch memory of their own.  This file reads
 * it: a walk of the blocks behind a pointer (process_vm_readv: never a
 * fault), the places a descriptor names, and the per-pin rule that exactly
 * one of the named RM objects may be video memory of this process large
 * enough.  Route V (per pin) and learning both use it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "cudadrv.h"
#include "internal.h"
#include "nvrm.h"

#define RS_CLIENT_HANDLE_BASE_ 0xc1d00000u /* RM-generated client handles */

/* ---- reading CUDA's memory without faulting ---------------------------- */

/* Bytes readable at addr (up to n), or -1: process_vm_readv, else a pipe. */
static ssize_t read_some(uint64_t addr, void *buf, size_t n)
{
    if (addr < 4096 || addr >= (1ull << 47)) return -1;
    struct iovec l = {buf, n}, r = {(void *)(uintptr_t)addr, n};
    ssize_t k = process_vm_readv(getpid(), &l, 1, &r, 1, 0);
    if (k >= 0) return k > 0 ? k : -1;
    if (errno == EFAULT) return -1;
    /* process_vm_readv refused (seccomp, ENOSYS): write(2) from an unmapped
     * address gives EFAULT, never a fault. */
    int pfd[2];
    if (n > 4096 || pipe(pfd) != 0) return -1;
    ssize_t w = write(pfd[1], (const void *)(uintptr_t)addr, n);
    ssize_t got = w > 0 ? read(pfd[0], buf, (size_t)w) : -1;
    close(pfd[0]);
    close(pfd[1]);
    return got > 0 ? got : -1;
}

int nvrm_safe_read(uint64_t addr, void *buf, size_t n)
{
    return read_some(addr, buf, n) == (ssize_t)n ? 0 : -1;
}

/* ---- a breadth-first walk of the blocks behind a pointer --------------- */

int nvrm_is_client(uint32_t x) { return (x & 0xfff00000u) == RS_CLIENT_HANDLE_BASE_; }

static int plausible_ptr(uint64_t v) { return v >= 0x10000 && v < (1ull << 47) && !(v & 7); }

/* Addresses already in the walk: open addressing, capacity a power of two
 * at least twice the block cap (so a lookup always ends). */
struct addr_set {
    uint64_t *t;
    uint32_t mask;
};
static int aset_add(struct addr_set *s, uint64_t v)
{
    uint32_t i = (uint32_t)((v >> 3) * 0x9e3779b97f4a7c15ull >> 40) & s->mask;
    while (s->t[i]) {
        if (s->t[i] == v) return 0;
        i = (i + 1) & s->mask;
    }
    s->t[i] = v;
    return 1;
}

int nvrm_walk(uint64_t root, struct nvrm_blk *b, int maxb, int levels)
{
    int n = 0;
    ssize_t k = read_some(root, b[0].d, NVRM_WALK_L0);
    if (k < 64) return 0;
    uint32_t cap = 64;
    while (cap < 2u * (uint32_t)maxb) cap <<= 1;
    struct addr_set seen = {calloc(cap, sizeof(uint64_t)), cap - 1};
    if (!seen.t) return 0;
    aset_add(&seen, root);
    b[0].addr = root;
    b[0].parent = -1;
    b[0].off = 0;
    b[0].len = (uint16_t)(k & ~7);
    b[0].level = 0;
    n = 1;
    for (int i = 0; i < n; i++) {
        if (b[i].level >= levels) continue;
        for (uint32_t o = 0; o + 8 <= b[i].len && n < maxb; o += 8) {
            uint64_t v;
            memcpy(&v, b[i].d + o, 8);
            if (!plausible_ptr(v) || !aset_add(&seen, v)) continue;
            ssize_t got = read_some(v, b[n].d, NVRM_WALK_BLK);
            if (got < 64) continue;
            b[n].addr = v;
            b[n].parent = i;
            b[n].off = (uint16_t)o;
            b[n].len = (uint16_t)(got & ~7);
            b[n].level = (uint8_t)(b[i].level + 1);
            n++;
        }
    }
    free(seen.t);
    return n;
}

struct nvrm_path nvrm_path_of(const struct nvrm_blk *b, int i, uint32_t pos)
{
    struct nvrm_path p;
    memset(&p, 0, sizeof p);
    int chain[6], k = 0;
    for (int x = i; x > 0 && k < 5; x = b[x].parent) chain[k++] = x;
    p.hops = (uint8_t)k;
    for (int j = 0; j < k; j++) p.off[j] = b[chain[k - 1 - j]].off;
    p.off[k] = (uint16_t)pos;
    return p;
}

int nvrm_path_read(uint64_t root, const struct nvrm_path *p, void *out, size_t w)
{
    uint64_t a = root;
    for (int h = 0; h < p->hops; h++) {
        uint64_t v;
        if (nvrm_safe_read(a + p->off[h], &v, 8) || !plausible_ptr(v)) return -1;
        a = v;
    }
    return nvrm_safe_read(a + p->off[p->hops], out, w);
}

void nvrm_path_str(const struct nvrm_path *p, char *s, size_t n)
{
    size_t u = (size_t)snprintf(s, n, "h");
    for (int h = 0; h < p->hops && u < n; h++) u += (size_t)snprintf(s + u, n - u, "->[+0x%x]", p->off[h]);
    if (u < n) snprintf(s + u, n - u, "+0x%x", p->off[p->hops]);
}

/* ---- CUDA's IPC handle words (route C) ----------------------------------- */

int nvrm_ipc_words(uint64_t base, uint32_t w[16])
{
    CUipcMemHandle ih;
    memset(&ih, 0, sizeof ih);
    CUresult r = gp_cu.IpcGetMemHandle(&ih, base);
    if (r)
        return gp_cuda_err(0, r, "cuIpcGetMemHandle", "IPC handle of the allocation at 0x%llx",
                           (unsigned long long)base);
    memcpy(w, ih.reserved, 16 * sizeof(uint32_t));
    return 0;
}


/* ---- cuMemAlloc memory of our own, never freed --------------------------- */

/* cuMemFree of cuMemAlloc memory waits for every kernel running on the
 * legacy default stream (or a blocking stream): a kernel that never ends
 * would hang the pin that freed it.  So the backend's own cuMemAlloc
 * memory (route C's self-test scratch, the allocation that names CUDA's
 * client) is allocated once per device and slot and kept for the life of
 * the process: NVRM_KEPT slots, 76 KiB per device in all.  Before a slot is
 * reused it must still be the same allocation (range and buffer id): after
 * CUDA's context was destroyed and made anew, the address may belong to
 * someone else's allocation, and a new one is made. */
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint64_t base, size, id;
} kept[NVRM_MAX_DEV][NVRM_KEPT];

static uint64_t buffer_id(uint64_t p)
{
    uint64_t id = 0;
    return gp_cu.PointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p) ? 0 : id;
}

uint64_t nvrm_kept_alloc(int device, int k, size_t size)
{
    if (device < 0 || device >= NVRM_MAX_DEV || k < 0 || k >= NVRM_KEPT || !gp_cu.MemAlloc)
        return 0;
    pthread_mutex_lock(&kept_lock);
    uint64_t b = kept[device][k].base;
    CUdeviceptr rb = 0;
    size_t rs = 0;
    if (b && (kept[device][k].size != size || gp_cu.MemGetAddressRange(&rb, &rs, b) ||
              rb != b || rs != size || buffer_id(b) != kept[device][k].id))
        b = 0; /* not ours any more: a new one (the old one died with its context) */
    if (!b) {
        CUdeviceptr d = 0;
        if (gp_cu.MemAlloc(&d, size) == CUDA_SUCCESS) {
            b = d;
            kept[device][k].base = b;
            kept[device][k].size = size;
            kept[device][k].id = buffer_id(b);
        } else {
            kept[device][k].base = 0;
        }
    }
    pthread_mutex_unlock(&kept_lock);
    return b;
}

/* Word k of the IPC handle of kept cuMemAlloc memory of our own, or 0. */
static uint32_t kept_word(int device, int k)
{
    uint64_t d = nvrm_kept_alloc(device, 0, NVRM_KEPT0_SIZE);
    uint32_t w[16];
    return d && nvrm_ipc_words(d, w) == 0 ? w[k] : 0;
}

uint32_t nvrm_cuda_client(int device) { return kept_word(device, 12); }

uint32_t nvrm_cuda_handle(int device) { return kept_word(device, 13); }

/* ---- candidates a descriptor names -------------------------------------- */

static int add_pair(uint32_t *cli, uint32_t *obj, int n, int max, uint32_t c, uint32_t x)
{
    if (!x || !nvrm_is_client(c) || x == c) return n;
    for (int k = 0; k < n; k++)
        if (cli[k] == c && obj[k] == x) return n;
    if (n < max) {
        cli[n] = c;
        obj[n++] = x;
    }
    return n;
}

int nvrm_desc_vmm_candidates(const struct nvrm_vmm_desc *d, uint64_t handle, uint32_t *cli,
                             uint32_t *obj, int max)
{
    uint32_t cs[NVRM_DESC_RULES + 1];
    int nc = 0, n = 0;
    if (d->cli_fixed) cs[nc++] = d->cli_fixed;
    for (int j = 0; j < d->ncli; j++)
        if (nvrm_path_read(handle, &d->cli[j], &cs[nc], 4) == 0) nc++;
    for (int i = 0; i < d->nobj; i++) {
        uint32_t x = 0;
        if (nvrm_path_read(handle, &d->obj[i], &x, 4)) continue;
        for (int j = 0; j < nc; j++) n = add_pair(cli, obj, n, max, cs[j], x);
    }
    return n;
}

/* Applies d's rules at every place of the walk b[nb] that holds mbase. */
int nvrm_pool_scan(const struct nvrm_pool_desc *d, const struct nvrm_blk *b, int nb,
                   uint64_t mbase, uint64_t msize, uint32_t *cli, uint32_t *obj, int max,
                   struct nvrm_pool_look *st)
{
    int n = 0;
    for (int i = 0; i < nb; i++)
        for (uint32_t o = 0; o + 8 <= b[i].len; o += 8) {
            uint64_t v;
            memcpy(&v, b[i].d + o, 8);
            if (v != mbase) continue;
            if (st) {
                if (!st->places || b[i].level < st->minlvl) st->minlvl = b[i].level;
                st->places++;
            }
            for (int r = 0; r < d->n; r++) {
                const struct nvrm_pool_rule *u = &d->r[r];
                int64_t ph = (int64_t)o + u->dh, pc = (int64_t)o + u->dc, ps = (int64_t)o + u->ds;
                if (!u->hop && (ph < 0 || ph + 4 > b[i].len)) continue;
                if (u->hop) {
                    int64_t pp = (int64_t)o + u->dp;
                    if (pp < 0 || pp + 8 > b[i].len || u->dh < 0) continue;
                }
                if (u->has_size) {
                    uint64_t sz;
                    if (ps < 0 || ps + 8 > b[i].len) continue;
                    memcpy(&sz, b[i].d + ps, 8);
                    if (sz != msize) continue;
                }
                uint32_t x = 0, c = u->cli_fixed;
                if (u->hop) {
                    uint64_t p;
                    memcpy(&p, b[i].d + o + u->dp, 8);
                    if (!plausible_ptr(p)) continue;
                    if (u->hop == 2 && (u->dp2 < 0 || nvrm_safe_read(p + (uint64_t)u->dp2, &p, 8) ||
                                        !plausible_ptr(p)))
                        continue;
                    if (nvrm_safe_read(p + (uint64_t)u->dh, &x, 4)) continue;
                } else {
                    memcpy(&x, b[i].d + ph, 4);
                }
                if (!c) {
                    if (pc < 0 || pc + 4 > b[i].len) continue;
                    memcpy(&c, b[i].d + pc, 4);
                }
                int before = n;
                n = add_pair(cli, obj, n, max, c, x);
                if (st && n > before && st->nrec < NVRM_LOOK_REC) {
                    st->rec_lvl[st->nrec] = b[i].level;
                    st->rec_rule[st->nrec++] = (uint8_t)r;
                }
            }
        }
    return n;
}

int nvrm_desc_pool_lookup(const struct nvrm_pool_desc *d, uint64_t pool, uint64_t mbase,
                          uint64_t msize, uint32_t *cli, uint32_t *obj, int max,
                          struct nvrm_pool_look *st)
{
    return nvrm_desc_pool_lookup_w(d, pool, mbase, msize, cli, obj, max, st, 0);
}

int nvrm_desc_pool_lookup_w(const struct nvrm_pool_desc *d, uint64_t pool, uint64_t mbase,
                            uint64_t msize, uint32_t *cli, uint32_t *obj, int max,
                            struct nvrm_pool_look *st, int wide_only)
{
    static const int caps[2][2] = {{NVRM_WALK_POOL_B, NVRM_WALK_POOL_L},
                                   {NVRM_WALK_POOL_BIG_B, NVRM_WALK_POOL_BIG_L}};
    struct nvrm_pool_look dummy;
    if (!st) st = &dummy;
    memset(st, 0, sizeof *st);
    int n = -1;
    /* the usual walk first; a pool with many chunks (or many other records
     * before them) may keep the chunk's record further away: a wider walk,
     * with the same rules (it only finds more places to apply them) */
    for (int w = wide_only ? 1 : 0; w < 2 && n <= 0; w++) {
        struct nvrm_blk *b = malloc((size_t)caps[w][0] * sizeof *b);
        if (!b) return -1;
        int nb = nvrm_walk(pool, b, caps[w][0], caps[w][1]);
        memset(st, 0, sizeof *st);
        st->nb = nb;
        st->full = nb >= caps[w][0];
        st->wide = w;
        n = nb ? nvrm_pool_scan(d, b, nb, mbase, msize, cli, obj, max, st) : -1;
        free(b);
        if (!nb) break;
    }
    return n;
}

/* The last resort of a lookup: every field holding mbase in this process's
 * anonymous private writable memory (the heaps where CUDA keeps its
 * records; regions backed by a file or a device, the stack and managed
 * memory are never read), each with the words around it as a block; the
 * same layouts are applied there.  A pool with many chunks may keep the
 * record of one of them deeper in a list than any walk from the pool
 * reaches. */
enum { HEAP_WIN = 256,
       HEAP_MAX_BLOCKS = 4096 };
static int heap_blocks(uint64_t mbase, struct nvrm_blk *b, int maxb, uint64_t *scanned)
{
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f) return 0;
    const size_t piece = 1u << 20;
    uint8_t *buf = malloc(piece);
    int n = 0;
    char line[512];
    *scanned = 0;
    while (buf && n < maxb && fgets(line, sizeof line, f)) {
        unsigned long long lo = 0, hi = 0, off = 0;
        char perm[8] = "", dev[16] = "";
        unsigned long ino = 0;
        int pos = 0;
        if (sscanf(line, "%llx-%llx %7s %llx %15s %lu %n", &lo, &hi, perm, &off, dev, &ino, &pos) < 6)
            continue;
        const char *path = line + pos;
        while (*path == ' ') path++;
        int anon = *path == '\n' || *path == 0 || !strncmp(path, "[heap]", 6);
        if (strncmp(perm, "rw-p", 4) || !anon || ino != 0) continue;
        /* A mapping larger than the whole budget (a sanitizer's shadow) is
         * skipped; it used to end the scan before the heaps after it. */
        if (hi - lo > (8ull << 30)) continue;
        if (*scanned + (hi - lo) > (8ull << 30)) break; /* 8 GiB at most */
        for (uint64_t a = lo; a < hi && n < maxb; a += piece) {
            size_t len = hi - a < piece ? (size_t)(hi - a) : piece;
            if (nvrm_safe_read(a, buf, len)) continue;
            *scanned += len;
            for (size_t o = 0; o + 8 <= len && n < maxb; o += 8) {
                uint64_t v;
                memcpy(&v, buf + o, 8);
                if (v != mbase) continue;
                /* the words around it, within its mapping (a record may sit
                 * at the start of a mapping of its own) */
                uint64_t at = a + o, w0 = at >= lo + HEAP_WIN ? at - HEAP_WIN : lo;
                ssize_t got = read_some(w0, b[n].d, 2 * HEAP_WIN + 8);
                if (got < (ssize_t)(at - w0 + 8)) continue;
                b[n].addr = w0;
                b[n].parent = -1;
                b[n].off = 0;
                b[n].len = (uint16_t)(got & ~7);
                b[n].level = 0;
                n++;
            }
        }
    }
    free(buf);
    fclose(f);
    return n;
}

int nvrm_desc_pool_lookup_heap(const struct nvrm_pool_desc *d, uint64_t mbase, uint64_t msize,
                               uint32_t *cli, uint32_t *obj, int max, struct nvrm_pool_look *st)
{
    memset(st, 0, sizeof *st);
    struct nvrm_blk *b = malloc((size_t)HEAP_MAX_BLOCKS * sizeof *b);
    if (!b) return -1;
    uint64_t scanned = 0;
    int nb = heap_blocks(mbase, b, HEAP_MAX_BLOCKS, &scanned);
    st->nb = nb;
    st->full = nb >= HEAP_MAX_BLOCKS;
    st->wide = 2;
    int n = nb ? nvrm_pool_scan(d, b, nb, mbase, msize, cli, obj, max, st) : 0;
    gp_log(1, "nvrm: heap scan for 0x%llx: %llu MiB read, %d fields hold it, %d candidates",
           (unsigned long long)mbase, (unsigned long long)(scanned >> 20), nb, n);
    free(b);
    return n;
}

int nvrm_desc_pool_candidates(const struct nvrm_pool_desc *d, uint64_t pool, uint64_t mbase,
                              uint64_t msize, uint32_t *cli, uint32_t *obj, int max)
{
    return nvrm_desc_pool_lookup(d, pool, mbase, msize, cli, obj, max, NULL);
}

int nvrm_dup_alive(struct nvrm_ctx *nc, const uint32_t *cli, const uint32_t *obj, int n,
                   uint64_t need, int exact, uint32_t *keep)
{
    if (n >= NVRM_MAX_CAND) return -1; /* the lookup may have dropped some */
    int kept = 0;
    for (int k = 0; k < n; k++) {
        uint32_t h = 0;
        if (nvrm_dup(nc, cli[k], obj[k], &h, "route V: an RM object CUDA's record names"))
            continue;
        uint64_t sz = 0;
        if (nvrm_class_of(nc, h) == NVRM_CLASS_LOCAL_USER &&
            ((sz = nvrm_obj_size(nc, h)) == 0 || (exact ? sz == need : sz >= need))) {
            keep[kept++] = h;
            continue;
        }
        nvrm_rm_free(nc, nc->hDevice, h, "route V: freeing a candidate");
        nvrm_live_add(&nc->n_mem, -1);
    }
    return kept;
}
