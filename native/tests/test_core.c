/*
 * test_core.c - C-level tests of libgdrpy's core on the sim backend (CI) or,
 * with GDRPY_BACKEND=nvrm|auto and a GPU, on a real backend for the parts
 * that need no allocation of their own (handles, validation, lifetimes).
 *
 * Each case is named by what it asserts.  Final line:
 *   test_core: N passed, M failed
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gdrpy.h"
#include "internal.h" /* the core's interface for the layers above */

#include "check.h"

#define PAGE 65536

static gdrpy_ctx_t open_sim(void)
{
    gdrpy_ctx_t c = 0;
    if (gdrpy_open(0, GDRPY_BACKEND_SIM, &c)) return 0;
    return c;
}

static int pin_map_write_read_roundtrip(void)
{
    gdrpy_ctx_t c = open_sim();
    CHECK(c);
    uint64_t d;
    CHECK(gdrpy_sim_alloc(3 * PAGE, &d) == 0);
    CHECK(d % PAGE == 0);
    gdrpy_pin_t p;
    CHECK(gdrpy_pin(c, d + 100, 2 * PAGE, 0, &p) == 0);
    gdrpy_pin_info_t info;
    CHECK(gdrpy_pin_get_info(c, p, &info) == 0);
    CHECK(info.va == d && info.mapped_size == 3 * PAGE && info.page_size == PAGE);
    CHECK(!info.mapped && info.map_ptr == NULL);
    void *mp, *up;
    CHECK(gdrpy_map(c, p, &mp, &up) == 0);
    CHECK((char *)up == (char *)mp + 100);
    char msg[64];
    for (int i = 0; i < 64; i++) msg[i] = (char)(i * 7 + 1);
    for (size_t off = 0; off < 64; off++) {
        CHECK(gdrpy_write(c, p, off, msg, sizeof msg) == 0);
        char back[64] = {0}, dev[64] = {0};
        CHECK(gdrpy_read(c, p, off, back, sizeof back) == 0);
        CHECK(memcmp(back, msg, 64) == 0);
        CHECK(gdrpy_memcpy_dtoh(c, dev, d + 100 + off, 64) == 0);
        CHECK(memcmp(dev, msg, 64) == 0);
    }
    CHECK(gdrpy_pin_get_info(c, p, &info) == 0);
    CHECK(info.mapped && info.map_ptr == mp && info.user_ptr == up);
    CHECK(gdrpy_unmap(c, p) == 0);
    CHECK(gdrpy_unpin(c, p) == 0);
    CHECK(gdrpy_sim_free(d) == 0);
    CHECK(gdrpy_close(c) == 0);
    return 0;
}

static int out_of_range_copies_are_refused_and_touch_nothing(void)
{
    gdrpy_ctx_t c = open_sim();
    CHECK(c);
    uint64_t d;
    CHECK(gdrpy_sim_alloc(PAGE, &d) == 0);
    unsigned char fill[PAGE];
    memset(fill, 0x5a, sizeof fill);
    CHECK(gdrpy_memcpy_htod(c, d, fill, sizeof fill) == 0);
    gdrpy_pin_t p;
    CHECK(gdrpy_pin(c, d, 4096, 0, &p) == 0);
    CHECK(gdrpy_map(c, p, NULL, NULL) == 0);
    unsigned char junk[8192];
    memset(junk, 1, sizeof junk);
    CHECK(gdrpy_write(c, p, 0, junk, 4097) == GDRPY_ERANGE);
    CHECK(gdrpy_write(c, p, 4096, junk, 1) == GDRPY_ERANGE);
    CHECK(gdrpy_write(c, p, SIZE_MAX, junk, 2) == GDRPY_ERANGE);
    CHECK(gdrpy_write(c, p, 1, junk, SIZE_MAX) == GDRPY_ERANGE);
    CHECK(gdrpy_read(c, p, 4095, junk, 2) == GDRPY_ERANGE);
    CHECK(gdrpy_ce_write(c, p, 4000, junk, 97, NULL) == GDRPY_ERANGE);
    CHECK(gdrpy_write(c, p, 0, NULL, 1) == GDRPY_EINVAL);
    CHECK(gdrpy_write(c, p, 4096, junk, 0) == 0); /* empty at the end is fine */
    CHECK(strstr(gdrpy_last_error(), "") != NULL);
    unsigned char back[PAGE];
    CHECK(gdrpy_memcpy_dtoh(c, back, d, sizeof back) == 0);
    CHECK(memcmp(back, fill, sizeof back) == 0);
    CHECK(gdrpy_close(c) == 0);
    CHECK(gdrpy_sim_free(d) == 0);
    return 0;
}

