/*
 * test_gdrapi.c - libgdrapi.so.2 (gdrpy's GDRCopy drop-in) against
 * GDRCopy 2.6's semantics, compiled against our gdrapi.h and linked with
 * -lgdrapi as users do.
 *
 * GDRPY_BACKEND=sim: memory from gdrpy_sim_alloc, the device side checked
 * with gdrpy_memcpy_dtoh/htod (the subset CI runs).  Otherwise: a GPU,
 * memory from cuMemAlloc and cuMemCreate, checked with cuMemcpyDtoH/HtoD
 * (libcuda dlopen'ed).  Cases are named by what they assert and follow
 * GDRCopy's sanity list where it applies.
 *
 * Usage: test_gdrapi [substring]   (runs only the cases whose name contains it)
 * The last line is "test_gdrapi: N passed, M failed"; exit status 1 if M > 0.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gdrapi.h"
#include "gdrapi_testmem.h"

/* The exported v1 symbol, reached past the header's gdr_get_info macro. */
#define gdr_get_info_v1_sym(g, h, i) (gdr_get_info)((g), (h), (i))

#include "gdrapi_check.h"
#include "gdrapi_tail.h"

/* ---- helpers ------------------------------------------------------------ */
static uint32_t rng_state = 12345;
static uint32_t rnd(void)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return rng_state;
}

static void fill_walking(void *p, size_t n, uint32_t seed)
{
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)((1u << ((i + seed) % 8)) ^ (i >> 8) ^ seed);
}

/* Allocates device memory and pins it (size bytes at an aligned address). */
typedef struct fixture {
    gdr_t g;
    tm_buf buf;
    gdr_mh_t mh;
    void *map;
    size_t size;
} fixture;

static int fx_setup(fixture *f, size_t size, int kind, int map)
{
    memset(f, 0, sizeof *f);
    f->size = size;
    f->g = gdr_open();
    if (!f->g) {
        fprintf(stderr, "    gdr_open failed (errno %d)\n", errno);
        return -1;
    }
    if (tm_alloc(&f->buf, size, kind)) return -1;
    int rc = gdr_pin_buffer(f->g, f->buf.d, size, 0, 0, &f->mh);
    if (rc) {
        fprintf(stderr, "    gdr_pin_buffer: %d (%s)\n", rc, strerror(rc));
        return -1;
    }
    if (map) {
        rc = gdr_map(f->g, f->mh, &f->map, size);
        if (rc) {
            fprintf(stderr, "    gdr_map: %d (%s)\n", rc, strerror(rc));
            return -1;
        }
    }
    return 0;
}

static void fx_teardown(fixture *f)
{
    if (f->g) {
        if (f->map) CHECK_EQ(gdr_unmap(f->g, f->mh, f->map, f->size), 0);
        if (f->mh.h) CHECK_EQ(gdr_unpin_buffer(f->g, f->mh), 0);
        CHECK_EQ(gdr_close(f->g), 0);
    }
    tm_free(&f->buf);
    memset(f, 0, sizeof *f);
}

/* ==== versions, attributes, strings ===================================== */
static void t_runtime_version_is_2_6(void)
{
    int major = -1, minor = -1;
    gdr_runtime_get_version(&major, &minor);
    CHECK_EQ(major, 2);
    CHECK_EQ(minor, 6);
    CHECK_EQ((major << 16) | minor, GDR_API_VERSION);
}

static void t_driver_version_meets_minimum(void)
{
    gdr_t g = gdr_open();
    REQUIRE(g != NULL);
    int major = -1, minor = -1;
    CHECK_EQ(gdr_driver_get_version(g, &major, &minor), 0);
    CHECK(((major << 16) | minor) >= MINIMUM_GDRDRV_VERSION);
    CHECK_EQ(gdr_driver_get_version(NULL, &major, &minor), EINVAL);
    CHECK_EQ(gdr_close(g), 0);
}

static void t_attributes_report_persistent_mapping(void)
{
    gdr_t g = gdr_open();
    REQUIRE(g != NULL);
    int v = -1;
    CHECK_EQ(gdr_get_attribute(g, GDR_ATTR_USE_PERSISTENT_MAPPING, &v), 0);
    CHECK_EQ(v, 1);
    v = -1;
    CHECK_EQ(gdr_get_attribute(g, GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE, &v), 0);
    CHECK(v == 0 || v == 1);
    v = -1;
    CHECK_EQ(gdr_get_attribute(g, GDR_ATTR_USING_DMA_BUF_MMAP, &v), 0);
    CHECK(v == 0 || v == 1);
    if (tm.sim) CHECK_EQ(v, 0);
    CHECK_EQ(gdr_get_attribute(g, (gdr_attr_t)0, &v), EINVAL);
    CHECK_EQ(gdr_get_attribute(g, (gdr_attr_t)99, &v), EINVAL);
    CHECK_EQ(gdr_get_attribute(g, GDR_ATTR_USE_PERSISTENT_MAPPING, NULL), EINVAL);
    CHECK_EQ(gdr_get_attribute(NULL, GDR_ATTR_USE_PERSISTENT_MAPPING, &v), EINVAL);
    CHECK_EQ(gdr_close(g), 0);
}

static void t_mapping_type_strings_name_each_type(void)
{
    const char *s = NULL;
    CHECK_EQ(gdr_get_mapping_type_string(GDR_MAPPING_TYPE_NONE, &s), 0);
    CHECK(s && strstr(s, "NONE"));
    CHECK_EQ(gdr_get_mapping_type_string(GDR_MAPPING_TYPE_WC, &s), 0);
    CHECK(s && strstr(s, "WC"));
    CHECK_EQ(gdr_get_mapping_type_string(GDR_MAPPING_TYPE_CACHING, &s), 0);
    CHECK(s && strstr(s, "CACHING"));
    CHECK_EQ(gdr_get_mapping_type_string(GDR_MAPPING_TYPE_DEVICE, &s), 0);
    CHECK(s && strstr(s, "DEVICE"));
    CHECK_EQ(gdr_get_mapping_type_string((gdr_mapping_type_t)42, &s), EINVAL);
    CHECK_EQ(gdr_get_mapping_type_string(GDR_MAPPING_TYPE_WC, NULL), EINVAL);
}

static void t_struct_layouts_match_gdrcopy(void)
{
    CHECK_EQ(sizeof(gdr_mh_t), 8);
    CHECK_EQ(sizeof(gdr_info_v2_t), 48);
    CHECK_EQ(sizeof(gdr_info_v1_t), 40);
    CHECK_EQ(offsetof(gdr_info_v2_t, mapping_type), 40);
    CHECK_EQ(offsetof(gdr_info_v2_t, cycles_per_ms), 32);
    gdr_info_v2_t i;
    memset(&i, 0, sizeof i);
    i.mapped = 1;
    i.wc_mapping = 1;
    uint32_t word;
    memcpy(&word, (char *)&i + 36, 4);
    CHECK_EQ(word, 3);
    CHECK_EQ(GPU_PAGE_SIZE, 65536);
    CHECK_EQ(GPU_PAGE_OFFSET, 65535);
    CHECK_EQ(GPU_PAGE_MASK, ~65535UL);
}

/* ==== open / close ======================================================= */
static void t_open_returns_null_on_bad_environment(void)
{
    char *old = getenv("GDRPY_BACKEND") ? strdup(getenv("GDRPY_BACKEND")) : NULL;
    setenv("GDRPY_BACKEND", "no-such-backend", 1);
    errno = 0;
    gdr_t g = gdr_open();
    CHECK(g == NULL);
    CHECK_EQ(errno, EINVAL);
    if (old) setenv("GDRPY_BACKEND", old, 1);
    else unsetenv("GDRPY_BACKEND");
    free(old);

    char *olddev = getenv("GDRPY_DEVICE") ? strdup(getenv("GDRPY_DEVICE")) : NULL;
    setenv("GDRPY_DEVICE", "zero", 1);
    g = gdr_open();
    CHECK(g == NULL);
    if (olddev) setenv("GDRPY_DEVICE", olddev, 1);
    else unsetenv("GDRPY_DEVICE");
    free(olddev);
    g = gdr_open();
    CHECK(g != NULL);
    if (g) CHECK_EQ(gdr_close(g), 0);
}

static void t_open_close_many_instances(void)
{
    gdr_t gs[8];
    for (int i = 0; i < 8; i++) {
        gs[i] = gdr_open();
        CHECK(gs[i] != NULL);
    }
    for (int i = 0; i < 8; i++)
        if (gs[i]) CHECK_EQ(gdr_close(gs[i]), 0);
}

static void t_bad_instance_pointers_are_einval(void)
{
    gdr_mh_t mh = {0};
    long junk[64] = {0};
    gdr_t bogus = (gdr_t)junk;
    CHECK_EQ(gdr_close(NULL), EINVAL);
    CHECK_EQ(gdr_close(bogus), EINVAL);
    CHECK_EQ(gdr_pin_buffer(NULL, 0x10000, 65536, 0, 0, &mh), EINVAL);
    CHECK_EQ(gdr_pin_buffer(bogus, 0x10000, 65536, 0, 0, &mh), EINVAL);
    CHECK_EQ(mh.h, 0);
    gdr_t g = gdr_open();
    REQUIRE(g != NULL);
    CHECK_EQ(gdr_close(g), 0);
    /* A closed instance is refused, not dereferenced as open. */
    CHECK_EQ(gdr_close(g), EINVAL);
    CHECK_EQ(gdr_pin_buffer(g, 0x10000, 65536, 0, 0, &mh), EINVAL);
}

