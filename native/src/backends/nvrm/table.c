/*
 * table.c - nvrm backend: choosing the ABI table for the running driver.
 *
 * The driver's version string ("580.159.04", from NV_ESC_CHECK_VERSION_STR;
 * open and proprietary kernel modules share the RM interface) names its
 * branch.  The table of that branch is used; a branch we have no table for
 * takes the newest table older than it, and a driver newer than every table
 * takes the newest one.  Whatever is chosen, the self-test (selftest.c)
 * proves it on this driver before any user memory is pinned.
 *
 * GDRPY_NVRM_FORCE=<branch> (e.g. 570) picks a table by hand, and
 * GDRPY_NVRM_FORCE=1 lets a driver older than every table try the oldest;
 * both still run the self-test.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi_tables.h"
#include "nvrm.h"

/* ---- the same layout on every LP64 target we build (docs/arm.md) ----- */
#define NVRM_LAYOUT(t, sz) _Static_assert(sizeof(t) == (sz), #t " size")
NVRM_LAYOUT(nv_os00_t, 16);
NVRM_LAYOUT(nv_os21_t, 32);
NVRM_LAYOUT(nv_os54_t, 32);
NVRM_LAYOUT(nv_os55_t, 28);
NVRM_LAYOUT(nv_os33_fd_t, 56);
NVRM_LAYOUT(nv_os34_t, 32);
NVRM_LAYOUT(nv_card_info_t, 72);
NVRM_LAYOUT(nv_version_t, 72);
NVRM_LAYOUT(nv0080_alloc_t, 56);
NVRM_LAYOUT(nv0000_id_info_v2_t, 32);
NVRM_LAYOUT(nv0000_export_info_t, 80);
NVRM_LAYOUT(nv0000_export_info_v535_t, 76);
NVRM_LAYOUT(nv0000_import_t, 652);
_Static_assert(offsetof(nv_os21_t, pAllocParms) == 16 && offsetof(nv_os21_t, status) == 28,
               "NVOS21");
_Static_assert(offsetof(nv_os54_t, params) == 16 && offsetof(nv_os54_t, status) == 28, "NVOS54");
_Static_assert(offsetof(nv_os55_t, status) == 24, "NVOS55");
_Static_assert(offsetof(nv_os33_fd_t, offset) == 16 && offsetof(nv_os33_fd_t, pLinearAddress) == 32 &&
                   offsetof(nv_os33_fd_t, status) == 40 && offsetof(nv_os33_fd_t, flags) == 44 &&
                   offsetof(nv_os33_fd_t, fd) == 48,
               "NVOS33 + fd");
_Static_assert(offsetof(nv_os34_t, pLinearAddress) == 16 && offsetof(nv_os34_t, status) == 24,
               "NVOS34");
_Static_assert(offsetof(nv_card_info_t, domain) == 4 && offsetof(nv_card_info_t, gpu_id) == 16 &&
                   offsetof(nv_card_info_t, reg_address) == 24 &&
                   offsetof(nv_card_info_t, minor_number) == 56,
               "card info");
_Static_assert(offsetof(nv0080_alloc_t, vaSpaceSize) == 24 && offsetof(nv0080_alloc_t, vaMode) == 48,
               "NV0080 alloc");
_Static_assert(offsetof(nv0000_import_t, objectTypes) == 520 &&
                   offsetof(nv0000_import_t, numObjects) == 648,
               "import from fd");
_Static_assert(_Alignof(nv_os21_t) == 8 && _Alignof(nv_os54_t) == 8 && _Alignof(nv_os33_fd_t) == 8 &&
                   _Alignof(nv_os34_t) == 8 && _Alignof(nv_card_info_t) == 8 &&
                   _Alignof(nv0080_alloc_t) == 8,
               "64-bit members 8-byte aligned, as NvP64/NvU64");
_Static_assert(sizeof(void *) == 8 && sizeof(long) == 8, "LP64");
#if defined(__x86_64__) || defined(__aarch64__)
/* Both use the asm-generic ioctl encoding, as the driver's numbers do. */
_Static_assert(NV_IOC(0x2A, 32) == 0xc020462au, "ioctl encoding");
#endif

#define NTABLES (sizeof nvrm_abi_tables / sizeof nvrm_abi_tables[0])

size_t nvrm_abi_count(void) { return NTABLES; }

const struct nvrm_abi *nvrm_abi_at(size_t i) { return i < NTABLES ? &nvrm_abi_tables[i] : NULL; }

/* Our definitions (abi.h) must be what the table says the driver takes:
 * the table's sizes are passed to the driver while our structs are what we
 * fill, so a disagreement would make the driver read or write past them. */
