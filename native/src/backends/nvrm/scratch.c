/*
 * scratch.c - nvrm backend: checks on scratch memory of the backend's own,
 * the only memory it ever writes.  What the self-test and learning prove a
 * route or a layout with, before any memory of the caller's is pinned:
 *
 *   nvrm_scratch_check   the self-test's data check: a pattern copied in by
 *                        CUDA must read back through the mapping; only
 *                        then is one written through it and copied back by
 *                        CUDA (nvrm_report_* say what failed)
 * CUDA's copies here run on gdrpy's own non-blocking stream (cudadrv.h):
 * never ordered after the caller's kernels.
 *   nvrm_scratch_pattern a random pattern (learning writes it through CUDA)
 *   nvrm_scratch_holds   does an RM object hold it (read through BAR1)
 *   nvrm_scratch_names   is (client, object) video memory holding it
 *   nvrm_scratch_rule_picks  does the per-pin rule (desc.c) pick, among the
 *                        candidates, exactly the object holding it
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cudadrv.h"
#include "internal.h"
#include "nvrm.h"

/* GDRPY_NVRM_TEST_CORRUPT_ABI=2: the self-test maps this far past its data. */
#define CORRUPT_SKEW 65536

/* ---- the self-test's data check ----------------------------------------- */

double nvrm_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void nvrm_report_fail(struct nvrm_route_report *r, const char *step, const char *fmt, ...)
{
    r->ok = 0;
    snprintf(r->step, sizeof r->step, "%s", step);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->detail, sizeof r->detail, fmt, ap);
    va_end(ap);
}

/* The message of the last failure, with the RM status of the last ioctl
 * when it was not NV_OK. */
void nvrm_report_last(struct nvrm_route_report *r, const char *step, struct nvrm_ctx *nc)
{
    if (nvrm_last_rm_status != NV_OK)
        nvrm_report_fail(r, step, "%s [RM status %s, driver %s]", gdrpy_last_error(),
                         nvrm_nv_status_name(nvrm_last_rm_status), nc->version);
    else
        nvrm_report_fail(r, step, "%s [driver %s]", gdrpy_last_error(), nc->version);
}

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void fill_random(uint8_t *b, size_t n, uint64_t seed)
{
    uint64_t s = seed | 1;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = xorshift(&s);
        memcpy(b + i, &v, n - i < 8 ? n - i : 8);
    }
}

/* Data check of [dptr, dptr + NVRM_CHECK_BYTES) (scratch memory), which is
 * offset `rm_off` of RM memory `hMem`.  write_back 0: the read direction only
 * (used while searching for the IPC layout).  0, or -1 with r filled; -2
 * when the failure cannot be a wrong offset (a copy or the ioctl itself
 * failed, rather than RM refusing the range or the data differing). */
int nvrm_scratch_check(int device, struct nvrm_ctx *nc, uint32_t hMem, uint64_t rm_off,
                       uint64_t dptr, int write_back, struct nvrm_route_report *r)
{
    uint8_t p1[NVRM_CHECK_BYTES], p2[NVRM_CHECK_BYTES], got[NVRM_CHECK_BYTES];
    uint64_t seed = (uint64_t)nvrm_now_ms() * 1000003u ^ dptr ^ ((uint64_t)getpid() << 32);
    fill_random(p1, sizeof p1, seed);
    if (gp_cuda_private_copy(device, 0, dptr, p1, sizeof p1)) {
        nvrm_report_last(r, "copy of the scratch pattern to the device", nc);
        return -2;
    }
    struct nvrm_map m;
    uint64_t off = rm_off + (nc->st && nc->st->corrupt == 2 ? CORRUPT_SKEW : 0);
    if (nvrm_map_range(nc, hMem, off, NVRM_CHECK_BYTES, &m)) {
        nvrm_report_last(r, "map (RM_MAP_MEMORY + mmap)", nc);
        return nvrm_last_errno || nvrm_last_rm_status == NV_OK ? -2 : -1;
    }
    volatile uint8_t *bar = (volatile uint8_t *)m.mm + (off & ((uint64_t)nvrm_host_page() - 1));
    uint64_t wbase = dptr; /* bar points at the byte CUDA calls dptr */
    nvrm_read_mapped(bar, wbase, dptr, NVRM_CHECK_BYTES, got);
    int rc = 0;
    size_t k = 0;
    while (k < NVRM_CHECK_BYTES && got[k] == p1[k]) k++;
    if (k < NVRM_CHECK_BYTES) {
        nvrm_report_fail(r, "read through the mapping", "byte %zu of a pattern written with "
                                                        "CUDA reads 0x%02x through BAR1, expected 0x%02x: the mapping does "
                                                        "not show the scratch memory (ABI table %s, driver %s); nothing was written "
                                                        "through it",
                         k, got[k], p1[k], nc->abi.branch, nc->version);
        rc = -1;
    }
    if (!rc && write_back) {
        fill_random(p2, sizeof p2, seed ^ 0x9e3779b97f4a7c15ull);
        for (size_t i = 0; i < NVRM_CHECK_BYTES; i += 8) {
            uint64_t v;
            memcpy(&v, p2 + i, 8);
            *(volatile uint64_t *)(bar + i) = v;
        }
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        (void)*(volatile uint64_t *)(bar + NVRM_CHECK_BYTES - 8); /* drains WC buffers */
        if (gp_cuda_private_copy(device, 1, dptr, got, NVRM_CHECK_BYTES)) {
            nvrm_report_last(r, "copy back of bytes written through the mapping", nc);
            rc = -1;
        } else {
            k = 0;
            while (k < NVRM_CHECK_BYTES && got[k] == p2[k]) k++;
            if (k < NVRM_CHECK_BYTES) {
                nvrm_report_fail(r, "write through the mapping", "byte %zu written through BAR1 "
                                                                 "reads 0x%02x in CUDA's copy, expected 0x%02x (ABI table %s, "
                                                                 "driver %s)",
                                 k, got[k], p2[k], nc->abi.branch, nc->version);
                rc = -1;
            }
        }
    }
    nvrm_unmap_range(nc, hMem, &m);
    return rc;
}

