/*
 * identity.c - nvrm backend: the identity proof.  Does an RM memory object
 * (a handle in our client) hold the bytes of the caller's CUDA allocation?
 * Read only: bytes read through a BAR1 mapping of the object are compared
 * with a copy CUDA makes of the same bytes (on gdrpy's own non-blocking
 * stream, never ordered after the caller's kernels: cudadrv.h), and nothing
 * of the caller's is ever written.
 *
 *   nvrm_identity / nvrm_verify_identity   one object: sampled at the first
 *                                         and last host page of the range
 *   nvrm_identity_pick                     several candidate objects: which
 *                                         one is the caller's memory
 *
 * What proves ownership, per route (docs/security.md has the long form):
 *  - route A: the export itself (CUDA exports the allocation's own RM
 *    object; nothing here runs);
 *  - route C: CUDA's IPC description of this allocation (the words the
 *    self-test learned on memory of its own), RM's size of the duplicated
 *    object against the size word, and CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR
 *    against the offset word; the byte comparison is a cross-check.  Where
 *    the self-test could not prove the mapping-base relation, the offset is
 *    proven by nothing else, and the bytes decide;
 *  - route V, VMM: CUDA's record of this very allocation
 *    (cuMemRetainAllocationHandle), read at the place learning proved, and
 *    RM's size of the object; route V, pools: the pool's record of this
 *    allocation's chunk (found from the pool at a field holding the chunk's
 *    mapping base) and RM's size.  Bytes cross-check.  Candidates that only a
 *    scan of the heap found are tied to nothing: the bytes decide;
 *  - several candidates: one allocation under several handles (same BAR1
 *    bus address, or same physical address), else the bytes decide.
 * Where the bytes decide ("tied" is 0) they must count: at least
 * NVRM_PROOF_MIN_BYTES bytes that stayed the same across two reads, not all
 * one value (never-written memory is zero in every chunk), and, among
 * several candidates, a stable byte that rules out each other one; else the
 * pin is refused with the reason and what to do.
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
    return gp_cuda_private_copy(ctx->device, 1, src, dst, n);
}

static void seen_add(struct nvrm_seen *sn, const uint8_t *b, const uint8_t *stable, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        if (!stable[k]) continue;
        if (!sn->stable++) sn->value = b[k];
        else if (b[k] != sn->value) sn->mixed = 1;
    }
}

/* One window of the read-only comparison: bytes [s, s + n) (n <= 64, inside
 * one host page) read through a BAR1 mapping of `hMem` (rm_off corresponds
 * to va) around a copy by CUDA of the same bytes, up to 3 tries: only a byte
 * that is stable across both BAR1 reads and differs from CUDA's copy counts
 * (a wrong object differs every time, a concurrent writer only now and
 * then).  0 with *bad = first differing offset or -1 and what was compared
 * added to *sn; else the error of the mapping or the copy. */
static int compare_window(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t hMem, uint64_t va,
                          uint64_t rm_off, uint64_t s, uint64_t n, int *bad,
                          struct nvrm_seen *sn, uint8_t seen[64], uint8_t cuda[64])
{
    const uint64_t hp = (uint64_t)nvrm_host_page();
    const uint64_t page = gp_round_down(s, hp);
    const uint64_t wlo = page > va ? page : va; /* never map before va */
    struct nvrm_map m;
    int rc = nvrm_map_range(nc, hMem, rm_off + (wlo - va), page + hp - wlo, &m);
    if (rc) return rc;
    const volatile uint8_t *base =
        (const volatile uint8_t *)m.mm + ((rm_off + (wlo - va)) & (hp - 1));
    uint8_t r2[64], st[64];
    *bad = -1;
    for (int attempt = 0; attempt < 3; attempt++) {
        nvrm_read_mapped(base, wlo, s, n, seen);
        rc = dtoh(ctx, cuda, s, n);
        if (rc) break;
        nvrm_read_mapped(base, wlo, s, n, r2);
        *bad = -1;
        for (uint64_t k = 0; k < n; k++) {
            st[k] = seen[k] == r2[k];
            if (st[k] && cuda[k] != seen[k] && *bad < 0) *bad = (int)k;
        }
        if (*bad < 0) {
            seen_add(sn, seen, st, n);
            break;
        }
    }
    nvrm_unmap_range(nc, hMem, &m);
    return rc;
}

