/*
 * test_gdrapi_dlopen.c - loads libgdrapi with dlopen and resolves every
 * GDRCopy 2.6 symbol by name, as NCCL does, using its own declarations of
 * the types (not gdrapi.h), then runs pin/map/copy/verify/unmap/unpin.
 *
 * Usage: test_gdrapi_dlopen [path-to-libgdrapi.so]   (default "libgdrapi.so")
 * GDRPY_BACKEND=sim runs on the sim backend (the gdrpy sim helpers are looked
 * up in the same handle); otherwise it needs a GPU (libcuda is dlopen'ed).
 * Last line: "test_gdrapi_dlopen: N passed, M failed".
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdrapi_testmem.h"

/* The caller's own view of the ABI, as NCCL keeps one. */
typedef struct {
    unsigned long h;
} my_mh_t;
typedef struct {
    uint64_t va, mapped_size;
    uint32_t page_size;
    uint64_t tm_cycles;
    uint32_t cycles_per_ms;
    unsigned mapped : 1;
    unsigned wc_mapping : 1;
} my_info_v1_t;
typedef struct {
    uint64_t va, mapped_size;
    uint32_t page_size;
    uint64_t tm_cycles;
    uint32_t cycles_per_ms;
    unsigned mapped : 1;
    unsigned wc_mapping : 1;
    int mapping_type;
} my_info_v2_t;
typedef void *my_gdr_t;

static struct {
    my_gdr_t (*open)(void);
    int (*close)(my_gdr_t);
    int (*pin_buffer)(my_gdr_t, unsigned long, size_t, uint64_t, uint32_t, my_mh_t *);
    int (*pin_buffer_v2)(my_gdr_t, unsigned long, size_t, uint32_t, my_mh_t *);
    int (*unpin_buffer)(my_gdr_t, my_mh_t);
    int (*get_callback_flag)(my_gdr_t, my_mh_t, int *);
    int (*get_info)(my_gdr_t, my_mh_t, my_info_v1_t *);
    int (*get_info_v2)(my_gdr_t, my_mh_t, my_info_v2_t *);
    int (*map)(my_gdr_t, my_mh_t, void **, size_t);
    int (*map_v2)(my_gdr_t, my_mh_t, void **, size_t, int);
    int (*unmap)(my_gdr_t, my_mh_t, void *, size_t);
    int (*copy_to_mapping)(my_mh_t, void *, const void *, size_t);
    int (*copy_from_mapping)(my_mh_t, void *, const void *, size_t);
    void (*runtime_get_version)(int *, int *);
    void (*driver_get_version_void)(my_gdr_t, int *, int *); /* NCCL's prototype */
    int (*driver_get_version)(my_gdr_t, int *, int *);
    int (*get_attribute)(my_gdr_t, int, int *);
    int (*get_mapping_type_string)(int, const char **);
} api;

static int n_pass, n_fail;

static void check(int ok, const char *what)
{
    if (ok) n_pass++;
    else n_fail++;
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
}

#define CHK(cond) check((cond), #cond)