static int lifetimes_are_enforced(void)
{
    gdrpy_ctx_t c = open_sim();
    CHECK(c);
    uint64_t d;
    CHECK(gdrpy_sim_alloc(PAGE, &d) == 0);
    gdrpy_pin_t p;
    CHECK(gdrpy_pin(c, d, PAGE, 0, &p) == 0);
    CHECK(gdrpy_unmap(c, p) == GDRPY_EINVAL); /* not mapped */
    CHECK(gdrpy_map(c, p, NULL, NULL) == 0);
    CHECK(gdrpy_map(c, p, NULL, NULL) == GDRPY_EAGAIN); /* one mapping per pin */
    CHECK(gdrpy_unpin(c, p) == GDRPY_EBUSY);            /* unmap first */
    CHECK(strstr(gdrpy_last_error(), "unmap") != NULL);
    CHECK(gdrpy_unmap(c, p) == 0);
    CHECK(gdrpy_unmap(c, p) == GDRPY_EINVAL); /* double unmap */
    CHECK(gdrpy_unpin(c, p) == 0);
    CHECK(gdrpy_unpin(c, p) == GDRPY_EBADF);           /* double unpin */
    CHECK(gdrpy_map(c, p, NULL, NULL) == GDRPY_EBADF); /* stale handle */
    CHECK(gdrpy_pin(c, d, PAGE, 0, &p) == 0);
    CHECK(gdrpy_map(c, p, NULL, NULL) == 0);
    CHECK(gdrpy_close(c) == 0);           /* tears down pin+map */
    CHECK(gdrpy_close(c) == GDRPY_EBADF); /* use after close */
    CHECK(gdrpy_pin(c, d, PAGE, 0, &p) == GDRPY_EBADF);
    CHECK(gdrpy_write(c, p, 0, "x", 1) == GDRPY_EBADF);
    CHECK(gdrpy_close(0) == GDRPY_EBADF);
    CHECK(gdrpy_close(0xdeadbeefcafeULL) == GDRPY_EBADF);
    CHECK(gdrpy_sim_free(d) == 0);
    CHECK(gdrpy_sim_free(d) == GDRPY_EINVAL); /* double free */
    return 0;
}

static int bad_arguments_get_clear_errors(void)
{
    gdrpy_ctx_t c = 0;
    CHECK(gdrpy_open(-1, GDRPY_BACKEND_SIM, &c) == GDRPY_EINVAL);
    CHECK(gdrpy_open(0, 99, &c) == GDRPY_EINVAL);
    CHECK(gdrpy_open(0, GDRPY_BACKEND_SIM, NULL) == GDRPY_EINVAL);
    CHECK(gdrpy_open(3, GDRPY_BACKEND_SIM, &c) == GDRPY_ENODEV);
    c = open_sim();
    CHECK(c);
    gdrpy_pin_t p;
    uint64_t d;
    CHECK(gdrpy_sim_alloc(PAGE, &d) == 0);
    CHECK(gdrpy_pin(c, 0, 8, 0, &p) == GDRPY_EINVAL);
    CHECK(gdrpy_pin(c, d, 0, 0, &p) == GDRPY_EINVAL);
    CHECK(gdrpy_pin(c, UINT64_MAX - 4, 8, 0, &p) == GDRPY_EINVAL);
    CHECK(gdrpy_pin(c, d, 8, 0x80, &p) == GDRPY_EINVAL);
    CHECK(gdrpy_pin(c, d + PAGE - 4, 8, 0, &p) == GDRPY_EINVAL); /* crosses the end */
    unsigned char host[16];
    CHECK(gdrpy_pin(c, (uint64_t)(uintptr_t)host, 16, 0, &p) == GDRPY_EINVAL);
    CHECK(strstr(gdrpy_last_error(), "sim") != NULL);
    CHECK(gdrpy_sim_alloc(0, &d) == GDRPY_EINVAL);
    CHECK(gdrpy_set_copy_isa("nope") == GDRPY_EINVAL);
    CHECK(gdrpy_backend_from_name("nvrm") == GDRPY_BACKEND_NVRM);
    CHECK(gdrpy_backend_from_name("x") == -1);
    CHECK(gdrpy_close(c) == 0);
    return 0;
}