/* ==== basic pin / map ==================================================== */
static void basic_cycle(int kind, int v2)
{
    if (kind == TM_VMM && tm.sim) SKIP("cuMemCreate memory needs a GPU");
    gdr_t g = gdr_open();
    REQUIRE(g != NULL);
    tm_buf b;
    size_t size = 4 * GPU_PAGE_SIZE;
    REQUIRE_EQ(tm_alloc(&b, size, kind), 0);
    gdr_mh_t mh = {0};
    if (v2) REQUIRE_EQ(gdr_pin_buffer_v2(g, b.d, size, GDR_PIN_FLAG_DEFAULT, &mh), 0);
    else REQUIRE_EQ(gdr_pin_buffer(g, b.d, size, 0, 0, &mh), 0);
    CHECK(mh.h != 0);

    gdr_info_v2_t info;
    CHECK_EQ(gdr_get_info_v2(g, mh, &info), 0);
    CHECK_EQ(info.va, b.d);
    CHECK_EQ(info.mapped_size, size);
    CHECK_EQ(info.page_size, GPU_PAGE_SIZE);
    CHECK_EQ(info.mapped, 0);
    CHECK_EQ(info.mapping_type, GDR_MAPPING_TYPE_NONE);

    void *map = NULL;
    if (v2) REQUIRE_EQ(gdr_map_v2(g, mh, &map, size, GDR_MAP_FLAG_DEFAULT), 0);
    else REQUIRE_EQ(gdr_map(g, mh, &map, size), 0);
    CHECK(map != NULL);
    CHECK_EQ(gdr_get_info_v2(g, mh, &info), 0);
    CHECK_EQ(info.mapped, 1);
    CHECK(info.mapping_type != GDR_MAPPING_TYPE_NONE);
    CHECK_EQ(info.wc_mapping, info.mapping_type == GDR_MAPPING_TYPE_WC);
    if (!tm.sim) CHECK_EQ(info.mapping_type, GDR_MAPPING_TYPE_WC);

    /* Round trip of one page through the mapping and the device side. */
    uint8_t *src = malloc(GPU_PAGE_SIZE), *dst = malloc(GPU_PAGE_SIZE);
    fill_walking(src, GPU_PAGE_SIZE, 7);
    CHECK_EQ(gdr_copy_to_mapping(mh, (char *)map + GPU_PAGE_SIZE, src, GPU_PAGE_SIZE), 0);
    memset(dst, 0, GPU_PAGE_SIZE);
    CHECK_EQ(tm_dtoh(dst, b.d + GPU_PAGE_SIZE, GPU_PAGE_SIZE), 0);
    CHECK(memcmp(src, dst, GPU_PAGE_SIZE) == 0);
    memset(dst, 0, GPU_PAGE_SIZE);
    CHECK_EQ(gdr_copy_from_mapping(mh, dst, (char *)map + GPU_PAGE_SIZE, GPU_PAGE_SIZE), 0);
    CHECK(memcmp(src, dst, GPU_PAGE_SIZE) == 0);
    free(src);
    free(dst);

    CHECK_EQ(gdr_unmap(g, mh, map, size), 0);
    CHECK_EQ(gdr_get_info_v2(g, mh, &info), 0);
    CHECK_EQ(info.mapped, 0);
    CHECK_EQ(info.mapping_type, GDR_MAPPING_TYPE_NONE);
    CHECK_EQ(gdr_unpin_buffer(g, mh), 0);
    CHECK_EQ(gdr_close(g), 0);
    CHECK_EQ(tm_free(&b), 0);
}

static void t_basic_pin_map_cumemalloc_v1(void) { basic_cycle(TM_CUMEMALLOC, 0); }
static void t_basic_pin_map_cumemalloc_v2(void) { basic_cycle(TM_CUMEMALLOC, 1); }
static void t_basic_pin_map_cumemcreate_v1(void) { basic_cycle(TM_VMM, 0); }
static void t_basic_pin_map_cumemcreate_v2(void) { basic_cycle(TM_VMM, 1); }

static void t_pin_with_p2p_token_is_einval(void)
{
    fixture f;
    REQUIRE_EQ(fx_setup(&f, GPU_PAGE_SIZE, TM_CUMEMALLOC, 0), 0);
    gdr_mh_t mh = {123};
    CHECK_EQ(gdr_pin_buffer(f.g, f.buf.d, GPU_PAGE_SIZE, 0xdeadbeef, 1, &mh), EINVAL);
    CHECK_EQ(mh.h, 0);
    CHECK_EQ(gdr_pin_buffer(f.g, f.buf.d, GPU_PAGE_SIZE, 0, 7, &mh), EINVAL);
    fx_teardown(&f);
}

static void t_pin_rejects_bad_arguments(void)
{
    fixture f;
    REQUIRE_EQ(fx_setup(&f, GPU_PAGE_SIZE, TM_CUMEMALLOC, 0), 0);
    gdr_mh_t mh;
    CHECK_EQ(gdr_pin_buffer(f.g, f.buf.d, 0, 0, 0, &mh), EINVAL);
    CHECK_EQ(gdr_pin_buffer(f.g, 0, GPU_PAGE_SIZE, 0, 0, &mh), EINVAL);
    CHECK_EQ(gdr_pin_buffer(f.g, f.buf.d, GPU_PAGE_SIZE, 0, 0, NULL), EINVAL);
    CHECK_EQ(gdr_pin_buffer_v2(f.g, f.buf.d, GPU_PAGE_SIZE, 0x80, &mh), EINVAL);
    /* Host memory is not GPU memory. */
    static char host[1 << 17];
    unsigned long h = ((unsigned long)host + GPU_PAGE_OFFSET) & GPU_PAGE_MASK;
    CHECK(gdr_pin_buffer(f.g, h, GPU_PAGE_SIZE, 0, 0, &mh) != 0);
    fx_teardown(&f);
}

/* One FORCE_PCIE pin of b: accepted (and a write through it arrives) on a
 * coherent GPU, refused with GDRCopy's ENOTSUPP (524) on a PCIe one. */
static void force_pcie_pin(gdr_t g, const tm_buf *b, int coherent)
{
    gdr_mh_t mh = {0};
    int rc = gdr_pin_buffer_v2(g, b->d, GPU_PAGE_SIZE, GDR_PIN_FLAG_FORCE_PCIE, &mh);
    if (!coherent) {
        CHECK_EQ(rc, 524);
        CHECK_EQ(mh.h, 0);
        return;
    }
    CHECK_EQ(rc, 0);
    void *map = NULL;
    CHECK_EQ(gdr_map(g, mh, &map, GPU_PAGE_SIZE), 0);
    uint64_t x = 0x1122334455667788ull, y = 0;
    CHECK_EQ(gdr_copy_to_mapping(mh, map, &x, 8), 0);
    CHECK_EQ(tm_dtoh(&y, b->d, 8), 0);
    CHECK_EQ(x, y);
    CHECK_EQ(gdr_unpin_buffer(g, mh), 0); /* unmaps first */
}

/* The attribute says the flag is understood (as gdrdrv >= 2.5 says); the
 * pin says whether this GPU honours it (issue 44).  Sim runs both branches:
 * a PCIe "GPU" by default, a coherent one with GDRPY_SIM_COHERENT=1. */
static void t_pin_flag_force_pcie_needs_coherent_gpu(void)
{
    tm_buf b;
    REQUIRE_EQ(tm_alloc(&b, GPU_PAGE_SIZE, TM_CUMEMALLOC), 0);
    gdr_t g = gdr_open();
    REQUIRE(g != NULL);
    int supported = -1;
    CHECK_EQ(gdr_get_attribute(g, GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE, &supported), 0);
    CHECK_EQ(supported, 1);
    force_pcie_pin(g, &b, tm_coherent());
    /* the refusal leaves nothing behind: the same pin without the flag works */
    gdr_mh_t mh;
    CHECK_EQ(gdr_pin_buffer_v2(g, b.d, GPU_PAGE_SIZE, GDR_PIN_FLAG_DEFAULT, &mh), 0);
    CHECK_EQ(gdr_close(g), 0);
    if (tm.sim) {
        const char *was = getenv("GDRPY_SIM_COHERENT");
        setenv("GDRPY_SIM_COHERENT", was && !strcmp(was, "1") ? "0" : "1", 1);
        g = gdr_open(); /* a new context asks again */
        CHECK(g != NULL);
        if (g) force_pcie_pin(g, &b, tm_coherent());
        if (g) CHECK_EQ(gdr_close(g), 0);
        if (was) setenv("GDRPY_SIM_COHERENT", was, 1);
        else unsetenv("GDRPY_SIM_COHERENT");
    }
    CHECK_EQ(tm_free(&b), 0);
}

static int tm_dtoh_fn(void *dst, uint64_t src, size_t n) { return tm_dtoh(dst, src, n); }

/* cuMemAlloc(4 GiB + 2) (sim: 1 MiB + 2 with GDRPY_SIM_BACKING=4k): CUDA's
 * memory object ends at +4 GiB + 4 KiB, inside the last GPU page.  Pinned
 * by its exact size, by the 64 KiB-rounded size (UCX) and by libfabric's
 * rule [addr & ~64K, (end & ~64K) + 64K): accepted, mapped whole, the last
 * owned bytes work and the rest of the page stays unreachable
 * (gdrapi_tail.h).  Ranges past that page, or starting in it past the
 * memory, are refused (issue 44). */
