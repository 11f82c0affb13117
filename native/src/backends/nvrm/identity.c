/*
 * identity.c - nvrm backend: the identity proof.  Does an RM memory object
 * (a handle in our client) hold the bytes of the caller's CUDA allocation?
 * Read only: bytes read through a BAR1 mapping of the object are compared
 * with cuMemcpyDtoH of the same bytes, and nothing of the caller's is ever
 * written.
 *
 *   nvrm_identity / nvrm_verify_identity   one object: sampled at the first
 *                                         and last host page of the range
 *   nvrm_identity_pick                     several candidate objects: which
 *                                         one is the caller's memory
 *
 * Routes C and V call it on every pin (docs/nvrm.md: why it is enough, and
 * where it stops).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <string.h>

#include "cudadrv.h"
#include "internal.h"
#include "nvrm.h"

static int dtoh(gp_ctx *ctx, void *dst, uint64_t src, size_t n)
{
    return gp_cuda_memcpy(ctx->device, 1, src, dst, n, NULL);
}

/* One window of the read-only comparison: bytes [s, s + n) (n <= 64, inside
 * one host page) read through a BAR1 mapping of `hMem` (rm_off corresponds
 * to va) around a cuMemcpyDtoH of the same bytes, up to 3 tries: only a byte
 * that is stable across both BAR1 reads and differs from CUDA's copy counts
 * (a wrong object differs every time, a concurrent writer only now and
 * then).  0 with *bad = first differing offset or -1, *stable = bytes
 * compared; else the error of the mapping or the copy. */
static int compare_window(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t hMem, uint64_t va,
                          uint64_t rm_off, uint64_t s, uint64_t n, int *bad, size_t *stable,
                          uint8_t seen[64], uint8_t cuda[64])
{
    const uint64_t hp = (uint64_t)nvrm_host_page();
    const uint64_t page = gp_round_down(s, hp);
    const uint64_t wlo = page > va ? page : va; /* never map before va */
    struct nvrm_map m;
    int rc = nvrm_map_range(nc, hMem, rm_off + (wlo - va), page + hp - wlo, &m);
    if (rc) return rc;
    const volatile uint8_t *base =
        (const volatile uint8_t *)m.mm + ((rm_off + (wlo - va)) & (hp - 1));
    uint8_t r2[64];
    *bad = -1;
    *stable = 0;
    for (int attempt = 0; attempt < 3; attempt++) {
        nvrm_read_mapped(base, wlo, s, n, seen);
        rc = dtoh(ctx, cuda, s, n);
        if (rc) break;
        nvrm_read_mapped(base, wlo, s, n, r2);
        *bad = -1;
        *stable = 0;
        for (uint64_t k = 0; k < n; k++) {
            if (seen[k] != r2[k]) continue;
            ++*stable;
            if (cuda[k] != seen[k] && *bad < 0) *bad = (int)k;
        }
        if (*bad < 0) break;
    }
    nvrm_unmap_range(nc, hMem, &m);
    return rc;
}

/*
 * The identity check, read only.  Why it is enough for route C (docs/nvrm.md
 * has the long form):
 *  - what the IPC words mean was proven by the self-test on scratch memory
 *    of its own, where it may write: a pattern written by CUDA was read
 *    through the mapping and the reverse (route_c.c);
 *  - the words are CUDA's own description of this allocation (what another
 *    process would import), checked by nvrm_dup_legacy (route_c.c) against
 *    the allocation's size, page congruence, the RM object's size and, where
 *    the self-test found CUDA reports it, the documented mapping base address;
 *  - here, bytes read through BAR1 around a cuMemcpyDtoH of the same range
 *    must agree wherever they are stable (a concurrent writer can change
 *    bytes between the reads: those are not compared).  A mismatch refuses.
 * Nothing is ever written: a kernel or thread writing the buffer at the same
 * time loses nothing.
 */
int nvrm_verify_identity(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t hMem, uint64_t va,
                         uint64_t rm_off, uint64_t addr, uint64_t size)
{
    return nvrm_identity(ctx, nc, hMem, va, rm_off, addr, size, NULL);
}

