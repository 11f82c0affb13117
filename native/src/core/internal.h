/*
 * internal.h - shared between the core, the backends and the copy kernels.
 * Not installed; nothing here is ABI.
 */
#ifndef GDRPY_INTERNAL_H
#define GDRPY_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gdrpy.h"

#define GP_HIDDEN __attribute__((visibility("hidden")))
#define GP_UNUSED __attribute__((unused))
#define GP_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* ---- errors (error.c) ------------------------------------------------- */
/* Records a message for the calling thread and returns `code`. */
GP_HIDDEN int gp_err(int code, const char *fmt, ...) GP_PRINTF(2, 3);
/* Prefixes the current thread's message with "what: " and returns code. */
GP_HIDDEN int gp_err_prefix(int code, const char *fmt, ...) GP_PRINTF(2, 3);
GP_HIDDEN void gp_err_clear(void);
/* Debug log to stderr when GDRPY_LOG_LEVEL (or GDRCOPY_LOG_LEVEL) <= level.
 * Levels: 1 debug, 2 info, 3 warn, 4 error. */
GP_HIDDEN void gp_log(int level, const char *fmt, ...) GP_PRINTF(2, 3);
/* Level for unusable GDRPY_* values: printed even when logging is off. */
#define GP_LOG_CONFIG 5

/* ---- objects ---------------------------------------------------------- */
typedef struct gp_ctx gp_ctx;
typedef struct gp_pin gp_pin;

struct gp_pin {
    gdrpy_pin_t handle;
    /* request */
    uint64_t addr;
    uint64_t size;
    unsigned flags;
    /* chosen by the backend's pin(): the pinned (mappable) range.
     * Must satisfy va <= addr and va + len >= addr + size; va and len are
     * multiples of the host page size. */
    uint64_t va;
    uint64_t len;
    uint32_t page_size; /* reported GPU page size (65536) */
    /* bytes from va backed by the pinned memory (0: all of len).  Only the
     * rest of the GPU page in which the memory object ends may lie past it
     * (docs/security.md); map() maps [va, va+backed) and reserves the rest
     * of [va, va+len) with no access, and the core refuses copies there. */
    uint64_t backed;
    /* set by the backend's map() */
    void *map_base;   /* CPU address of va; NULL while unmapped */
    size_t map_len;   /* bytes mapped at map_base (>= len) */
    int mapping_type; /* gdrpy_mapping_type_t */
    void *bpriv;      /* backend private */
    /* core only: validated copies in flight (raised under ctx->lock,
     * dropped without it); unmap/unpin wait (bounded) for none */
    _Atomic int inflight;
    int tearing;    /* unmap/unpin in progress (ctx->lock) */
    int chan_holds; /* of inflight, the holds gp_chan_pin_hold raised (ctx->lock) */
};

struct gp_backend;

struct gp_ctx_slot;

#define GP_CTX_HOOKS 4 /* teardown hooks per context (gp_ctx_attach) */

struct gp_ctx {
    gdrpy_ctx_t handle;
    struct gp_ctx_slot *slot; /* its entry in the context table */
    int device;
    const struct gp_backend *be;
    void *bpriv;          /* backend private */
    pid_t pid;            /* opener */
    unsigned fork_gen;    /* gdrpy_fork_generation at open */
    pthread_mutex_t lock; /* guards pins[] */
    gp_pin **pins;        /* slot table, NULL = free */
    uint32_t *pin_gen;    /* generation per slot */
    uint32_t npins_cap;
    uint32_t npins;
    gdrpy_ctx_info_t info; /* filled by open (backend fills names) */
    int fork_faults;       /* GDRPY_OPEN_FORK_FAULTS: no placeholders in a child */
    /* 1: the GPU has a coherent CPU-GPU link, 0: not, -1: not asked yet
     * (pin flag FORCE_PCIE asks, once per context: gp_ctx_coherent) */
    _Atomic int coherent;
    /* state of the layers above, torn down by gdrpy_close (gp_ctx_attach;
     * under ctx->lock) */
    struct gp_ctx_hook {
        void (*fn)(void *arg);
        void *arg;
    } hooks[GP_CTX_HOOKS];
    unsigned nhooks;
};

/* Bounded wait used by teardown (close/unmap/unpin) for calls in flight in
 * other threads: returns 0 once *count is 0, else GDRPY_EBUSY after the
 * limit (GDRPY_BUSY_WAIT_MS, default 3000 ms).  Sets *waited_ms. */
GP_HIDDEN int gp_wait_idle(_Atomic int *count, int *waited_ms);
GP_HIDDEN int gp_busy_wait_limit_ms(void);

/* ---- backend interface ------------------------------------------------ */
/* A backend is one file exporting one `const struct gp_backend`.
 * All hooks return 0 or a gdrpy_status_t and set the message with gp_err().
 * The core holds ctx->lock around unpin/map/unmap, validates arguments
 * before calling, and guarantees the order map-after-pin, unmap-before-unpin,
 * everything-before-close.  pin runs WITHOUT ctx->lock (it may take
 * milliseconds, and the copy paths take that lock), so it may run at the
 * same time as other pins, unpins, maps and unmaps of the context: what it
 * changes beyond its own gp_pin must be guarded by the backend. */