static int freed_memory_stays_alive_for_the_pin_and_never_aliases(void)
{
    gdrpy_ctx_t c = open_sim();
    CHECK(c);
    uint64_t d, d2;
    CHECK(gdrpy_sim_alloc(PAGE, &d) == 0);
    gdrpy_pin_t p;
    CHECK(gdrpy_pin(c, d, PAGE, 0, &p) == 0);
    void *up;
    CHECK(gdrpy_map(c, p, NULL, &up) == 0);
    memcpy(up, "old!", 4);
    CHECK(gdrpy_sim_free(d) == 0);
    CHECK(gdrpy_sim_alloc(PAGE, &d2) == 0);
    CHECK(gdrpy_memcpy_htod(c, d2, "new!", 4) == 0);
    CHECK(memcmp(up, "old!", 4) == 0);
    CHECK(gdrpy_close(c) == 0);
    CHECK(gdrpy_sim_free(d2) == 0);
    return 0;
}

static int forked_child_gets_eacces(void)
{
    gdrpy_ctx_t c = open_sim();
    CHECK(c);
    uint64_t d;
    CHECK(gdrpy_sim_alloc(PAGE, &d) == 0);
    gdrpy_pin_t p;
    CHECK(gdrpy_pin(c, d, PAGE, 0, &p) == 0);
    CHECK(gdrpy_map(c, p, NULL, NULL) == 0);
    CHECK(gdrpy_write(c, p, 0, "secret", 6) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        char buf[8] = {0};
        int bad = 0;
        if (gdrpy_read(c, p, 0, buf, 6) != GDRPY_EACCES) bad |= 1;
        if (memcmp(buf, "secret", 6) == 0) bad |= 2;
        if (gdrpy_map(c, p, NULL, NULL) != GDRPY_EACCES) bad |= 4;
        gdrpy_pin_t p2;
        if (gdrpy_pin(c, d, 8, 0, &p2) != GDRPY_EACCES) bad |= 8;
        _exit(bad);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char buf[8] = {0};
    CHECK(gdrpy_read(c, p, 0, buf, 6) == 0 && memcmp(buf, "secret", 6) == 0);
    CHECK(gdrpy_close(c) == 0);
    CHECK(gdrpy_sim_free(d) == 0);
    return 0;
}

struct thr {
    gdrpy_ctx_t c;
    gdrpy_pin_t p;
    int id;
    int bad;
};

static void *thr_main(void *arg)
{
    struct thr *t = arg;
    unsigned char data[4096], back[4096];
    memset(data, t->id, sizeof data);
    if (gdrpy_map(t->c, t->p, NULL, NULL)) {
        t->bad = 1;
        return NULL;
    }
    for (int i = 0; i < 50; i++) {
        if (gdrpy_write(t->c, t->p, 0, data, sizeof data) ||
            gdrpy_read(t->c, t->p, 0, back, sizeof back) || memcmp(back, data, sizeof data))
            t->bad = 2;
    }
    if (gdrpy_unmap(t->c, t->p)) t->bad = 3;
    return NULL;
}

static int pins_from_one_thread_map_and_copy_in_others(void)
{
    gdrpy_ctx_t c = open_sim();
    CHECK(c);
    uint64_t d;
    CHECK(gdrpy_sim_alloc(8 * PAGE, &d) == 0);
    struct thr t[8];
    pthread_t th[8];
    for (int i = 0; i < 8; i++) {
        t[i].c = c;
        t[i].id = i + 1;
        t[i].bad = 0;
        CHECK(gdrpy_pin(c, d + (uint64_t)i * PAGE, 4096, 0, &t[i].p) == 0);
    }
    for (int i = 0; i < 8; i++) pthread_create(&th[i], NULL, thr_main, &t[i]);
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 8; i++) CHECK(t[i].bad == 0);
    CHECK(gdrpy_close(c) == 0);
    CHECK(gdrpy_sim_free(d) == 0);
    return 0;
}

