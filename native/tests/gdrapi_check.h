/*
 * gdrapi_check.h - the case harness of the libgdrapi.so.2 C tests (test_gdrapi,
 * test_gdrapi_compat): CHECK/CHECK_EQ mark the running case failed and go on,
 * REQUIRE/REQUIRE_EQ mark it failed and end it, SKIP(why) ends it as skipped
 * (a case that failed before it skips still counts as failed); run_case()
 * runs one case by name, skipping cases that need device memory when
 * tm_init() did not succeed (set mem_ok).  Include after gdrapi_testmem.h.
 */
#ifndef GDRPY_TESTS_GDRAPI_CHECK_H
#define GDRPY_TESTS_GDRAPI_CHECK_H

#include <stdio.h>
#include <string.h>

static int n_pass, n_fail, n_skip;
static int t_failed;
static const char *t_skip;

/* eq_failed(): reports a failed a == b and marks the running case failed. */
static int eq_failed(const char *file, int line, const char *ea, const char *eb, long long va,
                     long long vb)
{
    if (va == vb) return 0;
    fprintf(stderr, "    %s:%d: %s == %s failed: %lld != %lld\n", file, line, ea, eb, va, vb);
    t_failed = 1;
    return 1;
}
static int cond_failed(const char *file, int line, const char *what, const char *ec, int ok)
{
    if (ok) return 0;
    fprintf(stderr, "    %s:%d: %s(%s) failed\n", file, line, what, ec);
    t_failed = 1;
    return 1;
}

#define CHECK(c) ((void)cond_failed(__FILE__, __LINE__, "CHECK", #c, !!(c)))
#define CHECK_EQ(a, b) \
    ((void)eq_failed(__FILE__, __LINE__, #a, #b, (long long)(a), (long long)(b)))
/* Stop the case when a precondition fails. */
#define REQUIRE(c)                                                 \
    do {                                                           \
        if (cond_failed(__FILE__, __LINE__, "REQUIRE", #c, !!(c))) \
            return;                                                \
    } while (0)
#define REQUIRE_EQ(a, b)                                                           \
    do {                                                                           \
        if (eq_failed(__FILE__, __LINE__, #a, #b, (long long)(a), (long long)(b))) \
            return;                                                                \
    } while (0)
#define SKIP(why)       \
    do {                \
        t_skip = (why); \
        return;         \
    } while (0)

static int mem_ok; /* tm_init succeeded */

/* needs_dev: the case opens an instance or allocates device memory. */
static void run_case(const char *name, void (*fn)(void), int needs_dev, const char *filter)
{
    if (filter && !strstr(name, filter)) return;
    t_failed = 0;
    t_skip = NULL;
    if (needs_dev && !mem_ok) t_skip = tm.why;
    else fn();
    if (t_skip && !t_failed) {
        n_skip++;
        printf("SKIP %s (%s)\n", name, t_skip);
    } else if (t_failed) {
        n_fail++;
        printf("FAIL %s\n", name);
    } else {
        n_pass++;
        printf("PASS %s\n", name);
    }
    fflush(stdout);
}

#endif