struct gp_backend {
    const char *name;
    int id;      /* gdrpy_backend_t */
    int is_real; /* 0 for sim: never chosen by auto */
    /* 0 if usable on `device`, else a code with the reason in why. */
    int (*probe)(int device, char *why, size_t whylen);
    /* ctx->device is set; fill ctx->bpriv and ctx->info (gpu_name,
     * pci_bus_id, driver_version). */
    int (*open)(gp_ctx *ctx);
    void (*close)(gp_ctx *ctx);
    /* p->addr/size/flags set; fill va, len, page_size, bpriv. */
    int (*pin)(gp_ctx *ctx, gp_pin *p);
    int (*unpin)(gp_ctx *ctx, gp_pin *p);
    /* fill map_base, map_len, mapping_type. */
    int (*map)(gp_ctx *ctx, gp_pin *p);
    int (*unmap)(gp_ctx *ctx, gp_pin *p);
    /* optional (NULL: always 0): 1 if the memory was freed under the pin. */
    int (*get_invalidated)(gp_ctx *ctx, gp_pin *p, int *flag);
    /* copy-engine copies.  dir 0: host->device, 1: device->host.
     * stream NULL = synchronous. */
    int (*dev_memcpy)(gp_ctx *ctx, int dir, uint64_t dptr, void *host,
                      size_t n, void *stream);
    /* optional: driver-level objects held by the context (leak checks);
     * NULL: the core counts pins + mappings. */
    uint64_t (*live_objects)(gp_ctx *ctx);
    /* optional: *coherent = 1 if the GPU has a coherent CPU-GPU link (NULL:
     * ask CUDA, gp_cuda_device_coherent). */
    int (*coherent)(gp_ctx *ctx, int *coherent);
};

GP_HIDDEN extern const struct gp_backend gp_backend_sim;
GP_HIDDEN extern const struct gp_backend gp_backend_nvrm;
GP_HIDDEN extern const struct gp_backend gp_backend_gdrdrv;
GP_HIDDEN extern const struct gp_backend gp_backend_dmabuf;

/* ---- the core's interface for the layers above (src/staging/, src/channel/) */
/* Enters the context, finds the pin (need_map: a mapped one), checks
 * [offset, offset+n) and raises the pin's in-flight count (unmap/unpin wait
 * for it); on success gp_copy_end() must follow. */
GP_HIDDEN int gp_copy_begin(gdrpy_ctx_t h, gdrpy_pin_t ph, size_t offset, size_t n,
                            const void *buf, int need_map, const char *what, gp_ctx **c,
                            gp_pin **p);
GP_HIDDEN void gp_copy_end(gp_ctx *c, gp_pin *p);
/* A copy-engine read of [dptr, dptr+n) into dst.  With a stream: the
 * backend's copy, enqueued on it.  Without one: synchronous, on gdrpy's own
 * non-blocking stream (gp_cuda_private_copy), so it never waits for the
 * caller's kernels, as a read through the mapping never does (sim: memcpy). */
GP_HIDDEN int gp_ce_read_dev(gp_ctx *c, uint64_t dptr, void *dst, size_t n, void *stream);
/* Before a copy-engine read of a pin (in flight, gp_copy_begin): the
 * earlier stores through its mapping, if it is mapped, reach GPU memory
 * first (core.c says how). */
GP_HIDDEN void gp_pin_flush(gp_pin *p);
/* Enters the context (its in-flight count; gp_ctx_leave(c) after). */
GP_HIDDEN int gp_ctx_enter(gdrpy_ctx_t h, gp_ctx **c, const char *what);
GP_HIDDEN void gp_ctx_leave(gp_ctx *c);
/* Per-context state of a layer above the core: with the context entered,
 * gp_ctx_attach(c, fn, arg) has gdrpy_close call fn(arg) once, after the
 * pins are torn down and before the backend closes, when no call is inside
 * the context any more; hooks run newest first.  ENOMEM when the context
 * already has GP_CTX_HOOKS.  gp_ctx_attached(c, fn) returns the arg attached
 * with fn, or NULL: fn names the owner, so a layer finds its own state. */
GP_HIDDEN int gp_ctx_attach(gp_ctx *c, void (*fn)(void *arg), void *arg);
GP_HIDDEN void *gp_ctx_attached(gp_ctx *c, void (*fn)(void *arg));
/* For the channel, which holds its pin for its lifetime.  hold > 0: checks
 * that `ph` is a mapped pin of `h`, raises its in-flight count (unmap/unpin
 * then fail with EBUSY) and fills *info, *device and *is_real.  hold <= 0:
 * drops one such hold again (if the pin still exists); EINVAL, changing
 * nothing, when the pin has no hold of this kind to drop. */
GP_HIDDEN int gp_chan_pin_hold(gdrpy_ctx_t h, gdrpy_pin_t ph, int hold, gdrpy_pin_info_t *info,
                               int *device, int *is_real);

/* ---- helpers ---------------------------------------------------------- */
static inline uint64_t gp_round_down(uint64_t x, uint64_t a) { return x & ~(a - 1); }
static inline uint64_t gp_round_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }
/* A spin-wait loop's pause (x86 PAUSE, aarch64 YIELD; nothing elsewhere). */
static inline void gp_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}


/* ---- copy kernels (src/copy/: dispatch.c + one file per ISA) ----------- */
typedef void (*gp_copy_fn)(void *dst, const void *src, size_t n);
typedef struct gp_copy_kernel {
    const char *name;
    gp_copy_fn to_mapping;   /* stores into WC memory, ends with the store fence */
    gp_copy_fn from_mapping; /* loads from WC memory */
    int (*cpu_ok)(void);     /* 1 if this CPU can run it */
    int device_memory_only;  /* 1: faults on ordinary cacheable memory (ls64) */
} gp_copy_kernel;

#endif /* GDRPY_INTERNAL_H */
