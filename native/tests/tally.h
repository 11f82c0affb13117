/*
 * tally.h - the assertion counter of the table and fake-driver tests: CHECK(cond,
 * fmt, ...) counts every assertion in `passed` or `failed` and goes on, printing the
 * condition and the formatted detail when it fails.  (check.h is the other harness:
 * its CHECK ends the current test function.)  Each program prints
 * "<name>: N passed, M failed" at the end.
 */
#ifndef GDRPY_TESTS_TALLY_H
#define GDRPY_TESTS_TALLY_H

#include <stdio.h>

static int passed, failed;

#define CHECK(cond, ...)                                           \
    do {                                                           \
        if (cond) {                                                \
            passed++;                                              \
        } else {                                                   \
            failed++;                                              \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            printf(__VA_ARGS__);                                   \
            printf("\n");                                          \
        }                                                          \
    } while (0)

#endif
