/*
 * selftest.c - nvrm backend: the per-device self-test and its report.
 *
 * The RM interface is not a documented API, and the cuIpcGetMemHandle words
 * route C relies on are not either.  So instead of trusting a version number,
 * the first open of a device in a process proves every route on scratch
 * memory of its own (allocated through the dlopen'ed libcuda, freed after):
 *
 *   route A (cuMemCreate):  scratch from cuMemCreate(POSIX_FD) -> the real pin
 *                           path (export + import) -> map -> data check;
 *   route C (cuMemAlloc):   two scratch cuMemAlloc allocations -> learn which
 *                           IPC handle words hold size / client / memory /
 *                           offset (the known CUDA 13.0 layout first, else a
 *                           bounded search, every candidate proven by data) ->
 *                           the real pin path (words + dup + identity check)
 *                           -> map -> data check.
 *
 * Data check (on scratch memory only): a random pattern written with
 * cuMemcpyHtoD must read back through the mapping; only then is a second
 * pattern written through the mapping and read back with cuMemcpyDtoH.  An
 * unproven mapping is never written.  A route that fails is disabled with
 * the step, the message (RM status names included) and the driver version;
 * if no route passes, the backend is unavailable on that device.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nvrm.h"

#define MAX_DEV 64

static pthread_mutex_t st_lock = PTHREAD_MUTEX_INITIALIZER;
static struct nvrm_dev_state st_dev[MAX_DEV];

/* ---- route A ----------------------------------------------------------- */

