/*
 * selftest.c - nvrm backend: the per-device self-test (which routes work on
 * this driver), its state and its report.
 *
 * The RM interface is not a documented API, and the cuIpcGetMemHandle words
 * route C relies on are not either.  So instead of trusting a version number,
 * the first open of a device in a process proves every route on scratch
 * memory of its own (allocated through the dlopen'ed libcuda; route A's is
 * freed after, route C's cuMemAlloc scratch is kept for the life of the
 * process, since cuMemFree waits for the caller's kernels: desc.c):
 *
 *   route A (cuMemCreate):  scratch from cuMemCreate(POSIX_FD) -> the real pin
 *                           path (export + import) -> map -> data check
 *                           (route_a.c);
 *   route C (cuMemAlloc):   two scratch cuMemAlloc allocations -> learn which
 *                           IPC handle words hold size / client / memory /
 *                           offset (the known CUDA 13.0 layout first, else a
 *                           bounded search, every candidate proven by data) ->
 *                           the real pin path (words + dup) -> map -> data
 *                           check -> identity check (route_c.c).
 *
 * Data check (scratch.c; on scratch memory only): a random pattern copied in
 * by CUDA must read back through the mapping; only then is a second pattern
 * written through the mapping and copied back by CUDA (on gdrpy's own
 * stream: the self-test never waits for the caller's kernels).  An unproven
 * mapping is never written.  A route that fails is disabled with
 * the step, the message (RM status names included) and the driver version;
 * if no route passes, the backend is unavailable on that device.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvrm.h"

static pthread_mutex_t st_lock = PTHREAD_MUTEX_INITIALIZER;
static struct nvrm_dev_state st_dev[NVRM_MAX_DEV];

/* ---- the self-test ----------------------------------------------------- */

int nvrm_selftest(int device, struct nvrm_ctx *nc)
{
    if (device < 0 || device >= NVRM_MAX_DEV)
        return gp_err(GDRPY_ENODEV, "nvrm: device %d is beyond the %d this backend tracks",
                      device, NVRM_MAX_DEV);
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
        nvrm_route_a_selftest(device, nc, t);
        nvrm_route_c_selftest(device, nc, t);
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
    if (device < 0 || device >= NVRM_MAX_DEV) return NULL;
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
