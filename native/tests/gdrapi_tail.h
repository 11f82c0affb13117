/*
 * gdrapi_tail.h - what a GDRCopy client sees of a pin whose GPU pages run
 * past the end of the memory behind the allocation (issue 44): CUDA's RM
 * object behind a large cuMemAlloc allocation is its size rounded up to
 * 4 KiB, and UCX and libfabric pin the whole last 64 KiB page.
 *
 * tail_expect() pins [lo, hi) of the allocation [a, a + n) whose memory ends
 * `obj` bytes after a, and checks: gdr_get_info reports the whole GPU pages;
 * gdr_map of them works (of more is refused); the allocation's last bytes
 * are written and read back (the device side through `dtoh`); the object's
 * last bytes read; copies that reach past the object's end are refused
 * with ERANGE, past the mapping with EINVAL; a raw load past the object's
 * end faults, the object's last byte reads.  Returns the number of failed
 * expectations, each printed.  Used by test_gdrapi (sim with
 * GDRPY_SIM_BACKING=4k, and the GPU) and the fake-driver test.
 */
#ifndef GDRPY_TESTS_GDRAPI_TAIL_H
#define GDRPY_TESTS_GDRAPI_TAIL_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gdrapi.h"
#include "faults.h"

#define TAIL_PAGE 65536ull

/* The bytes from lo (GPU page aligned) to the end of hi's GPU page. */
static uint64_t tail_pages(uint64_t lo, uint64_t hi)
{
    return ((hi + TAIL_PAGE - 1) & ~(TAIL_PAGE - 1)) - lo;
}

static int tail_bad(const char *what, const char *expect, int ok)
{
    if (!ok) printf("    tail %s: %s failed\n", what, expect);
    return !ok;
}

static __attribute__((unused)) int tail_expect(gdr_t g, const char *what, uint64_t a, uint64_t n,
                                               uint64_t obj, uint64_t lo, uint64_t hi,
                                               int (*dtoh)(void *, uint64_t, size_t))
{
    gdr_mh_t mh;
    int rc = gdr_pin_buffer(g, lo, hi - lo, 0, 0, &mh);
    if (rc) {
        printf("    tail %s: pin [0x%llx, +0x%llx): %d\n", what, (unsigned long long)lo,
               (unsigned long long)(hi - lo), rc);
        return 1;
    }
    int bad = 0;
    const uint64_t whole = tail_pages(lo, hi);
    gdr_info_v2_t info;
    memset(&info, 0, sizeof info);
    bad += tail_bad(what, "gdr_get_info reports the whole GPU pages",
                    gdr_get_info_v2(g, mh, &info) == 0 && info.va == lo &&
                        info.mapped_size == whole && info.page_size == TAIL_PAGE);
    void *map = NULL;
    bad += tail_bad(what, "gdr_map past the pages is refused",
                    gdr_map(g, mh, &map, whole + TAIL_PAGE) == EINVAL);
    rc = gdr_map(g, mh, &map, whole);
    bad += tail_bad(what, "gdr_map of the whole GPU pages", rc == 0 && map);
    if (!rc) {
        char *m = map;
        const uint64_t own = obj - (lo - a), end = a + n - lo;
        uint8_t buf[256], got[256];
        for (int i = 0; i < 256; i++) buf[i] = (uint8_t)(i ^ 0x5c ^ (uint8_t)n);
        bad += tail_bad(what, "a write of the allocation's last bytes",
                        gdr_copy_to_mapping(mh, m + end - 256, buf, 256) == 0);
        bad += tail_bad(what, "the allocation's last bytes arrive",
                        dtoh(got, a + n - 256, 256) == 0 && memcmp(got, buf, 256) == 0);
        memset(got, 0, sizeof got);
        bad += tail_bad(what, "the allocation's last bytes read back",
                        gdr_copy_from_mapping(mh, got, m + end - 256, 256) == 0 &&
                            memcmp(got, buf, 256) == 0);
        bad += tail_bad(what, "a read of the object's last bytes",
                        gdr_copy_from_mapping(mh, got, m + own - 8, 8) == 0);
        bad += tail_bad(what, "a write running past the object's end: ERANGE",
                        gdr_copy_to_mapping(mh, m + own - 8, buf, 16) == ERANGE);
        bad += tail_bad(what, "a read past the object's end: ERANGE",
                        gdr_copy_from_mapping(mh, got, m + own, 8) == ERANGE);
        bad += tail_bad(what, "a write at the end of the GPU pages: ERANGE",
                        gdr_copy_to_mapping(mh, m + whole - 8, buf, 8) == ERANGE);
        bad += tail_bad(what, "a write past the mapping: EINVAL",
                        gdr_copy_to_mapping(mh, m + whole, buf, 8) == EINVAL);
        bad += tail_bad(what, "a load of the object's last byte", !read_faults(m + own - 1));
        bad += tail_bad(what, "a load past the object's end faults",
                        read_faults(m + own) && read_faults(m + whole - 1));
        bad += tail_bad(what, "gdr_unmap", gdr_unmap(g, mh, map, whole) == 0);
    }
    bad += tail_bad(what, "gdr_unpin_buffer", gdr_unpin_buffer(g, mh) == 0);
    return bad;
}

#endif