/* ---- learning: a pattern of ours and the objects that hold it ------------ */

void nvrm_scratch_pattern(uint8_t *p, size_t n, uint64_t salt)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t s = ((uint64_t)ts.tv_nsec + 1) * 0x9e3779b97f4a7c15ull ^ salt ^ (uint64_t)(uintptr_t)p;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p[i] = (uint8_t)(s >> 24);
    }
}

/* Does RM object h (our dup) hold `pat` at rm_off?  Read only. */
int nvrm_scratch_holds(struct nvrm_ctx *nc, uint32_t h, uint64_t rm_off, const uint8_t *pat)
{
    const uint64_t hp = (uint64_t)nvrm_host_page();
    struct nvrm_map m;
    if ((rm_off & 7) || nvrm_map_range(nc, h, rm_off, NVRM_SCRATCH_PAT, &m)) return 0;
    uint8_t got[NVRM_SCRATCH_PAT];
    const volatile uint8_t *base = (const volatile uint8_t *)m.mm + (rm_off & (hp - 1));
    nvrm_read_mapped(base, rm_off, rm_off, NVRM_SCRATCH_PAT, got);
    nvrm_unmap_range(nc, h, &m);
    return memcmp(got, pat, NVRM_SCRATCH_PAT) == 0;
}

/* Is (cli, obj) video memory holding pat at rm_off?  (Dup freed again.) */
int nvrm_scratch_names(struct nvrm_ctx *nc, uint32_t cli, uint32_t obj, uint64_t rm_off,
                       const uint8_t *pat)
{
    uint32_t h = 0;
    if (!obj || obj == cli || nvrm_dup(nc, cli, obj, &h, "learning: candidate")) return 0;
    int ok = nvrm_class_of(nc, h) == NVRM_CLASS_LOCAL_USER && nvrm_scratch_holds(nc, h, rm_off, pat);
    nvrm_free_dups(nc, &h, 1, "learning: freeing a candidate");
    return ok;
}

/* The per-pin rule picks, among `n` candidates, the one holding pat: a
 * layout is confirmed only where it names exactly one live video-memory
 * object and that one holds pat (stricter than a user's pin, where route V
 * may tell several apart). */
int nvrm_scratch_rule_picks(struct nvrm_ctx *nc, const uint32_t *cli, const uint32_t *obj, int n,
                            uint64_t need, int exact, uint64_t rm_off, const uint8_t *pat)
{
    uint32_t h[NVRM_MAX_CAND];
    int kept = n > 0 ? nvrm_dup_alive(nc, cli, obj, n, need, exact, h) : -1;
    int ok = kept == 1 && nvrm_scratch_holds(nc, h[0], rm_off, pat);
    if (kept > 0) nvrm_free_dups(nc, h, kept, "learning: freeing a candidate");
    return ok;
}