int nvrm_content_proves(const struct nvrm_seen *sn, char *why, size_t whylen)
{
    if (sn->stable == 0)
        snprintf(why, whylen, "no sampled byte stayed the same across two reads (the memory "
                              "is being rewritten), so no byte was compared");
    else if (sn->stable < NVRM_PROOF_MIN_BYTES)
        snprintf(why, whylen, "only %zu sampled bytes stayed the same across two reads (at "
                              "least %d are needed)",
                 sn->stable, NVRM_PROOF_MIN_BYTES);
    else if (!sn->mixed)
        snprintf(why, whylen, "every one of the %zu bytes compared is 0x%02x, and memory "
                              "holding one value (never-written memory is 0x00) looks the same "
                              "in every chunk",
                 sn->stable, sn->value);
    else
        return 1;
    return 0;
}

int nvrm_content_refuse(const char *what, const struct nvrm_seen *sn)
{
    char why[256];
    nvrm_content_proves(sn, why, sizeof why);
    return gp_err(GDRPY_ENOTSUP, "%s is tied to the allocation by nothing but its content, "
                                 "and %s: which memory it is cannot be proven, so the pin is "
                                 "refused (nothing was written). Write the memory once with "
                                 "data of your own (not one repeated byte) and pin it while "
                                 "no kernel rewrites it, or allocate with cuMemAlloc or with "
                                 "cuMemCreate + CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR "
                                 "(gdrpy.memory does)",
                  what, why);
}

int nvrm_verify_identity(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t hMem, uint64_t va,
                         uint64_t rm_off, uint64_t addr, uint64_t size, int tied)
{
    struct nvrm_seen sn;
    int rc = nvrm_identity(ctx, nc, hMem, va, rm_off, addr, size, NULL, &sn);
    if (rc) return rc;
    if (!tied && !nvrm_content_proves(&sn, NULL, 0)) {
        char what[96];
        snprintf(what, sizeof what, "the RM object 0x%x found for 0x%llx", hMem,
                 (unsigned long long)addr);
        return nvrm_content_refuse(what, &sn);
    }
    return 0;
}

int nvrm_identity(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t hMem, uint64_t va, uint64_t rm_off,
                  uint64_t addr, uint64_t size, int *differs, struct nvrm_seen *sn)
{
    if (differs) *differs = 0;
    memset(sn, 0, sizeof *sn);
    const uint64_t hp = (uint64_t)nvrm_host_page();
    const uint64_t end = addr + size;
    enum { SAMPLE = 64 };
    uint64_t win[2] = {gp_round_down(addr, hp), gp_round_down(end - 1, hp)};
    int nwin = win[1] != win[0] ? 2 : 1;
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
        int rc = compare_window(ctx, nc, hMem, va, rm_off, s, n, &bad, sn, seen, cuda);
        if (rc) return gp_err_prefix(rc, "identity check of the pin");
        if (bad >= 0 && differs) *differs = 1;
        if (bad >= 0)
            return gp_err(GDRPY_EIO, "identity check failed: byte 0x%llx read through BAR1 "
                                     "is 0x%02x where CUDA's copy shows 0x%02x (stable across "
                                     "reads, 3 tries), so the RM object found for this "
                                     "allocation does not hold its bytes on this driver (%s): "
                                     "refusing to pin",
                          (unsigned long long)(s + (uint64_t)bad), seen[bad], cuda[bad],
                          nc->version);
    }
    gp_log(1, "nvrm: identity of 0x%llx+%llu: %zu stable sampled bytes agree%s (no writes)",
           (unsigned long long)addr, (unsigned long long)size, sn->stable,
           sn->stable && !sn->mixed ? ", all one value" : "");
    return 0;
}

/* The same comparison, read-only, at up to 256 windows of 64 bytes spread
 * evenly over [addr, addr + size): *differs = 1 where a stable byte of hMem
 * differs from CUDA's copy; what agreed is added to *sn.  0, or the error of
 * a mapping or copy.  Used to tell apart candidates that all passed the
 * identity check. */