static void t_pin_of_last_gpu_page_past_the_memory(void)
{
    const uint64_t n = tm.sim ? (1ull << 20) + 2 : (4ull << 30) + 2;
    tm_buf b;
    REQUIRE_EQ(tm_alloc(&b, n, TM_EXACT), 0);
    REQUIRE_EQ(b.d % GPU_PAGE_SIZE, 0);
    gdr_t g = gdr_open();
    REQUIRE(g != NULL);
    const uint64_t obj = (n + 4095) & ~4095ull, end = b.d + n;
    CHECK_EQ(tail_expect(g, "exact size", b.d, n, obj, b.d, end, tm_dtoh_fn), 0);
    CHECK_EQ(tail_expect(g, "64 KiB-rounded (UCX)", b.d, n, obj, b.d,
                         b.d + tail_pages(b.d, end), tm_dtoh_fn),
             0);
    CHECK_EQ(tail_expect(g, "libfabric's rule", b.d, n, obj, b.d & ~(TAIL_PAGE - 1),
                         (end & ~(TAIL_PAGE - 1)) + TAIL_PAGE, tm_dtoh_fn),
             0);
    gdr_mh_t mh;
    CHECK_EQ(gdr_pin_buffer(g, b.d, tail_pages(b.d, end) + GPU_PAGE_SIZE, 0, 0, &mh), EINVAL);
    CHECK_EQ(gdr_pin_buffer(g, b.d + obj + 64, 16, 0, 0, &mh), EINVAL);
    CHECK_EQ(gdr_close(g), 0);
    CHECK_EQ(tm_free(&b), 0);
}

static void t_get_info_v1_symbol_fills_40_bytes(void)
{
    fixture f;
    REQUIRE_EQ(fx_setup(&f, 2 * GPU_PAGE_SIZE, TM_CUMEMALLOC, 1), 0);
    unsigned char raw[64];
    memset(raw, 0xEE, sizeof raw);
    gdr_info_v1_t *v1 = (gdr_info_v1_t *)raw;
    CHECK_EQ(gdr_get_info_v1_sym(f.g, f.mh, v1), 0);
    gdr_info_v2_t v2;
    CHECK_EQ(gdr_get_info_v2(f.g, f.mh, &v2), 0);
    CHECK_EQ(v1->va, v2.va);
    CHECK_EQ(v1->mapped_size, v2.mapped_size);
    CHECK_EQ(v1->page_size, v2.page_size);
    CHECK_EQ(v1->tm_cycles, v2.tm_cycles);
    CHECK_EQ(v1->cycles_per_ms, v2.cycles_per_ms);
    CHECK_EQ(v1->mapped, 1);
    CHECK_EQ(v1->wc_mapping, v2.wc_mapping);
    /* Nothing written past the v1 layout. */
    for (int i = 40; i < 64; i++) CHECK_EQ(raw[i], 0xEE);
    CHECK(v2.cycles_per_ms > 0);
    CHECK(v2.tm_cycles > 0);
    /* The macro form reaches v2, as GDRCopy 2.6 sources expect. */
    gdr_info_t i;
    memset(&i, 0, sizeof i);
    CHECK_EQ(gdr_get_info(f.g, f.mh, &i), 0);
    CHECK_EQ(i.mapping_type, v2.mapping_type);
    fx_teardown(&f);
}

static void t_info_va_rounds_down_to_gpu_page(void)
{
    fixture f;
    REQUIRE_EQ(fx_setup(&f, 4 * GPU_PAGE_SIZE, TM_CUMEMALLOC, 0), 0);
    gdr_mh_t mh;
    gdr_info_v2_t info;
    REQUIRE_EQ(gdr_pin_buffer(f.g, f.buf.d + 100, 100, 0, 0, &mh), 0);
    CHECK_EQ(gdr_get_info_v2(f.g, mh, &info), 0);
    CHECK_EQ(info.va, f.buf.d);
    CHECK_EQ(info.mapped_size, GPU_PAGE_SIZE);
    CHECK_EQ(gdr_unpin_buffer(f.g, mh), 0);
    /* 16 bytes straddling a page boundary cover two GPU pages. */
    REQUIRE_EQ(gdr_pin_buffer(f.g, f.buf.d + GPU_PAGE_SIZE - 8, 16, 0, 0, &mh), 0);
    CHECK_EQ(gdr_get_info_v2(f.g, mh, &info), 0);
    CHECK_EQ(info.va, f.buf.d);
    CHECK_EQ(info.mapped_size, 2 * GPU_PAGE_SIZE);
    CHECK_EQ(gdr_unpin_buffer(f.g, mh), 0);
    fx_teardown(&f);
}

/* ==== mapping rules ====================================================== */
static void t_unaligned_mapping_fails_next_boundary_works(void)
{
    fixture f;
    size_t size = 3 * GPU_PAGE_SIZE;
    REQUIRE_EQ(fx_setup(&f, size, TM_CUMEMALLOC, 0), 0);
    unsigned long off = 4096 + 12;
    gdr_mh_t mh;
    void *map = NULL;
    REQUIRE_EQ(gdr_pin_buffer(f.g, f.buf.d + off, GPU_PAGE_SIZE, 0, 0, &mh), 0);
    CHECK_EQ(gdr_map(f.g, mh, &map, GPU_PAGE_SIZE), EINVAL);
    CHECK(map == NULL);
    CHECK_EQ(gdr_unpin_buffer(f.g, mh), 0);
    /* The next GPU page boundary maps. */
    unsigned long next = (f.buf.d + off + GPU_PAGE_OFFSET) & GPU_PAGE_MASK;
    REQUIRE_EQ(gdr_pin_buffer(f.g, next, GPU_PAGE_SIZE, 0, 0, &mh), 0);
    CHECK_EQ(gdr_map(f.g, mh, &map, GPU_PAGE_SIZE), 0);
    uint32_t x = 0xA5A5F00D, y = 0;
    CHECK_EQ(gdr_copy_to_mapping(mh, map, &x, 4), 0);
    CHECK_EQ(tm_dtoh(&y, next, 4), 0);
    CHECK_EQ(x, y);
    CHECK_EQ(gdr_unmap(f.g, mh, map, GPU_PAGE_SIZE), 0);
    CHECK_EQ(gdr_unpin_buffer(f.g, mh), 0);
    fx_teardown(&f);
}

static void t_two_small_buffers_in_one_gpu_page(void)
{
    fixture f;
    REQUIRE_EQ(fx_setup(&f, GPU_PAGE_SIZE, TM_CUMEMALLOC, 0), 0);
    gdr_mh_t a, b;
    REQUIRE_EQ(gdr_pin_buffer(f.g, f.buf.d, 8, 0, 0, &a), 0);
    REQUIRE_EQ(gdr_pin_buffer(f.g, f.buf.d + 8, 8, 0, 0, &b), 0);
    CHECK(a.h != b.h);
    gdr_info_v2_t ia, ib;
    CHECK_EQ(gdr_get_info_v2(f.g, a, &ia), 0);
    CHECK_EQ(gdr_get_info_v2(f.g, b, &ib), 0);
    CHECK_EQ(ia.va, ib.va);
    CHECK_EQ(ia.mapped_size, GPU_PAGE_SIZE);
    /* The first starts on the page and maps; the second does not. */
    void *ma = NULL, *mb = NULL;
    CHECK_EQ(gdr_map(f.g, a, &ma, 8), 0);
    CHECK_EQ(gdr_map(f.g, b, &mb, 8), EINVAL);
    if (ma) {
        uint64_t va = 0x0123456789abcdefull, vb = 0xfedcba9876543210ull, got[2] = {0, 0};
        CHECK_EQ(gdr_copy_to_mapping(a, ma, &va, 8), 0);
        /* The rest of the page is reachable through the first mapping. */
        CHECK_EQ(gdr_copy_to_mapping(a, (char *)ma + 8, &vb, 8), 0);
        CHECK_EQ(tm_dtoh(got, f.buf.d, 16), 0);
        CHECK_EQ(got[0], va);
        CHECK_EQ(got[1], vb);
        CHECK_EQ(gdr_unmap(f.g, a, ma, 8), 0);
    }
    CHECK_EQ(gdr_unpin_buffer(f.g, b), 0);
    CHECK_EQ(gdr_unpin_buffer(f.g, a), 0);
    fx_teardown(&f);
}

static void t_second_map_of_handle_is_eagain(void)
{
    fixture f;
    REQUIRE_EQ(fx_setup(&f, GPU_PAGE_SIZE, TM_CUMEMALLOC, 1), 0);
    void *again = f.map;
    CHECK_EQ(gdr_map(f.g, f.mh, &again, GPU_PAGE_SIZE), EAGAIN);
    CHECK_EQ(gdr_map_v2(f.g, f.mh, &again, GPU_PAGE_SIZE, GDR_MAP_FLAG_DEFAULT), EAGAIN);
    /* A refused map leaves the caller's pointer alone. */
    CHECK(again == f.map);
    /* The first mapping is untouched. */
    uint32_t x = 77, y = 0;
    CHECK_EQ(gdr_copy_to_mapping(f.mh, f.map, &x, 4), 0);
    CHECK_EQ(tm_dtoh(&y, f.buf.d, 4), 0);
    CHECK_EQ(y, 77);
    fx_teardown(&f);
}

