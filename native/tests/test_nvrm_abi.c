/*
 * test_nvrm_abi.c - the nvrm backend's ABI tables without a GPU: every
 * branch's table agrees with our definitions (abi.h), and the table chosen
 * for a driver version is the right one.  (tests/test_nvrm_abi.py checks our
 * definitions against the records of each branch's headers.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/backends/nvrm/nvrm.h"
#include "tally.h"


static const char *pick(const char *version, const char *force, int *newer)
{
    char why[256] = "";
    const struct nvrm_abi *t = nvrm_abi_select(version, force, newer, why, sizeof why);
    return t ? t->branch : NULL;
}

int main(void)
{
    static const char *const branches[] = {"535", "550", "560", "565", "570", "575", "580",
                                           "590", "595"};
    size_t n = nvrm_abi_count();
    CHECK(n == sizeof branches / sizeof branches[0], "%zu tables", n);
    for (size_t i = 0; i < n; i++) {
        const struct nvrm_abi *t = nvrm_abi_at(i);
        char why[256] = "";
        CHECK(strcmp(t->branch, branches[i]) == 0, "table %zu is %s", i, t->branch);
        CHECK(strncmp(t->tag, t->branch, 3) == 0 && t->tag[3] == '.', "tag %s", t->tag);
        CHECK(nvrm_abi_consistent(t, why, sizeof why) == 0, "%s", why);
        /* and a wrong table is caught */
        struct nvrm_abi bad = *t;
        bad.rm_map.size += 8;
        CHECK(nvrm_abi_consistent(&bad, why, sizeof why) != 0 && strstr(why, "RM_MAP_MEMORY"),
              "%s", why);
        bad = *t;
        bad.export_off_max_objects = 10;
        CHECK(nvrm_abi_consistent(&bad, why, sizeof why) != 0, "export offset");
    }
    /* 535 has the short GET_EXPORT_OBJECT_INFO, later branches the long one. */
    CHECK(nvrm_abi_at(0)->size_export_info == sizeof(nv0000_export_info_v535_t), "535");
    CHECK(nvrm_abi_at(1)->size_export_info == sizeof(nv0000_export_info_t), "550");

    int newer = -1;
    const char *b;
    b = pick("580.159.04", NULL, &newer);
    CHECK(b && !strcmp(b, "580") && newer == 0, "580.159.04 -> %s", b ? b : "none");
    b = pick("535.54.03", "", &newer);
    CHECK(b && !strcmp(b, "535") && newer == 0, "535.54.03 -> %s", b ? b : "none");
    b = pick("545.29.06", NULL, &newer); /* a branch without a table: the older one */
    CHECK(b && !strcmp(b, "535") && newer == 0, "545 -> %s", b ? b : "none");
    b = pick("600.10", NULL, &newer); /* newer than every table: the newest */
    CHECK(b && !strcmp(b, "595") && newer == 1, "600 -> %s newer %d", b ? b : "none", newer);
    b = pick("470.256.02", NULL, &newer); /* older than every table: refused... */
    CHECK(b == NULL, "470 -> %s", b ? b : "none");
    b = pick("470.256.02", "1", &newer); /* ...unless forced, to the oldest */
    CHECK(b && !strcmp(b, "535"), "470 forced -> %s", b ? b : "none");
    b = pick("580.159.04", "570", &newer); /* a table by hand */
    CHECK(b && !strcmp(b, "570"), "force 570 -> %s", b ? b : "none");
    b = pick("580.159.04", "999", &newer);
    CHECK(b == NULL, "force 999 -> %s", b ? b : "none");
    b = pick("garbage", NULL, &newer);
    CHECK(b == NULL, "garbage -> %s", b ? b : "none");

    /* The test-only corruption changes what goes to the driver. */
    struct nvrm_abi t = *nvrm_abi_at(6);
    setenv("GDRPY_NVRM_TEST_CORRUPT_ABI", "1", 1);
    CHECK(nvrm_abi_test_corrupt(&t) == 1 && t.rm_map.size == sizeof(nv_os33_fd_t) - 8,
          "corrupt 1: %u", t.rm_map.size);
    unsetenv("GDRPY_NVRM_TEST_CORRUPT_ABI");
    t = *nvrm_abi_at(6);
    CHECK(nvrm_abi_test_corrupt(&t) == 0 && t.rm_map.size == sizeof(nv_os33_fd_t), "none");

    printf("test_nvrm_abi: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