static void test_route_a(int device, struct nvrm_ctx *nc, struct nvrm_dev_state *st)
{
    struct nvrm_route_report *r = &st->route_a;
    r->tested = 1;
    if (!gp_cu.MemCreate || !gp_cu.MemAddressReserve || !gp_cu.MemMap || !gp_cu.MemSetAccess ||
        !gp_cu.MemUnmap || !gp_cu.MemAddressFree || !gp_cu.MemGetAllocationGranularity) {
        nvrm_report_fail(r, "scratch allocation", "libcuda lacks the VMM API (cuMemCreate...)");
        return;
    }
    gp_CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location_type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location_id = device;
    prop.gpuDirectRDMACapable = 1;
    size_t gran = 0;
    CUresult cr = gp_cu.MemGetAllocationGranularity(&gran, &prop,
                                                    CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (cr || !gran) gran = 2u << 20;
    size_t size = gran;
    CUmemGenericAllocationHandle h = 0;
    cr = gp_cu.MemCreate(&h, size, &prop, 0);
    if (cr) { /* a GPU without GPUDirect RDMA: the plain kind */
        prop.gpuDirectRDMACapable = 0;
        cr = gp_cu.MemCreate(&h, size, &prop, 0);
    }
    if (cr) {
        gp_cuda_err(0, cr, "cuMemCreate", "self-test scratch (%zu bytes, POSIX_FD)", size);
        nvrm_report_last(r, "scratch allocation (cuMemCreate)", nc);
        return;
    }
    uint64_t va = 0;
    int mapped = 0;
    cr = gp_cu.MemAddressReserve(&va, size, 0, 0, 0);
    if (!cr) {
        cr = gp_cu.MemMap(va, size, 0, h, 0);
        mapped = cr == 0;
    }
    if (!cr) {
        gp_CUmemAccessDesc d = {CU_MEM_LOCATION_TYPE_DEVICE, device,
                                CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        cr = gp_cu.MemSetAccess(va, size, &d, 1);
    }
    if (cr) {
        gp_cuda_err(0, cr, "cuMemAddressReserve/cuMemMap/cuMemSetAccess", "self-test scratch");
        nvrm_report_last(r, "scratch allocation (cuMemMap)", nc);
        goto out;
    }
    {
        /* The real pin path: classify, export + import. */
        const uint64_t at = va + 4096 + 64; /* not page aligned on purpose */
        gp_cuda_ptr cp;
        uint32_t hMem = 0;
        gp_ctx fake;
        memset(&fake, 0, sizeof fake);
        fake.device = device;
        fake.bpriv = nc;
        if (gp_cuda_classify(at, NVRM_CHECK_BYTES, device, &cp)) {
            nvrm_report_last(r, "classify the scratch pointer", nc);
            goto out;
        }
        if (nvrm_import_vmm(&fake, nc, at, &cp, &hMem)) {
            nvrm_report_last(r, "pin (export POSIX fd + OS_UNIX_IMPORT_OBJECTS_FROM_FD)", nc);
            goto out;
        }
        if (nvrm_scratch_check(device, nc, hMem, at - cp.base, at, 1, r) == 0) r->ok = 1;
        nvrm_rm_free(nc, nc->hDevice, hMem, "freeing the self-test import");
        nvrm_live_add(&nc->n_mem, -1);
    }
out:
    if (mapped) gp_cu.MemUnmap(va, size);
    if (va) gp_cu.MemAddressFree(va, size);
    gp_cu.MemRelease(h);
}

/* ---- route C ----------------------------------------------------------- */

struct scratch {
    uint64_t base;
    size_t size;
    uint32_t w[16];
};

/* Tries layout L on scratch s: words -> dup -> read-only data check.
 * 0 if the mapping shows the scratch memory. */
static int try_layout(int device, struct nvrm_ctx *nc, const struct nvrm_ipc_layout *L,
                      const struct scratch *s, struct nvrm_route_report *r, int *dups)
{
    const uint32_t *w = s->w;
    if (*dups >= 256) return -1; /* bounded search */
    if (w[L->w_size] != (uint32_t)s->size) return -1;
    uint32_t hcli = w[L->w_client], hobj = w[L->w_mem];
    if (!hcli || !hobj || hcli == nc->hClient) return -1;
    uint64_t off = L->w_off >= 0 ? w[L->w_off] : 0;
    if (((s->base ^ off) & 4095) != 0) return -1;
    uint32_t h;
    (*dups)++;
    if (nvrm_dup(nc, hcli, hobj, &h, "self-test: RM_DUP_OBJECT of an IPC word pair")) {
        nvrm_report_last(r, "IPC handle layout: RM_DUP_OBJECT", nc);
        return -1;
    }
    int rc = nvrm_scratch_check(device, nc, h, off, s->base, 0, r); /* -2 passes through */
    nvrm_rm_free(nc, nc->hDevice, h, "freeing a self-test dup");
    nvrm_live_add(&nc->n_mem, -1);
    return rc;
}

/* Finds the layout: the known one first, else a bounded search over word
 * pairs, each candidate proven by a data check on both scratch allocations. */
static int learn_layout(int device, struct nvrm_ctx *nc, struct scratch s[2],
                        struct nvrm_ipc_layout *out, struct nvrm_route_report *r)
{
    /* Seen with CUDA 13.0 / driver 580 (facts/nvrm-bar1.md). */
    struct nvrm_ipc_layout L = {.w_size = 4, .w_pages = 6, .w_off = 7, .w_client = 12, .w_mem = 13};
    int dups = 0;
    int t1 = try_layout(device, nc, &L, &s[1], r, &dups);
    int t0 = t1 == 0 ? try_layout(device, nc, &L, &s[0], r, &dups) : t1;
    if (t1 == -2 || t0 == -2) {
        /* Mapping or copying itself fails: no word layout would help. */
        return -1;
    }
    if (t1 == 0 && t0 == 0) {
        *out = L;
        out->searched = 0;
    } else {
        int found = 0;
        /* Candidates: the size word holds both sizes; the client word is the
         * same in both handles; a (client, memory) pair must be one RM_DUP
         * accepts; the offset word (or none: offset 0) must make the mapping
         * show the scratch pattern.  One dup per pair, bounded. */
        for (int i = 0; i < 16 && !found; i++) {
            if (s[0].w[i] != (uint32_t)s[0].size || s[1].w[i] != (uint32_t)s[1].size) continue;
            for (int c = 0; c < 16 && !found; c++) {
                if (c == i || !s[0].w[c] || s[0].w[c] != s[1].w[c]) continue;
                for (int m = 0; m < 16 && !found && dups < 256; m++) {
                    if (m == c || m == i || !s[1].w[m] || s[1].w[m] == s[1].w[c]) continue;
                    uint32_t h;
                    dups++;
                    if (nvrm_dup(nc, s[1].w[c], s[1].w[m], &h, "self-test: RM_DUP_OBJECT of "
                                                               "an IPC word pair"))
                        continue;
                    for (int o = -1; o < 16 && !found; o++) {
                        if (o == i || o == c || o == m) continue;
                        uint64_t off = o >= 0 ? s[1].w[o] : 0;
                        if (off >= (1u << 30) || ((s[1].base ^ off) & 4095)) continue;
                        if (nvrm_scratch_check(device, nc, h, off, s[1].base, 0, r) != 0) continue;
                        struct nvrm_ipc_layout t = {.w_size = i, .w_pages = -1, .w_off = o, .w_client = c, .w_mem = m};
                        if (try_layout(device, nc, &t, &s[0], r, &dups) == 0) {
                            *out = t;
                            out->searched = 1;
                            found = 1;
                        }
                    }
                    nvrm_rm_free(nc, nc->hDevice, h, "freeing a self-test dup");
                    nvrm_live_add(&nc->n_mem, -1);
                }
            }
        }
        if (!found) {
            char words[200];
            size_t u = 0;
            for (int k = 0; k < 16; k++)
                u += (size_t)snprintf(words + u, sizeof words - u, "%s%x", k ? " " : "",
                                      s[1].w[k]);
            char last[sizeof r->step + 160];
            snprintf(last, sizeof last, "%s: %.150s", r->step[0] ? r->step : "-",
                     r->detail[0] ? r->detail : "-");
            nvrm_report_fail(r, "IPC handle layout", "no layout of the cuIpcGetMemHandle words maps "
                                                     "the scratch allocation (%zu bytes at 0x%llx; words %s; %d duplications "
                                                     "tried; last failure: %s) [driver %s, CUDA %d]",
                             s[1].size,
                             (unsigned long long)s[1].base, words, dups, last, nc->version,
                             nc->cuda_version);
            return -1;
        }
    }
    /* Facts about the words that per-pin checks can rely on. */
    out->valid = 1;
    out->off_proven = 0;
    out->mapbase = 1;
    for (int k = 0; k < 2; k++) {
        uint64_t off = out->w_off >= 0 ? s[k].w[out->w_off] : 0;
        if (off) out->off_proven = 1;
        if (out->w_pages >= 0 && (uint64_t)s[k].w[out->w_pages] * 4096 < off + s[k].size)
            out->w_pages = -1; /* not the object size after all */
        uint64_t mb = 0;
        if (gp_cu.PointerGetAttribute(&mb, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, s[k].base) ||
            !mb || s[k].base - mb != off)
            out->mapbase = 0;
    }
    return 0;
}

static void test_route_c(int device, struct nvrm_ctx *nc, struct nvrm_dev_state *st)
{
    struct nvrm_route_report *r = &st->route_c;
    r->tested = 1;
    if (!gp_cu.MemAlloc || !gp_cu.MemFree) {
        nvrm_report_fail(r, "scratch allocation", "libcuda lacks cuMemAlloc/cuMemFree");
        return;
    }
    /* Two sizes no other word is likely to hold; the second usually sits
     * at a non-zero offset of the same RM object, which proves the offset
     * word. */
    struct scratch s[2];
    memset(s, 0, sizeof s);
    s[0].size = 0x6000;
    s[1].size = 0xa000;
    for (int k = 0; k < 2; k++) {
        CUresult cr = gp_cu.MemAlloc(&s[k].base, s[k].size);
        if (cr) {
            gp_cuda_err(0, cr, "cuMemAlloc", "self-test scratch (%zu bytes)", s[k].size);
            nvrm_report_last(r, "scratch allocation (cuMemAlloc)", nc);
            goto out;
        }
        if (nvrm_ipc_words(s[k].base, s[k].w)) {
            nvrm_report_last(r, "cuIpcGetMemHandle of the scratch allocation", nc);
            goto out;
        }
    }
    struct nvrm_ipc_layout L;
    memset(&L, 0, sizeof L);
    if (learn_layout(device, nc, s, &L, r)) goto out;
    /* Both at offset 0 of their RM objects: the offset word is unproven.
     * One more small allocation usually lands behind another one. */
    struct scratch extra;
    memset(&extra, 0, sizeof extra);
    if (!L.off_proven && L.w_off >= 0) {
        extra.size = 0x3000;
        int dups = 0;
        if (gp_cu.MemAlloc(&extra.base, extra.size) == CUDA_SUCCESS &&
            nvrm_ipc_words(extra.base, extra.w) == 0 && extra.w[L.w_off] != 0 &&
            try_layout(device, nc, &L, &extra, r, &dups) == 0)
            L.off_proven = 1;
        r->step[0] = r->detail[0] = '\0';
        if (L.mapbase) { /* the relation must hold here too */
            uint64_t mb = 0;
            if (!extra.base ||
                gp_cu.PointerGetAttribute(&mb, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                                          extra.base) ||
                extra.base - mb != extra.w[L.w_off])
                L.mapbase = 0;
        }
    }
    /* The real pin path on the second allocation: words + dup + identity. */
    st->ipc = L; /* what nvrm_dup_legacy reads */
    {
        gp_ctx fake;
        memset(&fake, 0, sizeof fake);
        fake.device = device;
        fake.bpriv = nc;
        gp_cuda_ptr cp;
        uint32_t hMem = 0;
        uint64_t objoff = 0;
        const uint64_t at = s[1].base + 4096 + 64;
        r->ok = 0;
        if (gp_cuda_classify(at, NVRM_CHECK_BYTES, device, &cp)) {
            nvrm_report_last(r, "classify the scratch pointer", nc);
        } else if (nvrm_dup_legacy(&fake, nc, &cp, &hMem, &objoff)) {
            nvrm_report_last(r, "pin (IPC words + RM_DUP_OBJECT)", nc);
        } else {
            uint64_t rm_at = objoff + (at - cp.base);
            if (nvrm_verify_identity(&fake, nc, hMem, at, rm_at, at, NVRM_CHECK_BYTES))
                nvrm_report_last(r, "identity check", nc);
            else if (nvrm_scratch_check(device, nc, hMem, rm_at, at, 1, r) == 0)
                r->ok = 1;
            nvrm_rm_free(nc, nc->hDevice, hMem, "freeing the self-test dup");
            nvrm_live_add(&nc->n_mem, -1);
        }
    }
    if (!r->ok) memset(&st->ipc, 0, sizeof st->ipc);
    if (extra.base) gp_cu.MemFree(extra.base);
out:
    for (int k = 0; k < 2; k++)
        if (s[k].base) gp_cu.MemFree(s[k].base);
}

/* ---- the self-test ----------------------------------------------------- */

int nvrm_selftest(int device, struct nvrm_ctx *nc)
{
    if (device < 0 || device >= MAX_DEV)
        return gp_err(GDRPY_ENODEV, "nvrm: device %d is beyond the %d this backend tracks",
                      device, MAX_DEV);
    pthread_mutex_lock(&st_lock);
    struct nvrm_dev_state *st = &st_dev[device];
    /* A route that could not even get its scratch memory (e.g. the GPU was
     * full) says nothing about the driver: test again at the next open. */
    int again = st->done &&
                ((!st->route_a.ok && !strncmp(st->route_a.step, "scratch allocation", 18)) ||
                 (!st->route_c.ok && !strncmp(st->route_c.step, "scratch allocation", 18)));
    if (!st->done || again) {
        /* Run into a fresh state and publish it at the end: contexts already
         * pinning through the old one keep reading consistent values. */
        struct nvrm_dev_state *t = calloc(1, sizeof *t);
        if (!t) {
            pthread_mutex_unlock(&st_lock);
            return gp_err(GDRPY_ENOMEM, "nvrm self-test: out of memory");
        }
        double t0 = nvrm_now_ms();
        snprintf(t->version, sizeof t->version, "%s", nc->version);
        snprintf(t->branch, sizeof t->branch, "%s", nc->abi.branch);
        snprintf(t->tag, sizeof t->tag, "%s", nc->abi.tag);
        t->newer = nc->abi_newer;
        t->cuda_version = nc->cuda_version;
        const char *cs = getenv("GDRPY_NVRM_TEST_CORRUPT_ABI");
        t->corrupt = cs ? atoi(cs) : 0;
        nc->st = t;
        test_route_a(device, nc, t);
        test_route_c(device, nc, t);
        t->ms = nvrm_now_ms() - t0;
        t->usable = t->route_a.ok || t->route_c.ok;
        if (!t->usable)
            snprintf(t->reason, sizeof t->reason, "the nvrm self-test failed on every route "
                                                  "(driver %s, ABI table %s from %s%s): route A at \"%s\": %.200s; route C "
                                                  "at \"%s\": %.200s",
                     t->version, t->branch, t->tag,
                     t->corrupt ? ", GDRPY_NVRM_TEST_CORRUPT_ABI set" : "", t->route_a.step,
                     t->route_a.detail, t->route_c.step, t->route_c.detail);
        t->done = 1;
        *st = *t;
        free(t);
        gp_log(2, "nvrm: self-test on device %d: route A %s, route C %s, %.2f ms", device,
               st->route_a.ok ? "ok" : "disabled", st->route_c.ok ? "ok" : "disabled", st->ms);
    }
    nc->st = st;
    int usable = st->usable;
    char reason[sizeof st->reason];
    memcpy(reason, st->reason, sizeof reason);
    pthread_mutex_unlock(&st_lock);
    gp_err_clear();
    if (!usable) return gp_err(GDRPY_ENOTSUP, "%s", reason);
    return 0;
}

const struct nvrm_dev_state *nvrm_selftest_state(int device)
{
    if (device < 0 || device >= MAX_DEV) return NULL;
    pthread_mutex_lock(&st_lock);
    const struct nvrm_dev_state *st = st_dev[device].done ? &st_dev[device] : NULL;
    pthread_mutex_unlock(&st_lock);
    return st; /* never changes once done */
}

/* ---- the report (JSON) -------------------------------------------------- */

static size_t jstr(char *b, size_t n, size_t u, const char *s)
{
    if (u < n) b[u] = '"';
    u++;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') snprintf(esc, sizeof esc, "\\%c", c);
        else if (c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", c);
        else {
            esc[0] = (char)c;
            esc[1] = 0;
        }
        for (char *e = esc; *e; e++, u++)
            if (u < n) b[u] = *e;
    }
    if (u < n) b[u] = '"';
    return u + 1;
}

#define OUT(...) (u += (size_t)snprintf(u < n ? b + u : NULL, u < n ? n - u : 0, __VA_ARGS__))

static size_t route_json(char *b, size_t n, size_t u, const struct nvrm_route_report *r)
{
    OUT("{\"tested\": %s, \"ok\": %s, \"step\": ", r->tested ? "true" : "false",
        r->ok ? "true" : "false");
    u = jstr(b, n, u, r->step);
    OUT(", \"detail\": ");
    u = jstr(b, n, u, r->detail);
    return u;
}

static void report_json(const struct nvrm_dev_state *st, int device, char *b, size_t n)
{
    size_t u = 0;
    OUT("{\"device\": %d, \"driver\": ", device);
    u = jstr(b, n, u, st->version);
    OUT(", \"cuda_driver\": %d, \"table\": {\"branch\": ", st->cuda_version);
    u = jstr(b, n, u, st->branch);
    OUT(", \"tag\": ");
    u = jstr(b, n, u, st->tag);
    OUT(", \"driver_newer_than_tables\": %s}, \"selftest_ms\": %.3f, \"usable\": %s, "
        "\"test_corrupt_abi\": %d, \"reason\": ",
        st->newer ? "true" : "false", st->ms,
        st->usable ? "true" : "false", st->corrupt);
    u = jstr(b, n, u, st->reason);
    OUT(", \"routes\": {\"A\": ");
    u = route_json(b, n, u, &st->route_a);
    OUT("}, \"C\": ");
    u = route_json(b, n, u, &st->route_c);
    const struct nvrm_ipc_layout *L = &st->ipc;
    if (L->valid)
        OUT(", \"ipc_layout\": {\"size\": %d, \"pages\": %d, \"offset\": %d, \"client\": %d, "
            "\"memory\": %d, \"offset_proven\": %s, \"mapping_base_checked\": %s, "
            "\"how\": \"%s\"}",
            L->w_size, L->w_pages, L->w_off, L->w_client, L->w_mem,
            L->off_proven ? "true" : "false", L->mapbase ? "true" : "false",
            L->searched ? "found by search" : "known CUDA 13.0 layout confirmed");
    OUT("}}}");
    if (n) b[u < n ? u : n - 1] = '\0';
}

/* Public: runs the self-test for `device` if it has not run in this process
 * and writes its report as JSON.  0, or a code with the reason (the report
 * is written whenever the self-test ran). */
GDRPY_API int gdrpy_nvrm_selftest(int device, char *buf, size_t len)
{
    if (!buf || !len) return gp_err(GDRPY_EINVAL, "nvrm_selftest: no output buffer");
    buf[0] = '\0';
    const struct nvrm_dev_state *st = nvrm_selftest_state(device);
    int rc = 0;
    if (!st) {
        rc = gp_cuda_load(NULL, 0);
        if (!rc) rc = gp_cuda_check_device(device);
        struct nvrm_ctx *nc = NULL;
        if (!rc) {
            nc = calloc(1, sizeof *nc);
            if (!nc) rc = gp_err(GDRPY_ENOMEM, "out of memory");
        }
        if (!rc) rc = nvrm_session_open(device, nc);
        if (!rc) {
            gp_cuda_hold(device);
            gp_cuda_scope sc;
            rc = gp_cuda_enter(device, &sc);
            if (!rc) {
                rc = nvrm_selftest(device, nc);
                gp_cuda_leave(&sc);
            }
            gp_cuda_unhold(device);
            nvrm_session_close(nc);
            pthread_mutex_destroy(&nc->hlock);
        }
        free(nc);
        st = nvrm_selftest_state(device);
        if (!st) return rc ? rc : gp_err(GDRPY_EIO, "nvrm self-test did not run");
    }
    report_json(st, device, buf, len);
    if (!st->usable) return gp_err(GDRPY_ENOTSUP, "%s", st->reason);
    return rc;
}