static int many_cycles_leak_no_fds(void)
{
    int fd0 = dup(0);
    close(fd0);
    gdrpy_ctx_t c = open_sim();
    CHECK(c);
    uint64_t d;
    CHECK(gdrpy_sim_alloc(PAGE, &d) == 0);
    for (int i = 0; i < 2000; i++) {
        gdrpy_pin_t p;
        CHECK(gdrpy_pin(c, d, PAGE, 0, &p) == 0);
        CHECK(gdrpy_map(c, p, NULL, NULL) == 0);
        CHECK(gdrpy_unmap(c, p) == 0);
        CHECK(gdrpy_unpin(c, p) == 0);
    }
    CHECK(gdrpy_close(c) == 0);
    CHECK(gdrpy_sim_free(d) == 0);
    int fd1 = dup(0);
    close(fd1);
    CHECK(fd1 == fd0);
    return 0;
}

/* ---- teardown while other threads copy (issue 17) ---------------------- */
struct racer {
    gdrpy_ctx_t c;
    gdrpy_pin_t p;
    int stop; /* both set and read with __atomic (the main thread and racers) */
    int bad;
    long n;
};

static void *racer_main(void *arg)
{
    struct racer *r = arg;
    static unsigned char data[PAGE];
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
        int rc = gdrpy_write(r->c, r->p, 0, data, sizeof data);
        if (rc == 0) {
            __atomic_fetch_add(&r->n, 1, __ATOMIC_RELAXED);
            continue;
        }
        /* the pin or context went away under us: a clear error, never a fault */
        if (rc != GDRPY_EINVAL && rc != GDRPY_EBUSY && rc != GDRPY_EBADF) r->bad = rc;
        break;
    }
    return NULL;
}

static int teardown_waits_for_copies_in_other_threads(void)
{
    uint64_t d;
    CHECK(gdrpy_sim_alloc(PAGE, &d) == 0);
    for (int what = 0; what < 3; what++) { /* unmap, unpin, close */
        for (int round = 0; round < 20; round++) {
            gdrpy_ctx_t c = open_sim();
            CHECK(c);
            gdrpy_pin_t p;
            CHECK(gdrpy_pin(c, d, PAGE, 0, &p) == 0);
            CHECK(gdrpy_map(c, p, NULL, NULL) == 0);
            struct racer r[4];
            pthread_t th[4];
            for (int i = 0; i < 4; i++) {
                r[i] = (struct racer){.c = c, .p = p};
                pthread_create(&th[i], NULL, racer_main, &r[i]);
            }
            usleep(200 + 100 * round);
            int rc;
            if (what == 0) {
                rc = gdrpy_unmap(c, p);
            } else if (what == 1) {
                /* unpin of a mapped pin is refused; unmap first, as users must */
                CHECK(gdrpy_unpin(c, p) == GDRPY_EBUSY);
                rc = gdrpy_unmap(c, p);
                if (rc == 0) rc = gdrpy_unpin(c, p);
            } else {
                rc = gdrpy_close(c);
            }
            CHECK(rc == 0); /* the bounded wait was long enough */
            for (int i = 0; i < 4; i++) __atomic_store_n(&r[i].stop, 1, __ATOMIC_RELEASE);
            for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
            for (int i = 0; i < 4; i++) CHECK(r[i].bad == 0);
            if (what != 2) CHECK(gdrpy_close(c) == 0);
        }
    }
    CHECK(gdrpy_sim_free(d) == 0);
    return 0;
}

