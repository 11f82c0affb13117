/*
 * ptimer.h - the round-trip timer of the channel's C tools.  A ping-pong
 * sample is two timer reads around one round trip, so the timer's own cost
 * is inside every sample; on a VM clock_gettime() can cost a good part of a
 * microsecond (no vDSO for its clock source).  pt_init() measures what a
 * read of clock_gettime(CLOCK_MONOTONIC) and of the x86 TSC (rdtscp) cost
 * here and picks the cheaper (the TSC is converted to ns against
 * CLOCK_MONOTONIC over a calibration interval); pt_report() says which and
 * what each costs, so the numbers can be read with that in mind.
 * Header-only.
 */
#ifndef GDRPY_TOOLS_PTIMER_H
#define GDRPY_TOOLS_PTIMER_H

#include <stdint.h>
#include <stdio.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define PT_HAVE_TSC 1
#else
#define PT_HAVE_TSC 0
#endif

static struct {
    int use_tsc;
    double ns_per_tick;
    double clock_cost_ns, tsc_cost_ns;
} pt;

static inline int64_t pt_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline uint64_t pt_tsc(void)
{
#if PT_HAVE_TSC
    unsigned aux;
    return __rdtscp(&aux);
#else
    return 0;
#endif
}

/* A timestamp in timer units (pt_ns converts a difference). */
static inline uint64_t pt_now(void)
{
    return pt.use_tsc ? pt_tsc() : (uint64_t)pt_clock_ns();
}

static inline int64_t pt_ns(uint64_t dt)
{
    return pt.use_tsc ? (int64_t)((double)dt * pt.ns_per_tick + 0.5) : (int64_t)dt;
}

static inline void pt_init(void)
{
    const int n = 20000;
    int64_t a = pt_clock_ns();
    for (int i = 0; i < n; i++) (void)pt_clock_ns();
    pt.clock_cost_ns = (double)(pt_clock_ns() - a) / n;
    pt.use_tsc = 0;
#if PT_HAVE_TSC
    uint64_t t0 = pt_tsc();
    int64_t c0 = pt_clock_ns();
    for (int i = 0; i < n; i++) (void)pt_tsc();
    uint64_t t1 = pt_tsc();
    int64_t c1 = pt_clock_ns();
    /* calibrate over >= 20 ms */
    while (c1 - c0 < 20000000) {
        t1 = pt_tsc();
        c1 = pt_clock_ns();
    }
    if (t1 > t0) {
        pt.ns_per_tick = (double)(c1 - c0) / (double)(t1 - t0);
        uint64_t s = pt_tsc();
        for (int i = 0; i < n; i++) (void)pt_tsc();
        pt.tsc_cost_ns = (double)(pt_tsc() - s) * pt.ns_per_tick / n;
        pt.use_tsc = pt.tsc_cost_ns < pt.clock_cost_ns;
    }
#endif
}

/* JSON fields (no braces): timer, its per-read costs. */
static inline void pt_json(FILE *f)
{
    fprintf(f, "\"timer\": \"%s\", \"clock_gettime_ns\": %.1f, \"rdtscp_ns\": %.1f",
            pt.use_tsc ? "rdtscp" : "clock_gettime", pt.clock_cost_ns, pt.tsc_cost_ns);
}

#endif