static void t_unmap_rules_einval(void)
{
    fixture f;
    REQUIRE_EQ(fx_setup(&f, 2 * GPU_PAGE_SIZE, TM_CUMEMALLOC, 0), 0);
    void *map = NULL;
    /* Not mapped yet. */
    CHECK_EQ(gdr_unmap(f.g, f.mh, (void *)0x1000, GPU_PAGE_SIZE), EINVAL);
    REQUIRE_EQ(gdr_map(f.g, f.mh, &map, 2 * GPU_PAGE_SIZE), 0);
    /* Wrong address or size: refused, mapping kept. */
    CHECK_EQ(gdr_unmap(f.g, f.mh, (char *)map + 4096, 2 * GPU_PAGE_SIZE), EINVAL);
    CHECK_EQ(gdr_unmap(f.g, f.mh, map, GPU_PAGE_SIZE), EINVAL);
    uint32_t x = 5;
    CHECK_EQ(gdr_copy_to_mapping(f.mh, map, &x, 4), 0);
    CHECK_EQ(gdr_unmap(f.g, f.mh, map, 2 * GPU_PAGE_SIZE), 0);
    /* Twice. */
    CHECK_EQ(gdr_unmap(f.g, f.mh, map, 2 * GPU_PAGE_SIZE), EINVAL);
    /* Remapping after unmap works. */
    CHECK_EQ(gdr_map(f.g, f.mh, &map, 2 * GPU_PAGE_SIZE), 0);
    f.map = map;
    fx_teardown(&f);
}

static void t_map_size_must_fit_pinned_pages(void)
{
    fixture f;
    REQUIRE_EQ(fx_setup(&f, 2 * GPU_PAGE_SIZE, TM_CUMEMALLOC, 0), 0);
    void *map = NULL;
    CHECK_EQ(gdr_map(f.g, f.mh, &map, 0), EINVAL);
    CHECK_EQ(gdr_map(f.g, f.mh, &map, 3 * GPU_PAGE_SIZE), EINVAL);
    CHECK_EQ(gdr_map(f.g, f.mh, NULL, GPU_PAGE_SIZE), EINVAL);
    /* A smaller size than the pin is accepted. */
    CHECK_EQ(gdr_map(f.g, f.mh, &map, 100), 0);
    CHECK_EQ(gdr_unmap(f.g, f.mh, map, 100), 0);
    fx_teardown(&f);
}

static void t_map_v2_flags_honoured_or_einval(void)
{
    fixture f;
    REQUIRE_EQ(fx_setup(&f, GPU_PAGE_SIZE, TM_CUMEMALLOC, 0), 0);
    void *map = NULL;
    gdr_info_v2_t info;
    /* DEFAULT: whatever the backend gives. */
    REQUIRE_EQ(gdr_map_v2(f.g, f.mh, &map, GPU_PAGE_SIZE, GDR_MAP_FLAG_DEFAULT), 0);
    CHECK_EQ(gdr_get_info_v2(f.g, f.mh, &info), 0);
    gdr_mapping_type_t native = info.mapping_type;
    CHECK(native != GDR_MAPPING_TYPE_NONE);
    CHECK_EQ(gdr_unmap(f.g, f.mh, map, GPU_PAGE_SIZE), 0);
    /* REQ_WC works on GPUs (WC) and on the sim. */
    CHECK_EQ(gdr_map_v2(f.g, f.mh, &map, GPU_PAGE_SIZE, GDR_MAP_FLAG_REQ_WC), 0);
    CHECK_EQ(gdr_unmap(f.g, f.mh, map, GPU_PAGE_SIZE), 0);
    /* REQ_CACHE / REQ_DEVICE: honoured only when that is the native type. */
    int rc = gdr_map_v2(f.g, f.mh, &map, GPU_PAGE_SIZE, GDR_MAP_FLAG_REQ_CACHE);
    if (native == GDR_MAPPING_TYPE_CACHING) {
        CHECK_EQ(rc, 0);
        CHECK_EQ(gdr_unmap(f.g, f.mh, map, GPU_PAGE_SIZE), 0);
    } else {
        CHECK_EQ(rc, EINVAL);
    }
    rc = gdr_map_v2(f.g, f.mh, &map, GPU_PAGE_SIZE, GDR_MAP_FLAG_REQ_DEVICE);
    if (native == GDR_MAPPING_TYPE_DEVICE) {
        CHECK_EQ(rc, 0);
        CHECK_EQ(gdr_unmap(f.g, f.mh, map, GPU_PAGE_SIZE), 0);
    } else {
        CHECK_EQ(rc, EINVAL);
    }
    /* A refused request leaves the handle unmapped and mappable. */
    CHECK_EQ(gdr_get_info_v2(f.g, f.mh, &info), 0);
    CHECK_EQ(info.mapped, 0);
    CHECK_EQ(gdr_map_v2(f.g, f.mh, &map, GPU_PAGE_SIZE, 17), EINVAL);
    CHECK_EQ(gdr_map_v2(f.g, f.mh, &map, GPU_PAGE_SIZE, -1), EINVAL);
    CHECK_EQ(gdr_map_v2(f.g, f.mh, &map, GPU_PAGE_SIZE, GDR_MAP_FLAG_DEFAULT), 0);
    f.map = map;
    fx_teardown(&f);
}

/* ==== data validation ==================================================== */
static void t_data_validation_dword_offsets(void)
{
    size_t size = 4 * GPU_PAGE_SIZE;
    fixture f;
    REQUIRE_EQ(fx_setup(&f, size, TM_CUMEMALLOC, 1), 0);
    uint32_t *src = malloc(size), *dev = malloc(size), *guard = malloc(size);
    const size_t offs[] = {0, 4, 8, 12, 60, 64, 4092, GPU_PAGE_SIZE - 4, GPU_PAGE_SIZE + 4};
    const size_t lens[] = {4, 8, 12, 60, 64, 4096, GPU_PAGE_SIZE + 12};
    for (size_t oi = 0; oi < sizeof offs / sizeof offs[0]; oi++) {
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            size_t off = offs[oi], len = lens[li];
            if (off + len > size) continue;
            for (size_t i = 0; i < size / 4; i++) guard[i] = 0xA5A5A5A5u;
            REQUIRE_EQ(tm_htod(f.buf.d, guard, size), 0);
            /* walking bits */
            for (size_t i = 0; i < len / 4; i++) src[i] = 1u << ((i + oi + li) % 32);
            CHECK_EQ(gdr_copy_to_mapping(f.mh, (char *)f.map + off, src, len), 0);
            REQUIRE_EQ(tm_dtoh(dev, f.buf.d, size), 0);
            int bad = memcmp((char *)dev + off, src, len) != 0 ||
                      memcmp(dev, guard, off) != 0 ||
                      memcmp((char *)dev + off + len, (char *)guard + off + len, size - off - len) != 0;
            if (bad) {
                fprintf(stderr, "    write mismatch at offset %zu len %zu\n", off, len);
                t_failed = 1;
            }
            /* and back out through the mapping */
            for (size_t i = 0; i < len / 4; i++) src[i] = ~(1u << ((i + oi) % 32));
            REQUIRE_EQ(tm_htod(f.buf.d + off, src, len), 0);
            memset(dev, 0, len);
            CHECK_EQ(gdr_copy_from_mapping(f.mh, dev, (char *)f.map + off, len), 0);
            if (memcmp(dev, src, len) != 0) {
                fprintf(stderr, "    read mismatch at offset %zu len %zu\n", off, len);
                t_failed = 1;
            }
        }
    }
    free(src);
    free(dev);
    free(guard);
    fx_teardown(&f);
}

static void t_data_validation_byte_offsets(void)
{
    size_t size = 2 * GPU_PAGE_SIZE;
    fixture f;
    REQUIRE_EQ(fx_setup(&f, size, TM_CUMEMALLOC, 1), 0);
    uint8_t *src = malloc(size), *dev = malloc(size), *guard = malloc(size);
    const size_t offs[] = {1, 2, 3, 5, 7, 15, 31, 63, 65, 4095, GPU_PAGE_SIZE - 3};
    const size_t lens[] = {1, 2, 3, 5, 7, 15, 16, 17, 31, 33, 63, 127, 1000, 4099};
    for (size_t oi = 0; oi < sizeof offs / sizeof offs[0]; oi++) {
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            size_t off = offs[oi], len = lens[li];
            if (off + len > size) continue;
            memset(guard, 0x5A, size);
            REQUIRE_EQ(tm_htod(f.buf.d, guard, size), 0);
            for (size_t i = 0; i < len; i++) src[i] = (uint8_t)(1u << ((i + oi) % 8)) ^ (uint8_t)rnd();
            CHECK_EQ(gdr_copy_to_mapping(f.mh, (char *)f.map + off, src, len), 0);
            REQUIRE_EQ(tm_dtoh(dev, f.buf.d, size), 0);
            int bad = memcmp(dev + off, src, len) != 0 || memcmp(dev, guard, off) != 0 ||
                      memcmp(dev + off + len, guard + off + len, size - off - len) != 0;
            if (bad) {
                fprintf(stderr, "    write mismatch at byte offset %zu len %zu\n", off, len);
                t_failed = 1;
            }
            for (size_t i = 0; i < len; i++) src[i] = (uint8_t)rnd();
            REQUIRE_EQ(tm_htod(f.buf.d + off, src, len), 0);
            memset(dev, 0, len);
            CHECK_EQ(gdr_copy_from_mapping(f.mh, dev, (char *)f.map + off, len), 0);
            if (memcmp(dev, src, len) != 0) {
                fprintf(stderr, "    read mismatch at byte offset %zu len %zu\n", off, len);
                t_failed = 1;
            }
        }
    }
    free(src);
    free(dev);
    free(guard);
    fx_teardown(&f);
}