static int open_close_never_wait_on_other_contexts_copies(void)
{
    gdrpy_ctx_t c = open_sim();
    CHECK(c);
    uint64_t d;
    CHECK(gdrpy_sim_alloc(PAGE, &d) == 0);
    gdrpy_pin_t p;
    CHECK(gdrpy_pin(c, d, PAGE, 0, &p) == 0);
    CHECK(gdrpy_map(c, p, NULL, NULL) == 0);
    struct racer r[8];
    pthread_t th[8];
    for (int i = 0; i < 8; i++) {
        r[i] = (struct racer){.c = c, .p = p};
        pthread_create(&th[i], NULL, racer_main, &r[i]);
    }
    for (int w = 0; w < 10000; w++) { /* every copier is running (<= 10 s) */
        int all = 1;
        for (int i = 0; i < 8; i++) all &= __atomic_load_n(&r[i].n, __ATOMIC_RELAXED) > 0;
        if (all) break;
        usleep(1000);
    }
    /* Functional (timing is gdrpy_apilat's job): 200 opens and closes of other
     * contexts complete while 8 threads copy; before issue 17 the first one
     * blocked until the copies stopped. */
    for (int i = 0; i < 200; i++) {
        gdrpy_ctx_t o = open_sim();
        CHECK(o);
        CHECK(gdrpy_close(o) == 0);
    }
    for (int i = 0; i < 8; i++) __atomic_store_n(&r[i].stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 8; i++) CHECK(r[i].bad == 0 && r[i].n > 0);
    CHECK(gdrpy_close(c) == 0);
    CHECK(gdrpy_sim_free(d) == 0);
    return 0;
}

static int auto_never_picks_sim(void)
{
    gdrpy_ctx_t c = 0;
    unsetenv("GDRPY_BACKEND");
    int rc = gdrpy_open(0, GDRPY_BACKEND_AUTO, &c);
    if (rc == 0) {
        gdrpy_ctx_info_t info;
        CHECK(gdrpy_ctx_get_info(c, &info) == 0);
        CHECK(info.backend != GDRPY_BACKEND_SIM);
        CHECK(gdrpy_close(c) == 0);
    } else {
        CHECK(strstr(gdrpy_last_error(), "sim") != NULL); /* says how to get sim */
    }
    setenv("GDRPY_BACKEND", "sim", 1);
    CHECK(gdrpy_open(0, GDRPY_BACKEND_AUTO, &c) == 0);
    gdrpy_ctx_info_t info;
    CHECK(gdrpy_ctx_get_info(c, &info) == 0);
    CHECK(info.backend == GDRPY_BACKEND_SIM && strcmp(info.backend_name, "sim") == 0);
    CHECK(gdrpy_close(c) == 0);
    unsetenv("GDRPY_BACKEND");
    return 0;
}

/* Teardown hooks (gp_ctx_attach): the layers above the core hang their
 * per-context state on the context; gdrpy_close runs the hooks once, newest
 * first, after the pins are gone. */
static int hook_order[GP_CTX_HOOKS], hook_runs;
static int64_t hook_pins_left = -1;

static void hook_record(void *arg)
{
    hook_order[hook_runs++] = (int)(intptr_t)arg;
}

static void hook_other(void *arg)
{
    hook_record(arg);
}

static void hook_count_pins(void *arg)
{
    hook_pins_left = ((gp_ctx *)arg)->npins;
}

