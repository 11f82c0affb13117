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

#define CHECK(c)                                                                      \
    do {                                                                              \
        if (!(c)) {                                                                   \
            fprintf(stderr, "    %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c); \
            t_failed = 1;                                                             \
        }                                                                             \
    } while (0)
#define CHECK_EQ(a, b)                                                              \
    do {                                                                            \
        long long va_ = (long long)(a), vb_ = (long long)(b);                       \
        if (va_ != vb_) {                                                           \
            fprintf(stderr, "    %s:%d: %s == %s failed: %lld != %lld\n", __FILE__, \
                    __LINE__, #a, #b, va_, vb_);                                    \
            t_failed = 1;                                                           \
        }                                                                           \
    } while (0)
/* Stops the case when a precondition fails. */
#define REQUIRE_EQ(a, b)                                                            \
    do {                                                                            \
        long long va_ = (long long)(a), vb_ = (long long)(b);                       \
        if (va_ != vb_) {                                                           \
            fprintf(stderr, "    %s:%d: %s == %s failed: %lld != %lld\n", __FILE__, \
                    __LINE__, #a, #b, va_, vb_);                                    \
            t_failed = 1;                                                           \
            return;                                                                 \
        }                                                                           \
    } while (0)
#define REQUIRE(c)                                                                      \
    do {                                                                                \
        if (!(c)) {                                                                     \
            fprintf(stderr, "    %s:%d: REQUIRE(%s) failed\n", __FILE__, __LINE__, #c); \
            t_failed = 1;                                                               \
            return;                                                                     \
        }                                                                               \
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