int nvrm_abi_consistent(const struct nvrm_abi *t, char *why, size_t whylen)
{
#define SAME(a, b, what)                                                                     \
    if ((uint64_t)(a) != (uint64_t)(b)) {                                                    \
        snprintf(why, whylen, "ABI table %s (%s): %s is %llu, our definition has %llu",      \
                 t->branch, t->tag, what, (unsigned long long)(a), (unsigned long long)(b)); \
        return -1;                                                                           \
    }
    SAME(t->card_info.size, sizeof(nv_card_info_t), "the CARD_INFO record size");
    SAME(t->check_version.size, sizeof(nv_version_t), "the CHECK_VERSION_STR argument size");
    SAME(t->rm_free.size, sizeof(nv_os00_t), "the RM_FREE argument size");
    SAME(t->rm_control.size, sizeof(nv_os54_t), "the RM_CONTROL argument size");
    SAME(t->rm_alloc.size, sizeof(nv_os21_t), "the RM_ALLOC argument size");
    SAME(t->rm_dup.size, sizeof(nv_os55_t), "the RM_DUP_OBJECT argument size");
    SAME(t->rm_map.size, sizeof(nv_os33_fd_t), "the RM_MAP_MEMORY argument size");
    SAME(t->rm_unmap.size, sizeof(nv_os34_t), "the RM_UNMAP_MEMORY argument size");
    SAME(t->size_device_alloc, sizeof(nv0080_alloc_t), "the NV01_DEVICE_0 parameter size");
    SAME(t->size_id_info_v2, sizeof(nv0000_id_info_v2_t), "the GPU_GET_ID_INFO_V2 size");
    SAME(t->size_import_from_fd, sizeof(nv0000_import_t), "the IMPORT_OBJECTS_FROM_FD size");
    SAME(t->caching_hi - t->caching_lo, NVOS33_CACHING_TYPE_HI - NVOS33_CACHING_TYPE_LO,
         "the NVOS33 caching-type field width");
    if (t->size_export_info == sizeof(nv0000_export_info_t)) {
        SAME(t->export_off_device_instance, offsetof(nv0000_export_info_t, deviceInstance),
             "GET_EXPORT_OBJECT_INFO.deviceInstance");
        SAME(t->export_off_max_objects, offsetof(nv0000_export_info_t, maxObjects),
             "GET_EXPORT_OBJECT_INFO.maxObjects");
    } else if (t->size_export_info == sizeof(nv0000_export_info_v535_t)) {
        SAME(t->export_off_device_instance, offsetof(nv0000_export_info_v535_t, deviceInstance),
             "GET_EXPORT_OBJECT_INFO.deviceInstance (535 layout)");
        SAME(t->export_off_max_objects, offsetof(nv0000_export_info_v535_t, maxObjects),
             "GET_EXPORT_OBJECT_INFO.maxObjects (535 layout)");
    } else {
        snprintf(why, whylen, "ABI table %s (%s): GET_EXPORT_OBJECT_INFO is %u bytes, a layout "
                              "we have no definition for",
                 t->branch, t->tag, t->size_export_info);
        return -1;
    }
#undef SAME
    return 0;
}

/* Picks the table for `version` ("580.159.04").  `force` is GDRPY_NVRM_FORCE
 * (NULL/"" = none).  Returns NULL with the reason in why. */
const struct nvrm_abi *nvrm_abi_select(const char *version, const char *force, int *newer,
                                       char *why, size_t whylen)
{
    *newer = 0;
    int major = version ? atoi(version) : 0;
    if (force && force[0] && strcmp(force, "0") != 0 && strcmp(force, "1") != 0) {
        for (size_t i = 0; i < NTABLES; i++)
            if (strcmp(nvrm_abi_tables[i].branch, force) == 0) return &nvrm_abi_tables[i];
        snprintf(why, whylen, "GDRPY_NVRM_FORCE=%s names no ABI table (tables: %s..%s)", force,
                 nvrm_abi_tables[0].branch, nvrm_abi_tables[NTABLES - 1].branch);
        return NULL;
    }
    if (major <= 0) {
        snprintf(why, whylen, "the NVIDIA driver version \"%s\" cannot be parsed; set "
                              "GDRPY_NVRM_FORCE=<branch> (e.g. 580) to choose an ABI table",
                 version ? version : "");
        return NULL;
    }
    const struct nvrm_abi *best = NULL;
    for (size_t i = 0; i < NTABLES; i++)
        if (atoi(nvrm_abi_tables[i].branch) <= major) best = &nvrm_abi_tables[i];
    if (!best) {
        if (force && strcmp(force, "1") == 0) return &nvrm_abi_tables[0];
        snprintf(why, whylen, "NVIDIA driver %s is older than every ABI table (oldest: %s, "
                              "tag %s); GDRPY_NVRM_FORCE=1 tries that table under the self-test",
                 version,
                 nvrm_abi_tables[0].branch, nvrm_abi_tables[0].tag);
        return NULL;
    }
    if (major > atoi(nvrm_abi_tables[NTABLES - 1].branch)) *newer = 1;
    return best;
}

int nvrm_abi_test_corrupt(struct nvrm_abi *t)
{
    const char *s = getenv("GDRPY_NVRM_TEST_CORRUPT_ABI");
    int mode = s ? atoi(s) : 0;
    if (mode == 1) t->rm_map.size -= 8; /* the driver checks it exactly: maps fail */
    return mode == 1 || mode == 2 ? mode : 0;
}