static int close_runs_teardown_hooks_newest_first(void)
{
    gdrpy_ctx_t h = open_sim();
    CHECK(h);
    uint64_t d;
    CHECK(gdrpy_sim_alloc(PAGE, &d) == 0);
    gdrpy_pin_t p;
    CHECK(gdrpy_pin(h, d, PAGE, 0, &p) == 0);
    gp_ctx *c;
    CHECK(gp_ctx_enter(h, &c, "test") == 0);
    CHECK(gp_ctx_attached(c, hook_record) == NULL);
    CHECK(gp_ctx_attach(c, hook_count_pins, c) == 0);
    CHECK(gp_ctx_attach(c, hook_record, (void *)(intptr_t)1) == 0);
    CHECK(gp_ctx_attach(c, hook_other, (void *)(intptr_t)2) == 0);
    CHECK(gp_ctx_attached(c, hook_record) == (void *)(intptr_t)1); /* the first with fn */
    CHECK(gp_ctx_attached(c, hook_other) == (void *)(intptr_t)2);
    int i = 3;
    while (i < GP_CTX_HOOKS) CHECK(gp_ctx_attach(c, hook_record, (void *)(intptr_t)i++) == 0);
    CHECK(gp_ctx_attach(c, hook_record, (void *)(intptr_t)i) == GDRPY_ENOMEM);
    CHECK(strstr(gdrpy_last_error(), "teardown hooks") != NULL);
    CHECK(c->npins == 1);
    gp_ctx_leave(c);
    hook_runs = 0;
    CHECK(gdrpy_close(h) == 0);
    CHECK(hook_runs == GP_CTX_HOOKS - 1); /* every hook but hook_count_pins records */
    for (int k = 0; k < hook_runs; k++) CHECK(hook_order[k] == GP_CTX_HOOKS - 1 - k);
    CHECK(hook_pins_left == 0); /* ran last, after the pins were torn down */
    CHECK(gdrpy_sim_free(d) == 0);
    return 0;
}

/* gp_chan_pin_hold(hold <= 0) drops only a hold it raised (issue 45): a
 * stray release while a copy is in flight changes nothing, so an unmap still
 * waits for that copy; before, it dropped the copy's count. */
static int a_stray_channel_release_changes_nothing(void)
{
    gdrpy_ctx_t h = open_sim();
    CHECK(h);
    uint64_t d;
    CHECK(gdrpy_sim_alloc(PAGE, &d) == 0);
    gdrpy_pin_t ph;
    CHECK(gdrpy_pin(h, d, PAGE, 0, &ph) == 0);
    CHECK(gdrpy_map(h, ph, NULL, NULL) == 0);
    gp_ctx *c;
    gp_pin *p;
    CHECK(gp_copy_begin(h, ph, 0, 8, &d, 1, "test copy", &c, &p) == 0); /* a copy in flight */
    CHECK(atomic_load(&p->inflight) == 1);
    CHECK(gp_chan_pin_hold(h, ph, 0, NULL, NULL, NULL) == GDRPY_EINVAL);
    CHECK(strstr(gdrpy_last_error(), "holds no channel") != NULL);
    CHECK(atomic_load(&p->inflight) == 1); /* the copy's count is untouched */
    gdrpy_pin_info_t info;
    int dev = -1, real = -1;
    CHECK(gp_chan_pin_hold(h, ph, 1, &info, &dev, &real) == 0); /* a channel holds it */
    CHECK(atomic_load(&p->inflight) == 2 && info.mapped && dev == 0 && real == 0);
    CHECK(gp_chan_pin_hold(h, ph, 0, NULL, NULL, NULL) == 0);
    CHECK(gp_chan_pin_hold(h, ph, -1, NULL, NULL, NULL) == GDRPY_EINVAL); /* once only */
    CHECK(atomic_load(&p->inflight) == 1);
    gp_copy_end(c, p);
    CHECK(gdrpy_unmap(h, ph) == 0 && gdrpy_unpin(h, ph) == 0);
    CHECK(gp_chan_pin_hold(h, ph, 0, NULL, NULL, NULL) == GDRPY_EBADF); /* unpinned */
    CHECK(gdrpy_close(h) == 0);
    CHECK(gdrpy_sim_free(d) == 0);
    return 0;
}

/* Pins run without the context lock (issue 45): threads pinning, mapping,
 * unmapping and unpinning pins of their own run beside threads copying
 * through an existing mapping, on one context; every call succeeds, every
 * copy lands, nothing is left.  (The sanitizer stage runs it under TSan.) */
struct pinner {
    gdrpy_ctx_t c;
    uint64_t d;
    int stop, bad;
    long n;
};