int nvrm_identity(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t hMem, uint64_t va, uint64_t rm_off,
                  uint64_t addr, uint64_t size, int *differs)
{
    if (differs) *differs = 0;
    const uint64_t hp = (uint64_t)nvrm_host_page();
    const uint64_t end = addr + size;
    enum { SAMPLE = 64 };
    uint64_t win[2] = {gp_round_down(addr, hp), gp_round_down(end - 1, hp)};
    int nwin = win[1] != win[0] ? 2 : 1;
    size_t stable_total = 0;
    for (int i = 0; i < nwin; i++) {
        uint64_t s, n;
        if (i == 0) {
            s = addr;
            n = end - s < SAMPLE ? end - s : SAMPLE;
            if (s + n > win[0] + hp) n = win[0] + hp - s;
        } else {
            n = end - win[1] < SAMPLE ? end - win[1] : SAMPLE;
            s = end - n;
        }
        uint8_t seen[SAMPLE], cuda[SAMPLE];
        int bad;
        size_t stable;
        int rc = compare_window(ctx, nc, hMem, va, rm_off, s, n, &bad, &stable, seen, cuda);
        if (rc) return gp_err_prefix(rc, "identity check of the pin");
        if (bad >= 0 && differs) *differs = 1;
        if (bad >= 0)
            return gp_err(GDRPY_EIO, "identity check failed: byte 0x%llx read through BAR1 "
                                     "is 0x%02x where cuMemcpyDtoH sees 0x%02x (stable across reads, 3 "
                                     "tries), so the RM object found for this allocation does not "
                                     "hold its bytes on this driver (%s): refusing to pin",
                          (unsigned long long)(s + (uint64_t)bad), seen[bad], cuda[bad],
                          nc->version);
        stable_total += stable;
    }
    gp_log(1, "nvrm: identity of 0x%llx+%llu: %zu stable sampled bytes agree (no writes)",
           (unsigned long long)addr,
           (unsigned long long)size, stable_total);
    return 0;
}

/* The same comparison, read-only, at up to 256 windows of 64 bytes spread
 * evenly over [addr, addr + size): *differs = 1 where a stable byte of hMem
 * differs from CUDA's copy.  0, or the error of a mapping or copy.  Used to
 * tell apart candidates that all passed nvrm_verify_identity. */
static int compare_spread(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t hMem, uint64_t va,
                          uint64_t rm_off, uint64_t addr, uint64_t size, int *differs)
{
    enum { SAMPLE = 64,
           MAXWIN = 256 };
    const uint64_t hp = (uint64_t)nvrm_host_page();
    *differs = 0;
    if (size == 0) return 0;
    const uint64_t pages = (gp_round_up(addr + size, hp) - gp_round_down(addr, hp)) / hp;
    const uint64_t nwin = pages < MAXWIN ? pages : MAXWIN;
    for (uint64_t i = 0; i < nwin && !*differs; i++) {
        /* window i starts at an evenly spread place, 8-aligned, inside one page */
        uint64_t s = nwin > 1 ? addr + (size - 1) * i / (nwin - 1) : addr;
        s = gp_round_down(s, 8) < addr ? addr : gp_round_down(s, 8);
        uint64_t n = addr + size - s < SAMPLE ? addr + size - s : SAMPLE;
        const uint64_t page_end = gp_round_down(s, hp) + hp;
        if (s + n > page_end) n = page_end - s;
        uint8_t seen[SAMPLE], cuda[SAMPLE];
        int bad;
        size_t stable;
        int rc = compare_window(ctx, nc, hMem, va, rm_off, s, n, &bad, &stable, seen, cuda);
        if (rc) return rc;
        *differs = bad >= 0;
    }
    return 0;
}

/* Are the m candidates handles of one allocation, at the bytes off[0] and
 * off[1] of each?  Proven, never guessed, in one of two ways:
 *  - BAR1: CPU mappings of the same bytes of each, alive at the same time,
 *    start at the same bus address (RM_MAP_MEMORY returns it): one BAR1
 *    address reaches one page of video memory at a time.  Where RM gives
 *    every mapping its own BAR1 range the addresses differ even for one
 *    allocation, and this says nothing;
 *  - the driver's physical addresses (CAP_SYS_ADMIN only; *refused is set
 *    when it answered no).
 * Returns how it was shown, or NULL. */
static const char *one_allocation(struct nvrm_ctx *nc, const uint32_t *c, int m,
                                  const uint64_t off[2], int *refused)
{
    int bar1 = 1;
    for (int j = 0; j < 2 && bar1; j++) {
        struct nvrm_map m0;
        if (nvrm_map_range(nc, c[0], off[j], 8, &m0)) {
            bar1 = 0;
            break;
        }
        for (int k = 1; k < m && bar1; k++) {
            struct nvrm_map mk;
            bar1 = !nvrm_map_range(nc, c[k], off[j], 8, &mk);
            if (bar1) {
                bar1 = mk.plinear == m0.plinear;
                nvrm_unmap_range(nc, c[k], &mk);
            }
        }
        nvrm_unmap_range(nc, c[0], &m0);
    }
    if (bar1) return "their BAR1 mappings start at the same bus address";
    uint64_t pa0[2] = {0, 0};
    uint32_t ap0[2] = {0, 0};
    for (int j = 0; j < 2; j++)
        if (nvrm_phys_addr(nc, c[0], off[j], &pa0[j], &ap0[j])) {
            *refused = 1;
            return NULL;
        }
    for (int k = 1; k < m; k++)
        for (int j = 0; j < 2; j++) {
            uint64_t pa = 0;
            uint32_t ap = 0;
            if (nvrm_phys_addr(nc, c[k], off[j], &pa, &ap)) {
                *refused = 1;
                return NULL;
            }
            if (pa != pa0[j] || ap != ap0[j]) return NULL;
        }
    return "the driver's physical addresses agree";
}