static int resolve(void *lib)
{
    static const struct {
        const char *name;
        void **slot;
    } syms[] = {
        {"gdr_open", (void **)&api.open},
        {"gdr_close", (void **)&api.close},
        {"gdr_pin_buffer", (void **)&api.pin_buffer},
        {"gdr_pin_buffer_v2", (void **)&api.pin_buffer_v2},
        {"gdr_unpin_buffer", (void **)&api.unpin_buffer},
        {"gdr_get_callback_flag", (void **)&api.get_callback_flag},
        {"gdr_get_info", (void **)&api.get_info},
        {"gdr_get_info_v2", (void **)&api.get_info_v2},
        {"gdr_map", (void **)&api.map},
        {"gdr_map_v2", (void **)&api.map_v2},
        {"gdr_unmap", (void **)&api.unmap},
        {"gdr_copy_to_mapping", (void **)&api.copy_to_mapping},
        {"gdr_copy_from_mapping", (void **)&api.copy_from_mapping},
        {"gdr_runtime_get_version", (void **)&api.runtime_get_version},
        {"gdr_driver_get_version", (void **)&api.driver_get_version},
        {"gdr_driver_get_version", (void **)&api.driver_get_version_void},
        {"gdr_get_attribute", (void **)&api.get_attribute},
        {"gdr_get_mapping_type_string", (void **)&api.get_mapping_type_string},
    };
    int missing = 0;
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(lib, syms[i].name);
        if (!*syms[i].slot) {
            printf("FAIL dlsym(%s): %s\n", syms[i].name, dlerror());
            missing++;
        }
    }
    return missing;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "libgdrapi.so";
    void *lib = dlopen(path, RTLD_NOW);
    if (!lib) {
        printf("FAIL dlopen(%s): %s\n", path, dlerror());
        printf("test_gdrapi_dlopen: 0 passed, 1 failed\n");
        return 1;
    }
    int missing = resolve(lib);
    check(missing == 0, "every GDRCopy 2.6 symbol resolves by name");
    if (missing) goto done;

    int major = 0, minor = 0;
    api.runtime_get_version(&major, &minor);
    check(major == 2 && minor >= 6, "gdr_runtime_get_version reports 2.6");

    if (tm_init(lib)) {
        printf("SKIP pin/map cycle: %s\n", tm.why);
        printf("test_gdrapi_dlopen: 1 skipped\n");
        goto done;
    }
    printf("mode: %s\n", tm.sim ? "sim" : "gpu");

    my_gdr_t g = api.open();
    check(g != NULL, "gdr_open returns an instance");
    if (!g) goto done;

    int dmaj = 0, dmin = 0;
    CHK(api.driver_get_version(g, &dmaj, &dmin) == 0 && dmaj >= 2);
    dmaj = dmin = 0;
    api.driver_get_version_void(g, &dmaj, &dmin); /* as NCCL calls it */
    check(dmaj >= 2, "gdr_driver_get_version called through a void prototype fills the version");
    int attr = -1;
    CHK(api.get_attribute(g, 1 /* USE_PERSISTENT_MAPPING */, &attr) == 0 && attr == 1);
    const char *ts = NULL;
    CHK(api.get_mapping_type_string(1, &ts) == 0 && ts && strstr(ts, "WC"));

    size_t size = 2 * 65536;
    tm_buf b;
    if (tm_alloc(&b, size, TM_CUMEMALLOC)) {
        check(0, "device allocation");
        api.close(g);
        goto done;
    }
    my_mh_t mh = {0};
    CHK(api.pin_buffer(g, b.d, size, 0, 0, &mh) == 0 && mh.h != 0);

    my_info_v1_t i1;
    memset(&i1, 0, sizeof i1);
    CHK(api.get_info(g, mh, &i1) == 0 && i1.va == b.d && i1.mapped_size == size &&
        i1.page_size == 65536 && !i1.mapped);

    void *map = NULL;
    CHK(api.map(g, mh, &map, size) == 0 && map != NULL);
    CHK(api.map(g, mh, &map, size) == EAGAIN);
    my_info_v2_t i2;
    memset(&i2, 0, sizeof i2);
    CHK(api.get_info_v2(g, mh, &i2) == 0 && i2.mapped && i2.mapping_type != 0);
    CHK(api.get_info(g, mh, &i1) == 0 && i1.mapped && i1.wc_mapping == (i2.mapping_type == 1));

    unsigned char src[8192], dst[8192];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (unsigned char)(i * 31 + 7);
    CHK(api.copy_to_mapping(mh, (char *)map + 65536 - 13, src, sizeof src) == 0);
    memset(dst, 0, sizeof dst);
    CHK(tm_dtoh(dst, b.d + 65536 - 13, sizeof dst) == 0 && memcmp(src, dst, sizeof src) == 0);
    memset(dst, 0, sizeof dst);
    CHK(api.copy_from_mapping(mh, dst, (char *)map + 65536 - 13, sizeof dst) == 0 &&
        memcmp(src, dst, sizeof src) == 0);
    int flag = -1;
    CHK(api.get_callback_flag(g, mh, &flag) == 0 && flag == 0);

    CHK(api.unmap(g, mh, map, size) == 0);
    CHK(api.unmap(g, mh, map, size) == EINVAL);
    CHK(api.copy_to_mapping(mh, map, src, 8) == EINVAL);
    CHK(api.unpin_buffer(g, mh) == 0);

    /* v2 entry points */
    my_mh_t mh2 = {0};
    CHK(api.pin_buffer_v2(g, b.d, 65536, 0, &mh2) == 0);
    CHK(api.map_v2(g, mh2, &map, 65536, 1 /* REQ_WC */) == 0);
    CHK(api.copy_to_mapping(mh2, map, src, 64) == 0);
    CHK(tm_dtoh(dst, b.d, 64) == 0 && memcmp(src, dst, 64) == 0);
    /* left mapped and pinned: gdr_close releases both */
    CHK(api.close(g) == 0);
    CHK(api.copy_to_mapping(mh2, map, src, 8) == EINVAL);
    tm_free(&b);
    tm_fini();
done:
    printf("test_gdrapi_dlopen: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