static void *pinner_main(void *arg)
{
    struct pinner *w = arg;
    while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) {
        gdrpy_pin_t p;
        int rc = gdrpy_pin(w->c, w->d, PAGE, 0, &p);
        if (!rc) rc = gdrpy_map(w->c, p, NULL, NULL);
        uint64_t v = (uint64_t)w->n, back = 0;
        if (!rc) rc = gdrpy_write(w->c, p, 8, &v, 8);
        if (!rc) rc = gdrpy_read(w->c, p, 8, &back, 8);
        if (!rc && back != v) rc = -1;
        if (!rc) rc = gdrpy_unmap(w->c, p);
        if (!rc) rc = gdrpy_unpin(w->c, p);
        if (rc) {
            w->bad = rc;
            break;
        }
        __atomic_fetch_add(&w->n, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static int pins_run_beside_copies_and_unpins(void)
{
    gdrpy_ctx_t c = open_sim();
    CHECK(c);
    enum { NP = 3,
           NC = 2 };
    uint64_t shared, own[NP];
    CHECK(gdrpy_sim_alloc(PAGE, &shared) == 0);
    for (int i = 0; i < NP; i++) CHECK(gdrpy_sim_alloc(PAGE, &own[i]) == 0);
    gdrpy_pin_t sp;
    CHECK(gdrpy_pin(c, shared, PAGE, 0, &sp) == 0);
    CHECK(gdrpy_map(c, sp, NULL, NULL) == 0);
    struct racer r[NC];
    struct pinner w[NP];
    pthread_t tr[NC], tw[NP];
    for (int i = 0; i < NC; i++) {
        r[i] = (struct racer){.c = c, .p = sp};
        pthread_create(&tr[i], NULL, racer_main, &r[i]);
    }
    for (int i = 0; i < NP; i++) {
        w[i] = (struct pinner){.c = c, .d = own[i]};
        pthread_create(&tw[i], NULL, pinner_main, &w[i]);
    }
    for (int k = 0; k < 10000; k++) { /* every thread did some work (<= 10 s) */
        int all = 1;
        for (int i = 0; i < NP; i++) all &= __atomic_load_n(&w[i].n, __ATOMIC_RELAXED) >= 50;
        for (int i = 0; i < NC; i++) all &= __atomic_load_n(&r[i].n, __ATOMIC_RELAXED) >= 50;
        if (all) break;
        usleep(1000);
    }
    for (int i = 0; i < NP; i++) __atomic_store_n(&w[i].stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < NC; i++) __atomic_store_n(&r[i].stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < NP; i++) pthread_join(tw[i], NULL);
    for (int i = 0; i < NC; i++) pthread_join(tr[i], NULL);
    for (int i = 0; i < NP; i++) CHECK(w[i].bad == 0 && w[i].n > 0);
    for (int i = 0; i < NC; i++) CHECK(r[i].bad == 0 && r[i].n > 0);
    uint64_t live = 99;
    CHECK(gdrpy_ctx_live_objects(c, &live) == 0 && live == 2); /* the shared pin + mapping */
    CHECK(gdrpy_unmap(c, sp) == 0 && gdrpy_unpin(c, sp) == 0);
    CHECK(gdrpy_close(c) == 0);
    CHECK(gdrpy_sim_free(shared) == 0);
    for (int i = 0; i < NP; i++) CHECK(gdrpy_sim_free(own[i]) == 0);
    return 0;
}

int main(void)
{
    RUN(pin_map_write_read_roundtrip);
    RUN(out_of_range_copies_are_refused_and_touch_nothing);
    RUN(lifetimes_are_enforced);
    RUN(bad_arguments_get_clear_errors);
    RUN(freed_memory_stays_alive_for_the_pin_and_never_aliases);
    RUN(forked_child_gets_eacces);
    RUN(pins_from_one_thread_map_and_copy_in_others);
    RUN(many_cycles_leak_no_fds);
    RUN(teardown_waits_for_copies_in_other_threads);
    RUN(open_close_never_wait_on_other_contexts_copies);
    RUN(auto_never_picks_sim);
    RUN(close_runs_teardown_hooks_newest_first);
    RUN(a_stray_channel_release_changes_nothing);
    RUN(pins_run_beside_copies_and_unpins);
    printf("test_core: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