static void t_mapping_to_mapping_copies(void)
{
    size_t size = 2 * GPU_PAGE_SIZE;
    fixture a, b;
    REQUIRE_EQ(fx_setup(&a, size, TM_CUMEMALLOC, 1), 0);
    if (fx_setup(&b, size, TM_CUMEMALLOC, 1)) {
        t_failed = 1;
        fx_teardown(&a);
        return;
    }
    uint8_t *src = malloc(size), *dst = malloc(size);
    fill_walking(src, size, 3);
    CHECK_EQ(tm_htod(a.buf.d, src, size), 0);
    const size_t offs[] = {0, 4, 1, 3, 4096};
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        size_t off = offs[i], len = size - 2 * off - 1;
        memset(dst, 0, size);
        CHECK_EQ(tm_htod(b.buf.d, dst, size), 0);
        /* mapping A -> mapping B */
        CHECK_EQ(gdr_copy_to_mapping(b.mh, (char *)b.map + off, (char *)a.map + off, len), 0);
        CHECK_EQ(tm_dtoh(dst, b.buf.d, size), 0);
        CHECK(memcmp(dst + off, src + off, len) == 0);
        /* and back with copy_from_mapping (B -> A) */
        fill_walking(src, size, (uint32_t)i + 11);
        CHECK_EQ(tm_htod(b.buf.d, src, size), 0);
        CHECK_EQ(gdr_copy_from_mapping(b.mh, (char *)a.map + off, (char *)b.map + off, len), 0);
        CHECK_EQ(tm_dtoh(dst, a.buf.d, size), 0);
        CHECK(memcmp(dst + off, src + off, len) == 0);
        memcpy(src, dst, size); /* A's contents for the next round */
    }
    free(src);
    free(dst);
    fx_teardown(&b);
    fx_teardown(&a);
}

/* ==== copy argument checks ============================================== */
static void t_copy_checks_handle_state_and_range(void)
{
    fixture f;
    REQUIRE_EQ(fx_setup(&f, 2 * GPU_PAGE_SIZE, TM_CUMEMALLOC, 0), 0);
    char buf[64] = {0};
    void *map = NULL;
    /* Pinned but unmapped: EINVAL, even for size 0. */
    CHECK_EQ(gdr_copy_to_mapping(f.mh, (void *)0x1000, buf, 8), EINVAL);
    CHECK_EQ(gdr_copy_from_mapping(f.mh, buf, (void *)0x1000, 8), EINVAL);
    CHECK_EQ(gdr_copy_to_mapping(f.mh, (void *)0x1000, buf, 0), EINVAL);
    REQUIRE_EQ(gdr_map(f.g, f.mh, &map, 2 * GPU_PAGE_SIZE), 0);
    f.map = map;
    /* size 0 is a no-op */
    CHECK_EQ(gdr_copy_to_mapping(f.mh, map, buf, 0), 0);
    CHECK_EQ(gdr_copy_from_mapping(f.mh, buf, map, 0), 0);
    CHECK_EQ(gdr_copy_to_mapping(f.mh, map, NULL, 0), 0);
    /* bad handles */
    gdr_mh_t zero = {0}, junk = {0x7777777700001234ul}, shifted = {f.mh.h + (1ul << 32)};
    CHECK_EQ(gdr_copy_to_mapping(zero, map, buf, 8), EINVAL);
    CHECK_EQ(gdr_copy_to_mapping(junk, map, buf, 8), EINVAL);
    CHECK_EQ(gdr_copy_to_mapping(shifted, map, buf, 8), EINVAL);
    CHECK_EQ(gdr_copy_from_mapping(junk, buf, map, 8), EINVAL);
    /* outside the mapping: refused before touching memory */
    char *end = (char *)map + 2 * GPU_PAGE_SIZE;
    CHECK_EQ(gdr_copy_to_mapping(f.mh, end - 8, buf, 16), EINVAL);
    CHECK_EQ(gdr_copy_to_mapping(f.mh, end, buf, 1), EINVAL);
    CHECK_EQ(gdr_copy_from_mapping(f.mh, buf, (char *)map - 1, 2), EINVAL);
    CHECK_EQ(gdr_copy_to_mapping(f.mh, buf, buf + 8, 8), EINVAL);
    /* the last bytes are fine */
    CHECK_EQ(gdr_copy_to_mapping(f.mh, end - 8, buf, 8), 0);
    CHECK_EQ(gdr_copy_to_mapping(f.mh, map, NULL, 8), EINVAL);
    fx_teardown(&f);
}

static void t_stale_and_foreign_handles_are_einval(void)
{
    fixture f;
    REQUIRE_EQ(fx_setup(&f, GPU_PAGE_SIZE, TM_CUMEMALLOC, 0), 0);
    gdr_mh_t old = f.mh;
    CHECK_EQ(gdr_unpin_buffer(f.g, old), 0);
    f.mh.h = 0;
    gdr_info_v2_t info;
    void *map;
    int flag;
    CHECK_EQ(gdr_unpin_buffer(f.g, old), EINVAL);
    CHECK_EQ(gdr_get_info_v2(f.g, old, &info), EINVAL);
    CHECK_EQ(gdr_map(f.g, old, &map, GPU_PAGE_SIZE), EINVAL);
    CHECK_EQ(gdr_get_callback_flag(f.g, old, &flag), EINVAL);
    /* A new pin reusing the slot gets a different handle; the old one stays dead. */
    gdr_mh_t fresh;
    REQUIRE_EQ(gdr_pin_buffer(f.g, f.buf.d, GPU_PAGE_SIZE, 0, 0, &fresh), 0);
    CHECK(fresh.h != old.h);
    CHECK_EQ(gdr_get_info_v2(f.g, old, &info), EINVAL);
    /* Another instance's handle is refused. */
    gdr_t g2 = gdr_open();
    REQUIRE(g2 != NULL);
    CHECK_EQ(gdr_get_info_v2(g2, fresh, &info), EINVAL);
    CHECK_EQ(gdr_map(g2, fresh, &map, GPU_PAGE_SIZE), EINVAL);
    CHECK_EQ(gdr_unpin_buffer(g2, fresh), EINVAL);
    CHECK_EQ(gdr_close(g2), 0);
    f.mh = fresh;
    fx_teardown(&f);
}

/* ==== lifetimes ========================================================== */
static void t_unpin_while_mapped_unmaps_first(void)
{
    fixture f;
    REQUIRE_EQ(fx_setup(&f, GPU_PAGE_SIZE, TM_CUMEMALLOC, 1), 0);
    CHECK_EQ(gdr_unpin_buffer(f.g, f.mh), 0);
    uint32_t x = 1;
    CHECK_EQ(gdr_copy_to_mapping(f.mh, f.map, &x, 4), EINVAL);
    f.map = NULL;
    f.mh.h = 0;
    fx_teardown(&f);
}

static void t_close_unmaps_and_unpins_everything(void)
{
    gdr_t g = gdr_open();
    REQUIRE(g != NULL);
    enum { N = 6 };
    tm_buf b[N];
    gdr_mh_t mh[N];
    void *map[N];
    for (int i = 0; i < N; i++) {
        REQUIRE_EQ(tm_alloc(&b[i], GPU_PAGE_SIZE, TM_CUMEMALLOC), 0);
        REQUIRE_EQ(gdr_pin_buffer(g, b[i].d, GPU_PAGE_SIZE, 0, 0, &mh[i]), 0);
        if (i % 2 == 0) REQUIRE_EQ(gdr_map(g, mh[i], &map[i], GPU_PAGE_SIZE), 0);
    }
    CHECK_EQ(gdr_close(g), 0);
    /* Access after gdr_close: every handle is dead. */
    uint32_t x = 9;
    for (int i = 0; i < N; i += 2) CHECK_EQ(gdr_copy_to_mapping(mh[i], map[i], &x, 4), EINVAL);
    for (int i = 0; i < N; i++) CHECK_EQ(tm_free(&b[i]), 0);
    /* A new instance works and does not see the old handles. */
    gdr_t g2 = gdr_open();
    REQUIRE(g2 != NULL);
    gdr_info_v2_t info;
    CHECK_EQ(gdr_get_info_v2(g2, mh[0], &info), EINVAL);
    CHECK_EQ(gdr_close(g2), 0);
}

static void t_access_after_free_keeps_persistent_mapping(void)
{
    fixture f;
    REQUIRE_EQ(fx_setup(&f, GPU_PAGE_SIZE, TM_CUMEMALLOC, 1), 0);
    uint64_t pattern[8] = {1, 2, 3, 4, 5, 6, 7, 0xfeedfacecafebeefull}, got[8];
    CHECK_EQ(gdr_copy_to_mapping(f.mh, f.map, pattern, sizeof pattern), 0);
    /* Free the memory under the pin (GDRCopy's invalidation case). */
    CHECK_EQ(tm_free(&f.buf), 0);
    int flag = -1;
    CHECK_EQ(gdr_get_callback_flag(f.g, f.mh, &flag), 0);
    CHECK(flag == 0 || flag == 1);
    /* Persistent mapping: the pin keeps the pages until unpin. */
    memset(got, 0, sizeof got);
    CHECK_EQ(gdr_copy_from_mapping(f.mh, got, f.map, sizeof got), 0);
    CHECK(memcmp(got, pattern, sizeof got) == 0);
    CHECK_EQ(gdr_copy_to_mapping(f.mh, f.map, pattern, 8), 0);
    CHECK_EQ(gdr_get_callback_flag(f.g, f.mh, NULL), EINVAL);
    fx_teardown(&f);
}