/* Which of the n live candidates (our dups, freed here unless chosen) holds
 * the caller's memory, proven without writing anything:
 *  1. the identity check (first and last page of the request) on each;
 *  2. where several pass: if they are shown to be handles of one allocation
 *     at both ends of the request (one_allocation: BAR1 bus addresses, or the
 *     driver's physical addresses), any is right (CUDA may keep more than
 *     one handle);
 *  3. else the comparison at up to 256 places spread over the request must
 *     leave exactly one.
 * Several distinct objects holding the same bytes everywhere compared (e.g.
 * never-written chunks, all zero) cannot be told apart: refused. */
int nvrm_identity_pick(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t *c, int n, uint64_t va,
                       uint64_t rm_off, uint64_t lo, uint64_t len, uint32_t *hOut, char *proof,
                       size_t prooflen)
{
    int m = 0, rc = 0;
    for (int k = 0; k < n; k++) {
        int differs = 0;
        int r = nvrm_identity(ctx, nc, c[k], va, rm_off, lo, len, &differs);
        if (r && !differs && n > 1) {
            /* not ruled out, not proven: no other candidate can be proven
             * the only one */
            nvrm_free_dups(nc, c + k, n - k, "route V: freeing undecided candidates");
            nvrm_free_dups(nc, c, m, "route V: freeing undecided candidates");
            return gp_err_prefix(r, "route V: %d live RM objects are named for the allocation "
                                    "and one of them could not be compared",
                                 n);
        }
        if (r) {
            rc = r;
            nvrm_free_dups(nc, &c[k], 1, "freeing a refused route V object");
        } else {
            c[m++] = c[k];
        }
    }
    if (m == 0)
        return n == 1 ? rc
                      : gp_err_prefix(rc, "none of the %d live RM objects named for the "
                                          "allocation holds its bytes",
                                      n);
    if (m == 1) {
        if (n > 1) gp_err_clear(); /* the others' identity failures are not the caller's */
        *hOut = c[0];
        snprintf(proof, prooflen, n == 1 ? "identity check passed" : "identity check passed; it ruled out the %d other "
                                                                     "live candidates",
                 n - 1);
        return 0;
    }
    /* 2: one allocation under several handles? */
    const uint64_t off[2] = {rm_off + (lo - va), rm_off + (lo + len - 1 - va)};
    int phys_refused = 0;
    const char *by = one_allocation(nc, c, m, off, &phys_refused);
    if (by) {
        gp_err_clear();
        gp_log(1, "nvrm: route V: %d live candidates are one allocation (%s)", m, by);
        *hOut = c[0];
        nvrm_free_dups(nc, c + 1, m - 1, "route V: freeing a second handle of the allocation");
        snprintf(proof, prooflen, "identity check passed; %d handles of one allocation (%s)", m,
                 by);
        return 0;
    }
    /* 3: bytes spread over the request */
    const int passed = m;
    int left = 0;
    for (int k = 0; k < m; k++) {
        int differs = 0;
        int r = compare_spread(ctx, nc, c[k], va, rm_off, lo, len, &differs);
        if (r) { /* not ruled out, not proven */
            nvrm_free_dups(nc, c + k, m - k, "route V: freeing undecided candidates");
            nvrm_free_dups(nc, c, left, "route V: freeing undecided candidates");
            return gp_err_prefix(r, "route V: comparing %d live RM objects named for the "
                                    "allocation",
                                 m);
        }
        if (!differs)
            c[left++] = c[k];
        else
            nvrm_free_dups(nc, &c[k], 1, "route V: freeing a candidate ruled out");
    }
    if (left == 1) {
        gp_err_clear();
        *hOut = c[0];
        snprintf(proof, prooflen, "identity check and a comparison at up to 256 places ruled out "
                                  "the %d other live candidates",
                 n - 1);
        return 0;
    }
    nvrm_free_dups(nc, c, left, "route V: freeing ambiguous candidates");
    if (left == 0)
        return gp_err(GDRPY_ENOTSUP, "none of the %d live RM objects named for the allocation "
                                     "holds its bytes at every place compared",
                      passed);
    return gp_err(GDRPY_ENOTSUP, "%d distinct RM objects named for the allocation hold its bytes "
                                 "at every place compared (the first and last page of the request "
                                 "and up to 256 places between), and %s; which one is its memory "
                                 "cannot be proven without writing to it, so exactly one must be "
                                 "and it is refused (write the memory once, e.g. zero it with a "
                                 "pattern of your own, or run with CAP_SYS_ADMIN)",
                  left,
                  !phys_refused ? "the driver reports different physical memory for them"
                                : "their BAR1 mappings do not share addresses, and the driver's "
                                  "physical-address query (NV0041_CTRL_CMD_GET_SURFACE_PHYS_ATTR) "
                                  "was refused: it answers only callers with CAP_SYS_ADMIN");
}
