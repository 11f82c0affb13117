/*
 * check.h - the small test harness the C tests of the core share: CHECK(cond)
 * fails the current test (a function returning int) with the library's last
 * error; RUN(fn) runs one test and counts it.  Each test program prints
 * "<name>: N passed, M failed" from `passed` and `failed` at the end.
 */
#ifndef GDRPY_TESTS_CHECK_H
#define GDRPY_TESTS_CHECK_H

#include <stdio.h>

#include "gdrpy.h"

static int passed, failed;
static const char *cur;

#define CHECK(cond)                                                             \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "  FAIL %s:%d %s: %s (last error: %s)\n", __FILE__, \
                    __LINE__, cur, #cond, gdrpy_last_error());                  \
            return 1;                                                           \
        }                                                                       \
    } while (0)

#define RUN(fn)                       \
    do {                              \
        cur = #fn;                    \
        if (fn()) {                   \
            failed++;                 \
            printf("FAIL %s\n", #fn); \
        } else {                      \
            passed++;                 \
            printf("ok   %s\n", #fn); \
        }                             \
    } while (0)

#endif