static void t_two_mappings_one_freed_other_intact(void)
{
    fixture a, b;
    REQUIRE_EQ(fx_setup(&a, GPU_PAGE_SIZE, TM_CUMEMALLOC, 1), 0);
    if (fx_setup(&b, GPU_PAGE_SIZE, TM_CUMEMALLOC, 1)) {
        t_failed = 1;
        fx_teardown(&a);
        return;
    }
    /* Free A's memory and tear A down. */
    CHECK_EQ(tm_free(&a.buf), 0);
    fx_teardown(&a);
    /* B still works end to end. */
    uint8_t src[4096], dst[4096];
    fill_walking(src, sizeof src, 21);
    CHECK_EQ(gdr_copy_to_mapping(b.mh, b.map, src, sizeof src), 0);
    CHECK_EQ(tm_dtoh(dst, b.buf.d, sizeof dst), 0);
    CHECK(memcmp(src, dst, sizeof src) == 0);
    fx_teardown(&b);
}

/* ==== several GPUs ====================================================== */
static void t_pin_on_another_gpu_uses_that_device(void)
{
    if (tm.sim) SKIP("the sim backend has one device");
    if (tm.ndevices < 2) SKIP("needs two GPUs");
    int other = tm.ordinal == 0 ? 1 : 0;
    tm_buf b;
    REQUIRE_EQ(tm_alloc_on(&b, GPU_PAGE_SIZE, other), 0);
    /* The instance's default device is tm.ordinal; the pin must still work
     * (GDRCopy pins whatever device owns the pointer). */
    gdr_t g = gdr_open();
    REQUIRE(g != NULL);
    gdr_mh_t mh;
    void *map = NULL;
    CHECK_EQ(gdr_pin_buffer(g, b.d, GPU_PAGE_SIZE, 0, 0, &mh), 0);
    CHECK_EQ(gdr_map(g, mh, &map, GPU_PAGE_SIZE), 0);
    if (map) {
        uint64_t v[4] = {11, 22, 33, 44}, got[4] = {0};
        CHECK_EQ(gdr_copy_to_mapping(mh, map, v, sizeof v), 0);
        CHECK_EQ(tm_dtoh(got, b.d, sizeof got), 0);
        CHECK(memcmp(v, got, sizeof v) == 0);
    }
    CHECK_EQ(gdr_close(g), 0);
    CHECK_EQ(tm_free(&b), 0);
}

/* ==== fork ============================================================== */
/* Whether this platform honours MADV_DONTFORK at all: an anonymous page so
 * marked must be absent in a forked child.  qemu-user (the cross-architecture
 * CI runs) accepts the call and ignores it. */
static int dontfork_honoured(void)
{
    void *pg = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pg == MAP_FAILED)
        return 1;
    int ok = 1;
    if (madvise(pg, 4096, MADV_DONTFORK) == 0) {
        pid_t pid = fork();
        if (pid == 0) {
            int pfd[2];
            ssize_t w = pipe(pfd) == 0 ? write(pfd[1], pg, 8) : -1;
            _exit(w < 0 && errno == EFAULT ? 0 : 1);
        }
        int st = 0;
        if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 1)
            ok = 0;
    }
    munmap(pg, 4096);
    return ok;
}

/* The child's exit status has one bit per failed expectation. */
static void t_fork_child_cannot_map_or_read_parent_pins(void)
{
    int dontfork = dontfork_honoured();
    if (!dontfork)
        printf("    note: this platform ignores MADV_DONTFORK (an emulator?): the check that "
               "the child has no copy of the mapping is skipped\n");
    fixture f;
    REQUIRE_EQ(fx_setup(&f, 2 * GPU_PAGE_SIZE, TM_CUMEMALLOC, 0), 0);
    gdr_mh_t unmapped;
    REQUIRE_EQ(gdr_pin_buffer(f.g, f.buf.d + GPU_PAGE_SIZE, GPU_PAGE_SIZE, 0, 0, &unmapped), 0);
    void *map = NULL;
    REQUIRE_EQ(gdr_map(f.g, f.mh, &map, 2 * GPU_PAGE_SIZE), 0);
    f.map = map;
    const char secret[16] = "parent-secret!!";
    CHECK_EQ(gdr_copy_to_mapping(f.mh, map, secret, sizeof secret), 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int bits = 0;
        char buf[16];
        memset(buf, 0, sizeof buf);
        /* the parent's mapping is not inherited: as with GDRCopy (whose
         * sanity cases invalidation_fork_after_gdr_map_* check it), a read
         * through a pointer kept from before fork faults in the child */
        if (dontfork && read_faults((const volatile char *)map) != 1) bits |= 1;
        if (gdr_copy_from_mapping(f.mh, buf, map, sizeof buf) == 0) bits |= 2;
        if (memcmp(buf, secret, sizeof buf) == 0) bits |= 4;
        void *m2 = NULL;
        if (gdr_map(f.g, unmapped, &m2, GPU_PAGE_SIZE) == 0) bits |= 8;
        gdr_mh_t mh2;
        if (gdr_pin_buffer(f.g, f.buf.d, GPU_PAGE_SIZE, 0, 0, &mh2) == 0) bits |= 16;
        gdr_info_v2_t info;
        if (gdr_get_info_v2(f.g, f.mh, &info) != EACCES) bits |= 32;
        if (gdr_unpin_buffer(f.g, unmapped) == 0) bits |= 64;
        /* The child lets go of the parent's instance without harm. */
        if (gdr_close(f.g) != 0) bits |= 128;
        _exit(bits);
    }
    int st = 0;
    REQUIRE_EQ(waitpid(pid, &st, 0), pid);
    REQUIRE(WIFEXITED(st));
    if (WEXITSTATUS(st)) fprintf(stderr, "    child expectations failed: mask 0x%x\n", WEXITSTATUS(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
    /* The parent is unaffected. */
    char back[16] = {0};
    CHECK_EQ(gdr_copy_from_mapping(f.mh, back, map, sizeof back), 0);
    CHECK(memcmp(back, secret, sizeof back) == 0);
    void *m2 = NULL;
    CHECK_EQ(gdr_map(f.g, unmapped, &m2, GPU_PAGE_SIZE), 0);
    CHECK_EQ(gdr_unpin_buffer(f.g, unmapped), 0);
    fx_teardown(&f);
}

static void t_fork_child_opens_its_own_instance(void)
{
    if (!tm.sim) SKIP("the child cannot use CUDA after fork; GPU runs check the parent-side part");
    fflush(stdout);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        gdr_t g = gdr_open();
        uint64_t d = 0;
        if (!g || tm.sim_alloc(GPU_PAGE_SIZE, &d)) _exit(1);
        gdr_mh_t mh;
        void *m = NULL;
        uint32_t v = 42, r = 0;
        if (gdr_pin_buffer(g, d, GPU_PAGE_SIZE, 0, 0, &mh) || gdr_map(g, mh, &m, GPU_PAGE_SIZE) ||
            gdr_copy_to_mapping(mh, m, &v, 4) || gdr_copy_from_mapping(mh, &r, m, 4) || r != 42)
            _exit(2);
        _exit(gdr_close(g) ? 3 : 0);
    }
    int st = 0;
    REQUIRE_EQ(waitpid(pid, &st, 0), pid);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
}

static void t_fd_passing_isolation(void)
{
    SKIP("no gdrdrv file descriptor: a gdr_t is a per-process object, fork isolation is "
         "covered above");
}

/* ==== threads =========================================================== */
enum { NT = 8,
       PER = 4 };
typedef struct tctx {
    gdr_t g;
    gdr_mh_t mh[PER];
    int id;
    int errors;
    pthread_barrier_t *bar;
} tctx;

static void *thread_map_copy(void *arg)
{
    tctx *t = arg;
    tm_thread_init();
    pthread_barrier_wait(t->bar);
    for (int r = 0; r < 20; r++) {
        for (int i = 0; i < PER; i++) {
            void *m = NULL;
            if (gdr_map(t->g, t->mh[i], &m, GPU_PAGE_SIZE)) {
                t->errors++;
                continue;
            }
            uint64_t v[16], back[16];
            for (int k = 0; k < 16; k++) v[k] = ((uint64_t)t->id << 48) | ((uint64_t)i << 32) | (uint64_t)(r * 16 + k);
            if (gdr_copy_to_mapping(t->mh[i], (char *)m + 128 * r, v, sizeof v)) t->errors++;
            if (gdr_copy_from_mapping(t->mh[i], back, (char *)m + 128 * r, sizeof back)) t->errors++;
            if (memcmp(v, back, sizeof v)) t->errors++;
            if (gdr_unmap(t->g, t->mh[i], m, GPU_PAGE_SIZE)) t->errors++;
        }
    }
    return NULL;
}

static void t_pin_in_one_thread_map_copy_in_others(void)
{
    gdr_t g = gdr_open();
    REQUIRE(g != NULL);
    tm_buf b;
    REQUIRE_EQ(tm_alloc(&b, (size_t)NT * PER * GPU_PAGE_SIZE, TM_CUMEMALLOC), 0);
    tctx t[NT];
    pthread_t th[NT];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, NT);
    /* all pins made here, in the main thread */
    for (int i = 0; i < NT; i++) {
        t[i].g = g;
        t[i].id = i;
        t[i].errors = 0;
        t[i].bar = &bar;
        for (int k = 0; k < PER; k++)
            REQUIRE_EQ(gdr_pin_buffer(g, b.d + (uint64_t)(i * PER + k) * GPU_PAGE_SIZE, GPU_PAGE_SIZE, 0, 0,
                                      &t[i].mh[k]),
                       0);
    }
    for (int i = 0; i < NT; i++) pthread_create(&th[i], NULL, thread_map_copy, &t[i]);
    int errors = 0;
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        errors += t[i].errors;
    }
    CHECK_EQ(errors, 0);
    /* Every thread's last writes are on the device side. */
    for (int i = 0; i < NT; i++) {
        uint64_t v[16];
        CHECK_EQ(tm_dtoh(v, b.d + (uint64_t)(i * PER + PER - 1) * GPU_PAGE_SIZE + 128 * 19, sizeof v), 0);
        CHECK_EQ(v[15], ((uint64_t)i << 48) | ((uint64_t)(PER - 1) << 32) | (uint64_t)(19 * 16 + 15));
    }
    for (int i = 0; i < NT; i++)
        for (int k = 0; k < PER; k++) CHECK_EQ(gdr_unpin_buffer(g, t[i].mh[k]), 0);
    pthread_barrier_destroy(&bar);
    CHECK_EQ(gdr_close(g), 0);
    CHECK_EQ(tm_free(&b), 0);
}