static int compare_spread(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t hMem, uint64_t va,
                          uint64_t rm_off, uint64_t addr, uint64_t size, int *differs,
                          struct nvrm_seen *sn)
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
        int rc = compare_window(ctx, nc, hMem, va, rm_off, s, n, &bad, sn, seen, cuda);
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
 *  1. the identity check (first and last page of the request) on each: a
 *     stable byte that differs from CUDA's copy rules a candidate out;
 *  2. where several are left: if they are shown to be handles of one
 *     allocation at both ends of the request (one_allocation: BAR1 bus
 *     addresses, or the driver's physical addresses), any is right (CUDA may
 *     keep more than one handle);
 *  3. else the comparison at up to 256 places spread over the request must
 *     leave exactly one.
 * The one left is the caller's memory when `tied` (the candidates are what
 * CUDA's record of this allocation names: one of them is its memory, and
 * the others were ruled out), else only if its bytes prove it
 * (nvrm_content_proves).  Several distinct objects holding the same bytes
 * everywhere compared (e.g. never-written chunks, all zero) cannot be told
 * apart: refused. */
int nvrm_identity_pick(gp_ctx *ctx, struct nvrm_ctx *nc, uint32_t *c, int n, uint64_t va,
                       uint64_t rm_off, uint64_t lo, uint64_t len, int tied, uint32_t *hOut,
                       char *proof, size_t prooflen)
{
    int m = 0, rc = 0;
    struct nvrm_seen sn[NVRM_MAX_CAND], one;
    for (int k = 0; k < n; k++) {
        int differs = 0;
        int r = nvrm_identity(ctx, nc, c[k], va, rm_off, lo, len, &differs, &one);
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
            sn[m] = one;
            c[m++] = c[k];
        }
    }
    if (m == 0)
        return n == 1 ? rc
                      : gp_err_prefix(rc, "none of the %d live RM objects named for the "
                                          "allocation holds its bytes",
                                      n);
    const char *src = tied ? "CUDA's record of the allocation names it" : "its bytes prove it";
    if (m == 1) {
        if (!tied && !nvrm_content_proves(&sn[0], NULL, 0)) {
            nvrm_free_dups(nc, c, 1, "route V: freeing an unproven candidate");
            char what[96];
            snprintf(what, sizeof what, "the only RM object found (by a scan of the heap) for "
                                        "0x%llx",
                     (unsigned long long)lo);
            return nvrm_content_refuse(what, &sn[0]);
        }
        if (n > 1) gp_err_clear(); /* the others' identity failures are not the caller's */
        *hOut = c[0];
        snprintf(proof, prooflen, "%s; %zu stable bytes agree%s", src, sn[0].stable,
                 n > 1 ? "; they ruled out the other candidates" : "");
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
        snprintf(proof, prooflen, "%d handles of one allocation (%s)", m, by);
        return 0;
    }
    /* 3: bytes spread over the request */
    const int passed = m;
    int left = 0;
    for (int k = 0; k < m; k++) {
        int differs = 0;
        struct nvrm_seen spread = sn[k];
        int r = compare_spread(ctx, nc, c[k], va, rm_off, lo, len, &differs, &spread);
        if (r) { /* not ruled out, not proven */
            nvrm_free_dups(nc, c + k, m - k, "route V: freeing undecided candidates");
            nvrm_free_dups(nc, c, left, "route V: freeing undecided candidates");
            return gp_err_prefix(r, "route V: comparing %d live RM objects named for the "
                                    "allocation",
                                 m);
        }
        if (!differs) {
            sn[left] = spread;
            c[left++] = c[k];
        } else {
            nvrm_free_dups(nc, &c[k], 1, "route V: freeing a candidate ruled out");
        }
    }
    if (left == 1 && !tied && !nvrm_content_proves(&sn[0], NULL, 0)) {
        nvrm_free_dups(nc, c, 1, "route V: freeing an unproven candidate");
        char what[128];
        snprintf(what, sizeof what, "the one of %d RM objects (found by a scan of the heap) "
                                    "left by the comparison",
                 n);
        return nvrm_content_refuse(what, &sn[0]);
    }
    if (left == 1) {
        gp_err_clear();
        *hOut = c[0];
        snprintf(proof, prooflen, "%s; a comparison at up to 256 places ruled out the %d other "
                                  "live candidates",
                 src, n - 1);
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
                                 "and it is refused (write the memory once with data of your own, "
                                 "or run with CAP_SYS_ADMIN)",
                  left,
                  !phys_refused ? "the driver reports different physical memory for them"
                                : "their BAR1 mappings do not share addresses, and the driver's "
                                  "physical-address query (NV0041_CTRL_CMD_GET_SURFACE_PHYS_ATTR) "
                                  "was refused: it answers only callers with CAP_SYS_ADMIN");
}