/* Every size a small write can have (1..64 bytes, the restartable path's
 * range, and a few beyond it) at every offset within a 16-byte line writes
 * exactly [off, off+n): the bytes around it keep their old values. */
static void t_small_writes_cover_exactly_their_range(void)
{
    fixture f;
    REQUIRE_EQ(fx_setup(&f, GPU_PAGE_SIZE, TM_CUMEMALLOC, 1), 0);
    enum { SPAN = 256 };
    uint8_t base[SPAN], src[80], back[SPAN];
    int bad = 0;
    for (size_t n = 1; n <= 72 && !bad; n++) {
        for (size_t off = 0; off < 16 && !bad; off++) {
            memset(base, (int)(0xA5 ^ n), SPAN);
            fill_walking(src, n, (uint32_t)(n * 31 + off));
            REQUIRE_EQ(gdr_copy_to_mapping(f.mh, f.map, base, SPAN), 0);
            REQUIRE_EQ(gdr_copy_to_mapping(f.mh, (char *)f.map + 64 + off, src, n), 0);
            REQUIRE_EQ(gdr_copy_from_mapping(f.mh, back, f.map, SPAN), 0);
            memcpy(base + 64 + off, src, n);
            if (memcmp(back, base, SPAN)) {
                for (size_t i = 0; i < SPAN; i++)
                    if (back[i] != base[i]) {
                        fprintf(stderr, "    n %zu off %zu: byte %zu is 0x%02x, expected 0x%02x\n",
                                n, off, i, back[i], base[i]);
                        break;
                    }
                bad = 1;
            }
        }
    }
    CHECK_EQ(bad, 0);
    /* and a small write that ends past the mapping is refused, writing nothing */
    memset(base, 0x3c, 64);
    REQUIRE_EQ(gdr_copy_to_mapping(f.mh, (char *)f.map + GPU_PAGE_SIZE - 64, base, 64), 0);
    CHECK_EQ(gdr_copy_to_mapping(f.mh, (char *)f.map + GPU_PAGE_SIZE - 8, src, 9), EINVAL);
    REQUIRE_EQ(gdr_copy_from_mapping(f.mh, back, (char *)f.map + GPU_PAGE_SIZE - 64, 64), 0);
    CHECK_EQ(memcmp(back, base, 64), 0);
    fx_teardown(&f);
}

/* Small writes from several threads while the main thread unmaps and maps
 * the handle again, over and over: a write either lands (0) or is refused
 * (EINVAL), never touches an unmapped page (which would kill the process),
 * and the unmap never fails. */
typedef struct small_racer {
    gdr_mh_t mh;
    char *_Atomic va; /* the current mapping, or NULL while unmapped */
    atomic_int stop;
    long ok, refused, other;
    unsigned seed;
    size_t region;
} small_racer;

static void *thread_small_writes(void *arg)
{
    small_racer *r = arg;
    uint8_t src[64];
    memset(src, 0x5a, sizeof src);
    unsigned x = r->seed;
    char *last = NULL;
    while (!atomic_load(&r->stop)) {
        char *va = atomic_load(&r->va);
        if (va) last = va;
        if (!last) continue;
        x = x * 1664525u + 1013904223u;
        /* each thread its own 1 KiB (the threads' data must not race) */
        size_t n = 1 + (x >> 8) % 64, off = r->region + (x >> 16) % 512;
        /* Often through a pointer of a mapping that is already gone. */
        int rc = gdr_copy_to_mapping(r->mh, last + off, src, n);
        if (rc == 0) r->ok++;
        else if (rc == EINVAL) r->refused++;
        else r->other++;
    }
    return NULL;
}

static void t_small_writes_during_unmap_and_remap(void)
{
    fixture f;
    REQUIRE_EQ(fx_setup(&f, GPU_PAGE_SIZE, TM_CUMEMALLOC, 1), 0);
    enum { NTH = 4,
           ROUNDS = 300 };
    small_racer r[NTH];
    pthread_t th[NTH];
    for (int i = 0; i < NTH; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].mh = f.mh;
        atomic_store(&r[i].va, (char *)f.map);
        r[i].seed = 77u + (unsigned)i;
        r[i].region = (size_t)i * 1024;
        pthread_create(&th[i], NULL, thread_small_writes, &r[i]);
    }
    int unmap_fail = 0, map_fail = 0;
    void *m = f.map;
    for (int k = 0; k < ROUNDS; k++) {
        for (int i = 0; i < NTH; i++) atomic_store(&r[i].va, NULL);
        if (gdr_unmap(f.g, f.mh, m, f.size)) unmap_fail++;
        /* Something else may now take the address range: a stale write
         * into it must still be refused. */
        void *other = mmap(NULL, f.size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (k % 4 == 0) sched_yield(); /* let writers run (and be preempted) meanwhile */
        else usleep(200);
        if (gdr_map(f.g, f.mh, &m, f.size)) {
            map_fail++;
            m = NULL;
            if (other != MAP_FAILED) munmap(other, f.size);
            break;
        }
        if (other != MAP_FAILED) munmap(other, f.size);
        for (int i = 0; i < NTH; i++) atomic_store(&r[i].va, (char *)m);
    }
    long ok = 0, refused = 0, other = 0;
    for (int i = 0; i < NTH; i++) {
        atomic_store(&r[i].stop, 1);
        pthread_join(th[i], NULL);
        ok += r[i].ok;
        refused += r[i].refused;
        other += r[i].other;
    }
    printf("    %d unmap/map rounds: %ld writes landed, %ld refused\n", ROUNDS, ok, refused);
    CHECK_EQ(unmap_fail, 0);
    CHECK_EQ(map_fail, 0);
    CHECK_EQ(other, 0);
    CHECK(ok > 0);
    f.map = m;
    fx_teardown(&f);
}

typedef struct churn {
    gdr_t g;
    uint64_t base;
    int errors;
} churn;

static void *thread_churn(void *arg)
{
    churn *c = arg;
    tm_thread_init();
    for (int r = 0; r < 50; r++) {
        gdr_mh_t mh;
        void *m;
        if (gdr_pin_buffer(c->g, c->base, GPU_PAGE_SIZE, 0, 0, &mh)) {
            c->errors++;
            continue;
        }
        if (gdr_map(c->g, mh, &m, GPU_PAGE_SIZE)) c->errors++;
        else {
            uint32_t v = (uint32_t)r, back = 0;
            if (gdr_copy_to_mapping(mh, m, &v, 4) || gdr_copy_from_mapping(mh, &back, m, 4) || back != v)
                c->errors++;
        }
        /* unpin of a mapped handle unmaps it */
        if (gdr_unpin_buffer(c->g, mh)) c->errors++;
    }
    return NULL;
}

static void t_concurrent_pin_map_unpin_on_one_instance(void)
{
    gdr_t g = gdr_open();
    REQUIRE(g != NULL);
    tm_buf b;
    REQUIRE_EQ(tm_alloc(&b, NT * GPU_PAGE_SIZE, TM_CUMEMALLOC), 0);
    churn c[NT];
    pthread_t th[NT];
    for (int i = 0; i < NT; i++) {
        c[i].g = g;
        c[i].base = b.d + (uint64_t)i * GPU_PAGE_SIZE;
        c[i].errors = 0;
        pthread_create(&th[i], NULL, thread_churn, &c[i]);
    }
    int errors = 0;
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        errors += c[i].errors;
    }
    CHECK_EQ(errors, 0);
    CHECK_EQ(gdr_close(g), 0);
    CHECK_EQ(tm_free(&b), 0);
}

/* ==== reads through the copy engine (issue 44) ============================ */
/* A gdr_t opened with GDRPY_GDRAPI_READ_CE=policy (read by gdr_open; NULL:
 * unset, auto), and MB bytes of device memory pinned and mapped in it. */
enum { RD_MB = 1 << 20 };
typedef struct rd_fixture {
    gdr_t g;
    tm_buf b;
    gdr_mh_t mh;
    void *map;
} rd_fixture;

static int rd_open(rd_fixture *f, const char *policy)
{
    memset(f, 0, sizeof *f);
    if (policy) setenv("GDRPY_GDRAPI_READ_CE", policy, 1);
    f->g = gdr_open();
    unsetenv("GDRPY_GDRAPI_READ_CE");
    if (!f->g || tm_alloc(&f->b, RD_MB, TM_CUMEMALLOC) ||
        gdr_pin_buffer(f->g, f->b.d, RD_MB, 0, 0, &f->mh) ||
        gdr_map(f->g, f->mh, &f->map, RD_MB))
        return -1;
    return 0;
}

static void rd_close(rd_fixture *f)
{
    if (f->g) CHECK_EQ(gdr_close(f->g), 0);
    CHECK_EQ(tm_free(&f->b), 0);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* With reads from 4 KiB on through the engine: every size and offset reads
 * exactly the bytes there, into pageable and (GPU) page-locked memory, and
 * a read right after a write through the mapping sees the write (the
 * earlier stores are flushed to GPU memory first). */
static void t_engine_reads_match_and_follow_writes(void)
{
    rd_fixture f;
    REQUIRE_EQ(rd_open(&f, "4096"), 0);
    uint8_t *src = malloc(RD_MB), *dst = malloc(RD_MB + 64);
    REQUIRE(src && dst);
    void *locked = NULL;
    if (!tm.sim) REQUIRE_EQ(tm.cuMemHostAlloc(&locked, RD_MB, 0), 0);
    static const size_t sizes[] = {4096, 5000, 65536, 65536 + 1, 300000, RD_MB};
    static const size_t offs[] = {0, 1, 4097, 65536};
    for (int round = 0; round < 2; round++) {
        fill_walking(src, RD_MB, 77u + (uint32_t)round);
        /* written through the mapping, read at once through the engine */
        REQUIRE_EQ(gdr_copy_to_mapping(f.mh, f.map, src, RD_MB), 0);
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            for (size_t k = 0; k < sizeof offs / sizeof offs[0]; k++) {
                size_t n = sizes[i], off = offs[k];
                if (off + n > RD_MB) continue;
                uint8_t *out = locked && (i + k) % 2 ? (uint8_t *)locked : dst + (k & 1);
                memset(out, 0xEE, n);
                CHECK_EQ(gdr_copy_from_mapping(f.mh, out, (char *)f.map + off, n), 0);
                if (memcmp(out, src + off, n)) {
                    fprintf(stderr, "    round %d: %zu bytes at %zu differ\n", round, n, off);
                    CHECK(0);
                }
            }
    }
    if (locked) tm.cuMemFreeHost(locked);
    free(src);
    free(dst);
    rd_close(&f);
}

/* Which path a read takes (sim, whose engine stand-in is slowed down to
 * 50 ms a copy with GDRPY_SIM_CE_DELAY_US): GDRPY_GDRAPI_READ_CE=65536 sends
 * 64 KiB through the engine and 32 KiB through the mapping; "off" and the
 * sim's default (auto: BAR1 only on sim) send everything through the
 * mapping. */
static void t_read_policy_picks_the_path(void)
{
    if (!tm.sim) SKIP("timing against the sim engine's delay; GPU runs time gdrapi_copylat");
    setenv("GDRPY_SIM_CE_DELAY_US", "50000", 1);
    rd_fixture at, off, dflt;
    int ok = rd_open(&at, "65536") == 0 && rd_open(&off, "off") == 0 && rd_open(&dflt, NULL) == 0;
    uint8_t *buf = malloc(65536);
    if (ok && buf) {
        double t0 = now_ms();
        CHECK_EQ(gdr_copy_from_mapping(at.mh, buf, at.map, 65536), 0);
        double t_ce = now_ms() - t0;
        t0 = now_ms();
        CHECK_EQ(gdr_copy_from_mapping(at.mh, buf, at.map, 32768), 0);
        double t_small = now_ms() - t0;
        t0 = now_ms();
        CHECK_EQ(gdr_copy_from_mapping(off.mh, buf, off.map, 65536), 0);
        double t_off = now_ms() - t0;
        t0 = now_ms();
        CHECK_EQ(gdr_copy_from_mapping(dflt.mh, buf, dflt.map, 65536), 0);
        double t_dflt = now_ms() - t0;
        printf("    64 KiB: %.2f ms (engine), 32 KiB %.2f ms, off %.2f ms, default %.2f ms\n",
               t_ce, t_small, t_off, t_dflt);
        CHECK(t_ce >= 50.0);
        CHECK(t_small < 50.0 && t_off < 50.0 && t_dflt < 50.0);
    }
    CHECK(ok && buf);
    free(buf);
    rd_close(&at);
    rd_close(&off);
    rd_close(&dflt);
    unsetenv("GDRPY_SIM_CE_DELAY_US");
}

/* Engine reads from several threads at once through one mapping (they share
 * the context's staging ring and the device's stream): every read returns
 * its own bytes; then gdr_close frees it all. */
enum { RD_THREADS = 4,
       RD_PER = 24 };
typedef struct rd_thread {
    gdr_mh_t mh;
    const char *map;
    const uint8_t *src;
    unsigned seed;
    int errors;
} rd_thread;

static void *thread_engine_reads(void *arg)
{
    rd_thread *t = arg;
    uint8_t *out = malloc(65536 + 4096);
    for (int i = 0; i < RD_PER && out; i++) {
        t->seed = t->seed * 1103515245u + 12345u;
        size_t n = 4096 + (t->seed >> 8) % 65536;
        size_t off = (t->seed >> 4) % (RD_MB - n);
        if (gdr_copy_from_mapping(t->mh, out, t->map + off, n) || memcmp(out, t->src + off, n))
            t->errors++;
    }
    if (!out) t->errors++;
    free(out);
    return NULL;
}

static void t_engine_reads_from_threads(void)
{
    rd_fixture f;
    REQUIRE_EQ(rd_open(&f, "4096"), 0);
    uint8_t *src = malloc(RD_MB);
    REQUIRE(src != NULL);
    fill_walking(src, RD_MB, 5);
    REQUIRE_EQ(gdr_copy_to_mapping(f.mh, f.map, src, RD_MB), 0);
    rd_thread t[RD_THREADS];
    pthread_t th[RD_THREADS];
    for (int i = 0; i < RD_THREADS; i++) {
        t[i] = (rd_thread){f.mh, f.map, src, 7u * (unsigned)i + 1u, 0};
        pthread_create(&th[i], NULL, thread_engine_reads, &t[i]);
    }
    int errors = 0;
    for (int i = 0; i < RD_THREADS; i++) {
        pthread_join(th[i], NULL);
        errors += t[i].errors;
    }
    CHECK_EQ(errors, 0);
    free(src);
    rd_close(&f);
}

/* ==== main =============================================================== */
int main(int argc, char **argv)
{
    const char *filter = NULL;
    if (argc > 1) filter = argv[1];
    mem_ok = tm_init(NULL) == 0;
    printf("test_gdrapi: mode %s%s%s\n", tm.sim ? "sim" : "gpu", mem_ok ? "" : ", unavailable: ",
           mem_ok ? "" : tm.why);

#define RUN0(fn) run_case(#fn + 2, fn, 0, filter)
#define RUN(fn) run_case(#fn + 2, fn, 1, filter)
    RUN0(t_runtime_version_is_2_6);
    RUN0(t_struct_layouts_match_gdrcopy);
    RUN0(t_mapping_type_strings_name_each_type);
    RUN(t_driver_version_meets_minimum);
    RUN(t_attributes_report_persistent_mapping);
    RUN(t_open_returns_null_on_bad_environment);
    RUN(t_open_close_many_instances);
    RUN(t_bad_instance_pointers_are_einval);
    RUN(t_basic_pin_map_cumemalloc_v1);
    RUN(t_basic_pin_map_cumemalloc_v2);
    RUN(t_basic_pin_map_cumemcreate_v1);
    RUN(t_basic_pin_map_cumemcreate_v2);
    RUN(t_pin_with_p2p_token_is_einval);
    RUN(t_pin_rejects_bad_arguments);
    RUN(t_pin_flag_force_pcie_needs_coherent_gpu);
    RUN(t_pin_of_last_gpu_page_past_the_memory);
    RUN(t_get_info_v1_symbol_fills_40_bytes);
    RUN(t_info_va_rounds_down_to_gpu_page);
    RUN(t_unaligned_mapping_fails_next_boundary_works);
    RUN(t_two_small_buffers_in_one_gpu_page);
    RUN(t_second_map_of_handle_is_eagain);
    RUN(t_unmap_rules_einval);
    RUN(t_map_size_must_fit_pinned_pages);
    RUN(t_map_v2_flags_honoured_or_einval);
    RUN(t_data_validation_dword_offsets);
    RUN(t_data_validation_byte_offsets);
    RUN(t_mapping_to_mapping_copies);
    RUN(t_copy_checks_handle_state_and_range);
    RUN(t_stale_and_foreign_handles_are_einval);
    RUN(t_unpin_while_mapped_unmaps_first);
    RUN(t_close_unmaps_and_unpins_everything);
    RUN(t_access_after_free_keeps_persistent_mapping);
    RUN(t_two_mappings_one_freed_other_intact);
    RUN(t_pin_on_another_gpu_uses_that_device);
    RUN(t_fork_child_cannot_map_or_read_parent_pins);
    RUN(t_fork_child_opens_its_own_instance);
    RUN(t_fd_passing_isolation);
    RUN(t_pin_in_one_thread_map_copy_in_others);
    RUN(t_engine_reads_match_and_follow_writes);
    RUN(t_read_policy_picks_the_path);
    RUN(t_engine_reads_from_threads);
    RUN(t_concurrent_pin_map_unpin_on_one_instance);
    RUN(t_small_writes_cover_exactly_their_range);
    RUN(t_small_writes_during_unmap_and_remap);
    tm_fini();
    printf("test_gdrapi: %d skipped\n", n_skip);
    printf("test_gdrapi: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
